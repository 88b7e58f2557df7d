// test_data_shards.c — token shards as the trainer reads them: both llm.c headers (20240520 v1
// uint16, 20240801 v7 uint32) and the project's own (20240520 v2), data.path as a file, a comma
// list, a glob and a directory (whose val_*.bin are the validation data), data.val_path,
// data.weights (Megatron's blend: drawn proportions over 10,000 windows, the window contents
// of each source, reproducible by seed), the separator from manifest.json, and
// cli_resolve_data_path on lists and globs.
#define _DEFAULT_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "data.h"
#include "test.h"

static char g_dir[64];

static const char* tpath(const char* name) { return t_join(g_dir, name); }

// A shard with header (magic, version, count) and tokens of width 2 or 4.
static void write_shard(const char* name, const uint32_t* tok, size_t n, uint32_t magic, int version, int width) {
    int32_t h[256] = {0};
    h[0] = (int32_t)magic;
    h[1] = version;
    h[2] = (int32_t)n;
    FILE* f = fopen(tpath(name), "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", name); exit(1); }
    fwrite(h, 4, 256, f);
    for (size_t i = 0; i < n; i++) {
        if (width == 2) { uint16_t v = (uint16_t)tok[i]; fwrite(&v, 2, 1, f); }
        else fwrite(&tok[i], 4, 1, f);
    }
    fclose(f);
}

static DataConfig cfg(const char* path) {
    DataConfig dc;
    memset(&dc, 0, sizeof dc);
    snprintf(dc.path, sizeof dc.path, "%s", path);
    dc.format = DATA_AUTO;
    dc.sep_token = 0;
    return dc;
}

static DataSet* open_ok(const DataConfig* dc, int vocab, int T, uint64_t seed) {
    DataSet* ds = NULL;
    Err e = {{0}};
    if (data_open(&ds, dc, vocab, T, seed, &e)) {
        EXPECT(0, "data_open(%s | val %s | weights %s) failed: %s", dc->path, dc->val_path, dc->weights, e.msg);
        return NULL;
    }
    return ds;
}

static void open_fails(const DataConfig* dc, int vocab, int T, const char* want) {
    DataSet* ds = NULL;
    Err e = {{0}};
    int rc = data_open(&ds, dc, vocab, T, 1, &e);
    EXPECT(rc == -1 && strstr(e.msg, want), "expected an error with '%s', got rc %d: %s", want, rc, e.msg);
    data_close(ds);
}

// The split's stream rebuilt from its windows (stride T, unshuffled): [nwin·T + 1] tokens.
static int32_t* stream_of(const DataSet* ds, int split, int T, uint64_t* n) {
    uint64_t w = data_num_windows(ds, split);
    int32_t* s = calloc(w * (uint64_t)T + 1, sizeof(int32_t));
    int32_t* win = calloc((size_t)T + 1, sizeof(int32_t));
    for (uint64_t i = 0; i < w; i++) {
        data_get(ds, split, i, win);
        memcpy(s + i * (uint64_t)T, win, sizeof(int32_t) * (size_t)(T + 1));
    }
    free(win);
    *n = w * (uint64_t)T + 1;
    return s;
}

static int same(const int32_t* a, const uint32_t* b, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if ((uint32_t)a[i] != b[i]) return 0;
    return 1;
}

static uint32_t* seq(size_t n, uint32_t base, uint32_t step, uint32_t mod) {
    uint32_t* t = malloc(n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) t[i] = base + (uint32_t)((i * step) % mod);
    return t;
}

// llm.c's two headers and the project's own, alone and concatenated; wrong versions refused.
static void test_headers(void) {
    const int T = 8;
    uint32_t* a = seq(81, 3, 7919, 60000);          // uint16
    uint32_t* b = seq(81, 70000, 104729, 1 << 20);  // uint32, > 65535
    write_shard("h16.bin", a, 81, 20240520, 1, 2);
    write_shard("h32.bin", b, 81, 20240801, 7, 4);
    write_shard("own32.bin", b, 81, 20240520, 2, 4);
    const char* names[3] = {"h16.bin", "h32.bin", "own32.bin"};
    const uint32_t* want[3] = {a, b, b};
    for (int k = 0; k < 3; k++) {
        DataConfig dc = cfg(tpath(names[k]));
        DataSet* ds = open_ok(&dc, 1 << 21, T, 1);
        if (!ds) continue;
        uint64_t n;
        int32_t* s = stream_of(ds, 0, T, &n);
        EXPECT(n == 81 && same(s, want[k], n), "%s: %llu tokens read back wrong", names[k], (unsigned long long)n);
        free(s);
        char d[512];
        data_describe(ds, d, sizeof d);
        EXPECT(strstr(d, k ? "uint32" : "uint16"), "%s: describe %s", names[k], d);
        EXPECT(data_doc_sep(ds, NULL) == -1, "%s: no manifest, no document boundaries", names[k]);
        data_close(ds);
    }
    char list[600];
    snprintf(list, sizeof list, "%s,%s", tpath("h16.bin"), tpath("h32.bin"));
    DataConfig dc = cfg(list);
    DataSet* ds = open_ok(&dc, 1 << 21, T, 1);
    if (ds) {
        uint64_t n;
        int32_t* s = stream_of(ds, 0, T, &n);  // 162 tokens: 20 windows, 161 tokens
        EXPECT(n == 161 && same(s, a, 81) && same(s + 81, b, 80), "uint16 + uint32 list");
        free(s);
    }
    data_close(ds);
    write_shard("bad7.bin", b, 81, 20240801, 1, 4);
    dc = cfg(tpath("bad7.bin"));
    open_fails(&dc, 1 << 21, T, "version 1 for magic 20240801");
    write_shard("big.bin", b, 81, 20240801, 7, 4);
    dc = cfg(tpath("big.bin"));
    open_fails(&dc, 65536, T, ">= model.vocab_size 65536");
    free(a);
    free(b);
}

// Shards named like scripts/tokenize_data.py's in a directory: d/train_00000k.bin, d/val_000000.bin.
static void make_dir_shards(const char* dir, uint32_t* all, size_t n_train_shard, int nshards, uint32_t* val,
                            size_t nval) {
    mkdir(tpath(dir), 0755);
    for (int k = 0; k < nshards; k++) {
        char nm[128];
        snprintf(nm, sizeof nm, "%s/train_%06d.bin", dir, k);
        write_shard(nm, all + (size_t)k * n_train_shard, n_train_shard, 20240520, 1, 2);
    }
    if (val) {
        char nm[128];
        snprintf(nm, sizeof nm, "%s/val_000000.bin", dir);
        write_shard(nm, val, nval, 20240520, 1, 2);
    }
}

static void test_paths(void) {
    const int T = 4;
    uint32_t* all = seq(300, 1, 13, 1000);
    uint32_t* val = seq(41, 2000, 3, 500);
    make_dir_shards("d1", all, 100, 3, val, 41);
    // a temp file of a running tokenize and a non-shard file are not read
    FILE* f = fopen(tpath("d1/.train_000003.bin.tmp"), "wb");
    if (f) { fputs("partial", f); fclose(f); }
    f = fopen(tpath("d1/manifest.json"), "wb");
    if (f) { fputs("{\"eos_id\": 7, \"vocab_size\": 4096}\n", f); fclose(f); }
    // the directory: train shards in name order, val_*.bin as validation, eos from the manifest
    DataConfig dc = cfg(tpath("d1"));
    dc.val_frac = 0.25f;  // ignored: the directory has validation shards
    DataSet* ds = open_ok(&dc, 4096, T, 1);
    if (ds) {
        uint64_t n;
        int32_t* s = stream_of(ds, 0, T, &n);
        EXPECT(n == 297 && same(s, all, n), "directory: train stream (%llu tokens)", (unsigned long long)n);
        free(s);
        s = stream_of(ds, 1, T, &n);
        EXPECT(n == 41 && same(s, val, n), "directory: validation = val_000000.bin (%llu tokens)",
               (unsigned long long)n);
        free(s);
        EXPECT(data_doc_separator(ds) == 7, "separator from manifest.json: %d", data_doc_separator(ds));
        int nat = 0;
        EXPECT(data_doc_sep(ds, &nat) == 7 && nat == 1, "documents end with the manifest's eos_id (train and "
               "validation shards agree): %d, natural %d", data_doc_sep(ds, NULL), nat);
    }
    data_close(ds);
    // a glob: every match, sorted (val_ included: the user asked for *.bin)
    char g[400];
    snprintf(g, sizeof g, "%s/d1/train_*.bin", g_dir);
    dc = cfg(g);
    ds = open_ok(&dc, 4096, T, 1);
    if (ds) {
        uint64_t n;
        int32_t* s = stream_of(ds, 0, T, &n);
        EXPECT(n == 297 && same(s, all, n), "glob: train stream");
        free(s);
        EXPECT(data_num_windows(ds, 1) == 0, "glob with val_frac 0: no validation");
        EXPECT(data_doc_sep(ds, NULL) == 7, "glob: documents end with the manifest's eos_id");
    }
    data_close(ds);
    // a comma list with spaces, out of name order: read in list order
    char list[800];
    snprintf(list, sizeof list, " %s/d1/train_000002.bin , %s/d1/train_000000.bin", g_dir, g_dir);
    dc = cfg(list);
    ds = open_ok(&dc, 4096, T, 1);
    if (ds) {
        uint64_t n;
        int32_t* s = stream_of(ds, 0, T, &n);
        EXPECT(n == 197 && same(s, all + 200, 100) && same(s + 100, all, 97), "list order");
        free(s);
    }
    data_close(ds);
    // errors: a glob without matches, a directory without shards, a directory with only val shards
    snprintf(g, sizeof g, "%s/d1/nothing_*.bin", g_dir);
    dc = cfg(g);
    open_fails(&dc, 4096, T, "matches no file");
    mkdir(tpath("empty"), 0755);
    dc = cfg(tpath("empty"));
    open_fails(&dc, 4096, T, "holds no .bin shards");
    mkdir(tpath("onlyval"), 0755);
    write_shard("onlyval/val_000000.bin", val, 41, 20240520, 1, 2);
    dc = cfg(tpath("onlyval"));
    open_fails(&dc, 4096, T, "only validation shards");
    free(all);
    free(val);
}

static void test_val_path(void) {
    const int T = 4;
    uint32_t* a = seq(101, 5, 11, 900);
    uint32_t* v = seq(33, 1000, 17, 800);
    write_shard("vp_train.bin", a, 101, 20240520, 1, 2);
    write_shard("vp_val.bin", v, 33, 20240801, 7, 4);
    DataConfig dc = cfg(tpath("vp_train.bin"));
    snprintf(dc.val_path, sizeof dc.val_path, "%s", tpath("vp_val.bin"));
    dc.val_frac = 0.5f;  // ignored: validation comes from val_path
    dc.shuffle = 1;
    DataSet* ds = open_ok(&dc, 4096, T, 3);
    if (ds) {
        EXPECT(data_num_windows(ds, 0) == 25 && data_num_windows(ds, 1) == 8, "windows %llu + %llu",
               (unsigned long long)data_num_windows(ds, 0), (unsigned long long)data_num_windows(ds, 1));
        uint64_t n;
        int32_t* s = stream_of(ds, 1, T, &n);  // validation is never shuffled
        EXPECT(n == 33 && same(s, v, n), "validation = val_path's stream");
        free(s);
        char d[1024];
        data_describe(ds, d, sizeof d);
        const char* vd = strstr(d, "; validation data: ");
        EXPECT(vd && strstr(vd, "vp_val.bin: tokens 33; windows 8 (") && !strstr(vd, " train"),
               "the validation data described as validation only: %s", d);
        EXPECT(!strstr(d, "0 validation"), "the training data, all of it train, names no empty validation split: %s", d);
        // train: all of vp_train.bin, shuffled: every window once per epoch
        int seen[25] = {0}, ok = 1;
        int32_t w[5];
        for (uint64_t i = 0; i < 25; i++) {
            uint64_t k = data_window_of(ds, 0, i);
            data_get(ds, 0, i, w);
            ok &= k < 25 && same(w, a + k * T, 5);
            if (k < 25) seen[k]++;
        }
        for (int k = 0; k < 25; k++) ok &= seen[k] == 1;
        EXPECT(ok, "train windows: a permutation of vp_train.bin's");
    }
    data_close(ds);
    snprintf(dc.val_path, sizeof dc.val_path, "%s", tpath("no_such_val.bin"));
    open_fails(&dc, 4096, T, "data.val_path");
    free(a);
    free(v);
}

// Three sources of distinct token ranges: weights 0.5 / 0.3 / 0.2 over 10,000 windows.
static void test_weights(void) {
    const int T = 4;
    const size_t n[3] = {401, 1201, 81};  // 100, 300, 20 windows: small sources repeat, large ones are cut
    uint32_t* src[3];
    char list[800] = "";
    for (int d = 0; d < 3; d++) {
        src[d] = seq(n[d], 1000u * (uint32_t)(d + 1), 1, 997);  // source d: tokens in [1000(d+1), 1000(d+1) + 997)
        char nm[32];
        snprintf(nm, sizeof nm, "w%d.bin", d);
        write_shard(nm, src[d], n[d], 20240520, 1, 2);
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", d ? "," : "", tpath(nm));
    }
    DataConfig dc = cfg(list);
    snprintf(dc.weights, sizeof dc.weights, "5, 3, 2");
    dc.shuffle = 1;
    dc.val_frac = 0.1f;
    DataSet* ds = open_ok(&dc, 4096, T, 42);
    DataSet* again = open_ok(&dc, 4096, T, 42);
    DataSet* other = open_ok(&dc, 4096, T, 43);
    if (ds && again && other) {
        const double want[3] = {0.5, 0.3, 0.2};
        uint64_t cnt[3] = {0, 0, 0};
        int contents_ok = 1, repro = 1, differs = 0;
        int32_t w[5], w2[5];
        const uint64_t N = 10000;
        for (uint64_t i = 0; i < N; i++) {
            int d = data_source_of(ds, 0, i);
            if (d < 0 || d > 2) { contents_ok = 0; continue; }
            cnt[d]++;
            data_get(ds, 0, i, w);
            for (int t = 0; t <= T; t++)
                contents_ok &= w[t] >= 1000 * (d + 1) && w[t] < 1000 * (d + 1) + 997;
            data_get(again, 0, i, w2);
            repro &= !memcmp(w, w2, sizeof w);
            data_get(other, 0, i, w2);
            differs |= memcmp(w, w2, sizeof w) != 0;
        }
        for (int d = 0; d < 3; d++)
            EXPECT(fabs((double)cnt[d] / N - want[d]) <= 0.01, "source %d drawn %.4f of 10000, weight %.2f", d,
                   (double)cnt[d] / N, want[d]);
        EXPECT(contents_ok, "a window's tokens do not come from the source data_source_of names");
        EXPECT(repro, "the same seed gives another mixture");
        EXPECT(differs, "another seed gives the same mixture");
        // validation: each source's held-out windows, one source after another
        uint64_t nv = data_num_windows(ds, 1), expect_v = 0;
        for (int d = 0; d < 3; d++) {
            DataConfig one = cfg(tpath(d == 0 ? "w0.bin" : d == 1 ? "w1.bin" : "w2.bin"));
            one.val_frac = 0.1f;
            DataSet* s = open_ok(&one, 4096, T, 1);
            if (s) expect_v += data_num_windows(s, 1);
            data_close(s);
        }
        EXPECT(nv == expect_v && nv > 0, "validation windows %llu, expected %llu", (unsigned long long)nv,
               (unsigned long long)expect_v);
        data_get(ds, 1, nv - 1, w);
        EXPECT(w[0] >= 3000 && w[0] < 3997, "the last validation window is source 3's");
    }
    data_close(ds);
    data_close(again);
    data_close(other);
    snprintf(dc.weights, sizeof dc.weights, "1,2");
    open_fails(&dc, 4096, T, "2 weights for 3 data.path items");
    snprintf(dc.weights, sizeof dc.weights, "1,0,2");
    open_fails(&dc, 4096, T, "not a positive number");
    FILE* f = fopen(tpath("seq.fa"), "wb");
    if (f) { fputs(">a\nACGTACGTACGTACGTACGT\n>b\nACGTACGTACGT\n", f); fclose(f); }
    char mixed[800];
    snprintf(mixed, sizeof mixed, "%s,%s", tpath("w0.bin"), tpath("seq.fa"));
    DataConfig mc = cfg(mixed);
    snprintf(mc.weights, sizeof mc.weights, "1,1");
    open_fails(&mc, 4096, T, "mixes .bin shards only");
    for (int d = 0; d < 3; d++) free(src[d]);
}

static void test_cli_resolve(void) {
    Config c;
    config_defaults(&c);
    Err e = {{0}};
    snprintf(c.data.path, sizeof c.data.path, "%s, %s/d1/train_*.bin,%s", tpath("w0.bin"), g_dir, tpath("d1"));
    EXPECT(cli_resolve_data_path(&c, &e) == 0, "a list with a glob and a directory: %s", e.msg);
    snprintf(c.data.path, sizeof c.data.path, "%s,%s", tpath("w0.bin"), tpath("missing.bin"));
    EXPECT(cli_resolve_data_path(&c, &e) == -1 && strstr(e.msg, "missing.bin") && !strstr(e.msg, "w0.bin"),
           "the missing item is named: %s", e.msg);
    snprintf(c.data.path, sizeof c.data.path, "%s/nomatch_*.bin", g_dir);
    EXPECT(cli_resolve_data_path(&c, &e) == -1 && strstr(e.msg, "matches no file"), "glob: %s", e.msg);
    snprintf(c.data.path, sizeof c.data.path, "%s", tpath("w0.bin"));
    snprintf(c.data.val_path, sizeof c.data.val_path, "%s", tpath("nope.bin"));
    EXPECT(cli_resolve_data_path(&c, &e) == -1 && strstr(e.msg, "data.val_path"), "val_path: %s", e.msg);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/moetrain_shards_XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    RUN(test_headers);
    RUN(test_paths);
    RUN(test_val_path);
    RUN(test_weights);
    RUN(test_cli_resolve);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_END();
}
