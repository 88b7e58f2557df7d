// cpu_optim.c — AdamW with PyTorch's semantics (torch.optim.AdamW, decoupled weight decay),
// each element computed in double and stored to fp32:
//   g = fl32(grad · grad_scale)
//   p ← p · (1 − lr·wd)
//   m ← β1 m + (1 − β1) g,  v ← β2 v + (1 − β2) g²       (stored as fp32)
//   p ← p − lr · (m / (1 − β1^step)) / (sqrt(v / (1 − β2^step)) + eps)
// then the act copy param = p when it is a different buffer.
#include <math.h>

#include "cpu.h"

void cpu_adamw(Backend* be, float* master, void* param_, float* m, float* v, const float* grad, size_t n, float lr,
               float b1, float b2, float eps, float wd, float grad_scale, int step) {
    // master, m, v, grad [n] fp32; param [n] act (may be master)
    float* param = param_;
    CHECK(step >= 1, "adamw: step is 1-based, got %d", step);
    const double bc1 = 1.0 - pow((double)b1, step), bc2 = 1.0 - pow((double)b2, step);
    const double decay = 1.0 - (double)lr * wd;
#pragma omp parallel for schedule(static) if (n >= 32768)
    for (size_t i = 0; i < n; i++) {
        const double g = (double)(grad[i] * grad_scale);
        m[i] = (float)((double)b1 * m[i] + (1.0 - b1) * g);
        v[i] = (float)((double)b2 * v[i] + (1.0 - b2) * g * g);
        const double mhat = m[i] / bc1, vhat = v[i] / bc2;
        const float p = (float)((double)master[i] * decay - (double)lr * mhat / (sqrt(vhat) + eps));
        master[i] = p;
        if (param != master) param[i] = p;
    }
}
