"""Loads a `moetrain export` directory in Hugging Face transformers and checks its logits and
losses against the golden fixture (issue 5: an export loads in transformers and gives the same
logits as moetrain).

    python3 scripts/hf_check.py EXPORT_DIR FIXTURE
    python3 scripts/hf_check.py build/hf_golden_export tests/fixtures/golden/tiny_mixtral.golden

EXPORT_DIR is what tests/test_export_golden.c leaves (`make test`, or
build/tests/test_export_golden run from the repository root; MOETRAIN_EXPORT_DIR moves it): the
fixture's weights saved by the trainer, exported in fp32, plus tokens.txt (the fixture's
input_ids). That test also checks moetrain's own logits on those weights against the fixture's
(rel L2 <= 1e-5), so passing here closes the loop moetrain -> export -> transformers.

What it checks (exit 1 on any failure):
  - MixtralForCausalLM.from_pretrained(EXPORT_DIR, dtype=float32, attn_implementation=
    "eager", output_loading_info=True): no missing, unexpected or mismatched keys, no errors;
    every parameter fp32; the loaded config has the fixture's model config;
  - the loaded weights equal the fixture's bit for bit (published names mapped to the
    installed layout, e.g. transformers 5's fused experts);
  - tokens.txt, when present, equals the fixture's input_ids;
  - eval mode, CPU, fp32, on the fixture's input_ids, as scripts/make_golden.py made the
    fixture: logits vs the fixture's `logits` (rel L2 <= 1e-5); with labels=input_ids (HF's own
    shift) and output_router_logits=False, out.loss (CE only) vs `ce_loss` (rel <= 1e-5); with
    output_router_logits=True (as the fixture was made), out.loss vs `loss` (CE + 0.02 * aux,
    rel <= 1e-5) and out.aux_loss vs `aux_loss` (rel <= 5e-5: the fixture's aux is
    (loss - ce) / 0.02 in fp32, see docs/golden.md).

Needs the standard library, torch and transformers only (tested with torch 2.11,
transformers 5.17). load_fixture() needs the standard library alone.
"""
import json
import math
import os
import struct
import sys

TOL_LOGITS = 1e-5
TOL_LOSS = 1e-5
TOL_AUX = 5e-5
COMMENT = "# moetrain golden fixture "


class Tensor:
    """One fixture tensor: dtype 'f32' or 'i32', shape (tuple), values (flat list, row-major)."""

    def __init__(self, name, dtype, shape, values):
        self.name, self.dtype, self.shape, self.values = name, dtype, shape, values

    def numel(self):
        return math.prod(self.shape)


def load_fixture(path):
    """Parses the .golden format (scripts/make_golden.py; read by tests/test_golden.c): a JSON
    comment line, one line per tensor "name dtype ndim d0 [d1 ...] offset", a line
    "end HEADER_BYTES", then raw little-endian f32 / i32 data at the offsets from the end of
    the header. Returns (meta dict, {name: Tensor})."""
    with open(path, "rb") as f:
        data = f.read()
    nl = data.index(b"\n")
    first = data[:nl].decode("utf-8")
    if not first.startswith(COMMENT):
        raise ValueError(f"{path}: not a moetrain golden fixture (first line: {first[:40]!r})")
    meta = json.loads(first[len(COMMENT):])
    entries, pos, head = [], nl + 1, None
    while pos < len(data):
        e = data.index(b"\n", pos)
        line = data[pos:e].decode("utf-8")
        pos = e + 1
        if line.startswith("end "):
            head = int(line[4:])
            break
        f = line.split()
        name, dt, nd = f[0], f[1], int(f[2])
        if dt not in ("f32", "i32") or len(f) != 4 + nd:
            raise ValueError(f"{path}: bad header line {line!r}")
        entries.append((name, dt, tuple(int(x) for x in f[3:3 + nd]), int(f[3 + nd])))
    if head is None or head != pos:
        raise ValueError(f"{path}: header ends at byte {pos}, its end line says {head}")
    tensors = {}
    for name, dt, shape, off in entries:
        n = math.prod(shape)
        start = head + off
        if start + 4 * n > len(data):
            raise ValueError(f"{path}: {name} runs past the end of the file")
        values = list(struct.unpack_from("<%d%s" % (n, "f" if dt == "f32" else "i"), data, start))
        if name in tensors:
            raise ValueError(f"{path}: {name} twice")
        tensors[name] = Tensor(name, dt, shape, values)
    return meta, tensors


def read_tokens(path):
    with open(path) as f:
        return [[int(x) for x in line.split()] for line in f if line.strip()]


def rel_l2(a, b):
    a, b = a.double(), b.double()
    den = b.norm().item()
    return (a - b).norm().item() / den if den else (0.0 if a.norm().item() == 0 else math.inf)


def rel(a, b):
    return abs(a - b) / abs(b) if b else (0.0 if a == 0 else math.inf)


def main(argv):
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    export_dir, fixture = argv[1], argv[2]
    meta, fx = load_fixture(fixture)
    failures = []

    def check(ok, what):
        print(("PASS " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    B, T, V = meta["B"], meta["T"], meta["config"]["vocab_size"]
    for name, shape in (("input_ids", (B, T)), ("logits", (B, T, V)), ("ce_loss", (1,)), ("loss", (1,)),
                        ("aux_loss", (1,))):
        if name not in fx or fx[name].shape != shape:
            print(f"{fixture}: no {name} {list(shape)}", file=sys.stderr)
            return 1

    import torch
    import transformers
    from transformers import MixtralForCausalLM

    print(f"torch {torch.__version__}, transformers {transformers.__version__}; fixture made with torch "
          f"{meta.get('torch')}, transformers {meta.get('transformers')}")
    ids_list = fx["input_ids"].values
    ids = torch.tensor(ids_list, dtype=torch.long).reshape(B, T)
    tok_path = os.path.join(export_dir, "tokens.txt")
    if os.path.exists(tok_path):
        check(read_tokens(tok_path) == ids.tolist(), f"{tok_path} holds the fixture's input_ids [{B}, {T}]")
    else:
        print(f"note: no {tok_path}; using the fixture's input_ids")

    model, info = MixtralForCausalLM.from_pretrained(export_dir, dtype=torch.float32, attn_implementation="eager",
                                                     output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    print("loading info:", {k: (sorted(map(str, v)) if isinstance(v, (list, set, tuple)) else v) for k, v in info.items()})
    check(not bad, "from_pretrained: no missing, unexpected or mismatched keys, no errors" + (f": {bad}" if bad else ""))
    model = model.to("cpu").eval()
    params = dict(model.named_parameters())
    wrong = sorted(n for n, p in params.items() if p.dtype != torch.float32)
    check(not wrong, f"all {len(params)} parameters are float32" + (f" (not: {wrong})" if wrong else ""))

    # the loaded config against the fixture's model config
    cfg = model.config
    diffs = []
    for k, want in meta["config"].items():
        if k == "output_router_logits":  # the export writes false (HF's default); set per call below
            continue
        if k == "rope_theta":
            rp = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
            got = rp.get("rope_theta", getattr(cfg, "rope_theta", None)) if isinstance(rp, dict) else getattr(cfg, "rope_theta", None)
            rtype = rp.get("rope_type", "default") if isinstance(rp, dict) else "default"
            if rtype != "default":
                diffs.append(f"rope_type {rtype!r}")
        elif hasattr(cfg, k):
            got = getattr(cfg, k)
        else:
            print(f"note: the loaded config has no attribute {k}")
            continue
        if got != want:
            diffs.append(f"{k} {got!r} (fixture {want!r})")
    check(not diffs, "the loaded config is the fixture's model" + (": " + ", ".join(diffs) if diffs else ""))

    # the weights, bit for bit: published names, or transformers 5's fused experts
    # (gate_up_proj[e] = [w1; w3], down_proj[e] = w2; docs/golden.md)
    def pub(n):
        return torch.tensor(fx[n].values, dtype=torch.float32).reshape(fx[n].shape)

    E = meta["config"]["num_local_experts"]
    compared, differ, unmapped = 0, [], []
    with torch.no_grad():
        for n, p in params.items():
            want = None
            cand = n.replace(".mlp.", ".block_sparse_moe.")
            if cand in fx:
                want = pub(cand)
            elif n.endswith(".experts.gate_up_proj") or n.endswith(".experts.down_proj"):
                pre = cand[: cand.rindex(".experts.")] + ".experts."
                if n.endswith("gate_up_proj"):
                    want = torch.stack([torch.cat([pub(f"{pre}{e}.w1.weight"), pub(f"{pre}{e}.w3.weight")]) for e in range(E)])
                else:
                    want = torch.stack([pub(f"{pre}{e}.w2.weight") for e in range(E)])
            if want is None or tuple(want.shape) != tuple(p.shape):
                unmapped.append(f"{n} {tuple(p.shape)}")
                continue
            compared += 1
            if not torch.equal(p.detach(), want):
                differ.append(n)
    if unmapped:
        print("note: parameters not compared (layout unknown to this script):", unmapped)
    check(not differ and compared > 0,
          f"{compared} loaded parameters equal the fixture's weights bit for bit" + (f" (differ: {differ})" if differ else ""))

    ref_logits = torch.tensor(fx["logits"].values, dtype=torch.float32).reshape(B, T, V)
    ce_ref, loss_ref, aux_ref = fx["ce_loss"].values[0], fx["loss"].values[0], fx["aux_loss"].values[0]
    print("experts implementation:", getattr(cfg, "_experts_implementation", None), "; attention:",
          getattr(cfg, "_attn_implementation", None))
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids, output_router_logits=False, use_cache=False)
        out2 = model(input_ids=ids, labels=ids, output_router_logits=True, use_cache=False)
    logits = out.logits.float()
    e = rel_l2(logits, ref_logits)
    print(f"logits: rel L2 {e:.3g}, max abs diff {(logits - ref_logits).abs().max().item():.3g}, "
          f"bit for bit equal: {torch.equal(logits, ref_logits)}")
    check(e <= TOL_LOGITS, f"logits [{B}, {T}, {V}] rel L2 {e:.3g} <= {TOL_LOGITS:g}")
    ce = out.loss.item()
    own = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)).item()
    print(f"ce_loss: HF {ce:.9g} (own shifted CE on HF's logits {own:.9g}), fixture {ce_ref:.9g}")
    check(rel(ce, ce_ref) <= TOL_LOSS, f"CE loss (labels=input_ids, HF's shift) rel diff {rel(ce, ce_ref):.3g} <= {TOL_LOSS:g}")
    loss, aux = out2.loss.item(), (out2.aux_loss.item() if out2.aux_loss is not None else math.nan)
    print(f"loss (CE + {cfg.router_aux_loss_coef:g} aux): HF {loss:.9g}, fixture {loss_ref:.9g}; "
          f"aux: HF {aux:.9g}, fixture {aux_ref:.9g}")
    check(rel(loss, loss_ref) <= TOL_LOSS, f"total loss rel diff {rel(loss, loss_ref):.3g} <= {TOL_LOSS:g}")
    check(rel(aux, aux_ref) <= TOL_AUX, f"aux loss rel diff {rel(aux, aux_ref):.3g} <= {TOL_AUX:g}")
    check(torch.equal(out2.logits, out.logits), "output_router_logits does not change the logits")

    if failures:
        print(f"hf_check: FAIL ({len(failures)} of the checks above)")
        return 1
    print(f"hf_check: PASS: {export_dir} loads in transformers {transformers.__version__} and gives the fixture's logits")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
