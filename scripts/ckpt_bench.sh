#!/usr/bin/env bash
# ckpt_bench.sh — what a checkpoint costs a run: save time and training stall with
# checkpoint.async off and on, resume time, checksum throughput on the files.
#
#   scripts/ckpt_bench.sh DIR [overrides...]
#
# DIR (needs room for two checkpoints; removed at the end) receives the checkpoints. The model
# is Mixtral-shaped, 842 M parameters (a 10.1 GB checkpoint: 12 bytes per parameter), on random
# tokens with a tiny batch so the steps are short; overrides go last (train.device=cuda for a
# GPU; model.ffn=2048 for a 5.6 GB checkpoint). Host memory: the model's state (~16 GB on the
# CPU) and, with async, the snapshot (the checkpoint's size). Each run trains 4 steps and saves
# at steps 2 and 4; the log lines are printed as they are, then the step times around the saves.
set -eu
DIR=${1:?usage: scripts/ckpt_bench.sh DIR [overrides...]}
shift
BIN=${BIN:-build/moetrain}
MPI=${MPI:-}
MODEL="model.vocab_size=32000 model.hidden=2048 model.ffn=4608 model.layers=3 model.heads=16 model.kv_heads=4
  model.experts=8 model.top_k=2 parallel.ep=1 train.seq_len=16 train.micro_batch=1 train.global_batch=1
  data.format=random optim.warmup=1 train.eval_every=0 train.eval_batches=1 log.every=1 log.dir= checkpoint.keep=1
  checkpoint.keep_best=false"
run() {  # run NAME overrides...
  local name=$1; shift
  rm -rf "$DIR/$name"
  local t0=$(date +%s.%N)
  $MPI "$BIN" --config L0_sanity $MODEL checkpoint.dir="$DIR/$name" "$@" >"$DIR/$name.log" 2>&1 || {
    tail -5 "$DIR/$name.log"; return 1; }
  local t1=$(date +%s.%N)
  echo "== $name: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s wall"
  grep -E '^step|checkpoint:|^parameters' "$DIR/$name.log" | cut -c1-200
}
mkdir -p "$DIR"
trap 'rm -rf "$DIR"' EXIT  # also when a run fails (set -e): its checkpoints take ~10 GB
run sync train.steps=4 checkpoint.every=2 checkpoint.async=false "$@"
du -sh "$DIR/sync/step_00000004"
run async train.steps=4 checkpoint.every=2 checkpoint.async=true "$@"
# resume: every rank verifies its files (CRC-32C) and loads; then one step
sync_caches() { sync; [ -w /proc/sys/vm/drop_caches ] && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
sync_caches
run resume train.steps=5 checkpoint.every=0 checkpoint.dir="$DIR/sync" checkpoint.resume=auto "$@" || true
f=$(ls "$DIR"/sync/step_*/rank_00000.safetensors | tail -1)
sync_caches
[ -x build/tests/bench_crc32c ] && build/tests/bench_crc32c "$f" | grep -E '^file|GB/s'
exit 0
