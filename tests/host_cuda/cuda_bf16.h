// cuda_bf16.h, as the host stand-in sees it (cuda_host.h says what this directory is): bf16 as its
// bits, converted to fp32 exactly and from fp32 to nearest even (non-finite kept), as the device does.
#pragma once
#include <stdint.h>

extern "C" {
#include "util.h"  // f32_to_bf16, bf16_to_f32
}

struct __nv_bfloat16 {
    uint16_t bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
static inline float __bfloat162float(__nv_bfloat16 h) { return bf16_to_f32(h.bits); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{f32_to_bf16(f)}; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
