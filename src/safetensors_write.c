// safetensors_write.c — the streaming writer and file crc (see safetensors.h).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "crc32c.h"
#include "minijson.h"
#include "safetensors.h"

typedef struct Item {
    char* name;
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel, begin, end;
    const float* data;  // [numel] or NULL when fn produces the values
    StFillFn fn;
    void* ctx;
    int tag;
} Item;

typedef struct Out {
    int fd;
    const char* path;
    uint32_t crc;  // CRC-32C, running
    uint64_t bytes;
} Out;

struct StWriter {
    Item* it;  // [n]
    int n, cap;
    StrMap names;
    char** meta;  // [2·n_meta] key, value
    int n_meta;
    uint64_t data_bytes;
    // streaming state (st_writer_begin .. st_writer_end)
    int state;   // 0 not begun, 1 open, 2 done, -1 failed
    int next;    // the tensor st_writer_put writes next
    char* path;  // of the open file
    Out o;
};

StWriter* st_writer_new(void) {
    StWriter* w = xcalloc(1, sizeof *w);
    strmap_init(&w->names);
    return w;
}

// A begun file that is not complete is closed and removed.
static void discard(StWriter* w) {
    if (w->state == 1) {
        if (w->o.fd >= 0) close(w->o.fd);
        w->o.fd = -1;
        unlink(w->path);
    }
    free(w->path);
    w->path = NULL;
}

void st_writer_free(StWriter* w) {
    if (!w) return;
    discard(w);
    for (int i = 0; i < w->n; i++) free(w->it[i].name);
    for (int i = 0; i < 2 * w->n_meta; i++) free(w->meta[i]);
    free(w->it);
    free(w->meta);
    strmap_free(&w->names);
    free(w);
}

#define LATER (-0x5eed)  // tag of a tensor whose values st_writer_put receives

static int add(StWriter* w, const char* name, StDtype dt, int ndim, const int64_t* shape, const float* data,
               StFillFn fn, void* ctx, int tag, Err* e) {
    if (!name || !name[0]) return err_set(e, "safetensors writer: empty tensor name");
    if (strcmp(name, "__metadata__") == 0) return err_set(e, "safetensors writer: '__metadata__' is not a tensor name");
    if (dt != ST_F32 && dt != ST_BF16 && dt != ST_F16)
        return err_set(e, "safetensors writer: tensor '%s': can only store F32, BF16 or F16, not %s", name, st_dtype_name(dt));
    if (ndim < 0 || ndim > ST_MAX_DIMS) return err_set(e, "safetensors writer: tensor '%s': %d dimensions", name, ndim);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return err_set(e, "safetensors writer: tensor '%s': negative shape[%d]", name, i);
        if (shape[i] && numel > (UINT64_MAX / 8) / (uint64_t)shape[i])
            return err_set(e, "safetensors writer: tensor '%s': shape overflows", name);
        numel *= (uint64_t)shape[i];
    }
    if (w->state) return err_set(e, "safetensors writer: tensor '%s' added after st_writer_begin", name);
    if (!data && !fn && numel && tag != LATER) return err_set(e, "safetensors writer: tensor '%s': no data", name);
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->it = realloc(w->it, sizeof(Item) * (size_t)w->cap);
        if (!w->it) FATAL("out of memory");
    }
    Item* t = &w->it[w->n];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    int old;
    if (strmap_put(&w->names, t->name, w->n, &old)) {
        free(t->name);
        return err_set(e, "safetensors writer: duplicate tensor name '%s'", name);
    }
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->numel = numel;
    t->begin = w->data_bytes;
    t->end = t->begin + numel * st_dtype_size(dt);
    w->data_bytes = t->end;
    t->data = data;
    t->fn = fn;
    t->ctx = ctx;
    t->tag = fn ? tag : 0;
    w->n++;
    return 0;
}

int st_writer_add(StWriter* w, const char* name, StDtype dtype, int ndim, const int64_t* shape,
                  const float* data, Err* e) {
    return add(w, name, dtype, ndim, shape, data, NULL, NULL, 0, e);
}

int st_writer_add_fn(StWriter* w, const char* name, StDtype dtype, int ndim, const int64_t* shape,
                     StFillFn fn, void* ctx, int tag, Err* e) {
    if (!fn) return err_set(e, "safetensors writer: tensor '%s': no fill function", name);
    return add(w, name, dtype, ndim, shape, NULL, fn, ctx, tag, e);
}

int st_writer_add_later(StWriter* w, const char* name, StDtype dtype, int ndim, const int64_t* shape, Err* e) {
    return add(w, name, dtype, ndim, shape, NULL, NULL, NULL, LATER, e);
}

void st_writer_meta(StWriter* w, const char* key, const char* value) {
    for (int i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta[2 * i], key) == 0) {
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = xstrdup(value);
            return;
        }
    w->meta = realloc(w->meta, sizeof(char*) * 2 * (size_t)(w->n_meta + 1));
    if (!w->meta) FATAL("out of memory");
    w->meta[2 * w->n_meta] = xstrdup(key);
    w->meta[2 * w->n_meta + 1] = xstrdup(value);
    w->n_meta++;
}

// The header JSON padded with spaces to a multiple of 8 bytes.
static void build_header(const StWriter* w, Sb* h) {
    sb_putc(h, '{');
    if (w->n_meta) {
        sb_printf(h, "\"__metadata__\":{");
        for (int i = 0; i < w->n_meta; i++) {
            if (i) sb_putc(h, ',');
            sb_json_str(h, w->meta[2 * i]);
            sb_putc(h, ':');
            sb_json_str(h, w->meta[2 * i + 1]);
        }
        sb_putc(h, '}');
    }
    for (int i = 0; i < w->n; i++) {
        const Item* t = &w->it[i];
        if (i || w->n_meta) sb_putc(h, ',');
        sb_json_str(h, t->name);
        sb_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) sb_printf(h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        sb_printf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->begin, (unsigned long long)t->end);
    }
    sb_putc(h, '}');
    while (h->len % 8) sb_putc(h, ' ');
}

uint64_t st_writer_size(const StWriter* w) {
    Sb h = {0};
    build_header(w, &h);
    uint64_t n = 8 + h.len + w->data_bytes;
    sb_free(&h);
    return n;
}

static int out_write(Out* o, const void* buf, size_t n, Err* e) {
    const unsigned char* p = buf;
    o->crc = crc32c(o->crc, p, n);
    o->bytes += n;
    while (n) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t k = write(o->fd, p, chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0)
            return err_set(e, "%s: write failed: %s%s", o->path, strerror(errno),
                           errno == ENOSPC ? " (free disk space, or keep fewer checkpoints)" : "");
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

// Writes numel fp32 values src as dtype dt, converting through a bounce buffer.
static int write_values(Out* o, StDtype dt, const float* src, uint64_t numel, Err* e) {
    if (dt == ST_F32) return out_write(o, src, (size_t)numel * 4, e);
    const size_t CH = 1u << 20;
    uint16_t* buf = xmalloc(sizeof(uint16_t) * (numel < CH ? (size_t)numel : CH));
    int rc = 0;
    for (uint64_t i = 0; i < numel && !rc; i += CH) {
        size_t k = (size_t)(numel - i < CH ? numel - i : CH);
        if (dt == ST_BF16)
            for (size_t j = 0; j < k; j++) buf[j] = f32_to_bf16(src[i + j]);
        else
            for (size_t j = 0; j < k; j++) buf[j] = st_f32_to_f16(src[i + j]);
        rc = out_write(o, buf, k * 2, e);
    }
    free(buf);
    return rc;
}

// Every failure of the streaming calls goes through here: the partial file is removed.
static int fail(StWriter* w) {
    discard(w);
    w->state = -1;
    return -1;
}

int st_writer_begin(StWriter* w, const char* path, Err* e) {
    if (w->state) return err_set(e, "%s: safetensors writer already begun", path);
    w->path = xstrdup(path);
    w->o = (Out){.fd = -1, .path = w->path, .crc = 0};
    w->next = 0;
    w->o.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->o.fd < 0) {
        err_set(e, "%s: cannot create: %s", path, strerror(errno));
        free(w->path);
        w->path = NULL;
        w->state = -1;
        return -1;
    }
    w->state = 1;
    Sb h = {0};
    build_header(w, &h);
    uint64_t hlen = h.len;
    int rc = out_write(&w->o, &hlen, 8, e) || out_write(&w->o, h.s, h.len, e);
    sb_free(&h);
    return rc ? fail(w) : 0;
}

int st_writer_put(StWriter* w, const float* data, Err* e) {
    if (w->state != 1) return err_set(e, "safetensors writer: not open (%s)", w->state < 0 ? "an earlier write failed" : "st_writer_begin first");
    if (w->next >= w->n) {
        err_set(e, "%s: more tensors put than the %d declared", w->path, w->n);
        return fail(w);
    }
    Item* t = &w->it[w->next++];
    if (t->numel == 0) return 0;
    const float* src = data ? data : t->data;
    if (src) return write_values(&w->o, t->dtype, src, t->numel, e) ? fail(w) : 0;
    if (!t->fn) {
        err_set(e, "%s: tensor '%s': no data", w->path, t->name);
        return fail(w);
    }
    float* tmp = xmalloc(sizeof(float) * (size_t)t->numel);
    int r = t->fn(t->ctx, t->tag, tmp, t->numel, e);
    if (!r) r = write_values(&w->o, t->dtype, tmp, t->numel, e);
    free(tmp);
    return r ? fail(w) : 0;
}

int st_writer_end(StWriter* w, StWriteInfo* info, Err* e) {
    if (w->state != 1) return err_set(e, "safetensors writer: not open (%s)", w->state < 0 ? "an earlier write failed" : "st_writer_begin first");
    if (w->next != w->n) {
        err_set(e, "%s: %d of the %d tensors declared were written", w->path, w->next, w->n);
        return fail(w);
    }
    if (fsync(w->o.fd)) {
        err_set(e, "%s: fsync failed: %s", w->path, strerror(errno));
        return fail(w);
    }
    int fd = w->o.fd;
    w->o.fd = -1;
    if (close(fd)) {
        err_set(e, "%s: close failed: %s", w->path, strerror(errno));
        return fail(w);
    }
    if (info) {
        info->bytes = w->o.bytes;
        info->crc32c = w->o.crc;
    }
    w->state = 2;
    free(w->path);
    w->path = NULL;
    return 0;
}

int st_writer_write(StWriter* w, const char* path, StWriteInfo* info, Err* e) {
    if (st_writer_begin(w, path, e)) return -1;
    for (int i = 0; i < w->n; i++)
        if (st_writer_put(w, NULL, e)) return -1;
    return st_writer_end(w, info, e);
}

int file_checksum(const char* path, int algo, uint32_t* crc, uint64_t* bytes, Err* e) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(e, "%s: cannot open: %s", path, strerror(errno));
#ifdef POSIX_FADV_SEQUENTIAL
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    const size_t CH = 8u << 20;
    unsigned char* buf = xmalloc(CH);
    uint32_t c = 0;
    uint64_t n = 0;
    int rc = 0;
    for (;;) {
        ssize_t k = read(fd, buf, CH);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) { rc = err_set(e, "%s: read failed: %s", path, strerror(errno)); break; }
        if (k == 0) break;
        c = cksum_update((CksumAlgo)algo, c, buf, (size_t)k);
        n += (uint64_t)k;
    }
    free(buf);
    close(fd);
    if (!rc) {
        *crc = c;
        if (bytes) *bytes = n;
    }
    return rc;
}
