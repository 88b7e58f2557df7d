#!/usr/bin/env bash
# ab.sh — an A/B (or A/B/C...) of training-step settings on one GPU, alternated so that the
# machine's drift (clocks at the power limit, temperature) falls on every setting alike, and
# stopped at a deadline: what to run when comparing two builds or two config values.
#
#   dev/ab.sh SETTINGS_FILE [ROUNDS]
#
# SETTINGS_FILE: one setting per line, a name and then words, each a config override
# (section.key=value), an environment assignment (NAME=value) or BIN=path (another build of
# moetrain); blank lines and lines starting with # are skipped. For example:
#     base
#     keep    train.keep_swiglu=false
#     other   BIN=../other/build/moetrain
# Each round runs every setting once (A B C A B C ...), ROUNDS rounds (default 3), each run
# bench_8x7B_L2 (CONFIG) at micro-batch MBS (default 8) with ARGS added; the step time is the
# run's {"bench": ...} line (the mean over its steady steps).
# Environment: MBS, SEQ (4096), CONFIG (bench_8x7B_L2), ARGS, DEADLINE (seconds from the start
# after which no new run starts; default none), RUN_TIMEOUT (300), OUT (build/ab/DATE).
# Output: one line per run, then per setting the median, min and max step ms and the median's
# difference from the first setting's; everything in $OUT/ab.log, the runs' logs beside it.
set -u
cd "$(dirname "$0")/.." || exit 1
[ $# -ge 1 ] && [ -f "$1" ] || { sed -n '2,20p' "$0"; exit 2; }
FILE=$1
ROUNDS=${2:-3}
MBS=${MBS:-8}
SEQ=${SEQ:-4096}
CONFIG=${CONFIG:-bench_8x7B_L2}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
OUT=${OUT:-build/ab/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
LOG=$OUT/ab.log
names=() settings=()
while read -r name rest; do
  case $name in '' | '#'*) continue ;; esac
  names+=("$name"); settings+=("$rest")
done <"$FILE"
[ ${#names[@]} -gt 0 ] || { echo "ab.sh: no settings in $FILE"; exit 2; }
echo "ab: ${names[*]} x $ROUNDS rounds, $CONFIG micro-batch $MBS seq $SEQ ${ARGS:-}" | tee "$LOG"

for ((r = 1; r <= ROUNDS; r++)); do
  for i in "${!names[@]}"; do
    if [ -n "${DEADLINE:-}" ] && [ "$SECONDS" -ge "$DEADLINE" ]; then
      echo "ab: deadline (${DEADLINE}s) reached: no more runs" | tee -a "$LOG"; break 2
    fi
    n=${names[$i]} bin=build/moetrain envs=() over=()
    for w in ${settings[$i]}; do
      case $w in
        BIN=*) bin=${w#BIN=} ;;
        *.*=*) over+=("$w") ;;  # a config override has a dot in its key
        *=*) envs+=("$w") ;;
        *) echo "ab.sh: '$w' in setting $n is neither NAME=value nor section.key=value"; exit 2 ;;
      esac
    done
    rl=$OUT/$n.r$r.log
    # shellcheck disable=SC2086  # ARGS is a word list
    env "${envs[@]}" timeout --foreground -k 10 "$RUN_TIMEOUT" "$bin" --config "$CONFIG" train.micro_batch="$MBS" \
      train.global_batch="$MBS" train.seq_len="$SEQ" ${ARGS:-} "${over[@]}" >"$rl" 2>&1
    rc=$?
    ms=$(grep '^{"bench"' "$rl" | tail -1 | sed -n 's/.*"step_ms": *\([0-9.]*\).*/\1/p')
    printf 'ab: round %d %-16s %s\n' "$r" "$n" "${ms:-failed (exit $rc, $rl)}" | tee -a "$LOG"
    [ -n "$ms" ] && echo "$n $ms" >>"$OUT/steps.txt"
  done
done

[ -f "$OUT/steps.txt" ] || { echo "ab: no run finished"; exit 1; }
set -o pipefail  # the exit status is python's, not tee's
python3 - "$OUT/steps.txt" "${names[@]}" <<'EOF' | tee -a "$LOG"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
base = None
for n in sys.argv[2:]:
    v = [float(ms) for name, ms in rows if name == n]
    if not v:
        print(f"ab: {n:16s} no finished run"); continue
    med = statistics.median(v)
    base = med if base is None else base
    print(f"ab: {n:16s} median {med:8.1f} ms  min {min(v):8.1f}  max {max(v):8.1f}  n {len(v)}  "
          f"{100 * (med - base) / base:+.1f}% against the first")
EOF
