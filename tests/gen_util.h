// gen_util.h — helpers shared by the generate tests: weights by tensor name (the same values in
// any EP layout) and a small GQA Mixtral config.
#pragma once
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "util.h"

static inline ModelConfig gen_test_config(void) {
    ModelConfig c = {.vocab_size = 48, .hidden = 32, .ffn = 24, .layers = 2, .heads = 4, .kv_heads = 2, .experts = 4,
                     .top_k = 2, .max_seq = 64, .rope_theta = 10000, .rms_eps = 1e-5f, .init_std = 0.25f};
    return c;
}

// Every tensor this rank holds from model_init_tensor(seed) by its name; norm weights get
// 1 + noise so they matter too.
static inline void gen_test_weights(Model* m, uint64_t seed) {
    for (int i = 0; i < m->pl.n; i++) {
        const ParamInfo* p = &m->pl.p[i];
        float* tmp = xmalloc(sizeof(float) * p->numel);
        ParamInfo q = *p;
        q.no_decay = 0;
        model_init_tensor(&m->c, &q, seed, tmp);
        if (p->no_decay)
            for (size_t j = 0; j < p->numel; j++) tmp[j] = 1.0f + 0.2f * tmp[j];
        Backend* be = m->be;
        float* dtmp = be->alloc(be, sizeof(float) * p->numel);
        be->to_device(be, dtmp, tmp, sizeof(float) * p->numel);
        be->f32_to_act(be, (char*)m->w[p->arena] + p->offset * dtype_size(be->act_dtype), dtmp, p->numel);
        be->sync(be);
        be->free(be, dtmp);
        free(tmp);
    }
}
