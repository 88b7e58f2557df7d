// ckpt.c — ckpt_save and its streaming form (ckpt_save_begin / _append / _finish): the
// collective, atomic checkpoint write (see ckpt.h for the protocol).
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "failpoint.h"

// The crash tests' failpoint (failpoint.h: ckpt.crash_at): this process is killed at `point`.
static void crash_point(const char* point) {
    if (failpoint_hit("ckpt.crash_at", point)) raise(SIGKILL);
}

// What each rank reports at an agreement point (all-gathered, so every rank sees every verdict).
typedef struct Report {
    int32_t status;  // 0 ok, -1 failed
    uint32_t crc;    // CRC-32C of this rank's file (stage 2)
    uint64_t bytes;
    char msg[496];
} Report;

static void report_fail(Report* r, const Err* le) {
    r->status = -1;
    ckpt_copy(r->msg, sizeof r->msg, le->msg);
}

// Every rank calls this at the same point. Returns 0 when every rank is ok, else -1 with the
// first failing rank's message. all (optional) receives every report [world].
static int agree(Comm* c, const Report* mine, Report* all, Err* e) {
    const int W = c->size[GROUP_WORLD];
    Report* buf = all ? all : xmalloc(sizeof(Report) * (size_t)W);
    c->host_all_gather(c, GROUP_WORLD, buf, mine, sizeof(Report));
    int bad = -1;
    for (int r = 0; r < W && bad < 0; r++)
        if (buf[r].status) bad = r;
    if (bad >= 0) err_set(e, "checkpoint save failed on rank %d: %s", bad, buf[bad].msg);
    if (!all) free(buf);
    return bad >= 0 ? -1 : 0;
}

static int mkdir_p(const char* path, Err* e) {
    char buf[CKPT_PATH];
    ckpt_copy(buf, sizeof buf, path);
    for (char* p = buf + 1;; p++) {
        if (*p != '/' && *p != 0) continue;
        char c = *p;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return err_set(e, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = c;
        if (!c) break;
    }
    struct stat st;
    if (stat(path, &st) || !S_ISDIR(st.st_mode)) return err_set(e, "%s: exists and is not a directory", path);
    return 0;
}

// Rank 0, before anyone writes: the root exists, stale temporaries are gone, tmp is empty.
static int prepare(const char* dir, const char* tmp, Err* e) {
    if (mkdir_p(dir, e)) return -1;
    DIR* d = opendir(dir);
    if (!d) return err_set(e, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent* de;
    char p[CKPT_PATH];
    int rc = 0;
    const char* run = ckpt_run_id();
    while ((de = readdir(d)) && !rc) {
        const int is_tmp = strncmp(de->d_name, ".tmp_step_", 10) == 0;
        if (!is_tmp && strncmp(de->d_name, ".trash_", 7) != 0) continue;
        // .tmp_step_XXXXXXXX[.RUN]: another run's save in progress is not ours to remove
        const char* dot = is_tmp ? strchr(de->d_name + 10, '.') : NULL;
        if (dot && (!run[0] || strcmp(dot + 1, run))) continue;
        ckpt_join(p, dir, de->d_name);
        if (ckpt_rm_rf(p)) rc = err_set(e, "%s: cannot remove a stale temporary: %s", p, strerror(errno));
    }
    closedir(d);
    if (rc) return rc;
    if (mkdir(tmp, 0755)) return err_set(e, "%s: cannot create: %s", tmp, strerror(errno));
    return 0;
}

// Rank 0: every rank file's header parses, its size is what the rank reported, and tensor
// names are unique across ranks.
static int check_headers(const char* tmp, int W, const Report* all, Err* e) {
    StrMap names;
    strmap_init(&names);
    char** owned = NULL;
    size_t n_owned = 0, cap = 0;
    int rc = 0;
    for (int r = 0; r < W && !rc; r++) {
        char p[CKPT_PATH], rn[64];
        ckpt_rank_name(rn, sizeof rn, r);
        ckpt_join(p, tmp, rn);
        StFile* f;
        if (st_open(&f, p, e)) { rc = -1; break; }
        if (f->file_size != all[r].bytes)
            rc = err_set(e, "%s: %llu bytes on disk, rank %d wrote %llu (shared file system out of sync?)", p,
                         (unsigned long long)f->file_size, r, (unsigned long long)all[r].bytes);
        for (int i = 0; i < f->n && !rc; i++) {
            if (n_owned == cap) {
                cap = cap ? 2 * cap : 1024;
                owned = realloc(owned, sizeof(char*) * cap);
                if (!owned) FATAL("out of memory");
            }
            char* nm = owned[n_owned++] = xstrdup(f->t[i].name);
            int old;
            if (strmap_put(&names, nm, r, &old))
                rc = err_set(e, "tensor '%s' is written by rank %d and rank %d (names must be unique across ranks)", nm, old, r);
        }
        st_close(f);
    }
    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
    free(owned);
    strmap_free(&names);
    return rc;
}

// Removes complete checkpoints beyond `keep` (the one just saved always counts and stays).
// Failures here only warn: the new checkpoint is already safe.
static void prune(const char* dir, const char* newest, int keep) {
    if (keep <= 0) return;
    StepDir* sd;
    int n;
    Err le = {{0}};
    if (ckpt_list_steps(dir, &sd, &n, &le)) {
        fprintf(stderr, "moetrain: warning: pruning checkpoints: %s\n", le.msg);
        return;
    }
    int kept = 1;  // newest
    for (int i = 0; i < n; i++) {
        if (!sd[i].complete || strcmp(sd[i].name, newest) == 0) continue;
        if (!ckpt_step_is_mine(dir, sd[i].name)) continue;  // another run's: never ours to prune
        if (kept < keep) { kept++; continue; }
        char from[CKPT_PATH], to[CKPT_PATH], tn[80];
        snprintf(tn, sizeof tn, ".trash_%s", sd[i].name);
        ckpt_join(from, dir, sd[i].name);
        ckpt_join(to, dir, tn);
        // Renamed first, so a crash mid-delete leaves no half-deleted step_* behind.
        if (rename(from, to) || ckpt_rm_rf(to))
            fprintf(stderr, "moetrain: warning: could not remove old checkpoint %s: %s\n", from, strerror(errno));
    }
    free(sd);
}

// Rank 0, after every rank file is on disk: state, manifest, rename, latest, prune.
static int commit(const char* dir, const char* tmp, const char* fin, const char* step_name, int64_t step, int W,
                  const Report* all, const char* state, int keep, int* renamed, Err* e) {
    char p[CKPT_PATH], q[CKPT_PATH];
    Manifest m = {.step = step, .world = W, .algo = CKSUM_CRC32C, .n = W + 1};
    m.f = xcalloc((size_t)m.n, sizeof *m.f);
    for (int r = 0; r < W; r++) {
        ckpt_rank_name(m.f[r].name, sizeof m.f[r].name, r);
        m.f[r].bytes = all[r].bytes;
        m.f[r].crc = all[r].crc;
    }
    ManEntry* s = &m.f[W];
    ckpt_copy(s->name, sizeof s->name, CKPT_STATE);
    s->bytes = strlen(state);
    ckpt_join(p, tmp, CKPT_STATE);
    crash_point("written");
    int rc = ckpt_write_file(p, state, s->bytes, &s->crc, e);
    if (!rc) rc = check_headers(tmp, W, all, e);
    char* text = rc ? NULL : manifest_format(&m);
    ckpt_join(p, tmp, CKPT_MANIFEST);
    if (!rc) rc = ckpt_write_file(p, text, strlen(text), NULL, e);
    free(text);
    manifest_free(&m);
    if (!rc) rc = ckpt_fsync_dir(tmp, e);
    if (rc) return rc;
    crash_point("manifest");
    // A checkpoint of the same step is replaced: moved aside first, removed at the end.
    struct stat st;
    int replaced = 0;
    char tn[80];
    snprintf(tn, sizeof tn, ".trash_%s", step_name);
    ckpt_join(q, dir, tn);
    if (stat(fin, &st) == 0) {
        if (rename(fin, q)) return err_set(e, "%s: cannot move the old checkpoint of this step aside: %s", fin, strerror(errno));
        replaced = 1;
    }
    if (rename(tmp, fin)) return err_set(e, "rename %s -> %s failed: %s", tmp, fin, strerror(errno));
    *renamed = 1;
    if (ckpt_fsync_dir(dir, e)) return -1;
    crash_point("renamed");
    char line[80];
    snprintf(line, sizeof line, "%s\n", step_name);
    ckpt_join(p, dir, CKPT_LATEST ".tmp");
    ckpt_join(q, dir, CKPT_LATEST);
    if (ckpt_write_file(p, line, strlen(line), NULL, e)) return -1;
    crash_point("latest_tmp");
    if (rename(p, q)) return err_set(e, "rename %s -> %s failed: %s", p, q, strerror(errno));
    if (ckpt_fsync_dir(dir, e)) return -1;
    crash_point("latest");
    if (replaced) {
        ckpt_join(q, dir, tn);
        ckpt_rm_rf(q);
    }
    prune(dir, step_name, keep);
    return 0;
}

struct CkptSave {
    Comm* comm;
    int rank, W;
    char dir[CKPT_PATH], tmp[CKPT_PATH], fin[CKPT_PATH], step_name[64];
    int64_t step;
    char* state;  // rank 0: trainer_state.yaml (a copy)
    int keep;
    StWriter* w;
    int failed;   // this rank's file failed; le says why (reported at ckpt_save_finish)
    Err le;
    int ended;    // ckpt_save_end_local ran (info holds the file's size and checksum)
    int appended; // tensors appended so far
    StWriteInfo info;
};

static void save_free(CkptSave* s) {
    st_writer_free(s->w);  // removes an unfinished file
    free(s->state);
    free(s);
}

// A save of step into dir, not begun: this rank and the world, and the directories:
// checkpoint.dir/step_N and the temporary it is written in first (.tmp_step_N.RUNID, or
// .tmp_step_N without a run id).
static CkptSave* save_new(Comm* comm, const char* dir, int64_t step, int keep) {
    CkptSave* s = xcalloc(1, sizeof *s);
    s->comm = comm;
    s->rank = comm->rank[GROUP_WORLD];
    s->W = comm->size[GROUP_WORLD];
    s->step = step;
    s->keep = keep;
    char tn[160];
    ckpt_copy(s->dir, sizeof s->dir, dir ? dir : "");
    ckpt_step_name(s->step_name, sizeof s->step_name, step);
    if (ckpt_run_id()[0]) snprintf(tn, sizeof tn, ".tmp_%s.%.40s", s->step_name, ckpt_run_id());
    else snprintf(tn, sizeof tn, ".tmp_%s", s->step_name);
    ckpt_join(s->tmp, dir ? dir : "", tn);
    ckpt_join(s->fin, dir ? dir : "", s->step_name);
    return s;
}

// Stage 1 on this rank: the arguments checked and the tensors added to the writer (with their
// values when with_data, else to be appended). The first problem goes to le.
static void save_check_tensors(StWriter* w, const char* dir, int64_t step, int rank, const CkptTensor* t, int n,
                               int with_data, const char* trainer_state_yaml, Err* le) {
    if (!dir || !dir[0]) err_set(le, "checkpoint directory is empty (set checkpoint.dir)");
    else if (strlen(dir) > CKPT_PATH - 128) err_set(le, "checkpoint directory path is too long");
    else if (step < 0) err_set(le, "negative step %lld", (long long)step);
    else if (rank == 0 && !trainer_state_yaml) err_set(le, "rank 0 passed no trainer state");
    for (int i = 0; i < n && !le->msg[0]; i++) {
        if (t[i].ndim < 0 || t[i].ndim > 4) {
            err_set(le, "tensor '%s': %d dimensions (0..4 supported)", t[i].name ? t[i].name : "?", t[i].ndim);
            break;
        }
        if (!t[i].name ||
            (with_data ? st_writer_add(w, t[i].name, ST_F32, t[i].ndim, t[i].shape, t[i].data, le)
                       : st_writer_add_later(w, t[i].name, ST_F32, t[i].ndim, t[i].shape, le))) {
            if (!t[i].name) err_set(le, "tensor %d has no name", i);
            break;
        }
    }
}

// The rank file's metadata: format pt, the step, this rank and the world size.
static void save_meta(StWriter* w, int64_t step, int rank, int W) {
    char v[32];
    st_writer_meta(w, "format", "pt");
    snprintf(v, sizeof v, "%lld", (long long)step);
    st_writer_meta(w, "moetrain.step", v);
    snprintf(v, sizeof v, "%d", rank);
    st_writer_meta(w, "moetrain.rank", v);
    snprintf(v, sizeof v, "%d", W);
    st_writer_meta(w, "moetrain.world", v);
}

// Stages 1 and 2a of the protocol (ckpt.h). with_data: the tensors carry their values (ckpt_save).
static int save_begin(CkptSave** out, Comm* comm, const char* dir, int64_t step, const CkptTensor* t, int n,
                      int with_data, const char* trainer_state_yaml, int keep, Err* e) {
    *out = NULL;
    CkptSave* s = save_new(comm, dir, step, keep);
    const int rank = s->rank, W = s->W;
    Report me;
    memset(&me, 0, sizeof me);
    Err le = {{0}};
    char rn[64], path[CKPT_PATH];

    // Stage 1: every rank checks its tensors; rank 0 prepares the temporary directory.
    StWriter* w = s->w = st_writer_new();
    save_check_tensors(w, dir, step, rank, t, n, with_data, trainer_state_yaml, &le);
    if (rank == 0 && trainer_state_yaml) s->state = xstrdup(trainer_state_yaml);
    save_meta(w, step, rank, W);
    int prepared = 0;
    if (!le.msg[0] && rank == 0) prepared = prepare(dir, s->tmp, &le) == 0;
    if (le.msg[0]) report_fail(&me, &le);
    if (agree(comm, &me, NULL, e)) {
        if (prepared) ckpt_rm_rf(s->tmp);
        save_free(s);
        return -1;
    }

    // Stage 2a: every rank creates its file and writes the header (the data streams in later).
    ckpt_rank_name(rn, sizeof rn, rank);
    ckpt_join(path, s->tmp, rn);
    if (st_writer_begin(w, path, &le)) report_fail(&me, &le);
    if (agree(comm, &me, NULL, e)) {
        st_writer_free(s->w);  // closes and removes this rank's file
        s->w = NULL;
        if (rank == 0) ckpt_rm_rf(s->tmp);
        save_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

int ckpt_save_begin(CkptSave** out, Comm* comm, const char* dir, int64_t step, const CkptTensor* t, int n,
                    const char* trainer_state_yaml, int keep, Err* e) {
    return save_begin(out, comm, dir, step, t, n, 0, trainer_state_yaml, keep, e);
}

int ckpt_save_append(CkptSave* s, const float* data) {
    if (s->failed) return -1;
    if (st_writer_put(s->w, data, &s->le)) s->failed = 1;
    if (++s->appended == 2) crash_point("append");  // mid-file, for the crash tests
    return s->failed ? -1 : 0;
}

void ckpt_save_end_local(CkptSave* s) {
    if (s->ended) return;
    s->ended = 1;
    if (!s->failed && st_writer_end(s->w, &s->info, &s->le)) s->failed = 1;
}

void ckpt_save_abort(CkptSave* s) {
    if (s) save_free(s);  // an unfinished file is removed; the temporary directory stays for the next save to clear
}

int ckpt_save_finish(CkptSave* s, Err* e) {
    Comm* comm = s->comm;
    const int rank = s->rank, W = s->W;
    Report me;
    memset(&me, 0, sizeof me);

    // Stage 2b: every rank fsyncs its file; sizes and crcs go to rank 0.
    ckpt_save_end_local(s);
    if (s->failed) report_fail(&me, &s->le);
    me.bytes = s->info.bytes;
    me.crc = s->info.crc32c;
    st_writer_free(s->w);
    s->w = NULL;
    Report* all = xmalloc(sizeof(Report) * (size_t)W);
    if (agree(comm, &me, all, e)) {
        if (rank == 0) ckpt_rm_rf(s->tmp);  // every rank is done writing
        free(all);
        save_free(s);
        return -1;
    }

    // Stage 3: rank 0 commits; its verdict is shared.
    memset(&me, 0, sizeof me);
    int renamed = 0;
    Err le = {{0}};
    if (rank == 0 &&
        commit(s->dir, s->tmp, s->fin, s->step_name, s->step, W, all, s->state, s->keep, &renamed, &le)) {
        report_fail(&me, &le);
        if (!renamed) ckpt_rm_rf(s->tmp);
    }
    free(all);
    save_free(s);
    return agree(comm, &me, NULL, e);
}

int ckpt_save(Comm* comm, const char* dir, int64_t step, const CkptTensor* t, int n,
              const char* trainer_state_yaml, int keep, Err* e) {
    CkptSave* s;
    if (save_begin(&s, comm, dir, step, t, n, 1, trainer_state_yaml, keep, e)) return -1;
    for (int i = 0; i < n; i++)
        if (ckpt_save_append(s, NULL)) break;  // the values are the tensors' own
    return ckpt_save_finish(s, e);
}
