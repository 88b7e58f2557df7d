"""Loads a `moetrain export` directory with its tokenizer in Hugging Face transformers, greedily
continues a prompt and prints the decoded text (docs/data.md: exporting with the tokenizer).

    python3 scripts/hf_tokenizer_check.py EXPORT_DIR [--prompt TEXT] [--new-tokens N] [--device cpu|cuda]

What it checks (exit 1 on any failure):
  - AutoTokenizer.from_pretrained(EXPORT_DIR) loads; its BOS/EOS ids equal config.json's;
  - the tokenizer round-trips the prompt: decode(encode(prompt)) == prompt;
  - when tokenizer.model is there too and the sentencepiece module is importable, the fast
    tokenizer encodes the prompt as SentencePiece does (the ids the shards were made with);
  - AutoModelForCausalLM.from_pretrained(EXPORT_DIR) loads (no missing or unexpected weights);
  - model.generate(greedy, max_new_tokens=N) runs and its continuation decodes to a str.
Prints the tokenizer class, the prompt's ids, the generated ids and the decoded text.

Needs torch and transformers (tested with transformers 5.x; tokenizers comes with it).
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("export_dir")
    ap.add_argument("--prompt", default="UGAGGUAGUAGGUUGUAUAGUU")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    failures = []

    def check(ok, what):
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            failures.append(what)

    with open(os.path.join(args.export_dir, "config.json")) as f:
        cfg = json.load(f)
    tok = AutoTokenizer.from_pretrained(args.export_dir)
    print("tokenizer: %s, %d tokens, bos %s, eos %s, pad %s" % (type(tok).__name__, len(tok), tok.bos_token_id,
                                                                tok.eos_token_id, tok.pad_token_id))
    check(tok.bos_token_id == cfg.get("bos_token_id"), "tokenizer bos %s == config.json's %s" % (
        tok.bos_token_id, cfg.get("bos_token_id")))
    check(tok.eos_token_id == cfg.get("eos_token_id"), "tokenizer eos %s == config.json's %s" % (
        tok.eos_token_id, cfg.get("eos_token_id")))
    check(len(tok) <= cfg["vocab_size"], "tokenizer size %d <= vocab_size %d" % (len(tok), cfg["vocab_size"]))
    ids = tok(args.prompt, return_tensors="pt").input_ids
    print("prompt ids:", ids[0].tolist())
    plain = tok(args.prompt, add_special_tokens=False).input_ids
    check(tok.decode(plain) == args.prompt, "decode(encode(prompt)) == prompt (%r)" % tok.decode(plain))
    spm_path = os.path.join(args.export_dir, "tokenizer.model")
    if os.path.exists(spm_path):
        try:
            import sentencepiece
        except ImportError:
            print("note: sentencepiece not importable: the ids are not compared with tokenizer.model's")
        else:
            sp = sentencepiece.SentencePieceProcessor(model_file=spm_path)
            check(sp.encode(args.prompt) == plain, "ids equal SentencePiece's (%s)" % sp.encode(args.prompt))

    model, info = AutoModelForCausalLM.from_pretrained(args.export_dir, dtype=torch.float32,
                                                       output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    check(not bad, "the model loads with no missing/unexpected/mismatched weights %s" % (bad or ""))
    model.to(args.device).eval()
    if hasattr(model, "set_experts_implementation"):  # the reference loop, in any dtype on any device
        model.set_experts_implementation("eager")
    with torch.no_grad():
        out = model.generate(ids.to(args.device), attention_mask=torch.ones_like(ids).to(args.device),
                             max_new_tokens=args.new_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    new = out[0, ids.shape[1]:].tolist()
    text = tok.decode(new, skip_special_tokens=True)
    print("generated ids:", new)
    print("continuation: %r" % text)
    print("full text: %r" % tok.decode(out[0].tolist(), skip_special_tokens=True))
    check(isinstance(text, str) and len(new) > 0, "the greedy continuation decodes to text")
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
