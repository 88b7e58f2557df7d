"""Prints the benchmark table from scripts/bench.sh's results.jsonl: every run, and per size
moetrain against the best Hugging Face variant (highest tokens/s). Standard library only.
Usage: python3 scripts/bench_compare.py [--gpu NAME] [--peak TFLOPS] results.jsonl [more.jsonl ...]
A line is one JSON object with "impl" ("moetrain" or the HF variant), "mbs", "seq", and either
"tokens_per_s", "model_tflops", "peak_gib", "step_ms" or "error".

MFU = model TFLOP/s over the GPU's dense bf16 tensor-core peak, looked up by the GPU's name
(--gpu, else a row's "device") in PEAKS; --peak or the environment's PEAK_TFLOPS overrides it,
and an unknown GPU gets "n/a"."""
import json
import os
import sys

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendor's data sheets. The first
# entry whose pattern occurs in the GPU's name wins, so the more specific names come first.
PEAKS = [
    ("H100 PCIe", 756.0),
    ("H100", 989.4),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H200", 989.4),  # also GH200
    ("A100", 312.0),
    ("B200", 2250.0),
]


def peak_tflops(gpu, override=None):
    """The dense bf16 peak for a GPU name, or None when unknown."""
    if override:
        return float(override)
    for pat, tf in PEAKS:
        if gpu and pat.lower() in gpu.lower():
            return tf
    return None


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    r = json.loads(line)
                except ValueError as e:
                    print(f"{p}:{n}: not JSON ({e}); skipped", file=sys.stderr)
                    continue
                if "impl" not in r:
                    continue
                r["mbs"], r["seq"] = int(r.get("mbs", 0)), int(r.get("seq", 0))
                rows.append(r)
    return rows


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def mfu(r, peak):
    return "n/a" if not peak or r.get("model_tflops") is None else f"{100 * r['model_tflops'] / peak:.1f}%"


def is_ours(r):
    """moetrain's rows: "moetrain", or "moetrain fp8=MODE" (bench.sh FP8=...)."""
    return r["impl"].startswith("moetrain")


def table(rows, gpu="", peak=None):
    out = []
    sizes = sorted({(r["mbs"], r["seq"]) for r in rows})
    out.append(f"GPU: {gpu or 'unknown'}; MFU against " +
               (f"{peak:g} dense bf16 TFLOP/s" if peak else "n/a (unknown GPU: set PEAK_TFLOPS)"))
    out.append("")
    out.append("| micro-batch | seq | implementation | step ms | tokens/s | model TFLOP/s | MFU | peak GiB | tokens/s vs best HF |")
    out.append("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    verdicts = []
    for mbs, seq in sizes:
        here = [r for r in rows if (r["mbs"], r["seq"]) == (mbs, seq)]
        hf = [r for r in here if not is_ours(r) and "error" not in r and r.get("tokens_per_s")]
        best = max(hf, key=lambda r: r["tokens_per_s"]) if hf else None
        ours = [r for r in here if is_ours(r)]
        for r in sorted(here, key=lambda r: (not is_ours(r), r["impl"])):
            name = (f"**{r['impl']}**" if is_ours(r) else "HF " + r["impl"]) + (" (best HF)" if r is best else "")
            if "error" in r:
                out.append(f"| {mbs} | {seq} | {name} | failed: {str(r['error'])[:80]} | | | | | |")
                continue
            ratio = f"{r['tokens_per_s'] / best['tokens_per_s']:.2f}×" if best else "—"
            out.append(f"| {mbs} | {seq} | {name} | {fmt(r.get('step_ms'), '.1f')} | {fmt(r.get('tokens_per_s'), ',.0f')} | "
                       f"{fmt(r.get('model_tflops'), '.1f')} | {mfu(r, peak)} | {fmt(r.get('peak_gib'), '.1f')} | {ratio} |")
        for o in ours:
            if "error" in o:
                verdicts.append(f"micro-batch {mbs}, seq {seq}: {o['impl']} failed ({o['error']})")
            elif best:
                verdicts.append(f"micro-batch {mbs}, seq {seq}: {o['impl']} {o['tokens_per_s']:,.0f} tokens/s "
                                f"= {o['tokens_per_s'] / best['tokens_per_s']:.2f}× the best HF variant "
                                f"({best['impl']}, {best['tokens_per_s']:,.0f} tokens/s); step "
                                f"{fmt(o.get('step_ms'), '.1f')} vs {fmt(best.get('step_ms'), '.1f')} ms; MFU "
                                f"{mfu(o, peak)} vs {mfu(best, peak)}; peak "
                                f"{fmt(o.get('peak_gib'), '.1f')} vs {fmt(best.get('peak_gib'), '.1f')} GiB")
            else:
                verdicts.append(f"micro-batch {mbs}, seq {seq}: no successful HF run to compare with")
    out.append("")
    out += verdicts
    out.append("")
    out.append("Model TFLOP/s on both sides: 6 × active matmul parameters + 6·L·H·seq per token "
               "(params_train_flops_per_token, src/params.h). Peak memory: moetrain's backend high-water mark; "
               "HF: torch.cuda.max_memory_allocated.")
    return "\n".join(out)


def matrix(rows):
    """The sweep at a glance: one line per sequence length, one column per micro-batch; each cell
    is moetrain's tokens/s and peak GiB over the best Hugging Face variant's, and the ratio."""
    seqs = sorted({r["seq"] for r in rows})
    mbss = sorted({r["mbs"] for r in rows})
    if len(seqs) * len(mbss) < 2:
        return ""
    out = ["| seq \\ micro-batch | " + " | ".join(str(m) for m in mbss) + " |",
           "| ---: | " + " | ".join("---" for _ in mbss) + " |"]
    for seq in seqs:
        cells = []
        for mbs in mbss:
            here = [r for r in rows if (r["mbs"], r["seq"]) == (mbs, seq) and "error" not in r and r.get("tokens_per_s")]
            ours = [r for r in here if r["impl"] == "moetrain"] or [r for r in here if is_ours(r)]
            hf = [r for r in here if not is_ours(r)]
            best = max(hf, key=lambda r: r["tokens_per_s"]) if hf else None
            if not ours and not best:
                tried = any((r["mbs"], r["seq"]) == (mbs, seq) for r in rows)
                cells.append("failed" if tried else "not run")
                continue
            o = f"{ours[0]['tokens_per_s']:,.0f} tok/s, {fmt(ours[0].get('peak_gib'), '.1f')} GiB" if ours else "—"
            h = f"{best['tokens_per_s']:,.0f}, {fmt(best.get('peak_gib'), '.1f')} GiB ({best['impl']})" if best else "—"
            ratio = f" **{ours[0]['tokens_per_s'] / best['tokens_per_s']:.2f}×**" if ours and best else ""
            cells.append(f"{o} vs HF {h}{ratio}")
        out.append(f"| {seq} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv):
    gpu, peak, paths = "", os.environ.get("PEAK_TFLOPS") or None, []
    it = iter(argv)
    for a in it:
        if a in ("--gpu", "--peak"):
            v = next(it, None)
            if v is None:
                sys.exit(f"bench_compare: {a} needs a value")
            if a == "--gpu":
                gpu = v.strip()
            else:
                peak = v
        else:
            paths.append(a)
    if not paths:
        sys.exit(__doc__)
    rows = load(paths)
    if not rows:
        sys.exit("bench_compare: no results in " + " ".join(paths))
    if not gpu:
        gpu = next((r["device"] for r in rows if r.get("device")), "")
    try:
        pk = peak_tflops(gpu, peak)
    except ValueError:
        sys.exit(f"bench_compare: PEAK_TFLOPS / --peak must be a number, not {peak!r}")
    print(table(rows, gpu, pk))
    m = matrix(rows)
    if m:
        print()
        print(m)


if __name__ == "__main__":
    main(sys.argv[1:])
