#!/usr/bin/env bash
# gpu_session.sh — the one device call that measured docs/performance.md's session-3 rows, for a
# tight device budget: the wgmma probe and the attention/GEMM test (with kernel timings and the
# cuBLASLt candidate survey), the other GPU tests, the micro-batch-8 stage profile, the headline
# bench (micro-batch 4 and 8 at seq 4096 against HF eager, then eager+compile), an A/B run with
# the mma.sync attention, then — while the deadline allows — the seq-1024 sweep and memcheck.
# If the attention test fails, everything after it runs with MOETRAIN_ATTN=mma.
#   run(command="DL=540 scripts/gpu_session.sh", carry=["build/moetrain", "build/tests/gpu", ".bench"])
# DL: seconds this call may take (default 560). Logs and results under $OUT (at most 8 files).
# Exit status: that of the attention/GEMM test (the other steps report in $OUT/d.log).
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build/gpu_session}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 NCCL_NVLS_ENABLE=0; W=$OUT; L=$W/d.log; DL=${DL:-560}
say() { echo "$*" | tee -a $L; }
build/tests/gpu/test_cuda_wgmma 2>&1 | tail -8 | tee -a $L
MOETRAIN_GPU_LONG=1 MOETRAIN_GPU_BENCH=1 MOETRAIN_GEMM_SURVEY=1 timeout 200 build/tests/gpu/test_cuda_gemm_attn > $W/attn.log 2>&1; rc=$?; frc=$rc; say "attn rc=$rc"
grep -E "FAIL|passed|^attn_|^gemm" $W/attn.log | head -30 | tee -a $L
[ $rc -ne 0 ] && { export MOETRAIN_ATTN=mma; say "attention tests failed: the rest runs MOETRAIN_ATTN=mma"; }
for t in test_cuda_model test_cuda_golden test_cuda_ops; do timeout 60 build/tests/gpu/$t > /tmp/$t.log 2>&1; say "$t rc=$? $(tail -1 /tmp/$t.log)"; grep FAIL /tmp/$t.log | head -5 | tee -a $L; done
MOETRAIN_PROFILE=1 timeout 100 build/moetrain --config bench_8x7B_L2 train.micro_batch=8 train.global_batch=8 train.steps=6 > /tmp/p.log 2>&1; sed -n '/^profile/,$p' /tmp/p.log | head -26 | tee -a $L
bs() { local n=$1; shift; env OUT=/tmp/$n HF_BATCH=1 RUN_TIMEOUT=250 "$@" scripts/bench.sh > /tmp/$n.log 2>&1; tail -14 /tmp/$n.log | tee -a $L; cp /tmp/$n/results.jsonl $W/$n.jsonl; }
bs head MBS='4 8' SEQ=4096 HF_VARIANTS=eager
say "t=$SECONDS"; [ $((DL - SECONDS)) -gt 200 ] && bs headc MBS='4 8' SEQ=4096 HF_VARIANTS=eager+compile OURS=0
MOETRAIN_ATTN=mma timeout 100 build/moetrain --config bench_8x7B_L2 train.micro_batch=8 train.global_batch=8 > /tmp/b.log 2>&1; say "mma mbs8: $(grep '^{"bench' /tmp/b.log)"
say "t=$SECONDS"; [ $((DL - SECONDS)) -gt 160 ] && bs s1024 MBS='1 2 4 8' SEQ=1024 HF_VARIANTS=eager
say "t=$SECONDS"; [ $((DL - SECONDS)) -gt 80 ] && { timeout 70 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 build/tests/gpu/test_cuda_gemm_attn > /tmp/mc.log 2>&1; say "memcheck rc=$? $(grep 'ERROR SUMMARY' /tmp/mc.log)"; }
say "t=$SECONDS"; tar czf $W/more.tgz -C /tmp head headc s1024 p.log b.log mc.log 2>/dev/null
exit $frc  # non-zero when the attention/GEMM test failed
