// train_sample.c — train.sample_every: a short continuation of train.sample_prompt printed into
// the log while training (llm.c's habit), decoded with the KV cache of src/generate.c on the
// training model's current weights. Collective: every rank runs it (the experts stay sharded);
// rank 0's draw is every rank's token.
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "hf.h"
#include "train.h"
#include "util.h"

// The prompt's token ids (*ids, allocated; returns how many, at least 1 and at most the model's
// rows): bytes with a byte vocabulary, else through the run's tokenizer sp (NULL: none).
static int prompt_ids(const Trainer* t, const SpModel* sp, int32_t** ids) {
    const TrainConfig* tc = &t->cfg.train;
    const int V = t->model.c.vocab_size, N = t->model.N;
    const char* prompt = tc->sample_prompt[0] ? tc->sample_prompt : (V == 256 ? "\n" : "");
    int n = 0;
    *ids = NULL;
    if (V == 256) {
        n = (int)strlen(prompt);
        *ids = xmalloc(sizeof(int32_t) * (size_t)n);
        for (int i = 0; i < n; i++) (*ids)[i] = (uint8_t)prompt[i];
    } else if (sp) {
        n = sp_encode(sp, prompt, 1, ids);
    }
    if (n == 0) {  // no tokenizer (or an empty prompt without BOS): start from token 0
        free(*ids);
        *ids = xcalloc(1, sizeof(int32_t));
        n = 1;
    }
    if (n > N) {  // the longest prompt the model's rows hold: its last N tokens
        memmove(*ids, *ids + (n - N), sizeof(int32_t) * (size_t)N);
        n = N;
    }
    return n;
}

// Up to len tokens after the prompt ids [n] into out, rank 0's draw on every rank; stops after
// eos. Returns how many.
static int decode(Trainer* t, const int32_t* ids, int n, int len, int eos, int step, int32_t* out) {
    Model* m = &t->model;
    const int V = m->c.vocab_size;
    Gen g;
    gen_create_batch(&g, m, 1, n + len);
    gen_forward(&g, ids, n, NULL, NULL);
    float* scratch = xmalloc(sizeof(float) * (size_t)V);
    Rng r;
    rng_seed(&r, t->cfg.train.seed * 0x9E3779B97F4A7C15ull + (uint64_t)step);
    int k = 0;
    for (; k < len; k++) {
        double x = t->rank == 0 ? gen_sample(g.h_logits, V, 1.0f, 0, 1.0f, scratch, &r) : 0;
        if (t->world > 1) t->comm->host_all_reduce_f64(t->comm, GROUP_WORLD, &x, 1);
        out[k] = (int32_t)x;
        if (out[k] == eos) break;
        if (k + 1 < len) gen_forward(&g, &out[k], 1, NULL, NULL);
    }
    gen_free(&g);
    free(scratch);
    return k;
}

// Appends the text of tokens v [cnt] to s [cap] at *at: bytes (V = 256) or the tokenizer's pieces,
// else the ids; newlines and other control bytes escaped.
static void append_text(char* s, size_t cap, size_t* at, const int32_t* v, int cnt, int V, const SpModel* sp) {
    for (int i = 0; i < cnt; i++) {
        char buf[128];
        size_t bl = 0;
        if (V == 256) buf[0] = (char)v[i], bl = 1;
        else if (sp) bl = sp_piece_text(sp, v[i], buf, sizeof buf);
        else bl = (size_t)snprintf(buf, sizeof buf, "%s%d", i ? " " : "", v[i]);
        for (size_t j = 0; j < bl && *at + 8 < cap; j++) {
            const unsigned char c = (unsigned char)buf[j];
            if (c == '\n') *at += (size_t)snprintf(s + *at, cap - *at, "\\n");
            else if (c < 32 || c == 127 || (V == 256 && c >= 128)) *at += (size_t)snprintf(s + *at, cap - *at, "\\x%02x", c);
            else s[(*at)++] = (char)c;
        }
    }
}

void trainer_sample(Trainer* t, int step) {
    const int V = t->model.c.vocab_size, len = t->cfg.train.sample_len;
    SpModel* sp = NULL;
    if (V != 256) {
        char path[4096];
        Err e = {{0}};
        if (hf_tokenizer_of_run(&t->cfg.data, path, sizeof path) && sp_open(&sp, path, &e)) sp = NULL;
    }
    int32_t* ids;
    const int n = prompt_ids(t, sp, &ids);
    int32_t* out = xmalloc(sizeof(int32_t) * (size_t)len);
    const int k = decode(t, ids, n, len, sp ? sp_eos(sp) : -1, step, out);
    if (t->rank == 0) {  // the prompt and the sample as text
        size_t cap = 64 + (size_t)(n + k) * 64, at = 0;
        char* s = xmalloc(cap);
        append_text(s, cap, &at, ids, n, V, sp);
        at += (size_t)snprintf(s + at, cap - at, "|");
        append_text(s, cap, &at, out, k, V, sp);
        s[at] = 0;
        log_info("sample (step %d, %d tokens): %s\n", step, k, s);
        free(s);
    }
    free(out), free(ids);
    if (sp) sp_close(sp);
}
