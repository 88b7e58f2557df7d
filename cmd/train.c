// train.c — `moetrain [train]`: start MPI, resolve and validate the config on every rank, then
// train. Every rank validates; a user error on any rank ends all ranks with exit code 2 and
// the message, so nothing hangs.
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "prof.h"
#include "comm.h"
#include "stop.h"
#include "train.h"

int cmd_train(int argc, char** argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("moetrain [train] --config NAME|PATH [section.key=value ...]\n"
                   "  trains; launch several ranks with mpirun (world = parallel.ep x edp).\n"
                   "  Every key and its default: docs/config.md, or moetrain --keys.\n");
            return 0;
        }
    stop_install();  // before anything slow: a signal during start-up exits 3 at once (stop.h)
    int world = 1;
    int rank = dist_init(&argc, &argv, &world);
    Config c;
    Err e = {{0}};
    int argi = 1;
    static const char* const known[] = {NULL};
    int st = cli_load_config(&c, argc, argv, &argi, &e) ? 2 : 0;
    if (!st && cli_check_flags(argc, argv, 1, known, &e)) st = 2;
    if (!st && config_validate(&c, world, &e)) st = 2;
    if (!st && config_validate_run(&c, &e)) st = 2;
    if (!st && cli_resolve_data_path(&c, &e)) st = 2;
    if (dist_agree_error(st, &e)) {
        if (rank == 0) cli_exit_error(NULL, &e);
        dist_finalize();
        return 2;
    }
    if (rank == 0) {
        printf("# moetrain %s: resolved config (%s), world %d\n", MOETRAIN_VERSION, c.source, world);
        config_print(&c, stdout);
        fflush(stdout);
    }
    Trainer t;
    st = trainer_init(&t, &c, &e) ? 2 : 0;
    if (dist_agree_error(st, &e)) {
        if (rank == 0) cli_exit_error(NULL, &e);
        trainer_free(&t);  // what start-up had made: the watchdog's heartbeat file, the lock if taken
        dist_finalize();
        return 2;
    }
    prof_init(t.be, c.log.profile);  // log.profile: per-stage times after the run
    int rc = trainer_run(&t);
    if (rank == 0) prof_report(stdout);
    prof_free();
    trainer_free(&t);
    dist_finalize();
    return rc;
}
