#!/usr/bin/env bash
# mpirun with what this machine needs and nothing more: --allow-run-as-root only as root,
# --oversubscribe only when there are fewer cores than ranks. Usage: mpirun.sh -np N cmd...
#
# Signals: Open MPI's mpirun answers SIGTERM and SIGINT by killing the ranks (SIGTERM, then
# SIGKILL about a second later), too soon for a step and a checkpoint; SIGUSR1 it forwards to
# every rank and waits. So this script runs mpirun as its child and turns SIGTERM and SIGINT
# (Ctrl-C) into SIGUSR1 for it: the ranks finish the step, save and exit 3, which this script
# returns. A second SIGTERM or SIGINT is passed on as it is (mpirun then ends the job now). On a
# terminal mpirun runs in its own session, so Ctrl-C reaches this script only. docs/cluster.md.
set -eu
np=1
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[$i]}" = "-np" ] && np=${args[$((i + 1))]}
done
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
[ "$(nproc)" -lt "$np" ] && extra+=(--oversubscribe)
# A small machine or a container often has no high-speed network: keep Open MPI on shared memory.
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / np > 0 ? $(nproc) / np : 1 ))}
sid=()
[ -t 0 ] && command -v setsid > /dev/null && sid=(setsid)
child=0; sent=0
# shellcheck disable=SC2317  # called by the traps
forward() {
  [ "$child" -ne 0 ] || return 0
  if [ "$sent" -eq 0 ]; then sent=1; kill -USR1 "$child" 2>/dev/null || true
  else kill -"$1" "$child" 2>/dev/null || true; fi
}
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'kill -USR1 "$child" 2>/dev/null || true' USR1
set +e
"${sid[@]}" mpirun "${extra[@]}" -x OMP_NUM_THREADS "$@" &
child=$!
# wait returns early (128 + signal) when a trapped signal arrives, and mpirun may end while the
# trap runs: wait until it is gone, then once more for its own exit code, which bash keeps.
wait "$child"
while kill -0 "$child" 2>/dev/null; do wait "$child"; done
wait "$child"; rc=$?
exit "$rc"
