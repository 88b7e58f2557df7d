// plan.c — see plan.h. The memory model follows what model.c, moe.c and optim.c allocate.
#include "plan.h"

#include <math.h>
#include <string.h>

#include "backend.h"
#include "model.h"
#include "params.h"

void plan_thousands(int64_t v, char* out, size_t n) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%lld", (long long)(v < 0 ? -v : v));
    size_t len = strlen(tmp), o = 0;
    if (v < 0 && o + 1 < n) out[o++] = '-';
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) out[o++] = ',';
        out[o++] = tmp[i];
    }
    out[o] = 0;
}

// Weights, fp32 masters, gradients and Adam state of one rank; a = compute dtype bytes.
static void plan_state(const Config* c, int world, double a, PlanMemory* m) {
    const double f4 = 4, held = (double)(m->dense + m->expert);
    // ZeRO-1 (optim.c): the dense arena is sharded over the world, the expert arena over edp,
    // each only when its group has more than one rank; a sharded arena also holds its reduced
    // gradient slice (gshard).
    const int zd = c->parallel.zero1 && world > 1, ze = c->parallel.zero1 && m->edp > 1;
    const double owned = (zd ? (double)m->dense / world : (double)m->dense) +
                         (ze ? (double)m->expert / m->edp : (double)m->expert);
    const double gshard = (zd ? (double)m->dense / world : 0) + (ze ? (double)m->expert / m->edp : 0);
    m->weights = held * a;
    // fp32 masters: a separate copy, or with bf16 weights and precision.master=split the bf16
    // weight itself plus a 16-bit remainder (optim.c OptShard.rem)
    m->split_master = a == 2 && c->precision.master == MASTER_SPLIT;
    m->master = owned * (m->split_master ? 2 : f4);
    m->adam = 2 * owned * f4;
    m->grads = held * f4 + gshard * f4;
}

// Activations saved for the backward, scratch and the logits chunk; a = compute dtype bytes.
static void plan_activations(const Config* c, double a, PlanMemory* m) {
    const ModelConfig* mc = &c->model;
    const double f4 = 4;
    // Activations, N = micro_batch × seq_len tokens, R = N·top_k expert rows a rank receives
    // with balanced routing (dropless: with EP > 1 the real R varies, and moe.c plans its arenas
    // with 25% slack; at EP = 1, R is exactly N·k).
    // H hidden, F ffn, Hq/Hkv heads, D head dim, E experts, k top_k, V vocab, a = dtype bytes.
    //  saved per layer (model.c LayerSaved, moe.c MoeSaved):
    //    a·N·(4H + 2·Hq·D + 2·Hkv·D)        x_in, ln1 out, x_mid (residual), ln2 out; q, att; k, v
    //    4·N·(2 + Hq + 2E + 3k)             rstd1, rstd2; attention lse; router logits, probs;
    //                                       top-k ids, weights, dest rows
    //    s·R·((H + 2F)·a + 4)               received rows xe [R,H], gate|up gu [R,2F], weights
    //                                       (s = 1.25 with EP > 1, else 1)
    //    s·R·F·a with train.keep_swiglu     the experts' SwiGLU output h [R,F], kept for the
    //                                       backward instead of recomputed (the scratch below
    //                                       keeps its h: eval and the attention backward use it);
    //                                       with precision.fp8 h's codes for w2's weight gradient
    //                                       instead: F·(sR + 15·El) codes (each of the El local
    //                                       experts' rows padded to 16), 4F·(sR/128 + El) scales,
    //                                       512·(El + 1) of alignment (the backends' bound)
    //  once: a·N·2H + 4·3N                  final x, final norm out, rstd, tokens, targets
    //  scratch (reused by every layer):
    //    a·N·(2·max(H, Hq·D) + H + Hq·D + 2·Hkv·D + E + k·H) + 4·N·(E + 2k)
    //                                       dense scratch, dlogits, permuted send rows x [N·k, H]
    //    s·(R·(F + c·H)·a + 8R)             MoE per-layer scratch: h [R,F] (dh reuses it), expert
    //                                       out / dxe [R,H]; with EP > 1 (c = 4) the received,
    //                                       reordered and returned rows [R,H] too (c = 1 without);
    //                                       in bf16 the attention backward's dS instead, the
    //                                       causal 64 × 64 tiles: 8 KiB · B·Hq·nt(nt+1)/2, nt = ⌈T/64⌉,
    //                                       when it is larger but at most twice as large (moe.c)
    //  logits chunk: min(N, MODEL_HEAD_CHUNK_BYTES / (V·a)) tokens × V × a
    const double N = (double)m->tokens, H = mc->hidden, F = mc->ffn, E = mc->experts, k = mc->top_k;
    const double Hq = mc->heads, Hkv = mc->kv_heads, D = H / Hq, V = mc->vocab_size, R = N * k;
    const double slack = m->ep > 1 ? 1.25 : 1.0;  // moe.c: rows beyond N·k arrive only with EP > 1
    const double sR = slack * R, El = m->e_local;
    const double kept_h = !c->train.keep_swiglu         ? 0
                          : c->precision.fp8 == FP8_NONE ? sR * F * a
                                                         : F * (sR + 15 * El) + 4 * F * (floor(sR / 128) + El) + 512 * (El + 1);
    const double per_layer = a * N * (4 * H + 2 * Hq * D + 2 * Hkv * D) + f4 * N * (2 + Hq + 2 * E + 3 * k) +
                             sR * ((H + 2 * F) * a + 4) + kept_h;
    m->act_saved = per_layer * mc->layers + a * N * 2 * H + f4 * 3 * N;
    m->kept_swiglu = kept_h * mc->layers;
    const double wide = H > Hq * D ? H : Hq * D;
    const double moe_scratch = slack * (R * (F + (c->parallel.ep > 1 ? 4 : 1) * H) * a + 8 * R);
    const double nt = (double)((c->train.seq_len + 63) / 64);
    const double ds = a == 2 ? 8192.0 * c->train.micro_batch * Hq * (nt * (nt + 1) / 2) : 0;
    m->moe_room = moe_scratch;
    m->moe_arena = ds > moe_scratch && ds <= 2 * moe_scratch ? ds : moe_scratch;
    m->act_scratch = a * N * (2 * wide + H + Hq * D + 2 * Hkv * D + E + k * H) + f4 * N * (E + 2 * k) + m->moe_arena;
    // inference: one layer's saved set (no h kept), the final x / norm / tokens, the fused q|k|v
    // projection, the send buffer and its weights, the MoE per-layer scratch (no dS)
    m->infer_act = per_layer - kept_h + a * N * 2 * H + f4 * 3 * N +
                   a * N * (Hq * D + 2 * Hkv * D + k * H) + f4 * N * k + moe_scratch;
    double chunk = (double)(int64_t)(MODEL_HEAD_CHUNK_BYTES / (size_t)(V * a));
    if (chunk < 1) chunk = 1;
    if (chunk > N) chunk = N;
    m->logits = (double)(int64_t)chunk * V * a;
}

// precision.fp8: the workspace moe.c plans into its per-layer scratch, the largest of one layer's
// expert FP8 GEMMs (rows R = N·k, + R/4 with EP > 1) and, with fp8=linear, the attention
// projections'. Per call the quantised operands: e4m3 codes and fp32 scales of op(A) [M,K] in 1×128
// tiles and of op(B)ᵀ [N,K] in 128×128 blocks (weights) or 1×128 tiles (weight gradients: dYᵀ and Xᵀ
// along the tokens), each piece 256-byte aligned. The CPU backend quantises every row at once and
// adds the fp32 product [M,N] (cpu_gemm_fp8.c: exact there). On GPUs an estimate: the CUDA backend
// takes the rows (the tokens of a weight gradient) PLAN_FP8_GPU_ROWS at a time and needs no product
// buffer except for a bf16 C with beta ≠ 0 and a weight gradient's sums over several such chunks;
// its fp8_ws_bytes decides.
// Placed as moe.c places it: the expert GEMMs' beside the layer's rows (moe_room), the projections'
// alone; the scratch grows only past what it holds already (moe_arena: the attention backward's dS
// room in bf16), so fp8_extra, not fp8_ws, is what FP8 adds to a rank's memory.
#define PLAN_FP8_GPU_ROWS 4096.0
static double al256(double x) { return (double)(((uint64_t)x + 255) / 256 * 256); }
static double tiles(double n) { return (double)(((uint64_t)n + 127) / 128); }
static double q8(double R, double C, int blk) { return al256(R * C) + al256(4 * (blk ? tiles(R) : R) * tiles(C)); }
static double rows_at_once(double M, int cpu) { return cpu || M < PLAN_FP8_GPU_ROWS ? M : PLAN_FP8_GPU_ROWS; }
static double ws_gemm(double M, double N, double K, int cpu) {
    M = rows_at_once(M, cpu);
    return q8(M, K, 0) + q8(N, K, 1) + (cpu ? al256(4 * M * N) : 0);
}
// A weight gradient over more rows than the CUDA backend takes at once sums a bf16 dB's chunks in
// fp32: up to PLAN_FP8_GPU_ACC bytes of it, whole rows of dB (a multiple of 8 of them).
#define PLAN_FP8_GPU_ACC (256.0 * 1024 * 1024)
static double ws_wgrad(double M, double N, double K, int cpu) {
    double acc = 0;
    if (!cpu && M > PLAN_FP8_GPU_ROWS) {
        double rows = (double)((int64_t)(PLAN_FP8_GPU_ACC / (4 * K)) / 8 * 8);
        acc = 4 * K * (rows < 8 ? 8 : rows < N ? rows : N);
    }
    M = rows_at_once(M, cpu);
    return q8(N, M, 0) + q8(K, M, 0) + (cpu ? al256(4 * N * K) : 0) + al256(acc);
}
static double dmax(double a, double b) { return a > b ? a : b; }

static double grow(double need, double have) { return need > have ? need - have : 0; }

static void plan_fp8(const Config* c, PlanMemory* m) {
    if (c->precision.fp8 == FP8_NONE) return;
    const ModelConfig* mc = &c->model;
    const int cpu = c->train.device == DEVICE_CPU;
    const int64_t R0 = m->tokens * mc->top_k;
    const double R = (double)(m->ep > 1 ? R0 + R0 / 4 : R0), H = mc->hidden, F = mc->ffn, N = (double)m->tokens;
    const double fw = dmax(ws_gemm(R, 2 * F, H, cpu), ws_gemm(R, H, F, cpu)) + 256;         // forward: w13, w2
    const double bw = dmax(dmax(ws_wgrad(R, H, F, cpu), ws_gemm(R, F, H, cpu)),             // w2 backward
                           dmax(ws_wgrad(R, 2 * F, H, cpu), ws_gemm(R, H, 2 * F, cpu))) + 256;  // w13 backward
    double pw = 0;  // the attention projections' (fp8=linear)
    if (c->precision.fp8 == FP8_LINEAR) {
        const double D = H / mc->heads, QD = mc->heads * D, QKV = (mc->heads + 2 * mc->kv_heads) * D;
        const double p[] = {ws_gemm(N, QKV, H, cpu), ws_gemm(N, H, QD, cpu), ws_gemm(N, QD, H, cpu),
                            ws_gemm(H, QD, N, cpu),  ws_gemm(QKV, H, N, cpu), ws_gemm(N, H, QKV, cpu)};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) pw = dmax(pw, p[i] + 256);
    }
    const double ew = dmax(fw, bw);
    m->fp8_ws = dmax(ew, pw);
    m->fp8_extra = grow(dmax(m->moe_room + ew, pw), m->moe_arena);
    m->fp8_infer_extra = grow(dmax(m->moe_room + fw, pw), m->moe_room);  // no backward, no dS room
    // kept weight codes (config_fp8_wcodes): each local expert's w13 [2F, H] and w2 [H, F] as 1-byte
    // codes in two layouts, and their fp32 scales (one per 128×128 block, each layout). model.c puts
    // them in the expert gradient arena past its gradients: with bf16 gradients that is the fp32-sized
    // arena's unused half, so only what exceeds it is added.
    if (config_fp8_wcodes(c, m->world)) {
        const double blocks = 2 * ceil(2 * F / 128) * ceil(H / 128) + ceil(H / 128) * ceil(F / 128);
        m->fp8_wcodes_kept = (double)mc->layers * m->e_local * 2 * (3 * H * F + 4 * blocks);
        const double room = config_expert_grad_bf16(c, m->world) ? 2.0 * (double)m->expert : 0;
        m->fp8_wcodes = m->fp8_wcodes_kept > room ? m->fp8_wcodes_kept - room : 0;
    }
}

// What a GPU run holds besides the model.
static void plan_runtime(const Config* c, int world, PlanMemory* m) {
    // GPU runs: the CUDA context, cuBLASLt's workspace and the op scratch, NCCL's buffers
    if (c->train.device == DEVICE_CPU) return;
    m->cuda_context = PLAN_CUDA_CONTEXT_BYTES;
    m->lib_workspace = (double)CUDA_LT_WS_BYTES + (double)CUDA_SCRATCH_BYTES;
    if (c->parallel.comm != COMM_MPI) {
        // comm_nccl.c: one communicator per group of > 1 rank; a group with the world's
        // members (ep = world, or edp when ep = 1) shares the world's
        m->nccl_comms = (world > 1) + (m->ep > 1 && m->ep < world) + (m->edp > 1 && m->edp < world);
        m->nccl = m->nccl_comms ? PLAN_NCCL_BASE_BYTES + m->nccl_comms * PLAN_NCCL_COMM_BYTES : 0;
    }
}

int plan_memory(const Config* c, int world, PlanMemory* m, Err* e) {
    if (world <= 0) world = c->parallel.ep;
    if (config_validate(c, world, e)) return -1;
    memset(m, 0, sizeof *m);
    const ModelConfig* mc = &c->model;
    const ParamCounts pc = params_count(mc);
    m->world = world;
    m->ep = c->parallel.ep;
    m->edp = world / m->ep;
    m->e_local = mc->experts / m->ep;
    m->grad_accum = c->train.global_batch / (c->train.micro_batch * world);
    m->tokens = (int64_t)c->train.micro_batch * c->train.seq_len;
    m->dense = pc.dense;
    m->expert = pc.expert / m->ep;

    // Compute dtype: bf16 on GPUs when asked; the CPU backend always computes in fp32.
    const double a = c->precision.dtype == DTYPE_BF16 && c->train.device != DEVICE_CPU ? 2 : 4;
    plan_state(c, world, a, m);
    plan_activations(c, a, m);
    plan_runtime(c, world, m);
    plan_fp8(c, m);
    m->total = m->weights + m->master + m->grads + m->adam + m->act_saved + m->act_scratch + m->logits + m->fp8_extra +
               m->fp8_wcodes + m->cuda_context + m->lib_workspace + m->nccl;
    m->infer_total = m->weights + m->infer_act + m->logits + m->fp8_infer_extra + m->cuda_context + m->lib_workspace +
                     m->nccl;
    return 0;
}

static double gib(double b) { return b / (double)(1ull << 30); }

// Small models in MiB, others in GiB (the runtime's fixed rows not counted in that choice).
static const char* report_unit(const PlanMemory* m, double* scale) {
    const int mib = gib(m->total - m->cuda_context - m->lib_workspace - m->nccl) < 1;
    *scale = mib ? 1024 : 1;
    return mib ? "MiB" : "GiB";
}

// The FP8 row's note: the mode, and where the workspace went when the scratch held some of it.
static void report_fp8_note(const Config* c, const PlanMemory* m, double scale, const char* unit, FILE* f) {
    fprintf(f, "   (precision.fp8=%s%s", fp8_mode_name(c->precision.fp8), c->train.device != DEVICE_CPU ? ", estimate" : "");
    if (m->fp8_extra == 0)
        fprintf(f, ": %.2f %s, held by the activation scratch's room for the attention backward", gib(m->fp8_ws) * scale,
                unit);
    else if (m->fp8_extra < m->fp8_ws)
        fprintf(f, ": %.2f %s, %.2f %s of it in the activation scratch", gib(m->fp8_ws) * scale, unit,
                gib(m->fp8_ws - m->fp8_extra) * scale, unit);
    fprintf(f, ")");
}

// The model, its FLOPs and the layout (plan_report's first lines).
static void report_model(const Config* c, const PlanMemory* m, FILE* f) {
    const ModelConfig* mc = &c->model;
    const ParamCounts pc = params_count(mc);
    char tot[32], act[32], den[32], ex[32], emb[32], loc[32], tok[32];
    plan_thousands(pc.total, tot, sizeof tot);
    plan_thousands(pc.active, act, sizeof act);
    plan_thousands(pc.dense, den, sizeof den);
    plan_thousands(pc.expert, ex, sizeof ex);
    plan_thousands(pc.embed, emb, sizeof emb);
    plan_thousands(m->dense + m->expert, loc, sizeof loc);
    plan_thousands((int64_t)c->train.global_batch * c->train.seq_len, tok, sizeof tok);
    const double flops = params_train_flops_per_token(mc, c->train.seq_len);
    fprintf(f, "config: %s\n", c->source[0] ? c->source : "(defaults)");
    fprintf(f, "model: %d layers, hidden %d, ffn %d, heads %d (kv %d), %d experts top-%d, vocab %d\n", mc->layers,
            mc->hidden, mc->ffn, mc->heads, mc->kv_heads, mc->experts, mc->top_k, mc->vocab_size);
    fprintf(f, "parameters:        %s total (%s dense incl. %s embedding, %s in experts)\n", tot, den, emb, ex);
    fprintf(f, "active per token:  %s (top-%d of %d experts)\n", act, mc->top_k, mc->experts);
    fprintf(f, "training FLOPs per token: %.4g (6 × active matmul params + causal attention at seq %d)\n",
            flops, c->train.seq_len);
    fprintf(f, "step: %s tokens = global_batch %d × seq_len %d; %.3g FLOPs per step\n", tok, c->train.global_batch,
            c->train.seq_len, flops * (double)c->train.global_batch * c->train.seq_len);
    fprintf(f, "\nlayout: world %d = ep %d x edp %d; %d of %d experts per rank; micro_batch %d x seq_len %d, "
            "gradient accumulation %d\n", m->world, m->ep, m->edp, m->e_local, mc->experts, c->train.micro_batch,
            c->train.seq_len, m->grad_accum);
    fprintf(f, "memory per rank (%s parameters held: dense replicated + local experts; ZeRO-1 %s):\n", loc,
            c->parallel.zero1 ? "on" : "off");
}

// The per-rank memory table, one row per PlanMemory field (the FP8 row with fp8 on, the CUDA rows on GPUs).
static void report_memory_rows(const Config* c, const PlanMemory* m, FILE* f) {
    const int a = c->precision.dtype == DTYPE_BF16 && c->train.device != DEVICE_CPU ? 2 : 4;
    struct { const char* what; double bytes; } rows[] = {
        {a == 2 ? "weights (bf16 compute copy)" : "weights (fp32 compute copy)", m->weights},
        {m->split_master ? "fp32 masters: 16-bit remainders" : "fp32 master weights", m->master},
        {"gradients (fp32)", m->grads},
        {"Adam m + v (fp32)", m->adam},
        {"activations saved for backward", m->act_saved},
        {"activation scratch (one layer)", m->act_scratch},
        {"lm_head logits chunk", m->logits},
        {"FP8 GEMM workspace", m->fp8_extra},
        {"FP8 expert weight codes", m->fp8_wcodes},
        {"CUDA context + kernels (estimate)", m->cuda_context},
        {"cuBLASLt workspace + op scratch", m->lib_workspace},
        {"NCCL (estimate)", m->nccl},
    };
    double scale;
    const char* unit = report_unit(m, &scale);
    const int on_gpu = c->train.device != DEVICE_CPU;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (i == 7 && m->fp8_ws == 0) continue;  // precision.fp8=none
        if (i == 8 && m->fp8_wcodes_kept == 0) continue;  // none kept (per_gemm)
        if (i >= 9 && !on_gpu) break;  // the CUDA rows: GPU runs only
        if (i == 11 && m->nccl == 0) continue;
        fprintf(f, "  %-34s %9.2f %s", rows[i].what, gib(rows[i].bytes) * scale, unit);
        if (i == 7) report_fp8_note(c, m, scale, unit, f);
        if (i == 8 && m->fp8_wcodes < m->fp8_wcodes_kept)
            fprintf(f, "   (both layouts, kept across a step: %.2f %s, in the bf16 expert gradients' unused half)",
                    gib(m->fp8_wcodes_kept) * scale, unit);
        else if (i == 8)
            fprintf(f, "   (both layouts, kept across a step's micro-batches)");
        if (i == 11) fprintf(f, "   (%d communicator%s of > 1 rank)", m->nccl_comms, m->nccl_comms == 1 ? "" : "s");
        fprintf(f, "\n");
    }
}

// What the table leaves out, the total, inference, and the verdict against the GPU's memory.
static void report_memory_total(const Config* c, const PlanMemory* m, int world, double gpu_gib, FILE* f) {
    const ModelConfig* mc = &c->model;
    double scale;
    const char* unit = report_unit(m, &scale);
    const int on_gpu = c->train.device != DEVICE_CPU;
    if (on_gpu && c->parallel.comm == COMM_MPI)
        fprintf(f, "  %-34s %9s       (parallel.comm=mpi: staging in page-locked host memory, the largest message)\n",
                "NCCL", "none");
    if (on_gpu && c->checkpoint.async)
        fprintf(f, "  (checkpoint.async: plus %.2f GiB of page-locked host memory per rank for the snapshot)\n",
                gib(4.0 * (c->checkpoint.save_optimizer ? 3 : 1) *
                    ((c->parallel.zero1 && world > 1 ? (double)m->dense / world : (double)m->dense) +
                     (c->parallel.zero1 && m->edp > 1 ? (double)m->expert / m->edp : (double)m->expert))));
    if (on_gpu)
        fprintf(f, "  %-34s %9.2f %s   (GPU: %.1f GiB%s)\n", "total", gib(m->total) * scale, unit, gpu_gib,
                m->ep > 1 ? "; not counted: routing imbalance beyond 25%" : "");
    else
        fprintf(f, "  %-34s %9.2f %s   (host memory of one rank on the CPU backend%s)\n", "total", gib(m->total) * scale,
                unit, m->ep > 1 ? "; not counted: routing imbalance beyond 25%" : "");
    fprintf(f, "  %-34s %9.2f %s   (weights, one layer's forward buffers at micro_batch x seq_len; no masters, "
            "gradients or Adam state; generate adds its KV cache)\n", "inference (eval/generate)",
            gib(m->infer_total) * scale, unit);
    if (m->kept_swiglu > 0)
        fprintf(f, "  (train.keep_swiglu: %.2f %s of the saved activations are the experts' SwiGLU output%s, %.2f %s per "
                "layer)\n", gib(m->kept_swiglu) * scale, unit, c->precision.fp8 != FP8_NONE ? " as FP8 codes" : "",
                gib(m->kept_swiglu / mc->layers) * scale, unit);
    if (!on_gpu)
        fprintf(f, "host memory (train.device=cpu): %.2f %s per rank, %.2f %s for the %d ranks together\n",
                gib(m->total) * scale, unit, gib(m->total) * scale * world, unit, world);
    else if (gib(m->total) > gpu_gib)
        fprintf(f, "WARNING: %.1f GiB per rank exceeds the %.1f GiB GPU: raise parallel.ep or the world size (--world), "
                "or lower train.micro_batch or train.seq_len\n", gib(m->total), gpu_gib);
    else
        fprintf(f, "fits: %.2f GiB of %.1f GiB (%.1f GiB to spare)\n", gib(m->total), gpu_gib, gpu_gib - gib(m->total));
}

int plan_report(const Config* c, int world, double gpu_gib, FILE* f, Err* e) {
    PlanMemory m;
    if (plan_memory(c, world, &m, e)) return -1;
    report_model(c, &m, f);
    report_memory_rows(c, &m, f);
    report_memory_total(c, &m, world, gpu_gib, f);
    return 0;
}
