"""hf_peer.py — the Hugging Face side of `make bench`: training steps of transformers'
MixtralForCausalLM at the dimensions of a moetrain config, timed the way moetrain times its own.

    python3 scripts/hf_peer.py [--config configs/bench_8x7B_L2.yaml] [--warmup 2] [--steps 10]
                               [--clip 0] [--set model.layers=4 ...] VARIANT:MICRO_BATCH:SEQ ...

VARIANT is the experts backend, optionally under torch.compile:
    eager           transformers' per-expert loop
    eager+compile   the same model wrapped in torch.compile
    default         the installed transformers' default experts backend (grouped_mm in 5.x)
    default+compile, grouped_mm, batched_mm, ... (any backend the installed transformers knows)

The model: MixtralConfig from the moetrain config's model section (vocab, hidden, ffn, layers,
heads, kv heads, experts, top-k, RoPE base, RMSNorm epsilon, init std, router aux-loss
coefficient; the aux loss is part of the loss, as in moetrain), fp32 parameters on the GPU, the
forward under bf16 autocast (mixed-precision training's fp32 masters), attention on the
transformers default (SDPA). The optimizer: torch.optim.AdamW(fused=True) with the config's lr,
betas, eps and weight decay. No gradient clipping unless --clip is given (moetrain clips at
optim.clip; the clip is one norm pass, ~0.5% of a step).

A step, on both sides: forward with the loss, backward, optimizer step, gradients cleared, the
loss read on the host (which waits for the device). Tokens are uniform random, fresh every step.
Each step is timed by wall clock; the first --warmup steps (torch.compile compiles there) are
skipped and the mean of the next --steps is reported, as moetrain's {"bench": ...} line does
(bench_8x7B_L2: 12 steps, the first 2 skipped). Model FLOPs per token use moetrain's formula
(params_train_flops_per_token in src/params.h): 6 x the matmul parameters a token uses + 6*L*H*seq.
Peak memory: torch.cuda.max_memory_allocated over the steps (the optimizer state included).

Output: a header line, then one JSON line per run, {"impl", "mbs", "seq", "step_ms",
"tokens_per_s", "model_tflops", "peak_gib", "loss", "device", ...} or {"impl", "mbs", "seq",
"error"}. A failed run (out of memory, a compile error) does not stop the others.
"""
import argparse
import gc
import json
import os
import re
import sys
import time

# ---- the moetrain config (a YAML mapping of sections to scalars; `defaults:` loaded first) ------


def _scalar(v):
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    if v in ("true", "false"):
        return v == "true"
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def _parse_yaml(text):
    """The subset moetrain's configs use: `defaults: NAME` or `[A, B]`, sections of `key: value`."""
    out, section = {}, None
    for raw in text.splitlines():
        line = re.sub(r"\s+#.*$", "", raw).rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*):\s*(.*)$", line)
        if not m:
            raise ValueError(f"unreadable config line: {raw!r}")
        indent, key, val = m.groups()
        if not indent:
            if key == "defaults":
                val = val.strip()
                out["defaults"] = [s.strip() for s in val.strip("[]").split(",") if s.strip()] if val.startswith("[") else [val]
                section = None
            else:
                section = out.setdefault(key, {})
        elif section is not None:
            section[key] = _scalar(val)
    return out


def load_config(path):
    with open(path) as f:
        text = f.read()
    try:
        import yaml  # transformers depends on PyYAML; the fallback parser covers the configs shipped here

        doc = yaml.safe_load(text) or {}
        if isinstance(doc.get("defaults"), str):
            doc["defaults"] = [doc["defaults"]]
    except ImportError:
        doc = _parse_yaml(text)
    merged = {}
    for name in doc.get("defaults", []) or []:
        base = os.path.join(os.path.dirname(path), name if name.endswith(".yaml") else name + ".yaml")
        for sec, kv in load_config(base).items():
            merged.setdefault(sec, {}).update(kv)
    for sec, kv in doc.items():
        if sec != "defaults" and isinstance(kv, dict):
            merged.setdefault(sec, {}).update(kv)
    return merged


# moetrain's defaults for the keys a config may leave out (the key table in src/config.c)
MODEL_DEFAULTS = dict(rope_theta=1e6, rms_eps=1e-5, init_std=0.02, aux_coef=0.02)
OPTIM_DEFAULTS = dict(lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


def model_dims(cfg):
    m = dict(MODEL_DEFAULTS)
    m.update(cfg.get("model", {}))
    o = dict(OPTIM_DEFAULTS)
    o.update(cfg.get("optim", {}))
    return m, o


def flops_per_token(m, seq):
    """params_train_flops_per_token (src/params.h): forward + backward = 6 x the matmul parameters
    a token uses (attention projections, top-k experts, router, lm_head), plus causal attention's
    scores and values, 6*L*H*seq."""
    H, F, V, L = m["hidden"], m["ffn"], m["vocab_size"], m["layers"]
    kvh = m["kv_heads"] * H / m["heads"]
    attn = 2 * H * H + 2 * H * kvh
    experts = m["top_k"] * 3 * H * F
    router = H * m["experts"]
    dense = L * (attn + experts + router) + H * V
    return 6 * dense + 6 * L * H * seq


# ---- one run ------------------------------------------------------------------------------------


def run(torch, transformers, m, o, variant, mbs, seq, warmup, steps, clip):
    compile_ = variant.endswith("+compile")
    backend = variant[: -len("+compile")] if compile_ else variant
    cfg = transformers.MixtralConfig(
        vocab_size=m["vocab_size"], hidden_size=m["hidden"], intermediate_size=m["ffn"],
        num_hidden_layers=m["layers"], num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"],
        num_local_experts=m["experts"], num_experts_per_tok=m["top_k"],
        max_position_embeddings=max(seq, int(m.get("max_seq", seq))), rope_theta=float(m["rope_theta"]),
        rms_norm_eps=float(m["rms_eps"]), initializer_range=float(m["init_std"]),
        router_aux_loss_coef=float(m["aux_coef"]), output_router_logits=True, tie_word_embeddings=False,
        use_cache=False)
    torch.manual_seed(0)
    with torch.device("cuda"):  # parameters made and initialised on the GPU
        model = transformers.MixtralForCausalLM(cfg)
    model = model.to(dtype=torch.float32)  # fp32 masters; the forward runs under bf16 autocast
    model.train()
    if backend != "default":
        if not hasattr(model, "set_experts_implementation"):
            raise RuntimeError(f"transformers {transformers.__version__} has no experts backends; use 'default'")
        model.set_experts_implementation(backend)
    fwd = torch.compile(model) if compile_ else model
    opt = torch.optim.AdamW(model.parameters(), lr=float(o["lr"]), betas=(float(o["beta1"]), float(o["beta2"])),
                            eps=float(o["eps"]), weight_decay=float(o["weight_decay"]), fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1234)
    batches = [torch.randint(0, m["vocab_size"], (mbs, seq), device="cuda", generator=gen) for _ in range(warmup + steps)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()

    times, loss = [], float("nan")
    for x in batches:
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fwd(input_ids=x, labels=x)
        out.loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = out.loss.item()  # the host waits for the step, as moetrain's does
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    dt = sum(times[warmup:]) / steps
    tok = mbs * seq / dt
    r = dict(impl=variant, mbs=mbs, seq=seq, step_ms=round(dt * 1e3, 1), tokens_per_s=round(tok),
             model_tflops=round(tok * flops_per_token(m, seq) / 1e12, 1),
             peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1), loss=round(loss, 4),
             steps=steps, warmup=warmup, clip=clip,
             experts_impl=getattr(model.config, "_experts_implementation", None) or backend,
             attn_impl=getattr(model.config, "_attn_implementation", None),
             device=torch.cuda.get_device_name(), torch=torch.__version__, transformers=transformers.__version__)
    del model, fwd, opt, out, batches
    return r


def parse_plan(s):
    parts = s.split(":")
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
        raise argparse.ArgumentTypeError(f"'{s}': expected VARIANT:MICRO_BATCH:SEQ, e.g. eager+compile:4:4096")
    return parts[0], int(parts[1]), int(parts[2])


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(here, "..", "configs", "bench_8x7B_L2.yaml"))
    ap.add_argument("--warmup", type=int, default=2, help="steps run before timing (default 2, as moetrain)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10, as bench_8x7B_L2)")
    ap.add_argument("--clip", type=float, default=0.0, help="gradient-norm clip (default 0: none)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a model or optim key, as on moetrain's command line (repeatable)")
    ap.add_argument("plan", nargs="+", type=parse_plan, metavar="VARIANT:MICRO_BATCH:SEQ")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    cfg = load_config(a.config)
    for kv in a.set:
        key, sep, val = kv.partition("=")
        sec, dot, name = key.partition(".")
        if not sep or not dot or not name:
            ap.error(f"--set {kv}: expected SECTION.KEY=VALUE")
        cfg.setdefault(sec, {})[name] = _scalar(val)
    m, o = model_dims(cfg)

    import torch
    import transformers

    if not torch.cuda.is_available():
        sys.exit("hf_peer: no CUDA GPU visible to torch")
    print(f"hf_peer: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name()}, config {os.path.relpath(a.config)}", flush=True)
    failed = 0
    for variant, mbs, seq in a.plan:
        try:
            r = run(torch, transformers, m, o, variant, mbs, seq, a.warmup, a.steps, a.clip)
        except Exception as e:  # one failed variant (OOM, compile error) must not lose the others
            r = dict(impl=variant, mbs=mbs, seq=seq, error=repr(e)[:300])
            failed += 1
        print(json.dumps(r), flush=True)
        # a failed run's model and optimizer stay reachable from its traceback's frames (a
        # cycle) until a collection: without one, an OOM at one size leaves the next too little
        gc.collect()
        torch.cuda.empty_cache()
        if hasattr(torch, "_dynamo"):
            torch._dynamo.reset()  # each compiled run starts from a clean cache
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
