// test_ckpt.c — checkpoints on one rank (a local single-rank Comm: no MPI here, since the kill
// test forks): save/open round trip, trainer_state.yaml, corrupted / truncated / missing files
// refused naming the file, resume=auto falling back past a bad checkpoint, keep/prune, inspect,
// and a kill test (SIGKILL mid-save, repeatedly: the previous checkpoint stays the one `latest`
// names and opens; the stale temporary is removed by the next save).
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zlib.h>

#include "ckpt.h"
#include "failpoint.h"
#include "test.h"
#include "util.h"

// ---- a single-rank Comm (host helpers only) ---------------------------------------------------
static void s_gather(Comm* c, GroupId g, void* out, const void* in, size_t n) { memmove(out, in, n); }
static void s_bcast(Comm* c, GroupId g, void* buf, size_t n, int root) {}
static void s_barrier(Comm* c, GroupId g) {}
static void s_max(Comm* c, GroupId g, int32_t* buf, size_t n) {}
static void s_f64(Comm* c, GroupId g, double* buf, size_t n) {}
static Comm g_comm = {.rank = {0, 0, 0}, .size = {1, 1, 1}, .host_all_gather = s_gather, .host_broadcast = s_bcast,
                      .barrier = s_barrier, .host_all_reduce_max_i32 = s_max, .host_all_reduce_f64 = s_f64};

static char g_dir[256];

static void path(char* out, const char* a, const char* b) {
    if (snprintf(out, 1024, "%s/%s", a, b) >= 1024) FATAL("test path too long");
}

// A small tensor set with odd shapes: model tensors and optimizer state.
typedef struct Set {
    int n;
    CkptTensor t[8];
    float* buf[8];
} Set;

static void make_set(Set* s, uint64_t seed, int64_t scale) {
    static const char* names[] = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                                  "model.norm.weight", "optim.exp_avg.model.norm.weight",
                                  "optim.exp_avg_sq.model.norm.weight", "scalar.thing", "odd.4d"};
    int64_t shapes[][4] = {{13, 7}, {5, 7}, {7}, {7}, {7}, {0}, {2, 3, 1, 5}};
    int ndims[] = {2, 2, 1, 1, 1, 0, 4};
    Rng r;
    rng_seed(&r, seed);
    s->n = 7;
    for (int i = 0; i < s->n; i++) {
        CkptTensor* t = &s->t[i];
        t->name = names[i];
        t->ndim = ndims[i];
        int64_t numel = 1;
        for (int d = 0; d < 4; d++) t->shape[d] = d < t->ndim ? shapes[i][d] * (d == 0 && i == 0 ? scale : 1) : 0;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        s->buf[i] = xmalloc(sizeof(float) * (size_t)numel);
        for (int64_t k = 0; k < numel; k++) s->buf[i][k] = rng_normal(&r);
        t->data = s->buf[i];
    }
}

static void free_set(Set* s) {
    for (int i = 0; i < s->n; i++) free(s->buf[i]);
}

static const char* STATE = "step: 5\ntokens: 10\nworld: 1\nep: 1\nseed: 3\nrng: 4\n";

static int save(const char* root, int64_t step, const Set* s, int keep, Err* e) {
    return ckpt_save(&g_comm, root, step, s->t, s->n, STATE, keep, e);
}

static int count_entries(const char* dir, const char* prefix) {
    DIR* d = opendir(dir);
    int n = 0;
    struct dirent* de;
    while (d && (de = readdir(d)))
        if (strncmp(de->d_name, prefix, strlen(prefix)) == 0) n++;
    if (d) closedir(d);
    return n;
}

static void flip_byte(const char* p, long off) {
    FILE* f = fopen(p, "r+b");
    fseek(f, off, off < 0 ? SEEK_END : SEEK_SET);
    int c = fgetc(f);
    fseek(f, -1, SEEK_CUR);
    fputc(c ^ 0x20, f);
    fclose(f);
}

static void test_roundtrip(void) {
    char root[1024], p[1024];
    path(root, g_dir, "rt");
    Set s;
    make_set(&s, 1, 1);
    Err e = {{0}};
    EXPECT(save(root, 10, &s, 0, &e) == 0, "save: %s", e.msg);
    const char* opens[] = {"rt", "rt/step_00000010", "rt/latest"};
    for (int k = 0; k < 3; k++) {
        path(p, g_dir, opens[k]);
        Ckpt* ck = NULL;
        EXPECT(ckpt_open(&ck, p, &e) == 0, "open %s: %s", p, e.msg);
        if (!ck) continue;
        EXPECT(ckpt_step(ck) == 10 && ckpt_world(ck) == 1, "step %lld", (long long)ckpt_step(ck));
        EXPECT(strcmp(ckpt_trainer_state(ck), STATE) == 0, "state text");
        EXPECT(ckpt_num_tensors(ck) == s.n, "%d tensors", ckpt_num_tensors(ck));
        for (int i = 0; i < s.n; i++) {
            const CkptTensor* t = &s.t[i];
            EXPECT(ckpt_has(ck, t->name), "has %s", t->name);
            EXPECT(strcmp(ckpt_tensor_name(ck, i), t->name) == 0, "name %d in order", i);
            int64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
            float* y = xmalloc(sizeof(float) * (size_t)numel);
            EXPECT(ckpt_read(ck, t->name, y, t->ndim, t->shape, &e) == 0, "read %s: %s", t->name, e.msg);
            EXPECT(memcmp(y, t->data, sizeof(float) * (size_t)numel) == 0, "%s: data differs", t->name);
            free(y);
        }
        float y[128];
        int64_t wrong[] = {7, 13};
        EXPECT(ckpt_read(ck, "model.embed_tokens.weight", y, 2, wrong, &e) == -1 &&
                   strstr(e.msg, "model.embed_tokens.weight: shape [13, 7] in the checkpoint, [7, 13] expected"),
               "shape mismatch message: %s", e.msg);
        EXPECT(ckpt_read(ck, "nope", y, 1, wrong, &e) == -1 && strstr(e.msg, "no tensor 'nope'"), "missing: %s", e.msg);
        EXPECT(!ckpt_has(ck, "nope"), "has nope");
        ckpt_close(ck);
    }
    path(p, root, "latest");
    FILE* f = fopen(p, "r");
    char line[64] = "";
    EXPECT(f && fgets(line, sizeof line, f) && strcmp(line, "step_00000010\n") == 0, "latest = '%s'", line);
    if (f) fclose(f);
    EXPECT(count_entries(root, ".tmp") == 0, "no temporary left");
    // Bad inputs fail cleanly.
    CkptTensor bad = {.name = "x", .ndim = 5, .data = s.buf[0]};
    EXPECT(ckpt_save(&g_comm, root, 11, &bad, 1, STATE, 0, &e) == -1 && strstr(e.msg, "rank 0") && strstr(e.msg, "dimensions"),
           "ndim 5: %s", e.msg);
    CkptTensor dup[2] = {s.t[2], s.t[2]};
    EXPECT(ckpt_save(&g_comm, root, 11, dup, 2, STATE, 0, &e) == -1 && strstr(e.msg, "duplicate"), "dup: %s", e.msg);
    path(p, root, "latest");
    EXPECT(save(p, 11, &s, 0, &e) == -1 && strstr(e.msg, "not a directory"), "dir is a file: %s", e.msg);
    EXPECT(count_entries(root, "step_00000011") == 0 && count_entries(root, ".tmp") == 0, "nothing left of failed saves");
    free_set(&s);
}

static void test_trainer_state(void) {
    const char* cfg = "  indented_first: 1\nmodel:\n  hidden: 64\n  name: \"a: b # c\"\n\n# comment\nlist:\n  - 1\n  - 2\n";
    TrainerState ts = {.step = 123, .tokens = 1ll << 40, .world = 8, .ep = 4, .seed = 42, .rng = UINT64_MAX,
                       .bad_steps = 2, .loss_ema = 2.0 / 3.0, .config_yaml = cfg, .extra_yaml = "data_pos: 777\n"};
    int need = trainer_state_format(NULL, 0, &ts);
    char* buf = xmalloc((size_t)need + 1);
    EXPECT(trainer_state_format(buf, (size_t)need + 1, &ts) == need && (int)strlen(buf) == need, "format length");
    TrainerState back;
    char cb[1024];
    Err e = {{0}};
    EXPECT(trainer_state_parse(buf, &back, cb, sizeof cb, &e) == 0, "parse: %s\n%s", e.msg, buf);
    EXPECT(back.step == 123 && back.tokens == 1ll << 40 && back.world == 8 && back.ep == 4 && back.seed == 42 &&
               back.rng == UINT64_MAX && back.bad_steps == 2 && back.loss_ema == 2.0 / 3.0,
           "fields differ:\n%s", buf);
    EXPECT(strcmp(cb, cfg) == 0, "config block differs: '%s'", cb);
    char v[32];
    EXPECT(trainer_state_get(buf, "data_pos", v, sizeof v, &e) == 1 && strcmp(v, "777") == 0, "extra key");
    EXPECT(trainer_state_get(buf, "nope", v, sizeof v, &e) == 0, "absent key");
    ts.loss_ema = NAN;
    ts.config_yaml = NULL;
    trainer_state_format(buf, (size_t)need + 1, &ts);
    EXPECT(trainer_state_parse(buf, &back, cb, sizeof cb, &e) == 0 && isnan(back.loss_ema) && cb[0] == 0, "NaN ema: %s", e.msg);
    EXPECT(trainer_state_parse(buf, &back, cb, 4, &e) == 0, "small buffer, no config");
    EXPECT(trainer_state_parse("step: 1\ntokens: 2\nworld: 1\nep: 1\nseed: 1\n", &back, cb, sizeof cb, &e) == -1 &&
               strstr(e.msg, "missing 'rng'"), "missing key: %s", e.msg);
    EXPECT(trainer_state_parse("step: x\n", &back, cb, sizeof cb, &e) == -1 && strstr(e.msg, "step"), "bad int: %s", e.msg);
    EXPECT(trainer_state_parse("step: [1\n", &back, cb, sizeof cb, &e) == -1 && strstr(e.msg, "line"), "bad yaml: %s", e.msg);
    free(buf);
}

// Damage one file of a good checkpoint; ckpt_open must refuse it naming that file.
static void test_corruption(void) {
    typedef struct { const char* file; int kind; const char* msg; } Case;  // kind 0 flip, 1 truncate, 2 delete
    const Case cases[] = {
        {"rank_00000.safetensors", 0, "crc32c"},    {"rank_00000.safetensors", 1, "the manifest says"},
        {"rank_00000.safetensors", 2, "missing"},   {"trainer_state.yaml", 0, "crc32c"},
        {"manifest.txt", 0, "manifest"},            {"manifest.txt", 1, "manifest"},
    };
    Set s;
    make_set(&s, 2, 1);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char root[1024], dir[1024], p[1024], name[64];
        snprintf(name, sizeof name, "corrupt%zu", i);
        path(root, g_dir, name);
        Err e = {{0}};
        EXPECT(save(root, 3, &s, 0, &e) == 0, "save: %s", e.msg);
        path(dir, root, "step_00000003");
        path(p, dir, cases[i].file);
        struct stat st;
        stat(p, &st);
        if (cases[i].kind == 0) flip_byte(p, st.st_size / 2 + 3);
        if (cases[i].kind == 1) EXPECT(truncate(p, st.st_size - 5) == 0, "truncate");
        if (cases[i].kind == 2) unlink(p);
        Ckpt* ck = NULL;
        EXPECT(ckpt_open(&ck, root, &e) == -1 && !ck, "case %zu: damaged checkpoint opened", i);
        EXPECT(strstr(e.msg, cases[i].file) && strstr(e.msg, cases[i].msg), "case %zu: message '%s'", i, e.msg);
        char out[8192] = "";
        FILE* f = fmemopen(out, sizeof out, "w");
        EXPECT(ckpt_inspect(root, f, &e) == 1, "case %zu: inspect says OK", i);
        fclose(f);
        EXPECT(strstr(out, "BAD"), "inspect output lacks BAD:\n%s", out);
    }
    free_set(&s);
}

static uint32_t zlib_file_crc(const char* p) {
    FILE* f = fopen(p, "rb");
    uLong c = crc32_z(0, NULL, 0);
    unsigned char buf[4096];
    size_t k;
    while (f && (k = fread(buf, 1, sizeof buf, f)) > 0) c = crc32_z(c, buf, k);
    if (f) fclose(f);
    return (uint32_t)c;
}

// A checkpoint written before CRC-32C: manifest version 1, zlib crc32 per file, no checksum
// line. It opens and verifies; a damaged file is still caught (by zlib's crc32).
static void test_v1_manifest(void) {
    char root[1024], dir[1024], p[1024];
    path(root, g_dir, "v1");
    Set s;
    make_set(&s, 5, 3);
    Err e = {{0}};
    EXPECT(save(root, 4, &s, 0, &e) == 0, "save: %s", e.msg);
    path(dir, root, "step_00000004");
    path(p, dir, "manifest.txt");
    char* text = NULL;
    {
        FILE* f = fopen(p, "r");
        char line[512];
        size_t cap = 0;
        FILE* o = open_memstream(&text, &cap);
        while (f && fgets(line, sizeof line, f)) {
            EXPECT(strncmp(line, "moetrain-checkpoint", 19) != 0 || strcmp(line, "moetrain-checkpoint 2\n") == 0,
                   "written manifest version: %s", line);
            EXPECT(strncmp(line, "checksum", 8) != 0 || strcmp(line, "checksum crc32c\n") == 0, "checksum line: %s", line);
            char name[128], fp[1024];
            unsigned long long bytes;
            unsigned c;
            if (!strcmp(line, "moetrain-checkpoint 2\n")) fputs("moetrain-checkpoint 1\n", o);
            else if (!strncmp(line, "checksum ", 9) || !strncmp(line, "crc32 ", 6)) continue;
            else if (sscanf(line, "file %127s %llu %8x", name, &bytes, &c) == 3) {
                path(fp, dir, name);
                fprintf(o, "file %s %llu %08x\n", name, bytes, zlib_file_crc(fp));
            } else fputs(line, o);
        }
        if (f) fclose(f);
        fclose(o);
        uint32_t mc = (uint32_t)crc32_z(crc32_z(0, NULL, 0), (const unsigned char*)text, strlen(text));
        f = fopen(p, "w");
        fprintf(f, "%scrc32 %08x\n", text, mc);
        fclose(f);
        free(text);
    }
    Ckpt* ck = NULL;
    EXPECT(ckpt_open(&ck, root, &e) == 0, "version 1 manifest: %s", e.msg);
    if (ck) {
        float* y = xmalloc(sizeof(float) * 13 * 3 * 7);
        EXPECT(ckpt_read(ck, s.t[0].name, y, s.t[0].ndim, s.t[0].shape, &e) == 0 &&
                   memcmp(y, s.buf[0], sizeof(float) * 13 * 3 * 7) == 0, "read: %s", e.msg);
        free(y);
        ckpt_close(ck);
    }
    char out[8192] = "";
    FILE* f = fmemopen(out, sizeof out, "w");
    EXPECT(ckpt_inspect(root, f, &e) == 0, "inspect: %s", e.msg);
    fclose(f);
    EXPECT(strstr(out, "crc32 ") && strstr(out, "OK") && !strstr(out, "crc32c"), "inspect of a v1 checkpoint:\n%s", out);
    path(p, dir, "rank_00000.safetensors");
    flip_byte(p, 200);
    EXPECT(ckpt_open(&ck, root, &e) == -1 && strstr(e.msg, "rank_00000.safetensors: crc32 "), "damaged v1: %s", e.msg);
    // A checksum this build does not know is refused, not skipped.
    path(p, dir, "manifest.txt");
    {
        const char* t2 = "moetrain-checkpoint 2\nstep 4\nworld 1\nchecksum sha9\n";
        uint32_t mc = (uint32_t)crc32_z(crc32_z(0, NULL, 0), (const unsigned char*)t2, strlen(t2));
        FILE* g = fopen(p, "w");
        fprintf(g, "%scrc32 %08x\n", t2, mc);
        fclose(g);
    }
    EXPECT(ckpt_open(&ck, root, &e) == -1 && strstr(e.msg, "unknown checksum 'sha9'"), "unknown checksum: %s", e.msg);
    free_set(&s);
}

static void test_auto_fallback(void) {
    char root[1024], p[1024], dir[1024], note[2048];
    path(root, g_dir, "auto");
    Err e = {{0}};
    EXPECT(ckpt_find_resume(root, dir, sizeof dir, note, sizeof note, &e) == 0, "no root: none");
    mkdir(root, 0755);
    EXPECT(ckpt_find_resume(root, dir, sizeof dir, note, sizeof note, &e) == 0, "empty root: none");
    Set s;
    make_set(&s, 3, 1);
    for (int st = 1; st <= 3; st++) EXPECT(save(root, st, &s, 0, &e) == 0, "save %d: %s", st, e.msg);
    EXPECT(ckpt_find_resume(root, dir, sizeof dir, note, sizeof note, &e) == 1 && strstr(dir, "step_00000003") && !note[0],
           "latest: %s (%s)", dir, note);
    path(p, root, "step_00000003/rank_00000.safetensors");
    flip_byte(p, -3);
    EXPECT(ckpt_find_resume(root, dir, sizeof dir, note, sizeof note, &e) == 1, "fallback: %s", e.msg);
    EXPECT(strstr(dir, "step_00000002"), "fell back to %s", dir);
    EXPECT(strstr(note, "step_00000003") && strstr(note, "crc32") && strstr(note, "resuming from step_00000002"), "note: %s", note);
    path(p, root, "latest");
    unlink(p);
    EXPECT(ckpt_find_resume(root, dir, sizeof dir, note, sizeof note, &e) == 1 && strstr(dir, "step_00000002") &&
               strstr(note, "latest is missing"), "no latest: %s / %s", dir, note);
    // A newer complete step than latest: latest wins, the note says so.
    FILE* f = fopen(p, "w");
    fputs("step_00000001\n", f);
    fclose(f);
    EXPECT(ckpt_find_resume(root, dir, sizeof dir, note, sizeof note, &e) == 1 && strstr(dir, "step_00000001") &&
               strstr(note, "step_00000003 (not verified) is newer than latest"), "stale latest: %s / %s", dir, note);
    // Everything damaged: an error, not a fresh start that says nothing.
    for (int st = 1; st <= 2; st++) {
        char q[64];
        snprintf(q, sizeof q, "step_%08d/trainer_state.yaml", st);
        path(p, root, q);
        flip_byte(p, 2);
    }
    EXPECT(ckpt_find_resume(root, dir, sizeof dir, note, sizeof note, &e) == -1 && strstr(e.msg, "no complete checkpoint"),
           "all bad: %s", e.msg);
    free_set(&s);
}

static void test_keep(void) {
    char root[1024], p[1024];
    path(root, g_dir, "keep");
    Set s;
    make_set(&s, 4, 1);
    Err e = {{0}};
    for (int st = 1; st <= 5; st++) EXPECT(save(root, st * 10, &s, 2, &e) == 0, "save: %s", e.msg);
    EXPECT(count_entries(root, "step_") == 2, "%d kept", count_entries(root, "step_"));
    path(p, root, "step_00000040");
    struct stat st;
    EXPECT(stat(p, &st) == 0, "step 40 kept");
    path(p, root, "step_00000050");
    EXPECT(stat(p, &st) == 0, "step 50 kept");
    EXPECT(count_entries(root, ".trash") == 0 && count_entries(root, ".tmp") == 0, "no leftovers");
    // Saving the newest step again replaces it; keep=0 keeps everything.
    s.buf[2][0] = 99.0f;
    EXPECT(save(root, 50, &s, 0, &e) == 0, "resave: %s", e.msg);
    Ckpt* ck;
    float y[7];
    int64_t sh[] = {7};
    EXPECT(ckpt_open(&ck, root, &e) == 0 && ckpt_read(ck, "model.norm.weight", y, 1, sh, &e) == 0 && y[0] == 99.0f,
           "resaved data: %s", e.msg);
    if (ck) ckpt_close(ck);
    for (int k = 6; k <= 8; k++) save(root, k * 10, &s, 0, &e);
    EXPECT(count_entries(root, "step_") == 5, "keep=0 kept %d", count_entries(root, "step_"));
    free_set(&s);
}

static void test_inspect_ok(void) {
    char root[1024];
    path(root, g_dir, "rt");
    char out[8192] = "";
    FILE* f = fmemopen(out, sizeof out, "w");
    Err e = {{0}};
    int rc = ckpt_inspect(root, f, &e);
    fclose(f);
    EXPECT(rc == 0, "inspect rc %d: %s\n%s", rc, e.msg, out);
    EXPECT(strstr(out, "step 10") && strstr(out, "rank_00000.safetensors") && strstr(out, "OK") &&
               strstr(out, "model") && strstr(out, "optim") && strstr(out, "model.embed_tokens.weight"),
           "inspect output:\n%s", out);
    EXPECT(ckpt_inspect(g_dir, stdout, &e) == -1 && strstr(e.msg, "neither"), "not a checkpoint: %s", e.msg);
}

// Runs a save of `step` in a child that is SIGKILLed: at failpoint `at` (ckpt.crash_at),
// or, with at == NULL, after delay_s. Returns 1 when the child was killed, 0 when it finished.
static int killed_save(const char* root, int64_t step, const Set* s, const char* at, double delay_s) {
    pid_t pid = fork();
    if (pid == 0) {
        if (at) failpoint_set("ckpt.crash_at", at);
        Err ce;
        _exit(save(root, step, s, 0, &ce) == 0 ? 0 : 1);
    }
    if (!at) {
        usleep((useconds_t)(delay_s * 1e6));
        kill(pid, SIGKILL);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) ? 1 : WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

// After a killed save: resume finds `good`, or the new step when the kill came after `latest`
// moved (then good becomes step); the root opens and its data is intact.
static void check_after_kill(const char* root, const Set* s, int64_t step, int64_t* good, const char* what) {
    char dir[1024], note[2048];
    Err e = {{0}};
    int rc = ckpt_find_resume(root, dir, sizeof dir, note, sizeof note, &e);
    int64_t got = rc == 1 ? atoll(strrchr(dir, '_') + 1) : -1;
    EXPECT(rc == 1 && (got == *good || got == step), "%s: resume rc %d dir %s (want step %lld): %s", what, rc, dir,
           (long long)*good, e.msg);
    if (got == step) *good = step;
    Ckpt* ck = NULL;
    EXPECT(ckpt_open(&ck, root, &e) == 0 && ckpt_step(ck) == *good, "%s: latest opens: %s", what, e.msg);
    if (!ck) return;
    size_t n = (size_t)(s->t[0].shape[0] * s->t[0].shape[1]);
    float* y = xmalloc(sizeof(float) * n);
    EXPECT(ckpt_read(ck, s->t[0].name, y, 2, s->t[0].shape, &e) == 0 && memcmp(y, s->buf[0], 4 * n) == 0, "%s: data: %s",
           what, e.msg);
    free(y);
    ckpt_close(ck);
}

// SIGKILL a child mid-save: at each failpoint of the protocol, then after random delays.
// Afterwards `latest` always names a checkpoint that verifies: the previous one, or the new
// one once `latest` was moved to it.
static void test_kill(void) {
    char root[1024], what[64];
    path(root, g_dir, "kill");
    Set s;
    make_set(&s, 5, 80000);  // embed [1040000, 7] ≈ 29 MB
    Err e = {{0}};
    double t0 = now_sec();
    EXPECT(save(root, 1, &s, 0, &e) == 0, "first save: %s", e.msg);
    double T = now_sec() - t0;
    int64_t good = 1, step = 2;
    static const char* points[] = {"written", "manifest", "renamed", "latest_tmp", "latest"};
    static const int64_t expect_new[] = {0, 0, 0, 0, 1};  // does resume see the new step afterwards?
    for (int i = 0; i < 5; i++, step++) {
        int64_t before = good;
        EXPECT(killed_save(root, step, &s, points[i], 0) == 1, "failpoint %s: child not killed", points[i]);
        snprintf(what, sizeof what, "failpoint %s", points[i]);
        check_after_kill(root, &s, step, &good, what);
        if (i < 2) EXPECT(count_entries(root, ".tmp_step_") == 1, "%s: the killed save's temporary is there", what);
        EXPECT((good == step) == expect_new[i], "%s: resume at step %lld (before %lld)", what, (long long)good, (long long)before);
    }
    int killed = 0;
    Rng r;
    rng_seed(&r, 99);
    for (int trial = 0; trial < 6; trial++, step++) {
        int k = killed_save(root, step, &s, NULL, rng_uniform(&r) * 0.9 * T);
        killed += k == 1;
        if (k == 0) good = step;
        snprintf(what, sizeof what, "random kill %d", trial);
        check_after_kill(root, &s, step, &good, what);
    }
    EXPECT(killed >= 2, "only %d of 6 saves were killed (timing)", killed);
    printf("  kill test: save %.0f ms, 5 failpoints, %d of 6 random kills landed mid-save\n", T * 1e3, killed);
    EXPECT(save(root, 100, &s, 0, &e) == 0, "save after kills: %s", e.msg);
    EXPECT(count_entries(root, ".tmp") == 0 && count_entries(root, ".trash") == 0, "stale temporaries removed by the next save");
    free_set(&s);
}

int main(void) {
    const char* tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/test_ckpt_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    RUN(test_roundtrip);
    RUN(test_trainer_state);
    RUN(test_corruption);
    RUN(test_v1_manifest);
    RUN(test_auto_fallback);
    RUN(test_keep);
    RUN(test_inspect_ok);
    RUN(test_kill);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_END();
}
