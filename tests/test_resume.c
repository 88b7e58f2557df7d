// test_resume.c — the trainer's checkpoints in one process (world 1, CPU, random tokens, a
// tiny model with 2 micro-batches of gradient accumulation):
//   exact resume      6 steps straight == 3 steps, stop (as on SIGTERM, exit 3), resume=auto,
//                     3 more: the metrics trace, the last loss, masters, Adam m and v, the
//                     compute weights and the final checkpoint files are bit for bit equal
//   bad checkpoints   corrupt, truncated, mismatched model, missing: each refused with its own
//                     message naming the file; resume=auto falls back to the newest complete one;
//                     all corrupt → refused (not silently restarted)
//   export/init_from  fp32 export then init_from gives every tensor bit for bit; bf16 gives the
//                     bf16 rounding of every tensor; a different model in config.json / in the
//                     shapes is refused with a message naming it
//   keep / every      checkpoint.every and checkpoint.keep: older ones pruned, latest newest
//   eval              `moetrain eval --ckpt` prints the final validation loss of training
//                     (checkpoint and exported Hugging Face directory)
//   weight-only       checkpoint.save_optimizer=false: the masters alone (names, bits, a third
//                     of the bytes, optimizer_state: false); inspect / export / eval work on it;
//                     resume logs the line, continues at step 3 with m = v = 0 and Adam's step
//                     count at 1, and runs bit for bit like the full checkpoint resumed with its
//                     moments zeroed; the first update is a fresh Adam step (|Δw| = lr)
//   fp8 switch        precision.fp8 none → experts on resume, and back (checkpoints unchanged)
//   fp8 weight codes  precision.fp8_weights=per_step equals per_gemm bit for bit (state, metrics)
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sys/stat.h>

#include "comm.h"
#include "hf.h"
#include "test_resume_util.h"
#include "train.h"

static char g_dir[256];
static char g_bin[PATH_MAX];

static int nonzero(const float* x, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += x[i] != 0;
    return k > n / 2;
}

static void test_exact_resume(void) {
    char a1[300], a2[300], b1[300], b2[300];
    snprintf(a1, sizeof a1, "checkpoint.dir=%s/a", g_dir);
    snprintf(a2, sizeof a2, "log.dir=%s/la", g_dir);
    snprintf(b1, sizeof b1, "checkpoint.dir=%s/b", g_dir);
    snprintf(b2, sizeof b2, "log.dir=%s/lb", g_dir);
    Err e = {{0}};
    Trainer A, B, C;
    const char* ea[] = {a1, a2};
    EXPECT(tiny_trainer(&A, ea, 2, &e) == 0, "init A: %s", e.msg);
    EXPECT(trainer_run(&A) == EXIT_OK && A.step == 6 && A.updates == 6, "A runs 6 steps (step %d)", A.step);

    const char* eb[] = {b1, b2};
    EXPECT(tiny_trainer(&B, eb, 2, &e) == 0, "init B: %s", e.msg);
    B.stop_at = 3;
    int rc = trainer_run(&B);
    EXPECT(rc == EXIT_PREEMPTED && B.step == 3, "B stops after step 3 with exit %d (got %d, step %d)", EXIT_PREEMPTED, rc, B.step);
    trainer_free(&B);
    char p[400];
    snprintf(p, sizeof p, "%s/b/step_00000003/manifest.txt", g_dir);
    EXPECT(access(p, F_OK) == 0, "the stop wrote step 3");

    const char* ec[] = {b1, b2, "checkpoint.resume=auto"};
    EXPECT(tiny_trainer(&C, ec, 3, &e) == 0, "init C: %s", e.msg);
    EXPECT(C.step == 3 && C.updates == 3 && C.tokens == 3 * 8 * 16 && strstr(C.resumed_from, "step_00000003"),
           "C resumes at step 3 (step %d, updates %lld, tokens %lld, from '%s')", C.step, (long long)C.updates,
           (long long)C.tokens, C.resumed_from);
    EXPECT(trainer_run(&C) == EXIT_OK && C.step == 6, "C finishes");

    EXPECT(isfinite(A.last_loss) && memcmp(&A.last_loss, &C.last_loss, sizeof(double)) == 0, "last loss %.17g vs %.17g",
           C.last_loss, A.last_loss);
    const char* what = "";
    EXPECT(trainer_state_eq(&A, &C, 1, &what), "final %s differ", what);
    EXPECT(nonzero(A.opt.sh[0].master, A.opt.sh[0].n / 2) && nonzero(A.opt.sh[1].v, A.opt.sh[1].n / 2), "state is not zeros");
    EXPECT(A.tokens == C.tokens && A.updates == C.updates && A.skipped == C.skipped, "counters");

    char *ta[16], *tc[16];
    snprintf(p, sizeof p, "%s/la/metrics.jsonl", g_dir);
    int na = read_trace(p, ta, 16);
    snprintf(p, sizeof p, "%s/lb/metrics.jsonl", g_dir);
    int nc = read_trace(p, tc, 16);
    EXPECT(na == 6 && nc == 6, "6 metrics lines each (%d, %d)", na, nc);
    for (int i = 0; i < na && i < nc; i++) EXPECT(strcmp(ta[i], tc[i]) == 0, "trace line %d:\n%s%s", i + 1, ta[i], tc[i]);
    EXPECT(na > 1 && strcmp(ta[0], ta[na - 1]) != 0, "the trace moves");
    free_trace(ta, na > 0 ? na : 0);
    free_trace(tc, nc > 0 ? nc : 0);

    char da[300], db[300], msg[1100];
    snprintf(da, sizeof da, "%s/a/step_00000006", g_dir);
    snprintf(db, sizeof db, "%s/b/step_00000006", g_dir);
    int d = ckpt_diff(da, db, msg, sizeof msg);
    EXPECT(d == 0, "final checkpoints differ: %d (%s)", d, msg);
    trainer_free(&A);
    trainer_free(&C);
}

// A copy of checkpoint root b (from test_exact_resume: step 3 and step 6) as `name`.
static void copy_b(const char* name) { sh("rm -rf '%s/%s' && cp -r '%s/b' '%s/%s'", g_dir, name, g_dir, g_dir, name); }

static int try_resume(const char* resume, const char* dir, const char* more, Trainer* t, Err* e) {
    char r[400], d[400];
    snprintf(r, sizeof r, "checkpoint.resume=%s", resume);
    snprintf(d, sizeof d, "checkpoint.dir=%s", dir ? dir : "");
    const char* ex[] = {r, d, more};
    return tiny_trainer(t, ex, 3, e);
}

static void test_bad_checkpoints(void) {
    char root[300], step6[400], file[500];
    Err e = {{0}};
    Trainer t;
    // corrupt: one byte of rank 0's tensor data
    copy_b("corrupt");
    snprintf(root, sizeof root, "%s/corrupt", g_dir);
    snprintf(step6, sizeof step6, "%s/step_00000006", root);
    snprintf(file, sizeof file, "%s/rank_00000.safetensors", step6);
    EXPECT(flip_byte(file, -100) == 0, "damage %s", file);
    EXPECT(try_resume(step6, NULL, NULL, &t, &e) == -1 && strstr(e.msg, file) && strstr(e.msg, "crc32"),
           "corrupt file named: %s", e.msg);
    trainer_free(&t);
    EXPECT(try_resume("auto", root, NULL, &t, &e) == 0 && t.step == 3 && strstr(t.resumed_from, "step_00000003"),
           "auto falls back to step 3: %s (step %d)", e.msg, t.step);
    trainer_free(&t);

    // truncated
    copy_b("trunc");
    snprintf(root, sizeof root, "%s/trunc", g_dir);
    snprintf(step6, sizeof step6, "%s/step_00000006", root);
    snprintf(file, sizeof file, "%s/rank_00000.safetensors", step6);
    struct stat st;
    EXPECT(stat(file, &st) == 0 && truncate(file, st.st_size - 64) == 0, "truncate");
    e.msg[0] = 0;
    EXPECT(try_resume(step6, NULL, NULL, &t, &e) == -1 && strstr(e.msg, file) && strstr(e.msg, "truncated"),
           "truncated file named: %s", e.msg);
    trainer_free(&t);
    EXPECT(try_resume("auto", root, NULL, &t, &e) == 0 && t.step == 3, "auto falls back to step 3: %s", e.msg);
    trainer_free(&t);

    // a damaged manifest
    copy_b("manifest");
    snprintf(step6, sizeof step6, "%s/manifest/step_00000006", g_dir);
    snprintf(file, sizeof file, "%s/manifest.txt", step6);
    EXPECT(flip_byte(file, 20) == 0, "damage manifest");
    EXPECT(try_resume(step6, NULL, NULL, &t, &e) == -1 && strstr(e.msg, file), "manifest named: %s", e.msg);
    trainer_free(&t);

    // mismatched: another model width than the checkpoint's
    snprintf(step6, sizeof step6, "%s/b/step_00000006", g_dir);
    EXPECT(try_resume(step6, NULL, "model.hidden=16", &t, &e) == -1 && strstr(e.msg, "trainer_state.yaml") &&
               strstr(e.msg, "model.hidden=32 there, 16 in this run"),
           "mismatched model: %s", e.msg);
    trainer_free(&t);

    // every checkpoint corrupt: auto refuses instead of restarting from scratch
    snprintf(root, sizeof root, "%s/corrupt", g_dir);
    snprintf(file, sizeof file, "%s/step_00000003/rank_00000.safetensors", root);
    EXPECT(flip_byte(file, -100) == 0, "damage step 3 too");
    EXPECT(try_resume("auto", root, NULL, &t, &e) == -1 && strstr(e.msg, "no complete checkpoint") && strstr(e.msg, "step_00000003"),
           "all corrupt: %s", e.msg);
    trainer_free(&t);

    // a path that is not a checkpoint
    snprintf(root, sizeof root, "%s/nothing_here", g_dir);
    EXPECT(try_resume(root, NULL, NULL, &t, &e) == -1 && strstr(e.msg, root), "missing: %s", e.msg);
    trainer_free(&t);
    // auto with an empty directory: a fresh start
    snprintf(root, sizeof root, "%s/empty", g_dir);
    EXPECT(try_resume("auto", root, NULL, &t, &e) == 0 && t.step == 0 && !t.resumed_from[0], "fresh start: %s", e.msg);
    trainer_free(&t);
}

static void test_export_init_from(void) {
    char step6[400], hf32[400], hf16[400], nocfg[400], arg[500];
    snprintf(step6, sizeof step6, "%s/a/step_00000006", g_dir);
    snprintf(hf32, sizeof hf32, "%s/hf32", g_dir);
    snprintf(hf16, sizeof hf16, "%s/hf16", g_dir);
    Err e = {{0}};
    Ckpt* ck = NULL;
    EXPECT(ckpt_open(&ck, step6, &e) == 0, "open: %s", e.msg);
    if (!ck) return;
    Config c;
    tiny_config(&c, NULL, 0, &e);
    EXPECT(hf_export(ck, &c.model, hf32, DTYPE_F32, &e) == 0, "export fp32: %s", e.msg);
    EXPECT(hf_export(ck, &c.model, hf16, DTYPE_BF16, &e) == 0, "export bf16: %s", e.msg);
    for (int pass = 0; pass < 2; pass++) {
        snprintf(arg, sizeof arg, "checkpoint.init_from=%s", pass ? hf16 : hf32);
        const char* ex[] = {arg};
        Trainer t;
        EXPECT(tiny_trainer(&t, ex, 1, &e) == 0, "init_from: %s", e.msg);
        int bad = 0, n = 0;
        for (int i = 0; i < t.model.pl.n; i++) {
            const ParamInfo* p = &t.model.pl.p[i];
            float* x = xmalloc(sizeof(float) * p->numel);
            if (ckpt_read(ck, p->name, x, p->ndim, p->shape, &e)) bad++;
            const float* w = t.opt.sh[p->arena].master + p->offset;  // world 1: the whole arena
            const float* cw = (const float*)t.model.w[p->arena] + p->offset;
            for (size_t k = 0; k < p->numel; k++) {
                float want = pass ? bf16_to_f32(f32_to_bf16(x[k])) : x[k];
                bad += memcmp(&w[k], &want, 4) != 0 || memcmp(&cw[k], &want, 4) != 0;
            }
            free(x);
            n++;
        }
        EXPECT(bad == 0 && n == 41, "%s: %d tensors, %d values differ", pass ? "bf16" : "fp32", n, bad);
        EXPECT(t.step == 0 && !nonzero(t.opt.sh[0].m, t.opt.sh[0].n) && !nonzero(t.opt.sh[1].v, t.opt.sh[1].n),
               "fresh optimizer at step 0");
        EXPECT(nonzero(t.opt.sh[1].master, t.model.numel[1]), "experts loaded");
        trainer_free(&t);
    }
    ckpt_close(ck);

    // another model than config.json's
    Trainer t;
    snprintf(arg, sizeof arg, "checkpoint.init_from=%s", hf32);
    const char* ex[] = {arg, "model.ffn=40"};
    EXPECT(tiny_trainer(&t, ex, 2, &e) == -1 && strstr(e.msg, "config.json") && strstr(e.msg, "model.ffn=48 there, 40"),
           "config.json mismatch: %s", e.msg);
    trainer_free(&t);
    // without config.json the shapes are checked tensor by tensor
    snprintf(nocfg, sizeof nocfg, "%s/hf_nocfg", g_dir);
    sh("cp -r '%s' '%s' && rm '%s/config.json'", hf32, nocfg, nocfg);
    snprintf(arg, sizeof arg, "checkpoint.init_from=%s", nocfg);
    EXPECT(tiny_trainer(&t, ex, 2, &e) == -1 && strstr(e.msg, nocfg) && strstr(e.msg, "experts.0.w1.weight") && strstr(e.msg, "shape"),
           "shape mismatch: %s", e.msg);
    trainer_free(&t);
    // not a Hugging Face directory
    snprintf(arg, sizeof arg, "checkpoint.init_from=%s/nothing_here", g_dir);
    const char* ex2[] = {arg};
    EXPECT(tiny_trainer(&t, ex2, 1, &e) == -1 && strstr(e.msg, "nothing_here"), "missing HF dir: %s", e.msg);
    EXPECT(t.metrics.fd == -1, "no metrics file after a failed start (fd %d)", t.metrics.fd);
    trainer_free(&t);
    EXPECT(fcntl(0, F_GETFD) != -1, "trainer_free after a failed start leaves stdin open");
}

static void test_keep_every(void) {
    char d[300], p[400];
    snprintf(d, sizeof d, "checkpoint.dir=%s/k", g_dir);
    const char* ex[] = {d, "train.steps=5", "checkpoint.every=2", "checkpoint.keep=2"};
    Err e = {{0}};
    Trainer t;
    EXPECT(tiny_trainer(&t, ex, 4, &e) == 0, "init: %s", e.msg);
    EXPECT(trainer_run(&t) == EXIT_OK, "run");
    trainer_free(&t);
    const int want[] = {0, 0, 0, 0, 1, 1};  // steps 2 and 4 saved by every, 5 at the end; keep 2
    for (int s = 1; s <= 5; s++) {
        snprintf(p, sizeof p, "%s/k/step_%08d", g_dir, s);
        EXPECT((access(p, F_OK) == 0) == want[s], "step %d %s", s, want[s] ? "kept" : "absent");
    }
    snprintf(p, sizeof p, "%s/k/latest", g_dir);
    FILE* f = fopen(p, "r");
    char line[64] = "";
    if (f) {
        if (!fgets(line, sizeof line, f)) line[0] = 0;
        fclose(f);
    }
    EXPECT(!strcmp(line, "step_00000005\n"), "latest: '%s'", line);
}

static int run_eval(const char* args, char* val, size_t n) {
    char cmd[5000], out[400];
    snprintf(out, sizeof out, "%s/eval.out", g_dir);
    snprintf(cmd, sizeof cmd, "%s eval %s > %s 2>&1", g_bin, args, out);
    int rc = sh("%s", cmd);
    last_val_loss(out, val, n);
    if (rc) sh("cat %s >&2", out);
    return rc;
}

static void test_eval_cmd(void) {
    if (access(g_bin, X_OK)) {
        EXPECT(0, "%s is not built", g_bin);
        return;
    }
    char want[64], got[64], p[400], args[800];
    snprintf(p, sizeof p, "%s/la/metrics.jsonl", g_dir);
    last_val_loss(p, want, sizeof want);
    EXPECT(want[0] && atof(want) > 0, "training logged a final validation loss ('%s')", want);
    snprintf(args, sizeof args, "--ckpt %s/a", g_dir);
    EXPECT(run_eval(args, got, sizeof got) == 0 && !strcmp(got, want), "eval of the checkpoint: '%s', training: '%s'", got, want);
    // the exported Hugging Face directory: the model from config.json, the data settings given
    snprintf(args, sizeof args,
             "--ckpt %s/hf32 data.format=random train.seed=77 train.seq_len=16 train.micro_batch=4 train.global_batch=8 "
             "train.eval_batches=2 train.device=cpu", g_dir);
    EXPECT(run_eval(args, got, sizeof got) == 0 && !strcmp(got, want), "eval of the HF export: '%s', training: '%s'", got, want);
    // an earlier checkpoint gives a different (higher) loss: the command reads what it is given
    snprintf(args, sizeof args, "--ckpt %s/b/step_00000003", g_dir);
    EXPECT(run_eval(args, got, sizeof got) == 0 && got[0] && atof(got) > atof(want), "step 3: '%s' > '%s'", got, want);
    snprintf(args, sizeof args, "--ckpt %s/nothing_here", g_dir);
    EXPECT(run_eval(args, got, sizeof got) == 2, "eval of a missing checkpoint exits 2");
}

static int allzero(const float* x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0) return 0;
    return 1;
}

static long file_size(const char* path) {
    struct stat st;
    return stat(path, &st) ? -1 : (long)st.st_size;
}

// tiny_trainer() with stdout (log_info) going to a file.
static int init_logged(Trainer* t, const char* const* extra, int n, const char* log, Err* e) {
    fflush(stdout);
    int saved = dup(1), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 1), close(fd);
    int rc = tiny_trainer(t, extra, n, e);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    return rc;
}

static const char* const NO_OPT_LINE =
    "has no optimizer state (saved with checkpoint.save_optimizer=false): Adam moments restart from zero; the run is "
    "not an exact continuation";

// Needs test_exact_resume's b/step_00000003 (full state) and la/metrics.jsonl (6 steps straight).
static void test_weight_only(void) {
    char w1[300], w2[300], p[600], q[600];
    snprintf(w1, sizeof w1, "checkpoint.dir=%s/w", g_dir);
    snprintf(w2, sizeof w2, "log.dir=%s/lw", g_dir);
    Err e = {{0}};
    Trainer W;
    const char* ew[] = {w1, w2, "checkpoint.save_optimizer=false"};
    EXPECT(tiny_trainer(&W, ew, 3, &e) == 0, "init W: %s", e.msg);
    W.stop_at = 3;
    int rc = trainer_run(&W);
    EXPECT(rc == EXIT_PREEMPTED && W.step == 3, "W stops after step 3 (exit %d, step %d)", rc, W.step);
    trainer_free(&W);

    // contents: exactly the master tensors, bit for bit those of the full checkpoint of step 3
    char wd[400], bd[400];
    snprintf(wd, sizeof wd, "%s/w/step_00000003", g_dir);
    snprintf(bd, sizeof bd, "%s/b/step_00000003", g_dir);
    Ckpt *cw = NULL, *cb = NULL;
    EXPECT(ckpt_open(&cw, wd, &e) == 0, "open %s: %s", wd, e.msg);
    EXPECT(ckpt_open(&cb, bd, &e) == 0, "open %s: %s", bd, e.msg);
    if (!cw || !cb) {
        if (cw) ckpt_close(cw);
        if (cb) ckpt_close(cb);
        return;
    }
    int nmodel = 0;
    for (int i = 0; i < ckpt_num_tensors(cb); i++) nmodel += strncmp(ckpt_tensor_name(cb, i), "optim.", 6) != 0;
    EXPECT(nmodel == 41 && ckpt_num_tensors(cb) == 3 * nmodel, "full: 41 masters + 82 moments (%d of %d)", nmodel,
           ckpt_num_tensors(cb));
    EXPECT(ckpt_num_tensors(cw) == nmodel, "weight-only: %d tensors, %d masters", ckpt_num_tensors(cw), nmodel);
    int bad = 0, opt = 0;
    for (int i = 0; i < ckpt_num_tensors(cw); i++) {
        const char* nm = ckpt_tensor_name(cw, i);
        opt += strncmp(nm, "optim.", 6) == 0;
        int nd = 0;
        int64_t shp[8];
        if (!ckpt_has(cb, nm) || ckpt_tensor_shape(cw, nm, &nd, shp)) {
            bad++;
            continue;
        }
        size_t numel = 1;
        for (int d = 0; d < nd; d++) numel *= (size_t)shp[d];
        float* x = xmalloc(sizeof(float) * numel);
        float* y = xmalloc(sizeof(float) * numel);
        bad += ckpt_read(cw, nm, x, nd, shp, &e) || ckpt_read(cb, nm, y, nd, shp, &e) || memcmp(x, y, sizeof(float) * numel);
        free(x);
        free(y);
    }
    EXPECT(opt == 0 && bad == 0, "no optim.* tensors (%d); every master as in the full checkpoint (%d differ)", opt, bad);
    EXPECT(strstr(ckpt_trainer_state(cw), "\noptimizer_state: false\n") && strstr(ckpt_trainer_state(cw), "save_optimizer: false"),
           "trainer_state.yaml says optimizer_state: false");
    EXPECT(strstr(ckpt_trainer_state(cb), "\noptimizer_state: true\n"), "the full one says optimizer_state: true");
    snprintf(p, sizeof p, "%s/rank_00000.safetensors", wd);
    snprintf(q, sizeof q, "%s/rank_00000.safetensors", bd);
    const double ratio = (double)file_size(p) / (double)file_size(q);
    EXPECT(file_size(p) > 0 && ratio > 0.32 && ratio < 0.35, "weight-only file is a third of the full one (%ld / %ld = %.4f)",
           file_size(p), file_size(q), ratio);

    // export: the same Hugging Face directory as the full checkpoint's
    char hw[400], hb[400];
    snprintf(hw, sizeof hw, "%s/hf_w", g_dir);
    snprintf(hb, sizeof hb, "%s/hf_b3", g_dir);
    Config c;
    tiny_config(&c, NULL, 0, &e);
    EXPECT(hf_export(cw, &c.model, hw, DTYPE_F32, &e) == 0, "export weight-only: %s", e.msg);
    EXPECT(hf_export(cb, &c.model, hb, DTYPE_F32, &e) == 0, "export full: %s", e.msg);
    EXPECT(sh("diff -r '%s' '%s' > /dev/null", hw, hb) == 0, "the exports are identical");
    ckpt_close(cw);
    ckpt_close(cb);

    // inspect: OK, no optim group
    if (access(g_bin, X_OK) == 0) {
        char out[400], text[8192], want[64];
        snprintf(out, sizeof out, "%s/inspect_w.out", g_dir);
        EXPECT(sh("%s inspect %s > %s 2>&1", g_bin, wd, out) == 0, "inspect of the weight-only checkpoint exits 0");
        t_read_text(out, text, sizeof text);
        snprintf(want, sizeof want, "  %-6s %8lld tensors", "optim", 0LL);
        EXPECT(strstr(text, want) && strstr(text, "result: OK"), "inspect: no optimizer tensors, OK:\n%s", text);
        // eval: the same loss as the full checkpoint of the same step
        char gw[64], gb[64], args[500];
        snprintf(args, sizeof args, "--ckpt %s", wd);
        EXPECT(run_eval(args, gw, sizeof gw) == 0 && gw[0], "eval of the weight-only checkpoint: '%s'", gw);
        snprintf(args, sizeof args, "--ckpt %s", bd);
        EXPECT(run_eval(args, gb, sizeof gb) == 0 && !strcmp(gw, gb), "eval: weight-only '%s', full '%s'", gw, gb);
    } else {
        EXPECT(0, "%s is not built", g_bin);
    }

    // resume: D from the weight-only checkpoint (resume=auto), R from the full one with its
    // moments and Adam step count reset by hand — what a fresh-moment run is.
    Trainer D, R;
    char dlog[400];
    snprintf(dlog, sizeof dlog, "%s/d.out", g_dir);
    const char* ed[] = {w1, w2, "checkpoint.resume=auto"};
    EXPECT(init_logged(&D, ed, 3, dlog, &e) == 0, "init D: %s", e.msg);
    char text[8192];
    t_read_text(dlog, text, sizeof text);
    EXPECT(strstr(text, NO_OPT_LINE) != NULL, "the resume logs the line:\n%s", text);
    EXPECT(D.step == 3 && D.updates == 0 && D.tokens == 3 * 8 * 16 && strstr(D.resumed_from, "w/step_00000003"),
           "D resumes at step 3, Adam step count 0 (step %d, updates %lld, tokens %lld, from '%s')", D.step,
           (long long)D.updates, (long long)D.tokens, D.resumed_from);
    int zero = 1;
    for (int a = 0; a < 2; a++) zero &= allzero(D.opt.sh[a].m, D.opt.sh[a].n) && allzero(D.opt.sh[a].v, D.opt.sh[a].n);
    EXPECT(zero, "Adam m and v are zero at the start");
    char r1[500], r2[400], r3[400], rlog[400];
    snprintf(r1, sizeof r1, "checkpoint.resume=%s", bd);
    snprintf(r2, sizeof r2, "checkpoint.dir=%s/r", g_dir);
    snprintf(r3, sizeof r3, "log.dir=%s/lr", g_dir);
    snprintf(rlog, sizeof rlog, "%s/r.out", g_dir);
    const char* er[] = {r1, r2, r3};
    EXPECT(init_logged(&R, er, 3, rlog, &e) == 0 && R.step == 3 && R.updates == 3, "init R: %s", e.msg);
    t_read_text(rlog, text, sizeof text);
    EXPECT(!strstr(text, "has no optimizer state"), "a full checkpoint does not log the line");
    EXPECT(nonzero(R.opt.sh[1].v, R.opt.sh[1].n / 2), "R has its moments before the reset");
    for (int a = 0; a < 2; a++) {
        memset(R.opt.sh[a].m, 0, sizeof(float) * R.opt.sh[a].n);
        memset(R.opt.sh[a].v, 0, sizeof(float) * R.opt.sh[a].n);
    }
    R.updates = 0;
    const char* what = "";
    EXPECT(trainer_state_eq(&D, &R, 1, &what), "at the start: %s differ", what);
    EXPECT(trainer_run(&D) == EXIT_OK && D.step == 6 && D.updates == 3, "D finishes (step %d, updates %lld)", D.step,
           (long long)D.updates);
    EXPECT(trainer_run(&R) == EXIT_OK && R.step == 6, "R finishes");
    EXPECT(isfinite(D.last_loss) && memcmp(&D.last_loss, &R.last_loss, sizeof(double)) == 0, "last loss %.17g vs %.17g",
           D.last_loss, R.last_loss);
    EXPECT(trainer_state_eq(&D, &R, 1, &what), "final %s differ", what);
    trainer_free(&D);
    trainer_free(&R);
    // traces: D's steps 4..6 are R's; step 4 (weights of step 3, before any update) is the
    // uninterrupted run's, step 5 is not (the moments differ)
    char *td[16], *tr[16], *ta[16];
    snprintf(p, sizeof p, "%s/lw/metrics.jsonl", g_dir);
    int nd = read_trace(p, td, 16);
    snprintf(p, sizeof p, "%s/lr/metrics.jsonl", g_dir);
    int nr = read_trace(p, tr, 16);
    snprintf(p, sizeof p, "%s/la/metrics.jsonl", g_dir);
    int na = read_trace(p, ta, 16);
    EXPECT(nd == 6 && nr == 3 && na == 6, "metrics lines: D %d, R %d, A %d", nd, nr, na);
    if (nd == 6 && nr == 3 && na == 6) {
        for (int i = 0; i < 3; i++) EXPECT(strcmp(td[3 + i], tr[i]) == 0, "step %d:\n%s%s", 4 + i, td[3 + i], tr[i]);
        for (int i = 0; i < 4; i++) EXPECT(strcmp(td[i], ta[i]) == 0, "step %d equals the uninterrupted run's", i + 1);
        EXPECT(strcmp(td[4], ta[4]) != 0, "step 5 differs from the uninterrupted run's (fresh moments)");
    }
    free_trace(td, nd > 0 ? nd : 0);
    free_trace(tr, nr > 0 ? nr : 0);
    free_trace(ta, na > 0 ? na : 0);

    // The first update after the resume is a fresh Adam step: with Adam's step count at 1,
    // m̂ = g and v̂ = g², so each weight moves by lr·g/(|g| + eps) (weight decay off here).
    // Continuing the saved count (4) would move it by 0.56 lr (β1 0.9, β2 0.95).
    Trainer F;
    char f1[500], f2[400];
    snprintf(f1, sizeof f1, "checkpoint.resume=%s", wd);
    snprintf(f2, sizeof f2, "checkpoint.dir=%s/f", g_dir);
    const char* ef[] = {f1, f2, "optim.weight_decay=0"};
    EXPECT(tiny_trainer(&F, ef, 3, &e) == 0 && F.step == 3 && F.updates == 0, "init F: %s", e.msg);
    float* w0[2];
    for (int a = 0; a < 2; a++) {
        w0[a] = xmalloc(sizeof(float) * F.opt.sh[a].n + 1);
        memcpy(w0[a], F.opt.sh[a].master, sizeof(float) * F.opt.sh[a].n);
    }
    F.stop_at = 4;
    EXPECT(trainer_run(&F) == EXIT_PREEMPTED && F.step == 4 && F.updates == 1, "F runs one step (step %d)", F.step);
    const double lr = optim_lr(&F.cfg.optim, F.cfg.train.steps, 3);
    const double b1 = F.cfg.optim.beta1, b2 = F.cfg.optim.beta2, eps = F.cfg.optim.eps;
    size_t n = 0, ok = 0, unit = 0;
    double worst = 0;
    for (int a = 0; a < 2; a++) {
        const OptShard* s = &F.opt.sh[a];
        for (size_t i = 0; i < s->n; i++) {
            const double g = s->m[i] / (1 - b1), ag = sqrt(s->v[i] / (1 - b2));  // m = (1-β1) g, v = (1-β2) g²
            if (ag < 1e-4) continue;                                               // eps matters, or padding
            const double u = ((double)w0[a][i] - s->master[i]) / lr, want = g / (ag + eps);
            n++;
            ok += fabs(u - want) < 1e-3;
            unit += fabs(fabs(u) - 1) < 1e-3;
            if (fabs(u - want) > worst) worst = fabs(u - want);
        }
        free(w0[a]);
    }
    EXPECT(n > 10000 && ok == n && unit == n, "first update = lr·g/|g| for %zu of %zu weights (|u| = 1: %zu; worst %.3g)",
           ok, n, unit, worst);
    trainer_free(&F);
}

// precision.fp8 may change on resume: a checkpoint holds fp32 masters whatever precision the GEMMs
// ran in. Step 3 of the plain run (b) resumed with fp8 none and with fp8 experts: both start from the
// same state; the FP8 run's later steps differ (FP8 is on) but stay close; its final checkpoint has
// the plain run's tensors (names, shapes) with other values, and resumes in turn with fp8 none.
static void test_fp8_switch(void) {
    copy_b("f0");
    copy_b("f8");
    char d0[300], d8[300];
    snprintf(d0, sizeof d0, "%s/f0", g_dir);
    snprintf(d8, sizeof d8, "%s/f8", g_dir);
    char s3[300];
    snprintf(s3, sizeof s3, "%s/f0/step_00000003", g_dir);
    Trainer P, Q, R;
    Err e = {{0}};
    EXPECT(try_resume(s3, d0, "precision.fp8=none", &P, &e) == 0, "resume fp8 none: %s", e.msg);
    snprintf(s3, sizeof s3, "%s/f8/step_00000003", g_dir);
    EXPECT(try_resume(s3, d8, "precision.fp8=experts", &Q, &e) == 0, "resume fp8 experts: %s", e.msg);
    const char* what = "";
    EXPECT(P.step == 3 && Q.step == 3 && Q.model.fp8 == FP8_EXPERTS && P.model.fp8 == FP8_NONE,
           "both resume at step 3 (%d, %d), Q in FP8", P.step, Q.step);
    EXPECT(trainer_state_eq(&P, &Q, 1, &what), "the same state at the resume (%s differ)", what);
    EXPECT(trainer_run(&P) == EXIT_OK && trainer_run(&Q) == EXIT_OK && P.step == 6 && Q.step == 6, "both finish");
    EXPECT(!trainer_state_eq(&P, &Q, 0, &what), "FP8 steps change the masters");
    const double rel = fabs(Q.last_loss - P.last_loss) / P.last_loss;
    printf("  last loss %.6f (fp8 none) vs %.6f (experts), rel %.2g\n", P.last_loss, Q.last_loss, rel);
    EXPECT(isfinite(Q.last_loss) && rel > 0 && rel < 1e-2, "last loss %.9g (experts) vs %.9g: rel %.3g", Q.last_loss,
           P.last_loss, rel);
    trainer_free(&P);
    trainer_free(&Q);
    char a[400], b[400], msg[1100];
    snprintf(a, sizeof a, "%s/f0/step_00000006", g_dir);
    snprintf(b, sizeof b, "%s/f8/step_00000006", g_dir);
    const int d = ckpt_diff(a, b, msg, sizeof msg);
    EXPECT(d > 0 && strstr(msg, " differs"), "the FP8 run's checkpoint: the same tensors, other values (%d: %s)", d, msg);
    char dd[400];
    snprintf(dd, sizeof dd, "checkpoint.dir=%s", d8);
    const char* ex[] = {"checkpoint.resume=auto", dd, "precision.fp8=none", "train.steps=7"};
    EXPECT(tiny_trainer(&R, ex, 4, &e) == 0 && R.step == 6 && R.model.fp8 == FP8_NONE, "back to fp8 none at step 6: %s",
           e.msg);
    EXPECT(trainer_run(&R) == EXIT_OK && R.step == 7 && isfinite(R.last_loss), "and on to step 7");
    trainer_free(&R);
}

// precision.fp8_weights=per_step: the expert weights' FP8 codes made at each step's first
// micro-batch and read by the step's others (three a step here) give the per_gemm run's state bit
// for bit after six steps, and the same metrics, evaluations included (an eval after an update
// must not read the codes made before it).
static void test_fp8_weight_codes(void) {
    char la[300], lb[300];
    snprintf(la, sizeof la, "log.dir=%s/wc_a", g_dir);
    snprintf(lb, sizeof lb, "log.dir=%s/wc_b", g_dir);
    const char* ea[] = {"precision.fp8=experts", "train.global_batch=12", la};
    const char* eb[] = {"precision.fp8=experts", "train.global_batch=12", lb, "precision.fp8_weights=per_step"};
    Trainer A, B;
    Err e = {{0}};
    EXPECT(tiny_trainer(&A, ea, 3, &e) == 0, "init per_gemm: %s", e.msg);
    EXPECT(tiny_trainer(&B, eb, 4, &e) == 0, "init per_step: %s", e.msg);
    EXPECT(!A.model.wq && B.model.wq, "only per_step keeps codes");
    EXPECT(trainer_run(&A) == EXIT_OK && trainer_run(&B) == EXIT_OK && A.step == 6 && B.step == 6, "both run 6 steps");
    const char* what = "";
    EXPECT(trainer_state_eq(&A, &B, 1, &what), "per_step = per_gemm bit for bit (%s differ)", what);
    EXPECT(A.last_loss == B.last_loss, "last loss %.9g vs %.9g", B.last_loss, A.last_loss);
    trainer_free(&A);
    trainer_free(&B);
    char pa[400], pb[400], *ta[64], *tb[64];
    snprintf(pa, sizeof pa, "%s/wc_a/metrics.jsonl", g_dir);
    snprintf(pb, sizeof pb, "%s/wc_b/metrics.jsonl", g_dir);
    const int na = read_trace(pa, ta, 64), nb = read_trace(pb, tb, 64);
    int same = na == nb && na == 6, evals = 0;
    for (int i = 0; same && i < na; i++) same = !strcmp(ta[i], tb[i]), evals += strstr(ta[i], "\"val_loss\"") != NULL;
    EXPECT(same && evals == 2, "the same metrics (%d and %d lines, %d with an evaluation)", na, nb, evals);
    for (int i = 0; i < na; i++) free(ta[i]);
    for (int i = 0; i < nb; i++) free(tb[i]);
}

static void test_validate_run(void) {
    Config c;
    Err e = {{0}};
    config_defaults(&c);
    EXPECT(config_override(&c, "checkpoint.dir=/tmp/x", &e) == 0 && config_validate_run(&c, &e) == 0, "a dir is fine: %s", e.msg);
    config_defaults(&c);
    config_override(&c, "checkpoint.resume=auto", &e);
    EXPECT(config_validate_run(&c, &e) == -1 && strstr(e.msg, "needs checkpoint.dir"), "auto without dir: %s", e.msg);
    config_defaults(&c);
    config_override(&c, "checkpoint.every=10", &e);
    EXPECT(config_validate_run(&c, &e) == -1 && strstr(e.msg, "checkpoint.every=10"), "every without dir: %s", e.msg);
    config_defaults(&c);
    config_override(&c, "checkpoint.init_from=/some/hf", &e);
    EXPECT(config_validate_run(&c, &e) == 0, "init_from alone is fine: %s", e.msg);
}

int main(int argc, char** argv) {
    moetrain_path(argv[0], g_bin, sizeof g_bin);
    int world;
    dist_init(&argc, &argv, &world);
    scratch_dir(g_dir, sizeof g_dir, "test_resume");
    if (fcntl(0, F_GETFD) == -1 && open("/dev/null", O_RDONLY) != 0) return 1;  // a stdin to keep open
    RUN(test_validate_run);
    RUN(test_exact_resume);
    RUN(test_bad_checkpoints);
    RUN(test_export_init_from);
    RUN(test_keep_every);
    RUN(test_eval_cmd);
    RUN(test_weight_only);
    RUN(test_fp8_switch);
    RUN(test_fp8_weight_codes);
    scratch_done(g_dir, "test_resume", t_failed);
    dist_finalize();
    TEST_END();
}
