// test_plan.c — `moetrain plan`: Mixtral-8x7B's parameter count, the per-rank memory model
// (checked against an independent count from the architecture), the 141 GiB fit of
// L1_8x7B_ep at EP=8, what train.keep_swiglu adds, the WARNING when a layout does not fit, and
// cmd_plan's command line.
#define _DEFAULT_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "model.h"
#include "params.h"
#include "plan.h"
#include "test.h"

#include "../cmd/plan.c"  // cmd_plan itself (cmd/ is not in libmoetrain.a)

static Config load(const char* name, const char* const* kv) {
    Config c;
    Err e = {{0}};
    char p[512];
    config_defaults(&c);
    if (config_find(name, p, sizeof p, &e) || config_load_file(&c, p, &e)) fprintf(stderr, "load %s: %s\n", name, e.msg);
    for (; kv && *kv; kv++)
        if (config_override(&c, *kv, &e)) fprintf(stderr, "override %s: %s\n", *kv, e.msg);
    return c;
}

static void test_thousands(void) {
    char b[32];
    const struct { int64_t v; const char* s; } cases[] = {
        {0, "0"}, {999, "999"}, {1000, "1,000"}, {-1234567, "-1,234,567"}, {46702792704LL, "46,702,792,704"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        plan_thousands(cases[i].v, b, sizeof b);
        EXPECT(!strcmp(b, cases[i].s), "%lld → '%s', want '%s'", (long long)cases[i].v, b, cases[i].s);
    }
}

static void test_mixtral_counts(void) {
    Config c = load("L1_8x7B_ep", NULL);
    ParamCounts pc = params_count(&c.model);
    EXPECT(pc.total == 46702792704LL, "Mixtral-8x7B total %lld, want 46,702,792,704", (long long)pc.total);
    // independent: per layer attention 2·H·H + 2·H·(kv·D), norms 2H, router E·H; experts 3·H·F each
    const int64_t H = 4096, F = 14336, V = 32000, L = 32, E = 8, D = 128, KV = 8;
    const int64_t dense = L * (2 * H * H + 2 * H * KV * D + 2 * H + E * H) + 2 * V * H + H;
    EXPECT(pc.dense == dense && pc.expert == L * E * 3 * H * F, "dense %lld / expert %lld", (long long)pc.dense,
           (long long)pc.expert);
    EXPECT(pc.active == dense + L * 2 * 3 * H * F, "active per token (top-2) %lld", (long long)pc.active);
}

static void test_memory_l1(void) {
    Config c = load("L1_8x7B_ep", NULL);
    PlanMemory m;
    Err e = {{0}};
    EXPECT(plan_memory(&c, 8, &m, &e) == 0, "plan L1 at world 8: %s", e.msg);
    const double GiB = (double)(1ull << 30);
    const ParamCounts pc = params_count(&c.model);
    const double held = (double)pc.dense + (double)pc.expert / 8;  // one expert of eight per layer
    EXPECT(m.ep == 8 && m.edp == 1 && m.e_local == 1 && m.grad_accum == 8 && m.tokens == 4096, "layout");
    EXPECT(m.weights == held * 2, "bf16 weights %.0f, want %.0f", m.weights, held * 2);
    // ZeRO-1: dense over the world (8), experts over edp (1: not sharded)
    const double owned = (double)pc.dense / 8 + (double)pc.expert / 8;
    // bf16 with precision.master=split (the default): the masters' memory is the int16 remainders
    EXPECT(m.split_master && m.master == owned * 2 && m.adam == owned * 8, "master (split) / Adam shards");
    EXPECT(m.grads == held * 4 + (double)pc.dense / 8 * 4, "fp32 grads + the dense reduce-scatter slice");
    EXPECT(m.act_saved > 20 * GiB && m.act_saved < 32 * GiB, "saved activations %.1f GiB", m.act_saved / GiB);
    // an H200 has 140.4 GiB; keep 4 GiB for the CUDA context, cuBLASLt and NCCL buffers
    EXPECT(m.total < 136 * GiB, "L1_8x7B_ep at EP=8 fits an H200 with >= 4 GiB spare: %.1f GiB", m.total / GiB);
    EXPECT(m.total > 100 * GiB, "and is not implausibly small: %.1f GiB", m.total / GiB);
    // activations are linear in the tokens of a micro-batch; the logits chunk is capped at
    // MODEL_HEAD_CHUNK_BYTES (1 GiB: 16,777 tokens of 32,000 bf16 logits)
    Config c2 = load("L1_8x7B_ep", (const char*[]){"train.micro_batch=2", "train.global_batch=64", NULL});
    PlanMemory m2;
    EXPECT(plan_memory(&c2, 8, &m2, &e) == 0, "micro_batch 2: %s", e.msg);
    EXPECT(m2.act_saved == 2 * m.act_saved && m2.weights == m.weights && m2.grad_accum == 4, "2× tokens, 2× saved");
    // eval / generate: the weights and one layer's forward buffers (linear in the tokens), no
    // optimizer state or gradients: 8x7B at EP 8 in well under a fifth of the training total
    EXPECT(m.infer_total > m.weights + m.logits && m.infer_total < 20 * GiB && m.infer_total < m.total / 5,
           "inference %.2f GiB (training %.2f)", m.infer_total / GiB, m.total / GiB);
    EXPECT(m2.infer_act == 2 * m.infer_act && m.infer_act < m.act_saved / 16, "inference buffers: %.0f, %.0f",
           m.infer_act, m2.infer_act);
    EXPECT(m.logits == 4096.0 * 32000 * 2 && m2.logits == 2 * m.logits, "logits chunk: all 4096 / 8192 tokens: %.0f, %.0f",
           m.logits, m2.logits);
    Config c8 = load("L1_8x7B_ep", (const char*[]){"train.micro_batch=8", "train.global_batch=64", NULL});
    PlanMemory m8;
    EXPECT(plan_memory(&c8, 8, &m8, &e) == 0, "micro_batch 8: %s", e.msg);
    EXPECT(m8.logits == (double)(MODEL_HEAD_CHUNK_BYTES / 64000) * 64000 && m8.logits <= MODEL_HEAD_CHUNK_BYTES,
           "32,768 tokens: the chunk is capped at 1 GiB: %.0f", m8.logits);
    // the same model on 16 ranks (edp 2): expert optimizer state halves
    PlanMemory m16;
    EXPECT(plan_memory(&c, 16, &m16, &e) == 0 && m16.edp == 2, "world 16: %s", e.msg);
    EXPECT(m16.master < m.master * 0.55 && m16.total < m.total, "edp 2 shards the experts' state");
    // fp32 weights double the compute copy; ZeRO-1 off replicates master and Adam
    Config c3 = load("L1_8x7B_ep", (const char*[]){"precision.dtype=fp32", "parallel.zero1=false", NULL});
    PlanMemory m3;
    EXPECT(plan_memory(&c3, 8, &m3, &e) == 0, "fp32: %s", e.msg);
    EXPECT(m3.weights == 2 * m.weights && m3.master == held * 4 && m3.grads == held * 4 && !m3.split_master,
           "fp32, no ZeRO-1 (precision.master is ignored in fp32)");
    // precision.master=fp32 in bf16: a separate fp32 copy, 2 bytes per owned parameter more
    Config c4 = load("L1_8x7B_ep", (const char*[]){"precision.master=fp32", NULL});
    PlanMemory m4;
    EXPECT(plan_memory(&c4, 8, &m4, &e) == 0, "master fp32: %s", e.msg);
    EXPECT(!m4.split_master && m4.master == owned * 4 && m4.total - m.total == owned * 2 && m4.weights == m.weights,
           "bf16 with fp32 masters: master %.0f, total +%.0f", m4.master, m4.total - m.total);
    // the CPU computes in fp32: no split there either
    Config c5 = load("L1_8x7B_ep", (const char*[]){"train.device=cpu", NULL});
    PlanMemory m5;
    EXPECT(plan_memory(&c5, 8, &m5, &e) == 0 && !m5.split_master && m5.master == owned * 4, "CPU: fp32 masters");
    // an impossible layout is an error, not a table
    EXPECT(plan_memory(&c, 12, &m, &e) == -1 && strstr(e.msg, "multiple of parallel.ep (8)"), "world 12: %s", e.msg);
}

// train.keep_swiglu: the experts' SwiGLU output h [R,F] per layer joins the saved activations
// (R = micro_batch × seq_len × top_k; 25% slack with EP > 1, like the rest of the MoE rows);
// the per-layer scratch is unchanged (eval and the attention backward still use its h).
static void test_memory_keep_swiglu(void) {
    Err e = {{0}};
    const double GiB = (double)(1ull << 30);
    // bench_8x7B_L2 at micro-batch 8, seq 4096, one H200: 65,536 rows × 14,336 × bf16 per layer
    // (the bench config turns the key on; the key's own default is false)
    const char* mb8[] = {"train.micro_batch=8", "train.global_batch=8", "train.keep_swiglu=false", NULL};
    const char* mb8k[] = {"train.micro_batch=8", "train.global_batch=8", NULL};
    Config off = load("bench_8x7B_L2", mb8), on = load("bench_8x7B_L2", mb8k);
    EXPECT(!off.train.keep_swiglu && on.train.keep_swiglu && !load("L1_8x7B_ep", NULL).train.keep_swiglu,
           "the key parses; default false; bench_8x7B_L2 sets it");
    PlanMemory a, b;
    EXPECT(plan_memory(&off, 1, &a, &e) == 0 && plan_memory(&on, 1, &b, &e) == 0, "plan bench: %s", e.msg);
    const double per_layer = 8.0 * 4096 * 2 * 14336 * 2;  // 1,879,048,192 bytes = 1.75 GiB
    EXPECT(b.kept_swiglu == 2 * per_layer && a.kept_swiglu == 0, "kept h %.0f, want %.0f", b.kept_swiglu, 2 * per_layer);
    EXPECT(b.act_saved - a.act_saved == 2 * per_layer && b.act_scratch == a.act_scratch && b.total - a.total == 2 * per_layer,
           "saved +%.2f GiB, scratch %+.2f GiB, total +%.2f GiB", (b.act_saved - a.act_saved) / GiB,
           (b.act_scratch - a.act_scratch) / GiB, (b.total - a.total) / GiB);
    // L1_8x7B_ep at EP 8: 32 layers of 4096 × 2 rows with the 25% slack
    Config l1 = load("L1_8x7B_ep", NULL), l1k = load("L1_8x7B_ep", (const char*[]){"train.keep_swiglu=true", NULL});
    EXPECT(plan_memory(&l1, 8, &a, &e) == 0 && plan_memory(&l1k, 8, &b, &e) == 0, "plan L1: %s", e.msg);
    const double l1_h = 32 * 1.25 * 4096 * 2 * 14336 * 2;
    EXPECT(b.total - a.total == l1_h && b.kept_swiglu == l1_h, "L1 at EP 8: +%.2f GiB, want %.2f", (b.total - a.total) / GiB,
           l1_h / GiB);
    // the report says what the key costs; without it, nothing
    char* t = NULL;
    size_t n = 0;
    FILE* f = open_memstream(&t, &n);
    EXPECT(plan_report(&on, 1, 141, f, &e) == 0, "report: %s", e.msg);
    fclose(f);
    EXPECT(strstr(t, "train.keep_swiglu: 3.50 GiB of the saved activations") && strstr(t, "1.75 GiB per layer"),
           "report with the key: %s", t);
    free(t);
    t = NULL;
    f = open_memstream(&t, &n);
    EXPECT(plan_report(&off, 1, 141, f, &e) == 0, "report: %s", e.msg);
    fclose(f);
    EXPECT(!strstr(t, "keep_swiglu"), "report without the key: %s", t);
    free(t);
}

static char* report(const Config* c, int world, double gpu) {
    char* t = NULL;
    size_t n = 0;
    FILE* f = open_memstream(&t, &n);
    Err e = {{0}};
    if (plan_report(c, world, gpu, f, &e)) fprintf(f, "ERROR %s", e.msg);
    fclose(f);
    return t;
}

static void test_report(void) {
    Config c = load("L1_8x7B_ep", NULL);
    char* t = report(&c, 8, 141);
    EXPECT(strstr(t, "46,702,792,704 total") && strstr(t, "active per token:  12,879,925,248"), "counts: %s", t);
    EXPECT(strstr(t, "training FLOPs per token: ") && strstr(t, "world 8 = ep 8 x edp 1"), "FLOPs and layout: %s", t);
    EXPECT(strstr(t, "weights (bf16") && strstr(t, "fp32 masters: 16-bit remainders") && strstr(t, "Adam m + v") &&
               strstr(t, "total "),
           "the memory table: %s", t);
    EXPECT(strstr(t, "fits: ") && !strstr(t, "WARNING"), "fits 141 GiB: %s", t);
    free(t);
    t = report(&c, 8, 80);
    EXPECT(strstr(t, "WARNING: ") && strstr(t, "exceeds the 80.0 GiB GPU"), "warns on a smaller GPU: %s", t);
    free(t);
    Config one = load("L1_8x7B_ep", (const char*[]){"parallel.ep=1", NULL});
    t = report(&one, 1, 141);
    EXPECT(strstr(t, "WARNING: "), "the whole 8x7B on one GPU does not fit: %s", t);
    free(t);
    Config c32 = load("L1_8x7B_ep", (const char*[]){"precision.master=fp32", NULL});
    t = report(&c32, 8, 141);
    EXPECT(strstr(t, "fp32 master weights") && !strstr(t, "remainders"), "precision.master=fp32: %s", t);
    free(t);
    Config tiny = load("L0_sanity", NULL);
    t = report(&tiny, 2, 141);
    EXPECT(strstr(t, "MiB") && strstr(t, "fits: "), "tiny model in MiB: %s", t);
    free(t);
    Config tcpu = load("L0_sanity", (const char*[]){"train.device=cpu", NULL});
    t = report(&tcpu, 2, 141);
    EXPECT(strstr(t, "(host memory of one rank on the CPU backend") && strstr(t, "MiB for the 2 ranks together") &&
               !strstr(t, "GPU") && !strstr(t, "fits: "),
           "on the CPU: host memory, no GPU to fit: %s", t);
    free(t);
}

// GPU runs count the CUDA context, cuBLASLt workspace + op scratch and NCCL's buffers (one per
// communicator of > 1 rank; groups with the world's members share the world's); the CPU none;
// parallel.comm=mpi no NCCL. L1_8x7B_ep still fits an H200.
static void test_gpu_rows(void) {
    const double GiB = 1024.0 * 1024 * 1024;
    Config c = load("L1_8x7B_ep", NULL);
    PlanMemory m, mc, mm, m16;
    Err e = {{0}};
    EXPECT(plan_memory(&c, 8, &m, &e) == 0, "plan: %s", e.msg);
    EXPECT(m.cuda_context == PLAN_CUDA_CONTEXT_BYTES && m.lib_workspace == 96.0 * (1 << 20) && m.nccl_comms == 1 &&
               m.nccl == PLAN_NCCL_BASE_BYTES + PLAN_NCCL_COMM_BYTES,
           "L1 at EP=8: context %.0f, workspace %.0f, %d NCCL comm(s)", m.cuda_context, m.lib_workspace, m.nccl_comms);
    EXPECT(plan_memory(&c, 16, &m16, &e) == 0 && m16.nccl_comms == 3, "world 16 = ep 8 x edp 2: world, ep, edp (%d)",
           m16.nccl_comms);
    Config cpu = load("L1_8x7B_ep", (const char*[]){"train.device=cpu", NULL});
    EXPECT(plan_memory(&cpu, 8, &mc, &e) == 0 && mc.cuda_context == 0 && mc.lib_workspace == 0 && mc.nccl == 0,
           "the CPU counts no CUDA rows");
    Config mpi = load("L1_8x7B_ep", (const char*[]){"parallel.comm=mpi", NULL});
    EXPECT(plan_memory(&mpi, 8, &mm, &e) == 0 && mm.nccl == 0 && mm.cuda_context > 0 && mm.total == m.total - m.nccl,
           "parallel.comm=mpi: no NCCL buffers");
    EXPECT(m.total < 136 * GiB, "L1_8x7B_ep with the CUDA rows still fits an H200 with >= 4 GiB spare: %.2f GiB",
           m.total / GiB);
    char* t = report(&c, 8, 141);
    EXPECT(strstr(t, "CUDA context + kernels (estimate)") && strstr(t, "cuBLASLt workspace + op scratch") &&
               strstr(t, "NCCL (estimate)") && strstr(t, "(1 communicator of > 1 rank)"),
           "the GPU rows: %s", t);
    free(t);
    t = report(&mpi, 8, 141);
    EXPECT(strstr(t, "parallel.comm=mpi: staging in page-locked host memory") && !strstr(t, "NCCL (estimate)"),
           "comm=mpi row: %s", t);
    free(t);
    Config as = load("L1_8x7B_ep", (const char*[]){"checkpoint.async=true", NULL});
    t = report(&as, 8, 141);
    EXPECT(strstr(t, "checkpoint.async: plus 65.") || strstr(t, "checkpoint.async: plus 64."), "async snapshot size: %s", t);
    free(t);
    t = report(&cpu, 8, 141);
    EXPECT(!strstr(t, "CUDA context") && !strstr(t, "NCCL"), "CPU report: %s", t);
    free(t);
}

// Runs cmd_plan with stdout and stderr captured into out.
static int run_plan(char* out, size_t n, int argc, const char** argv) {
    char path[] = "/tmp/moetrain_test_plan_XXXXXX";
    int fd = mkstemp(path);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    dup2(fd, 1);
    dup2(fd, 2);
    int rc = cmd_plan(argc, (char**)argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    lseek(fd, 0, SEEK_SET);
    ssize_t got = read(fd, out, n - 1);
    out[got > 0 ? got : 0] = 0;
    close(fd);
    unlink(path);
    return rc;
}

static void test_cmd_plan(void) {
    static char out[16384];
    int rc = run_plan(out, sizeof out, 3, (const char*[]){"plan", "--config", "L1_8x7B_ep"});
    EXPECT(rc == 0 && strstr(out, "46,702,792,704") && strstr(out, "fits: "), "plan L1: rc %d %s", rc, out);
    rc = run_plan(out, sizeof out, 6, (const char*[]){"plan", "--config=L1_8x7B_ep", "parallel.ep=4", "--world", "8",
                                                      "--gpu-mem=80"});
    EXPECT(rc == 0 && strstr(out, "world 8 = ep 4 x edp 2") && strstr(out, "WARNING"), "overrides + flags: rc %d %s", rc,
           out);
    rc = run_plan(out, sizeof out, 4, (const char*[]){"plan", "--config", "L1_8x7B_ep", "--wrld"});
    EXPECT(rc == 2 && strstr(out, "moetrain: error: plan: unknown option '--wrld'"), "unknown option: %d %s", rc, out);
    rc = run_plan(out, sizeof out, 5, (const char*[]){"plan", "--config", "L1_8x7B_ep", "--world", "x"});
    EXPECT(rc == 2 && strstr(out, "--world: expected"), "bad --world: %d %s", rc, out);
    rc = run_plan(out, sizeof out, 5, (const char*[]){"plan", "--config", "L1_8x7B_ep", "--world", "3"});
    EXPECT(rc == 2 && strstr(out, "world size (3 ranks)"), "bad layout: %d %s", rc, out);
    rc = run_plan(out, sizeof out, 4, (const char*[]){"plan", "--config", "L1_8x7B_ep", "model.heads=7"});
    EXPECT(rc == 2 && strstr(out, "model.hidden (4096) must be a multiple of model.heads (7)"),
           "bad model: %d %s", rc, out);
    rc = run_plan(out, sizeof out, 1, (const char*[]){"plan"});
    EXPECT(rc == 2 && strstr(out, "no config given"), "no config: %d %s", rc, out);
    rc = run_plan(out, sizeof out, 4, (const char*[]){"plan", "--config", "L1_8x7B_ep", "train.stepz=3"});
    EXPECT(rc == 2 && strstr(out, "command line: unknown key 'train.stepz' (did you mean train.steps?)"), "bad key: %s",
           out);
}

// The attention backward's dS in the MoE scratch (moe.c moe_plan_bumps): in bf16 the scratch grows
// to hold the whole stored dS when that at most doubles it (bench_8x7B_L2 at micro-batch 8: 4.36 GB
// against the MoE's 2.42 GB), not for long sequences (seq 32768: 34 GB), and never in fp32.
static void test_memory_attn_ds(void) {
    Err e = {{0}};
    const char* mb8[] = {"train.micro_batch=8", "train.global_batch=8", NULL};
    const char* mb8f[] = {"train.micro_batch=8", "train.global_batch=8", "precision.dtype=fp32", NULL};
    const char* long1[] = {"train.micro_batch=1", "train.global_batch=1", "train.seq_len=32768", NULL};
    PlanMemory a, f, l;
    Config ca = load("bench_8x7B_L2", mb8), cf = load("bench_8x7B_L2", mb8f), cl = load("bench_8x7B_L2", long1);
    EXPECT(plan_memory(&ca, 1, &a, &e) == 0 && plan_memory(&cf, 1, &f, &e) == 0 && plan_memory(&cl, 1, &l, &e) == 0,
           "plan: %s", e.msg);
    const double N = 8.0 * 4096, H = 4096, F = 14336, Hq = 32, D = 128, E = 8, k = 2, R = N * k;
    const double dense2 = 2 * N * (2 * H + H + Hq * D + 2 * 8 * D + E + k * H) + 4 * N * (E + 2 * k);
    const double moe2 = R * (F + H) * 2 + 8 * R, ds = 8192.0 * 8 * Hq * (64.0 * 65 / 2);
    EXPECT(ds > moe2 && ds <= 2 * moe2 && a.act_scratch == dense2 + ds, "bf16 micro-batch 8: scratch %.0f, want %.0f",
           a.act_scratch, dense2 + ds);
    const double dense4 = 4 * N * (2 * H + H + Hq * D + 2 * 8 * D + E + k * H) + 4 * N * (E + 2 * k);
    EXPECT(f.act_scratch == dense4 + R * (F + H) * 4 + 8 * R, "fp32: the MoE scratch alone (%.0f)", f.act_scratch);
    const double Nl = 32768, Rl = Nl * k;
    const double densel = 2 * Nl * (2 * H + H + Hq * D + 2 * 8 * D + E + k * H) + 4 * Nl * (E + 2 * k);
    EXPECT(l.act_scratch == densel + Rl * (F + H) * 2 + 8 * Rl, "seq 32768: no 34 GB dS arena (%.0f)", l.act_scratch);
}

// precision.fp8's workspace placed as moe.c places it: the expert GEMMs' beside the layer's rows,
// where bench_8x7B_L2 at micro-batch 8 has the attention backward's dS room (2.42 GB of rows in a
// 4.36 GB arena): no memory added; at seq 32768 (no dS room) and in fp32 the arena grows by the
// whole workspace. With its train.keep_swiglu the layers keep h's codes instead of bf16 h: the
// total is bf16's less the difference.
static void test_memory_fp8(void) {
    const double GiB = (double)(1ull << 30);
    Err e = {{0}};
    const char* base[] = {"train.micro_batch=8", "train.global_batch=8", NULL};
    const char* ex[] = {"train.micro_batch=8", "train.global_batch=8", "precision.fp8=experts", NULL};
    const char* li[] = {"train.micro_batch=8", "train.global_batch=8", "precision.fp8=linear", NULL};
    const char* lo[] = {"train.micro_batch=1", "train.global_batch=1", "train.seq_len=32768", "precision.fp8=experts", NULL};
    const char* lon[] = {"train.micro_batch=1", "train.global_batch=1", "train.seq_len=32768", NULL};
    const char* f32[] = {"train.micro_batch=8", "train.global_batch=8", "precision.dtype=fp32", "precision.fp8=experts", NULL};
    PlanMemory b, x, l, g, gn, f;
    Config cb = load("bench_8x7B_L2", base), cx = load("bench_8x7B_L2", ex), cl = load("bench_8x7B_L2", li);
    Config cg = load("bench_8x7B_L2", lo), cgn = load("bench_8x7B_L2", lon), cf = load("bench_8x7B_L2", f32);
    EXPECT(plan_memory(&cb, 1, &b, &e) == 0 && plan_memory(&cx, 1, &x, &e) == 0 && plan_memory(&cl, 1, &l, &e) == 0 &&
               plan_memory(&cg, 1, &g, &e) == 0 && plan_memory(&cgn, 1, &gn, &e) == 0 && plan_memory(&cf, 1, &f, &e) == 0,
           "plan: %s", e.msg);
    EXPECT(b.fp8_ws == 0 && b.fp8_extra == 0, "fp8 none: no workspace");
    EXPECT(x.fp8_ws > 0.1 * GiB && x.fp8_ws < 0.5 * GiB, "experts: workspace %.3f GiB", x.fp8_ws / GiB);
    // h's codes: 2 layers of F·(R + 15·8) codes, 4F·(R/128 + 8) bytes of scales, 512·9 of alignment
    const double R = 65536, F = 14336, codes = 2 * (F * (R + 15 * 8) + 4 * F * (R / 128 + 8) + 512 * 9);
    EXPECT(b.kept_swiglu == 2 * R * F * 2 && x.kept_swiglu == codes && l.kept_swiglu == codes,
           "kept h: bf16 %.0f, experts %.0f, linear %.0f bytes, want %.0f", b.kept_swiglu, x.kept_swiglu, l.kept_swiglu,
           codes);
    const double less = b.kept_swiglu - codes;  // 1.70 GiB
    // precision.fp8_weights=auto keeps the expert weight codes here (one micro-batch a step: bf16 expert
    // gradients): 2 layers × 8 local experts × two layouts of w13 [28672, 4096] and w2 [4096, 14336] in
    // bytes, and their fp32 block scales (224·32 + 32·112 a layout), in the training total only. They
    // take the bf16 gradients' unused half of the fp32-sized arena (2 bytes an expert parameter): only
    // the scales are added.
    const double want = 2.0 * 8 * 2 * (3.0 * 4096 * 14336 + 4.0 * (224 * 32 * 2 + 32 * 112));
    const double over = want - 2.0 * 2 * 8 * 3 * 4096 * 14336;
    EXPECT(x.fp8_wcodes_kept == want && x.fp8_wcodes == over && l.fp8_wcodes == over,
           "auto: %.0f bytes of codes (want %.0f), %.0f added (want %.0f)", x.fp8_wcodes_kept, want, x.fp8_wcodes, over);
    EXPECT(x.moe_room + x.fp8_ws <= x.moe_arena && x.fp8_extra == 0 && x.total == b.total - less + over,
           "experts at micro-batch 8: rows %.3f + workspace %.3f GiB within the %.3f GiB arena, total %.3f = %.3f - %.3f GiB",
           x.moe_room / GiB, x.fp8_ws / GiB, x.moe_arena / GiB, x.total / GiB, b.total / GiB, less / GiB);
    EXPECT(l.fp8_ws >= x.fp8_ws && l.fp8_extra == 0 && l.total == b.total - less + over, "linear: total %.3f GiB",
           l.total / GiB);
    EXPECT(g.moe_arena == g.moe_room && g.fp8_extra == g.fp8_ws &&
               g.total == gn.total + g.fp8_ws - (gn.kept_swiglu - g.kept_swiglu) + g.fp8_wcodes,
           "seq 32768: the arena grows by the workspace (%.3f of %.3f GiB)", g.fp8_extra / GiB, g.fp8_ws / GiB);
    EXPECT(f.fp8_extra == f.fp8_ws && f.fp8_ws > 0, "fp32: no dS room, the workspace added (%.3f GiB)", f.fp8_extra / GiB);
    EXPECT(f.fp8_wcodes_kept == 0, "fp32: fp32 expert gradients, so auto keeps no codes");
    EXPECT(x.fp8_infer_extra > 0 && x.fp8_infer_extra <= x.fp8_ws && x.infer_total == b.infer_total + x.fp8_infer_extra,
           "inference (no dS room): the forward's workspace added, %.3f GiB", x.fp8_infer_extra / GiB);
    // per_gemm keeps none; per_step with fp32 expert gradients adds them all; per_step with four
    // micro-batches a step (fp32 gradients under auto) too
    const char* pg[] = {"train.micro_batch=8", "train.global_batch=8", "precision.fp8=experts",
                        "precision.fp8_weights=per_gemm", NULL};
    const char* pf[] = {"train.micro_batch=8", "train.global_batch=8", "precision.fp8=experts",
                        "precision.fp8_weights=per_step", "precision.expert_grad=fp32", NULL};
    const char* pa[] = {"train.micro_batch=2", "train.global_batch=8", "precision.fp8=experts",
                        "precision.fp8_weights=per_step", NULL};
    const char* aa[] = {"train.micro_batch=2", "train.global_batch=8", "precision.fp8=experts", NULL};
    Config cpg = load("bench_8x7B_L2", pg), cpf = load("bench_8x7B_L2", pf), cpa = load("bench_8x7B_L2", pa);
    Config caa = load("bench_8x7B_L2", aa);
    PlanMemory p, q, r, t;
    EXPECT(plan_memory(&cpg, 1, &p, &e) == 0 && plan_memory(&cpf, 1, &q, &e) == 0 && plan_memory(&cpa, 1, &r, &e) == 0 &&
               plan_memory(&caa, 1, &t, &e) == 0,
           "plan fp8_weights: %s", e.msg);
    EXPECT(p.fp8_wcodes_kept == 0 && p.fp8_wcodes == 0 && p.total == x.total - over, "per_gemm: none kept");
    EXPECT(q.fp8_wcodes_kept == want && q.fp8_wcodes == want && q.total == x.total - over + want &&
               q.infer_total == x.infer_total,
           "per_step, fp32 gradients: %.3f GiB of codes added (want %.3f), training only", q.fp8_wcodes / GiB,
           want / GiB);
    EXPECT(r.fp8_wcodes == want && t.fp8_wcodes_kept == 0 && r.total == t.total + want,
           "per_step with accumulation: all added (%.3f GiB); auto keeps none there", r.fp8_wcodes / GiB);
}

int main(void) {
    char exe[PATH_MAX];  // work from the repository root (build/tests/test_plan)
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        for (int up = 0; up < 3 && strrchr(exe, '/'); up++) *strrchr(exe, '/') = 0;
        char cfg[PATH_MAX + 16];
        snprintf(cfg, sizeof cfg, "%.4000s/configs", exe);
        if (access(cfg, R_OK) == 0 && chdir(exe)) {}
    }
    RUN(test_thousands);
    RUN(test_mixtral_counts);
    RUN(test_memory_l1);
    RUN(test_memory_keep_swiglu);
    RUN(test_memory_attn_ds);
    RUN(test_memory_fp8);
    RUN(test_report);
    RUN(test_gpu_rows);
    RUN(test_cmd_plan);
    TEST_END();
}
