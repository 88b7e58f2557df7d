#!/usr/bin/env bash
# gpu_all.sh — every GPU check and the benchmark in one call to the lent GPU machine.
#
#   run(command="scripts/gpu_all.sh", carry=["build", ".bench"])     (build here first: make all test-gpu-build)
#
# Parts (PARTS="check l0 bench", any subset, in the order given):
#   check  scripts/gpu_check.sh: every CUDA op against the CPU op, the whole model against the
#          CPU backend (fp32 tight, bf16 loose), the Hugging Face golden fixture on the GPU, then
#          compute-sanitizer memcheck/racecheck (SANITIZE=0 skips them, RACECHECK=0 racecheck)
#   l0     L0_sanity three ways: the CPU at EP=2 (mpirun -np 2), the GPU in bf16 and in fp32
#          (one rank, EP=1, micro_batch 16: the same global batch); scripts/l0_compare.py checks
#          that the GPU curves follow the CPU's
#   bench  scripts/bench.sh (moetrain's bench_8x7B_L2 beside hf_mixtral_baseline.py; MBS, SEQ,
#          HF_VARIANTS as there)
#   prof   the per-stage time table (log.profile=sync) of bench_8x7B_L2 at each micro-batch in
#          PROF_MBS (default "4 8"), 6 steps each
# Logs under $OUT/<part>/ ($OUT is the device tool's output folder; build/gpu_all otherwise).
# Exit status: non-zero when any part failed; $OUT/summary.txt lists each part's result.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build/gpu_all}
PARTS=${PARTS:-check l0 bench}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
SUM=$OUT/summary.txt
: >"$SUM"
fail=0
part() {  # part NAME CMD...: runs CMD, records its exit code and time
  local name=$1; shift
  local t0=$(date +%s)
  "$@"
  local rc=$? t1=$(date +%s)
  printf '%-8s rc=%-3s %5ss\n' "$name" "$rc" "$((t1 - t0))" | tee -a "$SUM"
  [ "$rc" -eq 0 ] || fail=1
}

l0() {
  local d=$OUT/l0
  mkdir -p "$d"
  OMP_NUM_THREADS=4 scripts/mpirun.sh -np 2 build/moetrain --config L0_sanity train.device=cpu \
    log.dir="$d/cpu_ep2" >"$d/cpu_ep2.log" 2>&1 &
  local cpu=$!
  build/moetrain --config L0_sanity train.device=cuda parallel.ep=1 train.micro_batch=16 \
    log.dir="$d/cuda_bf16" >"$d/cuda_bf16.log" 2>&1 || echo "cuda bf16 run failed: $d/cuda_bf16.log"
  build/moetrain --config L0_sanity train.device=cuda parallel.ep=1 train.micro_batch=16 precision.dtype=fp32 \
    log.dir="$d/cuda_fp32" >"$d/cuda_fp32.log" 2>&1 || echo "cuda fp32 run failed: $d/cuda_fp32.log"
  wait $cpu || echo "cpu run failed: $d/cpu_ep2.log"
  for r in cpu_ep2 cuda_bf16 cuda_fp32; do echo "== $r"; grep -E '^step .*val|error' "$d/$r.log" | tail -4; done
  python3 scripts/l0_compare.py "$d/cpu_ep2/metrics.jsonl" "$d/cuda_bf16/metrics.jsonl" "$d/cuda_fp32/metrics.jsonl"
}

prof() {
  local d=$OUT/prof rc=0
  mkdir -p "$d"
  for mbs in ${PROF_MBS:-4 8}; do
    timeout --foreground 180 build/moetrain --config bench_8x7B_L2 train.micro_batch="$mbs" \
      train.global_batch="$mbs" train.steps=6 log.profile=sync >"$d/prof_mbs$mbs.log" 2>&1 || rc=1
    echo "== profile, micro-batch $mbs"; sed -n '/^profile/,$p' "$d/prof_mbs$mbs.log" | head -60
  done
  return $rc
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; git log --oneline -1; } 2>&1 | tee "$OUT/machine.txt"
for p in $PARTS; do
  case $p in
    check) part check env OUT="$OUT/check" scripts/gpu_check.sh build ;;
    l0)    part l0 l0 ;;
    bench) part bench env OUT="$OUT/bench" scripts/bench.sh ;;
    prof)  part prof prof ;;
    *) echo "gpu_all.sh: unknown part '$p' (check, l0, bench, prof)"; fail=1 ;;
  esac
done
echo "== summary"; cat "$SUM"
exit $fail
