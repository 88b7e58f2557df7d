// test_export_golden.c — the moetrain side of the proof that `moetrain export` writes what
// Hugging Face transformers loads with the same logits (issue 5). The other side is
// scripts/hf_check.py, run where torch + transformers are installed, on the directory this test
// leaves behind:
//
//   1. A Trainer (CPU, world 1) with the model of the golden fixture
//      (tests/fixtures/golden/tiny_mixtral.golden, docs/golden.md), the fixture's weights staged
//      as its masters: the forward on the fixture's input_ids gives the fixture's logits, CE,
//      aux and total loss (the tolerances of test_golden).
//   2. trainer_save writes a checkpoint (the trainer's own path: optim_gather, ownership,
//      trainer_state.yaml); it is opened and verified, and exported as `moetrain export` does it
//      (the model config parsed back from trainer_state.yaml's config: block, then hf_export,
//      fp32) into $MOETRAIN_EXPORT_DIR (default build/hf_golden_export, relative to the current
//      directory; created; an older export there is replaced), with tokens.txt: the fixture's
//      input_ids, B lines of T integers.
//   3. The export: config.json present and parsed back to the fixture's model; exactly the
//      fixture's 41 parameter names, no optimizer state; every tensor read back with
//      hf_open/hf_read is the fixture's bit for bit.
//   4. The `moetrain export` command (BUILD/moetrain, next to this binary's directory) writes
//      the same files byte for byte.
//   5. A Trainer with checkpoint.init_from=<the export> gives the same logits bit for bit as 1.
//
// Then, on a machine with transformers:
//   python3 scripts/hf_check.py build/hf_golden_export tests/fixtures/golden/tiny_mixtral.golden
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "golden_fixture.h"
#include "config.h"
#include "hf.h"
#include "test_resume_util.h"
#include "train.h"

#define TOL_LOGITS 1e-5
#define TOL_LOSS 1e-5
#define TOL_AUX 5e-5  // the fixture's aux is (loss - ce) / 0.02 in fp32 (see test_golden.c)
#define DEFAULT_EXPORT_DIR "build/hf_golden_export"
enum { B = 2, T = 17, V = 256, NPARAM = 41 };

// A model parameter of the fixture (not input_ids, logits, the losses, grad.*, after5.*).
static int is_param(const GTensor* t) {
    return !t->i32 && (!strncmp(t->name, "model.", 6) || !strcmp(t->name, "lm_head.weight"));
}

// ---- state shared by the tests, in order -------------------------------------------------------
static char g_tmp[256];           // scratch (checkpoint, the command's export)
static char g_bin[PATH_MAX];      // BUILD/moetrain
static char g_out[PATH_MAX];      // the export directory
static char g_step[PATH_MAX];     // the saved checkpoint
static int32_t g_tok[B * T], g_tgt[B * T];
static float g_logits[B * T * V];  // moetrain's logits on the fixture's weights
static int g_have_logits, g_exported;

static int make_config(Config* c, const char* extra, Err* e) {
    char ck[400];
    snprintf(ck, sizeof ck, "checkpoint.dir=%s/ck", g_tmp);
    const char* const ov[] = {
        "train.device=cpu", "data.format=random", "train.steps=1", "train.seq_len=17", "train.micro_batch=2",
        "train.global_batch=2", "parallel.ep=1", "model.vocab_size=256", "model.hidden=32", "model.ffn=48",
        "model.layers=2", "model.heads=4", "model.kv_heads=2", "model.experts=4", "model.top_k=2", "model.max_seq=64",
        "model.rope_theta=10000", "model.rms_eps=1e-5", "model.aux_coef=0.02", "model.z_coef=0", "log.dir=",
        "checkpoint.keep=0", ck, extra};
    config_defaults(c);
    for (size_t i = 0; i < sizeof ov / sizeof ov[0]; i++)
        if (ov[i] && config_override(c, ov[i], e)) return -1;
    return config_validate(c, 1, e);
}

// The fixture's model (docs/golden.md), as test_golden.c builds it.
static int same_model(const ModelConfig* m) {
    return m->vocab_size == 256 && m->hidden == 32 && m->ffn == 48 && m->layers == 2 && m->heads == 4 && m->kv_heads == 2 &&
           m->experts == 4 && m->top_k == 2 && m->max_seq == 64 && m->rope_theta == 10000.0f && m->rms_eps == 1e-5f &&
           m->aux_coef == 0.02f && !m->tie_embeddings;
}

static StepLoss forward(Trainer* t) {
    MicroArgs a = {.tokens = g_tok, .targets = g_tgt, .backward = 0};
    return model_step(&t->model, &a);
}

static void test_forward(void) {
    Err e = {{0}};
    Config c;
    Trainer t;
    EXPECT(make_config(&c, NULL, &e) == 0, "config: %s", e.msg);
    EXPECT(same_model(&c.model), "the config is the fixture's model");
    if (trainer_init(&t, &c, &e)) {
        EXPECT(0, "trainer_init: %s", e.msg);
        trainer_free(&t);
        return;
    }
    Model* m = &t.model;
    EXPECT(m->pl.n == NPARAM && m->B == B && m->T == T && m->head_chunk == m->N, "layout: %d tensors, B %d, T %d", m->pl.n,
           m->B, m->T);
    // the fixture's weights become the masters (staged through the fp32 gradient arenas)
    for (int a = 0; a < 2; a++) m->be->zero(m->be, m->grad[a], sizeof(float) * m->padded[a]);
    int missing = 0;
    for (int i = 0; i < m->pl.n; i++) {
        const ParamInfo* p = &m->pl.p[i];
        const float* w = getf(p->name, p->numel);
        if (!w) {
            EXPECT(0, "fixture lacks %s [%zu]", p->name, p->numel);
            missing++;
            continue;
        }
        m->be->to_device(m->be, m->grad[p->arena] + p->offset, w, sizeof(float) * p->numel);
    }
    optim_load_from_staging(&t.opt, m);
    if (!missing) {
        StepLoss l = forward(&t);
        const float* ref = getf("logits", (size_t)B * T * V);
        EXPECT(ref != NULL, "logits in the fixture");
        memcpy(g_logits, m->s_logits, sizeof g_logits);  // the CPU backend: host memory
        g_have_logits = 1;
        if (ref) {
            double err = rel_l2(g_logits, ref, (size_t)B * T * V);
            EXPECT(err < TOL_LOGITS, "logits rel L2 %.3g", err);
            printf("     logits rel L2 %.3g vs the fixture (HF)\n", err);
        }
        const double ce = l.ce_sum / (B * (T - 1)), loss = ce + c.model.aux_coef * l.aux;
        const double ce_ref = getf("ce_loss", 1)[0], aux_ref = getf("aux_loss", 1)[0], loss_ref = getf("loss", 1)[0];
        EXPECT(l.ntok == B * (T - 1), "%lld counted targets", (long long)l.ntok);
        EXPECT(fabs(ce - ce_ref) < TOL_LOSS * ce_ref, "CE %.7f vs HF %.7f", ce, ce_ref);
        EXPECT(fabs(l.aux - aux_ref) < TOL_AUX * aux_ref, "aux %.7f vs HF %.7f", l.aux, aux_ref);
        EXPECT(fabs(loss - loss_ref) < TOL_LOSS * loss_ref, "loss %.7f vs HF %.7f", loss, loss_ref);
        printf("     ce %.7f (HF %.7f), aux %.7f (HF %.7f), loss %.7f (HF %.7f)\n", ce, ce_ref, l.aux, aux_ref, loss,
               loss_ref);
    }
    // 2. the trainer's checkpoint (step 0: the fixture's weights, zero Adam moments)
    if (!missing) {
        EXPECT(trainer_save(&t, &e) == 0, "trainer_save: %s", e.msg);
        snprintf(g_step, sizeof g_step, "%s/ck/step_00000000", g_tmp);
    }
    trainer_free(&t);
}

static void rm_file(const char* dir, const char* name) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (unlink(p) && errno != ENOENT) EXPECT(0, "cannot remove %s: %s", p, strerror(errno));
}

// What `moetrain export --ckpt STEP --out DIR --dtype fp32` does (cmd/ckpt_cmds.c).
static int export_like_cli(const char* step, const char* out, ModelConfig* model, Err* e) {
    Ckpt* ck = NULL;
    if (ckpt_open(&ck, step, e)) return -1;
    EXPECT(ckpt_num_tensors(ck) == 3 * NPARAM, "%d tensors in the checkpoint (masters, exp_avg, exp_avg_sq)",
           ckpt_num_tensors(ck));
    const char* text = ckpt_trainer_state(ck);
    size_t cn = strlen(text) + 1;
    char* cfg_text = xmalloc(cn);
    TrainerState ts;
    Config* c = xcalloc(1, sizeof *c);
    config_defaults(c);
    int rc = trainer_state_parse(text, &ts, cfg_text, cn, e);
    if (!rc && !cfg_text[0]) rc = err_set(e, "%s/trainer_state.yaml has no config: block", step);
    if (!rc) rc = config_load_string(c, cfg_text, strlen(cfg_text), "trainer_state.yaml (config:)", e);
    if (!rc) rc = hf_export(ck, &c->model, out, DTYPE_F32, e);
    if (!rc) *model = c->model;
    free(c);
    free(cfg_text);
    ckpt_close(ck);
    return rc;
}

static void test_export(void) {
    if (!g_step[0]) {
        EXPECT(0, "no checkpoint (test_forward failed)");
        return;
    }
    Err e = {{0}};
    const char* env = getenv("MOETRAIN_EXPORT_DIR");
    snprintf(g_out, sizeof g_out, "%s", env && env[0] ? env : DEFAULT_EXPORT_DIR);
    // an older export must not pass for this one (hf_export removes old shards and the index)
    rm_file(g_out, "config.json");
    rm_file(g_out, "tokens.txt");
    ModelConfig mc;
    if (export_like_cli(g_step, g_out, &mc, &e)) {
        EXPECT(0, "export of %s to %s: %s", g_step, g_out, e.msg);
        return;
    }
    EXPECT(same_model(&mc), "trainer_state.yaml's config: block holds the fixture's model");
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/tokens.txt", g_out);
    FILE* f = fopen(p, "w");
    EXPECT(f != NULL, "cannot write %s: %s", p, strerror(errno));
    if (!f) return;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) fprintf(f, "%d%c", g_tok[b * T + t], t + 1 < T ? ' ' : '\n');
    EXPECT(fclose(f) == 0, "writing %s", p);
    g_exported = 1;
    printf("     exported %s to %s (fp32) with tokens.txt\n", g_step, g_out);
}

static void test_export_bits(void) {
    if (!g_exported) {
        EXPECT(0, "no export");
        return;
    }
    Err e = {{0}};
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/config.json", g_out);
    EXPECT(access(p, R_OK) == 0, "%s exists", p);
    ModelConfig back;
    memset(&back, 0, sizeof back);
    EXPECT(hf_read_config(g_out, &back, &e) == 0, "hf_read_config: %s", e.msg);
    EXPECT(same_model(&back), "config.json describes the fixture's model (V %d H %d F %d theta %g eps %g)", back.vocab_size,
           back.hidden, back.ffn, back.rope_theta, back.rms_eps);
    HfDir* h = NULL;
    if (hf_open(&h, g_out, &e)) {
        EXPECT(0, "hf_open %s: %s", g_out, e.msg);
        return;
    }
    int nfix = 0;
    for (int i = 0; i < g_n; i++) nfix += is_param(&g_t[i]);
    EXPECT(nfix == NPARAM && hf_num_tensors(h) == NPARAM, "%d tensors exported, %d parameters in the fixture, want %d",
           hf_num_tensors(h), nfix, NPARAM);
    // every exported name is a fixture parameter and vice versa, every value bit for bit
    int differ = 0, checked = 0;
    for (int i = 0; i < hf_num_tensors(h); i++) {
        const char* n = hf_tensor_name(h, i);
        const GTensor* g = get(n);
        EXPECT(g && is_param(g), "exported %s is not a parameter of the fixture", n);
        EXPECT(strncmp(n, "optim.", 6) != 0, "optimizer state exported: %s", n);
    }
    for (int i = 0; i < g_n; i++) {
        const GTensor* g = &g_t[i];
        if (!is_param(g)) continue;
        if (!hf_has(h, g->name)) {
            EXPECT(0, "%s missing from the export", g->name);
            continue;
        }
        float* y = xmalloc(sizeof(float) * g->numel);
        if (hf_read(h, g->name, y, g->ndim, g->shape, &e)) {
            EXPECT(0, "hf_read: %s", e.msg);
        } else {
            size_t bad = 0;
            for (size_t k = 0; k < g->numel; k++) bad += memcmp(&y[k], g_data + g->off + 4 * k, 4) != 0;
            EXPECT(bad == 0, "%s: %zu of %zu values differ from the fixture", g->name, bad, g->numel);
            differ += bad != 0;
            checked++;
        }
        free(y);
    }
    hf_close(h);
    printf("     %d tensors read back, %d differ from the fixture's bits\n", checked, differ);
}

static int cmp_files(const char* a, const char* b) { return sh("cmp -s '%s' '%s'", a, b); }

static void test_cli_export(void) {
    if (!g_exported) {
        EXPECT(0, "no export");
        return;
    }
    if (access(g_bin, X_OK)) {
        EXPECT(0, "%s is not built (make builds it before the tests)", g_bin);
        return;
    }
    char out[400];
    snprintf(out, sizeof out, "%s/cli_export", g_tmp);
    int rc = sh("'%s' export --ckpt '%s/ck' --out '%s' --dtype fp32 > '%s/cli_export.log' 2>&1", g_bin, g_tmp, out, g_tmp);
    EXPECT(rc == 0, "moetrain export exited %d (log in %s/cli_export.log)", rc, g_tmp);
    if (rc) return;
    const char* files[] = {"config.json", "model.safetensors.index.json", "model-00001-of-00001.safetensors"};
    for (int i = 0; i < 3; i++) {
        char a[PATH_MAX + 64], b[500];
        snprintf(a, sizeof a, "%s/%s", g_out, files[i]);
        snprintf(b, sizeof b, "%s/%s", out, files[i]);
        EXPECT(cmp_files(a, b) == 0, "moetrain export's %s differs from hf_export's (or is missing)", files[i]);
    }
}

static void test_reload_forward(void) {
    if (!g_exported || !g_have_logits) {
        EXPECT(0, "no export");
        return;
    }
    char arg[PATH_MAX + 32];
    snprintf(arg, sizeof arg, "checkpoint.init_from=%s", g_out);
    Err e = {{0}};
    Config c;
    Trainer t;
    EXPECT(make_config(&c, arg, &e) == 0, "config: %s", e.msg);
    c.checkpoint.dir[0] = 0;  // a fresh run that saves nothing (the directory holds the first run's checkpoint)
    if (trainer_init(&t, &c, &e)) {
        EXPECT(0, "trainer_init with %s: %s", arg, e.msg);
        trainer_free(&t);
        return;
    }
    forward(&t);
    EXPECT(memcmp(t.model.s_logits, g_logits, sizeof g_logits) == 0,
           "logits from init_from=<export> differ from those of the fixture's weights");
    trainer_free(&t);
}

int main(int argc, char** argv) {
    moetrain_path(argv[0], g_bin, sizeof g_bin);
    int world;
    dist_init(&argc, &argv, &world);
    if (load_fixture()) {
        printf("cannot read %s (run from the repository root)\n0 passed, 1 failed\n", FIXTURE);
        return 1;
    }
    const int32_t* ids = get("input_ids") && get("input_ids")->numel == B * T ? (const int32_t*)(g_data + get("input_ids")->off) : NULL;
    if (!ids) {
        printf("%s: no input_ids [%d, %d]\n0 passed, 1 failed\n", FIXTURE, B, T);
        return 1;
    }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            g_tok[b * T + t] = ids[b * T + t];
            g_tgt[b * T + t] = t + 1 < T ? ids[b * T + t + 1] : -1;
        }
    scratch_dir(g_tmp, sizeof g_tmp, "test_export_golden");
    RUN(test_forward);
    RUN(test_export);
    RUN(test_export_bits);
    RUN(test_cli_export);
    RUN(test_reload_forward);
    scratch_done(g_tmp, "test_export_golden", t_failed);
    if (g_exported)
        printf("     for transformers: python3 scripts/hf_check.py %s %s\n", g_out, FIXTURE);
    dist_finalize();
    TEST_END();
}
