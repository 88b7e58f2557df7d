// sp_encode.c — SentencePiece encode / decode for `moetrain generate`: the normaliser, BPE and
// unigram segmentation, and a piece's text (the model is read by sp_model.c).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "util.h"

static int utf8_len(uint8_t c) { return c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }

// Piece id of bytes [p, p + n), or -1.
static int sp_find(const SpModel* s, const char* p, int n, char* buf) {
    memcpy(buf, p, (size_t)n);
    buf[n] = 0;
    return strmap_get(&s->map, buf);
}

// Emits the ids of one symbol [p, p + n) with no piece of its own: bytes or unk.
static void sp_emit_fallback(const SpModel* s, const char* p, int n, int32_t* ids, int* k) {
    if (s->byte_fallback) {
        for (int j = 0; j < n; j++) ids[(*k)++] = s->byte_id[(uint8_t)p[j]] >= 0 ? s->byte_id[(uint8_t)p[j]] : s->unk;
    } else {
        ids[(*k)++] = s->unk;
    }
}

// SentencePiece's normalisation of text: spaces → ▁ (U+2581), optional collapse of runs / trim,
// optional dummy prefix. Returns the normalised string (caller frees), *m its length.
static char* sp_normalise(const SpModel* s, const char* text, size_t* m_out) {
    const size_t tn = strlen(text);
    char* t = xmalloc(3 * tn + 8);
    size_t m = 0;
    const char* a = text;
    const char* z = text + tn;
    if (s->collapse_ws) {
        while (a < z && *a == ' ') a++;
        while (z > a && z[-1] == ' ') z--;
    }
    if (s->dummy_prefix && a < z) memcpy(t + m, "\xE2\x96\x81", 3), m += 3;
    for (const char* q = a; q < z; q++) {
        if (*q == ' ') {
            if (s->collapse_ws && q > a && q[-1] == ' ') continue;
            memcpy(t + m, "\xE2\x96\x81", 3), m += 3;
        } else {
            t[m++] = *q;
        }
    }
    t[m] = 0;
    *m_out = m;
    return t;
}

// BPE over t[0, m): symbols are UTF-8 characters; the best-scoring adjacent pair that is a piece
// merges until none is. Appends the ids to ids[*k...]; buf holds m + 1 and maxlen + 1 bytes.
static void sp_encode_bpe(const SpModel* s, const char* t, size_t m, char* buf, int32_t* ids, int* k) {
    int ns = 0;
    int* st = xmalloc(sizeof(int) * (m + 1));
    int* ln = xmalloc(sizeof(int) * (m + 1));
    for (size_t i = 0; i < m;) {
        int l = utf8_len((uint8_t)t[i]);
        if (i + (size_t)l > m) l = (int)(m - i);
        st[ns] = (int)i, ln[ns] = l, ns++;
        i += (size_t)l;
    }
    for (;;) {
        int best = -1;
        float bs = 0;
        for (int i = 0; i + 1 < ns; i++) {
            const int l = ln[i] + ln[i + 1];
            if (l > s->maxlen) continue;
            const int id = sp_find(s, t + st[i], l, buf);
            if (id < 0) continue;
            if (best < 0 || s->score[id] > bs) best = i, bs = s->score[id];
        }
        if (best < 0) break;
        ln[best] += ln[best + 1];
        memmove(st + best + 1, st + best + 2, sizeof(int) * (size_t)(ns - best - 2));
        memmove(ln + best + 1, ln + best + 2, sizeof(int) * (size_t)(ns - best - 2));
        ns--;
    }
    for (int i = 0; i < ns; i++) {
        const int id = sp_find(s, t + st[i], ln[i], buf);
        if (id >= 0) ids[(*k)++] = id;
        else sp_emit_fallback(s, t + st[i], ln[i], ids, k);
    }
    free(st), free(ln);
}

// Unigram over t[0, m): Viterbi over byte positions (pieces start and end on character
// boundaries); a character no piece covers costs the lowest score − 10, as SentencePiece's unk
// penalty. Appends the ids to ids[*k...]; buf as sp_encode_bpe's.
static void sp_encode_unigram(const SpModel* s, const char* t, size_t m, char* buf, int32_t* ids, int* k) {
    float minsc = 0;
    for (int i = 0; i < s->n; i++)
        if (s->score[i] < minsc) minsc = s->score[i];
    double* best = xmalloc(sizeof(double) * (m + 1));
    int* from = xmalloc(sizeof(int) * (m + 1));
    int* pid = xmalloc(sizeof(int) * (m + 1));
    best[0] = 0;
    for (size_t i = 1; i <= m; i++) best[i] = -INFINITY, from[i] = -1, pid[i] = -1;
    for (size_t i = 0; i < m; i++) {
        if (best[i] == -INFINITY || (i && utf8_len((uint8_t)t[i]) == 1 && ((uint8_t)t[i] & 0xC0) == 0x80)) continue;
        const int cl = utf8_len((uint8_t)t[i]);
        for (int l = 1; l <= s->maxlen && i + (size_t)l <= m; l++) {
            const int id = sp_find(s, t + i, l, buf);
            if (id < 0) continue;
            const double sc = best[i] + s->score[id];
            if (sc > best[i + l]) best[i + l] = sc, from[i + l] = (int)i, pid[i + l] = id;
        }
        const size_t j = i + (size_t)cl <= m ? i + (size_t)cl : m;
        const double sc = best[i] + minsc - 10.0;
        if (from[j] < 0 || sc > best[j]) best[j] = sc, from[j] = (int)i, pid[j] = -1;
    }
    int nseg = 0;
    int* seg = xmalloc(sizeof(int) * (m + 1));
    for (int j = (int)m; j > 0; j = from[j]) seg[nseg++] = j;
    for (int q = nseg - 1; q >= 0; q--) {
        const int j = seg[q], i = from[j];
        if (pid[j] >= 0) ids[(*k)++] = pid[j];
        else sp_emit_fallback(s, t + i, j - i, ids, k);
    }
    free(seg), free(best), free(from), free(pid);
}

int sp_encode(const SpModel* s, const char* text, int add_bos, int32_t** out) {
    size_t m;
    char* t = sp_normalise(s, text, &m);
    int32_t* ids = xmalloc(sizeof(int32_t) * (m + 2));
    int k = 0;
    if (add_bos && s->bos >= 0) ids[k++] = s->bos;
    char* buf = xmalloc(m + 1 > (size_t)s->maxlen + 1 ? m + 1 : (size_t)s->maxlen + 1);
    if (s->bpe) sp_encode_bpe(s, t, m, buf, ids, &k);
    else sp_encode_unigram(s, t, m, buf, ids, &k);
    free(buf);
    free(t);
    *out = ids;
    return k;
}

size_t sp_piece_text(const SpModel* s, int id, char* out, size_t cap) {
    if (id < 0 || id >= s->n || !cap) return 0;
    const int ty = s->type[id];
    if (ty == SP_CONTROL || ty == SP_UNKNOWN || ty == SP_UNUSED) return 0;
    const char* p = s->piece[id];
    unsigned x;
    if (ty == SP_BYTE && sscanf(p, "<0x%2X>", &x) == 1) {
        out[0] = (char)x;
        return 1;
    }
    size_t k = 0;
    for (; *p && k < cap; p++) {
        if (!strncmp(p, "\xE2\x96\x81", 3)) {
            out[k++] = ' ';
            p += 2;
        } else {
            out[k++] = *p;
        }
    }
    return k;
}
