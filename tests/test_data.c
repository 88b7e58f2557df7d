// test_data.c — the data loader: every format, split, shuffle, purity, bad-data errors, and the
// shipped sequence sets.
#define _DEFAULT_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "data.h"
#include "test.h"

static char g_dir[128];

static const char* path_of(const char* name) {
    static char p[4][256];
    static int k;
    char* s = p[k++ % 4];
    snprintf(s, 256, "%s/%s", g_dir, name);
    return s;
}
static const char* write_text(const char* name, const char* text, int gz) {
    const char* p = path_of(name);
    if (gz) {
        gzFile f = gzopen(p, "wb");
        gzwrite(f, text, (unsigned)strlen(text));
        gzclose(f);
    } else {
        FILE* f = fopen(p, "w");
        fputs(text, f);
        fclose(f);
    }
    return p;
}
static DataConfig dcfg(const char* path, DataFormat fmt) {
    DataConfig d = {.format = fmt, .val_frac = 0.3f, .sep_token = 10, .shuffle = 1};
    snprintf(d.path, sizeof d.path, "%s", path);
    return d;
}

// A FASTA file of n records "ACGT..." of distinct lengths.
static const char* many_records(const char* name, int n, int gz) {
    static char buf[1 << 16];
    size_t o = 0;
    for (int r = 0; r < n; r++) {
        o += (size_t)snprintf(buf + o, sizeof buf - o, ">rec%d some description\n", r);
        for (int i = 0; i < 10 + r % 7; i++) buf[o++] = "ACGT"[(r + i) % 4];
        buf[o++] = '\n';
    }
    buf[o] = 0;
    return write_text(name, buf, gz);
}

static void test_fasta_window_contents(void) {
    // one record per split is forced by val_frac=0 → one stream split by position
    const char* p = write_text("a.fa", ">x\nAC GT\nTT\n>y\nGG\n", 0);
    DataConfig d = dcfg(p, DATA_AUTO);
    d.val_frac = 0.0f;
    d.shuffle = 0;
    DataSet* ds;
    Err e = {{0}};
    int rc = data_open(&ds, &d, 256, 3, 1, &e);
    EXPECT(rc != 0 && strstr(e.msg, "validation split has 0 tokens"), "empty validation split named: %s", e.msg);
    // one record: split by position. Stream A C G T T T G G A C C A \n; the last 4 tokens held out.
    d = dcfg(write_text("b.fa", ">x\nAC GT\nTT\nGGACCA\n", 0), DATA_AUTO);
    d.val_frac = 0.35f;
    d.shuffle = 0;
    rc = data_open(&ds, &d, 256, 3, 1, &e);
    EXPECT(rc == 0, "open: %s", e.msg);
    if (rc) return;
    int32_t w[4];
    data_get(ds, 0, 0, w);
    EXPECT(w[0] == 'A' && w[1] == 'C' && w[2] == 'G' && w[3] == 'T', "window 0: %c%c%c%c", w[0], w[1], w[2], w[3]);
    data_get(ds, 0, 1, w);
    EXPECT(w[0] == 'T' && w[1] == 'T' && w[2] == 'T' && w[3] == 'G', "window 1 (stride seq_len): %c%c%c%c", w[0], w[1], w[2], w[3]);
    data_get(ds, 1, 0, w);
    EXPECT(w[0] == 'C' && w[2] == 'A' && w[3] == 10, "validation holds the tail and the separator");
    EXPECT(data_num_windows(ds, 0) == 2, "train windows %llu", (unsigned long long)data_num_windows(ds, 0));
    data_close(ds);
}

static void test_formats_and_gzip(void) {
    const char* fq = write_text("a.fq.gz", "@r1\nACGT\n+\nIIII\n@r2\nGGCC\n+\nIIII\n@r3\nTTAA\n+\nIIII\n", 1);
    const char* tx = write_text("a.txt", "hello world\nsecond line\nthird line here\n", 0);
    const char* fa = many_records("m.fa.gz", 40, 1);
    const char* files[] = {fq, tx, fa};
    for (int i = 0; i < 3; i++) {
        DataConfig d = dcfg(files[i], DATA_AUTO);
        DataSet* ds;
        Err e = {{0}};
        int rc = data_open(&ds, &d, 256, 4, 1, &e);
        EXPECT(rc == 0, "%s: %s", files[i], e.msg);
        if (rc) continue;
        int32_t w[5];
        data_get(ds, 0, 0, w);
        for (int t = 0; t < 5; t++) EXPECT(w[t] >= 0 && w[t] < 128, "token in range");
        char desc[256];
        data_describe(ds, desc, sizeof desc);
        EXPECT(strstr(desc, i == 0 ? "fastq" : i == 1 ? "text" : "fasta") != NULL, "detected format: %s", desc);
        data_close(ds);
    }
}

static void test_split_and_shuffle(void) {
    const char* fa = many_records("s.fa", 200, 0);
    DataConfig d = dcfg(fa, DATA_FASTA);
    d.val_frac = 0.25f;
    DataSet *a, *b, *c;
    Err e = {{0}};
    EXPECT(data_open(&a, &d, 256, 8, 1, &e) == 0 && data_open(&b, &d, 256, 8, 1, &e) == 0 && data_open(&c, &d, 256, 8, 2, &e) == 0,
           "open: %s", e.msg);
    uint64_t nt = data_num_windows(a, 0), nv = data_num_windows(a, 1);
    double frac = (double)nv / (double)(nt + nv);
    EXPECT(frac > 0.12 && frac < 0.4, "validation fraction %.3f near 0.25", frac);
    // the train stream of one epoch is a permutation of the windows; same seed → same order
    int differs = 0;
    int32_t x[9], y[9], z[9];
    for (uint64_t i = 0; i < nt; i++) {
        data_get(a, 0, i, x);
        data_get(b, 0, i, y);
        data_get(c, 0, i, z);
        EXPECT(memcmp(x, y, sizeof x) == 0, "same seed, same window %llu", (unsigned long long)i);
        differs |= memcmp(x, z, sizeof x) != 0;
    }
    EXPECT(differs, "another seed shuffles differently");
    // purity: asking again gives the same tokens
    data_get(a, 0, 5, x);
    data_get(a, 0, 1000, y);
    data_get(a, 0, 5, z);
    EXPECT(memcmp(x, z, sizeof x) == 0, "data_get is a pure function");
    // validation is not shuffled and is disjoint from train (record level: streams differ)
    data_get(a, 1, 0, x);
    data_get(c, 1, 0, y);
    EXPECT(memcmp(x, y, sizeof x) == 0, "validation order is seed-independent");
    data_close(a), data_close(b), data_close(c);
}

static void test_bin_shards(void) {
    for (int ver = 1; ver <= 2; ver++) {
        int32_t hdr[256] = {20240520, ver, 100};
        const char* p = path_of(ver == 1 ? "t16.bin" : "t32.bin");
        FILE* f = fopen(p, "wb");
        fwrite(hdr, sizeof hdr, 1, f);
        for (int i = 0; i < 100; i++) {
            uint32_t v = (uint32_t)(i * 7 % 1000);
            if (ver == 1) { uint16_t s = (uint16_t)v; fwrite(&s, 2, 1, f); } else fwrite(&v, 4, 1, f);
        }
        fclose(f);
        DataConfig d = dcfg(p, DATA_AUTO);
        d.val_frac = 0.2f;
        d.shuffle = 0;
        DataSet* ds;
        Err e = {{0}};
        EXPECT(data_open(&ds, &d, 1000, 9, 1, &e) == 0, "bin v%d: %s", ver, e.msg);
        int32_t w[10];
        data_get(ds, 0, 1, w);
        EXPECT(w[0] == 9 * 7 % 1000 && w[9] == 18 * 7 % 1000, "bin v%d window 1", ver);
        data_close(ds);
        // token >= vocab
        EXPECT(data_open(&ds, &d, 500, 9, 1, &e) != 0 && strstr(e.msg, "token offset"), "bin v%d bad token: %s", ver, e.msg);
    }
}

static void test_bad_data(void) {
    struct { const char* name; const char* text; DataFormat fmt; const char* expect; } cases[] = {
        {"empty.fa", "", DATA_AUTO, "no records"},
        {"notfa.fa", "hello\n", DATA_FASTA, "not FASTA"},
        {"badfq.fq", "@r1\nACGT\nIIII\n", DATA_FASTQ, "must start with '+'"},
        {"trunc.fq", "@r1\nACGT\n+\n", DATA_FASTQ, "truncated FASTQ"},
        {"bin.fa", ">x\nAC\x01\xff\n", DATA_AUTO, "line 2: byte 0xff"},
        {"short.fa", ">x\nACGT\n>y\nAC\n", DATA_AUTO, "fewer than one window"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        DataConfig d = dcfg(write_text(cases[i].name, cases[i].text, 0), cases[i].fmt);
        DataSet* ds;
        Err e = {{0}};
        int rc = data_open(&ds, &d, 256, 64, 1, &e);
        EXPECT(rc != 0 && strstr(e.msg, cases[i].expect) && strstr(e.msg, cases[i].name), "%s: '%s'", cases[i].name, e.msg);
    }
    DataConfig d = dcfg("/no/such/file.fa", DATA_AUTO);
    DataSet* ds;
    Err e = {{0}};
    EXPECT(data_open(&ds, &d, 256, 8, 1, &e) != 0 && strstr(e.msg, "/no/such/file.fa"), "missing: %s", e.msg);
    int32_t hdr[256] = {20240520, 1, 1000};
    const char* p = path_of("trunc.bin");
    FILE* f = fopen(p, "wb");
    fwrite(hdr, sizeof hdr, 1, f);
    fwrite(hdr, 10, 1, f);
    fclose(f);
    d = dcfg(p, DATA_AUTO);
    EXPECT(data_open(&ds, &d, 256, 8, 1, &e) != 0 && strstr(e.msg, "truncated"), "truncated bin: %s", e.msg);
}

static void test_random_and_shipped(void) {
    DataConfig d = dcfg("", DATA_RANDOM);
    DataSet* ds;
    Err e = {{0}};
    EXPECT(data_open(&ds, &d, 32000, 16, 3, &e) == 0, "random: %s", e.msg);
    int32_t w[17], v[17];
    data_get(ds, 0, 12, w);
    data_get(ds, 0, 12, v);
    int distinct = 0;
    for (int t = 0; t < 17; t++) {
        EXPECT(w[t] >= 0 && w[t] < 32000, "random token in range");
        distinct += t && w[t] != w[t - 1];
    }
    EXPECT(memcmp(w, v, sizeof w) == 0 && distinct > 10, "random is seeded and not constant");
    data_close(ds);
    d = dcfg("data/hairpin.fa.gz", DATA_AUTO);
    d.val_frac = 0.05f;
    EXPECT(data_open(&ds, &d, 256, 128, 1, &e) == 0, "hairpin: %s", e.msg);
    char desc[512];
    data_describe(ds, desc, sizeof desc);
    long tr = 0, va = 0;
    const char* s = strstr(desc, "train ");
    if (s) tr = atol(s + 6);
    s = strstr(desc, "validation ");
    if (s) va = atol(s + 11);
    EXPECT(tr + va == 28645, "hairpin has 28,645 records: %s", desc);
    data_close(ds);
    d = dcfg("data/lambda_virus.fa.gz", DATA_AUTO);
    EXPECT(data_open(&ds, &d, 256, 128, 1, &e) == 0, "lambda: %s", e.msg);
    uint64_t w0 = data_num_windows(ds, 0), w1 = data_num_windows(ds, 1);
    EXPECT((w0 + w1) * 128 > 47000 && (w0 + w1) * 128 <= 48503, "lambda: 48,502 bases in windows (%llu)", (unsigned long long)((w0 + w1) * 128));
    data_close(ds);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/moetrain_test_data_%d", (int)getpid());
    char cmd[256];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
    if (system(cmd)) return 1;
    RUN(test_fasta_window_contents);
    RUN(test_formats_and_gzip);
    RUN(test_split_and_shuffle);
    RUN(test_bin_shards);
    RUN(test_bad_data);
    RUN(test_random_and_shipped);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) {}
    TEST_END();
}
