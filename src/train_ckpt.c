// train_ckpt.c — where the trainer's state comes from and goes to: random init now;
// checkpoints (save / resume / init_from) are the next piece of work (issue 5).
#include <stdlib.h>
#include <string.h>

#include "train.h"
#include "util.h"

// Random init by tensor name (layout-independent), staged through the fp32 gradient arenas.
static void init_random(Trainer* t) {
    Model* m = &t->model;
    size_t max = 0;
    for (int i = 0; i < m->pl.n; i++) max = m->pl.p[i].numel > max ? m->pl.p[i].numel : max;
    float* host = xmalloc(sizeof(float) * max);
    for (int i = 0; i < m->pl.n; i++) {
        const ParamInfo* p = &m->pl.p[i];
        model_init_tensor(&m->c, p, t->cfg.train.seed, host);
        m->be->to_device(m->be, m->grad[p->arena] + p->offset, host, sizeof(float) * p->numel);
    }
    free(host);
    optim_load_from_staging(&t->opt, m);
}

int trainer_restore(Trainer* t, Err* e) {
    const CheckpointConfig* c = &t->cfg.checkpoint;
    if (strcmp(c->resume, "none") != 0 || c->init_from[0])
        return err_set(e, "checkpoint.resume / checkpoint.init_from: this version cannot read checkpoints yet; "
                          "set checkpoint.resume=none and checkpoint.init_from=\"\"");
    init_random(t);
    return 0;
}

int trainer_save(Trainer* t, Err* e) {
    (void)t;
    return err_set(e, "this version cannot write checkpoints yet; leave checkpoint.dir empty");
}
