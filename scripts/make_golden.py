"""Golden fixture from Hugging Face transformers: a tiny MixtralForCausalLM with seeded random
weights, its logits, losses, every gradient, and the losses of 5 AdamW steps.

Run where torch and transformers are installed (the lent GPU machine; CPU torch is enough):
    python3 scripts/make_golden.py --out DIR
It writes DIR/tiny_mixtral.golden (copy to tests/fixtures/golden/) and DIR/golden.log.

The weights are drawn here under the *published* Mixtral names
(model.layers.N.block_sparse_moe.experts.E.w1.weight, ...), written as a Hugging Face directory
and loaded with MixtralForCausalLM.from_pretrained, so the fixture also proves that this
naming loads in the installed transformers. Gradients are mapped back from whatever layout the
installed version uses internally (fused experts in transformers 5) by finding, per tensor,
the view of the internal parameter that reproduces the known weights exactly.

File format (read by tests/test_golden.c): a text header, one line per tensor,
"name dtype ndim d0 [d1 ...] offset_bytes", ended by a line "end HEADER_BYTES"; then raw
little-endian data (f32 or i32) at the given offsets from the end of the header.
"""
import argparse, json, os, sys, tempfile, inspect
import numpy as np
import torch
import transformers
from transformers import MixtralConfig, MixtralForCausalLM

CFG = dict(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
           rope_theta=10000.0, rms_norm_eps=1e-5, router_aux_loss_coef=0.02, tie_word_embeddings=False,
           output_router_logits=True, sliding_window=None, hidden_act="silu")
B, T = 2, 17
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1


def published_shapes(c):
    H, F, V, L, E = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"], c["num_local_experts"]
    D = H // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    s = {"model.embed_tokens.weight": (V, H)}
    for l in range(L):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "self_attn.q_proj.weight"] = (q, H)
        s[p + "self_attn.k_proj.weight"] = (kv, H)
        s[p + "self_attn.v_proj.weight"] = (kv, H)
        s[p + "self_attn.o_proj.weight"] = (H, q)
        s[p + "post_attention_layernorm.weight"] = (H,)
        s[p + "block_sparse_moe.gate.weight"] = (E, H)
        for e in range(E):
            s[p + f"block_sparse_moe.experts.{e}.w1.weight"] = (F, H)
            s[p + f"block_sparse_moe.experts.{e}.w3.weight"] = (F, H)
            s[p + f"block_sparse_moe.experts.{e}.w2.weight"] = (H, F)
    s["model.norm.weight"] = (H,)
    s["lm_head.weight"] = (V, H)
    return s


def candidate_views(t):
    """Views of an internal parameter that may hold one published tensor: the tensor itself,
    its transpose, and for 3-D fused experts every [e], [e].T, halves along each axis."""
    out = {}
    def add(key, v):
        out[key] = v
    add(("id",), t)
    if t.dim() == 2:
        add(("T",), t.t())
    if t.dim() == 3:
        for e in range(t.shape[0]):
            x = t[e]
            for tr in (False, True):
                y = x.t() if tr else x
                add(("e", e, tr), y)
                for ax in (0, 1):
                    n = y.shape[ax]
                    if n % 2 == 0:
                        for half in (0, 1):
                            sl = y.narrow(ax, half * n // 2, n // 2)
                            add(("eh", e, tr, ax, half), sl)
                        add(("ei", e, tr, ax, 0), y.index_select(ax, torch.arange(0, n, 2)))
                        add(("ei", e, tr, ax, 1), y.index_select(ax, torch.arange(1, n, 2)))
    return out


def view_of(t, key):
    if key[0] == "id":
        return t
    if key[0] == "T":
        return t.t()
    e, tr = key[1], key[2]
    y = t[e].t() if tr else t[e]
    if key[0] == "e":
        return y
    ax, half = key[3], key[4]
    n = y.shape[ax]
    if key[0] == "eh":
        return y.narrow(ax, half * n // 2, n // 2)
    return y.index_select(ax, torch.arange(half, n, 2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "golden.log"), "w")
    def say(*x):
        s = " ".join(str(v) for v in x)
        print(s, flush=True)
        log.write(s + "\n")
    say("torch", torch.__version__, "transformers", transformers.__version__)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(1234)
    shapes = published_shapes(CFG)
    W = {}
    for n, s in shapes.items():
        if n.endswith("layernorm.weight") or n == "model.norm.weight":
            W[n] = (1.0 + 0.2 * rng.standard_normal(s)).astype(np.float32)
        else:
            W[n] = (0.2 * rng.standard_normal(s)).astype(np.float32)
    tokens = rng.integers(0, CFG["vocab_size"], size=(B, T)).astype(np.int64)

    # a Hugging Face directory with the published names, loaded by from_pretrained
    from safetensors.numpy import save_file
    d = tempfile.mkdtemp()
    cfg = MixtralConfig(**CFG)
    cfg.save_pretrained(d)
    save_file({k: v for k, v in W.items()}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    model = MixtralForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
    model.train()
    say("internal parameters:")
    for n, p in model.named_parameters():
        say("  ", n, tuple(p.shape))
    try:
        from transformers.models.mixtral import modeling_mixtral as mm
        for fn in ("load_balancing_loss_func",):
            log.write(inspect.getsource(getattr(mm, fn)) + "\n")
        for cls in ("MixtralSparseMoeBlock", "MixtralTopKRouter", "MixtralExperts"):
            if hasattr(mm, cls):
                log.write(inspect.getsource(getattr(mm, cls)) + "\n")
    except Exception as ex:  # documentation only
        say("could not read sources:", repr(ex))

    # map published names to views of internal parameters (verified on the known weights)
    params = dict(model.named_parameters())
    mapping = {}
    for n, w in W.items():
        wt = torch.from_numpy(w)
        found = None
        for pn, p in params.items():
            if p.numel() < wt.numel():
                continue
            for key, v in candidate_views(p.detach()).items():
                if tuple(v.shape) == tuple(wt.shape) and torch.equal(v, wt):
                    found = (pn, key)
                    break
            if found:
                break
        if not found:
            say("no internal parameter holds", n)
            sys.exit(1)
        mapping[n] = found
    say("every published tensor found in the loaded model")

    x = torch.from_numpy(tokens)
    out = model(input_ids=x, labels=x)
    loss = out.loss
    logits = out.logits.detach().float().numpy()
    V = CFG["vocab_size"]
    ce = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V).float(), x[:, 1:].reshape(-1))
    aux = (loss - ce) / CFG["router_aux_loss_coef"]  # HF's load-balancing loss, unscaled
    say("loss", loss.item(), "ce", ce.item(), "aux", float(aux))
    loss.backward()
    G = {n: view_of(params[pn].grad, key).detach().clone().numpy() for n, (pn, key) in mapping.items()}

    # 5 AdamW steps on the same batch; norm weights without weight decay
    decay = [p for pn, p in params.items() if "norm" not in pn]
    nodecay = [p for pn, p in params.items() if "norm" in pn]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    model.zero_grad()
    adam = []
    for _ in range(5):
        o = model(input_ids=x, labels=x)
        adam.append(o.loss.item())
        o.loss.backward()
        opt.step()
        opt.zero_grad()
    say("adam losses", adam)
    A = {n: view_of(params[pn].detach(), key).clone().numpy() for n, (pn, key) in mapping.items()}

    tensors = [("input_ids", tokens.astype(np.int32)), ("logits", logits.astype(np.float32)),
               ("loss", np.array([loss.item()], np.float32)), ("ce_loss", np.array([ce.item()], np.float32)),
               ("aux_loss", np.array([float(aux)], np.float32)), ("adam_losses", np.array(adam, np.float32))]
    for n in shapes:
        tensors.append((n, W[n]))
    for n in shapes:
        tensors.append(("grad." + n, np.ascontiguousarray(G[n], np.float32)))
    for n in shapes:
        tensors.append(("after5." + n, np.ascontiguousarray(A[n], np.float32)))
    lines, off, blobs = [], 0, []
    for n, t in tensors:
        dt = "i32" if t.dtype == np.int32 else "f32"
        lines.append(f"{n} {dt} {t.ndim} {' '.join(str(s) for s in t.shape)} {off}")
        b = np.ascontiguousarray(t).tobytes()
        blobs.append(b)
        off += len(b)
    meta = json.dumps(dict(config=CFG, B=B, T=T, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                           no_decay="norm weights", torch=torch.__version__, transformers=transformers.__version__,
                           loss="mean CE over B*(T-1) shifted targets + router_aux_loss_coef * aux"))
    head = "# moetrain golden fixture " + meta + "\n" + "\n".join(lines) + "\n"
    hb = head.encode()
    total = len(hb) + len("end 0000000000\n")
    hb += f"end {total:010d}\n".encode()
    with open(os.path.join(a.out, "tiny_mixtral.golden"), "wb") as f:
        f.write(hb)
        for b in blobs:
            f.write(b)
    say("wrote", os.path.join(a.out, "tiny_mixtral.golden"), total + off, "bytes")


if __name__ == "__main__":
    main()
