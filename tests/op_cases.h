// op_cases.h — the shapes each op family is tested at: one table per family, read by the CPU
// tests (tests/test_cpu_<source>.c: direct formulas and finite differences) and by the GPU tests
// (tests/gpu/: each CUDA op against the CPU spec), so that a shape added for one is in view of
// the other.
//
// A row's `where` says which test runs it. CASE_CPU rows are small enough for the CPU checks
// (finite differences re-run the forward a few times per variable; the attention reference is
// O(T²) in double); CASE_GPU rows are what the kernels must handle: tails after vector widths,
// odd sizes, one tile and many, the model's own widths. CASE_GPU_LONG rows are GPU rows that
// only `test_cuda_attn --long` runs (slow under the sanitizers). A row may carry several bits.
#pragma once
#include <stddef.h>

enum { CASE_CPU = 1, CASE_GPU = 2, CASE_GPU_LONG = 4 };
#define N_CASES(table) ((int)(sizeof(table) / sizeof((table)[0])))

// ---- norm: RMSNorm and embedding (src/cpu/cpu_norm.c, cuda/cuda_norm.cu) ----------------------

typedef struct RmsnormCase {
    int N, H;
    int where;
    const char* why;
} RmsnormCase;
static const RmsnormCase RMSNORM_CASES[] = {
    {9, 37, CASE_CPU, "H odd: no vector width divides a row"},
    {300, 200, CASE_GPU, "many rows"},
    {7, 4099, CASE_GPU, "a tail after the vector loads"},
    {130, 4096, CASE_GPU, "Mixtral's hidden size"},
    {9, 6144, CASE_GPU, "wider than one block's chunk"},
};

typedef struct EmbedCase {
    int V, H, N;  // vocabulary, width, tokens
    int where;
    const char* why;
} EmbedCase;
static const EmbedCase EMBED_CASES[] = {
    {11, 70, 40, CASE_CPU, "tokens repeat, odd rows of the table unused"},
    {50, 72, 61, CASE_GPU, "more tokens than rows"},
    {13, 37, 40, CASE_GPU, "H = 37: rows not 16-byte multiples"},
};

// ---- rope (src/cpu/cpu_attn.c, cuda/cuda_rope.cu) ---------------------------------------------

typedef struct RopeCase {
    int B, T, Hq, Hkv, D;  // Hkv = 0: q alone
    float theta;
    int where;
    const char* why;
} RopeCase;
static const RopeCase ROPE_CASES[] = {
    {2, 13, 3, 0, 10, 1e4f, CASE_CPU, "one tensor, 5 pairs per head"},
    {2, 9, 4, 2, 6, 1e4f, CASE_CPU, "the fused q/k/v rows: q, k rotated, v copied"},
    {2, 300, 3, 1, 16, 1e6f, CASE_GPU, "bf16: the 8-pair kernel"},
    {1, 70, 4, 2, 128, 1e4f, CASE_GPU, "Mixtral's head dim"},
    {1, 2000, 1, 0, 64, 1e6f, CASE_GPU, "q alone, long positions"},
    {2, 50, 2, 1, 12, 1e4f, CASE_GPU, "D = 12: the scalar kernel"},
};

// ---- attention (src/cpu/cpu_attn.c, cuda/cuda_attn*.cu) ---------------------------------------

typedef struct AttnCase {
    int B, T, Hq, Hkv, D;
    float scale;  // q and k are drawn N(0, scale²): > 1 gives sharp softmaxes (the CPU checks then
                  // skip finite differences and compare the forward at TOL_ATTN_BIG)
    int where;
    const char* why;
} AttnCase;
static const AttnCase ATTN_CASES[] = {
    {2, 70, 6, 2, 8, 1.f, CASE_CPU, "GQA 3:1, T > one key block, not 2^n"},
    {1, 23, 4, 4, 5, 1.f, CASE_CPU, "MHA, odd head dim"},
    {1, 19, 3, 1, 16, 1.f, CASE_CPU, "MQA"},
    {1, 150, 2, 1, 8, 6.f, CASE_CPU, "scores in the hundreds: online softmax rescaling, 3 blocks"},
    {2, 100, 4, 2, 64, 1.f, CASE_GPU, "T not a multiple of 64, GQA 2:1"},
    {1, 130, 4, 1, 128, 1.5f, CASE_GPU, "Mixtral's head dim, multi-query"},
    {1, 77, 2, 2, 16, 1.f, CASE_GPU, "L0_sanity's head dim"},
    {1, 50, 3, 1, 40, 1.f, CASE_GPU, "a head dim without a tensor-core kernel: the simple path"},
    {1, 520, 2, 1, 128, 1.f, CASE_GPU, "many key tiles: the online softmax across tiles"},
    {1, 64, 8, 8, 32, 2.f, CASE_GPU, "exactly one tile, sharp softmax"},
    {2, 200, 8, 2, 128, 1.f, CASE_GPU, "Mixtral's GQA 4:1, two sequences, a ragged last tile"},
    {1, 192, 4, 2, 64, 2.f, CASE_GPU, "D = 64, T a multiple of 64, sharp softmax"},
    {1, 300, 2, 2, 128, 2.f, CASE_GPU, "D = 128 without GQA, 300 = 2·128 + 44"},
    {1, 2048, 4, 1, 128, 1.f, CASE_GPU_LONG, "long"},
};

// ---- gemm (src/cpu/cpu_gemm.c, cuda/cuda_gemm.cu) ---------------------------------------------

// One GemmDesc (backend.h) and its buffers. The CPU reference test takes M, N, K from its rows and
// runs every transpose, padding, alpha/beta pair and c_in choice on each; a GPU row is one call.
typedef struct GemmOpCase {
    int M, N, K, ta, tb, lda, ldb, ldc;  // ld 0 = packed
    float alpha, beta;
    int c_f32;
    int cin;  // the addend from a separate buffer (GemmDesc.c_in)
    int where;
    const char* why;
} GemmOpCase;
static const GemmOpCase GEMM_CASES[] = {
    {5, 7, 6, 0, 0, 0, 0, 0, 1.f, 0.f, 0, 0, CASE_CPU, "tiny"},
    {37, 53, 300, 0, 0, 0, 0, 0, 1.f, 0.f, 0, 0, CASE_CPU, "K crossing the CPU's KC = 256 slice"},
    {130, 530, 70, 0, 0, 0, 0, 0, 1.f, 0.f, 0, 0, CASE_CPU, "M crossing MC = 64 blocks, N the NC = 512 block"},
    {64, 64, 1, 0, 0, 0, 0, 0, 1.f, 0.f, 0, 0, CASE_CPU, "K = 1"},
    {3, 17, 257, 0, 0, 0, 0, 0, 1.f, 0.f, 0, 0, CASE_CPU, "edge tiles (M % 4, N % 16 ≠ 0)"},
    {37, 53, 70, 0, 0, 0, 0, 0, 1.f, 0.f, 0, 0, CASE_GPU, "odd sizes, every transpose"},
    {37, 53, 70, 0, 1, 0, 0, 0, 1.f, 0.f, 0, 0, CASE_GPU, "odd sizes, every transpose"},
    {37, 53, 70, 1, 0, 0, 0, 0, 1.f, 0.5f, 0, 0, CASE_GPU, "odd sizes, every transpose"},
    {37, 53, 70, 1, 1, 0, 0, 0, 0.7f, 1.f, 0, 0, CASE_GPU, "odd sizes, every transpose"},
    {64, 96, 128, 0, 1, 136, 136, 104, 1.f, 0.f, 1, 0, CASE_GPU, "padded strides, fp32 C"},
    {128, 64, 256, 1, 0, 0, 0, 0, 1.f, 1.f, 1, 0, CASE_GPU, "a weight gradient: C += Aᵀ B"},
    {300, 8, 64, 0, 1, 0, 0, 0, 1.f, 0.f, 1, 0, CASE_GPU, "router logits: N = experts"},
    {40, 24, 0, 0, 1, 0, 0, 0, 1.f, 0.5f, 0, 0, CASE_GPU, "K = 0: C = beta·C"},
    {256, 512, 384, 0, 1, 0, 0, 0, 1.f, 0.f, 0, 0, CASE_GPU, "a tensor-core sized one"},
    {64, 96, 128, 0, 1, 0, 0, 0, 1.f, 1.f, 0, 1, CASE_GPU, "a residual read from c_in (the o projection)"},
    {37, 53, 70, 1, 0, 0, 0, 60, 0.7f, 0.5f, 1, 1, CASE_GPU, "c_in with fp32 C, padded ldc"},
    {40, 24, 0, 0, 1, 0, 0, 0, 1.f, 0.5f, 0, 1, CASE_GPU, "K = 0 with c_in: C = beta · c_in"},
};

// ---- moe: router, SwiGLU (src/cpu/cpu_moe.c, cuda/cuda_router.cu, cuda/cuda_moe.cu) -----------

typedef struct RouterCase {
    int N, E, k;  // tokens, experts, top-k
    int where;
    const char* why;
} RouterCase;
// (The CPU router checks, tests/test_cpu_moe.c, are written for top-2 and top-3 on their own
// small shapes: ties, separated logits for finite differences.)
static const RouterCase ROUTER_CASES[] = {
    {300, 8, 2, CASE_GPU, "Mixtral's 8 experts, top-2"},
    {129, 40, 3, CASE_GPU, "E not a power of two, odd k"},
    {64, 200, 8, CASE_GPU, "many experts, k = 8"},
};

typedef struct MoeIndexCase {
    int N, k, E;  // tokens, top-k, experts
    int skip;     // an expert no token picks (an empty group), -1: none
    int where;
    const char* why;
} MoeIndexCase;
static const MoeIndexCase MOE_INDEX_CASES[] = {
    {37, 3, 7, 6, CASE_CPU, "odd sizes, the last expert empty"},
    {1000, 2, 8, 5, CASE_GPU, "Mixtral's 8 experts, an empty one inside"},
    {3000, 2, 8, -1, CASE_GPU, "several tiles of the histogram"},
    {77, 1, 3, 0, CASE_GPU, "top-1, the first expert empty"},
    {700, 4, 64, 63, CASE_GPU, "many experts, the last empty"},
};

typedef struct PermuteCase {
    int N, k, E, H;  // tokens, top-k, experts, row width
    int where;
    const char* why;
} PermuteCase;
static const PermuteCase PERMUTE_CASES[] = {
    {37, 3, 7, 9, CASE_CPU, "odd sizes: copies exact, the adjoint pairs"},
    {57, 2, 4, 72, CASE_GPU, "H = 72: 16-byte row copies"},
    {31, 3, 5, 37, CASE_GPU, "H = 37: scalar row copies"},
};

typedef struct SwigluCase {
    int n, F;  // rows, width (gu is [n, 2F])
    int where;
    const char* why;
} SwigluCase;
static const SwigluCase SWIGLU_CASES[] = {
    {11, 13, CASE_CPU, "odd sizes, one saturated sigmoid"},
    {33, 100, CASE_GPU, "F % 8 ≠ 0: the scalar bf16 forward"},
    {5, 1031, CASE_GPU, "a tail"},
    {70, 256, CASE_GPU, "F % 8 = 0: the vectorised bf16 forward"},
    {9, 4800, CASE_GPU, "600 chunks, 2.3 rounds of 256"},
};

// ---- loss: cross-entropy (src/cpu/cpu_loss.c, cuda/cuda_loss.cu) ------------------------------

typedef struct CeCase {
    int n, V;  // rows, vocabulary; every test ignores some rows (target < 0)
    int where;
    const char* why;
} CeCase;
static const CeCase CE_CASES[] = {
    {7, 300, CASE_CPU, "ignored rows (−1, −100), the last class as a target"},
    {20, 32000, CASE_GPU, "Mixtral's vocabulary"},
    {301, 32000, CASE_GPU, "many rows"},
    {7, 997, CASE_GPU, "V prime"},
    {6, 64, CASE_GPU, "V smaller than a block"},
};

// ---- optim: AdamW (src/cpu/cpu_optim.c, cuda/cuda_optim.cu) ----------------------------------

typedef struct AdamwCase {
    size_t n;
    int where;
    const char* why;
} AdamwCase;
static const AdamwCase ADAMW_CASES[] = {
    {257, CASE_CPU, "odd: the parallel loop's last chunk short"},
    {1003, CASE_GPU, "a tail after the 4-wide vectors"},
    {4096, CASE_GPU, "vectors only"},
};
// adamw_split (the split fp32 masters) against adamw, bit for bit
static const AdamwCase ADAMW_SPLIT_CASES[] = {
    {1003, CASE_CPU | CASE_GPU, "a tail after the 8-wide vectors"},
    {4101, CASE_GPU, "a tail after many vectors"},
};

// ---- decode: rope_qkv_at, kv_append, attn_decode (src/cpu/cpu_attn.c, cuda/cuda_decode.cu) -----

// (The CPU checks, tests/test_generate.c, feed one sequence layout in pieces and compare with
// attn_fwd: the same bits by the spec's summation order.)
typedef struct DecodeCase {
    int B, n, Hq, Hkv, D, Tmax;  // sequences, new rows each, heads, head dim, cache length
    int pos[3];                  // [B] the first new row's position per sequence
    int where;
    const char* why;
} DecodeCase;
static const DecodeCase DECODE_CASES[] = {
    {1, 1, 32, 8, 128, 4096, {4000}, CASE_GPU, "batch 1, one new row, a long cache"},
    {3, 5, 6, 2, 64, 300, {0, 17, 250}, CASE_GPU, "prefill-like blocks at different positions"},
    {2, 1, 4, 4, 16, 40, {39, 0}, CASE_GPU, "MHA, the last cache position, a first token"},
    {2, 3, 4, 1, 80, 100, {10, 97}, CASE_GPU, "D not a multiple of 32"},
};
