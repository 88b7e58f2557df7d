// test_tokenize.c — scripts/tokenize_data.py end to end, against the trainer's data layer: a
// SentencePiece model trained here with spm_train on the shipped hairpins plus a small text, the
// inputs (FASTA .gz, JSON Lines, text by line) tokenized into several shards, and the stream the
// data layer reads equal to spm_encode's ids with BOS/EOS around each document; spm_decode of what
// the data layer reads gives the documents back (decode(encode(x)) == x); a validation split
// whose two streams interleave back into the documents; uint32 shards (llm.c's 20240801 v7);
// the bytes tokenizer; the manifest; and a tokenize killed while writing a shard leaves only
// complete shards that pass validation (the half one does not). Runs from the repository root
// (as `make test` does); needs spm_train/spm_encode/spm_decode and python3-sentencepiece
// (scripts/deps.sh installs them).
#define _DEFAULT_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "test.h"

static char g_dir[64];

static const char* tpath(const char* name) { return t_join(g_dir, name); }

static void write_text(const char* name, const char* s, const char* mode) {
    FILE* f = fopen(tpath(name), mode);
    if (!f) { fprintf(stderr, "cannot write %s\n", name); exit(1); }
    fputs(s, f);
    fclose(f);
}

// A token stream with document starts.
typedef struct Stream {
    int32_t* t;
    uint64_t n, cap;
    uint64_t* doc;  // [ndoc + 1] offsets of each document's first token, then n
    uint64_t ndoc;
} Stream;

static void push(Stream* s, int32_t v) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 4096;
        s->t = realloc(s->t, s->cap * sizeof(int32_t));
    }
    s->t[s->n++] = v;
}

// Splits s into documents ending at eos.
static void index_docs(Stream* s, int32_t eos) {
    free(s->doc);
    s->doc = malloc((s->n + 2) * sizeof(uint64_t));
    s->ndoc = 0;
    s->doc[0] = 0;
    for (uint64_t i = 0; i < s->n; i++)
        if (s->t[i] == eos) s->doc[++s->ndoc] = i + 1;
}

// spm_encode's ids (one document a line) as the stream [BOS] ids EOS per document.
static Stream expected_stream(const char* ids_file, int bos, int eos) {
    Stream s = {0};
    size_t n;
    char* b = t_slurp(ids_file, &n);
    if (!b) return s;
    char* p = b;
    while (*p) {
        if (bos >= 0) push(&s, bos);
        while (*p && *p != '\n') {
            char* end;
            long v = strtol(p, &end, 10);
            if (end == p) { p++; continue; }
            push(&s, (int32_t)v);
            p = end;
        }
        push(&s, eos);
        if (*p == '\n') p++;
    }
    free(b);
    index_docs(&s, eos);
    return s;
}

// The whole split stream through the data layer (seq_len 1: every token is in some window).
static Stream read_split(const char* path, int split, int vocab, int* sep) {
    Stream s = {0};
    DataConfig dc;
    memset(&dc, 0, sizeof dc);
    snprintf(dc.path, sizeof dc.path, "%s", path);
    dc.format = DATA_AUTO;
    DataSet* ds = NULL;
    Err e = {{0}};
    if (data_open(&ds, &dc, vocab, 1, 1, &e)) {
        EXPECT(0, "data_open(%s): %s", path, e.msg);
        return s;
    }
    if (sep) *sep = data_doc_separator(ds);
    uint64_t w = data_num_windows(ds, split);
    int32_t win[2];
    for (uint64_t i = 0; i < w; i++) {
        data_get(ds, split, i, win);
        push(&s, win[0]);
        if (i + 1 == w) push(&s, win[1]);
    }
    EXPECT(s.n == data_num_tokens(ds, split), "split %d: %llu tokens read, %llu in the set", split,
           (unsigned long long)s.n, (unsigned long long)data_num_tokens(ds, split));
    data_close(ds);
    return s;
}

static void stream_free(Stream* s) {
    free(s->t);
    free(s->doc);
    memset(s, 0, sizeof *s);
}

static uint64_t first_diff(const Stream* a, const Stream* b) {
    uint64_t n = a->n < b->n ? a->n : b->n;
    for (uint64_t i = 0; i < n; i++)
        if (a->t[i] != b->t[i]) return i;
    return n;
}

static int g_ready;
static Stream g_want;  // spm_encode's stream of the documents
static const char* TOKENIZE = "scripts/tokenize_data.py";

// The inputs, the SentencePiece model and spm_encode's ids.
static void test_setup(void) {
    struct stat st;
    if (stat("data/hairpin.fa.gz", &st) || stat(TOKENIZE, &st)) {
        EXPECT(0, "run from the repository root (data/hairpin.fa.gz, %s)", TOKENIZE);
        return;
    }
    int rc = sh("command -v spm_train >/dev/null && command -v spm_encode >/dev/null && command -v spm_decode "
                ">/dev/null");
    if (rc) {
        EXPECT(0, "spm_train/spm_encode/spm_decode not found: run scripts/deps.sh (Debian package sentencepiece)");
        return;
    }
    mkdir(tpath("in"), 0755);
    // 600 hairpin records, gzip'd, and their sequences one a line
    rc = sh("zcat data/hairpin.fa.gz | awk '/^>/{n++} n<=600' | gzip > %s", tpath("in/a_rec.fa.gz"));
    rc |= sh("zcat %s | awk '/^>/{if(s!=\"\")print s; s=\"\"; next}{s=s $0}END{if(s!=\"\")print s}' > %s",
             tpath("in/a_rec.fa.gz"), tpath("docs.txt"));
    EXPECT(rc == 0, "making the FASTA input failed");
    static const char* jl[] = {"The stem-loop folds back on itself.", "Ribonucleic acid, 22 nucleotides: mature miRNA.",
                               "Caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 non-ASCII text survives \xe2\x9c\x93"};
    static const char* tx[] = {"Let-7 was found in C. elegans in 2000.", "  two leading spaces and a\ttab",
                               "Lin-4 (1993): the first microRNA; it binds lin-14's 3' UTR."};
    char buf[2048] = "";
    for (int i = 0; i < 3; i++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "{\"id\": %d, \"text\": \"%s\"}\n\n", i, jl[i]);
    write_text("in/b_docs.jsonl", buf, "w");
    buf[0] = 0;
    for (int i = 0; i < 3; i++) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s\n%s", tx[i], i == 0 ? "\n" : "");
    write_text("in/c_notes.txt", buf, "w");  // a blank line too: not a document
    buf[0] = 0;
    for (int i = 0; i < 3; i++) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s\n", jl[i]);
    for (int i = 0; i < 3; i++) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s\n", tx[i]);
    write_text("docs.txt", buf, "a");
    rc = sh("spm_train --input=%s --model_prefix=%s --vocab_size=600 --model_type=bpe --character_coverage=1.0 "
            "--byte_fallback=true --normalization_rule_name=identity --remove_extra_whitespaces=false "
            "--max_sentence_length=100000 --minloglevel=2 >%s 2>&1",
            tpath("docs.txt"), tpath("tok"), tpath("spm_train.log"));
    EXPECT(rc == 0, "spm_train failed (see %s)", tpath("spm_train.log"));
    rc = sh("spm_encode --model=%s --output_format=id < %s > %s", tpath("tok.model"), tpath("docs.txt"),
            tpath("ids.txt"));
    EXPECT(rc == 0, "spm_encode failed");
    g_want = expected_stream(tpath("ids.txt"), 1, 2);  // spm_train's defaults: <s> = 1, </s> = 2
    EXPECT(g_want.ndoc == 606, "documents: %llu", (unsigned long long)g_want.ndoc);
    g_ready = rc == 0 && g_want.n > 0;
}

// Shards read by the data layer = spm_encode's ids with BOS/EOS; decoded back = the documents.
static void test_stream(void) {
    if (!g_ready) { EXPECT(0, "setup failed"); return; }
    int rc = sh("%s --tokenizer %s --out %s --text-docs line --val-frac 0 --shard-tokens 3000 --workers 2 %s >%s 2>&1",
                TOKENIZE, tpath("tok.model"), tpath("s1"), tpath("in"), tpath("s1.log"));
    EXPECT(rc == 0, "tokenize failed (%d): see %s", rc, tpath("s1.log"));
    int sep = -1;
    Stream got = read_split(tpath("s1"), 0, 600, &sep);
    uint64_t d = first_diff(&got, &g_want);
    EXPECT(got.n == g_want.n && d == got.n, "the data layer's stream (%llu tokens) differs from spm_encode's (%llu) "
           "at token %llu", (unsigned long long)got.n, (unsigned long long)g_want.n, (unsigned long long)d);
    EXPECT(sep == 2, "the set's document separator is %d, the tokenizer's EOS is 2", sep);
    EXPECT(sh("test -f %s && test -f %s && test ! -e %s", tpath("s1/train_000000.bin"), tpath("s1/train_000002.bin"),
              tpath("s1/val_000000.bin")) == 0, "shards: several train shards of 3000 tokens, no val shard");
    // decode what the data layer read
    index_docs(&got, 2);
    FILE* f = fopen(tpath("back_ids.txt"), "w");
    for (uint64_t k = 0; f && k < got.ndoc; k++) {
        uint64_t a = got.doc[k], b = got.doc[k + 1] - 1;  // [a, b): the document without its EOS
        EXPECT(got.t[a] == 1, "document %llu does not start with BOS", (unsigned long long)k);
        for (uint64_t i = a + 1; i < b; i++) fprintf(f, "%s%d", i > a + 1 ? " " : "", got.t[i]);
        fputc('\n', f);
    }
    if (f) fclose(f);
    rc = sh("spm_decode --model=%s --input_format=id < %s > %s && cmp -s %s %s", tpath("tok.model"),
            tpath("back_ids.txt"), tpath("back.txt"), tpath("back.txt"), tpath("docs.txt"));
    EXPECT(rc == 0, "decode(the shards) != the documents: diff %s %s", tpath("back.txt"), tpath("docs.txt"));
    // the manifest
    char* m = t_slurp(tpath("s1/manifest.json"), NULL);
    EXPECT(m && strstr(m, "\"vocab_size\": 600") && strstr(m, "\"bos_id\": 1") && strstr(m, "\"eos_id\": 2") &&
           strstr(m, "\"sentencepiece\"") && strstr(m, "a_rec.fa.gz") && strstr(m, "\"bytes\": "),
           "manifest.json: %s", m ? m : "(missing)");
    char want_train[64];
    snprintf(want_train, sizeof want_train, "\"train\": %llu", (unsigned long long)g_want.n);
    EXPECT(m && strstr(m, want_train), "manifest token count: want %s", want_train);
    free(m);
    EXPECT(sh("cmp -s %s %s", tpath("s1/tokenizer/tokenizer.model"), tpath("tok.model")) == 0,
           "the tokenizer is copied beside the shards");
    // rerunning into the same directory needs --force
    rc = sh("%s --tokenizer %s --out %s --quiet %s >/dev/null 2>&1", TOKENIZE, tpath("tok.model"), tpath("s1"),
            tpath("in"));
    EXPECT(rc == 2, "tokenize over existing shards without --force: exit %d", rc);
    stream_free(&got);
}

// With --val-frac: two streams whose documents interleave back into the documents, in order.
static void test_split(void) {
    if (!g_ready) { EXPECT(0, "setup failed"); return; }
    int rc = sh("%s --tokenizer %s --out %s --text-docs line --val-frac 0.2 --seed 5 --workers 2 %s >%s 2>&1",
                TOKENIZE, tpath("tok.model"), tpath("s2"), tpath("in"), tpath("s2.log"));
    EXPECT(rc == 0, "tokenize failed: see %s", tpath("s2.log"));
    Stream tr = read_split(tpath("s2"), 0, 600, NULL), va = read_split(tpath("s2"), 1, 600, NULL);
    index_docs(&tr, 2);
    index_docs(&va, 2);
    uint64_t i = 0, j = 0;
    int ok = tr.ndoc > 0 && va.ndoc > 0;
    for (uint64_t k = 0; ok && k < g_want.ndoc; k++) {
        uint64_t len = g_want.doc[k + 1] - g_want.doc[k];
        const int32_t* w = g_want.t + g_want.doc[k];
        if (i < tr.ndoc && tr.doc[i + 1] - tr.doc[i] == len && !memcmp(tr.t + tr.doc[i], w, len * 4)) i++;
        else if (j < va.ndoc && va.doc[j + 1] - va.doc[j] == len && !memcmp(va.t + va.doc[j], w, len * 4)) j++;
        else ok = 0;
    }
    EXPECT(ok && i == tr.ndoc && j == va.ndoc, "train (%llu docs) + validation (%llu docs) != the %llu documents",
           (unsigned long long)tr.ndoc, (unsigned long long)va.ndoc, (unsigned long long)g_want.ndoc);
    double frac = (double)va.ndoc / (double)g_want.ndoc;
    EXPECT(frac > 0.12 && frac < 0.28, "validation holds %.3f of the documents, --val-frac 0.2", frac);
    // the same seed splits the same way
    rc = sh("%s --tokenizer %s --out %s --text-docs line --val-frac 0.2 --seed 5 --workers 1 %s >/dev/null 2>&1 && "
            "cmp -s %s %s", TOKENIZE, tpath("tok.model"), tpath("s2b"), tpath("in"), tpath("s2/val_000000.bin"),
            tpath("s2b/val_000000.bin"));
    EXPECT(rc == 0, "the split depends on --workers");
    stream_free(&tr);
    stream_free(&va);
}

// --dtype uint32: llm.c's 20240801 version 7 header; the same stream.
static void test_uint32(void) {
    if (!g_ready) { EXPECT(0, "setup failed"); return; }
    int rc = sh("%s --tokenizer %s --out %s --text-docs line --val-frac 0 --dtype uint32 %s >%s 2>&1", TOKENIZE,
                tpath("tok.model"), tpath("s3"), tpath("in"), tpath("s3.log"));
    EXPECT(rc == 0, "tokenize --dtype uint32 failed: see %s", tpath("s3.log"));
    size_t n = 0;
    char* b = t_slurp(tpath("s3/train_000000.bin"), &n);
    int32_t h[3] = {0};
    if (b && n >= 12) memcpy(h, b, 12);
    EXPECT(h[0] == 20240801 && h[1] == 7 && (uint64_t)h[2] == g_want.n && n == 1024 + 4 * (size_t)h[2],
           "header %d %d %d, %zu bytes", h[0], h[1], h[2], n);
    free(b);
    Stream got = read_split(tpath("s3/train_000000.bin"), 0, 600, NULL);
    EXPECT(got.n == g_want.n && first_diff(&got, &g_want) == got.n, "uint32 stream differs");
    stream_free(&got);
    b = t_slurp(tpath("s1/train_000000.bin"), &n);
    if (b && n >= 12) memcpy(h, b, 12);
    EXPECT(h[0] == 20240520 && h[1] == 1 && h[2] == 3000, "the uint16 shard's header: %d %d %d", h[0], h[1], h[2]);
    free(b);
}

// --tokenizer bytes: UTF-8 bytes of each document, then EOS (0); no BOS.
static void test_bytes(void) {
    if (!g_ready) { EXPECT(0, "setup failed"); return; }
    int rc = sh("%s --tokenizer bytes --out %s --text-docs line --val-frac 0 %s >%s 2>&1", TOKENIZE, tpath("s4"),
                tpath("in/c_notes.txt"), tpath("s4.log"));
    EXPECT(rc == 0, "tokenize --tokenizer bytes failed: see %s", tpath("s4.log"));
    Stream got = read_split(tpath("s4"), 0, 256, NULL);
    char* src = t_slurp(tpath("in/c_notes.txt"), NULL);
    Stream want = {0};
    for (char* p = src; p && *p; p++) {
        if (*p == '\n') {
            if (want.n && want.t[want.n - 1] != 0) push(&want, 0);
        } else push(&want, (uint8_t)*p);
    }
    EXPECT(got.n == want.n && first_diff(&got, &want) == got.n, "bytes stream: %llu tokens, want %llu",
           (unsigned long long)got.n, (unsigned long long)want.n);
    free(src);
    stream_free(&got);
    stream_free(&want);
}

// A tokenize killed while writing its second shard: the first shard whole, no second shard, no
// manifest; the half-written temp file fails validation; the directory reads the first shard only.
static void test_killed(void) {
    if (!g_ready) { EXPECT(0, "setup failed"); return; }
    int rc = sh("MOETRAIN_TOKENIZE_CRASH_AT=2 %s --tokenizer %s --out %s --text-docs line --val-frac 0 "
                "--shard-tokens 3000 --workers 1 %s >%s 2>&1", TOKENIZE, tpath("tok.model"), tpath("k"), tpath("in"),
                tpath("k.log"));
    EXPECT(rc == 128 + 9 || rc == 137, "the fault-injected tokenize should die by SIGKILL, exit %d", rc);
    EXPECT(sh("test -f %s && test ! -e %s && test -f %s && test ! -e %s", tpath("k/train_000000.bin"),
              tpath("k/train_000001.bin"), tpath("k/.train_000001.bin.tmp"), tpath("k/manifest.json")) == 0,
           "after the kill: train_000000.bin, a temp file, no train_000001.bin, no manifest");
    struct stat st;
    EXPECT(stat(tpath("k/.train_000001.bin.tmp"), &st) == 0 && st.st_size == 1024 + 2 * 3000,
           "the temp file holds the whole payload (%lld bytes): only its header is missing", (long long)st.st_size);
    DataConfig dc;
    memset(&dc, 0, sizeof dc);
    snprintf(dc.path, sizeof dc.path, "%s", tpath("k/.train_000001.bin.tmp"));
    dc.format = DATA_BIN;
    DataSet* ds = NULL;
    Err e = {{0}};
    EXPECT(data_open(&ds, &dc, 600, 1, 1, &e) == -1 && strstr(e.msg, "bad magic 0"),
           "the half shard must fail validation: %s", e.msg);
    data_close(ds);
    Stream got = read_split(tpath("k"), 0, 600, NULL);
    EXPECT(got.n == 3000 && first_diff(&got, &g_want) == 3000, "the directory after the kill: %llu tokens",
           (unsigned long long)got.n);
    stream_free(&got);
    // every file under a shard name passes validation
    rc = sh("ls %s | grep -v '^\\.' | grep -c '\\.bin$' > %s", tpath("k"), tpath("k.count"));
    char* c = t_slurp(tpath("k.count"), NULL);
    EXPECT(c && atoi(c) == 1, "shard files after the kill: %s", c ? c : "?");
    free(c);
    // a rerun with --force replaces the leftovers
    rc = sh("%s --tokenizer %s --out %s --text-docs line --val-frac 0 --shard-tokens 3000 --force --quiet %s "
            ">/dev/null 2>&1 && test ! -e %s", TOKENIZE, tpath("tok.model"), tpath("k"), tpath("in"),
            tpath("k/.train_000001.bin.tmp"));
    EXPECT(rc == 0, "tokenize --force after a kill");
    got = read_split(tpath("k"), 0, 600, NULL);
    EXPECT(got.n == g_want.n && first_diff(&got, &g_want) == got.n, "after the rerun");
    stream_free(&got);
}

// Train a few CPU steps on the shards, export: the tokenizer the run recorded (the manifest
// beside data.path) lands beside config.json with its ids; eval refuses byte data for this
// vocabulary; L1_8x7B_ep without data.path shows how to make shards.
static void test_train_export(void) {
    if (!g_ready) { EXPECT(0, "setup failed"); return; }
    const char* bin = "build/moetrain";
    int rc = sh("%s --config L0_sanity model.vocab_size=600 parallel.ep=1 train.device=cpu train.steps=2 "
                "train.global_batch=2 train.micro_batch=2 train.seq_len=32 train.eval_batches=1 log.dir= "
                "data.path=%s checkpoint.dir=%s >%s 2>&1", bin, tpath("s2"), tpath("ck"), tpath("train.log"));
    EXPECT(rc == 0, "training on the shards failed (%d): see %s", rc, tpath("train.log"));
    char* log = t_slurp(tpath("train.log"), NULL);
    EXPECT(log && strstr(log, "bin uint16") && strstr(log, "validation data:"),
           "the log names the shards and the validation shards: %s", log ? log : "");
    free(log);
    rc = sh("%s export --ckpt %s --out %s --dtype fp32 >%s 2>&1", bin, tpath("ck"), tpath("hf"), tpath("export.log"));
    EXPECT(rc == 0, "export failed (%d): see %s", rc, tpath("export.log"));
    EXPECT(sh("cmp -s %s %s && cmp -s %s %s && test -f %s && test -f %s", tpath("hf/tokenizer.model"),
              tpath("tok.model"), tpath("hf/tokenizer.json"), tpath("s2/tokenizer/tokenizer.json"),
              tpath("hf/tokenizer_config.json"), tpath("hf/generation_config.json")) == 0,
           "the export carries tokenizer.model, tokenizer.json, tokenizer_config.json, generation_config.json");
    char* cj = t_slurp(tpath("hf/config.json"), NULL);
    EXPECT(cj && strstr(cj, "\"bos_token_id\": 1,") && strstr(cj, "\"eos_token_id\": 2,") &&
           strstr(cj, "\"pad_token_id\": null,") && strstr(cj, "\"vocab_size\": 600"), "config.json: %s", cj ? cj : "");
    free(cj);
    char* tc = t_slurp(tpath("hf/special_tokens_map.json"), NULL);
    EXPECT(tc && strstr(tc, "\"bos_token\": \"<s>\"") && strstr(tc, "\"eos_token\": \"</s>\"") &&
           strstr(tc, "\"unk_token\": \"<unk>\""), "special_tokens_map.json: %s", tc ? tc : "");
    free(tc);
    // --tokenizer with a bare SentencePiece model; a tokenizer larger than the model refused
    rc = sh("%s export --ckpt %s --out %s --tokenizer %s >/dev/null 2>&1 && test -f %s && test ! -e %s", bin,
            tpath("ck"), tpath("hf2"), tpath("tok.model"), tpath("hf2/tokenizer.model"), tpath("hf2/tokenizer.json"));
    EXPECT(rc == 0, "export --tokenizer tok.model");
    rc = sh("%s --config L0_sanity parallel.ep=1 train.device=cpu train.steps=1 train.global_batch=2 "
            "train.micro_batch=2 train.seq_len=32 log.dir= checkpoint.dir=%s >/dev/null 2>&1 && "
            "%s export --ckpt %s --out %s --tokenizer %s > %s 2>&1", bin, tpath("ck256"), bin, tpath("ck256"),
            tpath("hf3"), tpath("s2"), tpath("export3.log"));
    char* el = t_slurp(tpath("export3.log"), NULL);
    EXPECT(rc == 2 && el && strstr(el, "600 tokens, the model's vocabulary only 256"), "vocab check: %d %s", rc,
           el ? el : "");
    free(el);
    // eval refuses the shipped byte data for a 600-token model
    rc = sh("%s eval --ckpt %s parallel.ep=1 data.path= > %s 2>&1", bin, tpath("ck"), tpath("eval.log"));
    el = t_slurp(tpath("eval.log"), NULL);
    EXPECT(rc == 2 && el && strstr(el, "byte-level sequence data"), "eval on byte data: %d %s", rc, el ? el : "");
    free(el);
    rc = sh("%s eval --ckpt %s parallel.ep=1 > %s 2>&1", bin, tpath("ck"), tpath("eval2.log"));
    EXPECT(rc == 0, "eval on the run's own shards: %d (see %s)", rc, tpath("eval2.log"));
    // the flagship config without data
    rc = sh("%s --config L1_8x7B_ep parallel.ep=1 checkpoint.dir=%s > %s 2>&1", bin, tpath("ckL1"), tpath("l1.log"));
    el = t_slurp(tpath("l1.log"), NULL);
    EXPECT(rc == 2 && el && strstr(el, "data.required") && strstr(el, "spm_train") &&
               strstr(el, "scripts/tokenize_data.py"),
           "L1 without data.path: %d %s", rc, el ? el : "");
    free(el);
}

// Python puts a script's own directory first on sys.path, so a file in scripts/ named like a
// standard module (tokenize.py, say) stands in for that module in every script there: linecache,
// traceback and inspect import `tokenize`, and a multiprocessing pool's worker then dies on its
// first exception while the caller waits for its result. No script may take such a name.
static void test_script_names(void) {
    const int rc = sh("python3 -c 'import os, sys\n"
                      "names = getattr(sys, \"stdlib_module_names\", None)\n"
                      "if names is None: sys.exit(3)\n"
                      "bad = [f for f in sorted(os.listdir(\"scripts\")) if f.endswith(\".py\") and f[:-3] in names]\n"
                      "print(\" \".join(bad))\n"
                      "sys.exit(1 if bad else 0)' > %s 2>&1",
                      tpath("names.log"));
    char* out = t_slurp(tpath("names.log"), NULL);
    if (rc == 3) printf("  (python3 older than 3.10 lists no standard module names: not checked)\n");
    EXPECT(rc == 0 || rc == 3, "scripts/ holds scripts named like standard Python modules: %s", out ? out : "");
    free(out);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/moetrain_tok_XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    RUN(test_script_names);
    RUN(test_setup);
    RUN(test_stream);
    RUN(test_split);
    RUN(test_uint32);
    RUN(test_bytes);
    RUN(test_killed);
    RUN(test_train_export);
    stream_free(&g_want);
    if (!t_failed) sh("rm -rf %s", g_dir);
    else fprintf(stderr, "kept %s\n", g_dir);
    TEST_END();
}
