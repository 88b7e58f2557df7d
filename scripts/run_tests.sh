#!/usr/bin/env bash
# Runs test binaries and sums their "N passed, N failed" lines. A binary named mpi_*_npK runs
# under mpirun with K ranks (mpi_* alone: 2). A binary that crashes or prints no summary counts
# as one failure. Lines a test prints that start with "skip" (a case this machine cannot run:
# one GPU for a multi-GPU test, not Hopper) are repeated as "SKIP name: ..." and counted.
# Ends with the total line, "N passed, N failed" (", N skipped" when any was); exits non-zero on
# any failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
P=0; F=0; S=0
for t in "$@"; do
  name=$(basename "$t")
  echo "== $name"
  if [[ $name == mpi_* ]]; then
    np=2; [[ $name =~ _np([0-9]+)$ ]] && np=${BASH_REMATCH[1]}
    out=$("$here/mpirun.sh" -np "$np" "$t" 2>&1); rc=$?
  else
    out=$("$t" 2>&1); rc=$?
  fi
  echo "$out" | grep -v -E '^[0-9]+ passed, [0-9]+ failed$'
  skips=$(echo "$out" | grep -i -E '^[[:space:]]*skip(ped)?[: ]' | sed 's/^[[:space:]]*//')
  if [ -n "$skips" ]; then
    echo "$skips" | sed "s|^|SKIP $name: |"
    S=$((S + $(echo "$skips" | wc -l)))
  fi
  lines=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$')
  if [ -z "$lines" ]; then
    echo "FAIL $name: exited $rc without a summary line"; F=$((F + 1)); continue
  fi
  p=$(echo "$lines" | awk '{s+=$1} END {print s}'); f=$(echo "$lines" | awk '{s+=$3} END {print s}')
  [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && { echo "FAIL $name: exit code $rc"; f=1; }
  P=$((P + p)); F=$((F + f))
done
echo "$P passed, $F failed$([ "$S" -gt 0 ] && echo ", $S skipped")"
[ "$F" -eq 0 ]
