// generate.c — `moetrain generate --ckpt DIR|HF_DIR (--prompt TEXT ... | --prompt-file F |
// --prompt-ids 1,2,3 ...) [--max-new N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
// [--tokenizer bytes|PATH] [--eos ID] [--print-ids] [--device D] [--dtype D] [section.key=value ...]`:
// continuations of several prompts at once, decoded with a KV cache (src/generate.c,
// docs/generate.md). The weights load as `eval` loads them (a checkpoint or an export), onto the
// layout of this launch: under mpirun the experts are sharded over parallel.ep as in training,
// every rank runs the same batch, and rank 0's draw is every rank's token.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_cmds.h"
#include "cli.h"
#include "comm.h"
#include "generate.h"
#include "hf.h"
#include "train.h"

static const char* USAGE =
    "moetrain generate --ckpt DIR|HF_DIR|none (--prompt TEXT ... | --prompt-file F | --prompt-ids 1,2,3 ...)\n"
    "         [--max-new N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tokenizer bytes|PATH]\n"
    "         [--eos ID] [--print-ids] [--device auto|cpu|cuda] [--dtype bf16|fp32] [section.key=value ...]";

typedef struct Prompts {
    int n;
    char** text;     // [n] or NULL entries for --prompt-ids
    int32_t** ids;   // [n] token ids
    int* len;        // [n]
} Prompts;

static void add_prompt(Prompts* p, const char* text) {
    p->text = realloc(p->text, sizeof(char*) * (size_t)(p->n + 1));
    p->ids = realloc(p->ids, sizeof(int32_t*) * (size_t)(p->n + 1));
    p->len = realloc(p->len, sizeof(int) * (size_t)(p->n + 1));
    CHECK(p->text && p->ids && p->len, "out of memory");
    p->text[p->n] = text ? xstrdup(text) : NULL;
    p->ids[p->n] = NULL;
    p->len[p->n] = 0;
    p->n++;
}

static int parse_ids(const char* s, int32_t** out, int* n, int V, Err* e) {
    int cap = 16, k = 0;
    int32_t* v = xmalloc(sizeof(int32_t) * (size_t)cap);
    const char* q = s;
    while (*q) {
        char* end;
        long x = strtol(q, &end, 10);
        if (end == q || x < 0 || x >= V) {
            free(v);
            return err_set(e, "--prompt-ids '%s': want comma-separated token ids in [0, %d)", s, V);
        }
        if (k == cap) v = realloc(v, sizeof(int32_t) * (size_t)(cap *= 2));
        v[k++] = (int32_t)x;
        q = end;
        while (*q == ',' || *q == ' ') q++;
    }
    if (!k) {
        free(v);
        return err_set(e, "--prompt-ids '%s' holds no ids", s);
    }
    *out = v;
    *n = k;
    return 0;
}


static int is_override(const char* a) { return strncmp(a, "--", 2) && strchr(a, '='); }

// Each non-empty line of path is a prompt.
static int read_prompt_file(Prompts* P, const char* path, Err* e) {
    FILE* f = fopen(path, "r");
    if (!f) return err_set(e, "--prompt-file %s: cannot open it", path);
    char* line = NULL;
    size_t cap = 0;
    ssize_t r;
    while ((r = getline(&line, &cap, f)) >= 0) {
        while (r > 0 && (line[r - 1] == '\n' || line[r - 1] == '\r')) line[--r] = 0;
        if (r) add_prompt(P, line);
    }
    free(line);
    fclose(f);
    return 0;
}

// The tokenizer: bytes for a vocabulary of 256, else SentencePiece (--tokenizer, the HF
// directory's own, or the one the run recorded). need_text: some prompt is text (not ids).
static int open_tokenizer(const char* tokspec, const char* hf_dir, const DataConfig* data, int V, int need_text,
                          SpModel** sp, int* bytes, Err* e) {
    char runtok[4096];
    const char* spec = tokspec;
    if (!spec && hf_dir) spec = hf_dir;
    if (!spec && V != 256 && hf_tokenizer_of_run(data, runtok, sizeof runtok)) spec = runtok;
    if (spec && !strcmp(spec, "bytes")) {
        *bytes = 1;
        if (V != 256) return err_set(e, "--tokenizer bytes needs a vocabulary of 256 (the model has %d)", V);
    } else if (spec && (tokspec || V != 256)) {
        Err te = {{0}};
        if (sp_open(sp, spec, &te)) {
            if (tokspec || need_text) return err_set(e, "tokenizer: %s", te.msg);
        } else if (sp_vocab(*sp) > V) {
            return err_set(e, "tokenizer %s has %d pieces, more than the model's vocabulary of %d", spec, sp_vocab(*sp), V);
        }
    } else if (V == 256) {
        *bytes = 1;
    }
    if (!*bytes && !*sp && need_text)
        return err_set(e, "the model's vocabulary has %d entries and no tokenizer was found: give --tokenizer "
                       "PATH (a SentencePiece tokenizer.model) or --prompt-ids", V);
    return 0;
}

// Every prompt as token ids: --prompt-ids parsed, text as bytes or SentencePiece pieces.
static int encode_prompts(Prompts* P, int bytes, SpModel* sp, int V, Err* e) {
    for (int i = 0; i < P->n; i++) {
        int bad = 0;
        if (!P->text[i]) {
            char* s = (char*)P->ids[i];
            bad = parse_ids(s, &P->ids[i], &P->len[i], V, e);
            free(s);
        } else if (bytes) {
            const size_t n = strlen(P->text[i]);
            P->ids[i] = xmalloc(sizeof(int32_t) * (n + 1));
            for (size_t j = 0; j < n; j++) P->ids[i][j] = (uint8_t)P->text[i][j];
            P->len[i] = (int)n;
        } else {
            P->len[i] = sp_encode(sp, P->text[i], 1, &P->ids[i]);
        }
        if (bad) return -1;
        if (P->len[i] == 0) return err_set(e, "prompt %d is empty", i + 1);
    }
    return 0;
}

// The launch's layout, as eval does: one micro-batch of every prompt (B of at most maxlen
// tokens), no data, nothing saved; the weights from init_from (an HF directory, "" for random
// weights) or, with init_from NULL, resumed from the checkpoint ck; --device and --dtype.
static int generate_config(Config* c, int world, int B, int maxlen, const char* ck, const char* init_from,
                           const char* dev, const char* dt, Err* e) {
    eval_fit_ep(c, world);
    c->train.micro_batch = B;
    c->train.seq_len = maxlen;
    c->train.global_batch = B * world;
    c->data.format = DATA_RANDOM;
    c->data.path[0] = c->data.val_path[0] = c->data.weights[0] = 0;
    c->data.required = 0;
    eval_forward_only(c, ck, init_from);
    Err oe = {{0}};
    char kv[64];
    if (dev) {
        snprintf(kv, sizeof kv, "train.device=%s", dev);
        if (config_override(c, kv, &oe)) return err_set(e, "--device %s: %s", dev, oe.msg);
    }
    if (dt) {
        snprintf(kv, sizeof kv, "precision.dtype=%s", dt);
        if (config_override(c, kv, &oe)) return err_set(e, "--dtype %s: %s", dt, oe.msg);
    }
    return 0;
}

// Rank 0's output: each prompt and its continuation (up to EOS), or the new ids with --print-ids.
static void print_outputs(const Prompts* P, int32_t* const* out, const int* nout, int print_ids, int bytes, SpModel* sp,
                          int eos) {
    const int B = P->n;
    for (int b = 0; b < B; b++) {
        if (print_ids) {
            for (int j = 0; j < nout[b]; j++) printf("%s%d", j ? "," : "", out[b][j]);
            printf("\n");
            continue;
        }
        if (B > 1) printf("--- %d\n", b + 1);
        if (P->text[b]) fputs(P->text[b], stdout);
        else {
            for (int j = 0; j < P->len[b]; j++) printf("%s%d", j ? "," : "[", P->ids[b][j]);
            printf("]");
        }
        for (int j = 0; j < nout[b]; j++) {
            if (out[b][j] == eos) break;
            if (bytes) putchar(out[b][j]);
            else if (sp) {
                char buf[256];
                size_t n = sp_piece_text(sp, out[b][j], buf, sizeof buf);
                fwrite(buf, 1, n, stdout);
            } else printf(" %d", out[b][j]);
        }
        printf("\n");
    }
}

// The command line: its flags, the prompts (--prompt, --prompt-ids, --prompt-file) and the
// config's argv (--config and the section.key=value overrides; prompts may hold '=').
typedef struct GenArgs {
    const char *ck, *pfile, *tokspec, *dev, *dt, *cfgname;
    int max_new, top_k, eos, print_ids;  // eos -2: the tokenizer's
    double temperature, top_p, seed;
    char** cargv;
    int cargc;
    int n_ids_prompts;  // prompts given as --prompt-ids
} GenArgs;

static int wants_help(int argc, char** argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

// The flags with their values, the prompts in their order, the config's argv. Returns 2 (usage) or 0.
static int parse_args(int argc, char** argv, GenArgs* g, Prompts* P, Err* e) {
    static const char* const known[] = {"--ckpt", "--prompt", "--prompt-file", "--prompt-ids", "--max-new",
                                        "--temperature", "--top-k", "--top-p", "--seed", "--tokenizer",
                                        "--eos", "--print-ids", "--device", "--dtype", NULL};
    *g = (GenArgs){.max_new = 64, .eos = -2, .temperature = 1.0, .top_p = 1.0};
    g->cargv = xcalloc((size_t)argc + 1, sizeof(char*));
    g->cargv[g->cargc++] = argv[0];
    int st = 0;
    for (int i = 1; i < argc && !st; i++) {
        const char* a = argv[i];
        const char* val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--print-ids")) {
            g->print_ids = 1;
        } else if (!strcmp(a, "--prompt") || !strcmp(a, "--prompt-ids")) {
            if (!val) err_set(e, "%s needs a value", a), st = 2;
            else {
                add_prompt(P, a[8] ? NULL : val);
                if (a[8]) {
                    P->text[P->n - 1] = NULL;
                    P->ids[P->n - 1] = (int32_t*)xstrdup(val);  // parsed once the vocabulary is known
                    g->n_ids_prompts++;
                }
                i++;
            }
        } else if (!strcmp(a, "--config") || !strcmp(a, "-c")) {
            if (!val) err_set(e, "--config needs a value"), st = 2;
            else g->cfgname = val, g->cargv[g->cargc++] = (char*)a, g->cargv[g->cargc++] = argv[++i];
        } else if (is_override(a)) {
            g->cargv[g->cargc++] = (char*)a;
        } else if (!strncmp(a, "--", 2)) {
            if (val && strncmp(val, "--", 2)) i++;
        } else {
            err_set(e, "unexpected argument '%s'; usage:\n%s", a, USAGE), st = 2;
        }
    }
    if (st || cli_check_flags(argc, argv, 1, known, e)) return 2;
    if (!cli_flag(argc, argv, 1, "--ckpt", &g->ck) || !g->ck || !g->ck[0])
        return err_set(e, "generate needs --ckpt DIR (a checkpoint or a Hugging Face directory); usage:\n%s", USAGE), 2;
    cli_flag(argc, argv, 1, "--prompt-file", &g->pfile);
    cli_flag(argc, argv, 1, "--tokenizer", &g->tokspec);
    cli_flag(argc, argv, 1, "--device", &g->dev);
    cli_flag(argc, argv, 1, "--dtype", &g->dt);
    if (cli_flag_int(argc, argv, 1, "--max-new", 0, 1 << 20, &g->max_new, e) ||
        cli_flag_int(argc, argv, 1, "--top-k", 0, 1 << 30, &g->top_k, e) ||
        cli_flag_int(argc, argv, 1, "--eos", -1, 1 << 30, &g->eos, e) ||
        cli_flag_double(argc, argv, 1, "--temperature", 0, 1e6, &g->temperature, e) ||
        cli_flag_double(argc, argv, 1, "--top-p", 0, 1, &g->top_p, e) ||
        cli_flag_double(argc, argv, 1, "--seed", 0, 9.0e15, &g->seed, e))
        return 2;
    if (g->pfile && read_prompt_file(P, g->pfile, e)) return 2;
    if (P->n == 0) return err_set(e, "no prompt: give --prompt TEXT, --prompt-file F or --prompt-ids 1,2,3"), 2;
    return 0;
}

// The run's config (the checkpoint's, the export's, or --config's for --ckpt none), the tokenizer,
// the prompts as ids (*maxlen the longest) and the launch's layout. Returns 2 (usage) or 0.
static int setup(GenArgs* g, Prompts* P, int world, Config* c, SpModel** sp, int* bytes, int* maxlen, Err* e) {
    const int random_init = !strcmp(g->ck, "none");  // decode benchmarks: --config's model, random weights
    if (random_init && !g->cfgname) return err_set(e, "--ckpt none (random weights) needs --config NAME|PATH"), 2;
    const int hf = !random_init && ckpt_is_hf_dir(g->ck);
    int ref_world = 0;
    if (eval_load_config(c, g->cargc, g->cargv, g->ck, hf, &ref_world, e)) return 2;
    const int V = c->model.vocab_size;
    // the tokenizer: bytes for 256 entries, else SentencePiece (--tokenizer, the export's, the run's)
    if (open_tokenizer(g->tokspec, hf ? g->ck : NULL, &c->data, V, P->n > g->n_ids_prompts, sp, bytes, e)) return 2;
    if (g->eos == -2) g->eos = *sp ? sp_eos(*sp) : -1;
    if (encode_prompts(P, *bytes, *sp, V, e)) return 2;
    *maxlen = 0;
    for (int i = 0; i < P->n; i++) *maxlen = P->len[i] > *maxlen ? P->len[i] : *maxlen;
    if (generate_config(c, world, P->n, *maxlen, g->ck, hf || random_init ? (hf ? g->ck : "") : NULL, g->dev, g->dt, e))
        return 2;
    return config_validate(c, world, e) ? 2 : 0;
}

// The continuations: out[b] (nout[b] tokens, EOS included) and the timings.
typedef struct GenOut {
    int32_t** out;
    int* nout;
    int steps, gen_tokens;
    double prefill_s, decode_s;
} GenOut;

// Prefill every prompt (tok: B rows of maxlen), then decode up to max_new tokens each: rank 0
// samples (one generator per sequence, seeded independently of the batch), every rank takes
// rank 0's draw; a sequence stops at EOS.
static void decode(Trainer* t, Gen* g, const GenArgs* a, const Prompts* P, int maxlen, int V, GenOut* o) {
    const int B = P->n, max_new = a->max_new;
    int32_t* tok = xcalloc((size_t)B * maxlen, sizeof(int32_t));
    int *last = xmalloc(sizeof(int) * B), *adv = xmalloc(sizeof(int) * B), *done = xcalloc((size_t)B, sizeof(int));
    Rng* rng = xmalloc(sizeof(Rng) * B);
    float* scratch = xmalloc(sizeof(float) * V);
    double* pick = xmalloc(sizeof(double) * B);
    const uint64_t seed = (uint64_t)a->seed;
    o->out = xcalloc((size_t)B, sizeof(int32_t*));
    o->nout = xcalloc((size_t)B, sizeof(int));
    o->steps = o->gen_tokens = 0;
    for (int b = 0; b < B; b++) {
        memcpy(tok + (size_t)b * maxlen, P->ids[b], sizeof(int32_t) * P->len[b]);
        last[b] = P->len[b] - 1;
        o->out[b] = xmalloc(sizeof(int32_t) * (size_t)(max_new + 1));
        rng_seed(&rng[b], seed * 0x9E3779B97F4A7C15ull + (uint64_t)b);  // per sequence: independent of the batch
    }
    t->be->sync(t->be);
    const double t0 = now_sec();
    gen_forward(g, tok, maxlen, P->len, last);
    t->be->sync(t->be);
    const double t1 = now_sec();
    for (int s = 0; s < max_new; s++) {
        for (int b = 0; b < B; b++) {
            pick[b] = 0;
            if (!done[b] && t->rank == 0)
                pick[b] = gen_sample(g->h_logits + (size_t)b * V, V, (float)a->temperature, a->top_k, (float)a->top_p,
                                     scratch, &rng[b]);
        }
        if (t->world > 1) t->comm->host_all_reduce_f64(t->comm, GROUP_WORLD, pick, (size_t)B);  // rank 0's draw everywhere
        int live = 0;
        for (int b = 0; b < B; b++) {
            adv[b] = 0;
            tok[b] = 0;
            if (done[b]) continue;
            const int32_t x = (int32_t)pick[b];
            o->out[b][o->nout[b]++] = x;
            o->gen_tokens++;
            if (x == a->eos) {
                done[b] = 1;
                continue;
            }
            adv[b] = 1;
            tok[b] = x;
            live++;
        }
        if (!live || s + 1 == max_new) break;
        gen_forward(g, tok, 1, adv, NULL);
        o->steps++;
    }
    t->be->sync(t->be);
    o->prefill_s = t1 - t0;
    o->decode_s = now_sec() - t1;
    free(rng), free(scratch), free(pick), free(tok), free(last), free(adv), free(done);
}

static int fail(int rank, Err* e) {
    if (rank == 0) cli_exit_error("generate", e);
    dist_finalize();
    return 2;
}

int cmd_generate(int argc, char** argv) {
    if (wants_help(argc, argv)) {
        printf("%s\n  continues each prompt (batched) with a KV cache; greedy at --temperature 0. Tokenizer:\n"
               "  bytes for a vocabulary of 256, else a SentencePiece tokenizer.model (--tokenizer, the\n"
               "  export's own, or the one the run recorded). Defaults: --max-new 64 --temperature 1 --top-k 0\n"
               "  (off) --top-p 1 (off) --seed 0. Stops at EOS. Launch with mpirun to shard the experts.\n"
               "  --ckpt none --config X: random weights of X's model (decode benchmarks).\n"
               "  docs/generate.md\n",
               USAGE);
        return 0;
    }
    int world = 1;
    const int rank = dist_init(&argc, &argv, &world);
    Err e = {{0}};
    GenArgs a;
    Prompts P = {0};
    Config c;
    SpModel* sp = NULL;
    int bytes = 0, maxlen = 0;
    int st = parse_args(argc, argv, &a, &P, &e);
    if (!st) st = setup(&a, &P, world, &c, &sp, &bytes, &maxlen, &e);
    if (dist_agree_error(st, &e)) return fail(rank, &e);
    Trainer t;
    log_set_stream(NULL);  // the trainer's setup notes (data, resume position) say nothing here
    st = trainer_init_infer(&t, &c, &e) ? 2 : 0;
    log_set_stream(stderr);
    if (dist_agree_error(st, &e)) {
        trainer_free(&t);  // the watchdog's heartbeat file goes too
        return fail(rank, &e);
    }
    const int B = P.n, Tmax = maxlen + (a.max_new > 0 ? a.max_new : 1);
    if (rank == 0 && Tmax > c.model.max_seq)
        log_info("generate: note: %d positions exceed model.max_seq=%d (RoPE extrapolates; quality may drop)\n", Tmax,
                 c.model.max_seq);
    Gen g;
    gen_create(&g, &t.model, Tmax);
    GenOut o;
    decode(&t, &g, &a, &P, maxlen, c.model.vocab_size, &o);
    if (rank == 0) {
        print_outputs(&P, o.out, o.nout, a.print_ids, bytes, sp, a.eos);
        fflush(stdout);
        int prompt_tok = 0;
        for (int b = 0; b < B; b++) prompt_tok += P.len[b];
        log_info("generate: %s (step %d): %d sequence(s), %d prompt tokens, %d new tokens on %s (world %d, ep %d, %s): prefill %.3f s, "
                 "%d decode steps in %.3f s (%.1f tokens/s)\n",
                 a.ck, t.step, B, prompt_tok, o.gen_tokens, t.be->name, world, c.parallel.ep, dtype_name(t.be->act_dtype),
                 o.prefill_s, o.steps, o.decode_s, o.steps ? (double)o.steps * B / o.decode_s : 0.0);
    }
    gen_free(&g);
    for (int b = 0; b < B; b++) free(o.out[b]), free(P.ids[b]), free(P.text[b]);
    free(o.out), free(o.nout), free(P.ids), free(P.text), free(P.len), free(a.cargv);
    if (sp) sp_close(sp);
    trainer_free(&t);
    dist_finalize();
    return 0;
}
