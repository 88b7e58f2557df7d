#!/bin/bash
# tile A/B: bench_8x7B_L2 at micro-batch 8, alternating
cd "$(dirname "$0")/.." || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
ALL="0,1,28672,4096=201;1,0,28672,4096=29;0,1,32000,4096=201;0,0,4096,32000=24;1,0,32000,4096=24"
HEAD="0,1,32000,4096=201;0,0,4096,32000=24;1,0,32000,4096=24"
run() {  # name tiles
  MOETRAIN_GEMM_TILE="$2" timeout 100 build/moetrain --config bench_8x7B_L2 train.micro_batch=8 train.global_batch=8 > /tmp/tab_$1.log 2>&1
  echo "$1: $(grep '^{"bench' /tmp/tab_$1.log | tail -1)"
}
for r in 1 2; do run default ""; run all "$ALL"; run head "$HEAD"; done
MOETRAIN_GEMM_TUNE_LOG=1 MOETRAIN_GEMM_TILE="$ALL" timeout 100 build/moetrain --config bench_8x7B_L2 train.micro_batch=8 train.global_batch=8 train.steps=3 2>&1 | grep -E 'MOETRAIN_GEMM_TILE|^step' | head -30
