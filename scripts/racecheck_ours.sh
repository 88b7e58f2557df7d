#!/usr/bin/env bash
# racecheck_ours.sh LOG... — the kernels `compute-sanitizer --tool racecheck` reported hazards in,
# counted per kernel, one log at a time; a log fails when any of them is ours, that is, not one of
# cuBLASLt's nvjet_* kernels (vendor code we cannot change: on an H200 racecheck reports a few in them, at
# the GEMM tests' tile-preference plans). A log without a RACECHECK SUMMARY (the run died) fails
# too. Ends with "N passed, N failed"; exit status 1 when any failed.
pass=0 failn=0
for log in "$@"; do
  if ! grep -q 'RACECHECK SUMMARY' "$log" 2>/dev/null; then
    echo "FAIL $log: no RACECHECK SUMMARY (did the run finish?)"; failn=$((failn + 1)); continue
  fi
  kernels=$(grep -o 'Race reported between [A-Za-z]* access at [^(<+]*' "$log" | awk '{print $NF}' | sort | uniq -c)
  [ -n "$kernels" ] && echo "$kernels" | sed "s|^|  $(basename "$log"): hazards in |"
  ours=$(echo "$kernels" | awk 'NF == 2 && $2 !~ /^nvjet_/' | wc -l)
  if [ "$ours" -gt 0 ]; then echo "FAIL $log: hazards in $ours kernel(s) of ours"; failn=$((failn + 1))
  else echo "ok   $log: no hazards in our kernels"; pass=$((pass + 1)); fi
done
echo "$pass passed, $failn failed"
[ "$failn" -eq 0 ]
