#!/usr/bin/env bash
# gpu_check.sh — every GPU check, on any machine with an NVIDIA GPU, logs under $OUT and a summary
# table at the end.
#
#   scripts/gpu_check.sh                 every step: tests san ckpt l0 comm
#   scripts/gpu_check.sh tests ckpt      the steps named, in that order (or STEPS="tests ckpt")
#
# Steps:
#   tests  every GPU test binary in $BUILD/tests/gpu (each CUDA op against the CPU op, the whole
#          model against the CPU backend and the Hugging Face golden fixture, NCCL with 2+ GPUs),
#          through scripts/run_tests.sh ("N passed, N failed")
#   san    compute-sanitizer: memcheck over every GPU test (test_cuda_fp8 and test_cuda_fp8_ffn
#          --small: without their larger shapes), racecheck over the attention tests
#          (RACECHECK=0 skips it), judged by scripts/racecheck_ours.sh: hazards in our kernels
#          fail, those in cuBLASLt's own kernels are listed
#   ckpt   scripts/ckpt_check.sh: save + resume exact on the GPU (bf16 and fp32), and the Hugging
#          Face export scored by moetrain eval and by transformers (SKIP lines without torch)
#   l0     L0_sanity three ways, the CPU at EP=2 (mpirun) and the GPU in bf16 and fp32 at EP=1 with
#          the same global batch; scripts/l0_compare.py checks the GPU curves follow the CPU's
#   comm   parallel.comm=mpi, two ranks on one GPU (scripts/gpu_comm_mpi.sh): L0_sanity at EP=2
#          against the GPU at EP=1 and the CPU at EP=2, a save at EP=2 resumed at EP=1 on the GPU
#          and on the CPU, memcheck on both ranks, probe_gpu_mem against `moetrain plan`
#   generate  greedy `moetrain generate` on an fp32 export against transformers' generate (every
#          token, 64 new, fp32; bf16 agreement reported: scripts/generate_check.py), and decode
#          throughput at the bench shapes, batch 1 and 32 (scripts/generate_bench.sh)
#   fp8    (not in the default set) FP8 loss parity: scripts/fp8_parity.sh trains configs/fp8_parity.yaml
#          with precision.fp8 none, experts and linear on the GPU (about a minute each) and checks the
#          final validation losses agree within 0.5%; the curves in $OUT/fp8_parity/fp8_parity.png
#   fp8speed  (not in the default set) FP8's speed: the expert GEMM ops in bf16 against FP8 and the
#          quantisers alone ($BUILD/dev/gpu_bench fp8), `make bench`'s table with precision.fp8
#          none, experts and linear against Hugging Face eager+compile at micro-batch 4 and 8
#          (scripts/bench.sh, logs in $OUT/bench), and the step's stages (log.profile=events) of
#          bench_8x7B_L2 at both micro-batches in bf16 and with experts
#   timings   (not in the default set) kernel timings at Mixtral sizes, $BUILD/dev/gpu_bench all,
#          attention on packed documents against the same windows unmasked ($BUILD/dev/attn_docs_bench),
#          and the expert GEMM ops in bf16 against FP8 ($BUILD/dev/gpu_bench fp8)
#
# Environment: OUT (logs; default build/gpu_logs), BUILD (binaries; default build: moetrain,
# tests/gpu/*, dev/gpu_bench), STEP_TIMEOUT (seconds per command, default 900: the command and
# everything it started end there, and the next one runs), ONLY (test binaries for tests and san,
# by name, e.g. ONLY="test_cuda_fp8 test_cuda_infer"; default all), WORK (scratch for checkpoints
# and exports, removed at the end unless KEEP_WORK=1; default $TMPDIR/moetrain_gpu_check).
# Missing binaries are built with make first. Output: $OUT/NAME.log per command, $OUT/summary.txt
# (one PASS / FAIL / SKIP row each, also printed at the end) and $OUT/logs.tgz (all of $OUT's logs
# in one file, renewed after every command). Exit status: 0 when every command passed.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
OUT=${OUT:-build/gpu_logs}
STEP_TIMEOUT=${STEP_TIMEOUT:-900}
WORK=${WORK:-${TMPDIR:-/tmp}/moetrain_gpu_check}
if [ $# -gt 0 ]; then STEPS="$*"; else STEPS=${STEPS:-tests san ckpt l0 comm}; fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PATH=$PATH:${CUDA_HOME:-/usr/local/cuda}/bin  # compute-sanitizer
export LD_LIBRARY_PATH=${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# NCCL's NVLink SHARP path needs fabric-manager support a single node may lack; nothing here needs it
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
. scripts/limit.sh
SUM=$OUT/summary.txt
: >"$SUM"
fail=0

# $OUT/logs.tgz: every log so far, renewed after each command (a run killed from outside keeps them)
pack_logs() {
  local tgz
  tgz=$(mktemp) && tar czf "$tgz" -C "$OUT" --exclude=./logs.tgz . && mv "$tgz" "$OUT/logs.tgz"
}

# check NAME CMD...: runs CMD with the step timeout (CMD and every process it starts: limit.sh),
# its output in $OUT/NAME.log, one summary row: PASS, FAIL, or SKIP (exit 0, nothing passed and
# something skipped); a count of skips stays in the row. After a Ctrl-C or SIGTERM to this
# script nothing more runs.
check() {
  local name=$1; shift
  [ "$RUN_LIMITED_STOP" = 1 ] && return 130
  local t0=$SECONDS
  run_limited "$STEP_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local what extra  # the last test total, and the last sanitizer / script verdict
  what=$(grep -aE '^[0-9]+ passed, [0-9]+ failed' "$OUT/$name.log" | tail -1)
  extra=$(grep -aE 'ERROR SUMMARY|RACECHECK SUMMARY|^ckpt: [0-9]+ passed|^l0: |^fp8: ' "$OUT/$name.log" | tail -1)
  what="$what${what:+${extra:+; }}$extra"
  { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && what="timed out after ${STEP_TIMEOUT}s (STEP_TIMEOUT)"
  [ "$RUN_LIMITED_STOP" = 1 ] && what="interrupted"
  # a test's "skip..." lines (run_tests.sh counts them; a binary run directly, as under the
  # sanitizers, does not)
  local nskip
  nskip=$(grep -ciE '^[[:space:]]*skip(ped)?[: ]' "$OUT/$name.log")
  [ "$nskip" -gt 0 ] && [[ $what != *skipped* ]] && what="$what ($nskip skip lines)"
  local verdict=PASS
  if [ $rc -ne 0 ]; then verdict=FAIL; fail=1
  elif [ "$nskip" -gt 0 ] && [[ $what == "0 passed, 0 failed"* ]]; then verdict=SKIP
  fi
  printf '%-36s %-4s rc=%-3s %5ss  %s\n' "$name" "$verdict" "$rc" "$((SECONDS - t0))" "$what" | tee -a "$SUM"
  pack_logs
  return $rc
}

gpu_tests() {  # the GPU test binaries, whatever they are named (those in ONLY, when set)
  local f
  for f in "$BUILD"/tests/gpu/*; do
    [ -f "$f" ] && [ -x "$f" ] || continue
    case $f in *.d | *.o) continue ;; esac
    [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $(basename "$f") "* ]] && echo "$f"
  done
}

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv
  command -v compute-sanitizer; uname -a; git log --oneline -1 2>/dev/null; } >"$OUT/machine.log" 2>&1
head -1 "$OUT/machine.log"

if [ ! -x "$BUILD/moetrain" ] || [ -z "$(ONLY='' gpu_tests)" ]; then
  echo "gpu_check: building $BUILD/moetrain and the GPU tests"
  check build make -j"$(nproc)" BUILD="$BUILD" all gpu-tests || { cat "$SUM"; exit 1; }
fi
if [ -n "${ONLY:-}" ] && [ -z "$(gpu_tests)" ]; then
  echo "gpu_check: ONLY='$ONLY' names no binary in $BUILD/tests/gpu" | tee -a "$SUM"; fail=1
fi

step_tests() {
  local t
  for t in $(gpu_tests); do
    case $(basename "$t") in
      test_cuda_attn) check "test.$(basename "$t")" "$t" --long ;;  # + a T = 2,048 case
      *) check "test.$(basename "$t")" scripts/run_tests.sh "$t" ;;
    esac
    grep -aE '^ *FAIL' "$OUT/test.$(basename "$t").log" 2>/dev/null | head -20
  done
}

step_san() {
  if ! command -v compute-sanitizer >/dev/null; then
    echo "san: compute-sanitizer not found" | tee -a "$SUM"; fail=1; return
  fi
  local t n rlogs=()
  for t in $(gpu_tests); do
    n=$(basename "$t")
    case $n in mpi_*) continue ;; esac  # multi-rank tests: sanitizing one rank under mpirun says little more
    local a=()
    local s=()
    case $n in test_cuda_fp8 | test_cuda_fp8_ffn) a=(--small) ;; esac  # their larger GEMMs take too long under memcheck
    # NCCL's communicator set-up asks cudaFuncGetAttributes about its kernels built for other GPUs
    # and handles the "no kernel image" it gets back (four API errors, all inside ncclCommInitAll):
    # for the test that creates a communicator, memory errors only
    [ "$n" = probe_gpu_mem ] && s=(--report-api-errors no)
    check "memcheck.$n" compute-sanitizer --tool memcheck "${s[@]}" --error-exitcode 9 --print-limit 20 "$t" "${a[@]}"
    # a GPU the sanitizer cannot attach to (some virtualised machines) fails every run the same way
    if grep -q 'Device not supported' "$OUT/memcheck.$n.log"; then
      echo "san: compute-sanitizer does not support this GPU (memcheck.$n.log): the other runs are left out" |
        tee -a "$SUM"
      fail=1
      return
    fi
  done
  [ "${RACECHECK:-1}" = 1 ] || return
  for t in $(gpu_tests); do
    n=$(basename "$t")
    case $n in *attn*)  # the shared-memory pipelines
      check "racecheck.$n" compute-sanitizer --tool racecheck --print-limit 10000 "$t"
      rlogs+=("$OUT/racecheck.$n.log") ;;
    esac
  done
  [ ${#rlogs[@]} -gt 0 ] && check racecheck.ours scripts/racecheck_ours.sh "${rlogs[@]}"
}

step_ckpt() {
  # ckpt_check.sh's own deadline inside the step's limit: it skips what would not finish (SKIP
  # rows) rather than being killed mid-check
  check ckpt env MOETRAIN="$BUILD/moetrain" CKPT_WORK="$WORK/ckpt" \
    CKPT_DL="${CKPT_DL:-$((STEP_TIMEOUT > 60 ? STEP_TIMEOUT - 15 : STEP_TIMEOUT))}" scripts/ckpt_check.sh "$OUT/ckpt"
  grep -aE '^ckpt: (FAIL|SKIP)' "$OUT/ckpt.log" | sed 's/^/  /' | tee -a "$SUM"
}

step_l0() {
  local d=$OUT/l0 ck=$WORK/l0_ckpt  # checkpoints (with the best: keep_best) outside OUT
  rm -rf "$d" "$ck"; mkdir -p "$d"
  check l0.cpu_ep2 scripts/mpirun.sh -np 2 "$BUILD/moetrain" --config L0_sanity train.device=cpu log.dir="$d/cpu_ep2" \
    checkpoint.dir="$ck/cpu_ep2"
  check l0.cuda_bf16 "$BUILD/moetrain" --config L0_sanity train.device=cuda parallel.ep=1 train.micro_batch=16 \
    log.dir="$d/cuda_bf16" checkpoint.dir="$ck/cuda_bf16"
  check l0.cuda_fp32 "$BUILD/moetrain" --config L0_sanity train.device=cuda parallel.ep=1 train.micro_batch=16 \
    precision.dtype=fp32 log.dir="$d/cuda_fp32" checkpoint.dir="$ck/cuda_fp32"
  check l0.compare python3 scripts/l0_compare.py "$d/cpu_ep2/metrics.jsonl" "$d/cuda_bf16/metrics.jsonl" \
    "$d/cuda_fp32/metrics.jsonl"
  [ "$RUN_LIMITED_STOP" = 1 ] && return
  cat "$OUT/l0.compare.log"
  # the best checkpoint (checkpoint.keep_best) evaluates to the validation loss logged at its step
  check l0.eval_best "$BUILD/moetrain" eval --ckpt "$ck/cuda_bf16/best" train.device=cuda
  local bs logged got
  bs=$(sed 's/^step_0*//' "$ck/cuda_bf16/best/latest" 2>/dev/null)
  logged=$(grep -a "\"step\": $bs," "$d/cuda_bf16/metrics.jsonl" | grep -o '"val_loss": [0-9.]*' | cut -d' ' -f2)
  got=$(grep -a '^{"eval"' "$OUT/l0.eval_best.log" | grep -o '"val_loss": [0-9.]*' | cut -d' ' -f2)
  # the same bf16 weights on the same validation windows: equal up to the reduction order
  local v=FAIL
  [ -n "$got" ] && [ -n "$logged" ] &&
    awk -v a="$got" -v b="$logged" 'BEGIN { exit !(a - b <= 1e-4 * b && b - a <= 1e-4 * b) }' && v=PASS
  [ "$v" = PASS ] || fail=1
  printf '%-36s %-4s eval on the best checkpoint (step %s): val_loss %s; logged at that step: %s (rel 1e-4)\n' \
    l0.best_loss "$v" "${bs:-?}" "${got:-none}" "${logged:-none}" | tee -a "$SUM"
  scripts/plot.py "$d/cpu_ep2" "$d/cuda_bf16" "$d/cuda_fp32" -o "$d/l0.png" >"$OUT/l0.plot.log" 2>&1 \
    || echo "l0: no plot (see l0.plot.log)"
}

# ---- parallel.comm=mpi: EP=2 with both ranks on one GPU ----------------------------------------
step_comm() {
  check comm env OUT="$OUT" CK="$WORK/comm" scripts/gpu_comm_mpi.sh "$BUILD"
  sed 's/^/  /' "$OUT/comm_mpi/summary.txt" 2>/dev/null | tee -a "$SUM"  # its rows in the summary too
}

step_generate() {
  if python3 -c "import torch, transformers" 2>/dev/null; then
    check generate.hf python3 scripts/generate_check.py --moetrain "$BUILD/moetrain" --work "$WORK/generate"
    tail -1 "$OUT/generate.hf.log"
  else
    echo "SKIP generate.hf (no torch/transformers)" | tee -a "$SUM"
  fi
  check generate.bench scripts/generate_bench.sh "$BUILD/moetrain"
  grep -a '^generate' "$OUT/generate.bench.log"
}

step_fp8() {
  check fp8.parity env MOETRAIN="$BUILD/moetrain" scripts/fp8_parity.sh "$OUT/fp8_parity" train.device=cuda
  sed 's/^/  /' "$OUT/fp8_parity/summary.txt" 2>/dev/null | tee -a "$SUM"  # its rows in the summary too
}

step_fp8speed() {
  [ -x "$BUILD/dev/gpu_bench" ] || check build.dev make -j"$(nproc)" BUILD="$BUILD" dev
  check fp8speed.ops "$BUILD/dev/gpu_bench" fp8
  check fp8speed.bench env OUT="$OUT/bench" MOETRAIN="$BUILD/moetrain" MBS="4 8" SEQ=4096 HF_VARIANTS=eager+compile \
    FP8="none experts linear" scripts/bench.sh
  grep -a '^|' "$OUT/fp8speed.bench.log" | tee -a "$SUM"
  local f mb
  for f in none experts; do
    for mb in 4 8; do
      check "fp8speed.stages.$f.mbs$mb" "$BUILD/moetrain" --config bench_8x7B_L2 train.steps=8 train.micro_batch=$mb \
        train.global_batch=$mb precision.fp8=$f log.profile=events
    done
  done
}

step_timings() {
  [ -x "$BUILD/dev/gpu_bench" ] && [ -x "$BUILD/dev/attn_docs_bench" ] || check build.dev make -j"$(nproc)" BUILD="$BUILD" dev
  check timings "$BUILD/dev/gpu_bench" all
  check timings.docs "$BUILD/dev/attn_docs_bench"
  check timings.fp8 "$BUILD/dev/gpu_bench" fp8
}

for s in $STEPS; do
  [ "$RUN_LIMITED_STOP" = 1 ] && { echo "gpu_check: interrupted before step $s" | tee -a "$SUM"; fail=1; break; }
  echo "== $s"
  case $s in
    tests | san | ckpt | l0 | comm | generate | fp8 | fp8speed | timings) "step_$s" ;;
    *) echo "gpu_check: unknown step '$s' (tests, san, ckpt, l0, comm, generate, fp8, fp8speed, timings)" | tee -a "$SUM"; fail=1 ;;
  esac
  pack_logs
done

[ "${KEEP_WORK:-0}" = 1 ] || rm -rf "$WORK"
pack_logs
echo "== summary ($OUT; every log in logs.tgz)"
cat "$SUM"
exit $fail
