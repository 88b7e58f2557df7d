#!/usr/bin/env bash
# Runs test binaries and sums their "N passed, N failed" lines. A binary named mpi_*_npK runs
# under mpirun with K ranks (mpi_* alone: 2). A binary that crashes or prints no summary counts
# as one failure. Ends with the total line; exits non-zero on any failure.
set -u
here=$(cd "$(dirname "$0")" && pwd)
P=0; F=0
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
  lines=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$')
  if [ -z "$lines" ]; then
    echo "FAIL $name: exited $rc without a summary line"; F=$((F + 1)); continue
  fi
  p=$(echo "$lines" | awk '{s+=$1} END {print s}'); f=$(echo "$lines" | awk '{s+=$3} END {print s}')
  [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && { echo "FAIL $name: exit code $rc"; f=1; }
  P=$((P + p)); F=$((F + f))
done
echo "$P passed, $F failed"
[ "$F" -eq 0 ]
