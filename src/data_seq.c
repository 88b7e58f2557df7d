// data_seq.c — byte-level sources: the corpus (two split streams), the FASTA / FASTQ / text
// parsers (streaming state machines, fed chunks of any size), gzip'd or plain readers, and format
// detection. See data.h for the tokenisation rules.
#include <ctype.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "data_impl.h"

// ---- corpus ------------------------------------------------------------------------------------

uint64_t data_mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void corpus_init(Corpus* c, float val_frac, int vocab) {
    memset(c, 0, sizeof *c);
    c->cur = -1;
    c->val_frac = val_frac;
    c->vocab = vocab;
}

void corpus_free(Corpus* c) {
    free(c->buf[0].p);
    free(c->buf[1].p);
    memset(c, 0, sizeof *c);
}

int corpus_split_of(uint64_t i, float val_frac) {
    double u = (double)(data_mix64(i ^ 0x5EEDDA7Aull) >> 11) * 0x1.0p-53;  // uniform [0, 1)
    return u < (double)val_frac;
}

static void buf_reserve(ByteBuf* b, size_t more) {
    if (b->n + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : (size_t)1 << 16;
    while (cap < b->n + more) cap *= 2;
    uint8_t* p = realloc(b->p, cap);
    if (!p) FATAL("out of host memory growing the data stream to %zu bytes", cap);
    b->p = p;
    b->cap = cap;
}

static void corpus_append(Corpus* c, const uint8_t* p, size_t n) {
    if (c->cur < 0) {  // the first byte of a new record decides its split
        c->cur = corpus_split_of(c->nrec, c->val_frac);
        c->last_start[c->cur] = c->buf[c->cur].n;
        c->records[c->cur]++;
        c->nrec++;
    }
    ByteBuf* b = &c->buf[c->cur];
    buf_reserve(b, n);
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void corpus_end_record(Corpus* c) {
    if (c->cur < 0) return;  // records without tokens are not records
    ByteBuf* b = &c->buf[c->cur];
    buf_reserve(b, 1);
    b->p[b->n++] = 0;
    c->cur = -1;
}

static void move_last(Corpus* c, int from) {
    int to = 1 - from;
    ByteBuf* a = &c->buf[from];
    size_t st = c->last_start[from], len = a->n - st;
    buf_reserve(&c->buf[to], len);
    c->last_start[to] = c->buf[to].n;
    memcpy(c->buf[to].p + c->buf[to].n, a->p + st, len);
    c->buf[to].n += len;
    a->n = st;
    c->records[from]--;
    c->records[to]++;
}

void corpus_balance(Corpus* c) {
    if (c->nrec < 2 || c->val_frac <= 0) return;
    if (c->records[1] == 0) move_last(c, 0);
    else if (c->records[0] == 0) move_last(c, 1);
}

// ---- parsers -----------------------------------------------------------------------------------

enum { C_TOK = 0, C_DROP, C_NL, C_NUL, C_HIGH, C_VOCAB };  // byte classes in sequence lines
enum { S_START = 0, S_HEADER, S_SEQ,                       // FASTA / text
       Q_HDR_START, Q_HDR, Q_SEQ, Q_PLUS_START, Q_PLUS, Q_QUAL };  // FASTQ

void seqp_init(SeqParser* s, Corpus* c, DataFormat fmt, const char* name) {
    memset(s, 0, sizeof *s);
    s->c = c;
    s->fmt = fmt;
    s->name = name;
    s->line = 1;
    s->state = fmt == DATA_FASTQ ? Q_HDR_START : S_START;
    for (int b = 0; b < 256; b++) {
        uint8_t k = C_TOK;
        if (b == '\n') k = C_NL;
        else if (b == 0) k = C_NUL;
        else if (b == '\r') k = C_DROP;
        else if (fmt != DATA_TEXT && (b == ' ' || b == '\t' || b == '\v' || b == '\f')) k = C_DROP;
        else if (fmt != DATA_TEXT && b >= 128) k = C_HIGH;
        else if (b >= c->vocab) k = C_VOCAB;
        s->cls[b] = k;
    }
}

static const char* kind(const SeqParser* s) {
    return s->fmt == DATA_FASTA ? "FASTA" : s->fmt == DATA_FASTQ ? "FASTQ" : "text";
}

static int bad_byte(const SeqParser* s, uint8_t b, Err* e) {
    if (s->cls[b] == C_NUL || b == 0)
        return err_set(e, "data: %s: line %llu: NUL byte; this is not a %s file (a binary file? an llm.c "
                       ".bin shard needs its 20240520 header)", s->name, (unsigned long long)s->line, kind(s));
    if (s->cls[b] == C_HIGH)
        return err_set(e, "data: %s: line %llu: non-ASCII byte 0x%02x in a %s sequence; sequences must be "
                       "ASCII letters (use data.format=text for arbitrary bytes)", s->name,
                       (unsigned long long)s->line, b, kind(s));
    return err_set(e, "data: %s: line %llu: byte 0x%02x is token %d, >= model.vocab_size %d; byte-level data "
                   "needs model.vocab_size = 256", s->name, (unsigned long long)s->line, b, b, s->c->vocab);
}

// Length of the run of C_TOK bytes at p.
static size_t tok_run(const uint8_t* cls, const uint8_t* p, size_t n) {
    size_t i = 0;
    while (i < n && cls[p[i]] == C_TOK) i++;
    return i;
}

// Appends sequence bytes from p up to the end of the line; returns bytes consumed (the '\n' not
// included) or (size_t)-1 on a bad byte. counts: FASTQ quality lines count instead of appending.
static size_t seq_bytes(SeqParser* s, const uint8_t* p, size_t n, int count_only, Err* e) {
    size_t i = 0;
    while (i < n) {
        size_t r = tok_run(s->cls, p + i, n - i);
        if (r) {
            if (count_only) s->qual_len += r;
            else {
                if (s->fmt == DATA_FASTA && !s->seen_header)
                    return err_set(e, "data: %s: line %llu: not FASTA: sequence before the first '>' header "
                                   "(set data.format=text, or fix the file)", s->name,
                                   (unsigned long long)s->line), (size_t)-1;
                corpus_append(s->c, p + i, r);
                if (s->fmt == DATA_FASTQ) s->seq_len += r;
            }
            i += r;
            continue;
        }
        uint8_t k = s->cls[p[i]];
        if (k == C_NL) break;
        if (k == C_DROP) { i++; continue; }
        // quality strings are not tokens: only NUL and non-ASCII are wrong there
        if (count_only && k == C_VOCAB) { s->qual_len++; i++; continue; }
        bad_byte(s, p[i], e);
        return (size_t)-1;
    }
    return i;
}

// Skips a header-like line (FASTA '>', FASTQ '@'/'+'): returns bytes consumed up to the '\n'.
static size_t skip_line(SeqParser* s, const uint8_t* p, size_t n, Err* e) {
    const uint8_t* nl = memchr(p, '\n', n);
    size_t m = nl ? (size_t)(nl - p) : n;
    if (memchr(p, 0, m)) return bad_byte(s, 0, e), (size_t)-1;
    return m;
}

static int fastq_qual_done(SeqParser* s, Err* e) {
    if (s->qual_len != s->seq_len)
        return err_set(e, "data: %s: line %llu: bad FASTQ record (starts line %llu): quality has %llu characters, "
                       "sequence has %llu; records must be 4 lines (@id, sequence, +, quality)", s->name,
                       (unsigned long long)s->line, (unsigned long long)s->rec_line,
                       (unsigned long long)s->qual_len, (unsigned long long)s->seq_len);
    corpus_end_record(s->c);
    s->state = Q_HDR_START;
    return 0;
}

static int fastq_start(SeqParser* s, uint8_t b, int want, Err* e) {
    if (b == want) return 0;
    if (want == '@')
        return err_set(e, "data: %s: line %llu: %s: expected '@' starting a FASTQ record, found '%c'%s", s->name,
                       (unsigned long long)s->line, s->rec_line ? "bad FASTQ record" : "not FASTQ",
                       isprint(b) ? b : '?', s->rec_line ? "; records must be 4 lines (@id, sequence, +, quality)"
                                                         : " (set data.format to match the file)");
    return err_set(e, "data: %s: line %llu: bad FASTQ record (starts line %llu): expected the '+' line, found '%c'; "
                   "records must be 4 lines (@id, sequence, +, quality)", s->name, (unsigned long long)s->line,
                   (unsigned long long)s->rec_line, isprint(b) ? b : '?');
}

// The steps of seqp_feed, one per state: each reads from p[0, n) (n >= 1) and returns the bytes it
// consumed, or (size_t)-1 on an error (message in e).

// FASTA / text: sequence bytes up to the end of the line; the '\n' ends a text record.
static size_t step_seq(SeqParser* s, const uint8_t* p, size_t n, Err* e) {
    size_t m = seq_bytes(s, p, n, 0, e);
    if (m == (size_t)-1 || m == n) return m;
    s->line++;  // at the '\n'
    s->state = S_START;
    if (s->fmt == DATA_TEXT) corpus_end_record(s->c);
    return m + 1;
}

// FASTA / text, at the start of a line: a blank line (it ends a text record), a FASTA header or
// comment, else sequence.
static size_t step_line_start(SeqParser* s, const uint8_t* p, size_t n, Err* e) {
    const uint8_t b = p[0];
    if (b == '\n') {
        s->line++;
        if (s->fmt == DATA_TEXT) corpus_end_record(s->c);
        return 1;
    }
    if (s->fmt == DATA_FASTA && (b == '>' || b == ';')) {  // a header ends a record, a comment does not
        if (b == '>') {
            corpus_end_record(s->c);
            s->seen_header = 1;
        }
        s->state = S_HEADER;
        return 1;
    }
    s->state = S_SEQ;
    return step_seq(s, p, n, e);
}

// A line read past (FASTA header, FASTQ '@' and '+' lines); its '\n' moves to the next state.
static size_t step_skip_line(SeqParser* s, const uint8_t* p, size_t n, Err* e) {
    size_t m = skip_line(s, p, n, e);
    if (m == (size_t)-1 || m == n) return m;
    s->line++;
    s->state = s->state == S_HEADER ? S_START : s->state == Q_HDR ? Q_SEQ : Q_QUAL;
    return m + 1;
}

// FASTQ, between records: blank lines, then the '@' that starts the next one.
static size_t step_fastq_record(SeqParser* s, const uint8_t* p, Err* e) {
    if (p[0] == '\n') { s->line++; return 1; }  // blank lines between records
    if (fastq_start(s, p[0], '@', e)) return (size_t)-1;
    s->rec_line = s->line;
    s->seq_len = s->qual_len = 0;
    s->state = Q_HDR;
    return 1;
}

// FASTQ: the sequence line.
static size_t step_fastq_seq(SeqParser* s, const uint8_t* p, size_t n, Err* e) {
    size_t m = seq_bytes(s, p, n, 0, e);
    if (m == (size_t)-1 || m == n) return m;
    s->line++;
    s->state = Q_PLUS_START;
    return m + 1;
}

// FASTQ: the '+' that starts the line after the sequence.
static size_t step_fastq_plus(SeqParser* s, const uint8_t* p, Err* e) {
    if (fastq_start(s, p[0], '+', e)) return (size_t)-1;
    s->state = Q_PLUS;
    return 1;
}

// FASTQ: the quality line, counted; its '\n' ends the record.
static size_t step_fastq_qual(SeqParser* s, const uint8_t* p, size_t n, Err* e) {
    size_t m = seq_bytes(s, p, n, 1, e);
    if (m == (size_t)-1 || m == n) return m;
    if (fastq_qual_done(s, e)) return (size_t)-1;
    s->line++;
    return m + 1;
}

int seqp_feed(SeqParser* s, const uint8_t* p, size_t n, Err* e) {
    size_t i = 0;
    while (i < n) {
        size_t m = 0;
        switch (s->state) {
        case S_START: m = step_line_start(s, p + i, n - i, e); break;
        case S_SEQ: m = step_seq(s, p + i, n - i, e); break;
        case S_HEADER:
        case Q_HDR:
        case Q_PLUS: m = step_skip_line(s, p + i, n - i, e); break;
        case Q_HDR_START: m = step_fastq_record(s, p + i, e); break;
        case Q_SEQ: m = step_fastq_seq(s, p + i, n - i, e); break;
        case Q_PLUS_START: m = step_fastq_plus(s, p + i, e); break;
        case Q_QUAL: m = step_fastq_qual(s, p + i, n - i, e); break;
        }
        if (m == (size_t)-1) return -1;
        i += m;
    }
    return 0;
}

int seqp_end(SeqParser* s, Err* e) {
    if (s->fmt == DATA_FASTQ) {
        if (s->state == Q_QUAL) return fastq_qual_done(s, e);  // no '\n' after the last quality line
        if (s->state != Q_HDR_START)
            return err_set(e, "data: %s: line %llu: truncated FASTQ record (starts line %llu): the file ends "
                           "before its %s line", s->name, (unsigned long long)s->line,
                           (unsigned long long)s->rec_line,
                           s->state == Q_HDR || s->state == Q_SEQ ? "sequence" : s->state == Q_PLUS_START ? "'+'" : "quality");
        return 0;
    }
    corpus_end_record(s->c);
    return 0;
}

// ---- readers -----------------------------------------------------------------------------------

int reader_open_file(Reader* r, const char* path, Err* e) {
    memset(r, 0, sizeof *r);
    r->name = path;
    r->gz = gzopen(path, "rb");
    if (!r->gz) return err_set(e, "data: cannot open %s", path);
    gzbuffer(r->gz, 1 << 18);
    return 0;
}

void reader_open_mem(Reader* r, const char* name, const uint8_t* p, size_t n) {
    memset(r, 0, sizeof *r);
    r->name = name;
    r->mem = p;
    r->mem_n = n;
    r->mem_gz = n >= 2 && p[0] == 0x1f && p[1] == 0x8b;
    r->is_gz = r->mem_gz;
}

static long mem_inflate(Reader* r, uint8_t* buf, size_t cap, Err* e) {
    if (!r->zs_live) {
        if (inflateInit2(&r->zs, 16 + MAX_WBITS) != Z_OK) FATAL("zlib inflateInit2 failed");
        r->zs_live = 1;
    }
    if (cap > UINT_MAX) cap = UINT_MAX;
    r->zs.next_out = buf;
    r->zs.avail_out = (uInt)cap;
    while (r->zs.avail_out > 0 && !r->zs_done) {
        if (r->zs.avail_in == 0) {
            size_t left = r->mem_n - r->mem_pos, take = left > (1u << 30) ? (1u << 30) : left;
            if (take == 0)
                return err_set(e, "data: %s: truncated gzip data (it ends inside the compressed stream); "
                               "re-download or re-compress it", r->name);
            r->zs.next_in = (Bytef*)(r->mem + r->mem_pos);
            r->zs.avail_in = (uInt)take;
            r->mem_pos += take;
        }
        int ret = inflate(&r->zs, Z_NO_FLUSH);
        if (ret == Z_STREAM_END) {
            size_t at = r->mem_pos - r->zs.avail_in;  // another gzip member may follow
            if (r->mem_n - at >= 2 && r->mem[at] == 0x1f && r->mem[at + 1] == 0x8b) inflateReset(&r->zs);
            else r->zs_done = 1;
        } else if (ret != Z_OK) {
            return err_set(e, "data: %s: corrupt gzip data near compressed byte %zu (%s); re-download it", r->name,
                           r->mem_pos - r->zs.avail_in, r->zs.msg ? r->zs.msg : "inflate error");
        }
    }
    return (long)(cap - r->zs.avail_out);
}

long reader_read(Reader* r, uint8_t* buf, size_t cap, Err* e) {
    if (r->gz) {
        if (cap > (1u << 30)) cap = 1u << 30;
        int n = gzread(r->gz, buf, (unsigned)cap);
        int errnum = 0;
        const char* msg = gzerror(r->gz, &errnum);
        if (n < 0 || (errnum != Z_OK && errnum != Z_STREAM_END))
            return err_set(e, "data: %s: gzip error: %s (corrupt or truncated: re-download it)", r->name,
                           errnum == Z_ERRNO ? "read error" : msg);
        if (n > 0 && !gzdirect(r->gz)) r->is_gz = 1;
        return n;
    }
    if (r->mem_gz) return mem_inflate(r, buf, cap, e);
    size_t k = r->mem_n - r->mem_pos < cap ? r->mem_n - r->mem_pos : cap;
    memcpy(buf, r->mem + r->mem_pos, k);
    r->mem_pos += k;
    return (long)k;
}

void reader_close(Reader* r) {
    if (r->gz) gzclose(r->gz);
    if (r->zs_live) inflateEnd(&r->zs);
    memset(r, 0, sizeof *r);
}

// ---- detection ---------------------------------------------------------------------------------

const char* data_fmt_name(DataFormat f) {
    static const char* names[] = {"auto", "fasta", "fastq", "text", "bin", "random"};
    return (unsigned)f < 6 ? names[f] : "?";
}

int bin_has_magic(const uint8_t* p, size_t n) {
    if (n < 4) return 0;
    uint32_t m = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return m == BIN_MAGIC || m == BIN_MAGIC_U32;
}

static int ends_with(const char* s, const char* suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int has_ext(const char* name, const char* const* exts) {
    char base[64];
    for (int i = 0; exts[i]; i++) {
        snprintf(base, sizeof base, "%s.gz", exts[i]);
        if (ends_with(name, exts[i]) || ends_with(name, base)) return 1;
    }
    return 0;
}

DataFormat data_detect(const uint8_t* p, size_t n, const char* name) {
    static const char* const fa[] = {".fa", ".fasta", ".fna", ".ffn", ".faa", ".frn", ".fas", NULL};
    static const char* const fq[] = {".fq", ".fastq", NULL};
    if (bin_has_magic(p, n) || ends_with(name, ".bin")) return DATA_BIN;
    size_t i = 0;
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n')) i++;
    if (i < n && p[i] == '>') return DATA_FASTA;
    if (i < n && p[i] == '@') return DATA_FASTQ;
    if (has_ext(name, fa)) return DATA_FASTA;
    if (has_ext(name, fq)) return DATA_FASTQ;
    return DATA_TEXT;
}
