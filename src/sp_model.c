// sp_model.c — a SentencePiece model (tokenizer.model) read from its protobuf: the special tokens
// that export writes (sp_read), and the pieces, scores, types and normaliser flags that
// `moetrain generate` encodes with (sp_open; the encoding is in sp_encode.c).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "util.h"

// ---- protobuf (as much of the wire format as a ModelProto needs) -----------------------------

typedef struct Pb {
    const uint8_t* p;
    size_t n, i;
} Pb;

static int pb_varint(Pb* b, uint64_t* v) {
    *v = 0;
    for (int s = 0; s < 64 && b->i < b->n; s += 7) {
        uint8_t c = b->p[b->i++];
        *v |= (uint64_t)(c & 0x7F) << s;
        if (c < 0x80) return 0;
    }
    return -1;
}

// Next field: number, wire type, varint value or [sub, sublen]. 1 = got one, 0 = end, -1 = bad.
static int pb_next(Pb* b, int* field, int* wt, uint64_t* v, const uint8_t** sub, size_t* sublen) {
    if (b->i >= b->n) return 0;
    uint64_t key;
    if (pb_varint(b, &key)) return -1;
    *field = (int)(key >> 3);
    *wt = (int)(key & 7);
    if (*wt == 0) return pb_varint(b, v) ? -1 : 1;
    if (*wt == 1 || *wt == 5) {
        size_t k = *wt == 1 ? 8 : 4;
        if (b->n - b->i < k) return -1;
        *v = 0;  // fixed64 / fixed32, little-endian (a float's bits for wire type 5)
        for (size_t j = 0; j < k; j++) *v |= (uint64_t)b->p[b->i + j] << (8 * j);
        b->i += k;
        return 1;
    }
    if (*wt == 2) {
        uint64_t len;
        if (pb_varint(b, &len) || len > b->n - b->i) return -1;
        *sub = b->p + b->i;
        *sublen = (size_t)len;
        b->i += (size_t)len;
        return 1;
    }
    return -1;
}

// The varint field `field` of the message p[n] (its last occurrence, as protobuf reads a repeated
// scalar; fields after a malformed one are not seen): 1 with its value in *v, 0 when absent.
static int pb_varint_field(const uint8_t* p, size_t n, int field, uint64_t* v) {
    Pb b = {p, n, 0};
    int f, wt, found = 0;
    uint64_t u = 0;
    const uint8_t* sub = NULL;
    size_t sl = 0;
    while (pb_next(&b, &f, &wt, &u, &sub, &sl) == 1)
        if (f == field && wt == 0) *v = u, found = 1;
    return found;
}

int sp_read(const char* path, SpInfo* s, Err* e) {
    memset(s, 0, sizeof *s);
    s->bos = 1, s->eos = 2, s->pad = -1, s->unk = 0;  // SentencePiece's defaults
    char* text;
    size_t n;
    if (tok_read_all(path, &text, &n, e)) return -1;
    Pb b = {(const uint8_t*)text, n, 0};
    int f, wt, r;
    uint64_t v;
    const uint8_t* sub = NULL;
    size_t sl = 0;
    // pieces: only their strings at the special ids are kept, after the ids are known: two passes
    while ((r = pb_next(&b, &f, &wt, &v, &sub, &sl)) == 1) {
        if (f == 1 && wt == 2) s->n++;
        if (f == 2 && wt == 2) {
            Pb t = {sub, sl, 0};
            int g, wt2;
            uint64_t u;
            const uint8_t* s2;
            size_t l2;
            int r2;
            while ((r2 = pb_next(&t, &g, &wt2, &u, &s2, &l2)) == 1) {
                if (wt2 != 0) continue;
                if (g == 40) s->unk = (int)(int32_t)u;
                if (g == 41) s->bos = (int)(int32_t)u;
                if (g == 42) s->eos = (int)(int32_t)u;
                if (g == 43) s->pad = (int)(int32_t)u;
            }
            if (r2 < 0) r = -1;
        }
    }
    if (r < 0 || s->n == 0) {
        free(text);
        return err_set(e, "%s is not a SentencePiece model (its protobuf does not parse, or has no pieces)", path);
    }
    b.i = 0;
    int idx = 0;
    const int want[4] = {s->bos, s->eos, s->pad, s->unk};
    while (pb_next(&b, &f, &wt, &v, &sub, &sl) == 1) {
        if (!(f == 1 && wt == 2)) continue;
        Pb t = {sub, sl, 0};
        int g, wt2;
        uint64_t u;
        const uint8_t* s2 = NULL;
        size_t l2 = 0;
        while (pb_next(&t, &g, &wt2, &u, &s2, &l2) == 1)
            if (g == 1 && wt2 == 2)
                for (int k = 0; k < 4; k++)
                    if (want[k] == idx) snprintf(s->names[k], sizeof s->names[k], "%.*s", (int)(l2 < 127 ? l2 : 127), (const char*)s2);
        idx++;
    }
    free(text);
    return 0;
}

// ---- the model for encoding ------------------------------------------------------------------

int sp_vocab(const SpModel* s) { return s->n; }
int sp_eos(const SpModel* s) { return s->eos; }
int sp_bos(const SpModel* s) { return s->bos; }

void sp_close(SpModel* s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->piece[i]);
    free(s->piece), free(s->score), free(s->type);
    strmap_free(&s->map);
    free(s);
}

// An empty model for info's pieces, with SentencePiece's defaults until the file says otherwise.
static SpModel* sp_new(const SpInfo* info) {
    SpModel* s = xcalloc(1, sizeof *s);
    s->piece = xcalloc((size_t)info->n, sizeof(char*));
    s->score = xcalloc((size_t)info->n, sizeof(float));
    s->type = xcalloc((size_t)info->n, 1);
    s->bos = info->bos, s->eos = info->eos, s->unk = info->unk;
    s->dummy_prefix = 1, s->collapse_ws = 1, s->bpe = 0;
    for (int i = 0; i < 256; i++) s->byte_id[i] = -1;
    return s;
}

// ModelProto.pieces (field 1): the next piece's text, score and type.
static void sp_add_piece(SpModel* s, const uint8_t* sub, size_t sl) {
    Pb t = {sub, sl, 0};
    int g, wt2;
    uint64_t u = 0;
    const uint8_t* s2 = NULL;
    size_t l2 = 0;
    const int id = s->n++;
    s->type[id] = SP_NORMAL;
    while (pb_next(&t, &g, &wt2, &u, &s2, &l2) == 1) {
        if (g == 1 && wt2 == 2) {
            s->piece[id] = xmalloc(l2 + 1);
            memcpy(s->piece[id], s2, l2);
            s->piece[id][l2] = 0;
        } else if (g == 2 && wt2 == 5) {
            uint32_t bits = (uint32_t)u;
            memcpy(&s->score[id], &bits, 4);
        } else if (g == 3 && wt2 == 0) {
            s->type[id] = (uint8_t)u;
        }
    }
    if (!s->piece[id]) s->piece[id] = xstrdup("");
}

// ModelProto.trainer_spec (field 2): BPE or unigram, byte fallback.
static void sp_read_trainer_spec(SpModel* s, const uint8_t* sub, size_t sl) {
    uint64_t u;
    if (pb_varint_field(sub, sl, 3, &u)) s->bpe = u == 2;
    if (pb_varint_field(sub, sl, 35, &u)) s->byte_fallback = u != 0;
}

// ModelProto.normalizer_spec (field 3): the dummy prefix, whitespace collapsing.
static void sp_read_normalizer_spec(SpModel* s, const uint8_t* sub, size_t sl) {
    uint64_t u;
    if (pb_varint_field(sub, sl, 3, &u)) s->dummy_prefix = u != 0;
    if (pb_varint_field(sub, sl, 4, &u)) s->collapse_ws = u != 0;
}

// What encoding looks up: piece → id of the pieces text may match, the <0xNN> piece of each byte,
// the longest piece.
static void sp_index(SpModel* s) {
    strmap_init(&s->map);
    for (int i = 0; i < s->n; i++) {
        const char* p = s->piece[i];
        unsigned x;
        if (s->type[i] == SP_BYTE && strlen(p) == 6 && sscanf(p, "<0x%2X>", &x) == 1) s->byte_id[x & 255] = i;
        if (s->type[i] == SP_NORMAL || s->type[i] == SP_USER || s->type[i] == SP_UNUSED) {
            int old;
            strmap_put(&s->map, p, i, &old);
            int len = (int)strlen(p);
            if (len > s->maxlen) s->maxlen = len;
        }
    }
}

int sp_open(SpModel** out, const char* spec, Err* e) {
    TokFiles tf;
    *out = NULL;
    if (tok_find(spec, &tf, e)) return -1;
    if (!tf.model[0]) return err_set(e, "%s: generate reads SentencePiece models (tokenizer.model); this is a tokenizer.json", spec);
    SpInfo info;
    if (sp_read(tf.model, &info, e)) return -1;
    char* text;
    size_t n;
    if (tok_read_all(tf.model, &text, &n, e)) return -1;
    SpModel* s = sp_new(&info);
    Pb b = {(const uint8_t*)text, n, 0};
    int f, wt;
    uint64_t v;
    const uint8_t* sub = NULL;
    size_t sl = 0;
    while (pb_next(&b, &f, &wt, &v, &sub, &sl) == 1) {
        if (wt != 2) continue;
        if (f == 1) sp_add_piece(s, sub, sl);
        else if (f == 2) sp_read_trainer_spec(s, sub, sl);
        else if (f == 3) sp_read_normalizer_spec(s, sub, sl);
    }
    free(text);
    sp_index(s);
    *out = s;
    return 0;
}
