// ckpt_util.c — names, manifest, small-file I/O and directory helpers for the checkpoint code.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ckpt_internal.h"
#include "minijson.h"

void ckpt_copy(char* dst, size_t n, const char* src) {
    size_t k = strlen(src);
    if (k >= n) k = n - 1;
    memcpy(dst, src, k);
    dst[k] = 0;
}

void ckpt_join(char* out, const char* dir, const char* name) {
    size_t a = strlen(dir), b = strlen(name);
    if (a > CKPT_PATH - 2) a = CKPT_PATH - 2;
    if (a + 1 + b > CKPT_PATH - 1) b = CKPT_PATH - 2 - a;
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, name, b);
    out[a + 1 + b] = 0;
}

void ckpt_rank_name(char* buf, size_t n, int rank) { snprintf(buf, n, "rank_%05d.safetensors", rank); }

void ckpt_step_name(char* buf, size_t n, int64_t step) { snprintf(buf, n, "step_%08lld", (long long)step); }

int64_t ckpt_parse_step_name(const char* name) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char* d = name + 5;
    if (!*d || strlen(d) > 18) return -1;
    int64_t v = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9') return -1;
        v = v * 10 + (*d - '0');
    }
    return v;
}

int ckpt_safe_name(const char* s) {
    size_t n = strlen(s);
    if (n == 0 || n > 63 || !strcmp(s, ".") || !strcmp(s, "..")) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '.' ||
              *s == '_' || *s == '-'))
            return 0;
    return 1;
}

// ---- small files ------------------------------------------------------------------------------
int ckpt_write_file(const char* path, const char* data, size_t len, uint32_t* crc, Err* e) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return err_set(e, "%s: cannot create: %s", path, strerror(errno));
    size_t done = 0;
    while (done < len) {
        ssize_t k = write(fd, data + done, len - done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int er = errno;
            close(fd);
            return err_set(e, "%s: write failed: %s", path, strerror(er));
        }
        done += (size_t)k;
    }
    if (fsync(fd)) {
        int er = errno;
        close(fd);
        return err_set(e, "%s: fsync failed: %s", path, strerror(er));
    }
    if (close(fd)) return err_set(e, "%s: close failed: %s", path, strerror(errno));
    if (crc) *crc = crc32c(0, data, len);
    return 0;
}

char* ckpt_read_text(const char* path, size_t max, size_t* len, Err* e) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err_set(e, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        close(fd);
        err_set(e, "%s: not a regular file of at most %zu bytes", path, max);
        return NULL;
    }
    size_t n = (size_t)st.st_size, got = 0;
    char* buf = xmalloc(n + 1);
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    if (got != n) {
        free(buf);
        err_set(e, "%s: short read", path);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

int ckpt_fsync_dir(const char* dir, Err* e) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return err_set(e, "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int er = errno;
    close(fd);
    if (rc && er != EINVAL && er != EROFS) return err_set(e, "%s: fsync of the directory failed: %s", dir, strerror(er));
    return 0;
}

static int rm_one(const char* p, const struct stat* sb, int flag, struct FTW* ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p) && errno != ENOENT ? -1 : 0;
}

int ckpt_rm_rf(const char* path) {
    struct stat st;
    if (lstat(path, &st)) return errno == ENOENT ? 0 : -1;
    return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

// ---- manifest ---------------------------------------------------------------------------------
char* manifest_format(const Manifest* m) {
    Sb b = {0};
    // version 2 names the file checksum; version 1 (zlib crc32, no checksum line) is still read
    sb_printf(&b, "moetrain-checkpoint 2\nstep %lld\nworld %d\nchecksum %s\n", (long long)m->step, m->world,
              cksum_name((CksumAlgo)m->algo));
    for (int i = 0; i < m->n; i++)
        sb_printf(&b, "file %s %llu %08x\n", m->f[i].name, (unsigned long long)m->f[i].bytes, m->f[i].crc);
    uint32_t crc = (uint32_t)crc32_z(crc32_z(0, NULL, 0), (const unsigned char*)b.s, b.len);
    sb_printf(&b, "crc32 %08x\n", crc);
    return b.s;
}

void manifest_free(Manifest* m) {
    free(m->f);
    memset(m, 0, sizeof *m);
}

// The manifest's last line, "crc32 XXXXXXXX" over everything before it: that line of text [len],
// or NULL with the reason in e when it is missing or does not match.
static char* checked_tail(char* text, size_t len, const char* path, Err* e) {
    char* last = len >= 2 ? text + len - 2 : text;
    while (last > text && last[-1] != '\n') last--;
    unsigned stored = 0;
    char tail[16];
    if (sscanf(last, "crc32 %8x%1[\n]", &stored, tail) != 2) {
        err_set(e, "%s: no checksum line at the end (truncated or not a moetrain manifest)", path);
        return NULL;
    }
    uint32_t crc = (uint32_t)crc32_z(crc32_z(0, NULL, 0), (const unsigned char*)text, (size_t)(last - text));
    if (crc != stored) {
        err_set(e, "%s: checksum mismatch (corrupt manifest)", path);
        return NULL;
    }
    return last;
}

// What manifest_read has seen so far.
typedef struct ManParse {
    const char* path;
    int line_no, version, cap, have_step, have_world;
} ManParse;

static void add_file(Manifest* m, int* cap, const char* name, unsigned long long bytes, unsigned crc) {
    if (m->n == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        m->f = realloc(m->f, sizeof(ManEntry) * (size_t)*cap);
        if (!m->f) FATAL("out of memory");
    }
    memcpy(m->f[m->n].name, name, strlen(name) + 1);  // ≤ 63 chars (ckpt_safe_name)
    m->f[m->n].bytes = bytes;
    m->f[m->n].crc = crc;
    m->n++;
}

// One line of the manifest (the first names its version): 0, or -1 with the reason in e.
static int parse_line(Manifest* m, ManParse* p, const char* line, Err* e) {
    long long v;
    char name[128];
    unsigned long long bytes;
    unsigned c;
    if (++p->line_no == 1) {
        p->version = !strcmp(line, "moetrain-checkpoint 1") ? 1 : !strcmp(line, "moetrain-checkpoint 2") ? 2 : 0;
        if (!p->version)
            return err_set(e, "%s: not a moetrain checkpoint manifest (version 1 or 2): '%.40s'", p->path, line);
        m->algo = p->version == 1 ? CKSUM_CRC32 : -1;
    } else if (p->version >= 2 && sscanf(line, "checksum %127s", name) == 1) {
        if ((m->algo = cksum_parse(name)) < 0)
            return err_set(e, "%s: line %d: unknown checksum '%s' (crc32 and crc32c are known; a newer moetrain wrote it?)",
                           p->path, p->line_no, name);
    } else if (sscanf(line, "step %lld", &v) == 1 && v >= 0) {
        m->step = v;
        p->have_step = 1;
    } else if (sscanf(line, "world %lld", &v) == 1 && v >= 1 && v <= 1 << 20) {
        m->world = (int)v;
        p->have_world = 1;
    } else if (sscanf(line, "file %127s %llu %8x", name, &bytes, &c) == 3) {
        if (!ckpt_safe_name(name)) return err_set(e, "%s: line %d: bad file name '%s'", p->path, p->line_no, name);
        add_file(m, &p->cap, name, bytes, c);
    } else {
        return err_set(e, "%s: line %d: cannot parse '%.80s'", p->path, p->line_no, line);
    }
    return 0;
}

int manifest_read(Manifest* m, const char* dir, Err* e) {
    memset(m, 0, sizeof *m);
    char path[CKPT_PATH];
    ckpt_join(path, dir, CKPT_MANIFEST);
    size_t len;
    char* text = ckpt_read_text(path, 16u << 20, &len, e);
    if (!text) return -1;
    int rc = -1;
    char* last = checked_tail(text, len, path, e);
    if (!last) goto done;
    *last = 0;
    ManParse p = {.path = path};
    for (char* line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        if (parse_line(m, &p, line, e)) goto done;
    if (!p.have_step || !p.have_world || m->algo < 0) {
        err_set(e, "%s: missing step, world or checksum line", path);
        goto done;
    }
    rc = 0;
done:
    free(text);
    if (rc) manifest_free(m);
    return rc;
}

int ckpt_check_file(const char* dir, const ManEntry* f, int algo, int verify_crc, Err* e) {
    char path[CKPT_PATH];
    ckpt_join(path, dir, f->name);
    struct stat st;
    if (stat(path, &st))
        return err_set(e, "%s: %s (the manifest lists it: the checkpoint is incomplete or damaged)", path,
                       errno == ENOENT ? "missing" : strerror(errno));
    if ((uint64_t)st.st_size != f->bytes)
        return err_set(e, "%s: %llu bytes, the manifest says %llu (truncated or overwritten)", path,
                       (unsigned long long)st.st_size, (unsigned long long)f->bytes);
    if (!verify_crc) return 0;
    uint32_t crc;
    uint64_t bytes;
    if (file_checksum(path, algo, &crc, &bytes, e)) return -1;
    if (crc != f->crc || bytes != f->bytes)
        return err_set(e, "%s: %s %08x, the manifest says %08x (corrupt file)", path, cksum_name((CksumAlgo)algo), crc,
                       f->crc);
    return 0;
}

int ckpt_check_files(const char* dir, const Manifest* m, int verify_crc, int part, int stride, Err* e) {
    Err* fe = xcalloc((size_t)m->n, sizeof(Err));
    int* bad = xcalloc((size_t)m->n, sizeof(int));
#pragma omp parallel for schedule(dynamic, 1) if (verify_crc && m->n > stride)
    for (int i = 0; i < m->n; i++)
        if (i % stride == part) bad[i] = ckpt_check_file(dir, &m->f[i], m->algo, verify_crc, &fe[i]);
    int rc = 0;
    for (int i = 0; i < m->n && !rc; i++)
        if (bad[i]) rc = err_set(e, "%s", fe[i].msg);
    free(fe);
    free(bad);
    return rc;
}

// ---- directories ------------------------------------------------------------------------------
int ckpt_read_latest(const char* root, char* name, size_t n, Err* e) {
    char path[CKPT_PATH];
    ckpt_join(path, root, CKPT_LATEST);
    struct stat st;
    if (stat(path, &st)) {
        if (errno == ENOENT) return 0;
        return err_set(e, "%s: %s", path, strerror(errno));
    }
    char* text = ckpt_read_text(path, 4096, NULL, e);
    if (!text) return -1;
    size_t k = strlen(text);
    while (k && (text[k - 1] == '\n' || text[k - 1] == '\r' || text[k - 1] == ' ')) text[--k] = 0;
    int ok = ckpt_safe_name(text) && ckpt_parse_step_name(text) >= 0 && k < n;
    if (ok) ckpt_copy(name, n, text);
    else err_set(e, "%s: does not name a step_XXXXXXXX directory (content '%.40s')", path, text);
    free(text);
    return ok ? 1 : -1;
}

static int is_dir(const char* p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int ckpt_resolve(const char* path, char* dir, size_t n, Err* e) {
    struct stat st;
    if (stat(path, &st)) return err_set(e, "%s: %s", path, strerror(errno));
    char buf[CKPT_PATH], name[64];
    if (S_ISREG(st.st_mode)) {  // the `latest` file itself
        ckpt_copy(buf, sizeof buf, path);
        char* slash = strrchr(buf, '/');
        const char* base = slash ? slash + 1 : buf;
        if (strcmp(base, CKPT_LATEST) != 0)
            return err_set(e, "%s: a file; pass a checkpoint step directory, its root or its `latest` file", path);
        if (slash) *slash = 0;
        else ckpt_copy(buf, sizeof buf, ".");
        int r = ckpt_read_latest(buf, name, sizeof name, e);
        if (r <= 0) return r ? -1 : err_set(e, "%s: vanished", path);
        char full[CKPT_PATH];
        ckpt_join(full, buf, name);
        ckpt_copy(dir, n, full);
        return 0;
    }
    if (!S_ISDIR(st.st_mode)) return err_set(e, "%s: not a directory", path);
    ckpt_join(buf, path, CKPT_MANIFEST);
    if (stat(buf, &st) == 0) {
        ckpt_copy(dir, n, path);
        return 0;
    }
    int r = ckpt_read_latest(path, name, sizeof name, e);
    if (r < 0) return -1;
    if (r == 0) {
        ckpt_copy(buf, sizeof buf, path);
        size_t k = strlen(buf);
        while (k > 1 && buf[k - 1] == '/') buf[--k] = 0;
        const char* base = strrchr(buf, '/') ? strrchr(buf, '/') + 1 : buf;
        if (ckpt_parse_step_name(base) >= 0)
            return err_set(e, "%s: no %s: an incomplete or damaged checkpoint (use an older step_* or resume=auto)", path, CKPT_MANIFEST);
        return err_set(e, "%s: neither a checkpoint step directory (no %s) nor a checkpoint root (no `latest`); "
                          "pass e.g. DIR/step_00001000", path, CKPT_MANIFEST);
    }
    ckpt_join(buf, path, name);
    ckpt_copy(dir, n, buf);
    if (!is_dir(dir)) return err_set(e, "%s/%s names %s, which does not exist", path, CKPT_LATEST, name);
    return 0;
}

static int cmp_step_desc(const void* a, const void* b) {
    const StepDir *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0;
}

int ckpt_list_steps(const char* root, StepDir** out, int* n, Err* e) {
    *out = NULL;
    *n = 0;
    DIR* d = opendir(root);
    if (!d) return err_set(e, "%s: cannot list: %s", root, strerror(errno));
    int cap = 0;
    struct dirent* de;
    while ((de = readdir(d))) {
        int64_t s = ckpt_parse_step_name(de->d_name);
        if (s < 0 || strlen(de->d_name) >= 64) continue;
        char p[CKPT_PATH];
        ckpt_join(p, root, de->d_name);
        if (!is_dir(p)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            *out = realloc(*out, sizeof(StepDir) * (size_t)cap);
            if (!*out) FATAL("out of memory");
        }
        StepDir* sd = &(*out)[(*n)++];
        sd->step = s;
        ckpt_copy(sd->name, sizeof sd->name, de->d_name);
        char q[CKPT_PATH];
        ckpt_join(q, p, CKPT_MANIFEST);
        ckpt_copy(p, sizeof p, q);
        struct stat st;
        sd->complete = stat(p, &st) == 0;
    }
    closedir(d);
    if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_step_desc);
    return 0;
}

// ---- run ownership ----------------------------------------------------------------------------
static char g_run_id[64];

void ckpt_set_run_id(const char* run_id) { ckpt_copy(g_run_id, sizeof g_run_id, run_id ? run_id : ""); }
const char* ckpt_run_id(void) { return g_run_id; }

int ckpt_step_run_id(const char* root, const char* step_name, char* out, size_t n) {
    char d[CKPT_PATH], p[CKPT_PATH];
    ckpt_join(d, root, step_name);
    ckpt_join(p, d, CKPT_STATE);
    Err e = {{0}};
    char* text = ckpt_read_text(p, 64u << 20, NULL, &e);
    if (!text) return 0;
    char* cut = strstr(text, "\nconfig:");  // the scalars only
    if (cut) cut[1] = 0;
    int r = trainer_state_get(text, "run_id", out, n, &e);
    free(text);
    return r == 1 && out[0] ? 1 : 0;
}

int ckpt_step_is_mine(const char* root, const char* step_name) {
    if (!g_run_id[0]) return 1;
    char id[64];
    return !ckpt_step_run_id(root, step_name, id, sizeof id) || !strcmp(id, g_run_id);
}
