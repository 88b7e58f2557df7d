// mpi_resume.c — exact resume under mpirun -np 2 (CPU, random tokens, tiny model, 2 micro-batches
// of accumulation), at EP=2 (experts split, dense ZeRO-1 over the world) and at EP=1 × EDP=2
// (experts ZeRO-1-sharded over edp): 6 steps straight == 3 steps, stop (exit 3), resume=auto,
// 3 more — the metrics trace, the last loss, every rank's masters / Adam m / v / compute weights
// and the final checkpoint files bit for bit. Then EP=2 again with parallel.comm=mpi (every
// device collective staged through host memory: comm_staged.c) and checkpoint.async=true (the
// background writer on two ranks): exact resume as above, and the final checkpoint bit for bit
// equal to the plain MPI run's.
#define _GNU_SOURCE
#include <mpi.h>

#include "comm.h"
#include "mpi_test.h"
#include "test_resume_util.h"
#include "train.h"

// Differences in this rank's optimizer shards and weights, summed over the ranks.
static int state_diff(const Trainer* a, const Trainer* b) {
    int bad = 0;
    for (int r = 0; r < 2; r++) {
        const OptShard *x = &a->opt.sh[r], *y = &b->opt.sh[r];
        if (x->n != y->n) { bad++; continue; }
        bad += memcmp(x->master, y->master, sizeof(float) * x->n) != 0;
        bad += memcmp(x->m, y->m, sizeof(float) * x->n) != 0;
        bad += memcmp(x->v, y->v, sizeof(float) * x->n) != 0;
        bad += memcmp(a->model.w[r], b->model.w[r], sizeof(float) * a->model.padded[r]) != 0;
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    return bad;
}

static void exact(const char* name, const char* const* layout, int nl) {
    char a1[300], a2[300], b1[300], b2[300];
    snprintf(a1, sizeof a1, "checkpoint.dir=%s/%s_a", mt_dir, name);
    snprintf(a2, sizeof a2, "log.dir=%s/%s_la", mt_dir, name);
    snprintf(b1, sizeof b1, "checkpoint.dir=%s/%s_b", mt_dir, name);
    snprintf(b2, sizeof b2, "log.dir=%s/%s_lb", mt_dir, name);
    const char* ea[8] = {a1, a2}, *eb[8] = {b1, b2}, *ec[8] = {b1, b2, "checkpoint.resume=auto"};
    for (int i = 0; i < nl; i++) ea[2 + i] = eb[2 + i] = ec[3 + i] = layout[i];
    Err e = {{0}};
    Trainer A, B, C;
    EXPECT(tiny_trainer(&A, ea, 2 + nl, &e) == 0, "init A: %s", e.msg);
    EXPECT(A.world == 2, "world 2 (%d)", A.world);
    EXPECT(trainer_run(&A) == EXIT_OK && A.step == 6, "A runs 6 steps");
    EXPECT(tiny_trainer(&B, eb, 2 + nl, &e) == 0, "init B: %s", e.msg);
    B.stop_at = 3;
    EXPECT(trainer_run(&B) == EXIT_PREEMPTED && B.step == 3, "B stops after step 3 (step %d)", B.step);
    trainer_free(&B);
    EXPECT(tiny_trainer(&C, ec, 3 + nl, &e) == 0 && C.step == 3, "C resumes at step 3: %s (step %d)", e.msg, C.step);
    EXPECT(trainer_run(&C) == EXIT_OK && C.step == 6, "C finishes");
    EXPECT(memcmp(&A.last_loss, &C.last_loss, sizeof(double)) == 0 && isfinite(A.last_loss), "last loss %.17g vs %.17g",
           C.last_loss, A.last_loss);
    int d = state_diff(&A, &C);
    EXPECT(d == 0, "%d shard buffers differ over the ranks", d);
    if (mt_rank == 0) {
        char p[400], *ta[16], *tc[16];
        snprintf(p, sizeof p, "%s/%s_la/metrics.jsonl", mt_dir, name);
        int na = read_trace(p, ta, 16);
        snprintf(p, sizeof p, "%s/%s_lb/metrics.jsonl", mt_dir, name);
        int nc = read_trace(p, tc, 16);
        EXPECT(na == 6 && nc == 6, "6 metrics lines each (%d, %d)", na, nc);
        for (int i = 0; i < na && i < nc; i++) EXPECT(strcmp(ta[i], tc[i]) == 0, "trace line %d:\n%s%s", i + 1, ta[i], tc[i]);
        free_trace(ta, na > 0 ? na : 0);
        free_trace(tc, nc > 0 ? nc : 0);
        char da[300], db[300], msg[1100];
        snprintf(da, sizeof da, "%s/%s_a/step_00000006", mt_dir, name);
        snprintf(db, sizeof db, "%s/%s_b/step_00000006", mt_dir, name);
        int k = ckpt_diff(da, db, msg, sizeof msg);
        EXPECT(k == 0, "final checkpoints differ: %d (%s)", k, msg);
    }
    trainer_free(&A);
    trainer_free(&C);
}

static void test_exact_ep2(void) {
    const char* l[] = {"parallel.ep=2", "train.micro_batch=2"};
    exact("ep2", l, 2);
}

static void test_exact_ep1_edp2(void) {
    const char* l[] = {"parallel.ep=1", "train.micro_batch=2"};
    exact("edp2", l, 2);
}

static void test_exact_ep2_staged_async(void) {
    const char* l[] = {"parallel.ep=2", "train.micro_batch=2", "parallel.comm=mpi", "checkpoint.async=true"};
    exact("ep2mpi", l, 4);
    if (mt_rank == 0) {
        char da[300], db[300], msg[1100];
        snprintf(da, sizeof da, "%s/ep2_a/step_00000006", mt_dir);
        snprintf(db, sizeof db, "%s/ep2mpi_a/step_00000006", mt_dir);
        int k = ckpt_diff(da, db, msg, sizeof msg);
        EXPECT(k == 0, "staged comm + async vs plain MPI + sync: final checkpoints differ: %d (%s)", k, msg);
    }
}

int main(int argc, char** argv) {
    mpi_test_init(&argc, &argv, "mpi_resume");
    mpi_test_dir();
    MRUN(test_exact_ep2);
    MRUN(test_exact_ep1_edp2);
    MRUN(test_exact_ep2_staged_async);
    MPI_TEST_END();
}
