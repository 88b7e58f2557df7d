"""Compares L0_sanity loss traces from metrics.jsonl files: the first is the reference (the CPU
run), each other one is checked against it. Standard library only.

Usage: python3 scripts/l0_compare.py REF.jsonl RUN.jsonl [RUN.jsonl ...] [--tol-val F] [--tol-mean F]

Per run it prints the mean and the worst relative difference of the training loss over the
logged steps, and the validation losses side by side. Exit 1 when a run's final validation loss
differs from the reference's by more than --tol-val (relative, default 0.03) or its mean
training-loss difference over the last half of the steps exceeds --tol-mean (default 0.03).

Why loose: two runs that differ only in rounding (bf16 against fp32, or another summation order)
separate step by step; what must agree is the curve, not the bits. bf16 noise on this model moves
the final validation loss by about 1%.
"""
import json
import sys


def load(path):
    steps, val = {}, {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "step" not in r or "loss" not in r:
                continue
            steps[r["step"]] = r["loss"]
            if r.get("val_loss") is not None:
                val[r["step"]] = r["val_loss"]
    return steps, val


def main(argv):
    tol_val, tol_mean, paths = 0.03, 0.03, []
    i = 0
    while i < len(argv):
        if argv[i] == "--tol-val":
            tol_val = float(argv[i + 1]); i += 2
        elif argv[i] == "--tol-mean":
            tol_mean = float(argv[i + 1]); i += 2
        else:
            paths.append(argv[i]); i += 1
    if len(paths) < 2:
        print(__doc__)
        return 2
    ref_steps, ref_val = load(paths[0])
    if not ref_steps:
        print(f"{paths[0]}: no steps")
        return 1
    print(f"reference {paths[0]}: {len(ref_steps)} logged steps, val {sorted(ref_val.items())}")
    bad = 0
    for p in paths[1:]:
        steps, val = load(p)
        common = sorted(set(steps) & set(ref_steps))
        if not common:
            print(f"{p}: no steps in common with the reference")
            bad = 1
            continue
        rel = [abs(steps[s] - ref_steps[s]) / abs(ref_steps[s]) for s in common]
        late = [r for s, r in zip(common, rel) if s > common[-1] / 2] or rel
        mean_late = sum(late) / len(late)
        worst = max(rel)
        last_v = max(set(val) & set(ref_val)) if set(val) & set(ref_val) else None
        dv = abs(val[last_v] - ref_val[last_v]) / ref_val[last_v] if last_v else float("inf")
        ok = dv <= tol_val and mean_late <= tol_mean
        bad |= not ok
        print(f"{p}: {len(common)} steps; train loss rel diff mean(last half) {mean_late:.4f} worst {worst:.4f} "
              f"(step {common[rel.index(worst)]}); val at step {last_v}: {val.get(last_v, float('nan')):.4f} "
              f"vs {ref_val.get(last_v, float('nan')):.4f} (rel {dv:.4f}) -> {'ok' if ok else 'FAIL'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
