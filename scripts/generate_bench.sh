#!/usr/bin/env bash
# generate_bench.sh — decode throughput of `moetrain generate` at the bench shapes
# (configs/bench_8x7B_L2.yaml: Mixtral-8x7B layer dimensions, 2 layers, random weights), batch 1
# and 32: 128-token prompts, 128 new tokens, greedy, on the GPU. Prints moetrain's summary lines
# ("generate: ... prefill S s, N decode steps in S s (X tokens/s)").
#
#   scripts/generate_bench.sh [MOETRAIN] [CONFIG] [DTYPE]
set -u -o pipefail
M=${1:-build/moetrain}
CFG=${2:-bench_8x7B_L2}
DT=${3:-bf16}
ids=$(seq 1 128 | awk '{printf "%s%d", (NR > 1 ? "," : ""), ($1 * 7919) % 32000}')
rc=0
for B in 1 32; do
  args=()
  for ((i = 0; i < B; i++)); do args+=(--prompt-ids "$i,$ids"); done
  "$M" generate --ckpt none --config "$CFG" "${args[@]}" --max-new 128 --temperature 0 --eos -1 --print-ids \
    --device cuda --dtype "$DT" 2>&1 >/dev/null | grep -a -E '^generate|error' || { echo "generate_bench: batch $B failed"; rc=1; }
done
exit $rc
