// data.c — sequence files (FASTA / FASTQ / text, gzip'd or not) as byte tokens, llm.c .bin
// token shards, and a random source. See data.h.
//
// Sequence files: each record's residues (whitespace dropped) are its bytes; a record is
// followed by data.sep_token. Records go to train or validation by a hash of their index
// (seed-independent), and each split's records form one token stream cut into windows of
// seq_len + 1 tokens at stride seq_len. A single-record file (a genome) is split by position.
#define _DEFAULT_SOURCE
#include "data.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "util.h"

typedef struct Split {
    uint8_t* tok8;      // [n] byte tokens (sequence files), or NULL
    int32_t* tok32;     // [n] tokens (.bin), or NULL
    uint64_t n;         // tokens
    uint64_t windows;
    uint64_t records;
} Split;

struct DataSet {
    DataFormat fmt;
    int seq_len, vocab, shuffle;
    uint64_t seed;
    Split sp[2];
    char path[CFG_STR];
};

typedef struct Buf { uint8_t* p; uint64_t n, cap; } Buf;
static void buf_push(Buf* b, uint8_t v) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 1 << 16;
        b->p = realloc(b->p, b->cap);
        CHECK(b->p, "out of host memory reading data");
    }
    b->p[b->n++] = v;
}

static int is_val_record(uint64_t idx, float frac) {
    uint64_t x = idx * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (double)(x >> 11) / 9007199254740992.0 < frac;
}

// Parses sequence text (FASTA, FASTQ or plain lines) into the two splits.
static int parse_seq(DataSet* d, const char* name, gzFile f, DataFormat fmt, const DataConfig* dc, Err* e) {
    Buf rec = {0}, out[2] = {{0}, {0}};
    uint64_t nrec = 0, line = 0, recs[2] = {0, 0};
    char buf[1 << 16];
    int in_rec = 0, fq_state = 0;  // FASTQ: 0 header, 1 seq, 2 plus, 3 qual
    int first = 1;
    int rc = 0;
    uint64_t single_first = 0;
#define END_RECORD()                                                   \
    do {                                                               \
        if (in_rec) {                                                  \
            int v = is_val_record(nrec, dc->val_frac);                 \
            for (uint64_t i_ = 0; i_ < rec.n; i_++) buf_push(&out[v], rec.p[i_]); \
            buf_push(&out[v], (uint8_t)dc->sep_token);                 \
            recs[v]++;                                                 \
            nrec++;                                                    \
            rec.n = 0;                                                 \
        }                                                              \
    } while (0)
    while (gzgets(f, buf, sizeof buf)) {
        line++;
        size_t len = strlen(buf);
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) buf[--len] = 0;
        if (first) {
            first = 0;
            if (fmt == DATA_AUTO) fmt = buf[0] == '>' ? DATA_FASTA : buf[0] == '@' ? DATA_FASTQ : DATA_TEXT;
            if (fmt == DATA_FASTA && buf[0] != '>') { rc = err_set(e, "%s: line 1: not FASTA (expected '>' first); set data.format", name); goto out; }
            if (fmt == DATA_FASTQ && buf[0] != '@') { rc = err_set(e, "%s: line 1: not FASTQ (expected '@' first); set data.format", name); goto out; }
        }
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)buf[i] >= 128 || buf[i] == 0 || (unsigned char)buf[i] >= (unsigned)d->vocab) {
                rc = err_set(e, "%s: line %llu: byte 0x%02x is not sequence text (non-ASCII or >= model.vocab_size)", name,
                             (unsigned long long)line, (unsigned char)buf[i]);
                goto out;
            }
        if (fmt == DATA_FASTA) {
            if (buf[0] == '>') { END_RECORD(); in_rec = 1; continue; }
            for (size_t i = 0; i < len; i++) if (buf[i] != ' ' && buf[i] != '\t') buf_push(&rec, (uint8_t)buf[i]);
        } else if (fmt == DATA_FASTQ) {
            if (fq_state == 0) {
                if (len == 0) continue;
                if (buf[0] != '@') { rc = err_set(e, "%s: line %llu: FASTQ record must start with '@'", name, (unsigned long long)line); goto out; }
                in_rec = 1;
            } else if (fq_state == 1) {
                for (size_t i = 0; i < len; i++) buf_push(&rec, (uint8_t)buf[i]);
            } else if (fq_state == 2) {
                if (buf[0] != '+') { rc = err_set(e, "%s: line %llu: FASTQ separator line must start with '+'", name, (unsigned long long)line); goto out; }
            } else {
                END_RECORD();
                in_rec = 0;
            }
            fq_state = (fq_state + 1) % 4;
        } else {
            in_rec = 1;
            for (size_t i = 0; i < len; i++) buf_push(&rec, (uint8_t)buf[i]);
            END_RECORD();
            in_rec = 0;
        }
    }
    if (fmt == DATA_FASTQ && fq_state != 0) { rc = err_set(e, "%s: truncated FASTQ record at line %llu", name, (unsigned long long)line); goto out; }
    END_RECORD();
    if (nrec == 0) { rc = err_set(e, "%s: no records (empty file?)", name); goto out; }
    if (nrec == 1 || recs[0] == 0 || recs[1] == 0) {  // split one stream by position
        Buf all = {0};
        for (int v = 0; v < 2; v++) for (uint64_t i = 0; i < out[v].n; i++) buf_push(&all, out[v].p[i]);
        uint64_t nval = (uint64_t)((double)all.n * dc->val_frac);
        single_first = all.n - nval;
        free(out[0].p); free(out[1].p);
        out[0] = (Buf){0}; out[1] = (Buf){0};
        for (uint64_t i = 0; i < all.n; i++) buf_push(&out[i >= single_first], all.p[i]);
        free(all.p);
        recs[0] = nrec; recs[1] = nrec == 1 ? 1 : 0;
    }
    d->fmt = fmt;
    for (int v = 0; v < 2; v++) {
        d->sp[v].tok8 = out[v].p;
        d->sp[v].n = out[v].n;
        d->sp[v].records = recs[v];
        out[v].p = NULL;
    }
out:
    free(rec.p); free(out[0].p); free(out[1].p);
    return rc;
#undef END_RECORD
}

static int load_bin(DataSet* d, const char* name, const DataConfig* dc, Err* e) {
    FILE* f = fopen(name, "rb");
    if (!f) return err_set(e, "%s: %s", name, strerror(errno));
    int32_t hdr[256];
    if (fread(hdr, sizeof hdr, 1, f) != 1) { fclose(f); return err_set(e, "%s: truncated .bin header (needs 1024 bytes)", name); }
    if (hdr[0] != 20240520 || (hdr[1] != 1 && hdr[1] != 2)) { fclose(f); return err_set(e, "%s: not an llm.c token shard (magic %d, version %d)", name, hdr[0], hdr[1]); }
    const int w = hdr[1] == 1 ? 2 : 4;
    const uint64_t n = (uint32_t)hdr[2];
    int32_t* tok = malloc(sizeof(int32_t) * (n ? n : 1));
    CHECK(tok, "out of memory reading %s", name);
    uint8_t* raw = malloc((size_t)w * (n ? n : 1));
    CHECK(raw, "out of memory reading %s", name);
    size_t got = fread(raw, (size_t)w, n, f);
    fclose(f);
    if (got != n) { free(tok); free(raw); return err_set(e, "%s: truncated: header says %llu tokens (%llu bytes), file has %zu", name, (unsigned long long)n, (unsigned long long)(1024 + n * w), 1024 + got * w); }
    for (uint64_t i = 0; i < n; i++) {
        uint32_t v = w == 2 ? (uint32_t)((uint16_t*)raw)[i] : ((uint32_t*)raw)[i];
        if (v >= (uint32_t)d->vocab) { free(tok); free(raw); return err_set(e, "%s: token %u at token offset %llu is >= model.vocab_size (%d)", name, v, (unsigned long long)i, d->vocab); }
        tok[i] = (int32_t)v;
    }
    free(raw);
    uint64_t nval = (uint64_t)((double)n * dc->val_frac);
    d->sp[0].tok32 = tok;
    d->sp[0].n = n - nval;
    d->sp[1].tok32 = tok + (n - nval);
    d->sp[1].n = nval;
    d->fmt = DATA_BIN;
    return 0;
}

int data_open(DataSet** out, const DataConfig* dc, int vocab, int seq_len, uint64_t seed, Err* e) {
    DataSet* d = xcalloc(1, sizeof *d);
    d->seq_len = seq_len;
    d->vocab = vocab;
    d->seed = seed;
    d->shuffle = dc->shuffle;
    snprintf(d->path, sizeof d->path, "%s", dc->path);
    *out = NULL;
    if (dc->format == DATA_RANDOM) {
        d->fmt = DATA_RANDOM;
        d->sp[0].windows = d->sp[1].windows = 1ull << 40;
        *out = d;
        return 0;
    }
    const char* name = dc->path;
    const size_t L = strlen(name);
    int rc;
    if (dc->format == DATA_BIN || (dc->format == DATA_AUTO && L > 4 && !strcmp(name + L - 4, ".bin"))) {
        rc = load_bin(d, name, dc, e);
    } else {
        gzFile f = gzopen(name, "rb");
        if (!f) { free(d); return err_set(e, "data.path %s: %s", name, errno ? strerror(errno) : "cannot open"); }
        rc = parse_seq(d, name, f, dc->format, dc, e);
        gzclose(f);
    }
    if (rc) { data_close(d); return -1; }
    for (int v = 0; v < 2; v++) {
        Split* s = &d->sp[v];
        s->windows = s->n > (uint64_t)seq_len ? (s->n - 1) / (uint64_t)seq_len : 0;
        if (s->windows == 0) {
            err_set(e, "%s: the %s split has %llu tokens, fewer than one window of train.seq_len + 1 = %d; lower train.seq_len or change data.val_frac",
                    name, v ? "validation" : "training", (unsigned long long)s->n, seq_len + 1);
            data_close(d);
            return -1;
        }
    }
    *out = d;
    return 0;
}

void data_close(DataSet* d) {
    if (!d) return;
    free(d->sp[0].tok8);
    free(d->sp[1].tok8);
    free(d->sp[0].tok32);  // sp[1].tok32 points into it
    free(d);
}

uint64_t data_num_windows(const DataSet* d, int split) { return d->sp[split].windows; }

static uint64_t mix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}
static uint64_t gcd(uint64_t a, uint64_t b) { while (b) { uint64_t t = a % b; a = b; b = t; } return a; }

void data_get(const DataSet* d, int split, uint64_t i, int32_t* tok) {
    const int T = d->seq_len;
    if (d->fmt == DATA_RANDOM) {
        Rng r;
        rng_seed(&r, mix(d->seed * 2 + (uint64_t)split) ^ mix(i));
        for (int t = 0; t <= T; t++) tok[t] = (int32_t)(rng_u64(&r) % (uint64_t)d->vocab);
        return;
    }
    const Split* s = &d->sp[split];
    const uint64_t n = s->windows, epoch = i / n;
    uint64_t w = i % n;
    if (split == 0 && d->shuffle && n > 1) {  // a seeded affine bijection of [0, n) per epoch
        uint64_t h = mix(d->seed ^ mix(epoch + 1));
        uint64_t a = 1 + h % (n - 1);
        while (gcd(a, n) != 1) a = a % (n - 1) + 1;
        w = (uint64_t)(((unsigned __int128)a * w + mix(h)) % n);
    }
    const uint64_t o = w * (uint64_t)T;
    for (int t = 0; t <= T; t++) tok[t] = s->tok8 ? s->tok8[o + t] : s->tok32[o + t];
}

void data_describe(const DataSet* d, char* buf, size_t n) {
    static const char* names[] = {"auto", "fasta", "fastq", "text", "bin", "random"};
    if (d->fmt == DATA_RANDOM) {
        snprintf(buf, n, "random tokens in [0, %d)", d->vocab);
        return;
    }
    snprintf(buf, n, "%s (%s): train %llu records / %llu tokens / %llu windows, validation %llu / %llu / %llu",
             d->path, names[d->fmt], (unsigned long long)d->sp[0].records, (unsigned long long)d->sp[0].n,
             (unsigned long long)d->sp[0].windows, (unsigned long long)d->sp[1].records, (unsigned long long)d->sp[1].n,
             (unsigned long long)d->sp[1].windows);
}
