// moe.h — the sparse MoE block: router, token dispatch over the EP group, grouped SwiGLU
// experts, weighted combine; forward and backward.
#pragma once
#include "model.h"

void moe_saved_alloc(Model* m, MoeSaved* s);
void moe_saved_free(Model* m, MoeSaved* s);
// Plans the bump arenas for balanced routing (grown on demand).
void moe_plan_bumps(Model* m);
// out[N,H] += moe(x[N,H]) for layer l; saves what the backward needs in m->ls[l].moe.
void moe_forward(Model* m, int l, const void* x, void* out);
// dout[N,H] = dL/d out; writes dx[N,H] = dL/dx (overwrites). Accumulates weight gradients.
void moe_backward(Model* m, int l, const void* dout, void* dx);
