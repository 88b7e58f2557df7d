// test_safetensors.c — safetensors reader/writer and the JSON parser: round trips (F32, BF16,
// F16, odd shapes, metadata) and every class of malformed file rejected with its message.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "minijson.h"
#include "crc32c.h"
#include "safetensors.h"
#include "test.h"
#include "util.h"

static char g_dir[256];

static const char* tpath(const char* name) { return t_join(g_dir, name); }

// A file made of an 8-byte length (hlen, or strlen(header) when hlen == UINT64_MAX), the header
// text and `data` bytes of a counting pattern.
static void write_raw(const char* path, const char* header, uint64_t hlen, size_t data) {
    FILE* f = fopen(path, "wb");
    uint64_t n = hlen == UINT64_MAX ? strlen(header) : hlen;
    fwrite(&n, 8, 1, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

static void fill(float* x, size_t n, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = rng_normal(&r) * 3.0f;
}

static void test_roundtrip_f32(void) {
    float a[3 * 5], b[2 * 3 * 7], s = 4.25f, c[7];
    fill(a, 15, 1);
    fill(b, 42, 2);
    fill(c, 7, 3);
    int64_t sa[] = {3, 5}, sb[] = {2, 3, 7}, sc[] = {7}, sz[] = {0, 4};
    Err e = {{0}};
    StWriter* w = st_writer_new();
    EXPECT(st_writer_add(w, "layer.a", ST_F32, 2, sa, a, &e) == 0, "%s", e.msg);
    EXPECT(st_writer_add(w, "b \"quoted\"\\name", ST_F32, 3, sb, b, &e) == 0, "%s", e.msg);
    EXPECT(st_writer_add(w, "scalar", ST_F32, 0, NULL, &s, &e) == 0, "%s", e.msg);
    EXPECT(st_writer_add(w, "empty", ST_F32, 2, sz, NULL, &e) == 0, "%s", e.msg);
    EXPECT(st_writer_add(w, "c", ST_F32, 1, sc, c, &e) == 0, "%s", e.msg);
    EXPECT(st_writer_add(w, "c", ST_F32, 1, sc, c, &e) == -1 && strstr(e.msg, "duplicate"), "dup add: %s", e.msg);
    st_writer_meta(w, "format", "pt");
    st_writer_meta(w, "note", "tab\there \"q\"");
    uint64_t expect = st_writer_size(w);
    StWriteInfo info;
    const char* p = tpath("rt.safetensors");
    EXPECT(st_writer_write(w, p, &info, &e) == 0, "%s", e.msg);
    st_writer_free(w);
    struct stat st;
    stat(p, &st);
    EXPECT((uint64_t)st.st_size == expect && info.bytes == expect, "size %lld, predicted %llu", (long long)st.st_size, (unsigned long long)expect);
    uint32_t crc = 0;
    EXPECT(file_checksum(p, CKSUM_CRC32C, &crc, NULL, &e) == 0 && crc == info.crc32c, "crc %08x vs %08x", crc, info.crc32c);

    StFile* f;
    EXPECT(st_open(&f, p, &e) == 0, "%s", e.msg);
    if (!f) return;
    EXPECT(f->data_start % 8 == 0, "data starts at %llu", (unsigned long long)f->data_start);
    EXPECT(f->n == 5, "n=%d", f->n);
    EXPECT(st_meta(f, "format") && strcmp(st_meta(f, "format"), "pt") == 0, "format meta");
    EXPECT(st_meta(f, "note") && strcmp(st_meta(f, "note"), "tab\there \"q\"") == 0, "note meta");
    float ra[15], rb[42], rs = 0, rc[7];
    const StTensor* t = st_find(f, "layer.a");
    EXPECT(t && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 5, "shape a");
    EXPECT(t && st_read_f32(f, t, ra, &e) == 0 && memcmp(ra, a, sizeof a) == 0, "data a %s", e.msg);
    t = st_find(f, "b \"quoted\"\\name");
    EXPECT(t && t->ndim == 3 && st_read_f32(f, t, rb, &e) == 0 && memcmp(rb, b, sizeof b) == 0, "data b");
    t = st_find(f, "scalar");
    EXPECT(t && t->ndim == 0 && t->numel == 1 && st_read_f32(f, t, &rs, &e) == 0 && rs == s, "scalar");
    t = st_find(f, "empty");
    EXPECT(t && t->numel == 0 && t->begin == t->end, "empty tensor");
    t = st_find(f, "c");
    EXPECT(t && st_read_f32(f, t, rc, &e) == 0 && memcmp(rc, c, sizeof c) == 0, "data c");
    EXPECT(st_find(f, "missing") == NULL, "missing found");
    st_close(f);
}

static void test_roundtrip_bf16_f16(void) {
    enum { N = 3 * 1000 + 17 };  // odd, and not a multiple of the conversion chunk
    float* x = xmalloc(sizeof(float) * N);
    float* y = xmalloc(sizeof(float) * N);
    fill(x, N, 7);
    x[0] = 1e30f; x[1] = -1e-30f; x[2] = 65504.0f; x[3] = 1e-6f; x[4] = 0.0f; x[5] = -0.0f;
    int64_t s1[] = {N};
    Err e = {{0}};
    StWriter* w = st_writer_new();
    EXPECT(st_writer_add(w, "bf", ST_BF16, 1, s1, x, &e) == 0, "%s", e.msg);
    EXPECT(st_writer_add(w, "hf", ST_F16, 1, s1, x, &e) == 0, "%s", e.msg);
    const char* p = tpath("bf.safetensors");
    EXPECT(st_writer_write(w, p, NULL, &e) == 0, "%s", e.msg);
    st_writer_free(w);
    StFile* f;
    EXPECT(st_open(&f, p, &e) == 0, "%s", e.msg);
    if (!f) { free(x); free(y); return; }
    const StTensor* t = st_find(f, "bf");
    EXPECT(t && t->dtype == ST_BF16 && t->end - t->begin == 2 * N, "bf16 tensor");
    int bad = 0;
    if (t && st_read_f32(f, t, y, &e) == 0)
        for (int i = 0; i < N; i++) bad += memcmp(&y[i], &(float){bf16_to_f32(f32_to_bf16(x[i]))}, 4) != 0;
    EXPECT(bad == 0, "%d bf16 values differ from rounding", bad);
    t = st_find(f, "hf");
    bad = 0;
    if (t && st_read_f32(f, t, y, &e) == 0)
        for (int i = 0; i < N; i++) bad += memcmp(&y[i], &(float){st_f16_to_f32(st_f32_to_f16(x[i]))}, 4) != 0;
    EXPECT(bad == 0, "%d f16 values differ from rounding", bad);
    EXPECT(y[0] == INFINITY && y[2] == 65504.0f && y[4] == 0 && signbit(y[5]), "f16 specials %g %g", y[0], y[2]);
    st_close(f);
    free(x);
    free(y);
}

// Every finite half survives f16 → f32 → f16; rounding at a few known points.
static void test_f16_conversion(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN
        if (st_f32_to_f16(st_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    EXPECT(bad == 0, "%d halves do not round trip", bad);
    EXPECT(st_f16_to_f32(0x3c00) == 1.0f && st_f16_to_f32(0x0001) == 5.9604644775390625e-08f, "known halves");
    EXPECT(st_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00, "tie rounds to even (down)");
    EXPECT(st_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02, "tie rounds to even (up)");
    EXPECT(st_f32_to_f16(65520.0f) == 0x7c00 && st_f32_to_f16(65519.0f) == 0x7bff, "overflow to inf");
    EXPECT((st_f32_to_f16(NAN) & 0x7fff) > 0x7c00, "NaN stays NaN");
}

typedef struct Bad {
    const char* what;
    const char* header;
    uint64_t hlen;  // UINT64_MAX = the header's length
    size_t data;
    const char* msg;  // expected substring
} Bad;

static void test_malformed(void) {
    const Bad cases[] = {
        {"truncated header", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 200, 0, "exceeds the file"},
        {"huge header length", "{}", 1ull << 40, 0, "over the"},
        {"offsets out of range", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", UINT64_MAX, 8, "past the end of the data buffer"},
        {"overlapping", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", UINT64_MAX, 16, "overlap"},
        {"bad dtype", "{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", UINT64_MAX, 8, "unknown dtype 'F31'"},
        {"shape/size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", UINT64_MAX, 8, "span 8 bytes"},
        {"bad JSON", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,],\"data_offsets\":[0,8]}}", UINT64_MAX, 8, "header JSON"},
        {"duplicate names", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", UINT64_MAX, 8, "duplicate tensor name 'a'"},
        {"begin after end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", UINT64_MAX, 8, "end before they begin"},
        {"negative shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", UINT64_MAX, 8, "non-negative integer"},
        {"float offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.5]}}", UINT64_MAX, 8, "data_offsets"},
        {"missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", UINT64_MAX, 8, "\"shape\""},
        {"shape overflow", "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", UINT64_MAX, 8, "overflows"},
        {"root not an object", "[1, 2]", UINT64_MAX, 0, "not an object"},
        {"metadata not strings", "{\"__metadata__\":{\"format\":3}}", UINT64_MAX, 0, "not a string"},
        {"trailing garbage", "{} x", UINT64_MAX, 0, "after the JSON value"},
        {"deep nesting", "{\"__metadata__\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}", UINT64_MAX, 0, "nesting deeper"},
        {"bad escape", "{\"a\\q\":{}}", UINT64_MAX, 0, "bad escape"},
        {"NUL escape", "{\"a\\u0000\":{}}", UINT64_MAX, 0, "\\u0000"},
        {"tiny header", "", 0, 0, "too small"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const Bad* c = &cases[i];
        const char* p = tpath("bad.safetensors");
        write_raw(p, c->header, c->hlen, c->data);
        StFile* f = NULL;
        Err e = {{0}};
        int rc = st_open(&f, p, &e);
        EXPECT(rc == -1 && f == NULL, "%s: accepted", c->what);
        EXPECT(strstr(e.msg, c->msg) != NULL, "%s: message '%s' lacks '%s'", c->what, e.msg, c->msg);
        EXPECT(strstr(e.msg, p) != NULL, "%s: message '%s' does not name the file", c->what, e.msg);
        if (f) st_close(f);
    }
    // Shorter than the 8-byte length.
    const char* p = tpath("short.safetensors");
    FILE* f = fopen(p, "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    StFile* sf = NULL;
    Err e = {{0}};
    EXPECT(st_open(&sf, p, &e) == -1 && strstr(e.msg, "too short"), "short file: %s", e.msg);
    EXPECT(st_open(&sf, tpath("nonexistent"), &e) == -1 && strstr(e.msg, "cannot open"), "missing: %s", e.msg);
}

// A valid file cut short: the data of the last tensor is gone.
static void test_truncated_data(void) {
    float x[64];
    fill(x, 64, 5);
    int64_t s[] = {64};
    Err e = {{0}};
    StWriter* w = st_writer_new();
    st_writer_add(w, "x", ST_F32, 1, s, x, &e);
    const char* p = tpath("trunc.safetensors");
    st_writer_write(w, p, NULL, &e);
    st_writer_free(w);
    struct stat st;
    stat(p, &st);
    EXPECT(truncate(p, st.st_size - 4) == 0, "truncate");
    StFile* f = NULL;
    EXPECT(st_open(&f, p, &e) == -1 && strstr(e.msg, "past the end"), "truncated data: %s", e.msg);
}

static void test_non_float_dtype(void) {
    const char* p = tpath("i64.safetensors");
    write_raw(p, "{\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}     ", UINT64_MAX, 16);
    StFile* f = NULL;
    Err e = {{0}};
    EXPECT(st_open(&f, p, &e) == 0, "I64 file rejected: %s", e.msg);
    if (!f) return;
    float y[2];
    EXPECT(st_read_f32(f, &f->t[0], y, &e) == -1 && strstr(e.msg, "I64"), "I64 read: %s", e.msg);
    st_close(f);
}

static void test_json(void) {
    JsDoc d;
    char err[200];
    const char* s = "{\"a\": [1, -2, 3.5e2, 9223372036854775807, 18446744073709551616], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\", "
                    "\"t\": true, \"f\": false, \"n\": null, \"o\": {}}";
    EXPECT(js_parse(&d, s, strlen(s), JS_DEFAULT_LIMITS, err, sizeof err) == 0, "%s", err);
    const JsVal* a = js_get(&d.root, "a");
    EXPECT(a && a->n == 5 && a->items[0].i == 1 && a->items[1].i == -2 && !a->items[2].is_int && a->items[2].num == 350.0, "numbers");
    EXPECT(a && a->items[3].is_int && a->items[3].i == INT64_MAX && !a->items[4].is_int, "big integers");
    const JsVal* str = js_get(&d.root, "s");
    EXPECT(str && strcmp(str->str, "x\xc3\xa9\xf0\x9f\x98\x80\n") == 0, "escapes decode to UTF-8");
    EXPECT(js_get(&d.root, "t")->b == 1 && js_get(&d.root, "n")->type == JS_NULL && js_get(&d.root, "o")->n == 0, "literals");
    js_free(&d);
    const char* bad[] = {"", "{", "[1 2]", "{\"a\" 1}", "01", "1.", "-", "\"abc", "tru", "{\"a\":1,}", "\"\\ud800x\"", "\"a\x01\""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        EXPECT(js_parse(&d, bad[i], strlen(bad[i]), JS_DEFAULT_LIMITS, err, sizeof err) == -1 && strstr(err, "at byte"),
               "accepted bad JSON '%s'", bad[i]);
        js_free(&d);
    }
    JsLimits lim = {64, 10};
    const char* many = "[1,2,3,4,5,6,7,8,9,10,11]";
    EXPECT(js_parse(&d, many, strlen(many), lim, err, sizeof err) == -1 && strstr(err, "more than"), "node limit: %s", err);
    js_free(&d);
    Sb b = {0};
    sb_json_float(&b, 1e-5f);
    sb_putc(&b, ' ');
    sb_json_float(&b, 1e6f);
    sb_putc(&b, ' ');
    sb_json_float(&b, 0.02f);
    EXPECT(strcmp(b.s, "1e-05 1000000.0 0.02") == 0, "floats '%s'", b.s);
    sb_free(&b);
}

int main(void) {
    const char* tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/test_st_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    RUN(test_roundtrip_f32);
    RUN(test_roundtrip_bf16_f16);
    RUN(test_f16_conversion);
    RUN(test_malformed);
    RUN(test_truncated_data);
    RUN(test_non_float_dtype);
    RUN(test_json);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_END();
}
