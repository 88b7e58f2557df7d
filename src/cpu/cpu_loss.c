// cpu_loss.c — cross-entropy over rows of logits (log-softmax with the max subtracted, in
// double), with the gradient written in place.
#include <math.h>
#include <string.h>

#include "cpu.h"

typedef struct CeArgs {
    float* x;  // [n, V] logits, overwritten by the gradient when gs != 0
    const int32_t* tgt;  // [n]
    int V;
    float gs;  // grad_scale
} CeArgs;

// Rows [lo, hi): returns Σ −log softmax(x_r)[t_r] over rows with t_r >= 0.
static double ce_rows(const void* ctx, size_t lo, size_t hi) {
    const CeArgs* a = ctx;
    const int V = a->V;
    double total = 0;
    for (size_t r = lo; r < hi; r++) {
        float* row = a->x + r * V;
        const int t = a->tgt[r];
        if (t < 0) {
            if (a->gs != 0) memset(row, 0, sizeof(float) * (size_t)V);
            continue;
        }
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        double s = 0;
        for (int j = 0; j < V; j++) s += exp((double)row[j] - mx);
        const double lse = mx + log(s);
        total += lse - row[t];
        if (a->gs != 0) {  // (softmax − onehot) · grad_scale, the −1 applied in double
            for (int j = 0; j < V; j++) row[j] = (float)((exp((double)row[j] - lse) - (j == t)) * a->gs);
        }
    }
    return total;
}

void cpu_cross_entropy(Backend* be, void* logits, float* loss, const int32_t* targets, int n, int V,
                       float grad_scale) {
    // logits [n, V] (act), targets [n], loss [1] (+=)
    for (int r = 0; r < n; r++)  // checked here, on the calling thread, before the parallel part
        CHECK(targets[r] < V, "cross_entropy: target %d at row %d is outside the vocabulary [0, %d)", targets[r], r, V);
    CeArgs a = {logits, targets, V, grad_scale};
    loss[0] = (float)((double)loss[0] + cpu_sum_chunks((size_t)n, 1 + 16384 / (size_t)V, ce_rows, &a));
}
