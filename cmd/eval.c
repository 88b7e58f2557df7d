// eval.c — `moetrain eval --ckpt DIR [--config X] [section.key=value ...]`: the validation loss
// and bits per token of a checkpoint (a step directory, a checkpoint root or its `latest`) or a
// Hugging Face directory (what checkpoint.init_from reads), computed exactly as the validation
// inside training (trainer_eval over train.eval_batches micro-batches per rank of the
// validation split of data.path), on the inference set-up (trainer_init_infer: the weights
// alone, no gradients or optimizer state; the same numbers).
//
// The config: --config X when given; else the resolved config stored in the checkpoint's
// trainer_state.yaml (for a Hugging Face directory: its config.json for the model, defaults for
// the rest); then the overrides. Launched on another world size than the checkpoint's, the
// layout follows unless overridden: parallel.ep becomes the largest divisor of both the world
// and model.experts not above the stored ep, and train.micro_batch keeps micro_batch × world
// (the sequences one validation round reads), so the numbers are those of the training run.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt.h"
#include "ckpt_cmds.h"
#include "cli.h"
#include "comm.h"
#include "data.h"
#include "hf.h"
#include "train.h"

static const char* USAGE = "moetrain eval --ckpt DIR [--config NAME|PATH] [section.key=value ...]";

int ckpt_is_hf_dir(const char* p) {
    struct stat st;
    size_t n = strlen(p);
    if (n > 12 && !strcmp(p + n - 12, ".safetensors")) return 1;
    char q[CFG_STR + 64];
    snprintf(q, sizeof q, "%s/model.safetensors.index.json", p);
    if (stat(q, &st) == 0) return 1;
    snprintf(q, sizeof q, "%s/model.safetensors", p);
    return stat(q, &st) == 0;
}

static int overridden(int argc, char** argv, const char* key) {
    size_t n = strlen(key);
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], key, n) && argv[i][n] == '=') return 1;
    return 0;
}

// Loads the config: --config, or the checkpoint's stored one, or config.json; then overrides.
// *ref_world receives the world size the micro-batch was meant for (0 = this world).
int eval_load_config(Config* c, int argc, char** argv, const char* ck, int hf, int* ref_world, Err* e) {
    const char* name = NULL;
    *ref_world = 0;
    if (cli_flag(argc, argv, 1, "--config", &name) || cli_flag(argc, argv, 1, "-c", &name)) {
        int argi = 1;
        return cli_load_config(c, argc, argv, &argi, e);
    }
    config_defaults(c);
    if (hf) {
        if (hf_read_config(ck, &c->model, e)) return -1;
        snprintf(c->source, sizeof c->source, "%s/config.json", ck);
    } else {
        Ckpt* k = NULL;
        if (ckpt_open_ex(&k, ck, 0, e)) return -1;  // sizes and headers; the crcs are checked on load
        const char* text = ckpt_trainer_state(k);
        size_t cn = strlen(text) + 1;
        char* cfg = xmalloc(cn);
        TrainerState ts;
        char where[CFG_STR + 64];
        snprintf(where, sizeof where, "%s/trainer_state.yaml (config:)", ckpt_dir(k));
        int rc = trainer_state_parse(text, &ts, cfg, cn, e);
        if (!rc && !cfg[0]) rc = err_set(e, "%s/trainer_state.yaml has no config: block; give --config", ckpt_dir(k));
        if (!rc) rc = config_load_string(c, cfg, strlen(cfg), where, e);
        if (!rc) snprintf(c->source, sizeof c->source, "%.400s", where);
        *ref_world = ts.world;
        free(cfg);
        ckpt_close(k);
        if (rc) return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (!strncmp(a, "--", 2)) {
            if (!strchr(a, '=') && i + 1 < argc && strncmp(argv[i + 1], "--", 2) && !strchr(argv[i + 1], '=')) i++;
            continue;
        }
        if (!strchr(a, '=')) return err_set(e, "unexpected argument '%s'; usage: %s", a, USAGE);
        if (config_override(c, a, e)) return -1;
    }
    return 0;
}

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

void eval_fit_ep(Config* c, int world) {
    if (world % c->parallel.ep == 0 && c->model.experts % c->parallel.ep == 0) return;
    int g = gcd(world, c->model.experts), ep = 1;
    for (int d = 1; d <= g; d++)
        if (g % d == 0 && d <= c->parallel.ep) ep = d;
    c->parallel.ep = ep;
}

void eval_forward_only(Config* c, const char* ck, const char* init_from) {
    c->checkpoint.dir[0] = 0;
    c->checkpoint.every = 0;
    c->checkpoint.required = 0;
    c->log.dir[0] = 0;
    c->train.keep_swiglu = 0;  // no backward here: nothing to keep, no arena to reserve for it
    if (init_from) {
        snprintf(c->checkpoint.init_from, sizeof c->checkpoint.init_from, "%s", init_from);
        snprintf(c->checkpoint.resume, sizeof c->checkpoint.resume, "none");
    } else {
        c->checkpoint.init_from[0] = 0;
        snprintf(c->checkpoint.resume, sizeof c->checkpoint.resume, "%s", ck);
    }
}

// The layout of this launch (the header's rules, unless overridden), and nothing saved: the
// weights from the Hugging Face directory (hf) or resumed from the checkpoint ck.
static void eval_layout(Config* c, int argc, char** argv, int world, int ref_world, const char* ck, int hf) {
    if (!overridden(argc, argv, "parallel.ep")) eval_fit_ep(c, world);
    if (ref_world && ref_world != world && !overridden(argc, argv, "train.micro_batch")) {
        long long seqs = (long long)c->train.micro_batch * ref_world;
        if (seqs % world == 0) c->train.micro_batch = (int)(seqs / world);
    }
    if (c->train.global_batch % (c->train.micro_batch * world)) c->train.global_batch = c->train.micro_batch * world;
    eval_forward_only(c, ck, hf ? ck : NULL);
}

// The command line, the config, its layout and its data. Returns 2 (usage) or 0.
static int eval_setup(int argc, char** argv, int world, Config* c, const char** ck, Err* e) {
    static const char* const known[] = {"--ckpt", NULL};
    int ref_world = 0;
    if (!cli_flag(argc, argv, 1, "--ckpt", ck) || !*ck || !(*ck)[0])
        return err_set(e, "eval needs --ckpt DIR (a checkpoint or a Hugging Face directory); usage: %s", USAGE), 2;
    if (cli_check_flags(argc, argv, 1, known, e)) return 2;
    const int hf = ckpt_is_hf_dir(*ck);
    if (eval_load_config(c, argc, argv, *ck, hf, &ref_world, e)) return 2;
    eval_layout(c, argc, argv, world, ref_world, *ck, hf);
    if (config_validate(c, world, e) || cli_resolve_data_path(c, e)) return 2;
    if (c->model.vocab_size != 256 && data_is_byte_level(&c->data))
        return err_set(e, "data.path %s is byte-level sequence data (tokens 0..255), but the model's vocabulary has %d "
                       "entries: a loss there measures nothing. Give data.path= token shards made with the model's "
                       "tokenizer (scripts/tokenize_data.py; docs/data.md)", c->data.path, c->model.vocab_size), 2;
    return 0;
}

static int eval_fail(int rank, Err* e) {
    if (rank == 0) cli_exit_error("eval", e);
    dist_finalize();
    return 2;
}

int cmd_eval(int argc, char** argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s\n  validation loss (nats per token) and bits per token of a checkpoint or a Hugging Face\n"
                   "  directory on the validation split of data.path, the numbers training reports; the config is\n"
                   "  the checkpoint's own unless --config is given. Launch with mpirun for several ranks.\n",
                   USAGE);
            return 0;
        }
    int world = 1;
    int rank = dist_init(&argc, &argv, &world);
    Err e = {{0}};
    Config c;
    const char* ck = NULL;
    if (dist_agree_error(eval_setup(argc, argv, world, &c, &ck, &e), &e)) return eval_fail(rank, &e);
    Trainer t;
    int st = trainer_init_infer(&t, &c, &e) ? 2 : 0;
    if (!st && data_num_windows(t.data, 1) == 0) {
        err_set(&e, "the data has no validation split (data.val_frac=0); give data.val_frac > 0 or another data.path");
        st = 2;
    }
    if (dist_agree_error(st, &e)) {
        trainer_free(&t);  // the watchdog's heartbeat file goes too
        return eval_fail(rank, &e);
    }
    EvalResult r = trainer_eval(&t, c.train.eval_batches);
    if (rank == 0) {
        printf("eval: %s (step %d): validation loss %.6f nats/token, %.6f bits/token over %lld tokens "
               "(world %d, ep %d, micro_batch %d, eval_batches %d)\n",
               ck, t.step, r.loss, r.bits_per_token, (long long)r.tokens, world, c.parallel.ep, c.train.micro_batch,
               c.train.eval_batches);
        printf("{\"eval\": \"%s\", \"step\": %d, \"val_loss\": %.6f, \"val_bits_per_token\": %.6f, \"tokens\": %lld}\n", ck,
               t.step, r.loss, r.bits_per_token, (long long)r.tokens);
        fflush(stdout);
    }
    trainer_free(&t);
    dist_finalize();
    return 0;
}
