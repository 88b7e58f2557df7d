# shellcheck shell=bash disable=SC2034
# limit.sh — sourced by the GPU scripts (gpu_check.sh, gpu_comm_mpi.sh, bench.sh).
#
# run_limited LIMIT_S CMD...: CMD under `timeout` in a process group of its own, so that when the
# limit passes (SIGTERM, SIGKILL 10 s later) everything CMD started goes with it: mpirun and its
# ranks, the moetrain a script runs, torch.compile's workers. (`timeout --foreground` signals CMD
# alone and leaves its children running on the GPU into the next step.) Whatever of the group
# outlives CMD, after a normal exit too, gets SIGKILL 10 s after CMD has ended. A SIGINT or
# SIGTERM to the calling script ends CMD's group the same way and sets RUN_LIMITED_STOP=1 for the
# caller to stop after. CMD's stdin is /dev/null. Returns CMD's exit status: 124 or 137 when the
# limit ended it.
RUN_LIMITED_STOP=0
run_limited() {
  local lim=$1 pid rc
  shift
  timeout -k 10 "$lim" "$@" &
  pid=$!
  # shellcheck disable=SC2064  # the pid is meant to be expanded now
  trap "RUN_LIMITED_STOP=1; kill -TERM $pid 2>/dev/null" INT TERM
  wait "$pid"
  rc=$?
  # a trapped signal ends `wait` early: wait again until timeout itself has ended
  while kill -0 "$pid" 2>/dev/null; do
    wait "$pid"
    rc=$?
  done
  # timeout returns as soon as CMD itself has ended, and then sends no SIGKILL: what CMD started
  # may still run (a moetrain that finishes its step and saves on SIGTERM, under a script that
  # died of it). It gets 10 s more, then the group gets SIGKILL.
  local i=0
  while kill -0 -- "-$pid" 2>/dev/null && [ $i -lt 10 ]; do
    sleep 1
    i=$((i + 1))
  done
  kill -KILL -- "-$pid" 2>/dev/null
  trap - INT TERM
  return "$rc"
}
