// cuda_gemm.cuh — cuda_gemm.cu's plan for one exact GEMM shape, outside its plan cache: the
// matmul descriptor, the three layouts (cuBLASLt's A = our B, its B = our A, C/D) and the algorithm
// the step would run (the heuristic's first pick, or the tile table's). For the surveys
// (dev/cuda/cuda_gemm_survey.cu); the caller releases it.
#pragma once
#include "cuda_common.cuh"

typedef struct GemmShapePlan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} GemmShapePlan;

void gemm_shape_plan(Backend* be, const GemmDesc* d, GemmShapePlan* p);
void gemm_shape_plan_release(GemmShapePlan* p);
