// test_metrics.c — what a run reports, and what it keeps:
//   hms / peaks      metrics_hms's h:mm:ss; the dense bf16 peak table by CUDA device name
//   window           metrics_step on a device with memory (a stand-in backend) and given step
//                    times: every step's JSON line, the console only every log line, its ms and
//                    tok/s the window's means, TFLOP/s and MFU against the device's peak, memory
//                    in use / peak, ETA; the summary line's fields
//   every step       the binary (CPU, world 1): metrics.jsonl has every step while the console
//                    has every log.every-th; each console line's ms / tok/s is the mean of its
//                    window's JSON step_ms; model_tflops = tokens/s × FLOPs per token; MFU null
//                    on the CPU ("MFU none"), then computed from log.peak_tflops; the summary
//                    carries first_step_s and wall_s with the fields scripts/bench.sh reads
//   keep_best        a run whose validation rises: <dir>/best holds the lowest validation's
//                    step (gone from the keep rotation), `moetrain eval` on it prints the logged
//                    validation loss, and a resumed run keeps that best (trainer_state.yaml)
//                    (and with checkpoint.async: best saved after the save in flight commits)
//   early_stop       train.early_stop=2 ends the run (exit 0) two validations after its best,
//                    the reason in the log, a checkpoint at that step, "stop": "early_stop"
//   plot             scripts/plot.py draws a PNG of two runs
#define _GNU_SOURCE
#include <limits.h>
#include <math.h>
#include <sys/stat.h>

#include "metrics.h"
#include "params.h"
#include "test_resume_util.h"

static char g_dir[256];
static char g_bin[PATH_MAX];

// Runs a shell command; its stdout + stderr into out[n]. Returns the exit status.
static int run_out(char* out, size_t n, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static int run_out(char* out, size_t n, const char* fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    out[0] = 0;
    FILE* p = popen(cmd, "r");
    if (!p) return -1;
    size_t k = 0, r;
    while (k + 1 < n && (r = fread(out + k, 1, n - 1 - k, p)) > 0) k += r;
    out[k] = 0;
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int rc = pclose(p);
    return rc == -1 ? -1 : WEXITSTATUS(rc);
}

// The number after "key": in a JSON line — up to its newline — (NAN when absent or null).
static double jget(const char* line, const char* key) {
    char k[96];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char* s = strstr(line, k);
    const char* nl = strchr(line, '\n');
    if (!s || (nl && s > nl)) return NAN;
    s += strlen(k);
    if (!strncmp(s, "null", 4)) return NAN;
    return atof(s);
}

static int jnull(const char* line, const char* key) {
    char k[96];
    snprintf(k, sizeof k, "\"%s\": null", key);
    return strstr(line, k) != NULL;
}

static int near(double a, double b, double rel, double abs_tol) {
    return isfinite(a) && isfinite(b) && fabs(a - b) <= abs_tol + rel * fabs(b);
}

// The lines of a file (at most max), each malloc'd; -1 without the file.
static int read_lines(const char* path, char** lines, int max) {
    FILE* f = fopen(path, "r");
    if (!f) return -1;
    char buf[8192];
    int n = 0;
    while (n < max && fgets(buf, sizeof buf, f)) lines[n++] = xstrdup(buf);
    fclose(f);
    return n;
}

// The "h:mm:ss" after "eta " in a console line is well formed.
static int eta_ok(const char* line) {
    const char* s = strstr(line, "| eta ");
    if (!s) return 0;
    int h, m, sec, k = 0;
    if (sscanf(s + 6, "%d:%2d:%2d%n", &h, &m, &sec, &k) != 3) return 0;
    return h >= 0 && m >= 0 && m < 60 && sec >= 0 && sec < 60 && s[6 + k - 3] == ':';
}

static void test_hms_peaks(void) {
    char b[32];
    struct {
        double s;
        const char* want;
    } cases[] = {{0, "0:00:00"}, {59.4, "0:00:59"}, {59.6, "0:01:00"}, {65, "0:01:05"}, {3661.2, "1:01:01"},
                 {100000, "27:46:40"}, {-1, "-"}, {NAN, "-"}, {INFINITY, "-"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        metrics_hms(b, sizeof b, cases[i].s);
        EXPECT(!strcmp(b, cases[i].want), "hms(%g) = '%s', want '%s'", cases[i].s, b, cases[i].want);
    }
    struct {
        const char* dev;
        double tf;
    } peaks[] = {{"NVIDIA H200", 989.4},        {"NVIDIA H100 80GB HBM3", 989.4}, {"NVIDIA H100 PCIe", 756},
                 {"NVIDIA A100-SXM4-80GB", 312}, {"NVIDIA B200", 2250},            {"cpu", 0},
                 {"NVIDIA GeForce RTX 4090", 0}, {NULL, 0}};
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++)
        EXPECT(metrics_peak_tflops(peaks[i].dev) == peaks[i].tf, "peak of %s: %g, want %g", peaks[i].dev ? peaks[i].dev : "NULL",
               metrics_peak_tflops(peaks[i].dev), peaks[i].tf);
}

// A stand-in device with memory: 1.5 GiB held now, 2 GiB at most, 10 of 80 GiB used.
static void fake_mem(Backend* be, BackendMem* m) {
    *m = (BackendMem){.live = 3ull << 29, .peak = 2ull << 30, .device_used = 10ull << 30, .device_total = 80ull << 30};
}
static size_t fake_peak(Backend* be) { return 2ull << 30; }

static void test_window(void) {
    Backend be = {0};
    be.name = "cuda";
    be.device = "NVIDIA H100 PCIe";
    be.mem_info = fake_mem;
    be.peak_bytes = fake_peak;
    char jtext[8192] = "", *ctext = NULL;
    size_t jk = 0, cn = 0;
    FILE* cf = open_memstream(&ctext, &cn);
    Metrics m;
    const double tok = 65536, fpt = 1e9;  // tokens per step, FLOPs per token
    metrics_init(&m, &be, cf, 100, 8, tok, fpt, 0, now_sec());
    EXPECT(m.peak_tflops == 756 && m.peak_from && !strcmp(m.peak_from, "NVIDIA H100 PCIe"), "peak by name: %g", m.peak_tflops);
    const double times[6] = {0.5, 0.1, 0.2, 0.3, 0.4, 0.4};
    for (int i = 0; i < 6; i++) {
        MetricsStep s = {.step = i + 1, .loss = 3 - 0.1 * i, .ce = 2.9, .aux = 0.1, .lr = 1e-4, .grad_norm = 1.5, .step_s = times[i],
                         .tokens = (int64_t)tok * (i + 1), .load_max_over_mean = 1.25, .has_val = i == 3, .val_loss = 2.5,
                         .val_bits = 2.5 / log(2)};
        char line[2048];
        const size_t k = metrics_step(&m, &s, i == 3 || i == 5, line, sizeof line);  // console after steps 4 and 6
        EXPECT(k == strlen(line) && k > 0 && line[k - 1] == '\n' && jk + k < sizeof jtext, "step %d: a %zu-byte line", i + 1, k);
        if (jk + k < sizeof jtext) memcpy(jtext + jk, line, k + 1), jk += k;
    }
    metrics_summary(&m, "cfg.yaml", "steps");
    fclose(cf);
    // JSON: six lines, this step's own speed, MFU from 756
    int nl = 0;
    for (char* p = jtext; (p = strchr(p, '\n')); p++) nl++;
    EXPECT(nl == 6, "6 JSON lines (%d)", nl);
    const char* l2 = strstr(jtext, "{\"step\": 2,");
    EXPECT(l2 && near(jget(l2, "step_ms"), 100, 1e-6, 1e-3) && near(jget(l2, "tokens_per_s"), tok / 0.1, 1e-6, 0.1),
           "step 2's own time and speed: %s", l2 ? l2 : "(none)");
    const double tf2 = tok / 0.1 * fpt / 1e12 / 8;
    EXPECT(l2 && near(jget(l2, "model_tflops"), tf2, 1e-3, 0) && near(jget(l2, "mfu_pct"), 100 * tf2 / 756, 1e-3, 0),
           "step 2: %g TFLOP/s per device, MFU %g%%: %s", tf2, 100 * tf2 / 756, l2 ? l2 : "");
    EXPECT(l2 && jget(l2, "gpu_mem_gib") == 1.5 && jget(l2, "gpu_mem_peak_gib") == 2 && jget(l2, "gpu_used_gib") == 10,
           "memory in the JSON: %s", l2 ? l2 : "");
    const char* l4 = strstr(jtext, "{\"step\": 4,");
    const char* l3 = strstr(jtext, "{\"step\": 3,");
    EXPECT(l4 && jget(l4, "val_loss") == 2.5 && l3 && isnan(jget(l3, "val_loss")) && l2 && isnan(jget(l2, "val_loss")),
           "val_loss on step 4 only");
    // console: two lines; the first averages steps 1-4 (0.275 s), the second steps 5-6 (0.4 s)
    char* c1 = ctext;
    char* c2 = c1 ? strchr(c1, '\n') : NULL;
    if (c2) *c2++ = 0;
    EXPECT(c1 && strstr(c1, "step     4/100") && strstr(c1, "| 275 ms |"), "window 1-4 mean 275 ms: %s", c1 ? c1 : "");
    char want[64];
    snprintf(want, sizeof want, "| %.0f tok/s |", tok / 0.275);
    EXPECT(c1 && strstr(c1, want), "window 1-4: '%s' in %s", want, c1 ? c1 : "");
    snprintf(want, sizeof want, "| MFU %.1f%% |", 100 * (tok / 0.275 * fpt / 1e12 / 8) / 756);
    EXPECT(c1 && strstr(c1, want), "'%s' in %s", want, c1 ? c1 : "");
    EXPECT(c1 && strstr(c1, "| mem 1.5/2.0 GiB |") && eta_ok(c1) && strstr(c1, "| val 2.5000"), "mem, eta, val: %s", c1 ? c1 : "");
    EXPECT(c2 && strstr(c2, "step     6/100") && strstr(c2, "| 400 ms |"), "window 5-6 mean 400 ms: %s", c2 ? c2 : "");
    const char* sum = c2 ? strstr(c2, "{\"bench\": \"cfg.yaml\"") : NULL;
    // steady state: this run's steps 3.. (0.2, 0.3, 0.4, 0.4): 325 ms
    EXPECT(sum && near(jget(sum, "step_ms"), 325, 0, 0.051) && jget(sum, "peak_gib") == 2 && jget(sum, "world") == 8 &&
               jget(sum, "peak_tflops") == 756 && jget(sum, "steps") == 6 && jget(sum, "first_step_s") >= 0 &&
               jget(sum, "wall_s") >= jget(sum, "first_step_s") && strstr(sum, "\"backend\": \"cuda\"") &&
               strstr(sum, "\"device\": \"NVIDIA H100 PCIe\"") && strstr(sum, "\"stop\": \"steps\""),
           "summary: %s", sum ? sum : "(none)");
    free(ctext);
}

// A run of the binary on random tokens (fast): world 1, CPU.
static const char* TINY =
    "train.device=cpu data.format=random parallel.ep=1 train.seq_len=16 train.micro_batch=4 train.global_batch=8 "
    "model.hidden=32 model.ffn=48 model.heads=4 model.kv_heads=2 model.experts=4 model.top_k=2 model.vocab_size=64 "
    "train.eval_batches=2 optim.warmup=2 checkpoint.dir= checkpoint.keep_best=false";

static void test_every_step(void) {
    static char out[1 << 16];
    char dir[300];
    snprintf(dir, sizeof dir, "%s/every", g_dir);
    int rc = run_out(out, sizeof out, "OMP_NUM_THREADS=1 %s --config L0_sanity %s train.steps=12 log.every=4 train.eval_every=0 log.dir=%s 2>&1",
                     g_bin, TINY, dir);
    EXPECT(rc == 0, "exit %d:\n%s", rc, out);
    char p[400], *lines[64];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    int n = read_lines(p, lines, 64);
    EXPECT(n == 12, "12 lines in metrics.jsonl (%d)", n);
    // FLOPs per token of this model (params_train_flops_per_token), for model_tflops
    Config c;
    config_defaults(&c);
    Err e = {{0}};
    const char* kv[] = {"model.hidden=32", "model.ffn=48", "model.heads=4", "model.kv_heads=2", "model.experts=4",
                        "model.top_k=2", "model.vocab_size=64", "model.layers=2"};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) config_override(&c, kv[i], &e);
    const double fpt = params_train_flops_per_token(&c.model, 16);
    double ms[12] = {0};
    for (int i = 0; i < n && i < 12; i++) {
        EXPECT((int)jget(lines[i], "step") == i + 1, "line %d is step %d", i + 1, (int)jget(lines[i], "step"));
        ms[i] = jget(lines[i], "step_ms");
        const double ts = jget(lines[i], "tokens_per_s");
        EXPECT(ms[i] > 0 && near(ts, 8 * 16 / (ms[i] / 1e3), 2e-3, 0.5), "step %d: %g tok/s at %g ms", i + 1, ts, ms[i]);
        EXPECT(near(jget(lines[i], "model_tflops"), ts * fpt / 1e12, 2e-3, 0), "step %d: model_tflops %g, want %g", i + 1,
               jget(lines[i], "model_tflops"), ts * fpt / 1e12);
        EXPECT(jnull(lines[i], "mfu_pct") && jnull(lines[i], "gpu_mem_gib") && jget(lines[i], "eta_s") >= 0 &&
                   jget(lines[i], "tokens") == (i + 1) * 128,
               "CPU: MFU and GPU memory null; eta, tokens: %s", lines[i]);
    }
    // the console: steps 4, 8, 12, each the mean of its window
    int seen = 0;
    for (char* s = out; (s = strstr(s, "\nstep ")); s++) {
        int st = 0;
        double tps = 0, cms = 0;
        char* l = s + 1;
        sscanf(l, "step %d/", &st);
        char* a = strstr(l, " tok/s | ");
        char* nl = strchr(l, '\n');
        if (!a || (nl && a > nl)) continue;
        char* b = a;
        while (b > l && b[-1] != '|') b--;
        tps = atof(b);
        cms = atof(a + 9);
        seen++;
        EXPECT(st == 4 * seen, "console line %d is step %d", seen, st);
        if (st < 4 || st > 12) continue;
        double w = 0;
        for (int i = st - 4; i < st; i++) w += ms[i] / 4;
        EXPECT(near(cms, w, 6e-3, 0.006), "step %d: console %g ms, window mean %g ms", st, cms, w);
        EXPECT(near(tps, 128 / (w / 1e3), 6e-3, 1), "step %d: console %g tok/s, window %g", st, tps, 128 / (w / 1e3));
        char line[2048];
        snprintf(line, sizeof line, "%.*s", nl ? (int)(nl - l) : 2000, l);
        EXPECT(strstr(line, "| MFU none |") && eta_ok(line) && !strstr(line, "mem "), "CPU console line: %s", line);
    }
    EXPECT(seen == 3, "3 console lines (%d)", seen);
    const char* sum = strstr(out, "{\"bench\": ");
    EXPECT(sum && jget(sum, "step_ms") > 0 && jget(sum, "tokens_per_s") > 0 && jget(sum, "model_tflops") > 0 &&
               strstr(sum, "\"peak_gib\": ") && jget(sum, "world") == 1 && strstr(sum, "\"backend\": \"cpu\"") &&
               jnull(sum, "mfu_pct") && jget(sum, "first_step_s") > 0 && jget(sum, "wall_s") > jget(sum, "first_step_s") &&
               jget(sum, "steps") == 12 && strstr(sum, "\"stop\": \"steps\""),
           "summary line: %s", sum ? sum : "(none)");
    free_trace(lines, n > 0 ? n : 0);

    // log.peak_tflops: MFU from the given peak, on the CPU too
    snprintf(dir, sizeof dir, "%s/peak", g_dir);
    rc = run_out(out, sizeof out, "OMP_NUM_THREADS=1 %s --config L0_sanity %s train.steps=4 log.every=2 log.peak_tflops=0.002 log.dir=%s 2>&1",
                 g_bin, TINY, dir);
    EXPECT(rc == 0, "exit %d:\n%s", rc, out);
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    n = read_lines(p, lines, 64);
    EXPECT(n == 4, "4 lines (%d)", n);
    for (int i = 0; i < n; i++)
        EXPECT(near(jget(lines[i], "mfu_pct"), 100 * jget(lines[i], "model_tflops") / 0.002, 2e-3, 0),
               "MFU = model_tflops / 0.002: %s", lines[i]);
    EXPECT(strstr(out, "| MFU ") && !strstr(out, "| MFU none"), "console MFU computed");
    sum = strstr(out, "{\"bench\": ");
    EXPECT(sum && jget(sum, "peak_tflops") == 0.002 && near(jget(sum, "mfu_pct"), 100 * jget(sum, "model_tflops") / 0.002, 2e-3, 0),
           "summary MFU: %s", sum ? sum : "(none)");
    free_trace(lines, n > 0 ? n : 0);
}

// A small model on the shipped hairpins at a high constant learning rate: the validation loss
// falls, then rises (deterministic on the CPU; checked, not assumed).
static const char* RISE =
    "train.device=cpu parallel.ep=1 model.hidden=32 model.ffn=48 train.seq_len=32 train.micro_batch=4 "
    "train.global_batch=8 optim.lr=3e-2 optim.warmup=2 optim.schedule=constant train.eval_batches=4 "
    "train.eval_every=4 log.every=4";

// The validations of a metrics.jsonl: steps and losses; returns the count.
static int read_vals(const char* path, int* step, double* val, int max) {
    char* lines[512];
    int n = read_lines(path, lines, 512), k = 0;
    for (int i = 0; i < n; i++) {
        double v = jget(lines[i], "val_loss");
        if (isfinite(v) && k < max) step[k] = (int)jget(lines[i], "step"), val[k++] = v;
    }
    free_trace(lines, n > 0 ? n : 0);
    return k;
}

static int argmin(const double* v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] < v[b]) b = i;
    return b;
}

static void test_keep_best(void) {
    static char out[1 << 17];
    char ck[300], lg[300], p[400];
    snprintf(ck, sizeof ck, "%s/kb_ckpt", g_dir);
    snprintf(lg, sizeof lg, "%s/kb_log", g_dir);
    int rc = run_out(out, sizeof out,
                     "OMP_NUM_THREADS=1 %s --config L0_sanity %s train.steps=40 checkpoint.dir=%s checkpoint.every=4 checkpoint.keep=1 "
                     "checkpoint.keep_best=true log.dir=%s 2>&1", g_bin, RISE, ck, lg);
    EXPECT(rc == 0, "exit %d:\n%s", rc, out);
    int st[64];
    double val[64];
    snprintf(p, sizeof p, "%s/metrics.jsonl", lg);
    int n = read_vals(p, st, val, 64);
    EXPECT(n == 10, "10 validations (%d)", n);
    if (n < 2) return;
    int b = argmin(val, n);
    int rose = 0;
    for (int i = b + 1; i < n; i++) rose |= val[i] > val[b];
    EXPECT(rose && st[b] < 40, "the validation loss rises after its lowest (step %d, %.6f)", st[b], val[b]);
    char best[64], latest[64];
    snprintf(p, sizeof p, "%s/best/latest", ck);
    t_read_text(p, best, sizeof best);
    char want[64];
    snprintf(want, sizeof want, "step_%08d\n", st[b]);
    EXPECT(!strcmp(best, want), "best/latest is '%s', want '%s'", best, want);
    snprintf(p, sizeof p, "%s/latest", ck);
    t_read_text(p, latest, sizeof latest);
    EXPECT(!strcmp(latest, "step_00000040\n"), "the rotation's latest is step 40 ('%s')", latest);
    snprintf(p, sizeof p, "%s/step_%08d", ck, st[b]);
    struct stat sb;
    EXPECT(stat(p, &sb) != 0, "keep=1 pruned %s from the rotation (the best survives in best/)", p);
    snprintf(p, sizeof p, "%s/best/step_%08d/manifest.txt", ck, st[b]);
    EXPECT(stat(p, &sb) == 0, "%s complete", p);
    // eval on it reproduces the logged validation loss
    static char ev[1 << 14];
    rc = run_out(ev, sizeof ev, "OMP_NUM_THREADS=1 %s eval --ckpt %s/best 2>&1", g_bin, ck);
    const char* j = strstr(ev, "{\"eval\": ");
    char got[32] = "", logged[32];
    if (j && strstr(j, "\"val_loss\": ")) sscanf(strstr(j, "\"val_loss\": ") + 12, "%31[0-9.]", got);
    snprintf(logged, sizeof logged, "%.6f", val[b]);
    EXPECT(rc == 0 && j && jget(j, "step") == st[b] && !strcmp(got, logged),
           "eval on best: val_loss %s at step %g, logged %s at step %d:\n%s", got, j ? jget(j, "step") : -1, logged, st[b], ev);
    // the best is in the trainer state, so a resumed run keeps it
    char state[8192];
    snprintf(p, sizeof p, "%s/step_00000040/trainer_state.yaml", ck);
    t_read_text(p, state, sizeof state);
    char bs[64];
    snprintf(bs, sizeof bs, "best_step: %d\n", st[b]);
    EXPECT(strstr(state, bs) && strstr(state, "best_val_loss: "), "trainer_state.yaml records %s", bs);
    rc = run_out(out, sizeof out,
                 "OMP_NUM_THREADS=1 %s --config L0_sanity %s train.steps=48 checkpoint.dir=%s checkpoint.every=4 checkpoint.keep=1 "
                 "checkpoint.keep_best=true checkpoint.resume=auto log.dir=%s 2>&1", g_bin, RISE, ck, lg);
    EXPECT(rc == 0 && strstr(out, "resumed from"), "resumed run: exit %d:\n%s", rc, out);
    snprintf(p, sizeof p, "%s/metrics.jsonl", lg);
    int n2 = read_vals(p, st, val, 64);
    EXPECT(n2 == 12, "12 validations after the resume (%d)", n2);
    int b2 = argmin(val, n2);
    snprintf(p, sizeof p, "%s/best/latest", ck);
    t_read_text(p, best, sizeof best);
    snprintf(want, sizeof want, "step_%08d\n", st[b2]);
    EXPECT(!strcmp(best, want), "after the resume best/latest is '%s', the lowest of the joined trace is '%s'", best, want);
    EXPECT((b2 == b) == (strstr(out, "saved the best") == NULL), "a best is saved after the resume only when a validation beats step %d",
           st[b]);
}

// checkpoint.async with keep_best: the best is saved synchronously after the save in flight
// is committed; both roots end complete, best/ at the lowest validation.
static void test_keep_best_async(void) {
    static char out[1 << 17];
    char ck[300], lg[300], p[400];
    snprintf(ck, sizeof ck, "%s/kba_ckpt", g_dir);
    snprintf(lg, sizeof lg, "%s/kba_log", g_dir);
    int rc = run_out(out, sizeof out,
                     "OMP_NUM_THREADS=1 %s --config L0_sanity %s train.steps=24 checkpoint.dir=%s checkpoint.every=2 "
                     "checkpoint.keep=2 checkpoint.keep_best=true checkpoint.async=true log.dir=%s 2>&1", g_bin, RISE, ck, lg);
    EXPECT(rc == 0 && strstr(out, "in the background"), "exit %d:\n%s", rc, out);
    int st[64];
    double val[64];
    snprintf(p, sizeof p, "%s/metrics.jsonl", lg);
    int n = read_vals(p, st, val, 64);
    EXPECT(n == 6, "6 validations (%d)", n);
    if (n < 1) return;
    int b = argmin(val, n);
    char best[64], want[64];
    snprintf(p, sizeof p, "%s/best/latest", ck);
    t_read_text(p, best, sizeof best);
    snprintf(want, sizeof want, "step_%08d\n", st[b]);
    EXPECT(!strcmp(best, want), "best/latest is '%s', want '%s'", best, want);
    static char ev[1 << 14];
    rc = run_out(ev, sizeof ev, "OMP_NUM_THREADS=1 %s eval --ckpt %s/best 2>&1", g_bin, ck);
    const char* j = strstr(ev, "{\"eval\": ");
    char got[32] = "", logged[32];
    if (j && strstr(j, "\"val_loss\": ")) sscanf(strstr(j, "\"val_loss\": ") + 12, "%31[0-9.]", got);
    snprintf(logged, sizeof logged, "%.6f", val[b]);
    EXPECT(rc == 0 && !strcmp(got, logged), "eval on best: %s, logged %s:\n%s", got, logged, ev);
    snprintf(p, sizeof p, "%s/latest", ck);
    t_read_text(p, best, sizeof best);
    EXPECT(!strcmp(best, "step_00000024\n"), "the rotation's latest: '%s'", best);
}

static void test_early_stop(void) {
    static char out[1 << 17];
    char ck[300], lg[300], p[400];
    snprintf(ck, sizeof ck, "%s/es_ckpt", g_dir);
    snprintf(lg, sizeof lg, "%s/es_log", g_dir);
    int rc = run_out(out, sizeof out,
                     "OMP_NUM_THREADS=1 %s --config L0_sanity %s train.steps=400 train.early_stop=2 checkpoint.dir=%s checkpoint.keep_best=true "
                     "log.dir=%s 2>&1", g_bin, RISE, ck, lg);
    EXPECT(rc == 0, "early stop exits 0 (%d):\n%s", rc, out);
    int st[128];
    double val[128];
    snprintf(p, sizeof p, "%s/metrics.jsonl", lg);
    int n = read_vals(p, st, val, 128);
    EXPECT(n >= 3, "validations: %d", n);
    if (n < 3) return;
    const int last = st[n - 1];
    // the run stops at the second validation after its lowest, both above it, and nowhere earlier
    for (int i = 1; i < n; i++) {
        int since = 0;
        double best = val[0];
        for (int k = 1; k <= i; k++) {
            if (val[k] < best) best = val[k], since = 0;
            else since++;
        }
        EXPECT((since >= 2) == (i == n - 1), "validation %d (step %d): %d since the best; stop %s", i, st[i], since,
               i == n - 1 ? "here" : "later");
    }
    EXPECT(last < 400, "stopped early (step %d)", last);
    char want[160];
    snprintf(want, sizeof want, "train: early stop after step %d: the validation loss has not improved", last);
    EXPECT(strstr(out, want) && strstr(out, "(train.early_stop=2)"), "the reason in the log ('%s'):\n%s", want, out);
    snprintf(p, sizeof p, "%s/step_%08d/manifest.txt", ck, last);
    struct stat sb;
    EXPECT(stat(p, &sb) == 0, "a checkpoint at the stop: %s", p);
    const char* sum = strstr(out, "{\"bench\": ");
    EXPECT(sum && strstr(sum, "\"stop\": \"early_stop\"") && jget(sum, "steps") == last, "summary: %s", sum ? sum : "(none)");
}

static void test_plot(void) {
    static char out[1 << 14];
    char png[300];
    snprintf(png, sizeof png, "%s/two.png", g_dir);
    int rc = run_out(out, sizeof out, "scripts/plot.py %s/kb_log %s/every -o %s 2>&1", g_dir, g_dir, png);
    if (rc == 3) {
        printf("  skip test_plot: matplotlib is missing (make deps installs python3-matplotlib): %s", out);
        return;
    }
    EXPECT(rc == 0 && strstr(out, "plot: wrote "), "plot.py exit %d: %s", rc, out);
    struct stat sb;
    unsigned char sig[8] = {0};
    FILE* f = fopen(png, "rb");
    if (f) {
        if (fread(sig, 1, 8, f) != 8) sig[0] = 0;
        fclose(f);
    }
    EXPECT(stat(png, &sb) == 0 && sb.st_size > 20000 && !memcmp(sig, "\x89PNG\r\n\x1a\n", 8), "a PNG of %lld bytes",
           (long long)(stat(png, &sb) == 0 ? sb.st_size : -1));
    rc = run_out(out, sizeof out, "scripts/plot.py %s/no_such_run 2>&1", g_dir);
    EXPECT(rc == 2 && strstr(out, "no_such_run"), "a missing run: exit 2 naming it (%d): %s", rc, out);
}

int main(int argc, char** argv) {
    moetrain_path(argv[0], g_bin, sizeof g_bin);
    CHECK(chdir_repo(g_bin) == 0, "cannot go to the repository of %s", g_bin);  // scripts/plot.py
    scratch_dir(g_dir, sizeof g_dir, "test_metrics");
    RUN(test_hms_peaks);
    RUN(test_window);
    RUN(test_every_step);
    RUN(test_keep_best);
    RUN(test_keep_best_async);
    RUN(test_early_stop);
    RUN(test_plot);
    scratch_done(g_dir, "test_metrics", t_failed);
    TEST_END();
}
