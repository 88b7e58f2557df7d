// ckpt_inspect.c — `moetrain inspect DIR`: what a checkpoint holds and whether it is intact.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

static void human(char* buf, size_t n, double bytes) {
    const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
}

typedef struct Big {
    const char* name;
    const StTensor* t;
} Big;

// The trainer state's layout line; returns 1 when the file cannot be read as one.
static int inspect_state(const char* dir, FILE* out) {
    Err le = {{0}};
    char p[CKPT_PATH];
    ckpt_join(p, dir, CKPT_STATE);
    char* state = ckpt_read_text(p, 64u << 20, NULL, &le);
    if (!state) {
        fprintf(out, "  trainer state: BAD: %s\n", le.msg);
        return 1;
    }
    TrainerState ts;
    char cfg[8];
    // The config block does not fit cfg: parse the scalars only, via a trimmed copy.
    char* cut = strstr(state, "\nconfig:");
    if (cut) cut[1] = 0;
    const int ok = trainer_state_parse(state, &ts, cfg, sizeof cfg, &le) == 0;
    free(state);
    if (!ok) {
        fprintf(out, "  trainer state: BAD: unreadable: %s\n", le.msg);
        return 1;
    }
    fprintf(out, "  layout: world %d, ep %d, edp %d; tokens %lld; seed %llu\n", ts.world, ts.ep,
            ts.ep ? ts.world / ts.ep : 0, (long long)ts.tokens, (unsigned long long)ts.seed);
    return 0;
}

// Every file of the manifest with its size and checksum; returns how many fail.
static int inspect_files(const char* dir, const Manifest* m, FILE* out) {
    Err le = {{0}};
    fprintf(out, "files:\n");
    int bad = 0;
    uint64_t total = 0;
    for (int i = 0; i < m->n; i++) {
        char sz[32];
        human(sz, sizeof sz, (double)m->f[i].bytes);
        total += m->f[i].bytes;
        int ok = ckpt_check_file(dir, &m->f[i], m->algo, 1, &le) == 0;
        bad += !ok;
        fprintf(out, "  %-28s %10s  %s %08x  %s%s\n", m->f[i].name, sz, cksum_name((CksumAlgo)m->algo), m->f[i].crc, ok ? "OK" : "BAD: ", ok ? "" : le.msg);
    }
    char tot[32];
    human(tot, sizeof tot, (double)total);
    fprintf(out, "  total %s\n", tot);
    return bad;
}

// The tensors of every rank file whose header still parses: counts and the largest; returns how
// many rank files cannot be read.
static int inspect_tensors(const char* dir, const Manifest* m, FILE* out) {
    Err le = {{0}};
    char p[CKPT_PATH];
    int unreadable = 0;
    enum { NBIG = 5 };
    Big big[NBIG] = {{0}};
    int64_t count[2] = {0, 0};
    double numel[2] = {0, 0};
    StFile** f = xcalloc((size_t)m->world, sizeof *f);
    for (int r = 0; r < m->world; r++) {
        char rn[64];
        ckpt_rank_name(rn, sizeof rn, r);
        ckpt_join(p, dir, rn);
        if (st_open(&f[r], p, &le)) {
            fprintf(out, "  %s: BAD: header unreadable: %s\n", rn, le.msg);
            unreadable++;
            f[r] = NULL;
            continue;
        }
        for (int i = 0; i < f[r]->n; i++) {
            const StTensor* t = &f[r]->t[i];
            int g = strncmp(t->name, "optim.", 6) == 0;
            count[g]++;
            numel[g] += (double)t->numel;
            for (int k = 0; k < NBIG; k++)
                if (!big[k].t || t->numel > big[k].t->numel) {
                    memmove(&big[k + 1], &big[k], sizeof(Big) * (size_t)(NBIG - 1 - k));
                    big[k] = (Big){t->name, t};
                    break;
                }
        }
    }
    fprintf(out, "tensors: %lld\n", (long long)(count[0] + count[1]));
    const char* gname[2] = {"model", "optim"};
    for (int g = 0; g < 2; g++)
        fprintf(out, "  %-6s %8lld tensors  %16.0f elements\n", gname[g], (long long)count[g], numel[g]);
    fprintf(out, "largest:\n");
    for (int k = 0; k < NBIG && big[k].t; k++) {
        char s[128];
        st_shape_str(s, sizeof s, big[k].t->ndim, big[k].t->shape);
        fprintf(out, "  %-60s %-18s %s\n", big[k].name, s, st_dtype_name(big[k].t->dtype));
    }
    for (int r = 0; r < m->world; r++) st_close(f[r]);
    free(f);
    return unreadable;
}

int ckpt_inspect(const char* path, FILE* out, Err* e) {
    char dir[CKPT_PATH];
    if (ckpt_resolve(path, dir, sizeof dir, e)) return -1;
    fprintf(out, "checkpoint %s\n", dir);
    Manifest m;
    Err le = {{0}};
    if (manifest_read(&m, dir, &le)) {
        fprintf(out, "  manifest: BAD: %s\nresult: BAD\n", le.msg);
        return 1;
    }
    fprintf(out, "  step %lld, %d rank file%s\n", (long long)m.step, m.world, m.world == 1 ? "" : "s");
    int unreadable = inspect_state(dir, out);  // files present but not readable as what they should be
    const int bad = inspect_files(dir, &m, out);
    unreadable += inspect_tensors(dir, &m, out);
    if (bad) fprintf(out, "result: BAD (%d of %d files fail their checksum or size)\n", bad, m.n);
    else if (unreadable) fprintf(out, "result: BAD (%d file(s) cannot be read as a checkpoint's; see above)\n", unreadable);
    else fprintf(out, "result: OK (every checksum holds, every file reads)\n");
    manifest_free(&m);
    return bad || unreadable ? 1 : 0;
}
