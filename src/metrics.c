// metrics.c — see metrics.h.
#include "metrics.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "util.h"

double metrics_peak_tflops(const char* device) {
    if (!device) return 0;
    // First match wins: the more specific names come first. Dense (not 2:4 sparse) bf16 tensor
    // core figures from the vendor's data sheets; the SXM parts for H100 / H200.
    static const struct {
        const char* name;
        double tflops;
    } table[] = {
        {"H100 PCIe", 756.0},
        {"H100", 989.4},
        {"H200", 989.4},
        {"B200", 2250.0},
        {"A100", 312.0},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strstr(device, table[i].name)) return table[i].tflops;
    return 0;
}

void metrics_hms(char* out, size_t n, double seconds) {
    if (!isfinite(seconds) || seconds < 0) {
        snprintf(out, n, "-");
        return;
    }
    long long s = llround(seconds);
    snprintf(out, n, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
}

void metrics_init(Metrics* m, Backend* be, FILE* console, int steps, int world, double tokens_per_step,
                  double flops_per_token, double peak_override, double t_start) {
    memset(m, 0, sizeof *m);
    m->be = be;
    m->console = console;
    m->steps = steps;
    m->world = world;
    m->tokens_per_step = tokens_per_step;
    m->flops_per_token = flops_per_token;
    m->t_start = t_start;
    if (peak_override > 0) {
        m->peak_tflops = peak_override;
        m->peak_from = "log.peak_tflops";
    } else if (be && be->device) {
        m->peak_tflops = metrics_peak_tflops(be->device);
        m->peak_from = m->peak_tflops > 0 ? be->device : NULL;
    }
}

double metrics_tflops(const Metrics* m, double tokens_per_s) {
    return tokens_per_s * m->flops_per_token / 1e12 / (m->world > 0 ? m->world : 1);
}

double metrics_mfu(const Metrics* m, double tokens_per_s) {
    return m->peak_tflops > 0 ? 100.0 * metrics_tflops(m, tokens_per_s) / m->peak_tflops : NAN;
}

// A JSON number, or null when it is not finite (JSON has no NaN).
static void jnum(FILE* f, const char* key, const char* fmt, double v) {
    fprintf(f, ", \"%s\": ", key);
    if (isfinite(v)) fprintf(f, fmt, v);
    else fputs("null", f);
}

// The same into buf[n] at *k (truncation shows as *k >= n).
static void bput(char* buf, size_t n, size_t* k, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
static void bput(char* buf, size_t n, size_t* k, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + (*k < n ? *k : n), *k < n ? n - *k : 0, fmt, ap);
    va_end(ap);
    if (w > 0) *k += (size_t)w;
}
static void bnum(char* buf, size_t n, size_t* k, const char* key, const char* fmt, double v) {
    bput(buf, n, k, ", \"%s\": ", key);
    if (isfinite(v)) {
        char t[64];
        snprintf(t, sizeof t, fmt, v);
        bput(buf, n, k, "%s", t);
    } else {
        bput(buf, n, k, "null");
    }
}

static void fmt_ms(char* out, size_t n, double ms) {
    snprintf(out, n, ms < 10 ? "%.2f" : ms < 100 ? "%.1f" : "%.0f", ms);
}

static const double GIB = 1024.0 * 1024.0 * 1024.0;

// The step's line of metrics.jsonl into json[jn]; returns its length.
static size_t json_line(const Metrics* m, const MetricsStep* s, double now, double eta, double tok_s,
                        const BackendMem* mem, int has_mem, char* json, size_t jn) {
    size_t k = 0;
    bput(json, jn, &k, "{");
    if (m->run_id) bput(json, jn, &k, "\"run_id\": \"%s\", ", m->run_id);
    bput(json, jn, &k, "\"step\": %d", s->step);
    bnum(json, jn, &k, "loss", "%.6f", s->loss);
    bnum(json, jn, &k, "ce_loss", "%.6f", s->ce);
    bnum(json, jn, &k, "aux_loss", "%.6f", s->aux);
    bnum(json, jn, &k, "lr", "%.6e", s->lr);
    bnum(json, jn, &k, "grad_norm", "%.6f", s->grad_norm);
    // clock-dependent fields, together
    bnum(json, jn, &k, "tokens_per_s", "%.1f", tok_s);
    bnum(json, jn, &k, "step_ms", "%.3f", s->step_s * 1e3);
    bnum(json, jn, &k, "model_tflops", "%.4g", metrics_tflops(m, tok_s));
    bnum(json, jn, &k, "mfu_pct", "%.3f", metrics_mfu(m, tok_s));
    bnum(json, jn, &k, "elapsed_s", "%.3f", now - m->t_start);
    bnum(json, jn, &k, "eta_s", "%.1f", eta);
    // device memory (null without a device)
    bnum(json, jn, &k, "gpu_mem_gib", "%.3f", has_mem ? mem->live / GIB : NAN);
    bnum(json, jn, &k, "gpu_mem_peak_gib", "%.3f", has_mem ? mem->peak / GIB : NAN);
    bnum(json, jn, &k, "gpu_used_gib", "%.3f", has_mem ? mem->device_used / GIB : NAN);
    bput(json, jn, &k, ", \"tokens\": %lld", (long long)s->tokens);
    bnum(json, jn, &k, "expert_load_max_over_mean", "%.4f", s->load_max_over_mean);
    bput(json, jn, &k, ", \"skipped\": %d", s->skipped);
    if (s->has_val) {
        bnum(json, jn, &k, "val_loss", "%.6f", s->val_loss);
        bnum(json, jn, &k, "val_bits_per_token", "%.6f", s->val_bits);
    }
    bput(json, jn, &k, "}\n");
    CHECK(k < jn, "metrics line longer than %zu bytes", jn);
    return k;
}

// The console line: the averages of the logging window (every step since the previous line).
static void console_line(Metrics* m, const MetricsStep* s, double eta, const BackendMem* mem, int has_mem) {
    const double w_step = m->win_n ? m->win_s / m->win_n : s->step_s;
    const double w_tok_s = w_step > 0 ? m->tokens_per_step / w_step : NAN;
    m->win_n = 0;
    m->win_s = 0;
    char ms[32], eta_s[32], mfu[32], memtxt[64] = "";
    fmt_ms(ms, sizeof ms, w_step * 1e3);
    metrics_hms(eta_s, sizeof eta_s, eta);
    const double u = metrics_mfu(m, w_tok_s);
    if (isfinite(u)) snprintf(mfu, sizeof mfu, "%.1f%%", u);
    else snprintf(mfu, sizeof mfu, "none");
    if (has_mem) snprintf(memtxt, sizeof memtxt, " | mem %.1f/%.1f GiB", mem->live / GIB, mem->peak / GIB);
    FILE* c = m->console;
    fprintf(c, "step %5d/%d | loss %.4f | ce %.4f | aux %.4f | lr %.3e | gnorm %.3f | %.0f tok/s | %s ms | %.3g TFLOP/s | MFU %s%s | load max/mean %.2f | eta %s%s",
            s->step, m->steps, s->loss, s->ce, s->aux, s->lr, s->grad_norm, w_tok_s, ms, metrics_tflops(m, w_tok_s), mfu, memtxt,
            s->load_max_over_mean, eta_s, s->skipped ? " | SKIPPED (non-finite)" : "");
    if (s->has_val) fprintf(c, " | val %.4f (%.3f bits)", s->val_loss, s->val_bits);
    fputc('\n', c);
    if ((fflush(c) || ferror(c)) && !m->console_failed) {  // the console is a copy; metrics.jsonl is the record
        m->console_failed = 1;
        fprintf(stderr, "moetrain: warning: writing the step lines to the console failed (%s); training goes on\n",
                strerror(errno));
    }
}

size_t metrics_step(Metrics* m, const MetricsStep* s, int print, char* json, size_t jn) {
    const double now = now_sec();
    if (m->t_first == 0) {
        m->t_first = now;
        m->first_step = s->step;
        m->first_step_s = now - m->t_start;
    }
    const int run_steps = s->step - m->first_step;  // steps of this run after its first
    if (run_steps >= 2) m->steady_s += s->step_s, m->steady_n++;
    m->run_s += s->step_s;
    m->win_n++;
    m->win_s += s->step_s;
    m->last_step = s->step;
    // ETA: the average wall time per step of this run (validation and saves included), or the
    // first step's time until there is a second.
    const double per_step = run_steps > 0 ? (now - m->t_first) / run_steps : s->step_s;
    const double eta = (m->steps - s->step) * per_step;
    const double tok_s = s->step_s > 0 ? m->tokens_per_step / s->step_s : NAN;
    BackendMem mem = {0};
    const int has_mem = m->be && m->be->mem_info;
    if (has_mem) m->be->mem_info(m->be, &mem);
    const size_t k = json_line(m, s, now, eta, tok_s, &mem, has_mem, json, jn);
    if (print && m->console) console_line(m, s, eta, &mem, has_mem);
    return k;
}

void metrics_summary(const Metrics* m, const char* source, const char* stop) {
    if (!m->console || m->t_first == 0) return;  // no step ran
    const int run = m->last_step - m->first_step + 1;
    // steady state: from this run's third step on (the first ones warm caches and plans)
    const double step_s = m->steady_n > 0 ? m->steady_s / m->steady_n : m->run_s / run;
    const double tok_s = step_s > 0 ? m->tokens_per_step / step_s : NAN;
    const double peak = m->be && m->be->peak_bytes ? (double)m->be->peak_bytes(m->be) / GIB : 0;
    FILE* c = m->console;
    fprintf(c, "{\"bench\": \"%s\"", source);
    jnum(c, "step_ms", "%.1f", step_s * 1e3);
    jnum(c, "tokens_per_s", "%.0f", tok_s);
    jnum(c, "model_tflops", "%.4g", metrics_tflops(m, tok_s));
    fprintf(c, ", \"peak_gib\": %.1f, \"world\": %d, \"backend\": \"%s\"", peak, m->world, m->be ? m->be->name : "");
    jnum(c, "mfu_pct", "%.4g", metrics_mfu(m, tok_s));
    jnum(c, "peak_tflops", "%.5g", m->peak_tflops > 0 ? m->peak_tflops : NAN);
    fprintf(c, ", \"device\": \"%s\", \"steps\": %d", m->be && m->be->device ? m->be->device : "", run);
    jnum(c, "first_step_s", "%.3f", m->first_step_s);
    jnum(c, "wall_s", "%.3f", now_sec() - m->t_start);
    fprintf(c, ", \"stop\": \"%s\"}\n", stop);
    fflush(c);
}
