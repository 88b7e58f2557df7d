// test_data.c — the data layer: every format (plain and gzip'd, files written here with zlib),
// the record split, the shuffle, data_get purity, window contents, .bin shards, the random
// source, each class of bad data with its message, and the shipped data sets.
#define _DEFAULT_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "data.h"
#include "test.h"

static char g_dir[64];

static const char* tpath(const char* name) { return t_join(g_dir, name); }

static const char* write_file(const char* name, const void* data, size_t n, int gz) {
    const char* p = tpath(name);
    if (gz) {
        gzFile f = gzopen(p, "wb6");
        if (!f || (n && gzwrite(f, data, (unsigned)n) != (int)n)) { fprintf(stderr, "cannot write %s\n", p); exit(1); }
        gzclose(f);
    } else {
        FILE* f = fopen(p, "wb");
        if (!f || (n && fwrite(data, 1, n, f) != n)) { fprintf(stderr, "cannot write %s\n", p); exit(1); }
        fclose(f);
    }
    return p;
}

static const char* write_str(const char* name, const char* s, int gz) { return write_file(name, s, strlen(s), gz); }

// An llm.c shard: header + tokens (version 1 = uint16, 2 = uint32). count_override < 0: honest.
static const char* write_bin(const char* name, const uint32_t* tok, size_t n, int version, long count_override,
                             uint32_t magic) {
    int w = version == 1 ? 2 : 4;
    size_t bytes = 1024 + n * (size_t)w;
    uint8_t* b = calloc(1, bytes);
    int32_t h[256] = {0};
    h[0] = (int32_t)magic;
    h[1] = version;
    h[2] = count_override >= 0 ? (int32_t)count_override : (int32_t)n;
    memcpy(b, h, sizeof h);
    for (size_t i = 0; i < n; i++) {
        if (w == 2) { uint16_t v = (uint16_t)tok[i]; memcpy(b + 1024 + 2 * i, &v, 2); }
        else memcpy(b + 1024 + 4 * i, &tok[i], 4);
    }
    const char* p = write_file(name, b, bytes, 0);
    free(b);
    return p;
}

static DataConfig cfg(const char* path, DataFormat fmt, float val_frac, int sep, int shuffle) {
    DataConfig dc;
    memset(&dc, 0, sizeof dc);
    snprintf(dc.path, sizeof dc.path, "%s", path);
    dc.format = fmt;
    dc.val_frac = val_frac;
    dc.sep_token = sep;
    dc.shuffle = shuffle;
    return dc;
}

static DataSet* open_ok(const DataConfig* dc, int vocab, int T, uint64_t seed) {
    DataSet* ds = NULL;
    Err e = {{0}};
    if (data_open(&ds, dc, vocab, T, seed, &e)) {
        EXPECT(0, "data_open(%s) failed: %s", dc->path, e.msg);
        return NULL;
    }
    return ds;
}

// Opens expecting failure; checks the message holds each of the NULL-terminated substrings.
static void open_fails(const DataConfig* dc, int vocab, int T, const char* what, ...) {
    DataSet* ds = NULL;
    Err e = {{0}};
    int rc = data_open(&ds, dc, vocab, T, 1, &e);
    EXPECT(rc == -1 && ds == NULL, "%s: data_open of %s succeeded", what, dc->path);
    if (rc == 0) { data_close(ds); return; }
    va_list ap;
    va_start(ap, what);
    for (const char* s = va_arg(ap, const char*); s; s = va_arg(ap, const char*))
        EXPECT(strstr(e.msg, s), "%s: message lacks \"%s\": %s", what, s, e.msg);
    va_end(ap);
}

// The whole stream of a split, read back through seq_len-1 windows (open with T = 1, no shuffle).
static int32_t* read_stream(const DataSet* ds, int split, uint64_t* n) {
    uint64_t w = data_num_windows(ds, split);
    EXPECT(w < 2 || data_window_of(ds, split, 1) == 1, "read_stream needs an unshuffled split");
    *n = w ? w + 1 : 0;
    int32_t* out = malloc(sizeof(int32_t) * (w + 1));
    int32_t win[2];
    for (uint64_t i = 0; i < w; i++) {
        data_get(ds, split, i, win);
        out[i] = win[0];
        if (i + 1 == w) out[i + 1] = win[1];
    }
    return out;
}

static void expect_stream(const DataSet* ds, int split, const char* want, const char* what) {
    uint64_t n;
    int32_t* s = read_stream(ds, split, &n);
    size_t m = strlen(want);
    EXPECT(n == m, "%s: stream has %llu tokens, want %zu", what, (unsigned long long)n, m);
    for (size_t i = 0; i < n && i < m; i++)
        if (s[i] != (uint8_t)want[i]) {
            EXPECT(0, "%s: token %zu is %d, want %d ('%c')", what, i, s[i], (uint8_t)want[i], want[i]);
            break;
        }
    free(s);
}

// ---- formats -----------------------------------------------------------------------------------

static void test_fasta(void) {
    const char* src = "\n>r1 some description\nAC GT\r\nT\tT\n\n>empty\n;comment\n>r2\nggg";
    for (int gz = 0; gz < 2; gz++) {
        DataConfig dc = cfg(write_str(gz ? "a.fa.gz" : "a.fa", src, gz), DATA_AUTO, 0, '|', 0);
        DataSet* ds = open_ok(&dc, 256, 1, 7);
        if (!ds) continue;
        expect_stream(ds, 0, "ACGTTT|ggg|", gz ? "fasta gz" : "fasta");
        EXPECT(data_num_records(ds, 0) == 2 && data_num_windows(ds, 1) == 0, "records %llu, val windows %llu",
               (unsigned long long)data_num_records(ds, 0), (unsigned long long)data_num_windows(ds, 1));
        char d[512];
        data_describe(ds, d, sizeof d);
        EXPECT(strstr(d, "fasta") && strstr(d, "2 records") && (!gz || strstr(d, "gzip")), "describe: %s", d);
        data_close(ds);
    }
    // windows of seq_len + 1 at stride seq_len, against the hand-built stream
    DataConfig dc = cfg(tpath("a.fa"), DATA_FASTA, 0, '|', 0);
    DataSet* ds = open_ok(&dc, 256, 4, 7);
    if (!ds) return;
    const char* want = "ACGTTT|ggg|";  // 11 tokens: windows (11 - 1) / 4 = 2
    EXPECT(data_num_windows(ds, 0) == 2, "windows %llu", (unsigned long long)data_num_windows(ds, 0));
    int32_t w[5];
    for (int i = 0; i < 4; i++) {  // i = 2, 3 are epoch 1: the same windows again (no shuffle)
        data_get(ds, 0, (uint64_t)i, w);
        for (int t = 0; t < 5; t++)
            EXPECT(w[t] == want[(i % 2) * 4 + t], "window %d token %d: %d want %c", i, t, w[t], want[(i % 2) * 4 + t]);
    }
    data_close(ds);
}

static void test_fastq(void) {
    const char* src = "@r1 x\nACGT\n+\nII@I\n\n@r2\nG G\n+r2\n@@\n@r3\nTTA\n+\n!!!";  // no final newline
    for (int gz = 0; gz < 2; gz++) {
        DataConfig dc = cfg(write_str(gz ? "a.fq.gz" : "a.fq", src, gz), DATA_AUTO, 0, 5, 0);
        DataSet* ds = open_ok(&dc, 256, 1, 7);
        if (!ds) continue;
        expect_stream(ds, 0, "ACGT\5GG\5TTA\5", gz ? "fastq gz" : "fastq");
        EXPECT(data_num_records(ds, 0) == 3, "records %llu", (unsigned long long)data_num_records(ds, 0));
        data_close(ds);
    }
}

static void test_text(void) {
    const char* src = "hello\r\n\n w\xc3\xa9 \nlast";
    for (int gz = 0; gz < 2; gz++) {
        DataConfig dc = cfg(write_str(gz ? "a.txt.gz" : "a.txt", src, gz), DATA_AUTO, 0, '#', 0);
        DataSet* ds = open_ok(&dc, 256, 1, 7);
        if (!ds) continue;
        expect_stream(ds, 0, "hello# w\xc3\xa9 #last#", gz ? "text gz" : "text");
        data_close(ds);
    }
    // a FASTA file forced to text keeps its header lines
    DataConfig dc = cfg(write_str("b.fa", ">h\nAC\n", 0), DATA_TEXT, 0, '#', 0);
    DataSet* ds = open_ok(&dc, 256, 1, 7);
    if (ds) expect_stream(ds, 0, ">h#AC#", "fasta forced to text");
    data_close(ds);
}

static void test_file_list_and_buffer(void) {
    write_str("l1.fa", ">a\nAAA\n", 0);
    write_str("l2.fq.gz", "@b\nCC\n+\nII\n", 1);
    char list[512];
    snprintf(list, sizeof list, "%s, %s", tpath("l1.fa"), tpath("l2.fq.gz"));
    DataConfig dc = cfg(list, DATA_AUTO, 0, '|', 0);
    DataSet* ds = open_ok(&dc, 256, 1, 7);
    if (ds) {
        expect_stream(ds, 0, "AAA|CC|", "comma list");
        char d[512];
        data_describe(ds, d, sizeof d);
        EXPECT(strstr(d, "fasta+fastq") && strstr(d, "and 1 more"), "describe: %s", d);
    }
    data_close(ds);
    // in memory, gzip'd as two members (like `cat a.gz b.gz`)
    const char* parts[2] = {">x\nAC\n", ">y\nGT\n"};
    uint8_t gzbuf[512];
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
        zs.next_in = (Bytef*)parts[k];
        zs.avail_in = (uInt)strlen(parts[k]);
        zs.next_out = gzbuf + n;
        zs.avail_out = (uInt)(sizeof gzbuf - n);
        EXPECT(deflate(&zs, Z_FINISH) == Z_STREAM_END, "deflate");
        n += zs.total_out;
        deflateEnd(&zs);
    }
    DataConfig mc = cfg("", DATA_AUTO, 0, '|', 0);
    Err e = {{0}};
    DataSet* ms = NULL;
    EXPECT(data_open_buffer(&ms, &mc, "mem.fa.gz", gzbuf, n, 256, 1, 7, &e) == 0, "buffer: %s", e.msg);
    if (ms) expect_stream(ms, 0, "AC|GT|", "gzip buffer, two members");
    data_close(ms);
    EXPECT(data_open_buffer(&ms, &mc, "cut.fa.gz", gzbuf, n / 2 - 4, 256, 1, 7, &e) == -1 && strstr(e.msg, "gzip"),
           "truncated gzip buffer: %s", e.msg);
}

// Hand-made files in tests/fixtures/data: NAME holds the input, NAME.expected its stream ('|' = sep).
static void test_fixtures(void) {
    const char* cases[2][2] = {{"tests/fixtures/data/awkward.fa", "tests/fixtures/data/awkward.expected"},
                               {"tests/fixtures/data/reads.fq", "tests/fixtures/data/reads.expected"}};
    for (int k = 0; k < 2; k++) {
        char want[256] = "";
        FILE* f = fopen(cases[k][1], "rb");
        EXPECT(f, "cannot open %s (run from the repository root)", cases[k][1]);
        if (!f) continue;
        size_t n = fread(want, 1, sizeof want - 1, f);
        want[n] = 0;
        fclose(f);
        DataConfig dc = cfg(cases[k][0], DATA_AUTO, 0, '|', 0);
        DataSet* ds = open_ok(&dc, 256, 1, 1);
        if (ds) expect_stream(ds, 0, want, cases[k][0]);
        data_close(ds);
    }
}

// ---- split and shuffle -------------------------------------------------------------------------

// Writes a FASTA of n records: record i's sequence is "X<i>Y".
static const char* write_records(const char* name, int n) {
    size_t cap = (size_t)n * 32 + 16, len = 0;
    char* s = malloc(cap);
    for (int i = 0; i < n; i++) len += (size_t)snprintf(s + len, cap - len, ">r%d\nX%dY\n", i, i);
    const char* p = write_file(name, s, len, 0);
    free(s);
    return p;
}

// Record ids of a split, in stream order (parses "X<i>Y|").
static int split_ids(const DataSet* ds, int split, int* ids, int cap) {
    uint64_t n;
    int32_t* s = read_stream(ds, split, &n);
    int k = 0, v = -1;
    for (uint64_t i = 0; i < n; i++) {
        if (s[i] == 'X') v = 0;
        else if (s[i] >= '0' && s[i] <= '9') v = v * 10 + (s[i] - '0');
        else if (s[i] == 'Y' && k < cap) ids[k++] = v;
    }
    free(s);
    return k;
}

static void test_split(void) {
    enum { N = 2000 };
    const char* p = write_records("many.fa", N);
    static int ids0[N], ids1[N], again[N];
    static unsigned char seen[N];
    DataConfig dc = cfg(p, DATA_AUTO, 0.1f, '|', 0);
    DataSet* a = open_ok(&dc, 256, 1, 1);
    DataSet* b = open_ok(&dc, 256, 1, 999);  // the split does not depend on the seed
    if (!a || !b) return;
    int n0 = split_ids(a, 0, ids0, N), n1 = split_ids(a, 1, ids1, N);
    EXPECT(n0 + n1 == N, "train %d + val %d != %d", n0, n1, N);
    EXPECT(n1 >= 140 && n1 <= 260, "val_frac 0.1 of %d records gave %d (binomial sd 13)", N, n1);
    EXPECT((uint64_t)n0 == data_num_records(a, 0) && (uint64_t)n1 == data_num_records(a, 1), "record counts");
    for (int i = 0; i < n0; i++) seen[ids0[i]]++;
    for (int i = 0; i < n1; i++) seen[ids1[i]]++;
    int bad = 0;
    for (int i = 0; i < N; i++) bad += seen[i] != 1;
    EXPECT(bad == 0, "%d records not in exactly one split", bad);
    for (int i = 1; i < n1; i++) EXPECT(ids1[i] > ids1[i - 1], "val records out of order at %d", i);
    int m1 = split_ids(b, 1, again, N);
    EXPECT(m1 == n1 && !memcmp(again, ids1, sizeof(int) * (size_t)n1), "split changed with the seed");
    data_close(a);
    data_close(b);

    // two records: one in each split whatever val_frac says
    const char* two = write_records("two.fa", 2);
    float fr[2] = {0.001f, 0.89f};
    for (int k = 0; k < 2; k++) {
        DataConfig d2 = cfg(two, DATA_AUTO, fr[k], '|', 0);
        DataSet* ds = open_ok(&d2, 256, 1, 1);
        if (!ds) continue;
        EXPECT(data_num_records(ds, 0) == 1 && data_num_records(ds, 1) == 1, "val_frac %g: %llu + %llu records",
               fr[k], (unsigned long long)data_num_records(ds, 0), (unsigned long long)data_num_records(ds, 1));
        data_close(ds);
    }

    // one record (a genome): split by position, the last val_frac of its tokens
    char* g = malloc(1100);
    strcpy(g, ">genome\n");
    for (int i = 0; i < 1000; i++) g[8 + i] = "ACGT"[(i * 7 + i / 3) % 4];
    g[1008] = 0;
    DataConfig d1 = cfg(write_str("genome.fa", g, 0), DATA_AUTO, 0.1f, '|', 0);
    DataSet* ds = open_ok(&d1, 256, 1, 1);
    if (ds) {
        uint64_t nt = data_num_tokens(ds, 0), nv = data_num_tokens(ds, 1);
        EXPECT(nt == 901 && nv == 100, "genome split %llu + %llu, want 901 + 100 (1000 bases + sep)",
               (unsigned long long)nt, (unsigned long long)nv);
        uint64_t n;
        int32_t* s0 = read_stream(ds, 0, &n);
        int32_t* s1 = read_stream(ds, 1, &n);
        int ok = 1;
        for (int i = 0; i < 1000; i++) ok &= (i < 901 ? s0[i] : s1[i - 901]) == g[8 + i];
        EXPECT(ok && s1[99] == '|', "genome streams are not the record cut at 901");
        free(s0);
        free(s1);
    }
    data_close(ds);
    free(g);
}

static void test_shuffle(void) {
    enum { T = 8, W = 100 };
    static uint32_t tok[T * W + 1];
    for (uint32_t i = 0; i <= T * W; i++) tok[i] = i;
    const char* p = write_bin("idx.bin", tok, T * W + 1, 2, -1, 20240520);
    DataConfig dc = cfg(p, DATA_AUTO, 0.1f, 0, 1);
    DataSet* a = open_ok(&dc, 1 << 20, T, 11);
    DataSet* a2 = open_ok(&dc, 1 << 20, T, 11);
    DataSet* b = open_ok(&dc, 1 << 20, T, 12);
    dc.shuffle = 0;
    DataSet* c = open_ok(&dc, 1 << 20, T, 11);
    if (!a || !a2 || !b || !c) return;
    EXPECT(data_num_windows(a, 0) == 90 && data_num_windows(a, 1) == 10, "windows %llu/%llu",
           (unsigned long long)data_num_windows(a, 0), (unsigned long long)data_num_windows(a, 1));
    unsigned char seen[90] = {0};
    int same_ab = 0, same_epoch = 0, ident = 0, bad_tok = 0;
    int32_t w[T + 1];
    for (uint64_t i = 0; i < 90; i++) {
        uint64_t k = data_window_of(a, 0, i);
        if (k < 90) seen[k]++;
        EXPECT(k == data_window_of(a2, 0, i), "same seed, different window at %llu", (unsigned long long)i);
        same_ab += k == data_window_of(b, 0, i);
        same_epoch += k == data_window_of(a, 0, i + 90);
        ident += k == i;
        EXPECT(data_window_of(c, 0, i) == i, "shuffle off moved window %llu", (unsigned long long)i);
        data_get(a, 0, i, w);
        for (int t = 0; t <= T; t++) bad_tok += w[t] != (int32_t)(k * T + (uint64_t)t);
    }
    int perm = 1;
    for (int k = 0; k < 90; k++) perm &= seen[k] == 1;
    EXPECT(perm, "epoch 0 is not a permutation of the 90 train windows");
    EXPECT(same_ab < 20 && same_epoch < 20 && ident < 20, "too alike: seeds %d, epochs %d, identity %d of 90",
           same_ab, same_epoch, ident);
    EXPECT(bad_tok == 0, "%d tokens differ from the window's stream", bad_tok);
    for (uint64_t i = 0; i < 25; i++) {  // validation: never shuffled; the last 10 windows; wraps
        data_get(a, 1, i, w);
        EXPECT(w[0] == (int32_t)((90 + i % 10) * T) && w[T] == w[0] + T, "val %llu starts at %d",
               (unsigned long long)i, w[0]);
    }
    data_close(a);
    data_close(a2);
    data_close(b);
    data_close(c);

    // a larger permutation (cycle-walking over 2^17 > 100000)
    enum { M = 100001 };
    uint32_t* big = malloc(sizeof(uint32_t) * M);
    for (uint32_t i = 0; i < M; i++) big[i] = i % 251;
    DataConfig db = cfg(write_bin("big.bin", big, M, 1, -1, 20240520), DATA_BIN, 0, 0, 1);
    DataSet* d = open_ok(&db, 256, 1, 3);
    unsigned char* hit = calloc(M, 1);
    if (d) {
        uint64_t n = data_num_windows(d, 0), bad = 0;
        EXPECT(n == M - 1, "windows %llu", (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t k = data_window_of(d, 0, 5 * n + i);
            if (k >= n || hit[k]++) bad++;
        }
        EXPECT(bad == 0, "%llu collisions in a permutation of %llu", (unsigned long long)bad, (unsigned long long)n);
    }
    data_close(d);
    free(hit);
    free(big);
}

static void test_purity(void) {
    DataConfig dc = cfg(tpath("many.fa"), DATA_AUTO, 0.1f, '|', 1);
    DataSet* a = open_ok(&dc, 256, 16, 5);
    DataSet* b = open_ok(&dc, 256, 16, 5);
    if (!a || !b) return;
    int32_t x[17], y[17], z[17];
    const uint64_t probes[4] = {0, 12345, 987654321ull, ~0ull};
    for (int k = 0; k < 4; k++) {
        data_get(a, 0, probes[k], x);
        for (uint64_t j = 0; j < 50; j++) data_get(a, j & 1, j * 7919, z);  // unrelated reads
        data_get(a, 0, probes[k], y);
        EXPECT(!memcmp(x, y, sizeof x), "data_get(%llu) changed after other reads", (unsigned long long)probes[k]);
        data_get(b, 0, probes[k], y);
        EXPECT(!memcmp(x, y, sizeof x), "data_get(%llu) differs between two opens", (unsigned long long)probes[k]);
    }
    data_close(a);
    data_close(b);
}

// ---- .bin and random ---------------------------------------------------------------------------

static void test_bin(void) {
    uint32_t t16[21], t32[13];
    for (int i = 0; i < 21; i++) t16[i] = (uint32_t)(i * 3000 + 7);           // up to 60007: needs uint16
    for (int i = 0; i < 13; i++) t32[i] = 100000u + (uint32_t)i * 1000003u;  // > 65535: needs uint32
    char list[512];
    snprintf(list, sizeof list, "%s,%s", write_bin("v1.bin", t16, 21, 1, -1, 20240520),
             write_bin("v2.shard", t32, 13, 2, -1, 20240520));  // the second by magic, not extension
    DataConfig dc = cfg(list, DATA_AUTO, 0, 0, 0);
    DataSet* ds = open_ok(&dc, 1 << 30, 1, 1);
    if (ds) {
        uint64_t n;
        int32_t* s = read_stream(ds, 0, &n);
        int ok = n == 34;
        for (uint64_t i = 0; ok && i < n; i++) ok = s[i] == (int32_t)(i < 21 ? t16[i] : t32[i - 21]);
        EXPECT(ok, "uint16 + uint32 shards read back wrong (%llu tokens)", (unsigned long long)n);
        free(s);
        char d[512];
        data_describe(ds, d, sizeof d);
        EXPECT(strstr(d, "bin uint16+uint32") && strstr(d, "34 train"), "describe: %s", d);
    }
    data_close(ds);
    // windows across the file boundary, and the window split (last val_frac of windows)
    dc.val_frac = 0.25f;
    ds = open_ok(&dc, 1 << 30, 4, 1);  // 34 tokens: 8 windows, 2 validation
    if (ds) {
        EXPECT(data_num_windows(ds, 0) == 6 && data_num_windows(ds, 1) == 2, "windows %llu + %llu",
               (unsigned long long)data_num_windows(ds, 0), (unsigned long long)data_num_windows(ds, 1));
        int32_t w[5];
        data_get(ds, 0, 5, w);  // tokens 20..24: t16[20], t32[0..3]
        EXPECT(w[0] == (int32_t)t16[20] && w[1] == (int32_t)t32[0] && w[4] == (int32_t)t32[3], "boundary window");
        data_get(ds, 1, 1, w);  // window 7: tokens 28..32
        EXPECT(w[0] == (int32_t)t32[7] && w[4] == (int32_t)t32[11], "validation window 1");
    }
    data_close(ds);
}

static void test_random(void) {
    DataConfig dc = cfg("", DATA_RANDOM, 0.05f, 0, 1);
    DataSet* a = open_ok(&dc, 1000, 64, 1);
    DataSet* a2 = open_ok(&dc, 1000, 64, 1);
    DataSet* b = open_ok(&dc, 1000, 64, 2);
    if (!a || !a2 || !b) return;
    EXPECT(data_num_windows(a, 0) == DATA_UNLIMITED && data_num_windows(a, 1) == DATA_RANDOM_VAL, "windows");
    int32_t x[65], y[65], z[65], v[65];
    int out = 0, same_b = 0, same_v = 0, hist[10] = {0};
    for (uint64_t i = 0; i < 200; i++) {
        data_get(a, 0, i * 1000003ull, x);
        data_get(a2, 0, i * 1000003ull, y);
        data_get(b, 0, i * 1000003ull, z);
        data_get(a, 1, i * 1000003ull, v);
        EXPECT(!memcmp(x, y, sizeof x), "same seed differs at %llu", (unsigned long long)i);
        for (int t = 0; t < 65; t++) {
            out += x[t] < 0 || x[t] >= 1000;
            if (x[t] >= 0 && x[t] < 1000) hist[x[t] / 100]++;
            same_b += x[t] == z[t];
            same_v += x[t] == v[t];
        }
    }
    EXPECT(out == 0, "%d tokens outside [0, 1000)", out);
    EXPECT(same_b < 100 && same_v < 100, "seeds/splits too alike: %d, %d of 13000 equal", same_b, same_v);
    for (int k = 0; k < 10; k++)  // 1300 expected per decile, sd 34
        EXPECT(hist[k] > 1100 && hist[k] < 1500, "decile %d has %d of 13000 tokens", k, hist[k]);
    data_close(a);
    data_close(a2);
    data_close(b);
}

// ---- bad data ----------------------------------------------------------------------------------

static void test_errors(void) {
    DataConfig dc;
    dc = cfg(tpath("nope.fa"), DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 256, 4, "missing", "cannot open", "nope.fa", NULL);
    dc = cfg(write_str("empty.fa", "", 0), DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 256, 4, "empty", "empty.fa", "is empty", NULL);
    dc = cfg(write_str("empty.fa.gz", "", 1), DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 256, 4, "empty gz", "is empty", NULL);
    dc = cfg(write_str("hdr.fa", ">a\n>b\n\n", 0), DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 256, 1, "no records", "hdr.fa", "no records", NULL);
    dc = cfg(write_str("plain.txt", "hello\nworld\n", 0), DATA_FASTA, 0, '|', 0);
    open_fails(&dc, 256, 1, "forced fasta", "not FASTA", "line 1", NULL);
    dc = cfg(tpath("a.fa"), DATA_FASTQ, 0, '|', 0);
    open_fails(&dc, 256, 1, "forced fastq", "not FASTQ", NULL);
    dc = cfg(write_str("noplus.fq", "@r\nAC\n+\nII\n@s\nGG\nII\n", 0), DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 256, 1, "fastq no +", "line 7", "starts line 5", "'+'", NULL);
    dc = cfg(write_str("qual.fq", "@r\nACG\n+\nII\n", 0), DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 256, 1, "fastq qual", "line 4", "quality has 2", "sequence has 3", NULL);
    dc = cfg(write_str("trunc.fq", "@r\nAC\n+\nII\n@s\nGG\n", 0), DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 256, 1, "fastq truncated", "truncated FASTQ", "starts line 5", NULL);
    dc = cfg(write_str("hi.fa", ">a\nAC\nA\xc3\x89\n", 0), DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 256, 1, "non-ascii", "hi.fa", "line 3", "non-ASCII", NULL);
    dc = cfg(write_file("nul.fa", ">a\nA\0C\n", 7, 1), DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 256, 1, "nul", "line 2", "NUL", NULL);
    dc = cfg(tpath("a.fa"), DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 256, 64, "too short", "has 11 tokens", "seq_len + 1 = 65", "lower train.seq_len", NULL);
    dc = cfg(tpath("many.fa"), DATA_AUTO, 0.001f, '|', 0);  // the one validation record is short
    open_fails(&dc, 256, 64, "val too short", "validation split", "raise data.val_frac", NULL);
    dc = cfg(write_str("x.fa", ">a\nACxGT\n", 0), DATA_AUTO, 0, 5, 0);
    open_fails(&dc, 100, 1, "byte >= vocab", "line 2", "0x78", "vocab_size 100", NULL);
    dc = cfg(tpath("a.fa"), DATA_AUTO, 0, 200, 0);
    open_fails(&dc, 100, 1, "sep >= vocab", "data.sep_token = 200", NULL);
    char list[512];
    snprintf(list, sizeof list, "%s,%s", tpath("a.fa"), tpath("v1.bin"));
    dc = cfg(list, DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 1 << 20, 1, "mixed kinds", "mixes", NULL);

    // gzip damage: cut a real .gz in half
    FILE* f = fopen(tpath("many.fa"), "rb");
    static char raw[65536];
    size_t n = f ? fread(raw, 1, sizeof raw, f) : 0;
    if (f) fclose(f);
    write_file("whole.fa.gz", raw, n, 1);
    f = fopen(tpath("whole.fa.gz"), "rb");
    static char gz[65536];
    size_t m = f ? fread(gz, 1, sizeof gz, f) : 0;
    if (f) fclose(f);
    dc = cfg(write_file("cut.fa.gz", gz, m / 2, 0), DATA_AUTO, 0, '|', 0);
    open_fails(&dc, 256, 1, "truncated gzip", "cut.fa.gz", "gzip", NULL);

    // .bin damage
    uint32_t tok[10] = {1, 2, 3, 4, 5, 300, 7, 8, 9, 10};
    dc = cfg(write_bin("short.bin", tok, 10, 1, 12, 20240520), DATA_AUTO, 0, 0, 1);
    open_fails(&dc, 1000, 1, "truncated bin", "truncated", "1048 bytes", "1044 bytes", NULL);
    dc = cfg(write_bin("magic.bin", tok, 10, 1, -1, 12345), DATA_AUTO, 0, 0, 1);
    open_fails(&dc, 1000, 1, "bad magic", "bad magic 12345", NULL);
    dc = cfg(write_bin("ver.bin", tok, 10, 3, -1, 20240520), DATA_AUTO, 0, 0, 1);
    open_fails(&dc, 1000, 1, "bad version", "version 3", NULL);
    dc = cfg(write_bin("vocab.bin", tok, 10, 1, -1, 20240520), DATA_AUTO, 0, 0, 1);
    open_fails(&dc, 256, 1, "bin vocab", "vocab.bin", "token 300", "token offset 5", "byte offset 1034", NULL);
    dc = cfg(tpath("plain.txt"), DATA_BIN, 0, 0, 1);
    open_fails(&dc, 256, 1, "text forced to bin", "truncated .bin", NULL);
    dc = cfg(write_bin("tiny.bin", tok, 5, 1, -1, 20240520), DATA_AUTO, 0.5f, 0, 1);
    open_fails(&dc, 1000, 4, "bin too short", "none left for training", "lower train.seq_len", NULL);
    write_file("shard.bin.gz", gz, 0, 1);
    uint8_t hdr[1040] = {0};
    int32_t magic = 20240520, one = 1, cnt = 8;
    memcpy(hdr, &magic, 4);
    memcpy(hdr + 4, &one, 4);
    memcpy(hdr + 8, &cnt, 4);
    dc = cfg(write_file("shard.bin.gz", hdr, sizeof hdr, 1), DATA_AUTO, 0, 0, 1);
    open_fails(&dc, 1000, 1, "gzip'd bin", "gunzip it first", NULL);
}

// ---- the shipped data --------------------------------------------------------------------------

static void test_shipped(void) {
    DataConfig dc = cfg("", DATA_AUTO, 0.05f, '\n', 0);  // "" = data/hairpin.fa.gz; no shuffle: read_stream
    double t0 = now_sec();
    DataSet* ds = open_ok(&dc, 256, 1, 1);
    if (!ds) return;
    double dt = now_sec() - t0;
    uint64_t r0 = data_num_records(ds, 0), r1 = data_num_records(ds, 1);
    EXPECT(r0 + r1 == 28645, "hairpin: %llu records, want 28645", (unsigned long long)(r0 + r1));
    EXPECT(r1 > 28645 * 0.04 && r1 < 28645 * 0.06, "hairpin: %llu validation records for val_frac 0.05",
           (unsigned long long)r1);
    uint64_t counts[256] = {0}, total = 0;
    for (int s = 0; s < 2; s++) {
        uint64_t n;
        int32_t* st = read_stream(ds, s, &n);
        for (uint64_t i = 0; i < n; i++) counts[st[i] & 255]++;
        total += n;
        free(st);
    }
    uint64_t acgu = counts['A'] + counts['C'] + counts['G'] + counts['U'];
    EXPECT(total == 2949871 + 28645, "hairpin: %llu tokens, want 2949871 bases + 28645 separators",
           (unsigned long long)total);
    EXPECT(counts['\n'] == 28645 && acgu == 2949540 && counts['T'] == 0, "hairpin alphabet: %llu ACGU, want 2949540 (and 331 IUPAC codes)",
           (unsigned long long)acgu);
    int other = 0;  // the rest are IUPAC ambiguity codes (N, R, Y, ...): upper-case letters
    for (int b = 0; b < 256; b++)
        if (counts[b] && b != '\n' && !(b >= 'A' && b <= 'Z')) other++;
    EXPECT(other == 0, "hairpin has %d byte values that are not upper-case letters", other);
    if (counts['\n'] != 28645 || counts['T'])
        printf("  sep %llu, T %llu\n", (unsigned long long)counts['\n'], (unsigned long long)counts['T']);
    char d[512];
    data_describe(ds, d, sizeof d);
    printf("  %s (%.2f s)\n", d, dt);
    data_close(ds);

    dc = cfg("data/lambda_virus.fa.gz", DATA_AUTO, 0.05f, '\n', 1);
    ds = open_ok(&dc, 256, 64, 1);
    if (!ds) return;
    uint64_t nt = data_num_tokens(ds, 0), nv = data_num_tokens(ds, 1);
    EXPECT(nt + nv == 48503 && nv == 2425, "lambda: %llu + %llu tokens, want 48502 bases + 1 sep, 2425 held out",
           (unsigned long long)nt, (unsigned long long)nv);
    int32_t w[65];
    data_get(ds, 1, 0, w);
    int ok = 1;
    for (int t = 0; t < 65; t++) ok &= w[t] == 'A' || w[t] == 'C' || w[t] == 'G' || w[t] == 'T';
    EXPECT(ok, "lambda validation window is not DNA");
    data_describe(ds, d, sizeof d);
    printf("  %s\n", d);
    data_close(ds);
}

// Documents (data.documents): which token ends a document, whether records are documents by
// nature, and the per-window document starts.
static void test_documents(void) {
    static const char fa[] = ">a\nACGU\n>b\nGG\n>c\nUUA\n>d\nC\n", txt[] = "one line\nanother\n";
    struct { const char* name; const char* src; int sep, want_sep, want_nat; } cs[] = {
        {"d.fa", fa, 10, 10, 1},      // FASTA records end with the separator
        {"d.txt", txt, 10, 10, 0},    // text lines: a separator, but not documents by nature
        {"e.fa", fa, 'G', -1, 0},     // the separator occurs inside a record: no boundaries
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        DataConfig dc = cfg("", DATA_AUTO, 0, cs[c].sep, 0);
        Err e = {{0}};
        DataSet* ds = NULL;
        EXPECT(data_open_buffer(&ds, &dc, cs[c].name, (const uint8_t*)cs[c].src, strlen(cs[c].src), 256, 4, 1, &e) == 0,
               "%s: %s", cs[c].name, e.msg);
        if (!ds) continue;
        int nat = -1;
        const int sep = data_doc_sep(ds, &nat);
        EXPECT(sep == cs[c].want_sep && nat == cs[c].want_nat, "%s: separator %d (want %d), natural %d (want %d)",
               cs[c].name, sep, cs[c].want_sep, nat, cs[c].want_nat);
        data_close(ds);
    }
    DataConfig rc = cfg("", DATA_RANDOM, 0.1f, 10, 0);
    Err e = {{0}};
    DataSet* rs = NULL;
    EXPECT(data_open_buffer(&rs, &rc, "random", NULL, 0, 64, 8, 1, &e) == 0, "random: %s", e.msg);
    if (rs) EXPECT(data_doc_sep(rs, NULL) == -1, "random tokens have no documents");
    data_close(rs);
    // starts: the token after each separator begins a document; a separator ends its own
    const int32_t w[9] = {5, 7, 1, 1, 6, 1, 8, 9, 1};
    int32_t d[8];
    data_doc_starts(w, 8, 1, d);
    const int32_t want[8] = {0, 0, 0, 3, 4, 4, 6, 6};
    EXPECT(!memcmp(d, want, sizeof d), "document starts %d %d %d %d %d %d %d %d", d[0], d[1], d[2], d[3], d[4], d[5],
           d[6], d[7]);
}

int main(void) {
    if (access("tests/fixtures/data", F_OK) != 0) {  // run from elsewhere: go to the repository root
        char exe[4096];
        ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 32);
        if (k > 0) {
            exe[k] = 0;
            char* sl = strrchr(exe, '/');
            if (sl) strcpy(sl, "/../..");
            if (chdir(exe) != 0) perror(exe);
        }
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/moetrain_test_data_XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    RUN(test_fasta);
    RUN(test_fastq);
    RUN(test_text);
    RUN(test_file_list_and_buffer);
    RUN(test_fixtures);
    RUN(test_split);
    RUN(test_shuffle);
    RUN(test_purity);
    RUN(test_bin);
    RUN(test_random);
    RUN(test_errors);
    RUN(test_shipped);
    RUN(test_documents);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_END();
}
