// test_ckpt_stream.c — the streaming pieces on one rank (a local single-rank Comm, no MPI):
// st_writer_begin / _put / _end write the same bytes as st_writer_write (F32, BF16, F16, a
// fill function, an empty tensor); ckpt_save_begin / _append / _finish write the same step
// directory as ckpt_save, from one reused buffer; too few or too many appends, a begin that
// fails and a file that cannot be written all fail cleanly (no temporary, no `latest`).
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "crc32c.h"
#include "safetensors.h"
#include "test.h"
#include "util.h"

static void s_gather(Comm* c, GroupId g, void* out, const void* in, size_t n) { memmove(out, in, n); }
static void s_bcast(Comm* c, GroupId g, void* buf, size_t n, int root) {}
static void s_barrier(Comm* c, GroupId g) {}
static void s_max(Comm* c, GroupId g, int32_t* buf, size_t n) {}
static void s_f64(Comm* c, GroupId g, double* buf, size_t n) {}
static Comm g_comm = {.rank = {0, 0, 0}, .size = {1, 1, 1}, .host_all_gather = s_gather, .host_broadcast = s_bcast,
                      .barrier = s_barrier, .host_all_reduce_max_i32 = s_max, .host_all_reduce_f64 = s_f64};

static char g_dir[256];

static int same_file(const char* a, const char* b) {
    size_t na = 0, nb = 0;
    char *x = t_slurp(a, &na), *y = t_slurp(b, &nb);
    int ok = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return ok;
}

static int fill(void* ctx, int tag, float* dst, uint64_t n, Err* e) {
    for (uint64_t i = 0; i < n; i++) dst[i] = (float)tag + 0.5f * (float)i;
    return 0;
}

static void test_writer_stream(void) {
    float a[12], b[6];
    for (int i = 0; i < 12; i++) a[i] = 0.1f * (float)i - 0.3f;
    for (int i = 0; i < 6; i++) b[i] = 1e3f * (float)i + 0.7f;
    int64_t sa[] = {3, 4}, sb[] = {6}, s0[] = {0, 5}, sf[] = {2, 2};
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/whole.safetensors", g_dir);
    snprintf(p2, sizeof p2, "%s/stream.safetensors", g_dir);
    Err e = {{0}};
    StWriteInfo i1 = {0}, i2 = {0};
    StWriter* w = st_writer_new();
    st_writer_meta(w, "format", "pt");
    EXPECT(st_writer_add(w, "a", ST_F32, 2, sa, a, &e) == 0 && st_writer_add(w, "b", ST_BF16, 1, sb, b, &e) == 0 &&
               st_writer_add(w, "empty", ST_F32, 2, s0, NULL, &e) == 0 &&
               st_writer_add_fn(w, "f", ST_F16, 2, sf, fill, NULL, 3, &e) == 0 &&
               st_writer_add(w, "b16", ST_F16, 1, sb, b, &e) == 0,
           "add: %s", e.msg);
    EXPECT(st_writer_write(w, p1, &i1, &e) == 0, "write: %s", e.msg);
    st_writer_free(w);
    w = st_writer_new();
    st_writer_meta(w, "format", "pt");
    EXPECT(st_writer_add_later(w, "a", ST_F32, 2, sa, &e) == 0 && st_writer_add_later(w, "b", ST_BF16, 1, sb, &e) == 0 &&
               st_writer_add_later(w, "empty", ST_F32, 2, s0, &e) == 0 &&
               st_writer_add_fn(w, "f", ST_F16, 2, sf, fill, NULL, 3, &e) == 0 &&
               st_writer_add_later(w, "b16", ST_F16, 1, sb, &e) == 0,
           "add_later: %s", e.msg);
    EXPECT(st_writer_begin(w, p2, &e) == 0, "begin: %s", e.msg);
    EXPECT(st_writer_add_later(w, "late", ST_F32, 1, sb, &e) == -1 && strstr(e.msg, "after st_writer_begin"), "add after begin: %s", e.msg);
    float buf[12];
    memcpy(buf, a, sizeof a);
    EXPECT(st_writer_put(w, buf, &e) == 0, "put a: %s", e.msg);
    memset(buf, 0xff, sizeof buf);  // reused at once
    memcpy(buf, b, sizeof b);
    EXPECT(st_writer_put(w, buf, &e) == 0, "put b: %s", e.msg);
    EXPECT(st_writer_put(w, NULL, &e) == 0, "put empty: %s", e.msg);
    EXPECT(st_writer_put(w, NULL, &e) == 0, "put f (fill function): %s", e.msg);
    EXPECT(st_writer_put(w, b, &e) == 0, "put b16: %s", e.msg);
    EXPECT(st_writer_end(w, &i2, &e) == 0, "end: %s", e.msg);
    st_writer_free(w);
    EXPECT(same_file(p1, p2), "streamed file differs from the whole one");
    EXPECT(i1.bytes == i2.bytes && i1.crc32c == i2.crc32c && i1.bytes > 0, "info %llu/%08x vs %llu/%08x",
           (unsigned long long)i1.bytes, i1.crc32c, (unsigned long long)i2.bytes, i2.crc32c);
    uint32_t crc;
    uint64_t n;
    EXPECT(file_checksum(p2, CKSUM_CRC32C, &crc, &n, &e) == 0 && crc == i2.crc32c && n == i2.bytes, "running crc = file crc");

    // A later tensor without values, too few puts, or a writer freed unfinished: no file is left.
    w = st_writer_new();
    st_writer_add_later(w, "a", ST_F32, 2, sa, &e);
    st_writer_add_later(w, "b", ST_F32, 1, sb, &e);
    EXPECT(st_writer_begin(w, p2, &e) == 0, "begin: %s", e.msg);
    EXPECT(st_writer_put(w, NULL, &e) == -1 && strstr(e.msg, "no data"), "put NULL: %s", e.msg);
    EXPECT(access(p2, F_OK) != 0, "partial file removed");
    EXPECT(st_writer_put(w, b, &e) == -1 && strstr(e.msg, "earlier write failed"), "sticky: %s", e.msg);
    EXPECT(st_writer_end(w, NULL, &e) == -1, "end after a failure");
    st_writer_free(w);
    w = st_writer_new();
    st_writer_add_later(w, "a", ST_F32, 2, sa, &e);
    st_writer_add_later(w, "b", ST_F32, 1, sb, &e);
    EXPECT(st_writer_begin(w, p2, &e) == 0 && st_writer_put(w, a, &e) == 0, "begin, put: %s", e.msg);
    EXPECT(st_writer_end(w, NULL, &e) == -1 && strstr(e.msg, "1 of the 2"), "too few: %s", e.msg);
    EXPECT(access(p2, F_OK) != 0, "partial file removed (too few)");
    st_writer_free(w);
    w = st_writer_new();
    st_writer_add_later(w, "a", ST_F32, 2, sa, &e);
    EXPECT(st_writer_begin(w, p2, &e) == 0, "begin: %s", e.msg);
    st_writer_free(w);
    EXPECT(access(p2, F_OK) != 0, "freed unfinished: file removed");
}

// A set of tensors; the streamed save passes each through one reused buffer.
static void test_ckpt_stream_equals_save(void) {
    enum { N = 40 };
    CkptTensor t[N];
    char names[N][32];
    float* data[N];
    size_t largest = 0;
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "%st%02d", i % 3 ? "optim.exp_avg." : "", i);
        int64_t r = 1 + i % 7, c = 3 + (i * 5) % 11;
        t[i] = (CkptTensor){.name = names[i], .ndim = i % 5 == 4 ? 1 : 2, .shape = {r, c}};
        if (t[i].ndim == 1) t[i].shape[1] = 0;
        size_t n = (size_t)(t[i].ndim == 1 ? r : r * c);
        largest = n > largest ? n : largest;
        data[i] = xmalloc(sizeof(float) * n);
        for (size_t k = 0; k < n; k++) data[i][k] = (float)i * 0.01f + (float)k * 1.5f - 7.0f;
        t[i].data = data[i];
    }
    const char* STATE = "step: 3\ntokens: 1\nworld: 1\nep: 1\nseed: 1\nrng: 0\n";
    char ra[512], rb[512], pa[700], pb[700];
    snprintf(ra, sizeof ra, "%s/whole", g_dir);
    snprintf(rb, sizeof rb, "%s/stream", g_dir);
    Err e = {{0}};
    EXPECT(ckpt_save(&g_comm, ra, 3, t, N, STATE, 0, &e) == 0, "ckpt_save: %s", e.msg);
    CkptTensor d[N];
    memcpy(d, t, sizeof d);
    for (int i = 0; i < N; i++) d[i].data = NULL;  // begin needs names and shapes only
    CkptSave* s = NULL;
    EXPECT(ckpt_save_begin(&s, &g_comm, rb, 3, d, N, STATE, 0, &e) == 0 && s, "begin: %s", e.msg);
    float* buf = xmalloc(sizeof(float) * largest);
    for (int i = 0; i < N && s; i++) {
        size_t n = (size_t)(t[i].ndim == 1 ? t[i].shape[0] : t[i].shape[0] * t[i].shape[1]);
        memcpy(buf, data[i], sizeof(float) * n);
        EXPECT(ckpt_save_append(s, buf) == 0, "append %d", i);
        memset(buf, 0xa5, sizeof(float) * largest);
    }
    if (s) EXPECT(ckpt_save_finish(s, &e) == 0, "finish: %s", e.msg);
    free(buf);
    const char* files[] = {"rank_00000.safetensors", "trainer_state.yaml", "manifest.txt"};
    for (int f = 0; f < 3; f++) {
        snprintf(pa, sizeof pa, "%s/step_00000003/%s", ra, files[f]);
        snprintf(pb, sizeof pb, "%s/step_00000003/%s", rb, files[f]);
        EXPECT(same_file(pa, pb), "%s differs", files[f]);
    }
    snprintf(pa, sizeof pa, "%s/latest", ra);
    snprintf(pb, sizeof pb, "%s/latest", rb);
    EXPECT(same_file(pa, pb), "latest differs");

    // Too few appends / too many: -1, nothing published.
    for (int mode = 0; mode < 2; mode++) {
        s = NULL;
        EXPECT(ckpt_save_begin(&s, &g_comm, rb, 4 + mode, d, N, STATE, 0, &e) == 0, "begin: %s", e.msg);
        if (!s) continue;
        int k = mode ? N + 1 : N - 1, r = 0;
        for (int i = 0; i < k; i++) r |= ckpt_save_append(s, data[i < N ? i : 0]);
        EXPECT(mode ? r == -1 : r == 0, "append return (mode %d)", mode);
        EXPECT(ckpt_save_finish(s, &e) == -1 && strstr(e.msg, "rank 0") &&
                   strstr(e.msg, mode ? "more tensors put" : "39 of the 40"),
               "mode %d: %s", mode, e.msg);
        snprintf(pa, sizeof pa, "%s/.tmp_step_%08d", rb, 4 + mode);
        EXPECT(access(pa, F_OK) != 0, "temporary removed (mode %d)", mode);
        snprintf(pa, sizeof pa, "%s/step_%08d", rb, 4 + mode);
        EXPECT(access(pa, F_OK) != 0, "nothing published (mode %d)", mode);
    }
    // Begin fails: no handle.
    s = (CkptSave*)1;
    EXPECT(ckpt_save_begin(&s, &g_comm, "", 3, d, N, STATE, 0, &e) == -1 && !s && strstr(e.msg, "empty"), "begin '': %s", e.msg);
    CkptTensor bad = d[0];
    bad.ndim = 7;
    EXPECT(ckpt_save_begin(&s, &g_comm, rb, 6, &bad, 1, STATE, 0, &e) == -1 && !s && strstr(e.msg, "dimensions"), "ndim: %s", e.msg);
    // The root cannot be prepared (a file is in the way): -1, no handle, step 3 still latest.
    snprintf(pa, sizeof pa, "%s/afile", g_dir);
    FILE* f = fopen(pa, "w");
    if (f) fclose(f);
    EXPECT(ckpt_save_begin(&s, &g_comm, pa, 6, d, N, STATE, 0, &e) == -1 && !s, "root is a file: %s", e.msg);
    snprintf(pa, sizeof pa, "%s/latest", rb);
    char line[64] = "";
    f = fopen(pa, "r");
    EXPECT(f && fgets(line, sizeof line, f) && !strcmp(line, "step_00000003\n"), "latest still step 3: '%s'", line);
    if (f) fclose(f);
    for (int i = 0; i < N; i++) free(data[i]);
}

int main(void) {
    const char* tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/test_ckpt_stream_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) FATAL("mkdtemp failed");
    RUN(test_writer_stream);
    RUN(test_ckpt_stream_equals_save);
    if (!t_failed) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
    } else {
        fprintf(stderr, "test_ckpt_stream: files kept in %s\n", g_dir);
    }
    TEST_END();
}
