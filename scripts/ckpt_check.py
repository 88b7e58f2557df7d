"""Helpers of scripts/ckpt_check.sh (the `ckpt` step of scripts/gpu_check.sh): checkpoint
resume exactness and the Hugging Face export of a trained checkpoint.

    python3 scripts/ckpt_check.py tokens OUT.bin [--fasta data/hairpin.fa.gz] [--windows 32] [--seq 128]
    python3 scripts/ckpt_check.py compare --label TEXT --ref REF/metrics.jsonl --run RUN/metrics.jsonl
        --steps LO-HI [--noise NOISE/metrics.jsonl] [--ckpt REF_STEP_DIR RUN_STEP_DIR]...
        [--noise-ckpt REF_STEP_DIR NOISE_STEP_DIR] [--count N] [--ignore-state F1,F2] [--info]
    python3 scripts/ckpt_check.py hf --bin EVAL.bin --seq 128 --val-frac 0.5 --nseq 16 --tokens 2048
        --case HF_DIR LABEL LOSS RTOL [--case ...]

tokens   writes an llm.c .bin shard (uint16) of windows * seq + 1 byte tokens taken from a FASTA
         file the way moetrain reads it (sequence lines of a record concatenated, each record
         followed by token 10): data both `moetrain eval data.path=OUT.bin data.format=bin` and the
         `hf` command below read, so they score the same sequences.
compare  one resume comparison: the per-step losses (loss, ce_loss, aux_loss, grad_norm, lr) of
         steps LO..HI of RUN against REF (metrics.jsonl as moetrain writes it: 6 decimals), and
         the checkpoints (rank files byte for byte; when they differ, every tensor: max abs diff
         and rel L2 per group master / exp_avg / exp_avg_sq; trainer_state.yaml's fields before
         `config:`). NOISE is a repeat of REF (same command line): its differences from REF are
         the GPU's run-to-run nondeterminism, the floor the resumed run is judged against.
         Verdict: PASS when every step is there once and
           max |loss_RUN - loss_REF| <= 1e-5 + 2 * max |loss_NOISE - loss_REF|   (same steps)
         and the checkpoint tensors are bitwise equal, or (only where the NOISE checkpoints differ
         too) within 2 x the noise's rel L2 per group. 1e-5 covers the 6-decimal print (5e-7) and
         the one nondeterministic term of the loss with bitwise-equal weights: the router's
         sum of probabilities over 1024 tokens by float atomics enters 0.02 * aux (aux ~ 2), at
         most 1024 * 2^-24 relative, ~2.5e-6 absolute. So with a reproducible GPU the test
         demands bitwise-equal state; with a nondeterministic one, no more than twice its noise.
hf       loads each HF_DIR (a `moetrain export`) with MixtralForCausalLM.from_pretrained (fp32,
         eager attention, output_loading_info: no missing / unexpected / mismatched keys) as
         scripts/hf_check.py does, computes the mean next-token CE over the first NSEQ windows of
         the validation split of EVAL.bin exactly as moetrain's .bin reader and trainer_eval
         define it (W = (n - 1) // seq windows, the last round(W * val_frac) are validation,
         window w = tokens [w*seq, w*seq + seq + 1): inputs the first seq, targets the last seq),
         on the CPU in fp32, and compares it with LOSS (moetrain eval's val_loss) within RTOL
         relative. HF's own loss (input_ids = labels = the seq + 1 window, HF shifts) is checked
         against the CE computed here too. Prints SKIP and exits 3 when torch / transformers do
         not import (this machine has neither; the GPU machine has both).

Every check prints one line starting PASS, FAIL or SKIP (NOTE for a measurement: compare --info);
details are indented by two spaces. The exit status is 1 when a check failed.
Standard library only, except `hf` (torch, transformers; tested against transformers 5.17).
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys
from array import array

BIN_MAGIC = 20240520
KEYS = ("loss", "ce_loss", "aux_loss", "grad_norm", "lr")
LOSS_FLOOR = 1e-5
NOISE_FACTOR = 2.0


def say(*a):
    print(*a, flush=True)


def short(p):
    """The last three components of a path (DTYPE/RUN/step_N under the work directory)."""
    return os.sep.join(os.path.normpath(p).split(os.sep)[-3:])


# ---- tokens -----------------------------------------------------------------------------------

def fasta_tokens(path, need, sep=10):
    """Byte tokens of a FASTA file as moetrain's byte-level reader makes them (whitespace and
    '\\r' dropped, a '>' line starts a record, ';' lines are comments, sep after each record)."""
    opener = gzip.open if path.endswith(".gz") else open
    out = bytearray()
    rec = bytearray()
    with opener(path, "rb") as f:
        for line in f:
            if line.startswith(b">"):
                if rec:
                    out += rec
                    out.append(sep)
                    rec = bytearray()
                if len(out) >= need:
                    break
                continue
            if line.startswith(b";"):
                continue
            rec += bytes(c for c in line if c not in b" \t\r\n")
    if rec and len(out) < need:
        out += rec
        out.append(sep)
    if len(out) < need:
        raise SystemExit(f"{path}: only {len(out)} tokens, {need} needed")
    return list(out[:need])


def write_bin(path, toks):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = BIN_MAGIC, 1, len(toks)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        f.write(struct.pack("<%dH" % len(toks), *toks))


def read_bin(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack_from("<3i", data, 0)
    if magic != BIN_MAGIC or version not in (1, 2):
        raise ValueError(f"{path}: not an llm.c .bin shard (magic {magic}, version {version})")
    w = 2 if version == 1 else 4
    if len(data) != 1024 + count * w:
        raise ValueError(f"{path}: {len(data)} bytes, the header says {count} tokens")
    return list(struct.unpack_from("<%d%s" % (count, "H" if w == 2 else "I"), data, 1024))


def val_windows(toks, seq, val_frac, nseq):
    """moetrain's .bin split (src/data.c finish_bin) and trainer_eval's first nseq sequences
    of the validation split (world 1: sequences 0..nseq-1, never shuffled)."""
    W = (len(toks) - 1) // seq if len(toks) >= seq + 1 else 0
    nval = int(math.floor(W * val_frac + 0.5)) if val_frac > 0 else 0  # llround
    if val_frac > 0 and nval == 0:
        nval = 1
    if W <= nval:
        raise ValueError(f"{W} windows, {nval} for validation: none left for training")
    ntrain = W - nval
    if nseq > nval:
        raise ValueError(f"{nseq} sequences asked, the validation split has {nval} windows")
    return [toks[(ntrain + i) * seq: (ntrain + i) * seq + seq + 1] for i in range(nseq)]


def cmd_tokens(a):
    toks = fasta_tokens(a.fasta, a.windows * a.seq + 1)
    write_bin(a.out, toks)
    say(f"wrote {a.out}: {len(toks)} tokens ({a.windows} windows of {a.seq}) from {a.fasta}")
    return 0


# ---- compare ----------------------------------------------------------------------------------

def read_metrics(path):
    """{step: {key: value}}; a step twice is an error (the resumed log must join without
    duplicates)."""
    rows, dup = {}, []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r["step"] in rows:
                dup.append(r["step"])
            rows[r["step"]] = r
    return rows, dup


def loss_diffs(ref, run, steps):
    """max |run - ref| per key over steps, steps missing in run, and whether every value is the
    same printed number."""
    mx = {k: 0.0 for k in KEYS}
    missing, same = [], True
    for s in steps:
        if s not in run or s not in ref:
            missing.append(s)
            continue
        for k in KEYS:
            a, b = ref[s].get(k), run[s].get(k)
            if a is None or b is None:
                continue
            d = abs(a - b) if (math.isfinite(a) and math.isfinite(b)) else (0.0 if a == b else math.inf)
            mx[k] = max(mx[k], d)
            same &= a == b
    return mx, missing, same


def read_safetensors(path):
    """{name: (dtype, shape, array of floats)} for an F32 file (moetrain checkpoint rank files)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    hdr = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        if t["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {t['dtype']}, only F32 is compared")
        a = array("f")
        a.frombytes(data[base + lo: base + hi])
        if sys.byteorder != "little":
            a.byteswap()
        out[name] = (t["dtype"], tuple(t["shape"]), a)
    return out


def rank_files(step_dir):
    return sorted(f for f in os.listdir(step_dir) if f.startswith("rank_") and f.endswith(".safetensors"))


def state_fields(step_dir):
    """trainer_state.yaml's lines before `config:` as {key: value} (comments dropped)."""
    out = {}
    with open(os.path.join(step_dir, "trainer_state.yaml")) as f:
        for line in f:
            if line.startswith("config:"):
                break
            if line.startswith("#") or ":" not in line:
                continue
            k, v = line.split(":", 1)
            out[k.strip()] = v.strip()
    return out


def group(name):
    return "exp_avg_sq" if name.startswith("optim.exp_avg_sq.") else "exp_avg" if name.startswith("optim.exp_avg.") else "master"


def ckpt_diff(ref_dir, run_dir, ignore=(), loss_tol=LOSS_FLOOR):
    """(bitwise, {group: (max_abs, rel_l2, n_diff, n)}, problems, state differences); `ignore`:
    trainer_state fields not compared; loss_ema (the last loss) may differ by loss_tol."""
    problems, groups = [], {}
    fr, fu = rank_files(ref_dir), rank_files(run_dir)
    if fr != fu:
        problems.append(f"rank files {fr} vs {fu}")
    bitwise = not problems
    for fn in sorted(set(fr) & set(fu)):
        pa, pb = os.path.join(ref_dir, fn), os.path.join(run_dir, fn)
        with open(pa, "rb") as f1, open(pb, "rb") as f2:
            if f1.read() == f2.read():
                continue
        bitwise = False
        A, B = read_safetensors(pa), read_safetensors(pb)
        if set(A) != set(B):
            problems.append(f"{fn}: tensor names differ ({sorted(set(A) ^ set(B))[:4]} ...)")
        for name in sorted(set(A) & set(B)):
            (_, sa, a), (_, sb, b) = A[name], B[name]
            if sa != sb:
                problems.append(f"{fn}: {name} shape {sa} vs {sb}")
                continue
            g = groups.setdefault(group(name), [0.0, 0.0, 0.0, 0, 0])  # max_abs, sum d^2, sum ref^2, n_diff, n
            for x, y in zip(a, b):
                if x != y or x != x:  # NaN: counted as a difference
                    d = y - x
                    g[3] += 1
                    g[0] = max(g[0], abs(d)) if d == d else math.inf
                    g[1] += d * d
                g[2] += x * x
            g[4] += len(a)
    stats = {k: (v[0], math.sqrt(v[1]) / math.sqrt(v[2]) if v[2] > 0 else (0.0 if v[1] == 0 else math.inf), v[3], v[4])
             for k, v in groups.items()}
    sa, sb = state_fields(ref_dir), state_fields(run_dir)
    sdiff = []
    for k in sorted(set(sa) | set(sb)):
        if sa.get(k) == sb.get(k) or k in ignore:
            continue
        if k == "loss_ema":  # the last step's loss (%.17g): judged with the losses
            try:
                if abs(float(sa[k]) - float(sb[k])) <= loss_tol:
                    continue
            except (KeyError, ValueError):
                pass
        sdiff.append(f"{k}: {sa.get(k)} vs {sb.get(k)}")
    return bitwise and not problems, stats, problems, sdiff


def fmt_stats(stats):
    return "; ".join(f"{g}: max|d| {v[0]:.3g}, rel L2 {v[1]:.3g}, {v[2]}/{v[3]} differ" for g, v in sorted(stats.items()))


def parse_steps(s):
    lo, _, hi = s.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def cmd_compare(a):
    steps = parse_steps(a.steps)
    fails = []
    ref, dref = read_metrics(a.ref)
    run, drun = read_metrics(a.run)
    if dref or drun:
        fails.append(f"duplicate steps in the logs: ref {dref}, run {drun}")
    if a.count is not None and len(run) != a.count:
        fails.append(f"{short(a.run)} has {len(run)} steps, {a.count} expected")
    mx, missing, same = loss_diffs(ref, run, steps)
    if missing:
        fails.append(f"steps {missing} missing")
    noise_mx = None
    if a.noise:
        noise, dn = read_metrics(a.noise)
        noise_mx, nmiss, nsame = loss_diffs(ref, noise, steps)
        say(f"  noise (repeat of the reference run), steps {a.steps}: " +
            ", ".join(f"{k} {noise_mx[k]:.3g}" for k in KEYS) + (" (all equal)" if nsame and not nmiss else ""))
    tol = LOSS_FLOOR + NOISE_FACTOR * (noise_mx["loss"] if noise_mx else 0.0)
    say(f"  {a.label}, steps {a.steps}: max |diff| " + ", ".join(f"{k} {mx[k]:.3g}" for k in KEYS) +
        f"; printed values all equal: {same and not missing}; loss tolerance {tol:.3g}")
    if not mx["loss"] <= tol:
        fails.append(f"max |loss diff| {mx['loss']:.3g} > {tol:.3g}")
    if not mx["ce_loss"] <= tol:
        fails.append(f"max |ce_loss diff| {mx['ce_loss']:.3g} > {tol:.3g}")
    noise_ck = {}
    if a.noise_ckpt:
        nb, nstats, nprob, nsd = ckpt_diff(*a.noise_ckpt)
        noise_ck = {} if nb else nstats
        say(f"  noise checkpoints {short(a.noise_ckpt[1])} vs {short(a.noise_ckpt[0])}: " +
            ("bitwise equal" if nb else fmt_stats(nstats) + (f" {nprob}" if nprob else "")))
    all_bitwise = True
    ignore = tuple(a.ignore_state.split(",")) if a.ignore_state else ()
    for rd, ud in a.ckpt or []:
        b, stats, prob, sdiff = ckpt_diff(rd, ud, ignore, tol)
        all_bitwise &= b
        say(f"  checkpoint {short(ud)} vs {short(rd)}: " + ("tensors bitwise equal" if b else fmt_stats(stats)) +
            ("; trainer_state equal" if not sdiff else f"; trainer_state differs: {sdiff}"))
        fails += [f"{short(ud)}: {p}" for p in prob]
        if sdiff:
            fails.append(f"{short(ud)}/trainer_state.yaml differs from {short(rd)}: {sdiff}")
        if not b:
            for g, v in stats.items():
                lim = NOISE_FACTOR * noise_ck[g][1] if g in noise_ck else 0.0
                if not v[1] <= lim:
                    fails.append(f"{short(ud)}: {g} rel L2 {v[1]:.3g} from the reference > {lim:.3g} "
                                 f"({'2 x the run-to-run noise' if g in noise_ck else 'the repeat run is bitwise equal'})")
    kind = "bitwise" if all_bitwise and same and not missing else "within the run-to-run noise"
    if a.info:  # a measurement (the noise floor itself), not a check
        say(f"NOTE {a.label}: max |loss diff| {mx['loss']:.3g}, state " +
            ("bitwise equal" if all_bitwise and not fails else "differs: " + "; ".join(fails)))
        return 0
    if fails:
        say(f"FAIL {a.label}: " + "; ".join(fails))
        return 1
    say(f"PASS {a.label}: steps {a.steps} max |loss diff| {mx['loss']:.3g} (tol {tol:.3g}), " +
        ("state " + kind if a.ckpt else "losses " + ("equal" if same else "within tolerance")))
    return 0


# ---- hf ---------------------------------------------------------------------------------------

def cmd_hf(a):
    try:
        import torch
        import transformers
        from transformers import MixtralForCausalLM
    except Exception as ex:  # ImportError, or a broken install
        say(f"SKIP hf: cannot import torch / transformers ({type(ex).__name__}: {ex}); the Hugging Face check needs them")
        return 3
    say(f"  torch {torch.__version__}, transformers {transformers.__version__}")
    toks = read_bin(a.bin)
    wins = val_windows(toks, a.seq, a.val_frac, a.nseq)
    win = torch.tensor(wins, dtype=torch.long)  # [nseq, seq + 1]
    inp, tgt = win[:, :-1], win[:, 1:]
    fails = 0

    def check(ok, what):
        nonlocal fails
        say(("PASS " if ok else "FAIL ") + what)
        fails += 0 if ok else 1

    check(tgt.numel() == a.tokens, f"hf: {a.nseq} windows x {a.seq} = {tgt.numel()} target tokens, moetrain eval scored {a.tokens}")
    cache = {}
    for d, label, want, rtol in a.case:
        want, rtol = float(want), float(rtol)
        if d not in cache:
            try:
                model, info = MixtralForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                                                 output_loading_info=True)
            except Exception as ex:
                check(False, f"hf: {short(d)}: from_pretrained failed: {type(ex).__name__}: {ex}")
                cache[d] = None
                continue
            bad = {k: v for k, v in info.items() if v}
            check(not bad, f"hf: {short(d)} loads: no missing, unexpected or mismatched keys" + (f" ({bad})" if bad else ""))
            model = model.to("cpu").eval()
            wrong = sorted(n for n, p in model.named_parameters() if p.dtype != torch.float32)
            if wrong:
                check(False, f"hf: {short(d)}: parameters not float32: {wrong[:4]}")
            V = model.config.vocab_size
            with torch.no_grad():
                logits = model(input_ids=inp, use_cache=False).logits.float()
                ce = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1)).item()
                own = model(input_ids=win, labels=win, use_cache=False).loss.item()  # HF's shift, seq + 1 positions
            say(f"  {short(d)}: CE over {tgt.numel()} tokens {ce:.7f}; HF's own loss (labels = the {a.seq + 1}-token windows) {own:.7f}")
            check(abs(own - ce) <= 1e-5 * abs(ce), f"hf: {short(d)}: HF's own loss {own:.7f} = the CE on its logits {ce:.7f} (rel 1e-5)")
            cache[d] = ce
        ce = cache[d]
        if ce is None:
            continue
        r = abs(ce - want) / abs(want) if want else math.inf
        check(r <= rtol, f"hf: {short(d)} in transformers {ce:.6f} vs {label} {want:.6f}: "
                         f"rel diff {r:.2g} {'<=' if r <= rtol else '>'} {rtol:g}")
    return 1 if fails else 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokens")
    t.add_argument("out")
    t.add_argument("--fasta", default="data/hairpin.fa.gz")
    t.add_argument("--windows", type=int, default=32)
    t.add_argument("--seq", type=int, default=128)
    c = sub.add_parser("compare")
    c.add_argument("--label", required=True)
    c.add_argument("--ref", required=True)
    c.add_argument("--run", required=True)
    c.add_argument("--steps", required=True)
    c.add_argument("--noise")
    c.add_argument("--count", type=int)
    c.add_argument("--ckpt", nargs=2, action="append", metavar=("REF", "RUN"))
    c.add_argument("--noise-ckpt", nargs=2, metavar=("REF", "NOISE"))
    c.add_argument("--ignore-state", help="comma-separated trainer_state.yaml fields not compared")
    c.add_argument("--info", action="store_true", help="print a NOTE line (a measurement), never FAIL")
    h = sub.add_parser("hf")
    h.add_argument("--bin", required=True)
    h.add_argument("--seq", type=int, required=True)
    h.add_argument("--val-frac", type=float, required=True)
    h.add_argument("--nseq", type=int, required=True)
    h.add_argument("--tokens", type=int, required=True)
    h.add_argument("--case", nargs=4, action="append", required=True, metavar=("HF_DIR", "LABEL", "LOSS", "RTOL"))
    a = p.parse_args(argv[1:])
    try:
        return {"tokens": cmd_tokens, "compare": cmd_compare, "hf": cmd_hf}[a.cmd](a)
    except Exception as ex:
        say(f"FAIL {a.cmd}: {type(ex).__name__}: {ex}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
