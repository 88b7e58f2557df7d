// test_generate_cli.c — `moetrain generate` and train.sample_every end to end on the CPU, with the
// binary: a tiny L0_sanity run at EP = 2 under mpirun writes a checkpoint and prints its samples;
// generate on it gives the same tokens at world 1 and under mpirun at EP = 2 (sampled: top-k,
// top-p, seed), repeats with the seed and changes with another; a prompt's greedy continuation
// does not depend on the other prompts batched with it; --help and usage errors.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_resume_util.h"

static char g_bin[4096], g_dir[512];

// Runs a shell command; its stdout (stderr too with both = 1) into out. Returns the exit status.
static int capture(char* out, size_t n, int both, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
static int capture(char* out, size_t n, int both, const char* fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (both) strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
    else strncat(cmd, " 2>/dev/null", sizeof cmd - strlen(cmd) - 1);
    FILE* p = popen(cmd, "r");
    if (!p) return -1;
    size_t k = fread(out, 1, n - 1, p);
    out[k] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int g_have_ckpt;

static void test_train_samples(void) {
    static char out[1 << 16];
    int rc = capture(out, sizeof out, 1,
                     "timeout 300 scripts/mpirun.sh -np 2 %s --config L0_sanity train.device=cpu train.steps=6 "
                     "train.micro_batch=4 train.global_batch=8 train.seq_len=64 train.eval_every=0 "
                     "train.sample_every=3 train.sample_len=12 train.sample_prompt='>hsa' checkpoint.dir=%s/ck "
                     "checkpoint.every=6 log.dir=%s/log",
                     g_bin, g_dir, g_dir);
    EXPECT(rc == 0, "training exited %d:\n%s", rc, out);
    EXPECT(strstr(out, "sample (step 3, 12 tokens): >hsa|") && strstr(out, "sample (step 6, 12 tokens): >hsa|"),
           "no sample lines at steps 3 and 6:\n%s", out);
    g_have_ckpt = rc == 0;
}

static void test_generate_ep2_equals_world1(void) {
    if (!g_have_ckpt) {
        EXPECT(0, "no checkpoint from test_train_samples");
        return;
    }
    static char a[8192], b[8192], c[8192], d[8192];
    const char* args = "--prompt '>hsa-mir-21' --prompt UGAGG --prompt-ids 65,67,71 --max-new 24 --temperature 0.9 "
                       "--top-k 12 --top-p 0.95 --print-ids";
    int ra = capture(a, sizeof a, 0, "%s generate --ckpt %s/ck %s --seed 5", g_bin, g_dir, args);
    int rb = capture(b, sizeof b, 0, "timeout 120 scripts/mpirun.sh -np 2 %s generate --ckpt %s/ck %s --seed 5", g_bin,
                     g_dir, args);
    int rc = capture(c, sizeof c, 0, "%s generate --ckpt %s/ck %s --seed 5", g_bin, g_dir, args);
    int rd = capture(d, sizeof d, 0, "%s generate --ckpt %s/ck %s --seed 6", g_bin, g_dir, args);
    EXPECT(ra == 0 && rb == 0 && rc == 0 && rd == 0, "exit codes %d %d %d %d", ra, rb, rc, rd);
    int lines = 0;
    for (const char* p = a; *p; p++) lines += *p == '\n';
    EXPECT(lines == 3 && strlen(a) > 3 * 24, "want 3 lines of 24 ids, got:\n%s", a);
    EXPECT(!strcmp(a, b), "EP = 2 under mpirun differs from world 1:\n%s---\n%s", a, b);
    EXPECT(!strcmp(a, c), "the same seed gave other tokens:\n%s---\n%s", a, c);
    EXPECT(strcmp(a, d), "seeds 5 and 6 gave the same tokens");
}

static void test_greedy_batch_independent(void) {
    if (!g_have_ckpt) return;
    static char alone[4096], batched[8192];
    int r1 = capture(alone, sizeof alone, 0, "%s generate --ckpt %s/ck --prompt-ids 62,104,115 --max-new 30 "
                                             "--temperature 0 --print-ids", g_bin, g_dir);
    int r2 = capture(batched, sizeof batched, 0, "%s generate --ckpt %s/ck --prompt 'a much longer prompt than the other' "
                                                 "--prompt-ids 62,104,115 --prompt U --max-new 30 --temperature 0 --print-ids",
                     g_bin, g_dir);
    EXPECT(r1 == 0 && r2 == 0, "exit codes %d %d", r1, r2);
    const char* second = strchr(batched, '\n');
    EXPECT(second && !strncmp(second + 1, alone, strlen(alone)),
           "a greedy continuation changed with the batch:\nalone   %s\nbatched %s", alone, batched);
}

static void test_usage(void) {
    static char out[8192];
    EXPECT(capture(out, sizeof out, 1, "%s generate --help", g_bin) == 0 && strstr(out, "--top-p"), "--help:\n%s", out);
    EXPECT(capture(out, sizeof out, 1, "%s generate --ckpt %s/ck", g_bin, g_dir) == 2 && strstr(out, "no prompt"),
           "no prompt:\n%s", out);
    EXPECT(capture(out, sizeof out, 1, "%s generate --ckpt %s/ck --prompt-ids 1,999", g_bin, g_dir) == 2 &&
               strstr(out, "[0, 256)"),
           "an id outside the vocabulary:\n%s", out);
    EXPECT(capture(out, sizeof out, 1, "%s generate --ckpt %s/ck --prompt x --top-p 2", g_bin, g_dir) == 2,
           "--top-p 2 accepted:\n%s", out);
    EXPECT(capture(out, sizeof out, 1, "%s generate --ckpt none --prompt x", g_bin) == 2 && strstr(out, "--config"),
           "--ckpt none without --config:\n%s", out);
    EXPECT(capture(out, sizeof out, 1, "%s --help", g_bin) == 0 && strstr(out, "moetrain generate"),
           "moetrain --help does not list generate");
}

int main(int argc, char** argv) {
    if (find_moetrain(argv[0], g_bin, sizeof g_bin)) return 1;
    scratch_dir(g_dir, sizeof g_dir, "test_generate_cli");
    RUN(test_train_samples);
    RUN(test_generate_ep2_equals_world1);
    RUN(test_greedy_batch_independent);
    RUN(test_usage);
    scratch_done(g_dir, "test_generate_cli", t_failed);
    TEST_END();
}
