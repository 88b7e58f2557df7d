#!/usr/bin/env bash
# gpu_comm_mpi.sh — the multi-rank GPU path on a one-GPU machine: parallel.comm=mpi (device
# buffers staged through page-locked host memory, MPI between the ranks) with both ranks of
# `mpirun -np 2` on GPU 0. The `comm` step of scripts/gpu_check.sh, or alone:
#
#   scripts/gpu_comm_mpi.sh [BUILD_DIR]     logs and metrics under $OUT/comm_mpi (build/gpu_logs)
#
# Steps (L0_sanity, 300 steps, bf16 on the GPU; each a line in the summary):
#   ep2_mpi       mpirun -np 2, parallel.ep=2, parallel.comm=mpi on GPU 0, checkpoints at 200, 300
#   ep1_gpu       one rank on the GPU, parallel.ep=1
#   ep2_cpu       mpirun -np 2 on the CPU (fp32), parallel.ep=2: the reference curve
#   compare       scripts/l0_compare.py: ep2_mpi and ep1_gpu against ep2_cpu, and ep2_mpi against
#                 ep1_gpu: final validation loss within 3% relative and the mean training-loss
#                 difference over the last half within 3% (bf16 rounding moves L0's final
#                 validation loss by about 1%; a staging bug moves it far more or NaNs it)
#   resume_gpu    step_200 of ep2_mpi (EP=2, two ranks) resumed at EP=1 on the GPU to 300,
#   resume_cpu    and at EP=1 on the CPU: each against ep2_mpi's steps 201-300, same tolerances
#   memcheck      compute-sanitizer memcheck on both ranks (EP=2, comm=mpi, 4 steps, a save and
#                 a resume=auto start): 0 errors on each
#   probe_mem     build/tests/gpu/probe_gpu_mem: the CUDA context, cuBLASLt workspace and NCCL
#                 buffers against `moetrain plan`'s estimates; then plan's L1_8x7B_ep table
set -u
cd "$(dirname "$0")/.." || exit 1
. scripts/limit.sh
BUILD=${1:-build}
OUT=${OUT:-build/gpu_logs}
D="$OUT/comm_mpi"
CK=${CK:-/tmp/moetrain_comm_mpi}
rm -rf "$D" "$CK"
mkdir -p "$D" "$CK"
BIN="$BUILD/moetrain"
MPI="scripts/mpirun.sh -np 2"
SUM="$D/summary.txt"
: >"$SUM"
fail=0
export NCCL_NVLS_ENABLE=0

step() {  # step NAME LIMIT_S CMD... (CMD and all it starts end at the limit: scripts/limit.sh)
  local name=$1 lim=$2 t0 t1 rc; shift 2
  [ "$RUN_LIMITED_STOP" = 1 ] && { fail=1; return 130; }
  t0=$(date +%s)
  run_limited "$lim" "$@" >"$D/$name.log" 2>&1
  rc=$?
  t1=$(date +%s)
  printf '%-22s rc=%-3s %4ss  %s\n' "comm_mpi/$name" "$rc" "$((t1 - t0))" \
    "$(grep -E 'ERROR SUMMARY|-> (ok|FAIL)|passed, [0-9]+ failed|^step +300' "$D/$name.log" | tail -1)" | tee -a "$SUM"
  [ "$rc" -eq 0 ] || fail=1
  return $rc
}

# checkpoint.dir= (nothing saved) unless a run's checkpoints are used: L0_sanity's own checkpoint.dir
# is runs/L0_sanity/ckpt in the repository
L0="--config L0_sanity train.steps=300 log.every=1"
step ep2_mpi 300 $MPI "$BIN" $L0 train.device=cuda parallel.ep=2 parallel.comm=mpi \
  checkpoint.dir="$CK/ep2_mpi" checkpoint.every=200 checkpoint.keep=0 log.dir="$D/ep2_mpi"
step ep1_gpu 300 "$BIN" $L0 train.device=cuda parallel.ep=1 log.dir="$D/ep1_gpu" checkpoint.dir=
step ep2_cpu 580 $MPI "$BIN" $L0 train.device=cpu parallel.ep=2 log.dir="$D/ep2_cpu" checkpoint.dir=
step compare 60 sh -c "python3 scripts/l0_compare.py '$D/ep2_cpu/metrics.jsonl' '$D/ep2_mpi/metrics.jsonl' '$D/ep1_gpu/metrics.jsonl' && \
  python3 scripts/l0_compare.py '$D/ep1_gpu/metrics.jsonl' '$D/ep2_mpi/metrics.jsonl'"
grep -E '^(reference|/)|-> ' "$D/compare.log"

# a save at EP=2 (two ranks, comm=mpi) resumed at EP=1, on the GPU and on the CPU
step resume_gpu 300 sh -c "'$BIN' $L0 train.device=cuda parallel.ep=1 checkpoint.resume='$CK/ep2_mpi/step_00000200' \
  log.dir='$D/resume_gpu' checkpoint.dir= && python3 scripts/l0_compare.py '$D/ep2_mpi/metrics.jsonl' '$D/resume_gpu/metrics.jsonl'"
step resume_cpu 580 sh -c "'$BIN' $L0 train.device=cpu parallel.ep=1 checkpoint.resume='$CK/ep2_mpi/step_00000200' \
  log.dir='$D/resume_cpu' checkpoint.dir= && python3 scripts/l0_compare.py '$D/ep2_mpi/metrics.jsonl' '$D/resume_cpu/metrics.jsonl'"
grep -E 'resumed from|-> ' "$D/resume_gpu.log" "$D/resume_cpu.log"

# compute-sanitizer memcheck with two ranks on one GPU: 4 steps, a save at 2 and 4, then a
# resume=auto start that runs 2 more (restore path under the sanitizer too)
if command -v compute-sanitizer >/dev/null; then
  SAN="compute-sanitizer --tool memcheck --error-exitcode 9 --log-file $D/memcheck.%q{OMPI_COMM_WORLD_RANK}.%p.txt"
  step memcheck 580 sh -c "$MPI $SAN '$BIN' --config L0_sanity train.steps=4 log.every=1 train.device=cuda parallel.ep=2 \
    parallel.comm=mpi checkpoint.dir='$CK/san' checkpoint.every=2 log.dir='$D/memcheck_run' && \
    $MPI $SAN '$BIN' --config L0_sanity train.steps=6 log.every=1 train.device=cuda parallel.ep=2 \
    parallel.comm=mpi checkpoint.dir='$CK/san' checkpoint.resume=auto checkpoint.async=true log.dir='$D/memcheck_run'"
  grep -h 'ERROR SUMMARY' "$D"/memcheck.*.txt | tee -a "$D/memcheck.log"
else
  echo "comm_mpi/memcheck       skipped: no compute-sanitizer" | tee -a "$SUM"
fi

if [ -x "$BUILD/tests/gpu/probe_gpu_mem" ]; then
  step probe_mem 120 "$BUILD/tests/gpu/probe_gpu_mem"
  sed -n '/^check gpu memory/,/^ok\|^FAIL/p' "$D/probe_mem.log"
fi
"$BIN" plan --config L1_8x7B_ep >"$D/plan_L1.log" 2>&1
sed -n '/^memory per rank/,$p' "$D/plan_L1.log"
rm -rf "$CK"
exit $fail
