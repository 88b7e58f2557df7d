// plan.c — `moetrain plan`: parameters, FLOPs per token and memory per rank, without a GPU.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "params.h"

static void commas(char* out, size_t n, long long v) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%lld", v);
    size_t len = strlen(tmp), o = 0;
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) out[o++] = ',';
        out[o++] = tmp[i];
    }
    out[o] = 0;
}

static double gib(double bytes) { return bytes / (double)(1ull << 30); }

int cmd_plan(int argc, char** argv) {
    Config c;
    Err e = {{0}};
    int rest[64], nrest = 0;
    if (cli_load_config(&c, argc, argv, 1, rest, &nrest, &e)) return cli_error(&e);
    int world = c.parallel.ep;
    double gpu_gib = 141e9 / (double)(1ull << 30);  // H200: 141 GB
    for (int i = 0; i < nrest; i++) {
        const char* f = argv[rest[i]];
        const char* v = i + 1 < nrest ? argv[rest[i + 1]] : NULL;
        if (!strcmp(f, "--world") && v) world = atoi(v), i++;
        else if (!strcmp(f, "--gpu-mem") && v) gpu_gib = atof(v), i++;
        else {
            fprintf(stderr, "moetrain plan: unknown option %s (options: --world N, --gpu-mem GiB)\n", f);
            return 2;
        }
    }
    if (config_validate(&c, world, &e)) return cli_error(&e);
    const ModelConfig* m = &c.model;
    ParamCounts pc = params_count(m);
    char s1[64], s2[64], s3[64], s4[64];
    commas(s1, sizeof s1, pc.total);
    commas(s2, sizeof s2, pc.active);
    commas(s3, sizeof s3, pc.dense);
    commas(s4, sizeof s4, pc.expert);
    printf("config: %s\n", c.source);
    printf("parameters: %s total (%s dense, %s in experts)\n", s1, s3, s4);
    printf("active per token: %s (top-%d of %d experts)\n", s2, m->top_k, m->experts);
    printf("training FLOPs per token: %.1f GFLOP (6 x active matmul params + causal attention, seq %d)\n",
           params_train_flops_per_token(m, c.train.seq_len) / 1e9, c.train.seq_len);

    const int ep = c.parallel.ep, edp = world / ep;
    const double wsz = c.precision.dtype == DTYPE_BF16 ? 2 : 4;
    const double dense = (double)pc.dense, expert_local = (double)pc.expert / ep;
    const double held = dense + expert_local;  // parameters on one rank
    const double master = (c.parallel.zero1 ? dense / world + expert_local / edp : held) * 4;
    const double adam = 2 * master;
    const double weights = held * wsz;
    const double grads = held * 4;
    // Saved activations per layer for N = micro_batch x seq_len tokens (what model.c keeps):
    // x_in, ln1, x_mid, ln2 [N,H]; q, att [N,Hq*D]; k, v [N,Hkv*D]; lse, rstd (fp32, small);
    // router logits and probs [N,E] fp32; received MoE rows (N*k balanced): xe [R,H], gu [R,2F].
    const double N = (double)c.train.micro_batch * c.train.seq_len;
    const double H = m->hidden, F = m->ffn, D = (double)m->hidden / m->heads;
    const double R = N * m->top_k;
    const double per_layer = N * (4 * H + 2 * m->heads * D + 2 * m->kv_heads * D) * wsz +
                             N * 2 * m->experts * 4 + R * (H + 2 * F) * wsz + R * 4;
    const double scratch = R * (2 * H + 3 * F) * wsz + N * m->vocab_size * wsz;  // one layer + logits
    const double acts = per_layer * m->layers + scratch;
    const double total = weights + master + adam + grads + acts;
    printf("\nmemory per rank: world %d = ep %d x edp %d, %s weights, ZeRO-1 %s, micro-batch %d x %d tokens\n",
           world, ep, edp, dtype_name(c.precision.dtype), c.parallel.zero1 ? "on" : "off", c.train.micro_batch,
           c.train.seq_len);
    printf("  %-34s %10.2f GiB\n", "weights (compute dtype)", gib(weights));
    printf("  %-34s %10.2f GiB\n", "fp32 master weights", gib(master));
    printf("  %-34s %10.2f GiB\n", "Adam moments (fp32 m, v)", gib(adam));
    printf("  %-34s %10.2f GiB\n", "gradients (fp32)", gib(grads));
    printf("  %-34s %10.2f GiB\n", "activations (estimate)", gib(acts));
    printf("  %-34s %10.2f GiB\n", "total", gib(total));
    if (gib(total) > gpu_gib)
        printf("WARNING: %.1f GiB per rank does not fit a %.1f GiB GPU: raise parallel.ep or the world size, "
               "lower train.micro_batch or train.seq_len\n", gib(total), gpu_gib);
    else
        printf("fits a %.1f GiB GPU with %.1f GiB to spare\n", gpu_gib, gpu_gib - gib(total));
    return 0;
}
