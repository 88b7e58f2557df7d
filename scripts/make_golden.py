"""Golden fixture from Hugging Face transformers: a tiny MixtralForCausalLM with seeded random
weights, its logits, losses, every gradient, and the losses of 5 AdamW steps.

Run where torch and transformers are installed (CPU torch is enough):
    python3 scripts/make_golden.py --out DIR
It writes DIR/tiny_mixtral.golden (read by tests/test_golden.c), DIR/tiny_mixtral.safetensors
(the same tensors plus HF's own aux_loss, with the config, versions, loss formula and checks in
its __metadata__), DIR/golden.log and DIR/hf_source.log (the HF functions the math comes from).
Copy the fixtures to tests/fixtures/golden/. docs/golden.md says what they hold.

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
import argparse, json, os, sys, tempfile, inspect, datetime
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
    model = MixtralForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
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
    aux_hf = getattr(out, "aux_loss", None)  # HF's own unscaled load-balancing loss
    aux_hf = float(aux_hf.detach()) if aux_hf is not None else None
    margins = [router_margin(out.router_logits, CFG["num_experts_per_tok"])]
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
        margins.append(router_margin(o.router_logits, CFG["num_experts_per_tok"]))
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

    checks = {"min_topk_margin_per_forward": margins}
    say("router top-k margin (k-th minus (k+1)-th probability, min over rows) per forward:", margins)
    for name, fn in (("fact_check", lambda: fact_check(say, W, tokens, shapes, logits, loss.item(), ce.item(), aux_hf,
                                                       G, adam, A)),
                     ("export_check", lambda: export_check(say, model, d, W, x)),
                     ("dump_sources", lambda: dump_sources(a.out, say) or {})):
        try:  # the checks document; a failure here must not lose the fixture
            checks.update(fn())
        except Exception:
            import traceback
            say(name, "failed:", traceback.format_exc())
            checks[name + "_failed"] = True
    meta = {"format": "pt", "generator": "scripts/make_golden.py", "torch": torch.__version__,
            "transformers": transformers.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "batch": str(B), "seq": str(T), "device": "cpu", "dtype": "float32",
            "weights": "numpy default_rng(1234): N(0, 0.2^2) for every matrix, 1 + N(0, 0.2^2) for norm weights, "
                       "drawn in published-name order; then input_ids from the same generator",
            "loss_formula": "loss = ce_loss + router_aux_loss_coef * aux_loss; ce_loss = mean over B*(T-1) of "
                            "CE(logits[b, t], input_ids[b, t+1]); aux_loss = E * sum_e f_e * P_e over the rows of all "
                            "layers together: f_e = (top-k assignments to e) / (L*B*T), P_e = mean softmax prob of e",
            "optimizer": f"torch.optim.AdamW lr={LR} betas={BETAS} eps={EPS}; weight_decay {WD} except 0.0 for "
                         "every *norm* weight (input_layernorm, post_attention_layernorm, model.norm); 5 steps on the "
                         "same batch with the total loss; adam_losses[i] = loss before step i",
            "aux_loss_note": "aux_loss here is HF's out.aux_loss; tiny_mixtral.golden's aux_loss is (loss - ce)/coef",
            "checks": json.dumps(checks), "hf_config": model.config.to_json_string()}
    for k, v in CFG.items():
        meta["config." + k] = json.dumps(v)
    st = {n: np.ascontiguousarray(t) for n, t in tensors}
    if aux_hf is not None:
        st["aux_loss"] = np.array([aux_hf], np.float32)
    path = os.path.join(a.out, "tiny_mixtral.safetensors")
    save_file(st, path, metadata=meta)
    say("wrote", path, os.path.getsize(path), "bytes,", len(st), "tensors")


def router_margin(router_logits, k):
    """Smallest gap between the k-th and (k+1)-th router probability over all rows and layers."""
    from golden_ref import topk_margin
    try:
        return topk_margin([torch.softmax(r.detach().double(), -1) for r in router_logits], k)
    except Exception:  # router_logits missing or shaped otherwise in this version
        return None


def fact_check(say, W, tokens, shapes, logits, loss, ce, aux_hf, G, adam, A):
    """HF against scripts/golden_ref.py (written from docs/golden.md's facts) in float64 and
    float32: forward, losses, gradients, and the same 5 AdamW steps."""
    import golden_ref as R
    c = {}
    r32 = R.forward(W, tokens, CFG, torch.float32)
    r = R.forward(W, tokens, CFG, torch.float64, grad=True)
    c["logits_rel_l2_hf_vs_fp64"] = R.rel_l2(logits, r["logits"].detach())
    c["logits_rel_l2_hf_vs_ref_fp32"] = R.rel_l2(logits, r32["logits"].detach())
    c["loss_fp64"], c["ce_fp64"], c["aux_fp64"] = float(r["loss"]), float(r["ce"]), float(r["aux"])
    c["aux_hf"] = aux_hf
    c["aux_derived"] = (loss - ce) / CFG["router_aux_loss_coef"]
    c["aux_layer_mean_variant_fp64"] = float(r["aux_layer_mean"])
    say("fact check: logits rel L2 HF vs fp64 ref %.3g, vs fp32 ref %.3g" % (c["logits_rel_l2_hf_vs_fp64"],
                                                                           c["logits_rel_l2_hf_vs_ref_fp32"]))
    say("fact check: loss HF %.9g fp64 %.9g | ce HF %.9g fp64 %.9g | aux HF %s derived %.9g fp64 %.9g "
        "(per-layer-mean variant would be %.9g)" % (loss, c["loss_fp64"], ce, c["ce_fp64"], aux_hf,
                                                    c["aux_derived"], c["aux_fp64"], c["aux_layer_mean_variant_fp64"]))
    r["loss"].backward()
    worst = max((R.rel_l2(G[n], r["leaves"][n].grad), n) for n in shapes)
    c["grad_worst_rel_l2_hf_vs_fp64"] = worst
    say("fact check: worst gradient rel L2 HF vs fp64 %.3g (%s)" % worst)
    leaves = r["leaves"]
    groups = [{"params": [p for n, p in leaves.items() if "norm" not in n], "weight_decay": WD},
              {"params": [p for n, p in leaves.items() if "norm" in n], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
    ref_adam = []
    for _ in range(5):
        opt.zero_grad()
        o = R.forward({n: p for n, p in leaves.items()}, tokens, CFG, torch.float64, grad=True)
        # forward() copies its inputs into new leaves: route the gradient back by hand
        o["loss"].backward()
        for n, p in leaves.items():
            p.grad = o["leaves"][n].grad
        ref_adam.append(float(o["loss"]))
        opt.step()
    c["adam_losses_fp64"] = ref_adam
    c["adam_loss_worst_rel_hf_vs_fp64"] = max(abs(x - y) / abs(y) for x, y in zip(adam, ref_adam))
    worst = max((R.rel_l2(A[n], leaves[n].detach()), n) for n in shapes)
    c["after5_worst_rel_l2_hf_vs_fp64"] = worst
    say("fact check: AdamW losses fp64", ref_adam, "worst rel diff %.3g; after-5 weights worst rel L2 %.3g (%s)" %
        (c["adam_loss_worst_rel_hf_vs_fp64"], worst[0], worst[1]))
    ok = c["logits_rel_l2_hf_vs_fp64"] < 1e-5 and abs(c["aux_fp64"] - (aux_hf if aux_hf is not None else c["aux_derived"])) < 1e-4 \
        and c["grad_worst_rel_l2_hf_vs_fp64"][0] < 1e-4
    c["facts_hold"] = bool(ok)
    say("fact check:", "PASS: HF computes what docs/golden.md says" if ok else "FAIL: a stated fact is wrong")
    return c


def export_check(say, model, d, W, x):
    """What a published-name directory loads as, and what transformers itself writes on save."""
    from safetensors import safe_open
    c = {}
    m2, info = MixtralForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                                  output_loading_info=True)
    c["load_info"] = {k: sorted(map(str, v)) for k, v in info.items() if isinstance(v, (list, set, tuple))}
    say("from_pretrained(published names) loading info:", c["load_info"])
    d2 = tempfile.mkdtemp()
    m2.save_pretrained(d2)
    files = sorted(f for f in os.listdir(d2) if f.endswith(".safetensors"))
    keys = []
    for f in files:
        with safe_open(os.path.join(d2, f), "pt") as h:
            keys += list(h.keys())
    c["save_pretrained_files"] = files
    c["save_pretrained_writes_published_names"] = sorted(keys) == sorted(W)
    say("save_pretrained writes", files, len(keys), "tensors; published names:",
        c["save_pretrained_writes_published_names"], "; sample:", sorted(keys)[:6])
    m3 = MixtralForCausalLM.from_pretrained(d2, dtype=torch.float32, attn_implementation="eager")
    m2.eval(), m3.eval()
    with torch.no_grad():
        l2, l3 = m2(input_ids=x).logits, m3(input_ids=x).logits
    c["resave_reload_logits_equal"] = bool(torch.equal(l2, l3))
    say("save_pretrained -> from_pretrained: identical logits:", c["resave_reload_logits_equal"])
    c["experts_implementation"] = str(getattr(model.config, "_experts_implementation", None))
    c["attn_implementation"] = str(getattr(model.config, "_attn_implementation", None))
    c["router_jitter_noise"] = getattr(model.config, "router_jitter_noise", None)
    c["rope"] = str(getattr(model.config, "rope_parameters", None) or getattr(model.config, "rope_scaling", None))
    c["inv_freq"] = [float(v) for v in model.model.rotary_emb.inv_freq]
    say("experts impl", c["experts_implementation"], "attn impl", c["attn_implementation"], "jitter",
        c["router_jitter_noise"], "rope", c["rope"], "inv_freq", c["inv_freq"])
    return c


def dump_sources(outdir, say):
    """The HF source the math comes from, for docs/golden.md (not committed as code)."""
    import importlib
    want = [("transformers.models.mixtral.modeling_mixtral", n) for n in (
        "load_balancing_loss_func", "MixtralTopKRouter", "MixtralExperts", "MixtralSparseMoeBlock", "MixtralRMSNorm",
        "MixtralRotaryEmbedding", "rotate_half", "apply_rotary_pos_emb", "repeat_kv", "eager_attention_forward",
        "MixtralAttention", "MixtralDecoderLayer", "MixtralModel", "MixtralForCausalLM")]
    want += [("transformers.loss.loss_utils", n) for n in ("fixed_cross_entropy", "ForCausalLMLoss")]
    want += [("transformers.models.mixtral.configuration_mixtral", "MixtralConfig")]
    with open(os.path.join(outdir, "hf_source.log"), "w") as f:
        for mod, name in want:
            try:
                obj = getattr(importlib.import_module(mod), name)
                f.write(f"# ==== {mod}.{name}\n{inspect.getsource(obj)}\n")
            except Exception as ex:
                f.write(f"# ==== {mod}.{name}: {ex!r}\n")
        for mod in ("transformers.conversion_mapping", "transformers.integrations.moe"):
            try:
                src = inspect.getsource(importlib.import_module(mod)).splitlines()
                hits = [i for i, l in enumerate(src) if "mixtral" in l.lower() or "experts_implementation" in l]
                keep = sorted({j for i in hits for j in range(max(0, i - 12), min(len(src), i + 25))})
                f.write(f"# ==== {mod} (lines near 'mixtral' / 'experts_implementation')\n")
                last = -2
                for j in keep:
                    if j != last + 1:
                        f.write("# ...\n")
                    f.write(f"{j + 1}: {src[j]}\n")
                    last = j
            except Exception as ex:
                f.write(f"# ==== {mod}: {ex!r}\n")
    say("wrote", os.path.join(outdir, "hf_source.log"))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
