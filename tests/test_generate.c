#define _GNU_SOURCE
// test_generate.c — decoding with a KV cache (src/generate.c) on the CPU backend, the spec:
// * the decode ops against the training ops: rope_qkv_at at position 0 is rope_qkv; attn_decode
//   over a cache filled by kv_append gives attn_fwd's rows for any block of new rows (GQA);
// * the model: prefill + one-token steps give, at every position of three sequences of
//   different prompt lengths batched together (right-padded), the logits of a full forward
//   (model_step) of the same tokens, within fp32 rounding;
// * sampling: the filter (temperature, top-k, top-p) as generate.h specifies; draws follow the
//   filtered distribution and repeat with the seed;
// * the SentencePiece reader (hf.h sp_*): BPE and unigram models made by spm_train encode texts
//   to spm_encode's ids, and the pieces decode to spm_decode's text.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "comm.h"
#include "gen_util.h"
#include "generate.h"
#include "hf.h"
#include "model.h"
#include "test.h"

static Backend* be;
static Comm* g_comm;
static Rng rng;

static void randv(float* p, size_t n, float s) {
    for (size_t i = 0; i < n; i++) p[i] = s * rng_normal(&rng);
}

static void test_decode_ops(void) {
    enum { B = 2, T = 11, Hq = 6, Hkv = 2, D = 8, Tmax = 16 };
    const int QKV = (Hq + 2 * Hkv) * D, QD = Hq * D, KD = Hkv * D;
    float* qkv = xmalloc(sizeof(float) * B * T * QKV);
    randv(qkv, (size_t)B * T * QKV, 1.0f);
    float *q = xmalloc(sizeof(float) * B * T * QD), *k = xmalloc(sizeof(float) * B * T * KD),
          *v = xmalloc(sizeof(float) * B * T * KD);
    be->rope_qkv(be, qkv, q, k, v, B, T, Hq, Hkv, D, 10000.f, 0, NULL);
    float* out = xmalloc(sizeof(float) * B * T * QD);
    float* lse = xmalloc(sizeof(float) * B * Hq * T);
    be->attn_fwd(be, out, lse, q, k, v, B, T, Hq, Hkv, D, NULL);
    // rope_qkv_at, position 0 onwards: the same bits as rope_qkv
    float *q2 = xmalloc(sizeof(float) * B * T * QD), *k2 = xmalloc(sizeof(float) * B * T * KD),
          *v2 = xmalloc(sizeof(float) * B * T * KD);
    int32_t zero[B] = {0, 0};
    be->rope_qkv_at(be, qkv, q2, k2, v2, zero, B, T, Hq, Hkv, D, 10000.f);
    EXPECT(!memcmp(q, q2, sizeof(float) * B * T * QD) && !memcmp(k, k2, sizeof(float) * B * T * KD) &&
               !memcmp(v, v2, sizeof(float) * B * T * KD),
           "rope_qkv_at at position 0 differs from rope_qkv");
    // blocks of rows fed in pieces: sequence 0 as 4 + 1 + 6, sequence 1 as 2 + 3 + 6 (rows past
    // a sequence's piece are padding, overwritten by the next piece)
    float* kc = xcalloc((size_t)B * Hkv * Tmax * D, sizeof(float));
    float* vc = xcalloc((size_t)B * Hkv * Tmax * D, sizeof(float));
    const int piece[3][B] = {{4, 2}, {1, 3}, {6, 6}};
    int len[B] = {0, 0};
    double worst = 0;
    int rot_bad = 0;
    for (int st = 0; st < 3; st++) {
        const int n = piece[st][0] > piece[st][1] ? piece[st][0] : piece[st][1];
        float* blk = xcalloc((size_t)B * n * QKV, sizeof(float));
        for (int b = 0; b < B; b++)
            for (int i = 0; i < n; i++) {
                const int t = len[b] + i;
                if (i < piece[st][b]) memcpy(blk + ((size_t)b * n + i) * QKV, qkv + ((size_t)b * T + t) * QKV, sizeof(float) * QKV);
                else randv(blk + ((size_t)b * n + i) * QKV, QKV, 3.0f);  // padding: anything
            }
        float *bq = xmalloc(sizeof(float) * B * n * QD), *bk = xmalloc(sizeof(float) * B * n * KD),
              *bv = xmalloc(sizeof(float) * B * n * KD), *bo = xmalloc(sizeof(float) * B * n * QD);
        int32_t pos[B] = {len[0], len[1]};
        be->rope_qkv_at(be, blk, bq, bk, bv, pos, B, n, Hq, Hkv, D, 10000.f);
        be->kv_append(be, kc, vc, bk, bv, pos, B, n, Hkv, D, Tmax);
        be->attn_decode(be, bo, bq, kc, vc, pos, B, n, Hq, Hkv, D, Tmax);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < piece[st][b]; i++) {
                const int t = len[b] + i;
                rot_bad += memcmp(bq + ((size_t)b * n + i) * QD, q + ((size_t)b * T + t) * QD, sizeof(float) * QD) != 0;
                for (int x = 0; x < QD; x++) {
                    double d = fabs(bo[((size_t)b * n + i) * QD + x] - out[((size_t)b * T + t) * QD + x]);
                    if (!(d <= worst)) worst = d;
                }
            }
        for (int b = 0; b < B; b++) len[b] += piece[st][b];
        free(blk), free(bq), free(bk), free(bv), free(bo);
    }
    EXPECT(rot_bad == 0, "%d rows rotated at an explicit position differ from rope_qkv's", rot_bad);
    EXPECT(worst == 0, "attn_decode differs from attn_fwd by %g (the spec sums in the same order)", worst);
    free(qkv), free(q), free(k), free(v), free(q2), free(k2), free(v2), free(out), free(lse), free(kc), free(vc);
}

// Logits of a full forward (model_step, forward only) of B sequences of T tokens: [B·T, V].
static float* full_logits(const ModelConfig* c, int B, int T, const int32_t* tok, uint64_t seed) {
    Model m;
    model_create(&m, c, B, T, be, g_comm);
    gen_test_weights(&m, seed);
    int32_t* tgt = xcalloc((size_t)B * T, sizeof(int32_t));
    MicroArgs a = {.tokens = tok, .targets = tgt, .backward = 0};
    model_step(&m, &a);
    CHECK(m.head_chunk == B * T, "the test wants one lm_head chunk");
    float* out = xmalloc(sizeof(float) * (size_t)B * T * c->vocab_size);
    memcpy(out, m.s_logits, sizeof(float) * (size_t)B * T * c->vocab_size);
    free(tgt);
    model_free(&m);
    return out;
}

static void test_kv_equals_full(void) {
    ModelConfig c = gen_test_config();
    enum { B = 3, T = 12 };
    const int V = c.vocab_size;
    const int plen[B] = {1, 7, 4};
    int32_t tok[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(rng_u64(&rng) % (uint64_t)V);
    float* ref = full_logits(&c, B, T, tok, 77);

    Model m;
    model_create(&m, &c, B, 7, be, g_comm);  // rows for the longest prompt
    gen_test_weights(&m, 77);
    Gen g;
    gen_create(&g, &m, T + 1);
    // prefill: right-padded to 7 with token 0
    int32_t pre[B * 7];
    int last[B];
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < 7; i++) pre[b * 7 + i] = i < plen[b] ? tok[b * T + i] : 0;
        last[b] = plen[b] - 1;
    }
    gen_forward(&g, pre, 7, plen, last);
    double worst = 0;
    int checked = 0;
    for (int b = 0; b < B; b++) {
        const float* r = ref + ((size_t)b * T + plen[b] - 1) * V;
        for (int x = 0; x < V; x++) worst = fmax(worst, fabs(g.h_logits[(size_t)b * V + x] - r[x]) / (1 + fabs(r[x])));
        checked++;
    }
    // one token per sequence per step; a finished sequence repeats its last position (adv 0)
    for (int step = 0; step < T; step++) {
        int32_t one[B];
        int adv[B], at[B];
        for (int b = 0; b < B; b++) {
            at[b] = g.len[b];
            adv[b] = at[b] < T ? 1 : 0;
            one[b] = at[b] < T ? tok[b * T + at[b]] : 0;
        }
        if (!adv[0] && !adv[1] && !adv[2]) break;
        gen_forward(&g, one, 1, adv, NULL);
        for (int b = 0; b < B; b++) {
            if (!adv[b]) continue;
            const float* r = ref + ((size_t)b * T + at[b]) * V;
            for (int x = 0; x < V; x++) worst = fmax(worst, fabs(g.h_logits[(size_t)b * V + x] - r[x]) / (1 + fabs(r[x])));
            checked++;
        }
    }
    EXPECT(checked == 3 * T - (1 + 7 + 4) + 3, "checked %d positions", checked);
    EXPECT(g.len[0] == T && g.len[1] == T && g.len[2] == T, "lengths %d %d %d", g.len[0], g.len[1], g.len[2]);
    printf("  KV-cache logits vs full forward over %d positions: worst |Δ|/(1+|ref|) = %.3g\n", checked, worst);
    EXPECT(worst <= 1e-5, "KV-cache logits differ from the full forward by %g", worst);
    // the logits really vary (not a constant model)
    double spread = 0;
    for (int x = 0; x < V; x++) spread = fmax(spread, fabs(ref[x] - ref[(size_t)T * V + x]));
    EXPECT(spread > 1e-2, "logits hardly vary (%g): the test would be weak", spread);
    gen_free(&g);
    model_free(&m);
    free(ref);
}

static void test_filter(void) {
    enum { V = 8 };
    const float lg[V] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, 2.0f, -1.0f, 0.0f};
    float p[V];
    // greedy: the first maximum
    EXPECT(gen_filter(lg, V, 0.f, 0, 1.f, p) == 1 && p[1] == 1.f, "greedy keeps index 1 alone");
    // plain softmax at T = 2
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(lg[i] / 2.0);
    EXPECT(gen_filter(lg, V, 2.f, 0, 1.f, p) == V, "no filter keeps all");
    for (int i = 0; i < V; i++) EXPECT(fabs(p[i] - exp(lg[i] / 2.0) / z) < 1e-6, "softmax p[%d] = %g", i, p[i]);
    // top-k 3 at T = 1: indices 1, 3 (tied, both kept) and 5, renormalised
    EXPECT(gen_filter(lg, V, 1.f, 3, 1.f, p) == 3, "top-k 3 keeps 3");
    double s3 = 2 * exp(3.0) + exp(2.0);
    EXPECT(fabs(p[1] - exp(3.0) / s3) < 1e-6 && fabs(p[3] - exp(3.0) / s3) < 1e-6 && fabs(p[5] - exp(2.0) / s3) < 1e-6,
           "top-k 3 probabilities %g %g %g", p[1], p[3], p[5]);
    EXPECT(p[0] == 0 && p[2] == 0 && p[4] == 0 && p[6] == 0 && p[7] == 0, "top-k zeros the rest");
    // top-k 1 on a tie: the lower index
    EXPECT(gen_filter(lg, V, 1.f, 1, 1.f, p) == 1 && p[1] == 1.f, "top-k 1 on a tie keeps index 1");
    // top-p: full softmax masses sorted; the shortest prefix reaching top_p
    double zz = 0, pr[V];
    for (int i = 0; i < V; i++) zz += exp(lg[i]);
    for (int i = 0; i < V; i++) pr[i] = exp(lg[i]) / zz;
    const double two = pr[1] + pr[3], three = two + pr[5];
    EXPECT(gen_filter(lg, V, 1.f, 0, (float)(two - 1e-3), p) == 2, "top-p just under the two largest keeps 2");
    EXPECT(fabs(p[1] - 0.5) < 1e-6 && fabs(p[3] - 0.5) < 1e-6, "top-p 2 renormalises: %g %g", p[1], p[3]);
    EXPECT(gen_filter(lg, V, 1.f, 0, (float)(two + 1e-3), p) == 3, "top-p just over the two largest keeps 3");
    EXPECT(fabs(p[5] - pr[5] / three) < 1e-6, "top-p 3: p[5] %g", p[5]);
    EXPECT(gen_filter(lg, V, 1.f, 0, 1e-6f, p) == 1 && p[1] == 1.f, "a tiny top-p keeps the argmax");
    // top-k then top-p: the mass is the top-k's renormalised one
    EXPECT(gen_filter(lg, V, 1.f, 3, (float)(2 * exp(3.0) / s3 + 1e-3), p) == 3, "top-k 3 then top-p");
    EXPECT(gen_filter(lg, V, 1.f, 3, (float)(2 * exp(3.0) / s3 - 1e-3), p) == 2, "top-k 3 then a smaller top-p");
}

static void test_sampling(void) {
    enum { V = 6, DRAWS = 40000 };
    const float lg[V] = {0.2f, 1.5f, -0.3f, 1.1f, 0.0f, 0.9f};
    float p[V], scratch[V];
    gen_filter(lg, V, 0.8f, 4, 0.9f, p);
    int cnt[V] = {0};
    Rng r1, r2, r3;
    rng_seed(&r1, 5), rng_seed(&r2, 5), rng_seed(&r3, 6);
    int same = 1, differ = 0;
    for (int d = 0; d < DRAWS; d++) {
        const int a = gen_sample(lg, V, 0.8f, 4, 0.9f, scratch, &r1);
        const int b = gen_sample(lg, V, 0.8f, 4, 0.9f, scratch, &r2);
        const int c = gen_sample(lg, V, 0.8f, 4, 0.9f, scratch, &r3);
        same &= a == b;
        differ += a != c;
        cnt[a]++;
    }
    EXPECT(same, "the same seed gave another sequence of draws");
    EXPECT(differ > DRAWS / 10, "another seed gave almost the same draws (%d differ)", differ);
    for (int i = 0; i < V; i++) {
        const double f = (double)cnt[i] / DRAWS, sd = sqrt(p[i] * (1 - p[i]) / DRAWS);
        EXPECT(fabs(f - p[i]) <= 5 * sd + 1e-9, "token %d drawn %.4f of the time, filter says %.4f", i, f, p[i]);
        if (p[i] == 0) EXPECT(cnt[i] == 0, "token %d filtered out but drawn %d times", i, cnt[i]);
    }
    EXPECT(gen_sample(lg, V, 0.f, 0, 1.f, scratch, &r1) == 1, "temperature 0 is the argmax");
}

static void test_sentencepiece(void) {
    if (sh("command -v spm_train >/dev/null && command -v spm_encode >/dev/null && command -v spm_decode >/dev/null")) {
        EXPECT(0, "spm_train/spm_encode/spm_decode not found: run scripts/deps.sh (Debian package sentencepiece)");
        return;
    }
    char dir[] = "/tmp/test_generate_spXXXXXX";
    CHECK(mkdtemp(dir), "mkdtemp");
    // training text: hairpin sequences and some prose (multi-byte characters too)
    int rc = sh("zcat data/hairpin.fa.gz | head -4000 > %s/train.txt && printf '%%s\\n' 'The stem-loop folds back on "
                "itself.' 'Ribonucleic acid, 22 nucleotides: mature miRNA.' 'Lin-4 (1993): the first microRNA.' "
                ">> %s/train.txt",
                dir, dir);
    EXPECT(rc == 0, "making the training text failed");
    static const char* texts[] = {"UGAGGUAGUAGGUUGUAUAGUU", "The first microRNA folds back.",
                                  "a  double space, caf\xc3\xa9 \xe2\x9c\x93 and <tags>", ">hsa-let-7a-1 MI0000060"};
    const char* types[] = {"bpe", "unigram"};
    for (int t = 0; t < 2; t++) {
        rc = sh("spm_train --input=%s/train.txt --model_prefix=%s/%s --vocab_size=600 --model_type=%s "
                "--character_coverage=1.0 --byte_fallback=true --normalization_rule_name=identity "
                "--minloglevel=2 > %s/train_%s.log 2>&1",
                dir, dir, types[t], types[t], dir, types[t]);
        EXPECT(rc == 0, "spm_train %s failed", types[t]);
        if (rc) continue;
        char model[300];
        snprintf(model, sizeof model, "%s/%s.model", dir, types[t]);
        SpModel* sp = NULL;
        Err e = {{0}};
        EXPECT(sp_open(&sp, model, &e) == 0, "sp_open %s: %s", model, e.msg);
        if (!sp) continue;
        EXPECT(sp_vocab(sp) == 600, "%s: %d pieces", types[t], sp_vocab(sp));
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            char in[300], out[300];
            snprintf(in, sizeof in, "%s/in.txt", dir);
            snprintf(out, sizeof out, "%s/ids.txt", dir);
            FILE* fi = fopen(in, "w");
            fprintf(fi, "%s\n", texts[i]);
            fclose(fi);
            EXPECT(sh("spm_encode --model=%s --output_format=id < %s > %s", model, in, out) == 0, "spm_encode");
            int want[512], nw = 0;
            FILE* fo = fopen(out, "r");
            while (fo && nw < 512 && fscanf(fo, "%d", &want[nw]) == 1) nw++;
            if (fo) fclose(fo);
            int32_t* ids = NULL;
            const int n = sp_encode(sp, texts[i], 0, &ids);
            int same = n == nw;
            for (int j = 0; same && j < n; j++) same = ids[j] == want[j];
            EXPECT(same, "%s: '%s' encodes to %d ids, spm_encode gives %d (first difference at %d)", types[t], texts[i],
                   n, nw, ({ int j = 0; while (j < n && j < nw && ids[j] == want[j]) j++; j; }));
            // decode: the pieces' text is the text (SentencePiece drops the dummy prefix's space)
            char txt[1024];
            size_t k = 0;
            for (int j = 0; j < n; j++) k += sp_piece_text(sp, ids[j], txt + k, sizeof txt - 1 - k);
            txt[k] = 0;
            const char* dec = txt[0] == ' ' ? txt + 1 : txt;
            char dref[1024] = "";
            EXPECT(sh("spm_decode --model=%s --input_format=id < %s > %s/dec.txt", model, out, dir) == 0, "spm_decode");
            snprintf(in, sizeof in, "%s/dec.txt", dir);
            FILE* fd = fopen(in, "r");
            if (fd && fgets(dref, sizeof dref, fd)) dref[strcspn(dref, "\n")] = 0;
            if (fd) fclose(fd);
            EXPECT(dref[0] && !strcmp(dec, dref), "%s: '%s' decodes to '%s', spm_decode to '%s'", types[t], texts[i], dec, dref);
            int32_t* withbos = NULL;
            const int nb = sp_encode(sp, texts[i], 1, &withbos);
            EXPECT(nb == n + 1 && withbos[0] == sp_bos(sp), "%s: BOS first", types[t]);
            free(ids), free(withbos);
        }
        EXPECT(sp_eos(sp) == 2 && sp_bos(sp) == 1, "%s: bos %d eos %d (SentencePiece's defaults)", types[t], sp_bos(sp), sp_eos(sp));
        sp_close(sp);
    }
    if (!t_cur_failed) sh("rm -rf %s", dir);
}

int main(int argc, char** argv) {
    int world;
    dist_init(&argc, &argv, &world);
    be = cpu_backend_create();
    g_comm = comm_mpi_create(1);
    rng_seed(&rng, 1234);
    RUN(test_decode_ops);
    RUN(test_kv_equals_full);
    RUN(test_filter);
    RUN(test_sampling);
    RUN(test_sentencepiece);
    g_comm->destroy(g_comm);
    be->destroy(be);
    dist_finalize();
    TEST_END();
}
