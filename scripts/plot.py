#!/usr/bin/env python3
"""plot.py — one PNG of one or several training runs, from their metrics.jsonl.

usage: scripts/plot.py RUN [RUN ...] [-o OUT.png] [--label NAME ...] [--title TEXT]

RUN is a log directory (log.dir: its metrics.jsonl) or a metrics.jsonl file. Panels: training
loss (raw and smoothed) and validation loss against tokens; learning rate; gradient norm; tokens/s
and MFU; expert load max/mean; a table of each run's numbers. Skipped (non-finite) steps are
marked in red. Several runs are overlaid, one colour each, with a legend.
OUT defaults to RUN/metrics.png for one run, metrics_compare.png for several.

Needs matplotlib (Debian: python3-matplotlib, installed by `make deps`). When the python3 first
on PATH lacks it (a pyenv or a virtual environment), the script runs itself again with the
system's /usr/bin/python3. Exit codes: 0 written, 2 bad input, 3 matplotlib missing.
"""
import os
import sys

# This directory is sys.path[0] and nothing here is imported from it: drop it, so that no file
# here can stand in for a module of the same name.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402

SYSTEM_PY = "/usr/bin/python3"


def import_matplotlib():
    try:
        import matplotlib
    except ImportError:
        here = os.path.realpath(sys.executable or "")
        if (os.path.exists(SYSTEM_PY) and os.path.realpath(SYSTEM_PY) != here
                and not os.environ.get("MOETRAIN_PLOT_REEXEC")):
            os.environ["MOETRAIN_PLOT_REEXEC"] = "1"
            os.execv(SYSTEM_PY, [SYSTEM_PY, os.path.abspath(__file__)] + sys.argv[1:])
        sys.stderr.write("plot.py: matplotlib is not installed for %s (run `make deps`: Debian package "
                         "python3-matplotlib)\n" % (sys.executable or "python3"))
        sys.exit(3)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker
    return plt, ticker


def metrics_path(run):
    if os.path.isdir(run):
        return os.path.join(run, "metrics.jsonl")
    return run


def load(run):
    """The run's step records by step (a later line for the same step wins), in step order."""
    path = metrics_path(run)
    recs = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                sys.stderr.write("plot.py: %s:%d: not JSON, skipped\n" % (path, n))
                continue
            if isinstance(r, dict) and isinstance(r.get("step"), int):
                recs[r["step"]] = r
    return [recs[k] for k in sorted(recs)]


def label_for(run, others):
    """The directory name, with its parent when two runs share it."""
    p = os.path.abspath(run)
    if not os.path.isdir(p):
        p = os.path.dirname(p)
    base = os.path.basename(p)
    same = [o for o in others if o != run and os.path.basename(os.path.abspath(
        o if os.path.isdir(o) else os.path.dirname(os.path.abspath(o)))) == base]
    if same:
        return os.path.join(os.path.basename(os.path.dirname(p)), base)
    return base


def num(r, key):
    v = r.get(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def series(recs, xkey, ykey):
    xs, ys = [], []
    for r in recs:
        x, y = num(r, xkey), num(r, ykey)
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def smooth(ys, frac=0.03):
    """Centred moving average over about frac of the points (the edges use what they have)."""
    n = len(ys)
    w = max(1, int(n * frac)) // 2
    if w == 0:
        return list(ys)
    pre = [0.0]
    for y in ys:
        pre.append(pre[-1] + y)
    out = []
    for i in range(n):
        a, b = max(0, i - w), min(n, i + w + 1)
        out.append((pre[b] - pre[a]) / (b - a))
    return out


def raw_and_smooth(ax, recs, key, color, label):
    """key against step: raw (faint) and smoothed; nothing where no record has it. Returns the values."""
    x, y = series(recs, "step", key)
    if x:
        ax.plot(x, y, color=color, alpha=0.25, lw=0.8)
        ax.plot(x, smooth(y), color=color, lw=1.6, label=label)
    return y


def fmt_tokens(x):
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return ("%.3g" % (x / div)) + unit
    return "%.3g" % x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="log directories or metrics.jsonl files")
    ap.add_argument("-o", "--out", help="the PNG to write")
    ap.add_argument("--label", action="append", default=[], help="legend name of each run, in order")
    ap.add_argument("--title", help="figure title")
    args = ap.parse_args()

    runs = []
    for i, run in enumerate(args.runs):
        path = metrics_path(run)
        if not os.path.isfile(path):
            sys.stderr.write("plot.py: %s: no such file (a log.dir holds metrics.jsonl)\n" % path)
            return 2
        recs = load(run)
        if not recs:
            sys.stderr.write("plot.py: %s: no step records\n" % path)
            return 2
        label = args.label[i] if i < len(args.label) else label_for(run, args.runs)
        runs.append((label, recs))
    out = args.out or (os.path.join(os.path.dirname(metrics_path(args.runs[0])) or ".", "metrics.png")
                       if len(runs) == 1 else "metrics_compare.png")

    plt, ticker = import_matplotlib()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig = plt.figure(figsize=(17, 14))
    gs = fig.add_gridspec(3, 3)
    ax_loss, ax_zoom, ax_lr = (fig.add_subplot(gs[0, k]) for k in range(3))
    ax_gn, ax_speed, ax_mfu = (fig.add_subplot(gs[1, k]) for k in range(3))
    ax_load = fig.add_subplot(gs[2, 0])
    ax_text = fig.add_subplot(gs[2, 1:])
    zoom_pts = []  # (tokens, loss) of every run, raw and validation, for the zoom's limits
    tok_fmt = ticker.FuncFormatter(lambda x, _: fmt_tokens(x))
    any_skipped = False
    rows = []

    for i, (label, recs) in enumerate(runs):
        c = colors[i % len(colors)]
        # loss against tokens: raw (faint), smoothed, validation (markers)
        xs, ys = series(recs, "tokens", "loss")
        vx, vy = series(recs, "tokens", "val_loss")
        zoom_pts += list(zip(xs, ys)) + list(zip(vx, vy))
        for ax in (ax_loss, ax_zoom):
            if xs:
                ax.plot(xs, ys, color=c, alpha=0.25, lw=0.8)
                ax.plot(xs, smooth(ys), color=c, lw=1.8, label=label + " train")
            if vx:
                ax.plot(vx, vy, color=c, lw=1.2, ls="--", marker="o", ms=5, label=label + " validation")
                b = min(range(len(vy)), key=lambda k: vy[k])
                ax.plot([vx[b]], [vy[b]], marker="*", ms=15, color=c, mec="black", mew=0.7, ls="none")
        sx, sy = series(recs, "step", "lr")
        ax_lr.plot(sx, sy, color=c, lw=1.5, label=label)
        raw_and_smooth(ax_gn, recs, "grad_norm", c, label)
        ty = raw_and_smooth(ax_speed, recs, "tokens_per_s", c, label + " tokens/s")
        my = raw_and_smooth(ax_mfu, recs, "mfu_pct", c, label)
        raw_and_smooth(ax_load, recs, "expert_load_max_over_mean", c, label)
        # skipped steps: red ticks in every step panel, crosses on the loss curve
        skipped = [r for r in recs if r.get("skipped")]
        if skipped:
            any_skipped = True
            for ax in (ax_lr, ax_gn, ax_speed, ax_mfu, ax_load):
                for r in skipped:
                    ax.axvline(r["step"], color="red", alpha=0.35, lw=1)
            toks = [num(r, "tokens") for r in skipped if num(r, "tokens") is not None]
            for ax in (ax_loss, ax_zoom):
                if toks:
                    ax.plot(toks, [0.0] * len(toks), "x", color="red", ms=8, mew=2,
                            transform=ax.get_xaxis_transform(), clip_on=False)
        # the numbers of the run
        last = recs[-1]
        best = (min(zip(vy, vx), key=lambda p: p[0]) if vx else None)
        best_step = None
        if best:
            best_step = next(r["step"] for r in recs if num(r, "val_loss") == best[0])
        mean_tok = sum(ty[len(ty) // 4:]) / max(1, len(ty) - len(ty) // 4) if ty else None
        mean_mfu = sum(my[len(my) // 4:]) / max(1, len(my) - len(my) // 4) if my else None
        el = num(last, "elapsed_s")
        rows.append([label, "%d" % last["step"], fmt_tokens(num(last, "tokens") or 0),
                     "%d:%02d:%02d" % (el // 3600, el // 60 % 60, el % 60) if el is not None else "-",
                     "%.4f" % num(last, "loss") if num(last, "loss") is not None else "-",
                     ("%.4f @%d" % (best[0], best_step)) if best else "-",
                     "%.0f" % mean_tok if mean_tok else "-",
                     "%.1f%%" % mean_mfu if mean_mfu is not None else "none",
                     "%d" % len(skipped)])

    ax_loss.set_title("loss (nats/token) against tokens  (* = best validation)")
    ax_loss.set_xlabel("tokens")
    ax_loss.xaxis.set_major_formatter(tok_fmt)
    ax_loss.set_ylabel("loss")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8, loc="best")

    # the zoom: the last 90% of the tokens, the loss range there (1st-99th percentile of the
    # training loss, every validation)
    ax_zoom.set_title("loss, zoomed: after the first 10% of the tokens")
    ax_zoom.set_xlabel("tokens")
    ax_zoom.xaxis.set_major_formatter(tok_fmt)
    ax_zoom.grid(alpha=0.3)
    if zoom_pts:
        tmax = max(t for t, _ in zoom_pts)
        tmin = 0.1 * tmax
        late = sorted(y for t, y in zoom_pts if t >= tmin)
        if late:
            lo = late[int(0.01 * (len(late) - 1))]
            hi = late[int(0.99 * (len(late) - 1))]
            for _, recs in runs:
                for r in recs:
                    v, t = num(r, "val_loss"), num(r, "tokens")
                    if v is not None and t is not None and t >= tmin:
                        lo, hi = min(lo, v), max(hi, v)
            pad = 0.08 * (hi - lo) if hi > lo else 0.05 * abs(hi) + 1e-3
            ax_zoom.set_xlim(tmin, tmax * 1.02)
            ax_zoom.set_ylim(lo - pad, hi + pad)

    ax_lr.set_title("learning rate")
    ax_lr.set_xlabel("step")
    ax_lr.yaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: "0" if x == 0 else "%.3g" % x))
    ax_lr.grid(alpha=0.3)

    ax_gn.set_title("gradient norm (before clipping)")
    ax_gn.set_xlabel("step")
    gys = [y for l in ax_gn.get_lines() for y in l.get_ydata() if y > 0]
    if gys and max(gys) / min(gys) > 50:
        ax_gn.set_yscale("log")
    ax_gn.grid(alpha=0.3)

    ax_speed.set_title("throughput (tokens/s, all devices)")
    ax_speed.set_xlabel("step")
    ax_speed.yaxis.set_major_formatter(tok_fmt)
    ax_speed.set_ylim(bottom=0)
    ax_speed.grid(alpha=0.3)

    ax_mfu.set_title("MFU % (model FLOPs / dense bf16 peak)")
    ax_mfu.set_xlabel("step")
    ax_mfu.grid(alpha=0.3)
    if ax_mfu.get_lines():
        ax_mfu.set_ylim(bottom=0)
    else:
        ax_mfu.text(0.5, 0.5, "no MFU: the device's peak is unknown\n(the CPU; or set log.peak_tflops)",
                    ha="center", va="center", transform=ax_mfu.transAxes, color="gray")
        ax_mfu.set_yticks([])
        ax_mfu.set_xticks([])

    ax_load.set_title("expert load: max / mean tokens per expert (1 = balanced)")
    ax_load.set_xlabel("step")
    ax_load.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax_load.set_ylim(bottom=0.95)
    ax_load.grid(alpha=0.3)

    if len(runs) > 1:
        ax_lr.legend(fontsize=8)
    if any_skipped:
        from matplotlib.lines import Line2D
        ax_gn.legend(handles=ax_gn.get_legend_handles_labels()[0] + [
            Line2D([], [], color="red", alpha=0.5, label="skipped step (non-finite)")], fontsize=8)

    ax_text.axis("off")
    cols = ["run", "steps", "tokens", "time", "last loss", "best val @step", "tokens/s", "MFU", "skipped"]
    tab = ax_text.table(cellText=rows, colLabels=cols, loc="upper center", cellLoc="center")
    tab.auto_set_font_size(False)
    tab.set_fontsize(10)
    tab.scale(1.0, 1.6)
    for (r, col), cell in tab.get_celld().items():
        if r > 0 and col == 0:
            cell.get_text().set_color(colors[(r - 1) % len(colors)])
            cell.get_text().set_fontweight("bold")
    tab.auto_set_column_width(list(range(len(cols))))
    ax_text.set_title("tokens/s and MFU: means over the last 3/4 of the steps", fontsize=9, loc="left", color="dimgray")

    fig.suptitle(args.title or ("moetrain: " + ", ".join(l for l, _ in runs)), fontsize=13)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, out)
    print("plot: wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
