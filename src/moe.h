// moe.h — the sparse MoE block: router, token dispatch over the EP group, grouped SwiGLU
// experts, weighted combine; forward and backward.
#pragma once
#include "model.h"

void moe_saved_alloc(Model* m, MoeSaved* s);
void moe_saved_free(Model* m, MoeSaved* s);
// Plans the bump arenas for balanced routing (grown on demand); with precision.fp8 the per-layer
// scratch also holds the FP8 GEMMs' workspace (m->fp8_ws, the larger of the expert GEMMs' and
// proj_fp8_ws, the attention projections', model.c): the expert GEMMs' beside the layer's rows, the
// projections' alone, growing the arena only past what it holds already.
void moe_plan_bumps(Model* m, size_t proj_fp8_ws);
// With train.keep_swiglu and precision.fp8 a layer keeps h's FP8 codes for w2's weight gradient
// instead of h (MoeSaved.hq): half the bytes, and no pass of the backward reads h.
int moe_keeps_hq(const Model* m);
// out[N,H] = res[N,H] + moe(x[N,H]) for layer l (res may be out: +=); saves what the backward
// needs in m->ls[l].moe.
void moe_forward(Model* m, int l, const void* x, const void* res, void* out);
// dout[N,H] = dL/d out; writes dx[N,H] = dL/dx (overwrites). Accumulates weight gradients.
void moe_backward(Model* m, int l, const void* dout, void* dx);

// The token exchange alone (tests), with the routing of the last moe_forward saved in s. Rows are
// w bytes wide. Dispatch: send [N·k rows, the expert-major order of moe_index over all E experts]
// → dst [s->R rows, expert-major over this rank's experts, source EP rank ascending within one].
// Combine is its inverse: src [s->R rows] → recv [N·k rows]. scratch: [s->R rows]. Collective
// over the EP group; with ep = 1 both are copies.
void moe_dispatch_rows(Model* m, const MoeSaved* s, void* dst, const void* send, void* scratch, size_t w);
void moe_combine_rows(Model* m, const MoeSaved* s, void* recv, const void* src, void* scratch, size_t w);
