// minijson.c — see minijson.h.
#include "minijson.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

// ---- arena ------------------------------------------------------------------------------------
typedef struct Chunk {
    struct Chunk* next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} Chunk;

static void* arena_alloc(void** arena, size_t n) {
    n = (n + 15) & ~(size_t)15;
    Chunk* c = *arena;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        Chunk* nc = xmalloc(sizeof(Chunk) + cap);
        nc->next = c;
        nc->used = 0;
        nc->cap = cap;
        *arena = c = nc;
    }
    void* p = c->data + c->used;
    c->used += n;
    return p;
}

void js_free(JsDoc* doc) {
    Chunk* c = doc->arena;
    while (c) {
        Chunk* nx = c->next;
        free(c);
        c = nx;
    }
    memset(doc, 0, sizeof *doc);
}

// ---- parser -----------------------------------------------------------------------------------
typedef struct P {
    const char* s;
    size_t len, pos;
    JsLimits lim;
    size_t nodes;
    void** arena;
    char* err;
    size_t errn;
    int failed;
} P;

static int fail(P* p, const char* fmt, ...) {
    if (p->failed) return -1;
    p->failed = 1;
    int k = snprintf(p->err, p->errn, "at byte %zu: ", p->pos);
    if (k < 0 || (size_t)k >= p->errn) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + k, p->errn - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static void ws(P* p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(P* p, uint32_t* out) {
    if (p->len - p->pos < 4) return fail(p, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->s[p->pos + i]);
        if (h < 0) return fail(p, "bad hex digit in \\u escape");
        v = v * 16 + (uint32_t)h;
    }
    p->pos += 4;
    *out = v;
    return 0;
}

static size_t utf8(uint32_t cp, char* o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

// At the opening quote. The decoded string is never longer than the raw span.
static int parse_string(P* p, char** out) {
    p->pos++;
    size_t start = p->pos, end = start;
    while (end < p->len && p->s[end] != '"') end += (p->s[end] == '\\') ? 2 : 1;
    if (end >= p->len) return fail(p, "unterminated string");
    char* o = arena_alloc(p->arena, end - start + 1);
    size_t k = 0;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) return fail(p, "control character 0x%02x in string (escape it)", c);
        if (c != '\\') { o[k++] = (char)c; p->pos++; continue; }
        p->pos++;
        char x = p->s[p->pos++];
        switch (x) {
        case '"': o[k++] = '"'; break;
        case '\\': o[k++] = '\\'; break;
        case '/': o[k++] = '/'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (hex4(p, &cp)) return -1;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(p, "lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                    return fail(p, "high surrogate not followed by a \\u low surrogate");
                p->pos += 2;
                if (hex4(p, &lo)) return -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return fail(p, "bad low surrogate in \\u escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0) return fail(p, "\\u0000 in string (not allowed in names)");
            if (p->pos > end) return fail(p, "truncated \\u escape");
            k += utf8(cp, o + k);  // ≤ 4 bytes out for ≥ 6 bytes in
            break;
        }
        default: p->pos--; return fail(p, "bad escape '\\%c' in string", x);
        }
    }
    o[k] = 0;
    p->pos = end + 1;
    *out = o;
    return 0;
}

static int parse_number(P* p, JsVal* v) {
    size_t st = p->pos, i = st;
    const char* s = p->s;
    if (i < p->len && s[i] == '-') i++;
    if (i >= p->len || s[i] < '0' || s[i] > '9') return fail(p, "bad number");
    if (s[i] == '0') i++;
    else while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    int integer = 1;
    if (i < p->len && s[i] == '.') {
        integer = 0;
        i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') return fail(p, "bad number: digit expected after '.'");
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        integer = 0;
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9') return fail(p, "bad number: digit expected in exponent");
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i - st > 64) return fail(p, "number longer than 64 characters");
    char buf[72];
    memcpy(buf, s + st, i - st);
    buf[i - st] = 0;
    v->type = JS_NUM;
    v->num = strtod(buf, NULL);
    if (integer) {
        const char* d = buf + (buf[0] == '-');
        uint64_t acc = 0;
        int ok = 1;
        for (; *d; d++) {
            uint64_t dig = (uint64_t)(*d - '0');
            if (acc > (UINT64_MAX - dig) / 10) { ok = 0; break; }
            acc = acc * 10 + dig;
        }
        if (ok && buf[0] != '-' && acc <= (uint64_t)INT64_MAX) { v->is_int = 1; v->i = (int64_t)acc; }
        if (ok && buf[0] == '-' && acc <= (uint64_t)INT64_MAX) { v->is_int = 1; v->i = -(int64_t)acc; }
    }
    p->pos = i;
    return 0;
}

static int lit(P* p, const char* word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return fail(p, "unexpected character");
    p->pos += n;
    return 0;
}

static int parse_value(P* p, JsVal* v, int depth);

// Items are collected in a temporary growable array and then moved into the arena.
static int parse_container(P* p, JsVal* v, int depth, int is_obj) {
    if (depth >= p->lim.max_depth) return fail(p, "nesting deeper than %d", p->lim.max_depth);
    char close = is_obj ? '}' : ']';
    p->pos++;
    size_t n = 0, cap = 0;
    JsVal* items = NULL;
    char** keys = NULL;
    int rc = -1;
    ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) { p->pos++; rc = 0; goto done; }
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            items = realloc(items, cap * sizeof *items);
            keys = is_obj ? realloc(keys, cap * sizeof *keys) : keys;
            if (!items || (is_obj && !keys)) FATAL("out of memory parsing JSON");
        }
        ws(p);
        if (is_obj) {
            if (p->pos >= p->len || p->s[p->pos] != '"') { fail(p, "object key (a string) expected"); goto done; }
            if (parse_string(p, &keys[n])) goto done;
            ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') { fail(p, "':' expected after object key"); goto done; }
            p->pos++;
        }
        if (parse_value(p, &items[n], depth + 1)) goto done;
        n++;
        ws(p);
        if (p->pos >= p->len) { fail(p, "unterminated %s", is_obj ? "object" : "array"); goto done; }
        char c = p->s[p->pos++];
        if (c == close) break;
        if (c != ',') { p->pos--; fail(p, "',' or '%c' expected", close); goto done; }
    }
    rc = 0;
done:
    if (rc == 0) {
        v->type = is_obj ? JS_OBJ : JS_ARR;
        v->n = (int)n;
        if (n) {
            v->items = arena_alloc(p->arena, n * sizeof *items);
            memcpy(v->items, items, n * sizeof *items);
            if (is_obj) {
                v->keys = arena_alloc(p->arena, n * sizeof *keys);
                memcpy(v->keys, keys, n * sizeof *keys);
            }
        }
    }
    free(items);
    free(keys);
    return rc;
}

static int parse_value(P* p, JsVal* v, int depth) {
    memset(v, 0, sizeof *v);
    if (++p->nodes > p->lim.max_nodes) return fail(p, "more than %zu JSON values", p->lim.max_nodes);
    ws(p);
    if (p->pos >= p->len) return fail(p, "value expected, found the end of the text");
    char c = p->s[p->pos];
    switch (c) {
    case '{': return parse_container(p, v, depth, 1);
    case '[': return parse_container(p, v, depth, 0);
    case '"': v->type = JS_STR; return parse_string(p, &v->str);
    case 't': v->type = JS_BOOL; v->b = 1; return lit(p, "true");
    case 'f': v->type = JS_BOOL; return lit(p, "false");
    case 'n': v->type = JS_NULL; return lit(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, v);
        if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7f) return fail(p, "unexpected character '%c'", c);
        return fail(p, "unexpected byte 0x%02x", (unsigned char)c);
    }
}

int js_parse(JsDoc* doc, const char* text, size_t len, JsLimits lim, char* err, size_t errn) {
    memset(doc, 0, sizeof *doc);
    P p = {.s = text, .len = len, .lim = lim, .arena = &doc->arena, .err = err, .errn = errn};
    if (errn) err[0] = 0;
    if (parse_value(&p, &doc->root, 0)) return -1;
    ws(&p);
    if (p.pos != len) return fail(&p, "unexpected text after the JSON value");
    return 0;
}

const JsVal* js_get(const JsVal* obj, const char* key) {
    if (!obj || obj->type != JS_OBJ) return NULL;
    for (int i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

const char* js_type_name(JsType t) {
    static const char* names[] = {"null", "boolean", "number", "string", "array", "object"};
    return (unsigned)t < 6 ? names[t] : "?";
}

// ---- string buffer ----------------------------------------------------------------------------
static void sb_reserve(Sb* b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    b->s = realloc(b->s, cap);
    if (!b->s) FATAL("out of memory");
    b->cap = cap;
}

void sb_printf(Sb* b, const char* fmt, ...) {
    sb_reserve(b, 64);
    for (;;) {
        size_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->len, room, fmt, ap);
        va_end(ap);
        if (k < 0) { b->s[b->len] = 0; return; }
        if ((size_t)k < room) { b->len += (size_t)k; return; }
        sb_reserve(b, (size_t)k);
    }
}

void sb_putc(Sb* b, char c) {
    sb_reserve(b, 1);
    b->s[b->len++] = c;
    b->s[b->len] = 0;
}

void sb_json_str(Sb* b, const char* s) {
    sb_putc(b, '"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { sb_putc(b, '\\'); sb_putc(b, (char)c); }
        else if (c == '\n') sb_printf(b, "\\n");
        else if (c == '\t') sb_printf(b, "\\t");
        else if (c < 0x20) sb_printf(b, "\\u%04x", c);
        else sb_putc(b, (char)c);
    }
    sb_putc(b, '"');
}

void sb_json_float(Sb* b, float f) {
    char buf[48];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    if (f == floorf(f) && fabsf(f) >= 1 && fabsf(f) < 1e16f) snprintf(buf, sizeof buf, "%.1f", (double)f);
    else if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
    sb_printf(b, "%s", buf);
}

void sb_free(Sb* b) {
    free(b->s);
    memset(b, 0, sizeof *b);
}
