// trainer_state.c — trainer_state.yaml: format by hand, parse with libyaml (see ckpt.h).
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "ckpt.h"
#include "minijson.h"

static void put_double(Sb* b, double v) {
    if (isnan(v)) sb_printf(b, ".nan");
    else if (isinf(v)) sb_printf(b, v > 0 ? ".inf" : "-.inf");
    else sb_printf(b, "%.17g", v);
}

int trainer_state_format(char* buf, size_t n, const TrainerState* ts) {
    Sb b = {0};
    sb_printf(&b, "# moetrain trainer state (read on resume)\n");
    sb_printf(&b, "step: %lld\ntokens: %lld\nworld: %d\nep: %d\nseed: %llu\nrng: %llu\nbad_steps: %lld\nloss_ema: ",
              (long long)ts->step, (long long)ts->tokens, ts->world, ts->ep, (unsigned long long)ts->seed,
              (unsigned long long)ts->rng, (long long)ts->bad_steps);
    put_double(&b, ts->loss_ema);
    sb_putc(&b, '\n');
    if (ts->extra_yaml && ts->extra_yaml[0]) {
        sb_printf(&b, "%s", ts->extra_yaml);
        if (b.s[b.len - 1] != '\n') sb_putc(&b, '\n');
    }
    if (ts->config_yaml && ts->config_yaml[0]) {
        const char* c = ts->config_yaml;
        while (*c == '\n') c++;  // leading blank lines would be lost by YAML anyway
        // An explicit indentation indicator when the first line itself starts with a space.
        sb_printf(&b, "config: |%s\n", *c == ' ' ? "2" : "");
        while (*c) {
            const char* nl = strchr(c, '\n');
            size_t len = nl ? (size_t)(nl - c) : strlen(c);
            if (len) sb_printf(&b, "  %.*s", (int)len, c);
            sb_putc(&b, '\n');
            c += len + (nl ? 1 : 0);
        }
    }
    int len = (int)b.len;
    if (n) {
        size_t k = b.len < n ? b.len : n - 1;
        memcpy(buf, b.s, k);
        buf[k] = 0;
    }
    sb_free(&b);
    return len;
}

// Loads text; on success *root is the top-level mapping.
static int load(yaml_parser_t* p, yaml_document_t* d, const char* text, yaml_node_t** root, Err* e) {
    if (!yaml_parser_initialize(p)) FATAL("libyaml: out of memory");
    yaml_parser_set_input_string(p, (const unsigned char*)text, strlen(text));
    if (!yaml_parser_load(p, d)) {
        err_set(e, "trainer_state.yaml: line %zu: %s", p->problem_mark.line + 1, p->problem ? p->problem : "bad YAML");
        yaml_parser_delete(p);
        return -1;
    }
    *root = yaml_document_get_root_node(d);
    if (!*root || (*root)->type != YAML_MAPPING_NODE) {
        err_set(e, "trainer_state.yaml: not a YAML mapping");
        yaml_document_delete(d);
        yaml_parser_delete(p);
        return -1;
    }
    return 0;
}

static const char* scalar(yaml_document_t* d, int id) {
    yaml_node_t* n = yaml_document_get_node(d, id);
    return n && n->type == YAML_SCALAR_NODE ? (const char*)n->data.scalar.value : NULL;
}

int trainer_state_get(const char* text, const char* key, char* out, size_t n, Err* e) {
    yaml_parser_t p;
    yaml_document_t d;
    yaml_node_t* root;
    if (load(&p, &d, text, &root, e)) return -1;
    int found = 0;
    for (yaml_node_pair_t* pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top && !found; pr++) {
        const char* k = scalar(&d, pr->key);
        const char* v = scalar(&d, pr->value);
        if (k && v && strcmp(k, key) == 0) {
            found = 1;
            if (n) snprintf(out, n, "%s", v);
        }
    }
    yaml_document_delete(&d);
    yaml_parser_delete(&p);
    return found;
}

static int parse_i64(const char* k, const char* v, int64_t lo, int64_t hi, int64_t* out, Err* e) {
    char* end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return err_set(e, "trainer_state.yaml: %s: '%.40s' is not an integer in [%lld, %lld]", k, v, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

static int parse_u64(const char* k, const char* v, uint64_t* out, Err* e) {
    char* end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || end == v || *end || strchr(v, '-'))
        return err_set(e, "trainer_state.yaml: %s: '%.40s' is not an unsigned 64-bit integer", k, v);
    *out = x;
    return 0;
}

static int parse_f64(const char* k, const char* v, double* out, Err* e) {
    if (!strcmp(v, ".nan") || !strcmp(v, ".NaN")) { *out = NAN; return 0; }
    if (!strcmp(v, ".inf") || !strcmp(v, "+.inf")) { *out = INFINITY; return 0; }
    if (!strcmp(v, "-.inf")) { *out = -INFINITY; return 0; }
    char* end;
    double x = strtod(v, &end);
    if (end == v || *end) return err_set(e, "trainer_state.yaml: %s: '%.40s' is not a number", k, v);
    *out = x;
    return 0;
}

int trainer_state_parse(const char* text, TrainerState* ts, char* config_yaml, size_t cn, Err* e) {
    memset(ts, 0, sizeof *ts);
    if (cn) config_yaml[0] = 0;
    yaml_parser_t p;
    yaml_document_t d;
    yaml_node_t* root;
    if (load(&p, &d, text, &root, e)) return -1;
    enum { STEP, TOKENS, WORLD, EP, SEED, RNG, NREQ };
    static const char* req[NREQ] = {"step", "tokens", "world", "ep", "seed", "rng"};
    int have[NREQ] = {0}, rc = 0;
    for (yaml_node_pair_t* pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top && !rc; pr++) {
        const char* k = scalar(&d, pr->key);
        const char* v = scalar(&d, pr->value);
        if (!k) continue;
        int64_t i;
        if (!v) {
            for (int r = 0; r < NREQ; r++)
                if (!strcmp(k, req[r])) rc = err_set(e, "trainer_state.yaml: %s must be a scalar", k);
            if (!strcmp(k, "config")) rc = err_set(e, "trainer_state.yaml: config must be a block of text (config: |)");
            continue;
        }
        if (!strcmp(k, "step")) { rc = parse_i64(k, v, 0, INT64_MAX, &ts->step, e); have[STEP] = 1; }
        else if (!strcmp(k, "tokens")) { rc = parse_i64(k, v, 0, INT64_MAX, &ts->tokens, e); have[TOKENS] = 1; }
        else if (!strcmp(k, "world")) { rc = parse_i64(k, v, 1, 1 << 24, &i, e); ts->world = (int)i; have[WORLD] = 1; }
        else if (!strcmp(k, "ep")) { rc = parse_i64(k, v, 1, 1 << 24, &i, e); ts->ep = (int)i; have[EP] = 1; }
        else if (!strcmp(k, "seed")) { rc = parse_u64(k, v, &ts->seed, e); have[SEED] = 1; }
        else if (!strcmp(k, "rng")) { rc = parse_u64(k, v, &ts->rng, e); have[RNG] = 1; }
        else if (!strcmp(k, "bad_steps")) rc = parse_i64(k, v, 0, INT64_MAX, &ts->bad_steps, e);
        else if (!strcmp(k, "loss_ema")) rc = parse_f64(k, v, &ts->loss_ema, e);
        else if (!strcmp(k, "config")) {
            size_t len = strlen(v);
            if (len >= cn) rc = err_set(e, "trainer_state.yaml: the config block is %zu bytes, more than the %zu-byte buffer", len, cn);
            else memcpy(config_yaml, v, len + 1);
        }
    }
    for (int r = 0; r < NREQ && !rc; r++)
        if (!have[r]) rc = err_set(e, "trainer_state.yaml: missing '%s' (not written by this version of moetrain?)", req[r]);
    yaml_document_delete(&d);
    yaml_parser_delete(&p);
    return rc;
}
