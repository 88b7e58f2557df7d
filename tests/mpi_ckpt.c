// mpi_ckpt.c — checkpoints over 2 MPI ranks: each rank saves disjoint tensors, every rank
// reads everything back (ckpt_open and the collective ckpt_open_comm); a failure on one rank,
// or a name held by two ranks, makes both ranks fail with the message; keep/prune and resume.
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "comm.h"
#include "mpi_test.h"
#include "util.h"

static Comm* g_comm;

// Rank r owns tensors "r<r>.t<i>" of shape [i + 2, 3 + r]; values depend on the name only.
static float val(int r, int i, size_t k) { return (float)(r * 1000 + i * 100) + 0.25f * (float)k - 3.0f; }

typedef struct Set {
    int n;
    CkptTensor t[4];
    char name[4][32];
    float* buf[4];
} Set;

static void make_set(Set* s, int r) {
    s->n = 4;
    for (int i = 0; i < 4; i++) {
        snprintf(s->name[i], sizeof s->name[i], "r%d.t%d", r, i);
        size_t n = (size_t)(i + 2) * (size_t)(3 + r);
        s->buf[i] = xmalloc(sizeof(float) * n);
        for (size_t k = 0; k < n; k++) s->buf[i][k] = val(r, i, k);
        s->t[i] = (CkptTensor){.name = s->name[i], .ndim = 2, .shape = {i + 2, 3 + r}, .data = s->buf[i]};
    }
}

static void free_set(Set* s) {
    for (int i = 0; i < s->n; i++) free(s->buf[i]);
}

static const char* STATE = "step: 1\ntokens: 1\nworld: 2\nep: 2\nseed: 1\nrng: 1\n";

static void check_all(const Ckpt* ck, const char* what) {
    Err e = {{0}};
    EXPECT(ckpt_num_tensors(ck) == 4 * mt_world, "%s: %d tensors", what, ckpt_num_tensors(ck));
    EXPECT(ckpt_world(ck) == mt_world, "%s: world %d", what, ckpt_world(ck));
    int bad = 0;
    for (int r = 0; r < mt_world; r++)
        for (int i = 0; i < 4; i++) {
            char nm[32];
            snprintf(nm, sizeof nm, "r%d.t%d", r, i);
            int64_t sh[] = {i + 2, 3 + r};
            float y[64];
            if (ckpt_read(ck, nm, y, 2, sh, &e)) { bad++; continue; }
            for (int k = 0; k < (i + 2) * (3 + r); k++) bad += y[k] != val(r, i, (size_t)k);
        }
    EXPECT(bad == 0, "%s: rank %d reads %d wrong values (%s)", what, mt_rank, bad, e.msg);
}

static void test_disjoint(void) {
    char root[512];
    snprintf(root, sizeof root, "%s/a", mt_dir);
    Set s;
    make_set(&s, mt_rank);
    Err e = {{0}};
    EXPECT(ckpt_save(g_comm, root, 5, s.t, s.n, STATE, 0, &e) == 0, "save: %s", e.msg);
    Ckpt* ck = NULL;
    EXPECT(ckpt_open(&ck, root, &e) == 0, "open: %s", e.msg);
    if (ck) {
        check_all(ck, "ckpt_open");
        EXPECT(strcmp(ckpt_trainer_state(ck), STATE) == 0, "state");
        ckpt_close(ck);
    }
    ck = NULL;
    EXPECT(ckpt_open_comm(g_comm, &ck, root, &e) == 0, "open_comm: %s", e.msg);
    if (ck) {
        check_all(ck, "ckpt_open_comm");
        ckpt_close(ck);
    }
    char dir[512], note[1024];
    EXPECT(ckpt_find_resume(root, dir, sizeof dir, note, sizeof note, &e) == 1 && strstr(dir, "step_00000005"), "resume: %s", e.msg);
    free_set(&s);
}

static void test_failures(void) {
    char root[512];
    snprintf(root, sizeof root, "%s/b", mt_dir);
    Set s;
    make_set(&s, mt_rank);
    Err e = {{0}};
    EXPECT(ckpt_save(g_comm, root, 1, s.t, s.n, STATE, 0, &e) == 0, "first save: %s", e.msg);
    // Rank 1 passes a bad tensor: both ranks fail, naming rank 1.
    s.t[0].ndim = mt_rank == 1 ? 5 : 2;
    EXPECT(ckpt_save(g_comm, root, 2, s.t, s.n, STATE, 0, &e) == -1 && strstr(e.msg, "rank 1") && strstr(e.msg, "dimensions"),
           "rank %d: bad tensor on rank 1: %s", mt_rank, e.msg);
    s.t[0].ndim = 2;
    // Both ranks write "r0.t0": refused before anything is published.
    char same[32] = "r0.t0";
    s.t[0].name = same;
    if (mt_rank == 1) s.t[0].shape[1] = 3, s.t[0].data = s.buf[0];
    EXPECT(ckpt_save(g_comm, root, 3, s.t, s.n, STATE, 0, &e) == -1 && strstr(e.msg, "unique across ranks"),
           "rank %d: duplicate name: %s", mt_rank, e.msg);
    s.t[0].name = s.name[0];
    s.t[0].shape[1] = 3 + mt_rank;
    char dir[512], note[1024];
    EXPECT(ckpt_find_resume(root, dir, sizeof dir, note, sizeof note, &e) == 1 && strstr(dir, "step_00000001"),
           "failed saves leave step 1 as latest: %s %s", dir, e.msg);
    if (snprintf(dir, sizeof dir, "%s/.tmp_step_00000002", root) >= (int)sizeof dir) FATAL("path too long");
    EXPECT(access(dir, F_OK) != 0, "a failed save leaves no temporary");
    // keep=2 prunes over ranks too.
    for (int st = 10; st <= 13; st++) EXPECT(ckpt_save(g_comm, root, st, s.t, s.n, STATE, 2, &e) == 0, "save %d: %s", st, e.msg);
    Ckpt* ck = NULL;
    EXPECT(ckpt_open_comm(g_comm, &ck, root, &e) == 0 && ckpt_step(ck) == 13, "latest is 13: %s", e.msg);
    if (ck) ckpt_close(ck);
    if (snprintf(dir, sizeof dir, "%s/step_00000011", root) >= (int)sizeof dir) FATAL("path too long");
    EXPECT(access(dir, F_OK) != 0, "step 11 pruned");
    if (snprintf(dir, sizeof dir, "%s/step_00000012", root) >= (int)sizeof dir) FATAL("path too long");
    EXPECT(access(dir, F_OK) == 0, "step 12 kept");
    // A corrupt rank file: the collective open fails on both ranks, naming the file.
    g_comm->barrier(g_comm, GROUP_WORLD);
    if (mt_rank == 0) {
        if (snprintf(dir, sizeof dir, "%s/step_00000013/rank_00001.safetensors", root) >= (int)sizeof dir) FATAL("path too long");
        FILE* f = fopen(dir, "r+b");
        fseek(f, -2, SEEK_END);
        fputc(0x5a, f);
        fclose(f);
    }
    g_comm->barrier(g_comm, GROUP_WORLD);
    ck = NULL;
    EXPECT(ckpt_open_comm(g_comm, &ck, root, &e) == -1 && !ck && strstr(e.msg, "rank_00001.safetensors") && strstr(e.msg, "crc32"),
           "rank %d: corrupt file: %s", mt_rank, e.msg);
    free_set(&s);
}

int main(int argc, char** argv) {
    mpi_test_init(&argc, &argv, "mpi_ckpt");
    mpi_test_dir();
    g_comm = comm_mpi_create(1);
    MRUN(test_disjoint);
    MRUN(test_failures);
    g_comm->destroy(g_comm);
    MPI_TEST_END();
}
