// survey.h — what dev/gemm_attn_bench.h and cuda_gemm_survey.cu share: the scale forms
// cuda_gemm_survey_fp8 times (its comment says what each is).
#pragma once
enum { FP8_SURVEY_TENSOR = 0, FP8_SURVEY_BLK = 1, FP8_SURVEY_VEC = 2 };
