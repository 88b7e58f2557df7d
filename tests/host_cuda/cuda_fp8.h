// cuda_fp8.h, as the host stand-in sees it (cuda_host.h says what this directory is): the one
// conversion the quantisers use, as the spec's fp8_e4m3_from_f32 (round to nearest even,
// satfinite), which the GPU tests find equal to the device's.
#pragma once
#include "cuda_host.h"

enum { __NV_SATFINITE = 1, __NV_E4M3 = 2 };
static inline unsigned short __nv_cvt_float2_to_fp8x2(float2 v, int, int) {
    return (unsigned short)(fp8_e4m3_from_f32(v.x) | fp8_e4m3_from_f32(v.y) << 8);
}
