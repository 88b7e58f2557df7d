#!/usr/bin/env bash
# gpu_check.sh — every GPU check in one go (one device call): the CUDA-vs-CPU op tests, then
# compute-sanitizer memcheck over the same binaries, and racecheck over the attention/GEMM test
# (scripts/racecheck_ours.sh judges it: hazards in our kernels fail).
# Logs go to $OUT (the device tool's output folder; build/gpu_logs when unset).
#
#   scripts/gpu_check.sh [BUILD_DIR]     BUILD_DIR holds tests/gpu/test_* (default: build)
#   RACECHECK=0 scripts/gpu_check.sh     skip the (slow) racecheck pass
#   SANITIZE=0 scripts/gpu_check.sh      skip compute-sanitizer altogether
#   BENCH=1 scripts/gpu_check.sh         also time attention, GEMMs, RMSNorm, AdamW, CE at Mixtral sizes
#                                        (BUILD_DIR/dev/gpu_bench: `make dev`)
#
# The binaries are built where the toolkit and libyaml are (`make CUDA=1 test-gpu` builds them
# into build/tests/gpu); when none is found this script tries `make -j16 CUDA=1` itself.
# Ends with a summary table; exits non-zero when any step failed.
set -u
BUILD=${1:-build}
OUT=${OUT:-build/gpu_logs}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
SUM="$OUT/summary.txt"
: >"$SUM"
fail=0

step() {  # step NAME LIMIT_S CMD... : runs CMD with a time limit, log in $OUT/NAME.log
  local name=$1 lim=$2; shift 2
  local t0=$(date +%s)
  timeout --foreground "$lim" "$@" >"$OUT/$name.log" 2>&1
  local rc=$? t1=$(date +%s)
  local tail_line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$|ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$name.log" | tail -1)
  printf '%-34s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((t1 - t0))" "$tail_line" | tee -a "$SUM"
  [ "$rc" -eq 0 ] || fail=1
  return $rc
}

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv; \
  command -v compute-sanitizer; uname -a; } >"$OUT/machine.log" 2>&1

tests=$(ls "$BUILD"/tests/gpu/test_* 2>/dev/null | grep -v '\.d$')
if [ -z "$tests" ]; then
  echo "no prebuilt GPU tests under $BUILD/tests/gpu: building (needs libyaml.a and the CUDA toolkit)"
  step build 580 make -j16 CUDA=1 BUILD="$BUILD" $(cd tests/gpu && ls *.c | sed "s|^|$BUILD/tests/gpu/|; s|\.c$||")
  tests=$(ls "$BUILD"/tests/gpu/test_* 2>/dev/null | grep -v '\.d$')
fi

for t in $tests; do
  n=$(basename "$t")
  step "$n" 90 env MOETRAIN_GPU_LONG=1 "$t"  # + a T = 2048 attention case
  grep -E 'FAIL|error|rror:' "$OUT/$n.log" | head -40
  # the table of measured errors is the end of each test's log
  sed -n '/^check /,$p' "$OUT/$n.log"
done

# timings at Mixtral sizes (bf16): BENCH=1
if [ "${BENCH:-0}" = 1 ]; then
  step bench 180 "$BUILD/dev/gpu_bench" all
  sed -n '/^bench/,/^$/p' "$OUT/bench.log"
fi

if [ "${SANITIZE:-1}" != 1 ]; then
  echo "SANITIZE=0: compute-sanitizer skipped" | tee -a "$SUM"
elif command -v compute-sanitizer >/dev/null; then
  for t in $tests; do
    n=$(basename "$t")
    step "$n.memcheck" 150 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 "$t"
  done
  # racecheck over the tests of the shared-memory pipelines; the verdict is racecheck_ours.sh's:
  # hazards in our kernels fail, those in cuBLASLt's own (nvjet_*) are listed only
  if [ "${RACECHECK:-1}" = 1 ]; then
    rlogs=
    for t in $tests; do
      n=$(basename "$t")
      case $n in *attn*) step "$n.racecheck" 240 compute-sanitizer --tool racecheck --print-limit 10000 "$t"
                                   rlogs="$rlogs $OUT/$n.racecheck.log" ;; esac
    done
    [ -n "$rlogs" ] && { step racecheck.ours 30 scripts/racecheck_ours.sh $rlogs; cat "$OUT/racecheck.ours.log"; }
  fi
else
  echo "compute-sanitizer not found: memcheck skipped" | tee -a "$SUM"
  fail=1
fi

echo "== summary"
cat "$SUM"
exit $fail
