// data.c — opening a data set: files, memory or the random source read into one set, the
// train/validation split of its streams (byte-level records by hash, .bin windows by position),
// data_open (plain sets here, mixtures in data_mix.c) and data_close. Reading windows is in
// data_window.c, the log line in data_describe.c; parsers live in data_seq.c, .bin shards in
// data_bin.c, path expansion in data_paths.c.
#define _DEFAULT_SOURCE
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data_impl.h"

#define CHUNK ((size_t)1 << 20)
#define DEFAULT_DATA "data/hairpin.fa.gz"

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

DataSet* data_new_set(const DataConfig* dc, int vocab, int seq_len, uint64_t seed) {
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

int data_open_plain(DataSet** out, const DataConfig* dc0, const PathList* files, float val_frac, int shuffle,
                    int vocab_size, int seq_len, uint64_t seed, Err* e) {
    *out = NULL;
    DataConfig dc = *dc0;
    dc.val_frac = val_frac;
    dc.shuffle = shuffle;
    DataSet* ds = data_new_set(&dc, vocab_size, seq_len, seed);
    for (int i = 0; i < files->n; i++)
        if (add_file(ds, files->p[i], dc.format, e)) { data_close(ds); return -1; }
    if (!files->n) { data_close(ds); return err_set(e, "data.path = '%s' names no file", dc0->path); }
    if (ds->kind == KIND_BIN) {
        int m = shard_manifest_eos(files->p[0]);
        if (m >= 0) ds->doc_sep = ds->eos = m;
    }
    return finish(ds, out, e);
}

int data_open(DataSet** out, const DataConfig* dc, int vocab_size, int seq_len, uint64_t seed, Err* e) {
    *out = NULL;
    if (check_args(dc, vocab_size, seq_len, e)) return -1;
    if (dc->format == DATA_RANDOM) {
        DataSet* ds = data_new_set(dc, vocab_size, seq_len, seed);
        open_random(ds);
        return finish(ds, out, e);
    }
    char list[CFG_STR], vlist[CFG_STR];
    snprintf(list, sizeof list, "%s", dc->path[0] ? dc->path : DEFAULT_DATA);
    snprintf(vlist, sizeof vlist, "%s", dc->val_path);
    DataSources S;
    int rc = data_sources_expand(&S, dc, list, vlist, e);
    DataSet* ds = NULL;
    if (!rc && !S.mix && !S.val.n)
        rc = data_open_plain(&ds, dc, &S.src[0], dc->val_frac, dc->shuffle, vocab_size, seq_len, seed, e);
    else if (!rc) rc = data_open_mix(&ds, dc, &S, vocab_size, seq_len, seed, e);
    data_sources_free(&S);
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
    DataSet* ds = data_new_set(dc, vocab_size, seq_len, seed);
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
