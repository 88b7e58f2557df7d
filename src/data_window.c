// data_window.c — reading a data set: window, token and record counts per split, a mixture's
// sequence routed to its source, the per-epoch shuffle (a keyed Feistel permutation: no table, any
// size), data_get, and the document boundaries within a window.
#include <string.h>

#include "data_impl.h"

static const char* split_name(int s) { return s ? "validation" : "train"; }

// ---- windows -----------------------------------------------------------------------------------

// Sums a count over a mixture's sources (split 0, and split 1 without val) or its validation set.
static uint64_t mix_count(const DataSet* ds, int split, uint64_t (*f)(const DataSet*, int)) {
    if (split && ds->val) return f(ds->val, 0);
    uint64_t n = 0;
    for (int d = 0; d < ds->ncomp; d++) n += f(ds->comp[d], split);
    return n;
}

uint64_t data_num_windows(const DataSet* ds, int split) {
    return ds->kind == KIND_MIX ? mix_count(ds, split ? 1 : 0, data_num_windows) : ds->st[split ? 1 : 0].nwin;
}
uint64_t data_num_tokens(const DataSet* ds, int split) {
    return ds->kind == KIND_MIX ? mix_count(ds, split ? 1 : 0, data_num_tokens) : ds->st[split ? 1 : 0].ntok;
}
uint64_t data_num_records(const DataSet* ds, int split) {
    return ds->kind == KIND_MIX ? mix_count(ds, split ? 1 : 0, data_num_records) : ds->st[split ? 1 : 0].records;
}

int data_doc_separator(const DataSet* ds) { return ds->kind == KIND_RANDOM ? -1 : ds->doc_sep; }

// A mixture's sequence i of a split → (its source set, the split there, its index there).
static const DataSet* mix_route(const DataSet* ds, int split, uint64_t i, int* sub_split, uint64_t* k, int* src) {
    *src = 0;
    if (split && ds->val) { *sub_split = 0; *k = i; return ds->val; }
    *sub_split = split;
    if (split == 0 && ds->weight) {
        uint64_t q = i / MIX_PERIOD, r = i % MIX_PERIOD;
        *src = ds->tab_src[r];
        *k = q * ds->per_period[*src] + ds->tab_k[r];
        return ds->comp[*src];
    }
    // one source, or validation: the sources' windows one after another
    uint64_t total = data_num_windows(ds, split);
    CHECK(total > 0, "data_get: the %s split has no windows", split_name(split));
    uint64_t j = i % total;
    for (int d = 0; d < ds->ncomp; d++) {
        uint64_t nw = data_num_windows(ds->comp[d], split);
        if (j < nw) {
            *src = d;
            *k = ds->ncomp == 1 ? i : j;  // one source keeps its own epochs and shuffle
            return ds->comp[d];
        }
        j -= nw;
    }
    FATAL("data_get: window %llu past the %s split", (unsigned long long)i, split_name(split));
}

int data_source_of(const DataSet* ds, int split, uint64_t i) {
    if (ds->kind != KIND_MIX) return 0;
    int ss, src;
    uint64_t k;
    mix_route(ds, split ? 1 : 0, i, &ss, &k, &src);
    return split && ds->val ? 0 : src;
}

// A bijection of [0, n) keyed by key: a balanced Feistel network on the smallest even number of
// bits covering n, cycle-walked back into range (fewer than 4 steps on average).
static uint64_t permute(uint64_t x, uint64_t n, uint64_t key) {
    if (n <= 1) return 0;
    int bits = 2;
    while (bits < 64 && ((uint64_t)1 << bits) < n) bits += 2;
    int h = bits / 2;
    uint64_t mask = ((uint64_t)1 << h) - 1;
    do {
        uint64_t L = x >> h, R = x & mask;
        for (uint64_t r = 0; r < 6; r++) {
            uint64_t f = data_mix64(R ^ key ^ (r * 0xD6E8FEB86659FD93ull)) & mask;
            uint64_t nl = R;
            R = L ^ f;
            L = nl;
        }
        x = (L << h) | R;
    } while (x >= n);
    return x;
}

uint64_t data_window_of(const DataSet* ds, int split, uint64_t i) {
    split = split ? 1 : 0;
    if (ds->kind == KIND_RANDOM) return i;
    if (ds->kind == KIND_MIX) {
        int ss, src;
        uint64_t k;
        const DataSet* sub = mix_route(ds, split, i, &ss, &k, &src);
        return data_window_of(sub, ss, k);
    }
    uint64_t n = ds->st[split].nwin;
    CHECK(n > 0, "data_get: the %s split has no windows (data.val_frac = 0 means no validation)",
          split_name(split));
    uint64_t epoch = i / n, pos = i % n;
    if (split == 0 && ds->shuffle) pos = permute(pos, n, data_mix64(ds->seed ^ data_mix64(epoch + 0x51ull)));
    return pos;
}

void data_get(const DataSet* ds, int split, uint64_t i, int32_t* tokens) {
    split = split ? 1 : 0;
    const int T = ds->seq_len;
    if (ds->kind == KIND_MIX) {
        int ss, src;
        uint64_t k;
        const DataSet* sub = mix_route(ds, split, i, &ss, &k, &src);
        data_get(sub, ss, k, tokens);
        return;
    }
    if (ds->kind == KIND_RANDOM) {
        uint64_t h = data_mix64(ds->seed ^ data_mix64(i * 2 + (uint64_t)split));
        for (int t = 0; t <= T; t++) {
            h = data_mix64(h);
            tokens[t] = (int32_t)((h >> 16) % (uint64_t)ds->vocab);
        }
        return;
    }
    const Stream* st = &ds->st[split];
    uint64_t off = data_window_of(ds, split, i) * (uint64_t)T;
    int lo = 0, hi = st->nseg - 1;  // the piece holding off
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (st->start[mid] <= off) lo = mid;
        else hi = mid - 1;
    }
    int k = lo, t = 0;
    uint64_t j = off - st->start[k];
    while (t <= T) {
        const Seg* s = &st->seg[k];
        for (; j < s->n && t <= T; j++, t++) {
            if (s->width == 1) tokens[t] = s->p[j] ? s->p[j] : ds->sep;
            else if (s->width == 2) { uint16_t v; memcpy(&v, s->p + 2 * j, 2); tokens[t] = v; }
            else { uint32_t v; memcpy(&v, s->p + 4 * j, 4); tokens[t] = (int32_t)v; }
        }
        k++;
        j = 0;
        CHECK(t > T || k < st->nseg, "data_get: window %llu runs past the %s stream", (unsigned long long)off / T,
              split_name(split));
    }
}

// ---- documents ---------------------------------------------------------------------------------

int data_doc_sep(const DataSet* ds, int* natural) {
    int sep = -1, nat = 0;
    if (ds->kind == KIND_MIX) {  // every source (and the validation data) must agree
        const int n = ds->ncomp + (ds->val != NULL);
        nat = 1;
        for (int i = 0; i < n; i++) {
            int ni = 0;
            const int si = data_doc_sep(i < ds->ncomp ? ds->comp[i] : ds->val, &ni);
            if (i == 0) sep = si;
            if (si != sep) sep = -1;
            nat &= ni;
        }
    } else if (ds->kind == KIND_BYTES && !ds->sep_inside) {
        sep = ds->sep;
        nat = !(ds->fmt_mask & (1u << DATA_TEXT));
    } else if (ds->kind == KIND_BIN && ds->eos >= 0) {
        sep = ds->eos;
        nat = 1;
    }
    if (natural) *natural = sep >= 0 && nat;
    return sep;
}

void data_doc_starts(const int32_t* tokens, int T, int sep, int32_t* doc) {
    int32_t d = 0;
    for (int t = 0; t < T; t++) {
        if (t > 0 && tokens[t - 1] == sep) d = t;
        doc[t] = d;
    }
}
