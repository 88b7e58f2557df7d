#!/usr/bin/env python3
"""generate_check.py — greedy `moetrain generate` against transformers' generate(do_sample=False)
on the same Hugging Face export.

    scripts/generate_check.py [--moetrain build/moetrain] [--work DIR] [--hf HF_DIR] [--max-new 64]
                              [--device cuda] [--steps 300]

Without --hf it makes two fp32 exports of L0_sanity (GQA, 4 experts, top-2, byte vocabulary) on
--device: trained for --steps steps, and untrained with wide weights (model.init_std=0.5, so the
greedy tokens vary). Then, for three prompts of different
lengths batched in one moetrain run (--prompt-ids, --print-ids, no EOS), it compares the new
tokens with transformers' greedy generation of each prompt alone (its experts on the "eager" loop):
  fp32: every token must match (exit 1 otherwise);
  bf16 (moetrain --dtype bf16 against transformers in bf16): the agreement is reported (the
        length of the matching prefix per prompt), not required.
Prints one JSON line with the results.
"""
import argparse
import json
import os
import subprocess
import sys

PROMPTS = [
    b">hsa-mir-21 MI0000077\nUGUCGGGUAGCUUAUCAGACUGAUGUUGACUGUUGAAUCUCAUGGCAACACCAGUCGAUGGGCUGUC",
    b">mmu-let-7g MI0000137\n",
    b"UGAGGUAGUAGUUUGUACAGUU",
]


def run(cmd, **kw):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, **kw).stdout


def ours(args, hf, dtype, device):
    cmd = [args.moetrain, "generate", "--ckpt", hf, "--max-new", str(args.max_new), "--temperature", "0",
           "--print-ids", "--eos", "-1", "--device", device, "--dtype", dtype]
    for p in PROMPTS:
        cmd += ["--prompt-ids", ",".join(str(b) for b in p)]
    out = run(cmd).strip().splitlines()
    assert len(out) == len(PROMPTS), out
    return [[int(x) for x in line.split(",")] for line in out]


def theirs(hf, dtype, max_new):
    import torch
    from transformers import AutoModelForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    td = torch.float32 if dtype == "fp32" else torch.bfloat16
    m = AutoModelForCausalLM.from_pretrained(hf, dtype=td).to(dev).eval()
    # the reference per-expert loop: transformers 5.x loads with grouped_mm and, on a GPU, switches
    # generate()'s decode steps to batched_mm (other kernels, other summation orders) only from
    # grouped_mm, so eager keeps both prefill and decode on one plain implementation
    if hasattr(m, "set_experts_implementation"):
        m.set_experts_implementation("eager")
    m.generation_config.eos_token_id = None
    res = []
    for p in PROMPTS:
        ids = torch.tensor([list(p)], device=dev)
        with torch.no_grad():
            g = m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                           pad_token_id=0)
        res.append(g[0, ids.shape[1]:].tolist())
    return res


def prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moetrain", default="build/moetrain")
    ap.add_argument("--work", default="build/generate_check")
    ap.add_argument("--hf", default="")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.hf:
        models = [("given", args.hf)]
    else:
        # two exports: L0_sanity trained --steps steps, and untrained weights drawn wide
        # (init_std 0.5: large logit gaps, diverse greedy tokens rather than a repeated one)
        models = []
        for name, extra in (("trained", [f"train.steps={args.steps}"]),
                            ("random", ["train.steps=1", "optim.lr=0", "model.init_std=0.5"])):
            ck = os.path.join(args.work, name, "ckpt")
            hf = os.path.join(args.work, name, "hf")
            steps = args.steps if name == "trained" else 1
            run([args.moetrain, "--config", "L0_sanity", f"train.device={args.device}", "parallel.ep=1",
                 "train.micro_batch=16", f"checkpoint.dir={ck}", f"checkpoint.every={steps}", "checkpoint.resume=none",
                 "checkpoint.overwrite=true", f"log.dir={os.path.join(args.work, name, 'log')}", "train.eval_every=0"]
                + extra)
            run([args.moetrain, "export", "--ckpt", ck, "--out", hf, "--dtype", "fp32"])
            models.append((name, hf))
    result = {"max_new": args.max_new, "device": args.device}
    ok = True
    for name, hf in models:
        for dtype in ("fp32", "bf16"):
            a = ours(args, hf, dtype, args.device)
            b = theirs(hf, dtype, args.max_new)
            pre = [prefix(x, y) for x, y in zip(a, b)]
            result[f"{name}.{dtype}"] = {"matching_prefix": pre, "equal": a == b,
                                         "distinct_tokens": len({t for x in a for t in x})}
            if dtype == "fp32" and a != b:
                ok = False
                for i, (x, y) in enumerate(zip(a, b)):
                    if x != y:
                        print(f"{name} fp32 prompt {i}: moetrain {x}\n    transformers {y}", file=sys.stderr)
    result["ok"] = ok
    print(json.dumps(result))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
