#!/usr/bin/env bash
# device.sh — the one command of a call to the lent GPU machine: scripts/gpu_all.sh with its logs
# written to a scratch folder, then packed into $OUT/logs.tgz (the device tool returns at most 8
# files), with summary.txt beside it. Everything else (PARTS, MBS, SEQ, HF_VARIANTS, ...) passes
# through to gpu_all.sh.
#   run(command="PARTS='check prof' scripts/device.sh", carry=["build", ".bench"])
set -u
cd "$(dirname "$0")/.." || exit 1
real=${OUT:-build/device}
mkdir -p "$real"
work=$(mktemp -d /tmp/moetrain_logs.XXXXXX)
OUT=$work scripts/gpu_all.sh
rc=$?
cp "$work/summary.txt" "$real/" 2>/dev/null
[ -f "$work/bench/summary.md" ] && cp "$work/bench/summary.md" "$real/bench_summary.md"
[ -f "$work/bench/results.jsonl" ] && cp "$work/bench/results.jsonl" "$real/bench_results.jsonl"
tar czf "$real/logs.tgz" -C "$work" .
exit $rc
