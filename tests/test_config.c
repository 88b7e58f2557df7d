// test_config.c — the config system: defaults, shipped configs, defaults: chains, precedence,
// print → load round trip, every error class (message and return code), lookup, the command
// line (src/cli.c), the binary's exit code 2, and docs/config.md being current.
//
//   build/tests/test_config               run the tests (from anywhere: it goes to the repo root)
//   build/tests/test_config --write-docs  regenerate the key table in docs/config.md
#define _DEFAULT_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "params.h"
#include "test.h"
#include "test_resume_util.h"

static char g_dir[256];
static char g_bin[4096];  // BUILD/moetrain of this test binary's BUILD (moetrain_path)

static const char* write_file(const char* name, const char* text) {
    static char path[8][512];
    static int k = 0;
    char* p = path[k++ % 8];
    snprintf(p, 512, "%s/%s", g_dir, name);
    FILE* f = fopen(p, "w");
    if (!f) return p;
    fputs(text, f);
    fclose(f);
    return p;
}

// Loads text as the file t.yaml on top of the defaults; returns the status, message in e.
static int load_text(Config* c, const char* text, Err* e) {
    config_defaults(c);
    return config_load_file(c, write_file("t.yaml", text), e);
}

static void test_defaults(void) {
    Config c;
    Err e = {{0}};
    config_defaults(&c);
    const OptimConfig* o = &c.optim;
    EXPECT(o->lr == 3e-4f && o->min_lr_ratio == 0.1f && o->warmup == 100 && o->beta1 == 0.9f && o->beta2 == 0.95f &&
               o->eps == 1e-8f && o->weight_decay == 0.1f && o->clip == 1.0f && o->schedule == SCHED_COSINE,
           "optim defaults");
    const ModelConfig* m = &c.model;
    EXPECT(m->rope_theta == 1e6f && m->rms_eps == 1e-5f && m->init_std == 0.02f && m->aux_coef == 0.02f &&
               m->z_coef == 0 && m->tie_embeddings == 0 && m->vocab_size == 256,
           "model defaults");
    EXPECT(c.data.sep_token == 10 && c.data.val_frac == 0.05f && c.data.shuffle == 1 && c.data.path[0] == 0 &&
               c.data.format == DATA_AUTO,
           "data defaults");
    EXPECT(!strcmp(c.checkpoint.resume, "none") && c.checkpoint.keep == 3 && c.checkpoint.dir[0] == 0 &&
               c.checkpoint.required == 0,
           "checkpoint defaults");
    EXPECT(c.log.every == 1 && c.train.seed == 1234 && c.train.max_bad_steps == 5 && c.train.eval_every == 0 &&
               c.train.eval_batches == 4 && c.train.device == DEVICE_AUTO,
           "train/log defaults");
    EXPECT(c.parallel.ep == 1 && c.parallel.zero1 == 1, "parallel defaults");
    EXPECT(config_validate(&c, 1, &e) == 0, "defaults are valid on 1 rank: %s", e.msg);
    EXPECT(config_validate(&c, 2, &e) == 0, "defaults are valid on 2 ranks: %s", e.msg);
    EXPECT(!strcmp(dtype_name(DTYPE_BF16), "bf16") && !strcmp(device_name(DEVICE_CUDA), "cuda") &&
               !strcmp(schedule_name(SCHED_WSD), "wsd") && !strcmp(data_format_name(DATA_RANDOM), "random"),
           "enum names");
}

static void test_shipped(void) {
    Config c;
    Err e = {{0}};
    char p[512];
    EXPECT(config_find("L0_sanity", p, sizeof p, &e) == 0, "find L0_sanity: %s", e.msg);
    config_defaults(&c);
    EXPECT(config_load_file(&c, p, &e) == 0, "load L0_sanity: %s", e.msg);
    EXPECT(c.model.vocab_size == 256 && c.model.hidden == 64 && c.model.ffn == 128 && c.model.layers == 2 &&
               c.model.heads == 4 && c.model.kv_heads == 2 && c.model.experts == 4 && c.model.top_k == 2 &&
               c.parallel.ep == 2 && c.train.seq_len == 128 && c.train.micro_batch == 8 && c.train.global_batch == 16,
           "L0_sanity is the tiny Mixtral at EP=2");
    EXPECT(strstr(c.source, "L0_sanity.yaml") != NULL, "source names the file: %s", c.source);
    EXPECT(config_validate(&c, 2, &e) == 0 && config_validate_run(&c, &e) == 0, "L0_sanity valid at world 2: %s", e.msg);

    EXPECT(config_find("L1_8x7B_ep", p, sizeof p, &e) == 0, "find L1: %s", e.msg);
    config_defaults(&c);
    EXPECT(config_load_file(&c, p, &e) == 0, "load L1: %s", e.msg);
    const ModelConfig* m = &c.model;
    EXPECT(m->hidden == 4096 && m->ffn == 14336 && m->layers == 32 && m->heads == 32 && m->kv_heads == 8 &&
               m->experts == 8 && m->top_k == 2 && m->vocab_size == 32000 && m->max_seq == 32768 &&
               m->rope_theta == 1e6f && m->rms_eps == 1e-5f && !m->tie_embeddings,
           "L1 is Mixtral-8x7B");
    EXPECT(c.train.seq_len == 4096 && c.parallel.ep == 8 && c.precision.dtype == DTYPE_BF16 &&
               c.train.device == DEVICE_CUDA && c.checkpoint.every == 100 && c.checkpoint.required,
           "L1 training layout");
    EXPECT(params_count(m).total == 46702792704LL, "Mixtral-8x7B has 46,702,792,704 parameters");
    EXPECT(config_validate(&c, 8, &e) == 0, "L1 valid at world 8: %s", e.msg);
    EXPECT(c.precision.expert_grad == EGRAD_AUTO && !config_expert_grad_bf16(&c, 8),
           "L1 accumulates 8 micro-batches: auto keeps fp32 expert gradients");
    c.precision.expert_grad = EGRAD_BF16;
    EXPECT(config_validate(&c, 8, &e) == -1 && strstr(e.msg, "precision.expert_grad=bf16") &&
               strstr(e.msg, "accumulates"),
           "bf16 expert gradients refused with accumulation: %s", e.msg);
    c.precision.expert_grad = EGRAD_AUTO;
    EXPECT(config_override(&c, "precision.fp8_weights=per_step", &e) == 0 && config_validate(&c, 8, &e) == -1 &&
               strstr(e.msg, "precision.fp8_weights=per_step") && strstr(e.msg, "precision.fp8 is none"),
           "kept FP8 weight codes without FP8 refused: %s", e.msg);
    EXPECT(config_override(&c, "precision.fp8=experts", &e) == 0 && config_validate(&c, 8, &e) == 0,
           "and taken with precision.fp8=experts: %s", e.msg);
    EXPECT(config_fp8_wcodes(&c, 8), "per_step keeps the codes");
    c.precision.fp8_weights = FP8W_AUTO;
    EXPECT(!config_fp8_wcodes(&c, 8), "auto with fp32 expert gradients (accumulation): per_gemm");
    c.precision.fp8 = FP8_NONE, c.precision.fp8_weights = FP8W_AUTO;
    EXPECT(!config_fp8_wcodes(&c, 8), "auto without FP8: none");
    EXPECT(config_validate_run(&c, &e) == -1 && strstr(e.msg, "checkpoint.dir=/path"), "L1 needs checkpoint.dir: %s",
           e.msg);
    EXPECT(config_override(&c, "checkpoint.dir=/tmp/x", &e) == 0, "override dir");
    e.msg[0] = 0;
    config_validate_run(&c, &e);
    EXPECT(!strstr(e.msg, "needs a checkpoint directory"), "with a dir the requirement is met: %s", e.msg);

    EXPECT(config_find("bench_8x7B_L2", p, sizeof p, &e) == 0, "find bench");
    config_defaults(&c);
    EXPECT(config_load_file(&c, p, &e) == 0, "load bench (defaults: chain): %s", e.msg);
    EXPECT(c.model.layers == 2 && c.model.hidden == 4096 && c.parallel.ep == 1 && c.train.micro_batch == 4 &&
               c.train.global_batch == 4 && c.train.steps == 12 && c.data.format == DATA_RANDOM &&
               !c.checkpoint.required && c.log.every == 1,
           "bench inherits L1 and overrides it");
    EXPECT(config_validate(&c, 1, &e) == 0 && config_validate_run(&c, &e) == 0, "bench valid on 1 GPU: %s", e.msg);
    EXPECT(config_expert_grad_bf16(&c, 1), "bench on 1 GPU: auto gives bf16 expert gradients");
    EXPECT(c.precision.fp8_weights == FP8W_AUTO && !config_fp8_wcodes(&c, 1), "bench without FP8: no codes kept");
    c.precision.fp8 = FP8_EXPERTS;
    EXPECT(config_fp8_wcodes(&c, 1), "bench with FP8 on 1 GPU: auto keeps the codes (bf16 expert gradients)");
    c.precision.fp8_weights = FP8W_PER_GEMM;
    EXPECT(!config_fp8_wcodes(&c, 1), "per_gemm keeps none");
    c.precision.fp8 = FP8_NONE, c.precision.fp8_weights = FP8W_AUTO;
    c.train.global_batch = 8;  // one micro-batch per rank on 2 ranks
    EXPECT(!config_expert_grad_bf16(&c, 2) && config_validate(&c, 2, &e) == 0,
           "bench on 2 GPUs at ep 1 (expert replicas): auto keeps fp32: %s", e.msg);
    c.precision.expert_grad = EGRAD_BF16;
    EXPECT(config_validate(&c, 2, &e) == -1 && strstr(e.msg, "replicas"), "bf16 refused with replicas: %s", e.msg);
    c.train.global_batch = 4;
    EXPECT(config_validate(&c, 1, &e) == 0 && config_expert_grad_bf16(&c, 1), "bf16 on 1 GPU: %s", e.msg);
    c.precision.dtype = DTYPE_F32;
    EXPECT(config_validate(&c, 1, &e) == -1 && strstr(e.msg, "precision.dtype"), "bf16 refused in fp32: %s", e.msg);
    c.precision.expert_grad = EGRAD_FP32;
    c.precision.dtype = DTYPE_BF16;
    EXPECT(config_validate(&c, 1, &e) == 0 && !config_expert_grad_bf16(&c, 1), "fp32 is always allowed: %s", e.msg);
}

static void test_chains_and_precedence(void) {
    Config c;
    Err e = {{0}};
    char sub[600];
    snprintf(sub, sizeof sub, "%s/sub", g_dir);
    mkdir(sub, 0755);
    write_file("sub/base.yaml", "train:\n  steps: 7\n  seq_len: 64\nmodel:\n  hidden: 32\n");
    write_file("sub/mid.yaml", "defaults: base\ntrain:\n  steps: 8\noptim:\n  lr: 1e-3\n");
    write_file("sub/other.yaml", "optim:\n  lr: 2e-3\n  warmup: 5\n");
    // relative to the including file's directory, whatever the current directory is
    config_defaults(&c);
    EXPECT(config_load_file(&c, write_file("sub/top.yaml", "defaults: [mid, other.yaml]\ntrain:\n  steps: 9\n"), &e) == 0,
           "chain: %s", e.msg);
    EXPECT(c.train.steps == 9 && c.train.seq_len == 64 && c.model.hidden == 32, "the file overrides its defaults");
    EXPECT(c.optim.lr == 2e-3f && c.optim.warmup == 5, "later defaults override earlier ones");
    EXPECT(strstr(c.source, "top.yaml") != NULL, "source is the outermost file: %s", c.source);
    // defaults: anywhere in the file still loads first
    EXPECT(load_text(&c, "train:\n  steps: 3\ndefaults: sub/base\n", &e) == 0 && c.train.steps == 3 &&
               c.train.seq_len == 64, "defaults after the sections: %s", e.msg);
    // a shipped config as defaults, from a file outside configs/
    EXPECT(load_text(&c, "defaults: L0_sanity\ntrain:\n  steps: 5\n", &e) == 0 && c.parallel.ep == 2 &&
               c.train.steps == 5, "defaults: a shipped config: %s", e.msg);
    // overrides win, in argv order; --config may come after them; unknown flags are skipped
    char* argv[] = {"x", "train.steps=11", "--world", "3", "--config", (char*)write_file("sub/p.yaml", "defaults: mid\n"),
                    "optim.schedule=wsd", "train.steps=12", "--dry", "--", "rest"};
    int argc = (int)(sizeof argv / sizeof argv[0]), argi = 1;
    EXPECT(cli_load_config(&c, argc, argv, &argi, &e) == 0, "cli_load_config: %s", e.msg);
    EXPECT(c.train.steps == 12 && c.optim.schedule == SCHED_WSD && c.optim.lr == 1e-3f && c.model.hidden == 32,
           "defaults < file < overrides in order (steps %d)", c.train.steps);
    EXPECT(argi == 10 && !strcmp(argv[argi], "rest"), "stops after --: argi %d", argi);
    int world = 1;
    double gpu = 0;
    EXPECT(cli_flag_int(argc, argv, 1, "--world", 1, 1 << 20, &world, &e) == 0 && world == 3, "--world 3: %s", e.msg);
    EXPECT(cli_flag_double(argc, argv, 1, "--gpu-mem", 1, 1e6, &gpu, &e) == 0 && gpu == 0, "absent flag unchanged");
    const char* known[] = {"--world", "--dry", NULL};
    EXPECT(cli_check_flags(argc, argv, 1, known, &e) == 0, "known flags pass: %s", e.msg);
    const char* few[] = {"--world", NULL};
    EXPECT(cli_check_flags(argc, argv, 1, few, &e) == -1 && strstr(e.msg, "unknown option '--dry'"), "unknown flag: %s",
           e.msg);
    char* bad[] = {"x", "--config", "L0_sanity", "--wrld=4"};
    EXPECT(cli_check_flags(4, bad, 1, known, &e) == -1 && strstr(e.msg, "did you mean --world?"), "flag typo: %s", e.msg);
    EXPECT(cli_flag_int(4, bad, 1, "--wrld", 1, 100, &world, &e) == 0 && world == 4, "--flag=value form");
    char* badv[] = {"x", "--world", "many"};
    EXPECT(cli_flag_int(3, badv, 1, "--world", 1, 100, &world, &e) == -1 && strstr(e.msg, "--world: expected an integer"),
           "bad flag value: %s", e.msg);
    char* nocfg[] = {"x", "train.steps=3"};
    argi = 1;
    EXPECT(cli_load_config(&c, 2, nocfg, &argi, &e) == -1 && strstr(e.msg, "--config NAME"), "no --config: %s", e.msg);
    char* stray[] = {"x", "--config", "L0_sanity", "oops"};
    argi = 1;
    EXPECT(cli_load_config(&c, 4, stray, &argi, &e) == -1 && strstr(e.msg, "unexpected argument 'oops'"), "stray: %s",
           e.msg);
    char* badkv[] = {"x", "--config", "L0_sanity", "train.stepz=3"};
    argi = 1;
    EXPECT(cli_load_config(&c, 4, badkv, &argi, &e) == -1 && strstr(e.msg, "command line: unknown key 'train.stepz'"),
           "override error names the command line: %s", e.msg);
    // include cycles, with the chain in the message
    write_file("sub/cyc_a.yaml", "defaults: cyc_b\n");
    write_file("sub/cyc_b.yaml", "defaults: cyc_a\n");
    config_defaults(&c);
    EXPECT(config_load_file(&c, write_file("sub/cyc_a.yaml", "defaults: cyc_b\n"), &e) == -1 &&
               strstr(e.msg, "include cycle") && strstr(e.msg, "cyc_a.yaml -> ") && strstr(e.msg, "cyc_b.yaml"),
           "cycle: %s", e.msg);
    EXPECT(load_text(&c, "defaults: t\n", &e) == -1 && strstr(e.msg, "include cycle"), "self include: %s", e.msg);
    // a failed load leaves the config untouched
    config_defaults(&c);
    Config before = c;
    EXPECT(load_text(&c, "train:\n  steps: 77\n  seq_len: x\n", &e) == -1, "bad file fails");
    c.source[0] = before.source[0] = 0;
    EXPECT(config_equal(&c, &before, NULL) && c.train.steps == before.train.steps, "failed load changes nothing");
}

// checkpoint.save_optimizer: a bool, default true; YAML and the command line; junk refused; printed
// and read back; no interaction with the other checkpoint keys in validation.
static void test_save_optimizer(void) {
    Config c;
    Err e = {{0}};
    config_defaults(&c);
    EXPECT(c.checkpoint.save_optimizer == 1, "checkpoint.save_optimizer defaults to true");
    EXPECT(load_text(&c, "checkpoint:\n  save_optimizer: false\n", &e) == 0 && c.checkpoint.save_optimizer == 0,
           "YAML false: %s", e.msg);
    EXPECT(load_text(&c, "checkpoint:\n  save_optimizer: true\n", &e) == 0 && c.checkpoint.save_optimizer == 1,
           "YAML true: %s", e.msg);
    config_defaults(&c);
    EXPECT(config_override(&c, "checkpoint.save_optimizer=false", &e) == 0 && c.checkpoint.save_optimizer == 0,
           "override false: %s", e.msg);
    EXPECT(config_override(&c, "checkpoint.save_optimizer=yes", &e) == 0 && c.checkpoint.save_optimizer == 1,
           "override yes: %s", e.msg);
    EXPECT(load_text(&c, "checkpoint:\n  save_optimizer: sometimes\n", &e) == -1 &&
               strstr(e.msg, "t.yaml:2:") && strstr(e.msg, "checkpoint.save_optimizer: expected true or false, got 'sometimes'"),
           "YAML non-bool refused: %s", e.msg);
    config_defaults(&c);
    EXPECT(config_override(&c, "checkpoint.save_optimizer=2", &e) == -1 &&
               strstr(e.msg, "checkpoint.save_optimizer: expected true or false, got '2'") && c.checkpoint.save_optimizer == 1,
           "override non-bool refused, value kept: %s", e.msg);
    EXPECT(load_text(&c, "checkpoint:\n  save_optimizer:\n", &e) == -1 && strstr(e.msg, "missing value"),
           "empty value refused: %s", e.msg);
    EXPECT(load_text(&c, "checkpoint:\n  save_optimiser: false\n", &e) == -1 && strstr(e.msg, "did you mean checkpoint.save_optimizer"),
           "misspelling suggests the key: %s", e.msg);
    // printed (so stored in trainer_state.yaml's config: block) and read back
    config_defaults(&c);
    config_override(&c, "checkpoint.save_optimizer=false", &e);
    char* text = NULL;
    size_t n = 0;
    FILE* f = open_memstream(&text, &n);
    config_print(&c, f);
    fclose(f);
    EXPECT(text && strstr(text, "  save_optimizer: false"), "printed in the checkpoint section");
    Config b;
    config_defaults(&b);
    EXPECT(config_load_string(&b, text, n, "<printed>", &e) == 0 && b.checkpoint.save_optimizer == 0, "read back: %s", e.msg);
    free(text);
    // no interaction in validation: valid with or without a directory, with checkpoint.required
    EXPECT(config_validate(&c, 1, &e) == 0 && config_validate_run(&c, &e) == 0, "valid without checkpoint.dir: %s", e.msg);
    config_override(&c, "checkpoint.required=true", &e);
    config_override(&c, "checkpoint.dir=/tmp/x", &e);
    EXPECT(config_validate_run(&c, &e) == 0, "valid with checkpoint.required and a dir: %s", e.msg);
}

static void test_roundtrip(void) {
    Config a, b;
    Err e = {{0}};
    config_defaults(&a);
    const char* kv[] = {"train.steps=42", "optim.lr=1.25e-4", "train.device=cpu", "optim.schedule=constant",
                        "train.seed=18446744073709551615", "model.init_std=0.0123456789", "model.z_coef=1e-30",
                        "data.format=fastq", "precision.dtype=fp32", "parallel.zero1=false", "checkpoint.keep=0",
                        "data.path=/some/where \"quoted\" \\back\\slash #not-a-comment: x",
                        "checkpoint.init_from=tab\there, newline\nthere, \xc3\xa9t\xc3\xa9 \xe2\x80\xa8 sep \xef\xbb\xbf"
                        " \xc2\x85 nel \x7f del",
                        "log.dir=  spaces  ", "checkpoint.resume="};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        EXPECT(config_override(&a, kv[i], &e) == 0, "override %s: %s", kv[i], e.msg);
    FILE* f = fopen(write_file("rt.yaml", ""), "w");
    config_print(&a, f);
    fclose(f);
    config_defaults(&b);
    char p[512];
    snprintf(p, sizeof p, "%s/rt.yaml", g_dir);
    EXPECT(config_load_file(&b, p, &e) == 0, "reload the printed config: %s", e.msg);
    const char* diff = "";
    EXPECT(config_equal(&a, &b, &diff), "print → load is the identity (first difference: %s)", diff);
    memset(a.source, 0, sizeof a.source);
    memset(b.source, 0, sizeof b.source);
    EXPECT(memcmp(&a, &b, sizeof a) == 0, "byte-identical Config after the round trip");
    // from memory too, and printing is a fixed point
    char* t1 = NULL;
    size_t n1 = 0;
    FILE* m1 = open_memstream(&t1, &n1);
    config_print(&b, m1);
    fclose(m1);
    config_defaults(&b);
    EXPECT(config_load_string(&b, t1, n1, "<printed>", &e) == 0 && config_equal(&a, &b, &diff),
           "load_string round trip: %s %s", e.msg, diff);
    char* t2 = NULL;
    size_t n2 = 0;
    FILE* m2 = open_memstream(&t2, &n2);
    config_print(&b, m2);
    fclose(m2);
    EXPECT(n1 == n2 && memcmp(t1, t2, n1) == 0, "print(load(print(c))) == print(c)");
    free(t1);
    free(t2);
    // every enum value survives
    const char* en[] = {"precision.dtype=bf16", "train.device=auto", "train.device=cuda", "optim.schedule=cosine",
                        "optim.schedule=linear", "optim.schedule=wsd", "data.format=auto", "data.format=fasta",
                        "data.format=text", "data.format=bin", "data.format=random"};
    for (size_t i = 0; i < sizeof en / sizeof en[0]; i++) {
        config_override(&a, en[i], &e);
        f = fopen(p, "w");
        config_print(&a, f);
        fclose(f);
        config_defaults(&b);
        EXPECT(config_load_file(&b, p, &e) == 0 && config_equal(&a, &b, &diff), "%s round trip: %s", en[i], diff);
    }
}

typedef struct BadYaml {
    const char* yaml;
    const char* expect[3];  // substrings of the message
} BadYaml;

static void test_yaml_errors(void) {
    char big[700] = "data:\n  path: ";
    memset(big + strlen(big), 'x', 600);
    const BadYaml cases[] = {
        {"train:\n  steps: \"open\n", {"t.yaml:", "YAML syntax error", "end of stream"}},
        {"train:\n\tsteps: 5\n", {"t.yaml:2:1: YAML syntax error", "cannot start any token"}},
        {"train: [1,\n", {"YAML syntax error"}},
        {"model:\n  hidden: 64\n  \xff\xfe: 1\n", {"t.yaml: byte", "UTF-8"}},
        {"train:\n  seq_lne: 5\n", {"t.yaml:2:3: unknown key 'train.seq_lne' (did you mean train.seq_len?)"}},
        {"model:\n  seq_len: 5\n", {"unknown key 'model.seq_len' (did you mean train.seq_len?)"}},
        {"train:\n  zzzzzzzzzz: 1\n", {"unknown key 'train.zzzzzzzzzz'", "valid train keys: steps micro_batch"}},
        {"trian:\n  steps: 5\n", {"t.yaml:1:1: unknown section 'trian' (did you mean train?"}},
        {"banana: 1\n", {"unknown section 'banana' (sections: model, parallel"}},
        {"train.steps: 5\n", {"'train.steps' at the top level", "under a 'train:'"}},
        {"train:\n  steps: ten\n", {"t.yaml:2:10: train.steps: expected an integer, got 'ten'"}},
        {"train:\n  steps: 1.5\n", {"train.steps: expected an integer, got '1.5'"}},
        {"optim:\n  lr: fast\n", {"t.yaml:2:7: optim.lr: expected a number, got 'fast'"}},
        {"optim:\n  lr: .nan\n", {"optim.lr: expected a number"}},
        {"optim:\n  clip: inf\n", {"optim.clip: expected a number"}},
        {"parallel:\n  zero1: maybe\n", {"parallel.zero1: expected true or false, got 'maybe'"}},
        {"train:\n  seed: -1\n", {"train.seed: expected a non-negative integer"}},
        {"train:\n  steps: -3\n", {"train.steps: -3 is out of range (expected >= 1)"}},
        {"train:\n  steps: 99999999999999999999\n", {"train.steps: 99999999999999999999 is out of range"}},
        {"model:\n  layers: 5000\n", {"model.layers: 5000 is out of range (expected 1 to 1024)"}},
        {"optim:\n  beta2: 1.5\n", {"optim.beta2: 1.5 is out of range (expected 0 to 0.999999)"}},
        {"precision:\n  dtype: fp16\n", {"t.yaml:2:10: precision.dtype: 'fp16' is not one of fp32, bf16"}},
        {"optim:\n  schedule: cosin\n", {"is not one of cosine, linear, constant, wsd; did you mean cosine?"}},
        {"train:\n  steps:\n", {"train.steps: missing value (expected an integer)"}},
        {"train:\n  device: ~\n", {"train.device: missing value (expected one of auto, cpu, cuda)"}},
        {"train: 5\n", {"t.yaml:1:8: section 'train' must be a mapping of keys"}},
        {"- a\n- b\n", {"t.yaml:1:1: a config is a mapping of sections", "got a list"}},
        {"just text\n", {"a config is a mapping of sections", "got a value"}},
        {"train:\n  steps: [1, 2]\n", {"t.yaml:2:10: train.steps: expected a single value, got a list"}},
        {"train:\n  ? [a]\n  : 1\n", {"expected a key in section 'train', got a list"}},
        {"train:\n  steps: 1\n  steps: 2\n", {"t.yaml:3:3: train.steps is set twice (first on line 2)"}},
        {"train:\n  steps: 1\ntrain:\n  seq_len: 64\n", {"t.yaml:3:1: section 'train' appears twice (first on line 1)"}},
        {"train:\n  steps: 1\n---\ntrain:\n  steps: 2\n", {"t.yaml:4:1: a config file holds one YAML document"}},
        {"defaults: no_such_config_xyz\n",
         {"t.yaml:1:11: defaults: config 'no_such_config_xyz' not found", "configs/no_such_config_xyz.yaml",
          "available configs: L0_sanity, L1_8x7B_ep, bench_8x7B_L2, bench_8x7B_L4"}},
        {"defaults: [L0_sanity, {a: 1}]\n", {"defaults: expected a config name"}},
        {"defaults: a\ndefaults: b\n", {"t.yaml:2:1: defaults: given twice"}},
        {"data:\n  path: \"a\\0b\"\n", {"data.path: the value contains a NUL character"}},
        {big, {"data.path: value longer than 511 characters"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Config c;
        Err e = {{0}};
        int rc = load_text(&c, cases[i].yaml, &e);
        EXPECT(rc == -1, "case %zu should fail with -1 (rc %d)", i, rc);
        for (int j = 0; j < 3 && cases[i].expect[j]; j++)
            EXPECT(strstr(e.msg, cases[i].expect[j]) != NULL, "case %zu: message '%s' lacks '%s'", i, e.msg,
                   cases[i].expect[j]);
    }
    Config c;
    Err e = {{0}};
    config_defaults(&c);
    EXPECT(config_load_file(&c, "/nonexistent/dir/x.yaml", &e) == -1 &&
               strstr(e.msg, "cannot open config /nonexistent/dir/x.yaml: No such file"), "missing file: %s", e.msg);
    EXPECT(config_load_file(&c, g_dir, &e) == -1 && strstr(e.msg, "is not a regular file"), "a directory: %s", e.msg);
    EXPECT(config_load_string(&c, "train:\n  steps: x\n", 18, "<mem>", &e) == -1 && strstr(e.msg, "<mem>:2:10: "),
           "load_string names its input: %s", e.msg);
    EXPECT(load_text(&c, "", &e) == -1 && strstr(e.msg, "the config is empty (no sections)"), "empty file: %s", e.msg);
    EXPECT(load_text(&c, "# only a comment\n", &e) == -1 && strstr(e.msg, "the config is empty"), "comments only: %s", e.msg);
    EXPECT(load_text(&c, "train:\n", &e) == 0 && load_text(&c, "data:\n  path: ~\n", &e) == 0 && !c.data.path[0],
           "empty section / null string are fine: %s", e.msg);
}

typedef struct BadOverride {
    const char* kv;
    int world;           // > 0: config_validate at this world size after the override
    const char* expect;
} BadOverride;

static void test_override_and_layout_errors(void) {
    const BadOverride cases[] = {
        {"train.stepz=4", 0, "command line: unknown key 'train.stepz' (did you mean train.steps?)"},
        {"trian.steps=4", 0, "command line: unknown key 'trian.steps' (did you mean train.steps?)"},
        {"train.steps", 0, "command line: 'train.steps' is not section.key=value"},
        {"steps=4", 0, "is not section.key=value"},
        {"train.steps=ten", 0, "command line: train.steps: expected an integer, got 'ten'"},
        {"train.steps=0", 0, "command line: train.steps: 0 is out of range (expected >= 1)"},
        {"precision.dtype=fp16", 0, "command line: precision.dtype: 'fp16' is not one of fp32, bf16"},
        {"precision.fp8=all", 0, "command line: precision.fp8: 'all' is not one of none, experts, linear"},
        {"precision.fp8=true", 0, "command line: precision.fp8: 'true' is not one of none, experts, linear"},
        {"data.path=\xff\xfe", 0, "data.path: value is not valid UTF-8"},
        {"parallel.ep=2", 3, "the world size (3 ranks) must be a multiple of parallel.ep (2)"},
        {"parallel.ep=3", 3, "parallel.ep (3) must divide model.experts (4) (for 3 ranks: parallel.ep = 1)"},
        {"parallel.ep=8", 8, "parallel.ep (8) must divide model.experts (4)"},
        {"model.kv_heads=3", 1, "model.heads (4) must be a multiple of model.kv_heads (3)"},
        {"model.heads=5", 1, "model.hidden (64) must be a multiple of model.heads (5)"},
        {"model.hidden=68", 1, "head dim model.hidden / model.heads = 68 / 4 = 17 must be even"},
        {"model.top_k=5", 1, "model.top_k (5) cannot exceed model.experts (4)"},
        {"train.global_batch=20", 2,
         "train.global_batch (20) must be a multiple of train.micro_batch × world = 8 × 2 = 16 (gradient accumulation"},
        {"train.global_batch=8", 2, "e.g. train.global_batch=16"},
        {"model.tie_embeddings=true", 1, "model.tie_embeddings must be false"},
        {"train.seq_len=99999", 1, "train.seq_len (99999) exceeds model.max_seq (1024)"},
        {"data.sep_token=300", 1, "data.sep_token (300) must be below model.vocab_size (256)"},
        {"checkpoint.resume=", 1, "checkpoint.resume must be none, auto or a checkpoint path"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Config c;
        Err e = {{0}};
        config_defaults(&c);
        int rc = config_override(&c, cases[i].kv, &e);
        if (!rc && cases[i].world) rc = config_validate(&c, cases[i].world, &e);
        EXPECT(rc == -1, "case %zu (%s) should fail with -1 (rc %d)", i, cases[i].kv, rc);
        EXPECT(strstr(e.msg, cases[i].expect) != NULL, "case %zu: message '%s' lacks '%s'", i, e.msg, cases[i].expect);
    }
    Config c;
    Err e = {{0}};
    config_defaults(&c);
    c.train.steps = 0;  // set behind the parser's back: validate still checks ranges
    EXPECT(config_validate(&c, 1, &e) == -1 && strstr(e.msg, "train.steps = 0 is out of range"), "range: %s", e.msg);
    config_defaults(&c);
    c.optim.schedule = (Schedule)9;
    EXPECT(config_validate(&c, 1, &e) == -1 && strstr(e.msg, "optim.schedule holds 9"), "enum range: %s", e.msg);
    config_defaults(&c);
    config_override(&c, "checkpoint.required=true", &e);
    EXPECT(config_validate(&c, 1, &e) == 0, "plan-level validation does not need checkpoint.dir");
    EXPECT(config_validate_run(&c, &e) == -1 && strstr(e.msg, "checkpoint.dir=/path/to/checkpoints"),
           "checkpoint.required: %s", e.msg);
    config_defaults(&c);
    config_override(&c, "checkpoint.resume=auto", &e);
    EXPECT(config_validate_run(&c, &e) == -1 && strstr(e.msg, "resume=auto needs checkpoint.dir"), "auto: %s", e.msg);
    config_defaults(&c);
    EXPECT(config_validate(&c, 0, &e) == 0, "world 0 = parallel.ep");
}

static void test_find(void) {
    char p[512];
    Err e = {{0}};
    EXPECT(config_find("configs/L0_sanity.yaml", p, sizeof p, &e) == 0 && !strcmp(p, "configs/L0_sanity.yaml"),
           "a path: %s", e.msg);
    EXPECT(config_find("configs/L0_sanity", p, sizeof p, &e) == 0 && !strcmp(p, "configs/L0_sanity.yaml"),
           "a path without .yaml: %s", e.msg);
    EXPECT(config_find("L0_sanity.yaml", p, sizeof p, &e) == 0 && strstr(p, "configs/L0_sanity.yaml"), "NAME.yaml");
    EXPECT(config_find("L0_sanity", p, sizeof p, &e) == 0 && !strcmp(p, "configs/L0_sanity.yaml"), "NAME in ./configs");
    EXPECT(config_find("no_such_cfg", p, sizeof p, &e) == -1 && strstr(e.msg, "config 'no_such_cfg' not found") &&
               strstr(e.msg, "configs/no_such_cfg.yaml") && strstr(e.msg, "/share/moetrain/configs/no_such_cfg.yaml") &&
               strstr(e.msg, "available configs: L0_sanity, L1_8x7B_ep, bench_8x7B_L2, bench_8x7B_L4"),
           "not found lists places and names: %s", e.msg);
    // an install prefix: $MOETRAIN_PREFIX/share/moetrain/configs
    char pre[600];
    snprintf(pre, sizeof pre, "mkdir -p %s/pre/share/moetrain/configs", g_dir);
    EXPECT(system(pre) == 0, "mkdir");
    write_file("pre/share/moetrain/configs/inst.yaml", "train:\n  steps: 3\n");
    snprintf(pre, sizeof pre, "%s/pre", g_dir);
    setenv("MOETRAIN_PREFIX", pre, 1);
    EXPECT(config_find("inst", p, sizeof p, &e) == 0 && strstr(p, "/pre/share/moetrain/configs/inst.yaml"),
           "installed config: %s", e.msg);
    setenv("MOETRAIN_PREFIX", "/nonexistent_prefix", 1);
    EXPECT(config_find("inst", p, sizeof p, &e) == -1 && strstr(e.msg, "/nonexistent_prefix/share/moetrain/configs/inst.yaml"),
           "MOETRAIN_PREFIX is searched: %s", e.msg);
    unsetenv("MOETRAIN_PREFIX");
    Config c;
    config_defaults(&c);
    EXPECT(cli_resolve_data_path(&c, &e) == 0 && strstr(c.data.path, "data/hairpin.fa.gz") && access(c.data.path, R_OK) == 0,
           "data.path \"\" → the shipped hairpins: %s (%s)", c.data.path, e.msg);
    config_override(&c, "data.path=data/lambda_virus.fa.gz", &e);
    EXPECT(cli_resolve_data_path(&c, &e) == 0 && !strcmp(c.data.path, "data/lambda_virus.fa.gz"), "a path as given");
    config_override(&c, "data.path=nowhere/x.fa", &e);
    EXPECT(cli_resolve_data_path(&c, &e) == -1 && strstr(e.msg, "data.path:") && strstr(e.msg, "'nowhere/x.fa' not found"),
           "missing data: %s", e.msg);
    config_override(&c, "data.format=random", &e);
    EXPECT(cli_resolve_data_path(&c, &e) == 0 && !strcmp(c.data.path, "nowhere/x.fa"), "random data needs no file");
}

// The binary (written by the lead): user errors exit with code 2 and say what to fix.
static int run_cmd(const char* cmd, char* out, size_t n) {
    FILE* p = popen(cmd, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_binary(void) {
    if (access(g_bin, X_OK) != 0) {
        printf("  skip: %s is not built\n", g_bin);
        return;
    }
    char out[16384], cmd[8192];
    snprintf(cmd, sizeof cmd, "%s --config L0_sanity train.stepz=3 2>&1", g_bin);
    int rc = run_cmd(cmd, out, sizeof out);
    EXPECT(rc == 2 && strstr(out, "moetrain: error: ") && strstr(out, "did you mean train.steps"), "bad key: rc %d, %s",
           rc, out);
    snprintf(cmd, sizeof cmd, "%s --config no_such_cfg 2>&1", g_bin);
    rc = run_cmd(cmd, out, sizeof out);
    EXPECT(rc == 2 && strstr(out, "'no_such_cfg' not found"), "missing config: rc %d, %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s --config L1_8x7B_ep parallel.ep=1 2>&1", g_bin);
    rc = run_cmd(cmd, out, sizeof out);
    EXPECT(rc == 2 && strstr(out, "checkpoint.dir="), "L1 without checkpoint.dir: rc %d, %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s plan --config L1_8x7B_ep --wrld 3 2>&1", g_bin);
    rc = run_cmd(cmd, out, sizeof out);
    EXPECT(rc == 2 && strstr(out, "unknown option '--wrld'"), "plan: unknown option: rc %d, %s", rc, out);
    snprintf(cmd, sizeof cmd, "%s plan --config L1_8x7B_ep --world 12 2>&1", g_bin);
    rc = run_cmd(cmd, out, sizeof out);
    EXPECT(rc == 2 && strstr(out, "must be a multiple of parallel.ep (8)"), "plan: bad layout: rc %d, %s", rc, out);
    snprintf(cmd, sizeof cmd, "scripts/mpirun.sh -np 2 %s --config L0_sanity parallel.ep=3 2>&1", g_bin);
    rc = run_cmd(cmd, out, sizeof out);
    EXPECT(rc == 2 && strstr(out, "parallel.ep (3) must divide model.experts (4)"), "2 ranks, bad layout: rc %d, %s", rc,
           out);
}

// docs/config.md: hand-written text around a generated key table between two markers.
#define DOC "docs/config.md"
#define BEGIN "<!-- keys:begin (generated by build/tests/test_config --write-docs; do not edit) -->\n"
#define END "<!-- keys:end -->\n"

static char* key_table(void) {
    char* t = NULL;
    size_t n = 0;
    FILE* m = open_memstream(&t, &n);
    config_print_keys(m);
    fclose(m);
    return t;
}

static int write_docs(void) {
    size_t n = 0;
    char* doc = t_slurp(DOC, &n);
    char *b = doc ? strstr(doc, BEGIN) : NULL, *en = b ? strstr(b, END) : NULL;
    if (!b || !en) {
        fprintf(stderr, "%s: needs the two marker lines:\n%s%s", DOC, BEGIN, END);
        return 1;
    }
    char* table = key_table();
    FILE* f = fopen(DOC, "w");
    if (!f) return 1;
    fwrite(doc, 1, (size_t)(b - doc) + strlen(BEGIN), f);
    fputs(table, f);
    fputs(en, f);
    fclose(f);
    printf("wrote the key table into %s\n", DOC);
    free(table);
    free(doc);
    return 0;
}

static void test_docs_current(void) {
    size_t n = 0;
    char* doc = t_slurp(DOC, &n);
    char* table = key_table();
    char* b = doc ? strstr(doc, BEGIN) : NULL;
    EXPECT(b != NULL, "%s lacks the key-table markers", DOC);
    if (b) {
        b += strlen(BEGIN);
        char* en = strstr(b, END);
        EXPECT(en && (size_t)(en - b) == strlen(table) && !memcmp(b, table, strlen(table)),
               "%s's key table is stale: run build/tests/test_config --write-docs", DOC);
    }
    int nk = 0;
    for (char* q = table; (q = strstr(q, "\n| `")); q++) nk++;
    EXPECT(nk >= 50, "the table has a row per key (%d)", nk);
    // README.md's table of sections links every section of the key table to docs/config.md.
    char* readme = t_slurp("README.md", &n);
    EXPECT(readme != NULL, "README.md unreadable");
    char prev[64] = "";
    for (char* q = table; readme && (q = strstr(q, "\n| `")); q++) {
        char sec[64], link[128];
        snprintf(sec, sizeof sec, "%.*s", (int)strcspn(q + 4, ".`"), q + 4);
        if (!strcmp(sec, prev)) continue;
        snprintf(prev, sizeof prev, "%s", sec);
        snprintf(link, sizeof link, "| [`%s`](docs/config.md", sec);
        EXPECT(strstr(readme, link) != NULL, "README.md's table of sections lacks `%s` (a row starting %s)", sec, link);
    }
    free(readme);
    free(doc);
    free(table);
}

// precision.fp8: none by default (every shipped config), each mode from a file and an override,
// printed and loaded back; a YAML typo names the line and the valid values.
static void test_fp8_key(void) {
    Config c;
    Err e = {{0}};
    config_defaults(&c);
    EXPECT(c.precision.fp8 == FP8_NONE, "precision.fp8 defaults to none");
    const char* shipped[] = {"L0_sanity", "L1_8x7B_ep", "bench_8x7B_L2", "bench_8x7B_L4"};
    for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++) {
        char p[1024];
        config_defaults(&c);
        EXPECT(config_find(shipped[i], p, sizeof p, &e) == 0 && config_load_file(&c, p, &e) == 0 &&
                   c.precision.fp8 == FP8_NONE, "%s: fp8 none (%s)", shipped[i], e.msg);
    }
    const char* names[] = {"none", "experts", "linear"};
    for (int m = 0; m < 3; m++) {
        char kv[64], y[64];
        snprintf(kv, sizeof kv, "precision.fp8=%s", names[m]);
        config_defaults(&c);
        EXPECT(config_override(&c, kv, &e) == 0 && (int)c.precision.fp8 == m && config_validate(&c, 1, &e) == 0,
               "%s: %s", kv, e.msg);
        EXPECT(strcmp(fp8_mode_name(c.precision.fp8), names[m]) == 0, "fp8_mode_name(%d) = %s", m, names[m]);
        size_t n = 0;
        char* text = config_print_text(&c, &n);
        Config b;
        config_defaults(&b);
        EXPECT(config_load_string(&b, text, n, "<printed>", &e) == 0 && (int)b.precision.fp8 == m,
               "precision.fp8=%s survives print and load: %s", names[m], e.msg);
        free(text);
        snprintf(y, sizeof y, "precision:\n  fp8: %s\n", names[m]);
        config_defaults(&b);
        EXPECT(config_load_string(&b, y, strlen(y), "t.yaml", &e) == 0 && (int)b.precision.fp8 == m, "yaml fp8: %s: %s",
               names[m], e.msg);
    }
    const char* bad = "precision:\n  fp8: e4m3\n";
    config_defaults(&c);
    EXPECT(config_load_string(&c, bad, strlen(bad), "t.yaml", &e) == -1 &&
               strstr(e.msg, "t.yaml:2:8: precision.fp8: 'e4m3' is not one of none, experts, linear"),
           "yaml typo: %s", e.msg);
}

int main(int argc, char** argv) {
    moetrain_path(argv[0], g_bin, sizeof g_bin);  // before the chdir below: argv[0] may be relative
    // Work from the repository root (the binary is build/tests/test_config).
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        for (int up = 0; up < 3 && strrchr(exe, '/'); up++) *strrchr(exe, '/') = 0;
        char cfg[PATH_MAX + 16];
        snprintf(cfg, sizeof cfg, "%.4000s/configs", exe);
        if (access(cfg, R_OK) == 0 && chdir(exe)) {}
    }
    if (argc > 1 && !strcmp(argv[1], "--write-docs")) return write_docs();
    snprintf(g_dir, sizeof g_dir, "/tmp/moetrain_test_config_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    RUN(test_defaults);
    RUN(test_shipped);
    RUN(test_chains_and_precedence);
    RUN(test_save_optimizer);
    RUN(test_roundtrip);
    RUN(test_yaml_errors);
    RUN(test_override_and_layout_errors);
    RUN(test_fp8_key);
    RUN(test_find);
    RUN(test_binary);
    RUN(test_docs_current);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd)) {}
    TEST_END();
}
