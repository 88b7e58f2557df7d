#!/usr/bin/env python3
"""Raw files to token shards that `moetrain` reads (docs/data.md).

    scripts/tokenize_data.py --tokenizer TOKENIZER --out DIR [options] INPUT...

TOKENIZER is a SentencePiece model (tokenizer.model: Mixtral, Mistral, Llama 2; needs the
`sentencepiece` module: Debian's python3-sentencepiece, `make deps`), a Hugging Face
tokenizer.json (needs the `tokenizers` package), a directory holding either, or `bytes`
(byte-level tokens 0..255, end of document = --eos-id, default 0).

INPUT is files, directories (their files, sorted, recursively) or glob patterns, each plain or
.gz: plain text (a document per file, per blank-line block or per line: --text-docs), JSON Lines
(--field names the text), FASTA and FASTQ (a record's sequence is a document, as the trainer's
byte-level reader sees it). The format comes from the name (.txt/.md: text, .jsonl/.ndjson/.json:
JSON Lines, .fa/.fasta/.fna/...: FASTA, .fq/.fastq: FASTQ, anything else: text) unless --format.

Every document becomes [BOS] tokens EOS (BOS where the tokenizer adds one: SentencePiece models
with a BOS id, Hugging Face tokenizers whose post-processor adds it; --no-bos drops it). A
document goes to validation when a hash of its index (and --seed) falls below --val-frac, so the
split does not depend on --workers. Output in DIR:

    train_000000.bin ...  llm.c shards: 256 x int32 header (magic, version, token count), then
    val_000000.bin ...    tokens: uint16 (magic 20240520, version 1) when the vocabulary has at most
                          65536 entries, else uint32 (magic 20240801, version 7)
    tokenizer/            a copy of the tokenizer files (what `moetrain export` ships)
    manifest.json         tokenizer, vocab size, BOS/EOS ids, token and document counts, shards,
                          source files with sizes

Each shard is written to a hidden temp name (.NAME.tmp) whose header has magic 0 until the last
token is written; then the header, fsync, rename. A killed run leaves no file under a shard name
and no temp file that passes the trainer's validation. The manifest is written last, the same way.

MOETRAIN_TOKENIZE_CRASH_AT=k (tests only) SIGKILLs the run while it finishes its k-th shard.

Throughput: the input is read and parsed in this process, documents are encoded by --workers
processes (default: all cores), shards written here in input order.
"""
import argparse
import array
import glob
import gzip
import io
import json
import os
import re
import shutil
import signal
import sys
import time

HEADER_INTS = 256
MAGIC_U16, VERSION_U16 = 20240520, 1
MAGIC_U32, VERSION_U32 = 20240801, 7
FASTA_EXT = (".fa", ".fasta", ".fna", ".ffn", ".faa", ".frn", ".fas")
FASTQ_EXT = (".fq", ".fastq")
JSONL_EXT = (".jsonl", ".ndjson", ".json")
MASK64 = (1 << 64) - 1


def die(msg):
    sys.stderr.write("tokenize: error: %s\n" % msg)
    sys.exit(2)


def reexec_for_module(module):
    """The default python3 may lack a Debian module (python3-sentencepiece lives under
    /usr/bin/python3): run this script there instead, once."""
    alt = "/usr/bin/python3"
    if os.environ.get("MOETRAIN_TOKENIZE_REEXEC") or not os.path.exists(alt):
        return
    if os.path.realpath(sys.executable) == os.path.realpath(alt):
        return
    os.environ["MOETRAIN_TOKENIZE_REEXEC"] = "1"
    os.execv(alt, [alt, os.path.abspath(__file__)] + sys.argv[1:])


def mix64(z):
    """splitmix64's finaliser (the trainer's data_mix64)."""
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def is_val(doc_index, seed, val_frac):
    return val_frac > 0 and (mix64(doc_index ^ mix64(seed)) >> 11) * (2.0 ** -53) < val_frac


# ---- tokenizers ------------------------------------------------------------------------------

class Tok:
    """kind, path, vocab, bos, eos, pad, files (to copy), encode(list of str) -> list of lists."""

    def __init__(self, spec, no_bos, eos_override):
        self.spec = spec
        self.no_bos = no_bos
        self.eos_override = eos_override
        self.files = []
        if spec == "bytes":
            self.kind, self.path = "bytes", None
        else:
            path = spec
            if os.path.isdir(path):
                for name in ("tokenizer.model", "tokenizer.json"):
                    if os.path.isfile(os.path.join(path, name)):
                        path = os.path.join(path, name)
                        break
                else:
                    die("%s holds neither tokenizer.model nor tokenizer.json" % spec)
            if not os.path.isfile(path):
                die("tokenizer %s not found (give a tokenizer.model, a tokenizer.json, a directory holding one, "
                    "or bytes)" % spec)
            self.path = os.path.abspath(path)
            with open(self.path, "rb") as f:
                head = f.read(64).lstrip()
            self.kind = "hf" if head.startswith(b"{") else "sentencepiece"
        self.load()

    def load(self):
        if self.kind == "bytes":
            self.vocab, self.bos = 256, None
            self.eos = 0 if self.eos_override is None else self.eos_override
            self.pad = None
        elif self.kind == "sentencepiece":
            try:
                import sentencepiece
            except ImportError:
                reexec_for_module("sentencepiece")
                die("the sentencepiece module is missing: install python3-sentencepiece (make deps) and run "
                    "this with /usr/bin/python3")
            self.sp = sentencepiece.SentencePieceProcessor(model_file=self.path)
            self.vocab = self.sp.get_piece_size()
            self.bos = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
            self.eos = self.sp.eos_id() if self.sp.eos_id() >= 0 else None
            self.pad = self.sp.pad_id() if self.sp.pad_id() >= 0 else None
            self.files = [self.path]
        else:
            try:
                import tokenizers
            except ImportError:
                die("a tokenizer.json needs the `tokenizers` Python package (it comes with transformers); "
                    "it is not importable by %s" % sys.executable)
            self.hf = tokenizers.Tokenizer.from_file(self.path)
            self.vocab = self.hf.get_vocab_size(with_added_tokens=True)
            d = os.path.dirname(self.path)
            cfg = {}
            for name in ("tokenizer_config.json", "special_tokens_map.json"):
                p = os.path.join(d, name)
                if os.path.isfile(p):
                    self.files.append(p)
                    try:
                        with open(p) as f:
                            for k, v in json.load(f).items():
                                cfg.setdefault(k, v)
                    except ValueError:
                        pass
            self.files.insert(0, self.path)

            def special(key, names):
                v = cfg.get(key)
                if isinstance(v, dict):
                    v = v.get("content")
                for name in ([v] if isinstance(v, str) else []) + names:
                    i = self.hf.token_to_id(name)
                    if i is not None:
                        return i
                return None
            self.eos = special("eos_token", ["</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>"])
            self.pad = special("pad_token", ["<pad>", "<|pad|>"])
            probe = self.hf.encode("a").ids
            plain = self.hf.encode("a", add_special_tokens=False).ids
            self.bos = probe[0] if len(probe) > len(plain) and probe[:1] != plain[:1] else None
        if self.eos_override is not None:
            self.eos = self.eos_override
        if self.eos is None:
            die("the tokenizer %s has no end-of-sequence token; give --eos-id N" % self.spec)
        if not (0 <= self.eos < self.vocab):
            die("--eos-id %d is outside the vocabulary (0..%d)" % (self.eos, self.vocab - 1))
        if self.no_bos:
            self.bos = None

    def __getstate__(self):
        d = dict(self.__dict__)
        d.pop("sp", None)
        d.pop("hf", None)
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        if self.kind == "sentencepiece":
            import sentencepiece
            self.sp = sentencepiece.SentencePieceProcessor(model_file=self.path)
        elif self.kind == "hf":
            import tokenizers
            self.hf = tokenizers.Tokenizer.from_file(self.path)

    def encode_packed(self, docs, code):
        """The documents' tokens ([BOS] ids EOS each) as one little-endian array of type code
        ('H' or 'I') in bytes, and each document's token count."""
        flat = array.array(code)
        lens = []
        for ids in self.encode(docs):
            flat.extend(ids)
            lens.append(len(ids))
        if sys.byteorder != "little":
            flat.byteswap()
        return flat.tobytes(), lens

    def encode(self, docs):
        """Each document's tokens: [BOS] ids EOS."""
        if self.kind == "bytes":
            out = [list(d.encode("utf-8")) for d in docs]
        elif self.kind == "sentencepiece":
            out = self.sp.encode(docs, out_type=int)
        else:
            out = [e.ids for e in self.hf.encode_batch(docs, add_special_tokens=False)]
        pre = [self.bos] if self.bos is not None else []
        return [pre + ids + [self.eos] for ids in out]


# ---- tokenizer.json from a SentencePiece model -------------------------------------------------

def _proto_fields(buf):
    """(field, wire type, value) of a protobuf message: varints as int, length-delimited as bytes."""
    i, n = 0, len(buf)

    def varint():
        nonlocal i
        v = shift = 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v
    while i < n:
        key = varint()
        f, wt = key >> 3, key & 7
        if wt == 0:
            yield f, wt, varint()
        elif wt == 1:
            yield f, wt, buf[i:i + 8]
            i += 8
        elif wt == 2:
            k = varint()
            yield f, wt, buf[i:i + k]
            i += k
        elif wt == 5:
            yield f, wt, buf[i:i + 4]
            i += 4
        else:
            raise ValueError("unsupported protobuf wire type %d" % wt)


def spm_tokenizer_json(sp):
    """A Hugging Face tokenizer.json that encodes as a SentencePiece model does, or (None, why) when the
    model uses what it cannot express here (a normalization rule other than identity, or removal
    of extra whitespace). BPE models (Llama, Mistral, Mixtral) and unigram models."""
    model_type, byte_fallback = 1, False
    norm = {"name": "nmt_nfkc", "add_dummy_prefix": True, "remove_extra_whitespaces": True}
    for f, wt, v in _proto_fields(sp.serialized_model_proto()):
        if f == 2 and wt == 2:
            for g, wt2, u in _proto_fields(v):
                if g == 3 and wt2 == 0:
                    model_type = u
                elif g == 35 and wt2 == 0:
                    byte_fallback = bool(u)
        elif f == 3 and wt == 2:
            for g, wt2, u in _proto_fields(v):
                if g == 1 and wt2 == 2:
                    norm["name"] = u.decode()
                elif g == 3 and wt2 == 0:
                    norm["add_dummy_prefix"] = bool(u)
                elif g == 4 and wt2 == 0:
                    norm["remove_extra_whitespaces"] = bool(u)
    if norm["name"] != "identity":
        return None, "normalization rule %s (only identity converts)" % norm["name"]
    if norm["remove_extra_whitespaces"]:
        return None, "remove_extra_whitespaces is on"
    if model_type not in (1, 2):
        return None, "model type %d (only unigram and BPE convert)" % model_type
    n = sp.get_piece_size()
    pieces = [sp.id_to_piece(i) for i in range(n)]
    unk = sp.unk_id()
    added = []
    for i in range(n):
        if sp.is_control(i) or sp.is_unknown(i):
            added.append({"id": i, "content": pieces[i], "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True})
    norms = ([{"type": "Prepend", "prepend": "\u2581"}] if norm["add_dummy_prefix"] else []) + \
        [{"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]
    decs = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}]
    if norm["add_dummy_prefix"]:
        decs.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    bos = sp.bos_id()
    post = None
    if bos >= 0:
        b = pieces[bos]
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": b, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {b: {"id": b, "ids": [bos], "tokens": [b]}}}
    if model_type == 2:  # BPE: merges from the vocabulary, in the order of the merged piece's rank
        vocab = {p: i for i, p in enumerate(pieces)}
        merges = []
        for i, p in enumerate(pieces):
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i):
                continue
            local = [(vocab[p[:k]], vocab[p[k:]], p[:k], p[k:]) for k in range(1, len(p))
                     if p[:k] in vocab and p[k:] in vocab]
            merges += [[a, b] for _, _, a, b in sorted(local)]
        model = {"type": "BPE", "dropout": None, "unk_token": pieces[unk] if unk >= 0 else None,
                 "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                 "byte_fallback": byte_fallback, "ignore_merges": False, "vocab": vocab, "merges": merges}
    else:
        model = {"type": "Unigram", "unk_id": unk if unk >= 0 else None, "byte_fallback": byte_fallback,
                 "vocab": [[pieces[i], sp.get_score(i)] for i in range(n)]}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": norms}, "pre_tokenizer": None,
            "post_processor": post, "decoder": {"type": "Sequence", "decoders": decs}, "model": model}, None


def check_tokenizer_json(path, sp, samples):
    """'verified' when the tokenizers package encodes the samples as SentencePiece does,
    'differs: ...' when not, 'unverified' when the package is missing."""
    try:
        import tokenizers
    except ImportError:
        return "unverified (the tokenizers package is not importable here)"
    t = tokenizers.Tokenizer.from_file(path)
    for text in samples:
        a = t.encode(text, add_special_tokens=False).ids
        b = sp.encode(text, out_type=int)
        if a != b:
            return "differs on %r" % text[:60]
        if t.decode(a) != sp.decode(b):
            return "decodes differently %r" % text[:60]
    return "verified"


# ---- inputs ----------------------------------------------------------------------------------

class Counting(io.RawIOBase):
    """A read-only file that counts the bytes read from disk (for MB/s of input)."""

    def __init__(self, f, counter):
        self.f, self.counter = f, counter

    def readable(self):
        return True

    def readinto(self, b):
        n = self.f.readinto(b)
        self.counter[0] += n or 0
        return n

    def close(self):
        self.f.close()
        super().close()


def open_text(path, counter):
    raw = open(path, "rb")
    gz = raw.read(2) == b"\x1f\x8b"
    raw.seek(0)
    stream = io.BufferedReader(Counting(raw, counter), 1 << 20)
    if gz:
        stream = gzip.GzipFile(fileobj=stream, mode="rb")
    return io.TextIOWrapper(stream, encoding="utf-8", newline="")


def format_of(path, forced):
    if forced != "auto":
        return forced
    name = path[:-3] if path.endswith(".gz") else path
    name = name.lower()
    if name.endswith(FASTA_EXT):
        return "fasta"
    if name.endswith(FASTQ_EXT):
        return "fastq"
    if name.endswith(JSONL_EXT):
        return "jsonl"
    return "text"


_WS = re.compile(r"[ \t\r\v\f]")
_BLANK = re.compile(r"\n[ \t\r]*\n")


def docs_of(path, fmt, args, counter):
    """The documents of one file, as str."""
    with open_text(path, counter) as f:
        if fmt == "fasta":
            parts, seen = [], False
            for line in f:
                if line.startswith(">"):
                    if parts:
                        yield "".join(parts)
                    parts, seen = [], True
                elif line.startswith(";"):
                    continue
                else:
                    s = _WS.sub("", line.rstrip("\n"))
                    if s and not seen:
                        raise ValueError("not FASTA: sequence before the first '>' header")
                    if s:
                        parts.append(s)
            if parts:
                yield "".join(parts)
        elif fmt == "fastq":
            k = 0
            for line in f:
                if k == 0 and not line.strip():
                    continue
                if k == 0 and not line.startswith("@"):
                    raise ValueError("not FASTQ: expected '@' starting a record, found %r" % line[:20])
                if k == 1:
                    s = _WS.sub("", line.rstrip("\n"))
                    if s:
                        yield s
                k = (k + 1) % 4
        elif fmt == "jsonl":
            for no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise ValueError("line %d: not JSON (%s)" % (no, e))
                v = obj.get(args.field) if isinstance(obj, dict) else None
                if not isinstance(v, str):
                    raise ValueError("line %d: no string field %r (set --field)" % (no, args.field))
                if v:
                    yield v
        elif args.text_docs == "file":
            text = f.read()
            if text.strip():
                yield text
        elif args.text_docs == "line":
            for line in f:
                line = line.rstrip("\r\n")
                if line.strip():
                    yield line
        else:  # blank-line blocks
            buf = ""
            while True:
                chunk = f.read(1 << 20)
                buf += chunk
                blocks = _BLANK.split(buf)
                if chunk:
                    buf = blocks.pop()
                for b in blocks:
                    b = b.strip("\n")
                    if b.strip():
                        yield b
                if not chunk:
                    break


def expand_inputs(items):
    out = []
    for it in items:
        if any(c in it for c in "*?["):
            got = sorted(glob.glob(it, recursive=True))
            if not got:
                die("the pattern %s matches no file" % it)
            out += [p for p in got if os.path.isfile(p)]
        elif os.path.isdir(it):
            found = []
            for root, dirs, files in os.walk(it):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, n) for n in sorted(files) if not n.startswith(".")]
            if not found:
                die("the directory %s holds no files" % it)
            out += found
        elif os.path.isfile(it):
            out.append(it)
        else:
            die("input %s not found" % it)
    return out


# ---- shards ----------------------------------------------------------------------------------

class Shards:
    """One split's shards: train_000000.bin, ... written through hidden temp files."""

    def __init__(self, out, split, u32, shard_tokens, crash):
        self.out, self.split, self.shard_tokens, self.crash = out, split, shard_tokens, crash
        self.u32 = u32
        self.code = "I" if self.u32 else "H"
        self.index, self.f, self.n = 0, None, 0
        self.done = []  # (name, tokens)
        self.tokens = self.docs = 0

    def _open(self):
        self.name = "%s_%06d.bin" % (self.split, self.index)
        self.tmp = os.path.join(self.out, ".%s.tmp" % self.name)
        self.f = open(self.tmp, "wb")
        self.f.write(bytes(4 * HEADER_INTS))  # magic 0: not a shard until the header is written
        self.n = 0

    def add(self, data, ntok, ndocs):
        """Appends ntok tokens (little-endian bytes) of ndocs whole documents."""
        self.docs += ndocs
        w = 4 if self.u32 else 2
        mv = memoryview(data)
        pos = 0
        while pos < ntok:
            if self.f is None:
                self._open()
            take = min(ntok - pos, self.shard_tokens - self.n)
            self.f.write(mv[pos * w:(pos + take) * w])
            self.n += take
            self.tokens += take
            pos += take
            if self.n == self.shard_tokens:
                self.close()

    def close(self):
        if self.f is None:
            return
        self.f.flush()
        Shards.finished += 1
        if self.crash and Shards.finished == self.crash:  # fault injection: die with the payload written
            os.fsync(self.f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        hdr = array.array("i", [0] * HEADER_INTS)
        hdr[0], hdr[1] = (MAGIC_U32, VERSION_U32) if self.u32 else (MAGIC_U16, VERSION_U16)
        hdr[2] = self.n
        if sys.byteorder != "little":
            hdr.byteswap()
        self.f.seek(0)
        self.f.write(hdr.tobytes())
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        self.f = None
        os.rename(self.tmp, os.path.join(self.out, self.name))
        self.done.append((self.name, self.n))
        self.index += 1


Shards.finished = 0


def fsync_dir(d):
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path, data):
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


# ---- workers ---------------------------------------------------------------------------------

_TOK = None


def _init(tok):
    global _TOK
    _TOK = tok
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _encode(batch, code):
    return _TOK.encode_packed(batch, code)


def human(n):
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return "%.2f%s" % (n / div, unit)
    return str(int(n))


def main():
    ap = argparse.ArgumentParser(description="Raw files to moetrain token shards (docs/data.md).")
    ap.add_argument("inputs", nargs="+", help="files, directories or globs (.gz ok)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.model, tokenizer.json, a directory holding one, or bytes (UTF-8 bytes, 256 tokens)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--format", default="auto", choices=["auto", "text", "jsonl", "fasta", "fastq"])
    ap.add_argument("--text-docs", default="file", choices=["file", "blank", "line"],
                    help="text: a document per file (default), per blank-line-separated block, or per line")
    ap.add_argument("--field", default="text", help="JSON Lines: the field holding the text (default text)")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (default 1e8)")
    ap.add_argument("--val-frac", type=float, default=0.005, help="fraction of documents for validation (default 0.005)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the train/validation split (default 0)")
    ap.add_argument("--workers", type=int, default=0, help="encoding processes (default: all cores)")
    ap.add_argument("--no-bos", action="store_true", help="do not start documents with BOS")
    ap.add_argument("--eos-id", type=int, default=None, help="the end-of-document token (default: the tokenizer's; bytes: 0)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "uint16", "uint32"],
                    help="token width (auto: uint16 when the vocabulary fits, else uint32)")
    ap.add_argument("--force", action="store_true", help="replace shards already in --out")
    ap.add_argument("--quiet", action="store_true", help="no progress line")
    args = ap.parse_args()
    if not (1 <= args.shard_tokens < 2 ** 31):
        die("--shard-tokens must be in [1, 2^31)")
    if not (0 <= args.val_frac < 1):
        die("--val-frac must be in [0, 1)")
    crash = int(os.environ.get("MOETRAIN_TOKENIZE_CRASH_AT", "0") or 0)

    tok = Tok(args.tokenizer, args.no_bos, args.eos_id)
    files = expand_inputs(args.inputs)
    os.makedirs(args.out, exist_ok=True)
    old = [n for n in os.listdir(args.out) if re.match(r"^\.?(train|val)_\d+\.bin(\.tmp)?$", n) or
           n in ("manifest.json", ".manifest.json.tmp")]
    if old and not args.force:
        die("%s already holds shards (%s...); give --force to replace them, or another --out" % (args.out, old[0]))
    for n in old:
        os.remove(os.path.join(args.out, n))
    sizes = [os.path.getsize(p) for p in files]
    total_in = sum(sizes)
    workers = args.workers or os.cpu_count() or 1

    if args.dtype == "uint16" and tok.vocab > 65536:
        die("--dtype uint16: the vocabulary has %d entries, more than uint16 holds" % tok.vocab)
    u32 = args.dtype == "uint32" or (args.dtype == "auto" and tok.vocab > 65536)
    shards = {"train": Shards(args.out, "train", u32, args.shard_tokens, crash),
              "val": Shards(args.out, "val", u32, args.shard_tokens, crash)}
    counter = [0]
    text_bytes = [0]
    show = not args.quiet and sys.stderr.isatty()
    t0 = time.time()
    last = [0.0]
    ndoc = [0]

    def progress(final=False):
        now = time.time()
        if not show or (not final and now - last[0] < 0.5):
            return
        last[0] = now
        dt = max(now - t0, 1e-9)
        ntok = shards["train"].tokens + shards["val"].tokens
        done = counter[0] / max(total_in, 1)
        bar = "#" * int(20 * done) + "." * (20 - int(20 * done))
        sys.stderr.write("\r[%s] %3.0f%% of %sB  %.2f MB/s of text  %s tokens/s  %s docs  %s tokens %s" % (
            bar, 100.0 * done, human(total_in), text_bytes[0] / dt / 1e6, human(ntok / dt), human(ndoc[0]),
            human(ntok), "\n" if final else ""))
        sys.stderr.flush()

    def batches():
        batch, chars = [], 0
        for path in files:
            fmt = format_of(path, args.format)
            try:
                for d in docs_of(path, fmt, args, counter):
                    batch.append(d)
                    if len(samples) < 200:
                        samples.append(d[:2000])
                    chars += len(d)
                    text_bytes[0] += len(d)
                    if chars >= (1 << 18) or len(batch) >= 512:
                        yield batch
                        batch, chars = [], 0
            except (ValueError, UnicodeDecodeError, OSError, EOFError) as e:
                die("%s (%s): %s" % (path, fmt, e))
        if batch:
            yield batch

    samples = []

    width = 4 if u32 else 2

    def consume(encoded):
        data, lens = encoded
        mv = memoryview(data)
        start = run = 0  # token offset and length of the current run of documents of one split
        run_docs, run_split = 0, None
        for n in lens:
            split = "val" if is_val(ndoc[0], args.seed, args.val_frac) else "train"
            ndoc[0] += 1
            if split != run_split and run_docs:
                shards[run_split].add(mv[start * width:(start + run) * width], run, run_docs)
                start, run, run_docs = start + run, 0, 0
            run_split = split
            run += n
            run_docs += 1
        if run_docs:
            shards[run_split].add(mv[start * width:(start + run) * width], run, run_docs)
        progress()

    if workers <= 1:
        for b in batches():
            consume(tok.encode_packed(b, "I" if u32 else "H"))
    else:
        import collections
        import multiprocessing as mp
        with mp.get_context("fork").Pool(workers, _init, (tok,)) as pool:
            pending = collections.deque()
            for b in batches():
                pending.append(pool.apply_async(_encode, (b, "I" if u32 else "H")))
                while len(pending) > 2 * workers or (pending and pending[0].ready()):
                    consume(pending.popleft().get())
            while pending:
                consume(pending.popleft().get())
    for s in shards.values():
        s.close()
    progress(final=True)
    if ndoc[0] == 0:
        die("no documents in the input")

    tdir = os.path.join(args.out, "tokenizer")
    tj_status = None
    names = []
    if tok.files:
        os.makedirs(tdir, exist_ok=True)
        names = []
        for p in tok.files:  # the tokenizer under the name transformers looks for
            canon = "tokenizer.model" if tok.kind == "sentencepiece" else "tokenizer.json"
            names.append(canon if p == tok.path else os.path.basename(p))
            shutil.copyfile(p, os.path.join(tdir, names[-1]))
        if tok.kind == "sentencepiece":  # tokenizer.json beside it: transformers loads it without sentencepiece
            tj, why = spm_tokenizer_json(tok.sp)
            if tj is None:
                tj_status = "not written: " + why
            else:
                tjp = os.path.join(tdir, "tokenizer.json")
                write_atomic(tjp, json.dumps(tj, ensure_ascii=False).encode())
                tj_status = check_tokenizer_json(tjp, tok.sp, samples)
                if tj_status.startswith("differs") or tj_status.startswith("decodes"):
                    os.remove(tjp)
                    sys.stderr.write("tokenize: warning: tokenizer.json not kept: it %s\n" % tj_status)
                    tj_status = "not written: " + tj_status
                else:
                    names.append("tokenizer.json")
    manifest = {
        "format": "llm.c token shards",
        "magic": MAGIC_U32 if u32 else MAGIC_U16,
        "version": VERSION_U32 if u32 else VERSION_U16,
        "token_bytes": 4 if u32 else 2,
        "tokenizer": {"type": tok.kind, "source": tok.path, "dir": "tokenizer" if tok.files else None,
                      "files": names if tok.files else [], "tokenizer_json": tj_status},
        "vocab_size": tok.vocab,
        "bos_id": tok.bos,
        "eos_id": tok.eos,
        "pad_id": tok.pad,
        "text_bytes": text_bytes[0],
        "documents": {"train": shards["train"].docs, "val": shards["val"].docs},
        "tokens": {"train": shards["train"].tokens, "val": shards["val"].tokens},
        "shards": [{"name": n, "split": s, "tokens": k} for s in ("train", "val") for n, k in shards[s].done],
        "sources": [{"path": os.path.abspath(p), "bytes": n, "format": format_of(p, args.format)}
                    for p, n in zip(files, sizes)],
        "options": {"val_frac": args.val_frac, "seed": args.seed, "shard_tokens": args.shard_tokens,
                    "text_docs": args.text_docs, "field": args.field, "bos": tok.bos is not None},
    }
    write_atomic(os.path.join(args.out, "manifest.json"), (json.dumps(manifest, indent=2) + "\n").encode())
    fsync_dir(args.out)
    dt = time.time() - t0
    ntok = shards["train"].tokens + shards["val"].tokens
    print("tokenize: %d documents, %s tokens (train %s in %d shards, val %s in %d) from %d file%s (%.2f MB on disk, "
          "%.2f MB of text) in %.2f s: %.2f MB/s of text, %s tokens/s, %d workers -> %s" % (
              ndoc[0], human(ntok), human(shards["train"].tokens), len(shards["train"].done),
              human(shards["val"].tokens), len(shards["val"].done), len(files), "" if len(files) == 1 else "s",
              total_in / 1e6, text_bytes[0] / 1e6, dt, text_bytes[0] / 1e6 / max(dt, 1e-9),
              human(ntok / max(dt, 1e-9)), workers, args.out))
    if args.val_frac > 0 and shards["val"].docs == 0:
        sys.stderr.write("tokenize: warning: no document fell in the validation split (%d documents); the trainer "
                         "will hold out data.val_frac of the train windows instead\n" % ndoc[0])


if __name__ == "__main__":
    main()
