#!/usr/bin/env bash
# bench.sh — moetrain against Hugging Face transformers on one GPU (`make bench` runs it).
#
# For every micro-batch in MBS and sequence length in SEQ it trains bench_8x7B_L2 (Mixtral-8x7B
# layer dimensions, 2 layers, 8 experts, random tokens, bf16, AdamW) with build/moetrain and takes
# its final `{"bench": ...}` JSON line; then it runs scripts/hf_peer.py (transformers'
# MixtralForCausalLM at the same config's dimensions, fp32 masters under bf16 autocast, fused
# AdamW with the same hyper-parameters, the same step and timing) for the same sizes and every
# variant in HF_VARIANTS; then prints the table (scripts/bench_compare.py): step time, tokens/s,
# model TFLOP/s, MFU, peak memory, and ours against the best Hugging Face variant. Both sides
# count model FLOPs with params_train_flops_per_token (src/params.h).
#
# Needs a GPU, build/moetrain (`make bench` builds it), and python3 with torch and transformers
# for the peer (without them the table has moetrain's rows only).
#
# Environment (all optional):
#   MBS="4"              micro-batches (e.g. MBS="4 8")
#   SEQ="4096"           sequence lengths
#   HF_VARIANTS="eager eager+compile default"   peer variants (scripts/hf_peer.py): the experts
#                        backend, +compile for torch.compile; "" skips Hugging Face
#   HF_SEPARATE=1        one peer process per size and variant (default: one per variant for all
#                        sizes, which saves torch's start and compile cache per size)
#   HF_RESULTS=file      reuse peer JSON lines from an earlier run instead of running the peer
#   HF_ARGS="..."        more hf_peer.py arguments (e.g. "--clip 1.0")
#   OURS=0               skip moetrain (peer only)
#   MOETRAIN=build/moetrain  the binary (`make bench` passes $(BUILD)/moetrain)
#   CONFIG=bench_8x7B_L2 config name or path, for both sides; ARGS="k=v ..." extra overrides for
#                        moetrain (model.* and optim.* ones reach the peer too)
#   FP8="none experts"   one moetrain run per value with precision.fp8=VALUE (rows "moetrain" for
#                        none, "moetrain fp8=VALUE" otherwise); unset: one run without the key
#   LAUNCH=""            how moetrain is started (one rank needs no mpirun; e.g.
#                        LAUNCH="scripts/mpirun.sh -np 1")
#   RUN_TIMEOUT=300      seconds per run (one moetrain run; one peer size)
#   PEAK_TFLOPS=N        the GPU's dense bf16 peak for MFU, when bench_compare.py does not know it
#   OUT=dir              where logs go (default build/bench/YYYYmmdd-HHMMSS)
#
# Writes to $OUT: moetrain.log, hf.log, results.jsonl (one JSON object per run; "impl" is
# "moetrain" or the peer variant), summary.md (the table, also printed). Exit status: 0 when
# every requested moetrain run produced its bench line and the table was made, 1 otherwise.
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/limit.sh
BIN=${MOETRAIN:-build/moetrain}
MBS=${MBS:-4}
SEQ=${SEQ:-4096}
HF_VARIANTS=${HF_VARIANTS-eager eager+compile default}
CONFIG=${CONFIG:-bench_8x7B_L2}
LAUNCH=${LAUNCH-}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
OURS=${OURS:-1}
OUT=${OUT:-build/bench/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
RES=$OUT/results.jsonl
: >"$RES"
case $CONFIG in */* | *.yaml) CFG_FILE=$CONFIG ;; *) CFG_FILE=configs/$CONFIG.yaml ;; esac

say() { echo "bench: $*" >&2; }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -1)
say "out $OUT; $CONFIG, MBS=[$MBS] SEQ=[$SEQ] HF_VARIANTS=[$HF_VARIANTS]; GPU ${GPU:-unknown}; commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"

fail=0
# ---- moetrain ---------------------------------------------------------------------------------
if [ "$OURS" = 1 ]; then
  if [ ! -x "$BIN" ]; then
    say "$BIN is missing: run 'make' first (make bench builds it)"
    exit 1
  fi
  for seq in $SEQ; do
    for mbs in $MBS; do
     for f8 in ${FP8:-_}; do
      impl=moetrain extra=
      if [ "$f8" != _ ]; then
        extra="precision.fp8=$f8"
        [ "$f8" != none ] && impl="moetrain fp8=$f8"
      fi
      say "$impl $CONFIG micro_batch=$mbs seq_len=$seq"
      echo "==== moetrain $CONFIG train.micro_batch=$mbs train.global_batch=$mbs train.seq_len=$seq $extra ${ARGS:-}" >>"$OUT/moetrain.log"
      # shellcheck disable=SC2086  # LAUNCH, extra and ARGS are word lists
      run_limited "$RUN_TIMEOUT" $LAUNCH "$BIN" --config "$CONFIG" train.micro_batch="$mbs" \
        train.global_batch="$mbs" train.seq_len="$seq" $extra ${ARGS:-} >>"$OUT/moetrain.log" 2>&1
      rc=$?
      [ "$RUN_LIMITED_STOP" = 1 ] && { say "interrupted"; exit 130; }
      line=$(awk '/^==== /{last=""} /^\{"bench"/{last=$0} END{print last}' "$OUT/moetrain.log")
      if [ $rc -ne 0 ] || [ -z "$line" ]; then
        say "$impl mbs=$mbs seq=$seq: exit $rc$([ $rc -eq 124 ] && echo " (timed out after ${RUN_TIMEOUT}s)"), bench line: ${line:-none} (see $OUT/moetrain.log)"
        echo "{\"impl\": \"$impl\", \"mbs\": $mbs, \"seq\": $seq, \"error\": \"exit $rc\"}" >>"$RES"
        fail=1
        continue
      fi
      echo "{\"impl\": \"$impl\", \"mbs\": $mbs, \"seq\": $seq, ${line#\{}" >>"$RES"
      say "  $line"
     done
    done
  done
fi

# ---- Hugging Face peer ------------------------------------------------------------------------
# hf_run TIMEOUT PLAN...: one peer process for the plans (VARIANT:MBS:SEQ); its result lines are
# appended to $RES, missing ones as errors. model.* and optim.* overrides in ARGS reach the peer.
hf_run() {
  local lim=$1; shift
  local log=$OUT/hf_last.log t0=$SECONDS p line a v mbs seq
  local cmd=(python3 scripts/hf_peer.py --config "$CFG_FILE")
  for a in ${ARGS:-}; do case $a in model.*=* | optim.*=*) cmd+=(--set "$a") ;; esac; done
  # shellcheck disable=SC2206  # HF_ARGS is a word list
  cmd+=(${HF_ARGS:-} "$@")
  say "peer: ${cmd[*]}"
  echo "==== ${cmd[*]}" >>"$OUT/hf.log"
  PYTHONUNBUFFERED=1 run_limited "$lim" "${cmd[@]}" >"$log" 2>&1
  local rc=$?
  [ "$RUN_LIMITED_STOP" = 1 ] && { say "interrupted"; exit 130; }
  cat "$log" >>"$OUT/hf.log"
  say "  exit $rc after $((SECONDS - t0)) s"
  for p in "$@"; do
    IFS=: read -r v mbs seq <<<"$p"
    line=$(grep '^{' "$log" | grep -F "\"impl\": \"$v\"" | grep "\"mbs\": $mbs," | grep "\"seq\": $seq," | tail -1)
    [ -z "$line" ] && line="{\"impl\": \"$v\", \"mbs\": $mbs, \"seq\": $seq, \"error\": \"exit $rc, no result line (see hf.log)\"}"
    echo "$line" >>"$RES"
    say "  $line"
  done
}

if [ -n "${HF_RESULTS:-}" ]; then
  say "peer: reusing $HF_RESULTS"
  grep '^{' "$HF_RESULTS" | grep '"impl"' | grep -v '"moetrain"' >>"$RES"
elif [ -n "$HF_VARIANTS" ]; then
  if ! python3 -c 'import torch, transformers' 2>/dev/null; then
    say "python3 cannot import torch and transformers: skipping the Hugging Face peer"
  else
    for v in $HF_VARIANTS; do
      plans=()
      for seq in $SEQ; do for mbs in $MBS; do plans+=("$v:$mbs:$seq"); done; done
      if [ "${HF_SEPARATE:-0}" = 1 ]; then
        for p in "${plans[@]}"; do hf_run "$RUN_TIMEOUT" "$p"; done
      else
        hf_run $((RUN_TIMEOUT * ${#plans[@]})) "${plans[@]}"
      fi
    done
  fi
fi

# ---- table ------------------------------------------------------------------------------------
python3 scripts/bench_compare.py --gpu "${GPU:-}" "$RES" | tee "$OUT/summary.md"
[ "${PIPESTATUS[0]}" -eq 0 ] || { say "bench_compare.py failed: no table"; fail=1; }
exit $fail
