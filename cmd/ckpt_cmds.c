// ckpt_cmds.c — `moetrain inspect` and `moetrain export` (see ckpt_cmds.h). argv[0] is the
// subcommand name.
#include "ckpt_cmds.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "config.h"
#include "hf.h"
#include "util.h"

static int user_error(const char* what, const Err* e) {
    fprintf(stderr, "moetrain: error: %s%s%s\n", what ? what : "", what ? ": " : "", e->msg);
    return 2;
}

static int usage_error(const char* usage, const char* msg) {
    fprintf(stderr, "moetrain: error: %s\nusage: %s\n", msg, usage);
    return 2;
}

int cmd_inspect(int argc, char** argv) {
    const char* usage = "moetrain inspect DIR   (a checkpoint step directory, its root, or its `latest` file)";
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("%s\n  step, layout, files with sizes and checksums (OK/BAD), tensors by group, the largest tensors;\n"
               "  exit 0 when every checksum holds, 1 otherwise\n", usage);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') return usage_error(usage, "inspect takes one checkpoint directory");
    Err e = {{0}};
    int rc = ckpt_inspect(argv[1], stdout, &e);
    if (rc < 0) return user_error("inspect", &e);
    return rc;
}

// "--flag VALUE" or "--flag=VALUE".
static int flag(int argc, char** argv, int* i, const char* name, const char** out) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return 0;
    if (argv[*i][n] == '=') {
        *out = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != 0) return 0;
    if (*i + 1 >= argc) return -1;
    *out = argv[++*i];
    return 1;
}

// The tokenizer beside the weights: --tokenizer, else the one the run recorded; none without.
static int export_tokenizer(const Config* c, const char* tok, const char* out, DType dtype, Err* e) {
    char found[CFG_STR + 32];
    if (tok && !strcmp(tok, "none")) return 0;
    if (!tok) {
        if (!hf_tokenizer_of_run(&c->data, found, sizeof found)) {
            printf("export: no tokenizer recorded by the run (data.tokenizer, or manifest.json beside the shards); "
                   "give --tokenizer PATH for AutoTokenizer to load the directory\n");
            return 0;
        }
        tok = found;
    }
    HfTokenIds ids;
    char desc[256];
    if (hf_export_tokenizer(tok, out, c->model.vocab_size, c->model.max_seq, &ids, desc, sizeof desc, e)) return -1;
    if (hf_write_config_ids(&c->model, out, dtype, &ids, e)) return -1;
    printf("export: tokenizer from %s: %s\n", tok, desc);
    return 0;
}

static const char export_usage[] =
    "moetrain export --ckpt DIR --out HF_DIR [--dtype bf16|fp32] [--tokenizer PATH|none]";

static void export_help(void) {
    printf("%s\n  writes a Hugging Face directory (config.json, model-*.safetensors, index) that\n"
           "  transformers loads as MixtralForCausalLM; the model config comes from the checkpoint's\n"
           "  trainer_state.yaml; optimizer state is not exported. Default dtype bf16.\n"
           "  --tokenizer PATH: a tokenizer.model, tokenizer.json, a directory holding them, or the shard\n"
           "  directory / manifest.json of scripts/tokenize_data.py; copied beside config.json, with its\n"
           "  BOS/EOS/PAD ids in config.json, so AutoTokenizer loads the directory. Default: the run's\n"
           "  data.tokenizer, else the manifest.json beside its data.path shards; none = no tokenizer.\n",
           export_usage);
}

typedef struct ExportArgs {
    const char *ckpt, *out, *tok;
    DType dtype;
} ExportArgs;

// Reads export's flags into a. Returns -1 to go on, else the command's exit code (0 after
// --help, 2 after a usage error, which it has printed).
static int export_args(int argc, char** argv, ExportArgs* a) {
    const char* dt = "bf16";
    *a = (ExportArgs){0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            export_help();
            return 0;
        }
        int r = 0;
        if ((r = flag(argc, argv, &i, "--ckpt", &a->ckpt)) || (r = flag(argc, argv, &i, "--out", &a->out)) ||
            (r = flag(argc, argv, &i, "--dtype", &dt)) || (r = flag(argc, argv, &i, "--tokenizer", &a->tok))) {
            if (r < 0) return usage_error(export_usage, "a flag lacks its value");
            continue;
        }
        char msg[300];
        snprintf(msg, sizeof msg, "unknown argument '%.200s'", argv[i]);
        return usage_error(export_usage, msg);
    }
    if (!a->ckpt || !a->out) return usage_error(export_usage, "export needs --ckpt and --out");
    if (!strcmp(dt, "bf16") || !strcmp(dt, "bfloat16")) a->dtype = DTYPE_BF16;
    else if (!strcmp(dt, "fp32") || !strcmp(dt, "f32") || !strcmp(dt, "float32")) a->dtype = DTYPE_F32;
    else return usage_error(export_usage, "--dtype must be bf16 or fp32");
    return -1;
}

// The run's config from the checkpoint's trainer_state.yaml (its config: section) into c, which
// holds the defaults. Returns 0, or the exit code after printing the error.
static int export_config(const Ckpt* ck, Config* c) {
    Err e = {{0}};
    const char* text = ckpt_trainer_state(ck);
    size_t cn = strlen(text) + 1;
    char* cfg_text = xmalloc(cn);
    TrainerState ts;
    char name[4200];
    snprintf(name, sizeof name, "%.4000s/trainer_state.yaml (config:)", ckpt_dir(ck));
    int rc = 0;
    if (trainer_state_parse(text, &ts, cfg_text, cn, &e)) rc = user_error(ckpt_dir(ck), &e);
    else if (!cfg_text[0]) {
        err_set(&e, "%s/trainer_state.yaml has no config: section, so the model shape is unknown", ckpt_dir(ck));
        rc = user_error("export", &e);
    } else if (config_load_string(c, cfg_text, strlen(cfg_text), name, &e)) {
        rc = user_error("export", &e);
    }
    free(cfg_text);
    return rc;
}

// "exported step S: N tensors, X MB bf16, to DIR".
static void export_summary(const Ckpt* ck, const ModelConfig* m, DType dtype, const char* out) {
    HfTensorSpec* spec;
    int n = hf_tensor_list(m, &spec);
    double bytes = 0;
    for (int i = 0; i < n; i++) bytes += (double)spec[i].shape[0] * (double)(spec[i].ndim > 1 ? spec[i].shape[1] : 1);
    bytes *= dtype == DTYPE_BF16 ? 2 : 4;
    free(spec);
    printf("exported step %lld: %d tensors, %.2f %s %s, to %s\n", (long long)ckpt_step(ck), n,
           bytes >= 1e9 ? bytes / 1e9 : bytes / 1e6, bytes >= 1e9 ? "GB" : "MB", dtype == DTYPE_BF16 ? "bf16" : "fp32", out);
}

int cmd_export(int argc, char** argv) {
    ExportArgs a;
    int rc = export_args(argc, argv, &a);
    if (rc >= 0) return rc;
    Err e = {{0}};
    Ckpt* ck = NULL;
    if (ckpt_open(&ck, a.ckpt, &e)) return user_error("export", &e);
    Config* c = xcalloc(1, sizeof *c);
    config_defaults(c);
    rc = export_config(ck, c);
    if (!rc && (hf_export(ck, &c->model, a.out, a.dtype, &e) || export_tokenizer(c, a.tok, a.out, a.dtype, &e)))
        rc = user_error("export", &e);
    if (!rc) export_summary(ck, &c->model, a.dtype, a.out);
    free(c);
    ckpt_close(ck);
    return rc;
}
