// mpi_ckpt_stream.c — the streamed trainer_save under mpirun -np 2 (CPU, a tiny model with many
// tensors, trained 2 steps so the Adam moments are not zero), at EP=2 and at EP=1 × EDP=2 with
// ZeRO-1 on and off:
//   identical   the streamed save writes the same bytes (every rank file, trainer_state.yaml,
//               manifest.txt) as ckpt_save of the same tensors staged whole in host memory
//               (the previous trainer_save, kept here as ref_save)
//   memory      the host memory trainer_save allocates (every malloc / calloc / realloc of the
//               process, counted by the interposed allocator below) peaks at ≤ 2 × the largest
//               tensor + 512 KiB, far below ref_save's 3 × owned parameters × 4 bytes
//   failure     a write that fails on one rank (RLIMIT_FSIZE: EFBIG), in the header or in the
//               middle of the tensor data, on rank 0 or rank 1: every rank returns -1 naming
//               that rank, within seconds; no temporary and no `latest` are left
#define _GNU_SOURCE
#include <malloc.h>
#include <mpi.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "comm.h"
#include "mpi_test.h"
#include "test_resume_util.h"
#include "train.h"

// ---- counting allocator (glibc's own entry points underneath) ---------------------------------
extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);
extern void __libc_free(void*);

static _Atomic long long g_cur, g_peak;

static void note_alloc(void* p) {
    if (!p) return;
    long long c = atomic_fetch_add(&g_cur, (long long)malloc_usable_size(p)) + (long long)malloc_usable_size(p);
    long long pk = atomic_load(&g_peak);
    while (c > pk && !atomic_compare_exchange_weak(&g_peak, &pk, c)) {}
}
static void note_free(void* p) {
    if (p) atomic_fetch_sub(&g_cur, (long long)malloc_usable_size(p));
}
void* malloc(size_t n) {
    void* p = __libc_malloc(n);
    note_alloc(p);
    return p;
}
void* calloc(size_t a, size_t b) {
    void* p = __libc_calloc(a, b);
    note_alloc(p);
    return p;
}
void* realloc(void* q, size_t n) {
    note_free(q);
    void* p = __libc_realloc(q, n);
    note_alloc(p ? p : (n ? q : NULL));
    return p;
}
void free(void* p) {
    note_free(p);
    __libc_free(p);
}
void* memalign(size_t a, size_t n) {
    void* p = __libc_memalign(a, n);
    note_alloc(p);
    return p;
}
void* aligned_alloc(size_t a, size_t n) { return memalign(a, n); }
int posix_memalign(void** out, size_t a, size_t n) {
    void* p = memalign(a, n);
    if (!p) return 12;  // ENOMEM
    *out = p;
    return 0;
}

// Host bytes allocated above the level at the start, at the peak, while fn runs.
static long long g_base;
static void peak_start(void) {
    g_base = atomic_load(&g_cur);
    atomic_store(&g_peak, g_base);
}
static long long peak_bytes(void) { return atomic_load(&g_peak) - g_base; }

// ---- the previous trainer_save: everything staged in host memory, then ckpt_save ---------------
static const char* const OPT_PREFIX[3] = {"", "optim.exp_avg.", "optim.exp_avg_sq."};

static int owns(const Trainer* t, const ParamInfo* p) {
    const OptShard* s = &t->opt.sh[p->arena];
    const size_t part = t->model.padded[p->arena] / (size_t)s->gsize;
    return (int)(p->offset / part) == s->grank;
}

static int ref_save(Trainer* t, const char* dir, const char* state, Err* e) {
    Model* m = &t->model;
    Backend* be = m->be;
    int n_own = 0;
    size_t total = 0;
    for (int i = 0; i < m->pl.n; i++)
        if (owns(t, &m->pl.p[i])) n_own++, total += m->pl.p[i].numel;
    CkptTensor* ct = xcalloc((size_t)(3 * n_own) + 1, sizeof *ct);
    char(*names)[128] = xcalloc((size_t)(3 * n_own) + 1, sizeof *names);
    float* host = xmalloc(sizeof(float) * (3 * total + 1));
    float* dst = host;
    int k = 0;
    for (int which = 0; which < 3; which++)
        for (int a = 0; a < 2; a++) {
            optim_gather(&t->opt, m, a, which);
            for (int i = 0; i < m->pl.n; i++) {
                const ParamInfo* p = &m->pl.p[i];
                if ((int)p->arena != a || !owns(t, p)) continue;
                be->to_host(be, dst, m->grad[a] + p->offset, sizeof(float) * p->numel);
                snprintf(names[k], sizeof names[k], "%s%s", OPT_PREFIX[which], p->name);
                ct[k] = (CkptTensor){.name = names[k], .ndim = p->ndim, .data = dst};
                for (int d = 0; d < p->ndim; d++) ct[k].shape[d] = p->shape[d];
                dst += p->numel;
                k++;
            }
        }
    for (int a = 0; a < 2; a++) be->zero(be, m->grad[a], sizeof(float) * m->padded[a]);
    int rc = ckpt_save(t->comm, dir, t->step, ct, k, state, t->cfg.checkpoint.keep, e);
    free(host);
    free(names);
    free(ct);
    return rc;
}

// ---- helpers ----------------------------------------------------------------------------------

// 0 when the two files have the same bytes.
static int file_cmp(const char* a, const char* b) {
    size_t na = 0, nb = 0;
    char *x = t_slurp(a, &na), *y = t_slurp(b, &nb);
    int d = !x || !y || na != nb || memcmp(x, y, na) != 0;
    free(x);
    free(y);
    return d;
}

static int init(Trainer* t, const char* const* extra, int n, Err* e) {
    static const char* const big[] = {"model.hidden=128", "model.ffn=256", "model.experts=8", "model.layers=4",
                                      "model.vocab_size=512", "train.steps=2", "train.eval_every=0",
                                      "train.micro_batch=2"};
    const char* all[16];
    int k = 0;
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) all[k++] = big[i];
    for (int i = 0; i < n && k < 16; i++) all[k++] = extra[i];
    Config c;
    if (tiny_config(&c, all, k, e)) return -1;
    return trainer_init(t, &c, e);
}

static size_t largest_tensor_bytes(const Trainer* t) {
    size_t mx = 0;
    for (int i = 0; i < t->model.pl.n; i++) mx = t->model.pl.p[i].numel > mx ? t->model.pl.p[i].numel : mx;
    return 4 * mx;
}

static size_t owned_bytes(const Trainer* t) {
    size_t s = 0;
    for (int i = 0; i < t->model.pl.n; i++)
        if (owns(t, &t->model.pl.p[i])) s += t->model.pl.p[i].numel;
    return 4 * s;
}

static void set_dir(Trainer* t, const char* name) { snprintf(t->cfg.checkpoint.dir, sizeof t->cfg.checkpoint.dir, "%s/%s", mt_dir, name); }

// ---- tests ------------------------------------------------------------------------------------
static void identical(const char* name, const char* const* layout, int nl) {
    char d1[300];
    snprintf(d1, sizeof d1, "checkpoint.dir=%s/%s_run", mt_dir, name);
    const char* ex[8] = {d1};
    for (int i = 0; i < nl; i++) ex[1 + i] = layout[i];
    Err e = {{0}};
    Trainer T;
    EXPECT(init(&T, ex, 1 + nl, &e) == 0, "init: %s", e.msg);
    EXPECT(T.world == 2, "world %d", T.world);
    EXPECT(trainer_run(&T) == EXIT_OK && T.step == 2, "2 steps (and the final save, streamed)");
    EXPECT(T.model.pl.n >= 60, "a model with many tensors (%d)", T.model.pl.n);

    // The streamed save again, measured.
    char sa[64], sb[64];
    snprintf(sa, sizeof sa, "%s_stream", name);
    snprintf(sb, sizeof sb, "%s_ref", name);
    set_dir(&T, sa);
    MPI_Barrier(MPI_COMM_WORLD);
    peak_start();
    int rc = trainer_save(&T, &e);
    long long streamed = peak_bytes();
    EXPECT(rc == 0, "streamed save: %s", e.msg);

    // The state text of the streamed save, for the reference save.
    char p[600], q[600];
    char* state = NULL;
    size_t sn = 0;
    if (mt_rank == 0) {
        snprintf(p, sizeof p, "%s/%s/step_00000002/trainer_state.yaml", mt_dir, sa);
        state = t_slurp(p, &sn);
        EXPECT(state != NULL, "read %s", p);
    }
    set_dir(&T, sb);
    MPI_Barrier(MPI_COMM_WORLD);
    peak_start();
    rc = ref_save(&T, T.cfg.checkpoint.dir, state ? state : "", &e);
    long long staged = peak_bytes();
    EXPECT(rc == 0, "reference save: %s", e.msg);
    free(state);

    const long long largest = (long long)largest_tensor_bytes(&T), owned = (long long)owned_bytes(&T);
    const long long bound = 2 * largest + (512 << 10);
    printf("  %s rank %d: %d tensors in the model, largest %lld B, owned %lld B (x3 = %lld B); host bytes allocated at "
           "the peak: streamed %lld B, staged whole %lld B\n",
           name, mt_rank, T.model.pl.n, largest, owned, 3 * owned, streamed, staged);
    EXPECT(streamed <= bound, "rank %d: streamed save peaked at %lld host bytes > 2 x %lld + 512 KiB", mt_rank, streamed, largest);
    EXPECT(staged >= 3 * owned, "rank %d: the reference (whole) staging %lld < 3 x %lld (the counter works)", mt_rank, staged, owned);

    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0) {
        const char* files[] = {"rank_00000.safetensors", "rank_00001.safetensors", "trainer_state.yaml", "manifest.txt"};
        const char* runs[] = {"run", "stream"};
        for (int r = 0; r < 2; r++)
            for (int f = 0; f < (r ? 4 : 2); f++) {  // the run's config names another checkpoint.dir
                snprintf(p, sizeof p, "%s/%s_%s/step_00000002/%s", mt_dir, name, runs[r], files[f]);
                snprintf(q, sizeof q, "%s/%s/step_00000002/%s", mt_dir, sb, files[f]);
                EXPECT(file_cmp(p, q) == 0, "%s differs from %s", p, q);
            }
        char dd[600];
        snprintf(dd, sizeof dd, "%s/%s/latest", mt_dir, sa);
        EXPECT(access(dd, F_OK) == 0, "latest written");
    }
    trainer_free(&T);
}

static void test_identical_ep2(void) {
    const char* l[] = {"parallel.ep=2"};
    identical("ep2", l, 1);
}

static void test_identical_edp2_zero1(void) {
    const char* l[] = {"parallel.ep=1", "parallel.zero1=true"};
    identical("edp2z", l, 2);
}

static void test_identical_edp2_nozero1(void) {
    const char* l[] = {"parallel.ep=1", "parallel.zero1=false"};
    identical("edp2n", l, 2);
}

// The header length of a safetensors file + 8, or -1.
static long long header_end(const char* path) {
    FILE* f = fopen(path, "rb");
    uint64_t h = 0;
    if (!f) return -1;
    size_t k = fread(&h, 8, 1, f);
    fclose(f);
    return k == 1 ? (long long)h + 8 : -1;
}

static void test_write_failure(void) {
    char d1[300];
    snprintf(d1, sizeof d1, "checkpoint.dir=%s/fail_first", mt_dir);
    const char* ex[] = {d1, "parallel.ep=2", "train.steps=1"};
    Err e = {{0}};
    Trainer T;
    EXPECT(init(&T, ex, 3, &e) == 0, "init: %s", e.msg);
    EXPECT(trainer_run(&T) == EXIT_OK, "1 step and a save");
    char p[600];
    snprintf(p, sizeof p, "%s/fail_first/step_00000001/rank_%05d.safetensors", mt_dir, mt_rank);
    const long long hdr = header_end(p);
    EXPECT(hdr > 0, "header of %s", p);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    for (int bad = 0; bad < 2; bad++)
        for (int where = 0; where < 2; where++) {  // 0: the header cannot be written; 1: the data, mid-file
            char name[32];
            snprintf(name, sizeof name, "fail_r%d_%s", bad, where ? "data" : "header");
            set_dir(&T, name);
            MPI_Barrier(MPI_COMM_WORLD);
            if (mt_rank == bad) {
                struct rlimit lim = old;
                lim.rlim_cur = where ? (rlim_t)(hdr + 3000) : 0;
                setrlimit(RLIMIT_FSIZE, &lim);
            }
            double t0 = MPI_Wtime();
            memset(&e, 0, sizeof e);
            int rc = trainer_save(&T, &e);
            double dt = MPI_Wtime() - t0;
            if (mt_rank == bad) setrlimit(RLIMIT_FSIZE, &old);
            char want[32];
            snprintf(want, sizeof want, "rank %d", bad);
            EXPECT(rc == -1 && strstr(e.msg, want) && (strstr(e.msg, "write failed") || strstr(e.msg, "File too large")),
                   "%s: rank %d: rc %d, message '%s'", name, mt_rank, rc, e.msg);
            EXPECT(dt < 10, "%s: failed after %.1f s", name, dt);
            if (mt_rank == 0) printf("  %s: every rank returned -1 after %.2f s: %s\n", name, dt, e.msg);
            MPI_Barrier(MPI_COMM_WORLD);
            if (mt_rank == 0) {
                char q[600];
                snprintf(q, sizeof q, "%s/%s/.tmp_step_00000001", mt_dir, name);
                EXPECT(access(q, F_OK) != 0, "%s: temporary left: %s", name, q);
                snprintf(q, sizeof q, "%s/%s/latest", mt_dir, name);
                EXPECT(access(q, F_OK) != 0, "%s: latest written", name);
                snprintf(q, sizeof q, "%s/%s/step_00000001", mt_dir, name);
                EXPECT(access(q, F_OK) != 0, "%s: step directory published", name);
            }
        }
    // And the trainer still saves afterwards (the staging was left zeroed, nothing is stuck).
    set_dir(&T, "fail_after");
    EXPECT(trainer_save(&T, &e) == 0, "save after the failures: %s", e.msg);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0) {
        char a[300], b[300], msg[1100];
        snprintf(a, sizeof a, "%s/fail_first/step_00000001", mt_dir);
        snprintf(b, sizeof b, "%s/fail_after/step_00000001", mt_dir);
        int k = ckpt_diff(a, b, msg, sizeof msg);
        EXPECT(k == 0, "the save after the failures differs: %d (%s)", k, msg);
    }
    trainer_free(&T);
}

int main(int argc, char** argv) {
    mpi_test_init(&argc, &argv, "mpi_ckpt_stream");
    alarm(300);  // a hang is a failure (no summary line), not a stuck suite
    mpi_test_dir();
    MRUN(test_identical_ep2);
    MRUN(test_identical_edp2_zero1);
    MRUN(test_identical_edp2_nozero1);
    MRUN(test_write_failure);
    MPI_TEST_END();
}
