// safetensors.c — the reader (see safetensors.h); the writer is in safetensors_write.c.
#define _GNU_SOURCE
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "minijson.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

static const struct { const char* name; size_t size; } DT[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1},     [ST_I8] = {"I8", 1},
    [ST_I16] = {"I16", 2},   [ST_U16] = {"U16", 2},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I32] = {"I32", 4},   [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},   [ST_I64] = {"I64", 8},   [ST_U64] = {"U64", 8},
    [ST_F64] = {"F64", 8},   [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char* st_dtype_name(StDtype d) { return (unsigned)d < ST_DTYPE_COUNT ? DT[d].name : "?"; }
size_t st_dtype_size(StDtype d) { return (unsigned)d < ST_DTYPE_COUNT ? DT[d].size : 0; }

int st_dtype_parse(const char* s, StDtype* out) {
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (strcmp(s, DT[i].name) == 0) { *out = (StDtype)i; return 0; }
    return -1;
}

// ---- half precision ---------------------------------------------------------------------------
float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, ex = (h >> 10) & 31, man = h & 0x3ff, u;
    if (ex == 0) {
        float f = (float)man * (1.0f / 16777216.0f);  // subnormal: man × 2^-24
        return sign ? -f : f;
    }
    if (ex == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((ex + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t st_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00;        // NaN
    if (x >= 0x477ff000u) return sign | 0x7c00;       // ≥ 65520 rounds to inf
    if (x < 0x38800000u) {                            // below 2^-14: half subnormal or zero
        if (x < 0x33000000u) return sign;             // below 2^-25 rounds to 0
        uint32_t m = (x & 0x7fffffu) | 0x800000u, shift = 126 - (x >> 23);
        uint32_t k = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (k & 1))) k++;
        return sign | (uint16_t)k;
    }
    uint32_t r = x + 0xfffu + ((x >> 13) & 1u) - 0x38000000u;
    return sign | (uint16_t)(r >> 13);
}

// ---- header validation ------------------------------------------------------------------------
static int get_u64(const JsVal* v, uint64_t* out) {
    if (!v || v->type != JS_NUM || !v->is_int || v->i < 0) return -1;
    *out = (uint64_t)v->i;
    return 0;
}

void st_shape_str(char* buf, size_t n, int ndim, const int64_t* shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

int st_shape_differs(const StTensor* t, int ndim, const int64_t* shape, char* got, char* want, size_t n) {
    int same = t->ndim == ndim;
    for (int d = 0; d < ndim && same; d++) same = t->shape[d] == shape[d];
    if (same) return 0;
    st_shape_str(got, n, t->ndim, t->shape);
    st_shape_str(want, n, ndim, shape);
    return 1;
}

static int parse_tensor(StFile* f, const char* name, const JsVal* v, uint64_t data_size, Err* e) {
    const char* P = f->path;
    if (!name[0]) return err_set(e, "%s: a tensor has an empty name", P);
    if (v->type != JS_OBJ)
        return err_set(e, "%s: tensor '%s': expected an object with dtype, shape, data_offsets, found %s", P, name, js_type_name(v->type));
    StTensor* t = &f->t[f->n];
    memset(t, 0, sizeof *t);
    t->name = name;
    const JsVal* dt = js_get(v, "dtype");
    const JsVal* sh = js_get(v, "shape");
    const JsVal* of = js_get(v, "data_offsets");
    if (!dt || dt->type != JS_STR) return err_set(e, "%s: tensor '%s': missing or non-string \"dtype\"", P, name);
    if (st_dtype_parse(dt->str, &t->dtype))
        return err_set(e, "%s: tensor '%s': unknown dtype '%.32s' (known: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL ...)", P, name, dt->str);
    if (!sh || sh->type != JS_ARR) return err_set(e, "%s: tensor '%s': missing or non-array \"shape\"", P, name);
    if (sh->n > ST_MAX_DIMS) return err_set(e, "%s: tensor '%s': %d dimensions (at most %d supported)", P, name, sh->n, ST_MAX_DIMS);
    t->ndim = sh->n;
    uint64_t numel = 1;
    int overflow = 0;
    for (int i = 0; i < sh->n; i++) {
        uint64_t d;
        if (get_u64(&sh->items[i], &d))
            return err_set(e, "%s: tensor '%s': shape[%d] is not a non-negative integer", P, name, i);
        t->shape[i] = (int64_t)d;
        if (d && numel > UINT64_MAX / d) overflow = 1;
        numel *= d;
    }
    size_t es = st_dtype_size(t->dtype);
    if (overflow || numel > UINT64_MAX / es)
        return err_set(e, "%s: tensor '%s': shape overflows 64-bit sizes", P, name);
    t->numel = numel;
    if (!of || of->type != JS_ARR || of->n != 2 || get_u64(&of->items[0], &t->begin) ||
        get_u64(&of->items[1], &t->end))
        return err_set(e, "%s: tensor '%s': \"data_offsets\" must be [begin, end] (non-negative integers)", P, name);
    if (t->begin > t->end)
        return err_set(e, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", P, name,
                       (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > data_size)
        return err_set(e, "%s: tensor '%s': data_offsets [%llu, %llu] past the end of the data buffer (%llu bytes): truncated file?",
                       P, name, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)data_size);
    if (numel * es != t->end - t->begin) {
        char s[128];
        st_shape_str(s, sizeof s, t->ndim, t->shape);
        return err_set(e, "%s: tensor '%s': shape %s of %s is %llu bytes but data_offsets [%llu, %llu] span %llu bytes",
                       P, name, s, st_dtype_name(t->dtype), (unsigned long long)(numel * es),
                       (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)(t->end - t->begin));
    }
    int old;
    if (strmap_put(&f->index, name, f->n, &old)) return err_set(e, "%s: duplicate tensor name '%s'", P, name);
    f->n++;
    return 0;
}

typedef struct Span { uint64_t begin, end; int i; } Span;
static int cmp_span(const void* a, const void* b) {
    const Span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int check_overlap(StFile* f, Err* e) {
    if (f->n < 2) return 0;
    Span* s = xmalloc(sizeof(Span) * (size_t)f->n);
    for (int i = 0; i < f->n; i++) s[i] = (Span){f->t[i].begin, f->t[i].end, i};
    qsort(s, (size_t)f->n, sizeof *s, cmp_span);
    int rc = 0, prev = 0;
    for (int i = 1; i < f->n && !rc; i++) {
        const StTensor *a = &f->t[s[prev].i], *b = &f->t[s[i].i];
        if (b->begin < a->end)
            rc = err_set(e, "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap in the data buffer",
                         f->path, a->name, (unsigned long long)a->begin, (unsigned long long)a->end, b->name,
                         (unsigned long long)b->begin, (unsigned long long)b->end);
        if (b->end > a->end) prev = i;
    }
    free(s);
    return rc;
}

static int parse_header(StFile* f, const char* hdr, uint64_t hlen, Err* e) {
    JsDoc* doc = xcalloc(1, sizeof *doc);
    f->doc = doc;
    char msg[256];
    if (js_parse(doc, hdr, (size_t)hlen, JS_DEFAULT_LIMITS, msg, sizeof msg))
        return err_set(e, "%s: header JSON %s (corrupt or not a safetensors file)", f->path, msg);
    const JsVal* r = &doc->root;
    if (r->type != JS_OBJ) return err_set(e, "%s: header is a JSON %s, not an object", f->path, js_type_name(r->type));
    uint64_t data_size = f->file_size - f->data_start;
    f->t = xcalloc((size_t)r->n + 1, sizeof *f->t);
    int seen_meta = 0;
    for (int i = 0; i < r->n; i++) {
        const char* k = r->keys[i];
        const JsVal* v = &r->items[i];
        if (strcmp(k, "__metadata__") == 0) {
            if (seen_meta++) return err_set(e, "%s: duplicate \"__metadata__\"", f->path);
            if (v->type != JS_OBJ) return err_set(e, "%s: \"__metadata__\" must be an object of strings", f->path);
            f->meta_key = xcalloc((size_t)v->n + 1, sizeof(char*));
            f->meta_val = xcalloc((size_t)v->n + 1, sizeof(char*));
            for (int j = 0; j < v->n; j++) {
                if (v->items[j].type != JS_STR)
                    return err_set(e, "%s: \"__metadata__\" value of '%s' is a %s, not a string", f->path, v->keys[j], js_type_name(v->items[j].type));
                f->meta_key[j] = v->keys[j];
                f->meta_val[j] = v->items[j].str;
            }
            f->n_meta = v->n;
            continue;
        }
        if (parse_tensor(f, k, v, data_size, e)) return -1;
    }
    return check_overlap(f, e);
}

static int read_full(int fd, void* buf, size_t n, uint64_t off) {
    unsigned char* p = buf;
    while (n) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t k = pread(fd, p, chunk, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k == 0 ? (errno = EIO, -1) : -1;
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

static int check_lengths(StFile* f, const uint8_t* first8, Err* e) {
    if (f->file_size < 8)
        return err_set(e, "%s: %llu bytes, too short for a safetensors file (8-byte header length first)",
                       f->path, (unsigned long long)f->file_size);
    uint64_t n;
    memcpy(&n, first8, 8);
    if (n > ST_MAX_HEADER)
        return err_set(e, "%s: header length %llu is over the %u-byte limit (corrupt or not a safetensors file)",
                       f->path, (unsigned long long)n, ST_MAX_HEADER);
    if (n > f->file_size - 8)
        return err_set(e, "%s: header length %llu exceeds the file (%llu bytes): truncated or not a safetensors file",
                       f->path, (unsigned long long)n, (unsigned long long)f->file_size);
    if (n < 2) return err_set(e, "%s: header length %llu is too small for a JSON object", f->path, (unsigned long long)n);
    f->data_start = 8 + n;
    return 0;
}

int st_open(StFile** out, const char* path, Err* e) {
    *out = NULL;
    StFile* f = xcalloc(1, sizeof *f);
    f->path = xstrdup(path);
    strmap_init(&f->index);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    uint8_t first8[8] = {0};
    char* hdr = NULL;
    int rc = -1;
    if (f->fd < 0) { err_set(e, "%s: cannot open: %s", path, strerror(errno)); goto done; }
    if (fstat(f->fd, &st) || !S_ISREG(st.st_mode)) { err_set(e, "%s: not a regular file", path); goto done; }
    f->file_size = (uint64_t)st.st_size;
    if (f->file_size >= 8 && read_full(f->fd, first8, 8, 0)) { err_set(e, "%s: read failed: %s", path, strerror(errno)); goto done; }
    if (check_lengths(f, first8, e)) goto done;
    hdr = xmalloc((size_t)(f->data_start - 8));
    if (read_full(f->fd, hdr, (size_t)(f->data_start - 8), 8)) { err_set(e, "%s: read failed: %s", path, strerror(errno)); goto done; }
    rc = parse_header(f, hdr, f->data_start - 8, e);
done:
    free(hdr);
    if (rc) st_close(f);
    else *out = f;
    return rc;
}

int st_parse_buffer(StFile** out, const char* name, const uint8_t* buf, size_t size, Err* e) {
    *out = NULL;
    StFile* f = xcalloc(1, sizeof *f);
    f->path = xstrdup(name);
    strmap_init(&f->index);
    f->fd = -1;
    f->mem = buf;
    f->file_size = size;
    int rc = check_lengths(f, buf, e);
    if (!rc) rc = parse_header(f, (const char*)buf + 8, f->data_start - 8, e);
    if (rc) st_close(f);
    else *out = f;
    return rc;
}

void st_close(StFile* f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    if (f->doc) js_free(f->doc);
    free(f->doc);
    free(f->t);
    free(f->meta_key);
    free(f->meta_val);
    strmap_free(&f->index);
    free(f->path);
    free(f);
}

const StTensor* st_find(const StFile* f, const char* name) {
    int i = strmap_get(&f->index, name);
    return i < 0 ? NULL : &f->t[i];
}

const char* st_meta(const StFile* f, const char* key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_key[i], key) == 0) return f->meta_val[i];
    return NULL;
}

int st_read_raw(const StFile* f, const StTensor* t, uint64_t off, void* dst, size_t n, Err* e) {
    uint64_t size = t->end - t->begin;
    if (off > size || n > size - off)
        return err_set(e, "%s: tensor '%s': read of %zu bytes at %llu is outside its %llu bytes", f->path, t->name, n,
                       (unsigned long long)off, (unsigned long long)size);
    uint64_t at = f->data_start + t->begin + off;
    if (f->fd < 0) {
        memcpy(dst, f->mem + at, n);
        return 0;
    }
    if (read_full(f->fd, dst, n, at))
        return err_set(e, "%s: tensor '%s': read failed: %s (file truncated since it was opened?)", f->path, t->name, strerror(errno));
    return 0;
}

int st_read_f32(const StFile* f, const StTensor* t, float* dst, Err* e) {
    if (t->dtype == ST_F32) return st_read_raw(f, t, 0, dst, (size_t)t->numel * 4, e);
    if (t->dtype != ST_BF16 && t->dtype != ST_F16)
        return err_set(e, "%s: tensor '%s' is %s; only F32, BF16 and F16 can be read as fp32", f->path, t->name,
                       st_dtype_name(t->dtype));
    const size_t CH = 1u << 20;  // elements per bounce buffer
    uint16_t* buf = xmalloc(sizeof(uint16_t) * (t->numel < CH ? (size_t)t->numel : CH));
    int rc = 0;
    for (uint64_t i = 0; i < t->numel && !rc; i += CH) {
        size_t k = (size_t)(t->numel - i < CH ? t->numel - i : CH);
        rc = st_read_raw(f, t, i * 2, buf, k * 2, e);
        if (rc) break;
        if (t->dtype == ST_BF16)
            for (size_t j = 0; j < k; j++) dst[i + j] = bf16_to_f32(buf[j]);
        else
            for (size_t j = 0; j < k; j++) dst[i + j] = st_f16_to_f32(buf[j]);
    }
    free(buf);
    return rc;
}
