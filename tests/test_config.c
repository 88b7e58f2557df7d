// test_config.c — config loading, overrides, validation errors (message and exit code), plan.
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "params.h"
#include "test.h"

static char g_dir[256];

static const char* write_file(const char* name, const char* text) {
    static char path[8][512];
    static int k = 0;
    char* p = path[k++ % 8];
    snprintf(p, 512, "%s/%s", g_dir, name);
    FILE* f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    return p;
}

// Loads text as a config file; returns the status and leaves the message in e.
static int load_text(Config* c, const char* text, Err* e) {
    config_defaults(c);
    return config_load_file(c, write_file("t.yaml", text), e);
}

static void test_defaults_and_shipped(void) {
    Config c;
    Err e = {{0}};
    config_defaults(&c);
    EXPECT(c.optim.beta2 > 0.949f && c.optim.beta2 < 0.951f, "beta2 default %g", c.optim.beta2);
    EXPECT(c.parallel.ep == 1 && c.parallel.zero1 == 1, "parallel defaults");
    EXPECT(strcmp(c.checkpoint.resume, "none") == 0, "resume default '%s'", c.checkpoint.resume);
    char p[512];
    EXPECT(config_find("L0_sanity", p, sizeof p, &e) == 0, "find L0_sanity: %s", e.msg);
    config_defaults(&c);
    EXPECT(config_load_file(&c, p, &e) == 0, "load L0_sanity: %s", e.msg);
    EXPECT(c.parallel.ep == 2 && c.model.experts == 4 && c.model.top_k == 2, "L0_sanity layout");
    EXPECT(config_validate(&c, 2, &e) == 0, "L0_sanity valid at world 2: %s", e.msg);
    EXPECT(config_find("L1_8x7B_ep", p, sizeof p, &e) == 0, "find L1: %s", e.msg);
    config_defaults(&c);
    EXPECT(config_load_file(&c, p, &e) == 0, "load L1: %s", e.msg);
    EXPECT(c.model.hidden == 4096 && c.model.ffn == 14336 && c.model.layers == 32 && c.model.heads == 32 &&
               c.model.kv_heads == 8 && c.model.experts == 8 && c.model.vocab_size == 32000 &&
               c.train.seq_len == 4096 && c.parallel.ep == 8 && c.precision.dtype == DTYPE_BF16,
           "L1 is Mixtral-8x7B");
    EXPECT(config_validate(&c, 8, &e) == 0, "L1 valid at world 8: %s", e.msg);
    EXPECT(config_validate_run(&c, &e) != 0 && strstr(e.msg, "checkpoint.dir="), "L1 needs checkpoint.dir: %s", e.msg);
    EXPECT(config_override(&c, "checkpoint.dir=/tmp/x", &e) == 0, "override dir");
    config_validate_run(&c, &e);
    EXPECT(!strstr(e.msg, "needs a checkpoint directory"), "with dir the requirement is met: %s", e.msg);
    ParamCounts pc = params_count(&c.model);
    EXPECT(pc.total == 46702792704LL, "Mixtral-8x7B has 46,702,792,704 parameters, got %lld", (long long)pc.total);
    EXPECT(config_find("bench_8x7B_L2", p, sizeof p, &e) == 0, "find bench");
    config_defaults(&c);
    EXPECT(config_load_file(&c, p, &e) == 0, "load bench (defaults: chain): %s", e.msg);
    EXPECT(c.model.layers == 2 && c.model.hidden == 4096 && c.parallel.ep == 1 && c.data.format == DATA_RANDOM,
           "bench inherits L1 and overrides");
}

static void test_overrides_and_defaults_chain(void) {
    Config c;
    Err e = {{0}};
    write_file("base.yaml", "train:\n  steps: 7\n  seq_len: 64\nmodel:\n  hidden: 32\n");
    EXPECT(load_text(&c, "defaults: base\ntrain:\n  steps: 9\n", &e) == 0, "chain: %s", e.msg);
    EXPECT(c.train.steps == 9 && c.train.seq_len == 64 && c.model.hidden == 32, "file overrides its defaults");
    EXPECT(config_override(&c, "train.steps=11", &e) == 0 && c.train.steps == 11, "override wins");
    EXPECT(config_override(&c, "optim.schedule=wsd", &e) == 0 && c.optim.schedule == SCHED_WSD, "enum override");
    write_file("cyc.yaml", "defaults: cyc\n");
    EXPECT(load_text(&c, "defaults: cyc\n", &e) != 0 && strstr(e.msg, "cycle"), "cycle detected: %s", e.msg);
}

static void test_print_roundtrip(void) {
    Config a, b;
    Err e = {{0}};
    config_defaults(&a);
    config_override(&a, "train.steps=42", &e);
    config_override(&a, "data.path=/some/where \"quoted\".fa", &e);
    config_override(&a, "optim.lr=1.25e-4", &e);
    config_override(&a, "train.device=cpu", &e);
    FILE* f = fopen(write_file("rt.yaml", ""), "w");
    config_print(&a, f);
    fclose(f);
    config_defaults(&b);
    char p[512];
    snprintf(p, sizeof p, "%s/rt.yaml", g_dir);
    EXPECT(config_load_file(&b, p, &e) == 0, "reload printed config: %s", e.msg);
    memset(a.source, 0, sizeof a.source);
    memset(b.source, 0, sizeof b.source);
    EXPECT(memcmp(&a, &b, sizeof a) == 0, "print → load is the identity");
}

typedef struct BadCase {
    const char* yaml;       // file text (NULL: use override)
    const char* override;   // section.key=value
    int world;              // > 0: also validate at this world size
    const char* expect;     // substring of the message
} BadCase;

static void test_errors(void) {
    const BadCase cases[] = {
        {"train:\n  steps: \"open\n", NULL, 0, "t.yaml:"},                     // YAML syntax, file:line:col
        {"train:\n  steps: \"open\n", NULL, 0, "YAML syntax error"},
        {"train:\n  steps: [1, 2]\n", NULL, 0, "expected a single value"},
        {"train:\n  seq_lne: 5\n", NULL, 0, "did you mean train.seq_len"},     // unknown key
        {"trian:\n  steps: 5\n", NULL, 0, "unknown section 'trian'"},          // unknown section
        {"train:\n  steps: ten\n", NULL, 0, "expected an integer, got 'ten'"}, // wrong type
        {"optim:\n  lr: fast\n", NULL, 0, "expected a number"},
        {"parallel:\n  zero1: maybe\n", NULL, 0, "expected true or false"},
        {"train:\n  steps: -3\n", NULL, 0, "out of range"},                    // range
        {"precision:\n  dtype: fp16\n", NULL, 0, "not one of fp32|bf16"},      // enum
        {"train: 5\n", NULL, 0, "must be a mapping"},
        {"- a\n- b\n", NULL, 0, "mapping of sections"},
        {"defaults: no_such_config_xyz\n", NULL, 0, "no_such_config_xyz not found"},
        {NULL, "train.stepz=4", 0, "did you mean train.steps"},
        {NULL, "train.steps", 0, "not section.key=value"},
        {NULL, "parallel.ep=2", 3, "world size (3 ranks) must be a multiple of parallel.ep (2)"},
        {NULL, "parallel.ep=8", 8, "parallel.ep (8) must divide model.experts (4)"},
        {NULL, "model.kv_heads=3", 1, "model.heads (4) must be a multiple of model.kv_heads (3)"},
        {NULL, "model.heads=5", 1, "model.hidden (64) must be a multiple of model.heads (5)"},
        {NULL, "model.top_k=5", 1, "model.top_k (5) cannot exceed model.experts (4)"},
        {NULL, "train.global_batch=20", 2, "train.global_batch (20) must be a multiple of train.micro_batch"},
        {NULL, "model.tie_embeddings=true", 1, "tie_embeddings must be false"},
        {NULL, "train.seq_len=99999", 1, "exceeds model.max_seq"},
        {NULL, "data.sep_token=300", 1, "data.sep_token (300) must be below model.vocab_size"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const BadCase* b = &cases[i];
        Config c;
        Err e = {{0}};
        int rc;
        if (b->yaml) {
            rc = load_text(&c, b->yaml, &e);
        } else {
            config_defaults(&c);
            rc = config_override(&c, b->override, &e);
            if (!rc && b->world) rc = config_validate(&c, b->world, &e);
        }
        EXPECT(rc != 0, "case %zu should fail", i);
        EXPECT(strstr(e.msg, b->expect) != NULL, "case %zu: message '%s' lacks '%s'", i, e.msg, b->expect);
    }
    // line and column of a bad value
    Config c;
    Err e = {{0}};
    load_text(&c, "model:\n  hidden: 64\ntrain:\n  steps: x\n", &e);
    EXPECT(strstr(e.msg, "t.yaml:4:10") != NULL, "position of the bad value: %s", e.msg);
    config_defaults(&c);
    EXPECT(config_load_file(&c, "/nonexistent/dir/x.yaml", &e) != 0 && strstr(e.msg, "cannot open config"),
           "missing file: %s", e.msg);
}

// The binary: exit code 2 and the message on bad input, on every rank.
static int run_cmd(const char* cmd, char* out, size_t n) {
    FILE* p = popen(cmd, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_binary(void) {
    if (access("build/moetrain", X_OK) != 0) {
        EXPECT(0, "build/moetrain missing (make builds it before the tests)");
        return;
    }
    char out[16384];
    int rc = run_cmd("build/moetrain --config L0_sanity train.stepz=3 2>&1", out, sizeof out);
    EXPECT(rc == 2 && strstr(out, "did you mean train.steps"), "bad key: rc %d, %s", rc, out);
    rc = run_cmd("build/moetrain --config no_such_cfg 2>&1", out, sizeof out);
    EXPECT(rc == 2 && strstr(out, "no_such_cfg not found"), "missing config: rc %d, %s", rc, out);
    rc = run_cmd("build/moetrain --config L1_8x7B_ep parallel.ep=1 2>&1", out, sizeof out);
    EXPECT(rc == 2 && strstr(out, "checkpoint.dir="), "L1 without checkpoint.dir: rc %d, %s", rc, out);
    rc = run_cmd("build/moetrain plan --config L1_8x7B_ep 2>&1", out, sizeof out);
    EXPECT(rc == 0 && strstr(out, "46,702,792,704 total"), "plan L1: rc %d, %s", rc, out);
    EXPECT(strstr(out, "world 8 = ep 8 x edp 1") && strstr(out, "fits a"), "plan L1 per-rank table fits: %s", out);
    EXPECT(!strstr(out, "WARNING"), "plan L1 fits 141 GB");
    rc = run_cmd("build/moetrain plan --config L1_8x7B_ep parallel.ep=1 --world 1 2>&1", out, sizeof out);
    EXPECT(rc == 0 && strstr(out, "WARNING"), "plan warns when it does not fit: %s", out);
    rc = run_cmd("build/moetrain --version 2>&1", out, sizeof out);
    EXPECT(rc == 0 && strstr(out, "moetrain "), "--version");
    rc = run_cmd("scripts/mpirun.sh -np 2 build/moetrain --config L0_sanity parallel.ep=3 2>&1", out, sizeof out);
    EXPECT(rc == 2 && strstr(out, "parallel.ep (3) must divide model.experts (4)"), "2 ranks, bad layout: rc %d, %s", rc, out);
}

static void test_keys_doc(void) {
    // README.md's key table is generated by `moetrain --keys`: it must be current.
    char out[65536];
    FILE* p = popen("build/moetrain --keys", "r");
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    if (p) pclose(p);
    out[n] = 0;
    FILE* f = fopen("README.md", "r");
    static char readme[1 << 20];
    size_t m = f ? fread(readme, 1, sizeof readme - 1, f) : 0;
    if (f) fclose(f);
    readme[m] = 0;
    EXPECT(n > 100 && strstr(readme, out) != NULL, "README.md's key table is stale: paste `build/moetrain --keys`");
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/moetrain_test_config_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
    if (system(cmd)) return 1;
    RUN(test_defaults_and_shipped);
    RUN(test_overrides_and_defaults_chain);
    RUN(test_print_roundtrip);
    RUN(test_errors);
    RUN(test_binary);
    RUN(test_keys_doc);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) {}
    TEST_END();
}
