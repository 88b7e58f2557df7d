// mpi_infer.c — the inference set-up (trainer_init_infer) against the training set-up under
// mpirun -np 2 (tests/infer_util.h): a tiny model trained at EP = 2 (ZeRO-1 shards the dense
// masters), its checkpoint loaded both ways at EP = 2 and at EP = 1 x EDP 2: on every rank the
// same compute weights, eval loss and decoder logits, bit for bit, and a peak lower by at least
// the plan's masters + gradients + Adam of that rank.
#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>

#include "infer_util.h"
#include "mpi_test.h"

static void test_ep2_checkpoint(void) {
    char d[400], step6[400];
    snprintf(d, sizeof d, "checkpoint.dir=%s/ck", mt_dir);
    snprintf(step6, sizeof step6, "%s/ck/step_00000006", mt_dir);
    Err e = {{0}};
    Trainer t;
    const char* ex[] = {d, "parallel.ep=2", "train.micro_batch=2"};
    EXPECT(tiny_trainer(&t, ex, 3, &e) == 0, "init: %s", e.msg);
    EXPECT(trainer_run(&t) == EXIT_OK && t.step == 6, "train 6 steps at EP = 2");
    trainer_free(&t);
    static const char* const layouts[2][2] = {{"parallel.ep=2", "train.micro_batch=2"},
                                              {"parallel.ep=1", "train.micro_batch=2"}};
    for (int k = 0; k < 2; k++) {
        Config c;
        EXPECT(eval_config(&c, step6, 0, layouts[k], 2, &e) == 0, "config: %s", e.msg);
        compare(k ? "EP = 1 x EDP = 2" : "EP = 2", &c);
    }
    mpi_test_note("(world 2: EP = 2, EP = 1 x EDP = 2)");
}

int main(int argc, char** argv) {
    mpi_test_init(&argc, &argv, "mpi_infer");
    mpi_test_dir();
    if (fcntl(0, F_GETFD) == -1 && open("/dev/null", O_RDONLY) != 0) return 1;  // a stdin to keep open
    MRUN(test_ep2_checkpoint);
    MPI_TEST_END();
}
