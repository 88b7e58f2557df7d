#!/usr/bin/env bash
# bench.sh — moetrain against Hugging Face transformers on one GPU (`make bench` runs it).
#
# For every micro-batch in MBS and sequence length in SEQ it trains bench_8x7B_L2 (Mixtral-8x7B
# layer dimensions, 2 layers, 8 experts, random tokens, bf16, AdamW) with build/moetrain and takes
# its final `{"bench": ...}` JSON line; then it runs the peer baseline hf_mixtral_baseline.py
# (MixtralForCausalLM, fp32 masters + bf16 autocast, fused AdamW) for the same sizes and every
# variant in HF_VARIANTS; then prints a table: ours against the best HF variant (tokens/s, model
# TFLOP/s, peak GiB, step time, ratio). Both sides count model FLOPs the same way
# (params_train_flops_per_token in src/params.h is the baseline's formula).
#
# Environment (all optional):
#   MBS="4"              micro-batches to run (e.g. MBS="4 8")
#   SEQ="4096"           sequence lengths
#   HF_VARIANTS="eager eager+compile default"   baseline IMPLs (default = the installed default,
#                        grouped_mm in transformers 5.17); "" skips Hugging Face
#   HF_CONFIG=8x7B-L2    the baseline's config name (must match bench_8x7B_L2's dimensions)
#   HF_BASELINE=path     hf_mixtral_baseline.py; else the first of .bench/, ../shared/bench/,
#                        shared/bench/ that has it (see "On the lent GPU machine" below)
#   HF_BATCH=1           one baseline process per variant for all sizes (saves the torch start per
#                        size; an OOM or crash loses that variant's remaining sizes, which are
#                        then reported as failed)
#   HF_RESULTS=file      reuse baseline JSON lines from an earlier run instead of running it
#   OURS=0               skip moetrain (baseline only)
#   CONFIG=bench_8x7B_L2 moetrain config; ARGS="k=v ..." extra overrides for every run
#   LAUNCH=""            how moetrain is started (one rank needs no mpirun: on the lent machine
#                        mpirun's start alone took ~80 s; e.g. LAUNCH="scripts/mpirun.sh -np 1")
#   RUN_TIMEOUT=300      seconds per run (moetrain run, or one baseline call). Runs use
#                        `timeout --foreground`: they stay in this script's process group, so
#                        a caller that kills the group (a device call running out of time) takes
#                        them along instead of leaving one on the GPU to slow the next call.
#   OUT=dir              where logs go (default build/bench/YYYYmmdd-HHMMSS)
#
# Writes to $OUT: moetrain.log, hf.log, results.jsonl (one JSON object per run, "impl" is
# "moetrain" or the HF variant), summary.md (the table, also printed). Exit status: 0 when
# every requested moetrain run produced its bench line, 1 otherwise.
#
# On the lent GPU machine the working tree travels but ../shared does not, and the baseline is
# the peer's file, never committed here. Copy it into an ignored folder and carry that folder:
#   here:   mkdir -p .bench && cp ../shared/bench/hf_mixtral_baseline.py .bench/ &&
#           grep -qx '/.bench/' .git/info/exclude || echo /.bench/ >> .git/info/exclude
#   run:    carry [".bench", "build"], command "make bench" (OUT is set there).
set -u
cd "$(dirname "$0")/.." || exit 1
MBS=${MBS:-4}
SEQ=${SEQ:-4096}
HF_VARIANTS=${HF_VARIANTS-eager eager+compile default}
HF_CONFIG=${HF_CONFIG:-8x7B-L2}
CONFIG=${CONFIG:-bench_8x7B_L2}
LAUNCH=${LAUNCH-}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
OURS=${OURS:-1}
OUT=${OUT:-build/bench/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
RES=$OUT/results.jsonl
: >"$RES"

say() { echo "bench: $*" >&2; }
# build/commit.txt where the caller wrote one (a worktree copied to the GPU machine has no git metadata of its own)
say "out $OUT; MBS=[$MBS] SEQ=[$SEQ] HF_VARIANTS=[$HF_VARIANTS]; commit $(cat build/commit.txt 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo ?)"
command -v nvidia-smi >/dev/null && nvidia-smi -L >&2

fail=0
# ---- moetrain ---------------------------------------------------------------------------------
if [ "$OURS" = 1 ]; then
  if [ ! -x build/moetrain ]; then
    say "build/moetrain is missing: run 'make' first (make bench builds it)"
    exit 1
  fi
  for seq in $SEQ; do
    for mbs in $MBS; do
      say "moetrain $CONFIG micro_batch=$mbs seq_len=$seq"
      echo "==== moetrain $CONFIG train.micro_batch=$mbs train.global_batch=$mbs train.seq_len=$seq ${ARGS:-}" >>"$OUT/moetrain.log"
      # shellcheck disable=SC2086  # LAUNCH and ARGS are word lists
      timeout --foreground "$RUN_TIMEOUT" $LAUNCH build/moetrain --config "$CONFIG" train.micro_batch="$mbs" \
        train.global_batch="$mbs" train.seq_len="$seq" ${ARGS:-} >>"$OUT/moetrain.log" 2>&1
      rc=$?
      line=$(awk '/^==== /{last=""} /^\{"bench"/{last=$0} END{print last}' "$OUT/moetrain.log")
      if [ $rc -ne 0 ] || [ -z "$line" ]; then
        say "moetrain mbs=$mbs seq=$seq: exit $rc$([ $rc -eq 124 ] && echo " (timed out after ${RUN_TIMEOUT}s)"), bench line: ${line:-none} (see $OUT/moetrain.log)"
        echo "{\"impl\": \"moetrain\", \"mbs\": $mbs, \"seq\": $seq, \"error\": \"exit $rc\"}" >>"$RES"
        fail=1
        continue
      fi
      echo "{\"impl\": \"moetrain\", \"mbs\": $mbs, \"seq\": $seq, ${line#\{}" >>"$RES"
      say "  $line"
    done
  done
fi

# ---- Hugging Face baseline --------------------------------------------------------------------
if [ -n "${HF_RESULTS:-}" ]; then
  say "baseline: reusing $HF_RESULTS"
  grep '^{' "$HF_RESULTS" | grep '"impl"' | grep -v '"moetrain"' >>"$RES"
elif [ -n "$HF_VARIANTS" ]; then
  base=${HF_BASELINE:-}
  if [ -z "$base" ]; then
    for p in .bench/hf_mixtral_baseline.py ../shared/bench/hf_mixtral_baseline.py shared/bench/hf_mixtral_baseline.py; do
      [ -f "$p" ] && { base=$p; break; }
    done
  fi
  if [ -z "$base" ] || [ ! -f "$base" ]; then
    say "no hf_mixtral_baseline.py (set HF_BASELINE, or copy it to .bench/ and carry .bench): skipping Hugging Face"
  else
    if [ "${HF_BATCH:-0}" = 1 ]; then
      for v in $HF_VARIANTS; do
        plans=()
        for seq in $SEQ; do for mbs in $MBS; do plans+=("$HF_CONFIG:$v:$mbs:$seq"); done; done
        say "baseline ${plans[*]} ($base, one process)"
        echo "==== $base ${plans[*]}" >>"$OUT/hf.log"
        t0=$(date +%s)
        PYTHONUNBUFFERED=1 timeout --foreground "$RUN_TIMEOUT" python3 "$base" "${plans[@]}" >"$OUT/hf_batch.log" 2>&1
        rc=$?
        cat "$OUT/hf_batch.log" >>"$OUT/hf.log"
        say "  exit $rc after $(( $(date +%s) - t0 )) s"
        for seq in $SEQ; do
          for mbs in $MBS; do
            line=$(grep '^{"config"' "$OUT/hf_batch.log" | grep "\"impl\": \"$v\"" | grep "\"mbs\": $mbs," | grep "\"seq\": $seq," | tail -1)
            [ -z "$line" ] && line="{\"config\": \"$HF_CONFIG\", \"impl\": \"$v\", \"mbs\": $mbs, \"seq\": $seq, \"error\": \"exit $rc, no result line\"}"
            echo "$line" >>"$RES"
            say "  $line"
          done
        done
      done
    else
    for seq in $SEQ; do
      for mbs in $MBS; do
        for v in $HF_VARIANTS; do
          # one process per variant: a crash or OOM in one (torch.compile) does not take the others
          say "baseline $HF_CONFIG:$v:$mbs:$seq ($base)"
          echo "==== $base $HF_CONFIG:$v:$mbs:$seq" >>"$OUT/hf.log"
          t0=$(date +%s)
          PYTHONUNBUFFERED=1 timeout --foreground "$RUN_TIMEOUT" python3 "$base" "$HF_CONFIG:$v:$mbs:$seq" >>"$OUT/hf.log" 2>&1
          rc=$?
          line=$(awk '/^==== /{last=""} /^\{"config"/{last=$0} END{print last}' "$OUT/hf.log")
          if [ -z "$line" ]; then
            line="{\"config\": \"$HF_CONFIG\", \"impl\": \"$v\", \"mbs\": $mbs, \"seq\": $seq, \"error\": \"exit $rc, no result line\"}"
          fi
          echo "$line" >>"$RES"
          say "  $line ($(( $(date +%s) - t0 )) s)"
        done
      done
    done
    fi
  fi
fi

# ---- table ------------------------------------------------------------------------------------
python3 scripts/bench_compare.py "$RES" | tee "$OUT/summary.md"
exit $fail
