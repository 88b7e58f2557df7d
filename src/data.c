// data.c — the data set: opening files or memory, the train/validation split, windows, the
// per-epoch shuffle (a keyed Feistel permutation: no table, any size), data_get and the log line.
// Parsers live in data_seq.c, .bin shards in data_bin.c.
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_impl.h"
#include "minijson.h"

#ifndef MOETRAIN_PREFIX
#define MOETRAIN_PREFIX "/usr/local"
#endif
#define CHUNK ((size_t)1 << 20)
#define DEFAULT_DATA "data/hairpin.fa.gz"

typedef struct Stream {
    Seg* seg;          // [nseg] pieces of the split's token stream, in order
    uint64_t* start;   // [nseg] stream offset of each piece's first token
    int nseg;
    uint64_t ntok, nwin, records;
} Stream;

enum { KIND_NONE = 0, KIND_BYTES, KIND_BIN, KIND_RANDOM, KIND_MIX };

struct DataSet {
    int kind;
    int seq_len, vocab, sep, shuffle;
    uint64_t seed;
    float val_frac;
    Stream st[2];        // [split]
    Corpus corpus;       // byte-level storage (the streams point into it)
    int single;          // byte-level: one record, split by position
    Seg* segs;           // [nsegs] .bin payloads, in file order
    int nsegs;
    MapFile* maps;       // [nmaps] mmap'd .bin files
    int nmaps;
    unsigned fmt_mask;   // 1 << DataFormat of every file
    unsigned width_mask; // .bin: 1 << token width
    int nfiles, any_gz;
    char first[256];     // first file name, for messages
    int doc_sep;         // the token between documents (data_doc_separator)
    // KIND_MIX: sources mixed by weight and/or separate validation data
    DataSet** comp;      // [ncomp] sources (each a plain set: bytes or bin)
    int ncomp;
    double* weight;      // [ncomp] normalised weights, or NULL (one source, no mixing)
    uint16_t* tab_src;   // [MIX_PERIOD] source of blended sample r of a period
    uint32_t* tab_k;     // [MIX_PERIOD] its sample index within that source and period
    uint64_t* per_period;// [ncomp] samples of each source per period
    DataSet* val;        // validation data (data.val_path), or NULL
    int sep_inside;      // byte-level: the sep token's byte value occurs inside a record
    int eos;             // .bin: the token between documents, or -1 when not known
};

#define MIX_PERIOD 65536  // the blend repeats every MIX_PERIOD samples (exact proportions per period)

static const char* split_name(int s) { return s ? "validation" : "train"; }

// ---- streams -----------------------------------------------------------------------------------

// Builds s from tokens [a, b) of the concatenation of segs.
static void stream_slice(Stream* s, const Seg* segs, int nseg, uint64_t a, uint64_t b) {
    memset(s, 0, sizeof *s);
    s->seg = xcalloc((size_t)nseg + 1, sizeof(Seg));
    s->start = xcalloc((size_t)nseg + 1, sizeof(uint64_t));
    uint64_t g = 0;
    for (int k = 0; k < nseg; k++) {
        uint64_t lo = a > g ? a : g, hi = b < g + segs[k].n ? b : g + segs[k].n;
        if (lo < hi) {
            Seg* o = &s->seg[s->nseg];
            o->width = segs[k].width;
            o->p = segs[k].p + (lo - g) * (uint64_t)segs[k].width;
            o->n = hi - lo;
            s->start[s->nseg++] = s->ntok;
            s->ntok += o->n;
        }
        g += segs[k].n;
    }
}

static void stream_free(Stream* s) {
    free(s->seg);
    free(s->start);
    memset(s, 0, sizeof *s);
}

static uint64_t windows_of(uint64_t ntok, int T) { return ntok >= (uint64_t)T + 1 ? (ntok - 1) / (uint64_t)T : 0; }

// ---- opening -----------------------------------------------------------------------------------

// A relative path that does not exist is looked for next to the binary and its parents, then
// under PREFIX/share/moetrain.

static int set_kind(DataSet* ds, int kind, const char* name, Err* e) {
    if (ds->kind && ds->kind != kind)
        return err_set(e, "data.path mixes llm.c .bin shards and sequence files (%s and %s); give one kind", ds->first,
                       name);
    ds->kind = kind;
    if (!ds->nfiles++) snprintf(ds->first, sizeof ds->first, "%s", name);
    return 0;
}

static int add_bin(DataSet* ds, const char* name, const uint8_t* p, size_t size, Err* e) {
    if (set_kind(ds, KIND_BIN, name, e)) return -1;
    Seg s;
    if (bin_check(name, p, size, ds->vocab, &s, e)) return -1;
    ds->segs = realloc(ds->segs, sizeof(Seg) * (size_t)(ds->nsegs + 1));
    CHECK(ds->segs, "out of host memory");
    ds->segs[ds->nsegs++] = s;
    ds->fmt_mask |= 1u << DATA_BIN;
    ds->width_mask |= 1u << s.width;
    return 0;
}

static int add_seq(DataSet* ds, Reader* r, const char* name, DataFormat forced, Err* e) {
    if (set_kind(ds, KIND_BYTES, name, e)) return -1;
    if (ds->sep < 0 || ds->sep >= ds->vocab)
        return err_set(e, "data.sep_token = %d must be in [0, model.vocab_size = %d)", ds->sep, ds->vocab);
    uint8_t* buf = xmalloc(CHUNK);
    int rc = -1;
    long n = reader_read(r, buf, CHUNK, e);
    if (n < 0) goto done;
    if (n == 0) { err_set(e, "data: %s is empty%s", name, r->is_gz ? " (after gunzip)" : ""); goto done; }
    DataFormat f = forced != DATA_AUTO ? forced : data_detect(buf, (size_t)n, name);
    if (f == DATA_BIN) {
        err_set(e, "data: %s: a gzip'd llm.c .bin shard; gunzip it first (shards are mmap'd)", name);
        goto done;
    }
    SeqParser sp;
    seqp_init(&sp, &ds->corpus, f, name);
    uint64_t before = ds->corpus.nrec;
    while (n > 0) {
        if (seqp_feed(&sp, buf, (size_t)n, e)) goto done;
        if ((n = reader_read(r, buf, CHUNK, e)) < 0) goto done;
    }
    if (seqp_end(&sp, e)) goto done;
    if (ds->corpus.nrec == before) {
        err_set(e, "data: %s: no records (%s)", name,
                f == DATA_FASTA ? "no sequence lines after any '>' header"
                : f == DATA_FASTQ ? "no FASTQ record has a sequence" : "only blank lines");
        goto done;
    }
    ds->fmt_mask |= 1u << f;
    ds->any_gz |= r->is_gz;
    rc = 0;
done:
    free(buf);
    return rc;
}

static int is_gzip(const uint8_t* p, size_t n) { return n >= 2 && p[0] == 0x1f && p[1] == 0x8b; }

static int wants_bin(DataFormat fmt, const uint8_t* head, size_t n, const char* name) {
    if (is_gzip(head, n)) return 0;  // add_seq explains gzip'd shards
    return fmt == DATA_BIN || (fmt == DATA_AUTO && data_detect(head, n, name) == DATA_BIN);
}

static int add_file(DataSet* ds, const char* path, DataFormat fmt, Err* e) {
    FILE* f = fopen(path, "rb");
    if (!f)
        return err_set(e, "data.path: cannot open %s (%s); give an existing FASTA/FASTQ/text file (.gz ok) or "
                       "llm.c .bin shard", path, strerror(errno));
    uint8_t head[4];
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    if (n == 0) return err_set(e, "data: %s is empty (0 bytes)", path);
    if (fmt == DATA_BIN && is_gzip(head, n))
        return err_set(e, "data: %s: a gzip'd llm.c .bin shard; gunzip it first (shards are mmap'd)", path);
    if (wants_bin(fmt, head, n, path)) {
        ds->maps = realloc(ds->maps, sizeof(MapFile) * (size_t)(ds->nmaps + 1));
        CHECK(ds->maps, "out of host memory");
        if (bin_map(path, &ds->maps[ds->nmaps], e)) return -1;
        MapFile* m = &ds->maps[ds->nmaps++];
        return add_bin(ds, path, m->base, m->size, e);
    }
    Reader r;
    if (reader_open_file(&r, path, e)) return -1;
    int rc = add_seq(ds, &r, path, fmt, e);
    reader_close(&r);
    return rc;
}

static int too_short(const DataSet* ds, int s, Err* e) {
    const Stream* st = &ds->st[s];
    char where[320];
    snprintf(where, sizeof where, "%s%s", ds->first, ds->nfiles > 1 ? " (and the other files)" : "");
    if (s == 0)
        return err_set(e, "data: %s: the train split has %llu tokens, but one window needs seq_len + 1 = %d; lower "
                       "train.seq_len or data.val_frac, or give more data", where, (unsigned long long)st->ntok,
                       ds->seq_len + 1);
    return err_set(e, "data: %s: the validation split has %llu tokens, but one window needs seq_len + 1 = %d; "
                   "raise data.val_frac (or set it to 0 for no validation) or lower train.seq_len", where,
                   (unsigned long long)st->ntok, ds->seq_len + 1);
}

static int finish_bytes(DataSet* ds, Err* e) {
    Corpus* c = &ds->corpus;
    corpus_balance(c);
    for (int s = 0; s < 2; s++) {  // give back the growth slack
        if (c->buf[s].n && c->buf[s].n < c->buf[s].cap) {
            uint8_t* p = realloc(c->buf[s].p, c->buf[s].n);
            if (p) { c->buf[s].p = p; c->buf[s].cap = c->buf[s].n; }
        }
    }
    if (c->nrec == 1) {  // one record (a genome): its last val_frac of tokens are validation
        ds->single = 1;
        int s = c->records[1] ? 1 : 0;
        Seg all = {c->buf[s].p, c->buf[s].n, 1};
        uint64_t nval = ds->val_frac > 0 ? (uint64_t)llround((double)all.n * ds->val_frac) : 0;
        if (ds->val_frac > 0 && nval == 0) nval = 1;
        stream_slice(&ds->st[0], &all, 1, 0, all.n - nval);
        stream_slice(&ds->st[1], &all, 1, all.n - nval, all.n);
        ds->st[0].records = 1;
        ds->st[1].records = nval ? 1 : 0;
    } else {
        for (int s = 0; s < 2; s++) {
            Seg one = {c->buf[s].p, c->buf[s].n, 1};
            stream_slice(&ds->st[s], &one, 1, 0, one.n);
            ds->st[s].records = c->records[s];
        }
    }
    for (int s = 0; s < 2; s++) ds->st[s].nwin = windows_of(ds->st[s].ntok, ds->seq_len);
    if (ds->st[0].nwin == 0) return too_short(ds, 0, e);
    if (ds->val_frac > 0 && ds->st[1].nwin == 0) return too_short(ds, 1, e);
    // records are stored with byte 0 between them; a record byte equal to sep_token would read
    // as a boundary too
    for (int s = 0; s < 2 && ds->sep > 0 && ds->sep < 256; s++)
        if (c->buf[s].n && memchr(c->buf[s].p, ds->sep, c->buf[s].n)) ds->sep_inside = 1;
    return 0;
}

static int finish_bin(DataSet* ds, Err* e) {
    const uint64_t T = (uint64_t)ds->seq_len;
    uint64_t n = 0;
    for (int k = 0; k < ds->nsegs; k++) n += ds->segs[k].n;
    uint64_t W = windows_of(n, ds->seq_len);
    uint64_t nval = ds->val_frac > 0 ? (uint64_t)llround((double)W * ds->val_frac) : 0;
    if (ds->val_frac > 0 && nval == 0) nval = 1;
    if (W <= nval) {
        ds->st[0].ntok = n;
        return err_set(e, "data: %s%s: %llu tokens make %llu windows of seq_len %d, %llu of them for validation, "
                       "none left for training; lower train.seq_len or data.val_frac, or give more data", ds->first,
                       ds->nfiles > 1 ? " (and the other files)" : "", (unsigned long long)n, (unsigned long long)W,
                       ds->seq_len, (unsigned long long)nval);
    }
    uint64_t ntrain = W - nval;  // window w covers [w·T, w·T + T + 1): train 0..ntrain-1, then validation
    stream_slice(&ds->st[0], ds->segs, ds->nsegs, 0, ntrain * T + 1);
    if (nval) stream_slice(&ds->st[1], ds->segs, ds->nsegs, ntrain * T, W * T + 1);
    else stream_slice(&ds->st[1], ds->segs, ds->nsegs, 0, 0);
    for (int s = 0; s < 2; s++) ds->st[s].nwin = windows_of(ds->st[s].ntok, ds->seq_len);
    return 0;
}

static DataSet* new_set(const DataConfig* dc, int vocab, int seq_len, uint64_t seed) {
    DataSet* ds = xcalloc(1, sizeof *ds);
    ds->seq_len = seq_len;
    ds->vocab = vocab;
    ds->sep = dc->sep_token;
    ds->shuffle = dc->shuffle;
    ds->seed = seed;
    ds->val_frac = dc->val_frac;
    ds->doc_sep = dc->sep_token;
    ds->eos = -1;
    corpus_init(&ds->corpus, dc->val_frac, vocab);
    return ds;
}

static int check_args(const DataConfig* dc, int vocab, int seq_len, Err* e) {
    if (seq_len < 1) return err_set(e, "train.seq_len = %d: must be >= 1", seq_len);
    if (vocab < 1) return err_set(e, "model.vocab_size = %d: must be >= 1", vocab);
    if (!(dc->val_frac >= 0 && dc->val_frac < 1))
        return err_set(e, "data.val_frac = %g: must be in [0, 1)", (double)dc->val_frac);
    if ((unsigned)dc->format > DATA_RANDOM) return err_set(e, "data.format: unknown value %d", (int)dc->format);
    return 0;
}

static int finish(DataSet* ds, DataSet** out, Err* e) {
    int rc = ds->kind == KIND_BIN ? finish_bin(ds, e) : ds->kind == KIND_BYTES ? finish_bytes(ds, e) : 0;
    if (rc) { data_close(ds); return -1; }
    *out = ds;
    return 0;
}

static void open_random(DataSet* ds) {
    ds->kind = KIND_RANDOM;
    ds->st[0].nwin = DATA_UNLIMITED;
    ds->st[1].nwin = ds->val_frac > 0 ? DATA_RANDOM_VAL : 0;
    ds->fmt_mask = 1u << DATA_RANDOM;
}

// ---- plain sets and mixtures ----------------------------------------------------------------------

static int open_plain(DataSet** out, const DataConfig* dc0, const PathList* files, float val_frac, int shuffle,
                      int vocab_size, int seq_len, uint64_t seed, Err* e) {
    *out = NULL;
    DataConfig dc = *dc0;
    dc.val_frac = val_frac;
    dc.shuffle = shuffle;
    DataSet* ds = new_set(&dc, vocab_size, seq_len, seed);
    for (int i = 0; i < files->n; i++)
        if (add_file(ds, files->p[i], dc.format, e)) { data_close(ds); return -1; }
    if (!files->n) { data_close(ds); return err_set(e, "data.path = '%s' names no file", dc0->path); }
    if (ds->kind == KIND_BIN) {
        int m = shard_manifest_eos(files->p[0]);
        if (m >= 0) ds->doc_sep = ds->eos = m;
    }
    return finish(ds, out, e);
}

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

// data.path and data.val_path expanded into files: one list per data.weights source (mix), or
// one for all; the validation files, those named by data.val_path or else the directories' own.
typedef struct Sources {
    char* items[256];  // data.path's items (pointers into the caller's copy)
    int n, nv, mix, nsrc;
    double w[256];     // data.weights, with mix
    PathList* src;     // [nsrc]
    PathList dir_val, val;
} Sources;

static void sources_free(Sources* S) {
    for (int d = 0; d < S->nsrc; d++) path_list_free(&S->src[d]);
    free(S->src);
    path_list_free(&S->dir_val);
    path_list_free(&S->val);
}

// list, vlist: writable copies of data.path and data.val_path. 0, or -1 with the reason in e;
// sources_free S either way.
static int sources_expand(Sources* S, const DataConfig* dc, char* list, char* vlist, Err* e) {
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

// A set of components: the weighted sources (blended), or one source with separate validation files.
static int open_mix(DataSet** out, const DataConfig* dc, const Sources* S, int vocab_size, int seq_len, uint64_t seed,
                    Err* e) {
    const int nsrc = S->nsrc, mix = S->mix;
    DataSet* ds = new_set(dc, vocab_size, seq_len, seed);
    ds->kind = KIND_MIX;
    ds->ncomp = nsrc;
    ds->comp = xcalloc((size_t)nsrc, sizeof(DataSet*));
    float vf = S->val.n ? 0.0f : dc->val_frac;
    int rc = 0;
    for (int d = 0; d < nsrc && !rc; d++) {
        uint64_t sd = d ? data_mix64(seed ^ data_mix64((uint64_t)d * 0x9E37ull)) : seed;
        rc = open_plain(&ds->comp[d], dc, &S->src[d], vf, dc->shuffle, vocab_size, seq_len, sd, e);
        if (rc && mix) {
            Err c = *e;
            err_set(e, "data.path item %d ('%s'): %s", d + 1, S->items[d], c.msg);
        }
        if (!rc && mix && ds->comp[d]->kind != KIND_BIN)
            rc = err_set(e, "data.weights mixes .bin shards only; '%s' is a sequence file: tokenize it first "
                         "(scripts/tokenize_data.py, docs/data.md)", S->items[d]);
    }
    if (!rc && S->val.n) {
        rc = open_plain(&ds->val, dc, &S->val, 0.0f, 0, vocab_size, seq_len, seed, e);
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

int data_open(DataSet** out, const DataConfig* dc, int vocab_size, int seq_len, uint64_t seed, Err* e) {
    *out = NULL;
    if (check_args(dc, vocab_size, seq_len, e)) return -1;
    if (dc->format == DATA_RANDOM) {
        DataSet* ds = new_set(dc, vocab_size, seq_len, seed);
        open_random(ds);
        return finish(ds, out, e);
    }
    char list[CFG_STR], vlist[CFG_STR];
    snprintf(list, sizeof list, "%s", dc->path[0] ? dc->path : DEFAULT_DATA);
    snprintf(vlist, sizeof vlist, "%s", dc->val_path);
    Sources S;
    int rc = sources_expand(&S, dc, list, vlist, e);
    DataSet* ds = NULL;
    if (!rc && !S.mix && !S.val.n) rc = open_plain(&ds, dc, &S.src[0], dc->val_frac, dc->shuffle, vocab_size, seq_len, seed, e);
    else if (!rc) rc = open_mix(&ds, dc, &S, vocab_size, seq_len, seed, e);
    sources_free(&S);
    if (rc) return -1;
    *out = ds;
    return 0;
}

int data_is_byte_level(const DataConfig* dc) {
    if (dc->format == DATA_BIN || dc->format == DATA_RANDOM) return 0;
    if (dc->format != DATA_AUTO) return 1;
    char list[CFG_STR];
    snprintf(list, sizeof list, "%s", dc->path[0] ? dc->path : DEFAULT_DATA);
    char* items[1];
    if (!split_list_inplace(list, items, 1)) return 0;
    char path[PATH_MAX];
    if (strpbrk(items[0], "*?[")) {
        glob_t g;
        if (glob(items[0], 0, NULL, &g) || g.gl_pathc == 0) return 0;
        snprintf(path, sizeof path, "%s", g.gl_pathv[0]);
        globfree(&g);
    } else {
        data_resolve_path(items[0], path, sizeof path);
    }
    struct stat st;
    if (stat(path, &st) || S_ISDIR(st.st_mode)) return 0;  // directories hold shards
    FILE* f = fopen(path, "rb");
    if (!f) return 0;
    uint8_t head[4];
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    if (is_gzip(head, n)) return 1;
    return data_detect(head, n, path) != DATA_BIN;
}

int data_open_buffer(DataSet** out, const DataConfig* dc, const char* name, const uint8_t* buf, size_t n,
                     int vocab_size, int seq_len, uint64_t seed, Err* e) {
    *out = NULL;
    if (check_args(dc, vocab_size, seq_len, e)) return -1;
    DataSet* ds = new_set(dc, vocab_size, seq_len, seed);
    int rc = 0;
    if (dc->format == DATA_RANDOM) open_random(ds);
    else if (n == 0) rc = err_set(e, "data: %s is empty (0 bytes)", name);
    else if (dc->format == DATA_BIN && is_gzip(buf, n))
        rc = err_set(e, "data: %s: a gzip'd llm.c .bin shard; gunzip it first (shards are mmap'd)", name);
    else if (wants_bin(dc->format, buf, n, name)) rc = add_bin(ds, name, buf, n, e);
    else {
        Reader r;
        reader_open_mem(&r, name, buf, n);
        rc = add_seq(ds, &r, name, dc->format, e);
        reader_close(&r);
    }
    if (rc) { data_close(ds); return -1; }
    return finish(ds, out, e);
}

void data_close(DataSet* ds) {
    if (!ds) return;
    for (int s = 0; s < 2; s++) stream_free(&ds->st[s]);
    corpus_free(&ds->corpus);
    for (int k = 0; k < ds->nmaps; k++) bin_unmap(&ds->maps[k]);
    free(ds->maps);
    free(ds->segs);
    for (int d = 0; d < ds->ncomp; d++) data_close(ds->comp[d]);
    free(ds->comp);
    free(ds->weight);
    free(ds->tab_src);
    free(ds->tab_k);
    free(ds->per_period);
    data_close(ds->val);
    free(ds);
}

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

// ---- description -------------------------------------------------------------------------------

static void human(uint64_t v, char* b, size_t n) {
    if (v >= 1000000000ull) snprintf(b, n, "%.2fG", (double)v / 1e9);
    else if (v >= 1000000ull) snprintf(b, n, "%.2fM", (double)v / 1e6);
    else if (v >= 10000ull) snprintf(b, n, "%.1fK", (double)v / 1e3);
    else snprintf(b, n, "%llu", (unsigned long long)v);
}

static void describe_plain(const DataSet* ds, char* buf, size_t n, int as_val);

void data_describe(const DataSet* ds, char* buf, size_t n) {
    if (ds->kind == KIND_MIX) {
        size_t o = 0;
        buf[0] = 0;
        for (int d = 0; d < ds->ncomp && o + 1 < n; d++) {
            if (ds->weight) o += (size_t)snprintf(buf + o, n - o, "%ssource %d (weight %.3g): ", d ? "; " : "", d + 1,
                                                  ds->weight[d]);
            if (o + 1 < n) data_describe(ds->comp[d], buf + o, n - o);
            o += strlen(buf + o);
        }
        if (ds->val && o + 1 < n) {
            o += (size_t)snprintf(buf + o, n - o, "; validation data: ");
            if (o + 1 < n) describe_plain(ds->val, buf + o, n - o, 1);
        }
        return;
    }
    if (ds->kind == KIND_RANDOM) {
        snprintf(buf, n, "random tokens in [0, %d) from seed %llu: unlimited train windows, %llu validation "
                 "(seq_len %d)", ds->vocab, (unsigned long long)ds->seed, (unsigned long long)ds->st[1].nwin,
                 ds->seq_len);
        return;
    }
    describe_plain(ds, buf, n, 0);
}

// One source (not a mix): its files, tokens and windows; as_val: data.val_path's data, all of
// which is validation (its split 0), said so.
static void describe_plain(const DataSet* ds, char* buf, size_t n, int as_val) {
    char fmt[64] = "";
    for (int f = DATA_FASTA; f <= DATA_BIN; f++)
        if (ds->fmt_mask & (1u << f))
            snprintf(fmt + strlen(fmt), sizeof fmt - strlen(fmt), "%s%s", fmt[0] ? "+" : "", data_fmt_name(f));
    if (ds->kind == KIND_BIN)
        snprintf(fmt + strlen(fmt), sizeof fmt - strlen(fmt), " %s",
                 ds->width_mask == (1u << 2) ? "uint16" : ds->width_mask == (1u << 4) ? "uint32" : "uint16+uint32");
    char files[300], recs[128] = "", t0[32], t1[32];
    if (ds->nfiles > 1) snprintf(files, sizeof files, "%s and %d more", ds->first, ds->nfiles - 1);
    else snprintf(files, sizeof files, "%s", ds->first);
    if (ds->kind == KIND_BYTES) {
        if (ds->single)
            snprintf(recs, sizeof recs, "1 record split by position; ");
        else
            snprintf(recs, sizeof recs, "%llu records (%llu train, %llu validation); ",
                     (unsigned long long)ds->corpus.nrec, (unsigned long long)ds->st[0].records,
                     (unsigned long long)ds->st[1].records);
    }
    human(ds->st[0].ntok, t0, sizeof t0);
    human(ds->st[1].ntok, t1, sizeof t1);
    if (as_val) {
        recs[0] = 0;
        if (ds->kind == KIND_BYTES && !ds->single)
            snprintf(recs, sizeof recs, "%llu records; ", (unsigned long long)ds->corpus.nrec);
        snprintf(buf, n, "%s%s, %s: %stokens %s; windows %llu (seq_len %d, stride %d, in order)", fmt,
                 ds->any_gz ? " (gzip)" : "", files, recs, t0, (unsigned long long)ds->st[0].nwin, ds->seq_len,
                 ds->seq_len);
        return;
    }
    if (!ds->st[1].ntok && !ds->st[1].nwin) {  // no split (val_frac 0, or separate validation data)
        snprintf(buf, n, "%s%s, %s: %stokens %s train; windows %llu train (seq_len %d, stride %d, shuffle %s)", fmt,
                 ds->any_gz ? " (gzip)" : "", files, recs, t0, (unsigned long long)ds->st[0].nwin, ds->seq_len,
                 ds->seq_len, ds->shuffle ? "on" : "off");
        return;
    }
    snprintf(buf, n, "%s%s, %s: %stokens %s train, %s validation; windows %llu train, %llu validation "
             "(seq_len %d, stride %d, shuffle %s)", fmt, ds->any_gz ? " (gzip)" : "", files, recs, t0, t1,
             (unsigned long long)ds->st[0].nwin, (unsigned long long)ds->st[1].nwin, ds->seq_len, ds->seq_len,
             ds->shuffle ? "on" : "off");
}
