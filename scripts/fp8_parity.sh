#!/usr/bin/env bash
# fp8_parity.sh — FP8 loss parity: configs/fp8_parity.yaml trained three times from the same seed on
# the same data, precision.fp8 = none (bf16 on GPUs), experts and linear; the three metrics.jsonl
# plotted side by side (scripts/plot.py) and a summary of the validation curves.
#
#   scripts/fp8_parity.sh OUTDIR [section.key=value ...]
#
# OUTDIR/{none,experts,linear}/metrics.jsonl and .log, OUTDIR/fp8_parity.png, OUTDIR/summary.txt.
# Overrides apply to all three runs (e.g. train.device=cuda, or a small model to try the script on
# the CPU). The summary: each run's final validation loss, its relative difference to fp8 none
# (PASS within 0.5%), the largest relative gap of the validation curves at any validation step,
# skipped (non-finite) steps and whether the run finished. Exit status 0 when every run finished
# and both FP8 runs pass. Environment: MOETRAIN (default build/moetrain).
set -u
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  "" | -*) usage; exit 2 ;;
esac
OUTDIR=$1; shift
# OUTDIR and MOETRAIN as the caller gave them (relative to where it runs), then the repository root
mkdir -p -- "$OUTDIR" || exit 2
OUTDIR=$(cd -- "$OUTDIR" && pwd) || exit 2
[ -n "${MOETRAIN:-}" ] && MOETRAIN=$(realpath -- "$MOETRAIN")
cd "$(dirname "$0")/.." || exit 1
MOETRAIN=${MOETRAIN:-build/moetrain}
[ -x "$MOETRAIN" ] || { echo "fp8_parity: $MOETRAIN not found (make, or set MOETRAIN)"; exit 2; }
MODES="none experts linear"
for m in $MODES; do
  rm -rf "${OUTDIR:?}/$m"
  t0=$SECONDS
  "$MOETRAIN" --config fp8_parity log.dir="$OUTDIR/$m" "$@" precision.fp8="$m" >"$OUTDIR/$m.log" 2>&1
  rc=$?
  echo "$rc" >"$OUTDIR/$m.rc"
  echo "fp8_parity: precision.fp8=$m: exit $rc, $((SECONDS - t0)) s ($OUTDIR/$m.log)"
done
scripts/plot.py "$OUTDIR/none" "$OUTDIR/experts" "$OUTDIR/linear" --label "fp8 none" --label "fp8 experts" \
  --label "fp8 linear" --title "FP8 loss parity (configs/fp8_parity.yaml)" -o "$OUTDIR/fp8_parity.png" \
  >"$OUTDIR/plot.log" 2>&1 || echo "fp8_parity: no plot (see $OUTDIR/plot.log)"
# (the verdict is python's exit status, not tee's)
set -o pipefail
# shellcheck disable=SC2086  # MODES is a word list
python3 - "$OUTDIR" $MODES <<'PY' | tee "$OUTDIR/summary.txt"
import json, math, sys
out, modes = sys.argv[1], sys.argv[2:]
TOL = 0.005  # the final validation loss within 0.5% relative of fp8 none
runs = {}
for m in modes:
    steps, val, skipped, bad = {}, {}, 0, 0
    try:
        with open(f"{out}/{m}/metrics.jsonl") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if "step" not in r:
                    continue
                steps[r["step"]] = r
                skipped += int(r.get("skipped", 0) or 0)
                if not (isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])):
                    bad += 1
                if isinstance(r.get("val_loss"), (int, float)):
                    val[r["step"]] = r["val_loss"]
    except OSError:
        pass
    try:
        rc = open(f"{out}/{m}.rc").read().strip()
    except OSError:
        rc = "?"
    runs[m] = dict(steps=steps, val=val, skipped=skipped, bad=bad, rc=rc)
base = runs[modes[0]]
ok = True
print(f"fp8 parity ({out}): final validation loss, relative to fp8 {modes[0]} (pass: within {TOL:.1%})")
print(f"{'precision.fp8':<14} {'steps':>6} {'final val':>10} {'rel diff':>9} {'largest gap (step)':>22} {'skipped':>8} {'exit':>5}  verdict")
for m in modes:
    r = runs[m]
    last = max(r["steps"]) if r["steps"] else 0
    fv = r["val"][max(r["val"])] if r["val"] else float("nan")
    bv = base["val"][max(base["val"])] if base["val"] else float("nan")
    rel = (fv - bv) / bv if bv == bv and bv != 0 else float("nan")
    common = sorted(set(r["val"]) & set(base["val"]))
    gap, gstep = 0.0, None
    for s in common:
        g = abs(r["val"][s] - base["val"][s]) / abs(base["val"][s])
        if g >= gap:
            gap, gstep = g, s
    finished = r["rc"] == "0" and r["val"] and r["bad"] == 0
    if m == modes[0]:
        verdict = "baseline" if finished else "FAIL (did not finish cleanly)"
        ok &= bool(finished)
        relt, gapt = "-", "-"
    else:
        passed = finished and abs(rel) <= TOL
        verdict = "PASS" if passed else ("FAIL (did not finish cleanly)" if not finished else "FAIL (beyond 0.5%)")
        ok &= bool(passed)
        relt = f"{rel:+.3%}"
        gapt = f"{gap:.3%} ({gstep})" if gstep is not None else "-"
    print(f"{m:<14} {last:>6} {fv:>10.5f} {relt:>9} {gapt:>22} {r['skipped']:>8} {r['rc']:>5}  {verdict}")
    if r["bad"]:
        print(f"  {m}: {r['bad']} step(s) with a non-finite loss")
print(f"fp8: {'PASS' if ok else 'FAIL'} (plot: {out}/fp8_parity.png)")
sys.exit(0 if ok else 1)
PY
