// data_mix.c — data.weights and data.val_path: data.path and data.val_path expanded into
// sources, the weights parsed, the blend table (Megatron's: exact proportions per MIX_PERIOD
// samples) and the mixture set over the sources' plain sets. data_window.c routes a mixture's
// sequences to its sources.
#define _DEFAULT_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data_impl.h"

static int parse_weights(const char* text, int nitems, double* w, Err* e) {
    char buf[CFG_STR];
    snprintf(buf, sizeof buf, "%s", text);
    char* it[256];
    int n = split_list_inplace(buf, it, 256);
    if (n != nitems)
        return err_set(e, "data.weights has %d weights for %d data.path items; give one weight per item", n, nitems);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        char* end = NULL;
        errno = 0;
        w[i] = strtod(it[i], &end);
        if (!*it[i] || *end || errno || !(w[i] > 0) || !isfinite(w[i]))
            return err_set(e, "data.weights: '%s' is not a positive number", it[i]);
        sum += w[i];
    }
    for (int i = 0; i < n; i++) w[i] /= sum;
    return 0;
}

// Megatron's blend over one period: sample r goes to the source furthest behind its share.
static void build_blend(DataSet* ds) {
    int n = ds->ncomp;
    ds->tab_src = xmalloc(sizeof(uint16_t) * MIX_PERIOD);
    ds->tab_k = xmalloc(sizeof(uint32_t) * MIX_PERIOD);
    ds->per_period = xcalloc((size_t)n, sizeof(uint64_t));
    for (uint32_t r = 0; r < MIX_PERIOD; r++) {
        int best = 0;
        double be = -1e300;
        for (int d = 0; d < n; d++) {
            double err = ds->weight[d] * (double)(r + 1) - (double)ds->per_period[d];
            if (err > be) be = err, best = d;
        }
        ds->tab_src[r] = (uint16_t)best;
        ds->tab_k[r] = (uint32_t)ds->per_period[best]++;
    }
}

static int item_error(const char* key, Err* e) {
    Err c = *e;
    return err_set(e, "%s: %s", key, c.msg);
}

void data_sources_free(DataSources* S) {
    for (int d = 0; d < S->nsrc; d++) path_list_free(&S->src[d]);
    free(S->src);
    path_list_free(&S->dir_val);
    path_list_free(&S->val);
}

int data_sources_expand(DataSources* S, const DataConfig* dc, char* list, char* vlist, Err* e) {
    memset(S, 0, sizeof *S);
    char* vitems[256];
    S->n = split_list_inplace(list, S->items, 256);
    S->nv = split_list_inplace(vlist, vitems, 256);
    if (!S->n) return err_set(e, "data.path = '%s' names no file", dc->path);
    S->mix = dc->weights[0] != 0;
    if (S->mix && parse_weights(dc->weights, S->n, S->w, e)) return -1;
    if (S->mix && S->n > 65535) return err_set(e, "data.weights: at most 65535 sources");
    int rc = 0;
    S->nsrc = S->mix ? S->n : 1;
    S->src = xcalloc((size_t)S->nsrc, sizeof(PathList));
    for (int i = 0; i < S->n && !rc; i++) rc = path_list_expand(S->items[i], 0, &S->src[S->mix ? i : 0], &S->dir_val, e);
    if (rc) item_error("data.path", e);
    for (int i = 0; i < S->nv && !rc; i++)
        if ((rc = path_list_expand(vitems[i], 1, &S->val, &S->dir_val, e))) item_error("data.val_path", e);
    if (!rc && !S->nv)
        for (int i = 0; i < S->dir_val.n; i++) path_list_add(&S->val, S->dir_val.p[i]);
    return rc;
}

int data_open_mix(DataSet** out, const DataConfig* dc, const DataSources* S, int vocab_size, int seq_len,
                  uint64_t seed, Err* e) {
    const int nsrc = S->nsrc, mix = S->mix;
    DataSet* ds = data_new_set(dc, vocab_size, seq_len, seed);
    ds->kind = KIND_MIX;
    ds->ncomp = nsrc;
    ds->comp = xcalloc((size_t)nsrc, sizeof(DataSet*));
    float vf = S->val.n ? 0.0f : dc->val_frac;
    int rc = 0;
    for (int d = 0; d < nsrc && !rc; d++) {
        uint64_t sd = d ? data_mix64(seed ^ data_mix64((uint64_t)d * 0x9E37ull)) : seed;
        rc = data_open_plain(&ds->comp[d], dc, &S->src[d], vf, dc->shuffle, vocab_size, seq_len, sd, e);
        if (rc && mix) {
            Err c = *e;
            err_set(e, "data.path item %d ('%s'): %s", d + 1, S->items[d], c.msg);
        }
        if (!rc && mix && ds->comp[d]->kind != KIND_BIN)
            rc = err_set(e, "data.weights mixes .bin shards only; '%s' is a sequence file: tokenize it first "
                         "(scripts/tokenize_data.py, docs/data.md)", S->items[d]);
    }
    if (!rc && S->val.n) {
        rc = data_open_plain(&ds->val, dc, &S->val, 0.0f, 0, vocab_size, seq_len, seed, e);
        if (rc) item_error(S->nv ? "data.val_path" : "validation shards", e);
    }
    if (!rc && mix) {
        ds->weight = xmalloc(sizeof(double) * (size_t)nsrc);
        memcpy(ds->weight, S->w, sizeof(double) * (size_t)nsrc);
        build_blend(ds);
    }
    if (rc) {
        data_close(ds);
        return rc;
    }
    ds->doc_sep = ds->comp[0]->doc_sep;
    for (int s = 0; s < 2; s++) {
        ds->st[s].nwin = data_num_windows(ds, s);
        ds->st[s].ntok = data_num_tokens(ds, s);
        ds->st[s].records = data_num_records(ds, s);
    }
    *out = ds;
    return 0;
}
