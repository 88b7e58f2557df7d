// ckpt_open.c — opening and verifying a checkpoint, finding the one to resume from, reading
// tensors by name (see ckpt.h).
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_internal.h"
#include "minijson.h"

void ckpt_close(Ckpt* ck) {
    if (!ck) return;
    for (int i = 0; i < ck->nfiles; i++) st_close(ck->files[i]);
    free(ck->files);
    free(ck->ref);
    free(ck->state);
    strmap_free(&ck->index);
    manifest_free(&ck->man);
    free(ck);
}

static int open_dir(Ckpt* ck, int verify_crc, Err* e) {
    const char* dir = ck->dir;
    if (manifest_read(&ck->man, dir, e)) return -1;
    const Manifest* m = &ck->man;
    // The manifest must list rank_00000 .. rank_{world-1} and the trainer state.
    int have_state = 0;
    int* seen = xcalloc((size_t)m->world, sizeof(int));
    int rc = 0;
    for (int i = 0; i < m->n && !rc; i++) {
        if (strcmp(m->f[i].name, CKPT_STATE) == 0) { have_state = 1; continue; }
        int r;
        char tail[32];
        if (sscanf(m->f[i].name, "rank_%5d.safetensor%1s", &r, tail) == 2 && r >= 0 && r < m->world) {
            char expect[64];
            ckpt_rank_name(expect, sizeof expect, r);
            if (strcmp(expect, m->f[i].name) == 0) { seen[r]++; continue; }
        }
        rc = err_set(e, "%s/%s: lists '%s', which is not a file of world %d", dir, CKPT_MANIFEST, m->f[i].name, m->world);
    }
    for (int r = 0; r < m->world && !rc; r++)
        if (seen[r] != 1) rc = err_set(e, "%s/%s: rank %d's file is listed %d times (world %d)", dir, CKPT_MANIFEST, r, seen[r], m->world);
    free(seen);
    if (!rc && !have_state) rc = err_set(e, "%s/%s: does not list %s", dir, CKPT_MANIFEST, CKPT_STATE);
    if (rc || ckpt_check_files(dir, m, verify_crc, 0, 1, e)) return -1;

    char p[CKPT_PATH];
    ckpt_join(p, dir, CKPT_STATE);
    ck->state = ckpt_read_text(p, 64u << 20, NULL, e);
    if (!ck->state) return -1;
    ck->files = xcalloc((size_t)m->world, sizeof(StFile*));
    int cap = 0;
    for (int r = 0; r < m->world; r++) {
        char rn[64];
        ckpt_rank_name(rn, sizeof rn, r);
        ckpt_join(p, dir, rn);
        if (st_open(&ck->files[r], p, e)) return -1;
        ck->nfiles++;
        const StFile* f = ck->files[r];
        for (int i = 0; i < f->n; i++) {
            if (ck->n == cap) {
                cap = cap ? 2 * cap : 1024;
                ck->ref = realloc(ck->ref, sizeof(TensorRef) * (size_t)cap);
                if (!ck->ref) FATAL("out of memory");
            }
            int old;
            if (strmap_put(&ck->index, f->t[i].name, ck->n, &old))
                return err_set(e, "%s: tensor '%s' is also in rank_%05d.safetensors (a checkpoint holds each name once)",
                               p, f->t[i].name, ck->ref[old].file);
            ck->ref[ck->n++] = (TensorRef){r, i};
        }
    }
    return 0;
}

int ckpt_open_ex(Ckpt** out, const char* path, int verify_crc, Err* e) {
    *out = NULL;
    Ckpt* ck = xcalloc(1, sizeof *ck);
    strmap_init(&ck->index);
    if (ckpt_resolve(path, ck->dir, sizeof ck->dir, e) || open_dir(ck, verify_crc, e)) {
        ckpt_close(ck);
        return -1;
    }
    *out = ck;
    return 0;
}

int ckpt_open(Ckpt** out, const char* path, Err* e) { return ckpt_open_ex(out, path, 1, e); }

typedef struct Verdict {
    int32_t status;
    char text[1020];  // rank 0: the resolved directory on success; else the message
} Verdict;

// Every rank checks the files i with i % world == rank (sizes and checksums), in parallel threads;
// the verdicts are all-gathered, so every rank returns the same.
int ckpt_verify_comm(Comm* comm, const char* step_dir, Err* e) {
    const int rank = comm->rank[GROUP_WORLD], W = comm->size[GROUP_WORLD];
    Verdict mine;
    memset(&mine, 0, sizeof mine);
    Manifest m;
    Err le = {{0}};
    if (manifest_read(&m, step_dir, &le) == 0) {
        if (ckpt_check_files(step_dir, &m, 1, rank, W, &le)) mine.status = -1;
        manifest_free(&m);
    } else {
        mine.status = -1;
    }
    if (mine.status) ckpt_copy(mine.text, sizeof mine.text, le.msg);
    Verdict* all = xmalloc(sizeof(Verdict) * (size_t)W);
    comm->host_all_gather(comm, GROUP_WORLD, all, &mine, sizeof mine);
    int bad = -1;
    for (int r = 0; r < W && bad < 0; r++)
        if (all[r].status) bad = r;
    if (bad == 0) err_set(e, "%s", all[0].text);
    else if (bad > 0) err_set(e, "rank %d: %s", bad, all[bad].text);
    free(all);
    return bad >= 0 ? -1 : 0;
}

int ckpt_open_comm_ex(Comm* comm, Ckpt** out, const char* path, int verified, Err* e) {
    *out = NULL;
    const int rank = comm->rank[GROUP_WORLD], W = comm->size[GROUP_WORLD];
    Verdict v;
    memset(&v, 0, sizeof v);
    Err le = {{0}};
    Ckpt* ck = NULL;
    if (rank == 0) {  // one view of `latest`: rank 0 resolves the path, every rank uses its answer
        if (ckpt_resolve(path, v.text, sizeof v.text, &le)) v.status = -1, ckpt_copy(v.text, sizeof v.text, le.msg);
    }
    comm->host_broadcast(comm, GROUP_WORLD, &v, sizeof v, 0);
    if (v.status) return err_set(e, "%s", v.text);
    if (!verified && ckpt_verify_comm(comm, v.text, e)) return -1;
    memset(&le, 0, sizeof le);
    Verdict mine;
    memset(&mine, 0, sizeof mine);
    if (ckpt_open_ex(&ck, v.text, 0, &le)) mine.status = -1, ckpt_copy(mine.text, sizeof mine.text, le.msg);
    Verdict* all = xmalloc(sizeof(Verdict) * (size_t)W);
    comm->host_all_gather(comm, GROUP_WORLD, all, &mine, sizeof mine);
    int bad = -1;
    for (int r = 0; r < W && bad < 0; r++)
        if (all[r].status) bad = r;
    if (bad >= 0) err_set(e, "opening the checkpoint failed on rank %d: %s", bad, all[bad].text);
    free(all);
    if (bad >= 0) {
        ckpt_close(ck);
        return -1;
    }
    *out = ck;
    return 0;
}

int ckpt_open_comm(Comm* comm, Ckpt** out, const char* path, Err* e) { return ckpt_open_comm_ex(comm, out, path, 0, e); }

// ---- resume -----------------------------------------------------------------------------------
static int verify_local(void* ctx, const char* step_dir, char* why, size_t n) {
    (void)ctx;
    Ckpt* ck;
    Err e = {{0}};
    if (ckpt_open_ex(&ck, step_dir, 1, &e) == 0) {
        ckpt_close(ck);
        return 1;
    }
    ckpt_copy(why, n, e.msg);
    return 0;
}

typedef struct Verifier {
    CkptVerifyFn fn;
    void* ctx;
} Verifier;

static int verifies(const Verifier* v, const char* root, const char* name, char* why, size_t n) {
    char p[CKPT_PATH];
    ckpt_join(p, root, name);
    return v->fn(v->ctx, p, why, n);
}

int ckpt_find_resume(const char* root, char* step_dir, size_t n, char* note, size_t note_n, Err* e) {
    return ckpt_find_resume_cb(root, step_dir, n, note, note_n, NULL, NULL, e);
}

// root, when it exists, must be a directory: 1 it is one, 0 it does not exist, -1 otherwise.
static int resume_root(const char* root, Err* e) {
    struct stat st;
    if (stat(root, &st)) {
        if (errno == ENOENT) return 0;
        return err_set(e, "%s: %s", root, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) return err_set(e, "%s: not a directory (checkpoint.dir must be one)", root);
    return 1;
}

// The step named by root's `latest` file into latest[n] and *lr (ckpt_read_latest's result).
// Returns 1 when that step verifies; otherwise why not goes into nb.
static int try_latest(const Verifier* v, const char* root, char* latest, size_t n, int* lr, Sb* nb) {
    char why[1024];
    Err le = {{0}};
    *lr = ckpt_read_latest(root, latest, n, &le);
    if (*lr < 0) sb_printf(nb, "%s (ignored); ", le.msg);
    else if (*lr > 0 && verifies(v, root, latest, why, sizeof why)) return 1;
    else if (*lr > 0) sb_printf(nb, "skipped %s named by latest: %s; ", latest, why);
    return 0;
}

// Resuming from a verified latest while a newer complete step exists (sd newest first): a save
// stopped between its last file and `latest`. Said in nb.
static void note_newer_than_latest(Sb* nb, const StepDir* sd, int ns, const char* latest) {
    int64_t ls = ckpt_parse_step_name(latest);
    for (int i = 0; i < ns; i++)
        if (sd[i].step > ls && sd[i].complete) {
            sb_printf(nb, "%s (not verified) is newer than latest (%s): a save was interrupted before latest was updated; "
                          "resuming from latest; ", sd[i].name, latest);
            return;
        }
}

// The first of sd (newest first) that belongs to this run and verifies, skipping tried (the step
// `latest` named, or NULL): its name into chosen[cn], 1 returned. What was skipped, and why, goes
// into nb.
static int newest_verified(const Verifier* v, const char* root, const StepDir* sd, int ns, const char* tried,
                           char* chosen, size_t cn, Sb* nb) {
    char why[1024];
    for (int i = 0; i < ns; i++) {
        if (tried && strcmp(sd[i].name, tried) == 0) continue;
        if (!ckpt_step_is_mine(root, sd[i].name)) {
            sb_printf(nb, "skipped %s: it belongs to another run; ", sd[i].name);
            continue;
        }
        if (verifies(v, root, sd[i].name, why, sizeof why)) {
            ckpt_copy(chosen, cn, sd[i].name);
            sb_printf(nb, "resuming from %s, the newest complete checkpoint", sd[i].name);
            return 1;
        }
        sb_printf(nb, "skipped %s: %s; ", sd[i].name, why);
    }
    return 0;
}

// ckpt_find_resume's result from what the search found: chosen (NULL = nothing verified), any
// (checkpoints exist) and the note nb (its trailing "; " cut here).
static int resume_result(const char* root, const char* chosen, int any, Sb* nb, char* step_dir, size_t n, char* note,
                         size_t note_n, Err* e) {
    if (nb->len >= 2 && nb->s[nb->len - 2] == ';') nb->s[nb->len -= 2] = 0;
    const char* text = nb->s ? nb->s : "";
    if (chosen) {
        char p[CKPT_PATH];
        ckpt_join(p, root, chosen);
        ckpt_copy(step_dir, n, p);
        if (note_n) ckpt_copy(note, note_n, text);
        return 1;
    }
    if (!any) return 0;
    int rc = err_set(e, "%s: no complete checkpoint to resume from: %s", root, text);
    if (note_n) ckpt_copy(note, note_n, text);
    return rc;
}

int ckpt_find_resume_cb(const char* root, char* step_dir, size_t n, char* note, size_t note_n, CkptVerifyFn fn,
                        void* ctx, Err* e) {
    const Verifier vf = {fn ? fn : verify_local, ctx};
    if (note_n) note[0] = 0;
    int r = resume_root(root, e);
    if (r <= 0) return r;
    Sb nb = {0};
    char latest[64] = "", chosen[64] = "";
    int lr;
    int found = try_latest(&vf, root, latest, sizeof latest, &lr, &nb);
    StepDir* sd = NULL;
    int ns = 0;
    Err le = {{0}};
    if (ckpt_list_steps(root, &sd, &ns, &le)) {
        sb_free(&nb);
        return err_set(e, "%s", le.msg);
    }
    if (found) {
        ckpt_copy(chosen, sizeof chosen, latest);
        note_newer_than_latest(&nb, sd, ns, latest);
    } else {
        if (lr == 0 && ns > 0) sb_printf(&nb, "%s/%s is missing; ", root, CKPT_LATEST);
        found = newest_verified(&vf, root, sd, ns, lr > 0 ? latest : NULL, chosen, sizeof chosen, &nb);
    }
    free(sd);
    int rc = resume_result(root, found ? chosen : NULL, lr != 0 || ns > 0, &nb, step_dir, n, note, note_n, e);
    sb_free(&nb);
    return rc;
}

// ---- accessors --------------------------------------------------------------------------------
const char* ckpt_trainer_state(const Ckpt* ck) { return ck->state; }
const char* ckpt_dir(const Ckpt* ck) { return ck->dir; }
int64_t ckpt_step(const Ckpt* ck) { return ck->man.step; }
int ckpt_world(const Ckpt* ck) { return ck->man.world; }
int ckpt_has(const Ckpt* ck, const char* name) { return strmap_get(&ck->index, name) >= 0; }
int ckpt_num_tensors(const Ckpt* ck) { return ck->n; }

static const StTensor* tensor_at(const Ckpt* ck, int i) { return &ck->files[ck->ref[i].file]->t[ck->ref[i].idx]; }

const char* ckpt_tensor_name(const Ckpt* ck, int i) { return i >= 0 && i < ck->n ? tensor_at(ck, i)->name : NULL; }

int ckpt_tensor_shape(const Ckpt* ck, const char* name, int* ndim, int64_t* shape) {
    int i = strmap_get(&ck->index, name);
    if (i < 0) return -1;
    const StTensor* t = tensor_at(ck, i);
    *ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) shape[d] = t->shape[d];
    return 0;
}

int ckpt_read(const Ckpt* ck, const char* name, float* dst, int ndim, const int64_t* shape, Err* e) {
    int i = strmap_get(&ck->index, name);
    if (i < 0) return err_set(e, "%s: no tensor '%s' in this checkpoint", ck->dir, name);
    const StFile* f = ck->files[ck->ref[i].file];
    const StTensor* t = tensor_at(ck, i);
    char a[128], b[128];
    if (st_shape_differs(t, ndim, shape, a, b, sizeof a))
        return err_set(e, "%s: shape %s in the checkpoint, %s expected (%s)", name, a, b, f->path);
    return st_read_f32(f, t, dst, e);
}
