// train.c — see train.h.
#define _POSIX_C_SOURCE 200809L
#include "train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "failpoint.h"
#include "logfile.h"
#include "stop.h"
#include "watchdog.h"
#include "util.h"


static int mkdir_p(const char* path) {
    char buf[CFG_STR];
    snprintf(buf, sizeof buf, "%s", path);
    for (char* p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) && errno != EEXIST) return -1;
            *p = '/';
        }
    }
    if (mkdir(buf, 0755) && errno != EEXIST) return -1;
    return 0;
}

// On resume: drop the lines of metrics.jsonl for steps after the checkpoint (a run that died
// after its last save logged steps that the resumed run repeats), so the trace joins without
// duplicates. Rewritten through a temporary file and rename; every write checked.
static int metrics_trim(const char* path, int step, Err* e) {
    FILE* f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 0 : err_set(e, "%s: cannot read: %s", path, strerror(errno));
    char tmp[CFG_STR + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    LogFile o;
    if (logfile_open(&o, tmp, 0, e)) {
        fclose(f);
        return -1;
    }
    char* line = NULL;
    size_t cap = 0;
    int dropped = 0, rc = 0;
    ssize_t len;
    while (!rc && (len = getline(&line, &cap, f)) > 0) {
        const char* s = strstr(line, "\"step\": ");
        if ((s && atoi(s + 8) > step) || line[len - 1] != '\n') {  // later steps, or a torn last line
            dropped++;
            continue;
        }
        rc = logfile_write(&o, line, (size_t)len, e);
    }
    if (!rc && ferror(f)) rc = err_set(e, "%s: read failed", path);
    free(line);
    fclose(f);
    if (logfile_close(&o, rc ? NULL : e)) rc = -1;
    if (!rc && rename(tmp, path)) rc = err_set(e, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (rc) {
        remove(tmp);
        return -1;
    }
    if (dropped) log_info("log: dropped %d line(s) of %s after step %d (resumed from there)\n", dropped, path, step);
    return 0;
}

// ---- start-up under the watchdog (watchdog.h: step 0) ------------------------------------------
// Each stage of trainer_init is watched with train.timeout_s, the checkpoint restore with
// max(train.timeout_s, 4 x the whole checkpoint's bytes over the write rate measured in
// checkpoint.dir, or 100 MB/s without one). Tests: the failpoint train.startup_stall "R:WORD"
// stops rank R for good at the end of the stage whose name holds WORD, "R:WORD:begin" at its
// beginning (its watchdog thread goes on publishing).
static int stall_here(const char* stage, int begin) {
    const char* v = failpoint_value("train.startup_stall");
    const char* colon = v ? strchr(v, ':') : NULL;
    if (!stage || !colon || atoi(v) != util_rank()) return 0;
    char word[128];
    snprintf(word, sizeof word, "%s", colon + 1);
    char* tail = strstr(word, ":begin");
    if (!!tail != begin) return 0;
    if (tail) *tail = 0;
    return strstr(stage, word) != NULL;
}

static void startup_stage(const char* stage, double timeout) {
    static const char* prev = NULL;
    if (stall_here(prev, 0))
        for (;;) pause();
    prev = stage;
    watchdog_timeout(timeout);
    watchdog_stage(0, stage);
    if (stall_here(stage, 1))
        for (;;) pause();
}

// A token for this job's heartbeat files that every rank finds without communication (the
// launcher's job id: Open MPI's, PMIx's, Slurm's step), hashed to 16 hex digits; "" when
// unknown. One rank needs none: a random one.
static void launcher_token(char token[17], int world) {
    const char* ompi = getenv("OMPI_MCA_orte_precondition_transports");  // Open MPI 4: random per job
    const char* pmix = getenv("PMIX_NAMESPACE");                          // Open MPI 5, srun --mpi=pmix
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    char id[512] = "";
    if (world == 1) snprintf(id, sizeof id, "pid %d at %.9f", (int)getpid(), now_sec());
    else if (ompi && *ompi) snprintf(id, sizeof id, "ompi %.400s", ompi);
    else if (pmix && *pmix) snprintf(id, sizeof id, "pmix %.400s", pmix);
    else if (job && *job && step && *step) snprintf(id, sizeof id, "slurm %.200s.%.200s", job, step);
    token[0] = 0;
    if (!id[0]) return;
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (const char* c = id; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    snprintf(token, 17, "%016llx", (unsigned long long)h);
}

// The backend of this rank; *why says why train.device=auto fell back to the CPU.
static Backend* make_backend(const Config* cfg, Err* e, Err* why) {
    DeviceKind dev = cfg->train.device;
    if (dev == DEVICE_CUDA || dev == DEVICE_AUTO) {
        Err ce = {{0}};
        // one GPU per rank (node-local rank); parallel.comm=mpi lets ranks share GPUs (local rank mod count)
        int gpu = dist_local_rank();
        const int ngpu = cfg->parallel.comm == COMM_MPI ? cuda_device_count() : 0;
        if (ngpu > 0) gpu %= ngpu;
        Backend* be = cuda_backend_create(cfg->precision.dtype, gpu, &cfg->gpu, &ce);
        if (be) return be;
        if (dev == DEVICE_CUDA) {
            err_set(e, "train.device=cuda, but no CUDA backend: %s", ce.msg);
            return NULL;
        }
        err_set(why, "%s", ce.msg);
    }
    return cpu_backend_create();
}

// The backend (every rank on the same kind, agreed first), its Comm, this rank's place in the world.
static int open_backend(Trainer* t, const Config* cfg, Err* e) {
    Err why = {{0}};
    t->be = make_backend(cfg, e, &why);
    startup_stage("start-up: communicator", cfg->train.timeout_s);
    // Every rank must end up on the same kind of backend (NCCL and MPI communicators do not mix,
    // and a rank that fails here must not leave the others waiting in a collective): agree first.
    if (dist_agree_error(t->be ? 0 : 2, e)) {
        if (t->be) t->be->destroy(t->be), t->be = NULL;
        return -1;
    }
    const int on_gpu = strcmp(t->be->name, "cuda") == 0;
    if (dist_agree_status(on_gpu) && dist_agree_status(!on_gpu)) {  // some ranks on GPUs, some not
        Err mixed = {{0}};
        if (!on_gpu)
            err_set(&mixed, "train.device=auto: this rank found no usable GPU (%s) while other ranks use GPUs; "
                            "launch one rank per GPU, or set train.device=cpu", why.msg);
        dist_agree_error(on_gpu ? 0 : 2, &mixed);
        *e = mixed;
        t->be->destroy(t->be), t->be = NULL;
        return -1;
    }
    if (on_gpu && cfg->model.hidden / cfg->model.heads > 256) {  // every rank is on a GPU here: all return alike
        t->be->destroy(t->be), t->be = NULL;
        return err_set(e, "the head dim model.hidden / model.heads = %d exceeds 256, the CUDA attention kernels' limit: "
                       "raise model.heads, or train on the CPU (train.device=cpu)", cfg->model.hidden / cfg->model.heads);
    }
    if (!on_gpu && why.msg[0]) log_info("device: no GPU (%s); using the CPU backend\n", why.msg);
    if (!on_gpu && cfg->precision.dtype != DTYPE_F32)
        log_info("device: the CPU backend computes in fp32 (precision.dtype=%s applies on GPUs)\n",
                 dtype_name(cfg->precision.dtype));
    // parallel.comm: NCCL (auto on GPUs) or MPI; device buffers go through host memory for MPI
    if (dist_agree_error(!on_gpu && cfg->parallel.comm == COMM_NCCL
                             ? err_set(e, "parallel.comm=nccl needs the CUDA backend (this rank runs on the CPU); "
                                          "use parallel.comm=auto or mpi")
                             : 0,
                         e)) {
        t->be->destroy(t->be), t->be = NULL;
        return -1;
    }
    const CommOpts co = {.ep = cfg->parallel.ep, .staged = cfg->parallel.comm == COMM_MPI};
    Err ce = {{0}};
    t->comm = t->be->comm_create(t->be, &co, &ce);
    CHECK(t->comm, "could not create the communicator: %s", ce.msg);
    t->comm = comm_watched(t->comm);  // its collective calls counted for the watchdog
    if (co.staged && on_gpu)
        log_info("comm: parallel.comm=mpi: collectives over MPI, device buffers staged through page-locked host memory\n");
    t->world = t->comm->size[GROUP_WORLD];
    t->rank = t->comm->rank[GROUP_WORLD];
    return 0;
}

// The data, and whether packed documents stay apart (data.documents).
static int open_data(Trainer* t, const Config* cfg, Err* e) {
    const TrainConfig* tc = &cfg->train;
    if (data_open(&t->data, &cfg->data, cfg->model.vocab_size, tc->seq_len, tc->seed, e)) return -1;
    char desc[512];
    data_describe(t->data, desc, sizeof desc);
    log_info("data: %s\n", desc);
    int natural = 0;
    const int sep = data_doc_sep(t->data, &natural);
    const DocMode dm = cfg->data.documents;
    if (dm == DOCS_ON && sep < 0)
        return err_set(e, "data.documents=on, but this data marks no document boundaries (byte-level records "
                       "end with data.sep_token, which must not occur inside a record; .bin shards need their "
                       "EOS token; random tokens have none); use data.documents=auto or off");
    t->doc_sep = dm == DOCS_ON || (dm == DOCS_AUTO && natural) ? sep : -1;
    if (t->doc_sep >= 0)
        log_info("data: documents kept apart (end token %d): block-diagonal attention, positions %s, boundary "
                 "predictions %s\n", t->doc_sep, cfg->data.reset_positions ? "restart per document" : "per window",
                 cfg->data.mask_boundary_loss ? "not scored" : "scored");
    else
        log_info("data: documents off (data.documents=%s): attention and positions run across the window\n",
                 dm == DOCS_OFF ? "off" : "auto");
    return 0;
}

// Rank 0 with log.dir: the resolved config.yaml, and metrics.jsonl open (trimmed to the resumed
// step, or an earlier run's rotated aside).
static int open_log_dir(Trainer* t, const Config* cfg, Err* e) {
    if (t->rank != 0 || !cfg->log.dir[0]) return 0;
    if (mkdir_p(cfg->log.dir)) return err_set(e, "log.dir %s: cannot create it (%s)", cfg->log.dir, strerror(errno));
    char p[CFG_STR + 32];
    snprintf(p, sizeof p, "%s/config.yaml", cfg->log.dir);
    size_t len = 0;
    char* text = config_print_text(cfg, &len);
    Err le = {{0}};
    int bad = logfile_write_whole(p, text, len, &le);
    free(text);
    if (bad) return err_set(e, "log.dir: %s (free space there, or give another log.dir)", le.msg);
    snprintf(p, sizeof p, "%s/metrics.jsonl", cfg->log.dir);
    if (t->step > 0 && metrics_trim(p, t->step, &le))
        return err_set(e, "log.dir: %s (free space there, or give another log.dir)", le.msg);
    struct stat ms;
    if (t->step == 0 && stat(p, &ms) == 0 && S_ISREG(ms.st_mode) && ms.st_size > 0) {
        // a fresh run into a used log.dir: the earlier run's metrics are kept, rotated aside
        char q[CFG_STR + 48];
        int k = 1;
        do snprintf(q, sizeof q, "%s.%d", p, k++);
        while (stat(q, &ms) == 0 && k < 100000);
        if (rename(p, q)) return err_set(e, "log.dir: cannot move the earlier %s aside: %s", p, strerror(errno));
        log_info("log: %s of an earlier run moved to %s (a fresh run; resume to append)\n", p, q);
    }
    if (logfile_open(&t->metrics, p, t->step > 0, &le)) return err_set(e, "log.dir: %s", le.msg);
    return 0;
}

// A job-wide token for the watchdog's heartbeat files (watchdog.h): rank 0's, on every rank.
static void job_token(Trainer* t, char token[17]) {
    if (t->rank == 0 && !token[0]) random_id(token, 17);
    t->comm->host_broadcast(t->comm, GROUP_WORLD, token, 17, 0);
}

// The model, its optimizer (training only) and the host buffers of one micro-batch.
static void create_model(Trainer* t, const Config* cfg, int infer) {
    const TrainConfig* tc = &cfg->train;
    const ModelOpts mo = {.keep_swiglu = tc->keep_swiglu && !infer,
                          .expert_grad_act = !infer && config_expert_grad_bf16(cfg, t->world),
                          .fp8 = cfg->precision.fp8, .inference = infer};
    model_create_opts(&t->model, &cfg->model, tc->micro_batch, tc->seq_len, &mo, t->be, t->comm);
    if (!infer) {
        optim_create(&t->opt, &cfg->optim, cfg->parallel.zero1, cfg->precision.master, tc->steps, &t->model);
        t->opt.zero_grads = 0;  // each step's first micro-batch overwrites the gradients (MicroArgs.fresh)
    }
    const int N = t->model.N;
    t->h_tok = xmalloc(sizeof(int32_t) * (size_t)N);
    t->h_tgt = xmalloc(sizeof(int32_t) * (size_t)N);
    t->h_win = xmalloc(sizeof(int32_t) * (size_t)(tc->seq_len + 1));
    t->h_doc = xmalloc(sizeof(int32_t) * (size_t)N);
    t->h_pos = xmalloc(sizeof(int32_t) * (size_t)N);
    t->best_val = INFINITY;  // until a validation, or the checkpoint's record
}

static int init_stages(Trainer* t, const Config* cfg, int infer, Err* e) {
    memset(t, 0, sizeof *t);
    t->infer = infer;
    t->metrics.fd = -1;  // not open (trainer_free may run after any failure below; fd 0 is stdin)
    t->cfg = *cfg;
    t->t_start = now_sec();
    const TrainConfig* tc = &cfg->train;
    // The watchdog from here on; before the communicator only where the launcher names the job.
    const double to = tc->timeout_s;
    const char* hb_dir = cfg->checkpoint.dir[0] ? cfg->checkpoint.dir : cfg->log.dir;
    char token[17];
    launcher_token(token, dist_world_size());
    if (token[0]) watchdog_start(util_rank(), dist_world_size(), hb_dir, token, to);
    startup_stage("start-up: device", to);
    if (open_backend(t, cfg, e)) return -1;
    job_token(t, token);
    watchdog_start(t->rank, t->world, hb_dir, token, to);
    watchdog_token(token);
    if (dist_agree_error(model_fp8_check(t->be, cfg->precision.fp8, e) ? 2 : 0, e)) return -1;
    t->n_micro = tc->global_batch / (tc->micro_batch * t->world);
    if (!infer) {  // the directory and its lock before anything slow: a second run is refused at once
        startup_stage("start-up: checkpoint.dir check", to);
        if (trainer_preflight_dir(t, e)) return -1;
        startup_stage("start-up: checkpoint.dir lock", to);
        if (trainer_own(t, e)) return -1;
    }

    startup_stage("start-up: data", to);
    if (open_data(t, cfg, e)) return -1;
    const long slow = failpoint_int("train.startup_sleep", 0);  // tests: a slow start-up (signals during it)
    if (slow > 0) sleep((unsigned)slow);

    startup_stage("start-up: model", to);
    create_model(t, cfg, infer);

    if (infer) {  // writes nothing, owns nothing: the restore's allowance for a checkpoint with
                  // optimizer state (verified whole)
        t->ckpt_bytes = 12.0 * (double)params_count(&cfg->model).total;
    } else {
        startup_stage("start-up: checkpoint.dir space", to);
        if (trainer_preflight_space(t, e)) return -1;  // before anything is restored or trained
    }
    const double read_s = 4 * t->ckpt_bytes / (t->write_rate > 0 ? t->write_rate : 1e8);
    startup_stage("start-up: checkpoint restore", to > 0 && read_s > to ? read_s : to);
    if (trainer_restore(t, e)) return -1;
    if (infer) return 0;
    startup_stage("start-up: run id, log.dir", to);
    if (trainer_own_after(t, e)) return -1;
    if (open_log_dir(t, cfg, e)) return -1;
    return 0;
}

static int init_mode(Trainer* t, const Config* cfg, int infer, Err* e) {
    const int rc = init_stages(t, cfg, infer, e);
    watchdog_timeout(0);  // not watched until trainer_run names its stages
    watchdog_stage(0, rc ? "start-up failed (agreeing on the error)" : "start-up done");
    return rc;
}

int trainer_init(Trainer* t, const Config* cfg, Err* e) { return init_mode(t, cfg, 0, e); }

int trainer_init_infer(Trainer* t, const Config* cfg, Err* e) { return init_mode(t, cfg, 1, e); }

void trainer_free(Trainer* t) {
    watchdog_stop();
    if (t->rank == 0) trainer_release(t);
    ckpt_set_run_id(NULL);
    trainer_save_release(t);
    Err le = {{0}};
    if (logfile_close(&t->metrics, &le) && !t->log_failed)
        fprintf(stderr, "moetrain: error: %s (the metrics of the last steps may be lost)\n", le.msg);
    if (!t->infer && t->model.be) optim_free(&t->opt, &t->model);
    if (t->model.be) model_free(&t->model);
    if (t->data) data_close(t->data);
    free(t->h_tok);
    free(t->h_tgt);
    free(t->h_win);
    free(t->h_doc);
    free(t->h_pos);
    if (t->comm) t->comm->destroy(t->comm);
    if (t->be) t->be->destroy(t->be);
}

int64_t trainer_fill_batch(Trainer* t, int split, uint64_t first) {
    const int T = t->cfg.train.seq_len, sep = t->doc_sep;
    const DataConfig* dc = &t->cfg.data;
    int64_t scored = (int64_t)t->model.B * T;
    for (int b = 0; b < t->model.B; b++) {
        data_get(t->data, split, first + (uint64_t)b, t->h_win);
        int32_t *tok = t->h_tok + (size_t)b * T, *tgt = t->h_tgt + (size_t)b * T;
        memcpy(tok, t->h_win, sizeof(int32_t) * (size_t)T);
        memcpy(tgt, t->h_win + 1, sizeof(int32_t) * (size_t)T);
        if (sep < 0) continue;
        int32_t *doc = t->h_doc + (size_t)b * T, *pos = t->h_pos + (size_t)b * T;
        data_doc_starts(t->h_win, T, sep, doc);
        for (int i = 0; i < T; i++) {
            pos[i] = i - doc[i];
            if (dc->mask_boundary_loss && tok[i] == sep) tgt[i] = -1, scored--;
        }
    }
    return scored;
}

// The micro-batch's document arrays (NULL when data.documents is off).
static void micro_docs(const Trainer* t, MicroArgs* a) {
    a->doc = t->doc_sep >= 0 ? t->h_doc : NULL;
    a->pos = t->doc_sep >= 0 && t->cfg.data.reset_positions ? t->h_pos : NULL;
}

EvalResult trainer_eval(Trainer* t, int batches) {
    EvalResult r = {0};
    const int B = t->model.B;
    uint64_t nwin = data_num_windows(t->data, 1);
    uint64_t per_round = (uint64_t)B * (uint64_t)t->world;
    int n = batches > 0 ? batches : (int)((nwin + per_round - 1) / per_round);
    if ((uint64_t)n * per_round > nwin && nwin >= per_round) n = (int)(nwin / per_round);
    if (n < 1) n = 1;
    double sums[2] = {0, 0};  // CE sum, tokens
    MicroArgs a = {.tokens = t->h_tok, .targets = t->h_tgt, .backward = 0};
    micro_docs(t, &a);
    for (int j = 0; j < n; j++) {
        trainer_fill_batch(t, 1, (uint64_t)j * per_round + (uint64_t)t->rank * B);
        StepLoss l = model_step(&t->model, &a);
        sums[0] += l.ce_sum;
        sums[1] += (double)l.ntok;
    }
    t->comm->host_all_reduce_f64(t->comm, GROUP_WORLD, sums, 2);
    r.tokens = (int64_t)sums[1];
    r.loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
    r.bits_per_token = r.loss / log(2.0);
    return r;
}

// The step's record for metrics.c (rank 0): metrics.jsonl always, the console line when `print`.
static void log_step(Trainer* t, int step, double loss, double ce, double aux, const StepStats* st, double step_s,
                     const EvalResult* ev, int print) {
    if (t->rank != 0) return;
    const int E = t->cfg.model.experts;
    double load[64], mx = 0, mean = 0;
    model_expert_load(&t->model, load);
    for (int i = 0; i < E; i++) {
        mean += load[i] / E;
        if (load[i] > mx) mx = load[i];
    }
    MetricsStep ms = {.step = step + 1, .loss = loss, .ce = ce, .aux = aux, .lr = st->lr, .grad_norm = st->grad_norm,
                      .skipped = st->skipped, .step_s = step_s, .tokens = t->tokens,
                      .load_max_over_mean = mean > 0 ? mx / mean : 0, .has_val = ev != NULL,
                      .val_loss = ev ? ev->loss : NAN, .val_bits = ev ? ev->bits_per_token : NAN};
    char line[2048];
    const size_t n = metrics_step(&t->met, &ms, print, line, sizeof line);
    if (t->metrics.fd >= 0 && !t->log_failed && logfile_write(&t->metrics, line, n, &t->log_err)) t->log_failed = 1;
}

// Step s's forward and backward over this rank's micro-batches: *ce the mean CE over the world's
// scored targets (count_scored: counted first, else every one of the gtok), *aux and *z this
// rank's router losses (means over its micro-batches).
static void forward_backward(Trainer* t, MicroArgs* a, int s, int count_scored, double gtok, double* ce, double* aux,
                             double* z) {
    const TrainConfig* tc = &t->cfg.train;
    const int B = t->model.B;
    double scored = gtok;
    *ce = *aux = *z = 0;
    watchdog_stage(s + 1, "forward/backward (expert all-to-all)");
    if (count_scored) {
        scored = 0;
        for (int j = 0; j < t->n_micro; j++)
            scored += (double)trainer_fill_batch(t, 0, (uint64_t)s * tc->global_batch + (uint64_t)j * B * t->world +
                                                           (uint64_t)t->rank * B);
        t->comm->host_all_reduce_f64(t->comm, GROUP_WORLD, &scored, 1);
        if (scored < 1) scored = 1;
        a->ce_scale = (float)(1.0 / scored);
    }
    for (int j = 0; j < t->n_micro; j++) {
        uint64_t first = (uint64_t)s * tc->global_batch + (uint64_t)j * B * t->world + (uint64_t)t->rank * B;
        trainer_fill_batch(t, 0, first);
        a->fresh = j == 0;
        StepLoss l = model_step(&t->model, a);
        *ce += l.ce_sum;
        *aux += l.aux / t->n_micro;
        *z += l.z / t->n_micro;
    }
    watchdog_stage(s + 1, "loss all-reduce");
    t->comm->host_all_reduce_f64(t->comm, GROUP_WORLD, ce, 1);
    *ce /= scored;
}

// The optimizer's update for step s, or none for a non-finite loss (the gradients discarded).
static StepStats update(Trainer* t, int s, double loss) {
    watchdog_stage(s + 1, "optimizer (gradient reduction, ZeRO-1 gather)");
    if (!isfinite(loss)) {  // skip the update; the gradients are discarded
        for (int ar = 0; ar < 2; ar++) t->be->zero(t->be, t->model.grad[ar], sizeof(float) * t->model.padded[ar]);
        return (StepStats){.grad_norm = NAN, .lr = optim_lr(&t->cfg.optim, t->cfg.train.steps, s), .skipped = 1};
    }
    return optim_step(&t->opt, &t->model, s, (int)t->updates + 1);
}

// The run's state across steps: the micro-batch arguments, the loss's scale and the watchdog's
// allowances (a step's grows with the slowest step seen, a save's with the checkpoint's size).
typedef struct RunState {
    MicroArgs a;
    int count_scored;  // data.mask_boundary_loss: the scored targets are counted over the world first
    double gtok;       // the world's tokens per step
    double base_to, step_to, save_to, slowest;
    int evb;           // validation batches, for the validation's allowance
    long fail_rank;    // tests: this rank fails at its second step
} RunState;

enum { RUN_ON = -1 };  // a step's helpers: go on with the next step (else an exit code)

// Before the first step: the micro-batch arguments, metrics, the signal handling, the watchdog
// and the run's opening line.
static void run_start(Trainer* t, RunState* r) {
    const TrainConfig* tc = &t->cfg.train;
    const ModelConfig* mc = &t->cfg.model;
    const int B = t->model.B, T = tc->seq_len;
    r->gtok = (double)tc->global_batch * T;
    r->a = (MicroArgs){.tokens = t->h_tok, .targets = t->h_tgt, .backward = 1};
    micro_docs(t, &r->a);
    // the loss is the mean CE over the step's scored targets (all of them unless
    // data.mask_boundary_loss drops some: then they are counted over the world before the step)
    r->count_scored = t->doc_sep >= 0 && t->cfg.data.mask_boundary_loss;
    r->a.ce_scale = (float)(1.0 / r->gtok);
    r->a.aux_scale = mc->aux_coef / (float)t->n_micro;
    r->a.z_scale = mc->z_coef / (float)t->n_micro;
    const double flops_tok = params_train_flops_per_token(mc, T);
    if (t->rank == 0) {
        metrics_init(&t->met, t->be, stdout, tc->steps, t->world, r->gtok, flops_tok, t->cfg.log.peak_tflops, t->t_start);
        t->met.run_id = t->run_id;  // first in every metrics.jsonl line
    }
    const int bf16_egrad = t->model.grad_act[ARENA_EXPERT] && t->be->act_dtype == DTYPE_BF16;
    const char* notes = t->opt.split ? (bf16_egrad ? " (split fp32 masters, bf16 expert gradients)" : " (split fp32 masters)")
                                     : (bf16_egrad ? " (bf16 expert gradients)" : "");
    stop_running();  // a signal from here on saves a checkpoint (start-up signals exit 3 at once)
    // The first step's allowance: 10 x the plan's time at a modest rate (CPU 5 GFLOP/s per rank,
    // GPU 100 TFLOP/s), at least train.timeout_s.
    const double first_est = flops_tok * (double)B * T * t->n_micro / (strcmp(t->be->name, "cuda") ? 5e9 : 1e14);
    r->base_to = tc->timeout_s;
    r->step_to = r->base_to > 0 && 10 * first_est > r->base_to ? 10 * first_est : r->base_to;
    r->slowest = 0;
    r->save_to = r->base_to > 0 && t->write_rate > 0 && 4 * t->ckpt_rank_bytes / t->write_rate > r->base_to
                     ? 4 * t->ckpt_rank_bytes / t->write_rate : r->base_to;
    r->evb = tc->eval_batches > 0 ? tc->eval_batches : 64;
    watchdog_timeout(r->step_to);  // the watchdog runs since trainer_init
    log_info("train: %d steps from step %d, global batch %d x %d tokens, %d micro-batch(es) of %d per rank, world %d (ep %d x edp %d), backend %s/%s%s\n",
             tc->steps, t->step, tc->global_batch, T, t->n_micro, B, t->world, t->model.ep, t->model.edp,
             t->be->name, dtype_name(t->be->act_dtype), notes);
    if (t->model.fp8 != FP8_NONE)
        log_info("precision: fp8=%s: %s GEMMs in block-scaled FP8 e4m3, %.1f MiB workspace\n", fp8_mode_name(t->model.fp8),
                 t->model.fp8 == FP8_LINEAR ? "expert and attention-projection" : "expert", t->model.fp8_ws / 1048576.0);
    if (t->cfg.checkpoint.keep_best && !t->cfg.checkpoint.dir[0])
        log_info("checkpoint: checkpoint.keep_best without checkpoint.dir: no checkpoint is saved\n");
    r->fail_rank = failpoint_int("train.fail_rank", -1);
    if (t->step >= tc->steps)
        log_info("train: the run is at step %d and train.steps is %d: nothing to train (raise train.steps to continue)\n",
                 t->step, tc->steps);
}

// Step s's training: forward, backward and update, the counters, and the watchdog's allowance
// (10 x the slowest step after the first). *loss, *ce, *aux the step's losses, *dt its seconds.
static StepStats run_step(Trainer* t, RunState* r, int s, double* loss, double* ce, double* aux, double* dt) {
    const ModelConfig* mc = &t->cfg.model;
    const double t0 = now_sec();
    double z;
    watchdog_timeout(r->step_to);
    forward_backward(t, &r->a, s, r->count_scored, r->gtok, ce, aux, &z);
    *loss = *ce + mc->aux_coef * *aux + mc->z_coef * z;
    const StepStats st = update(t, s, *loss);
    t->be->sync(t->be);
    *dt = now_sec() - t0;
    t->tokens += (int64_t)r->gtok;
    t->last_loss = *loss;
    if (st.skipped) {
        t->skipped++;
        t->bad_in_row++;
    } else {
        t->updates++;
        t->bad_in_row = 0;
    }
    if (s >= 1 && *dt > r->slowest) {
        r->slowest = *dt;
        if (r->base_to > 0) r->step_to = 10 * r->slowest > r->base_to ? 10 * r->slowest : r->base_to;
    }
    return st;
}

// After step s's update: validation (train.eval_every, the last step), the step's record, a
// sample (train.sample_every), checkpoint.keep_best's save and the commit of an async save.
// *early: train.early_stop's patience ran out at this validation. Returns RUN_ON or an exit code.
static int run_observe(Trainer* t, RunState* r, int s, double loss, double ce, double aux, const StepStats* st,
                       double dt, int* early, Err* e) {
    const TrainConfig* tc = &t->cfg.train;
    EvalResult ev, *evp = NULL;
    const int has_val = data_num_windows(t->data, 1) > 0;  // data.val_frac = 0: no validation
    if (has_val && ((tc->eval_every > 0 && (s + 1) % tc->eval_every == 0) || s + 1 == tc->steps)) {
        watchdog_timeout(r->step_to * (1 + (double)r->evb / t->n_micro));
        watchdog_stage(s + 1, "validation");
        ev = trainer_eval(t, tc->eval_batches);
        evp = &ev;
    }
    log_step(t, s, loss, ce, aux, st, dt, evp,
             (s + 1) % (t->cfg.log.every > 0 ? t->cfg.log.every : 1) == 0 || evp || st->skipped || s + 1 == tc->steps);
    if (tc->sample_every > 0 && (s + 1) % tc->sample_every == 0) {  // src/train_sample.c
        watchdog_timeout(r->step_to * (1 + (double)tc->sample_len));
        watchdog_stage(s + 1, "sample (train.sample_every)");
        trainer_sample(t, s + 1);
    }
    *early = 0;
    if (evp) {  // checkpoint.keep_best may save here
        watchdog_timeout(r->save_to);
        watchdog_stage(s + 1, "checkpoint save (best)");
    }
    if (evp && trainer_after_eval(t, s + 1, ev.loss, early, e)) {
        if (t->rank == 0) fprintf(stderr, "moetrain: error: saving the best checkpoint failed: %s\n", e->msg);
        return EXIT_USAGE;
    }
    // checkpoint.async: commit the save in flight once every rank has written its files
    watchdog_timeout(r->save_to);
    watchdog_stage(s + 1, "checkpoint commit (async save)");
    if (trainer_save_poll(t, e)) {
        if (t->rank == 0) fprintf(stderr, "moetrain: error: checkpoint save failed: %s\n", e->msg);
        return EXIT_USAGE;
    }
    return RUN_ON;
}

// After step s: stop on too many non-finite steps in a row, then every rank agrees on a
// preemption signal (*sig) and on a failed metrics write on rank 0, which stops every rank (no
// step goes unrecorded). Returns RUN_ON or an exit code.
static int run_agree(Trainer* t, RunState* r, int s, int32_t* sig, Err* e) {
    if (t->bad_in_row >= t->cfg.train.max_bad_steps) {
        trainer_save_wait(t, e);  // a save in flight is complete work: commit it
        if (t->rank == 0)
            fprintf(stderr, "moetrain: error: %d non-finite steps in a row (last at step %d); stopping. "
                            "The last checkpoint, if any, is intact; lower optim.lr or raise optim.warmup, then resume.\n",
                    t->bad_in_row, s + 1);
        t->step++;
        if (t->rank == 0) metrics_summary(&t->met, t->cfg.source, "diverged");
        return EXIT_DIVERGED;
    }
    int32_t flags[2] = {stop_signal(), t->log_failed};
    if (t->stop_at > 0 && s + 1 == t->stop_at) flags[0] = SIGTERM;  // tests
    watchdog_timeout(r->step_to);
    watchdog_stage(s + 1, "stop agreement (signal, log)");
    t->comm->host_all_reduce_max_i32(t->comm, GROUP_WORLD, flags, 2);
    *sig = flags[0];
    if (flags[1]) {
        trainer_save_wait(t, e);  // a save in flight is complete work: commit it
        if (t->rank == 0)
            fprintf(stderr, "moetrain: error: log.dir: %s; stopping at step %d so that no metrics are lost "
                            "(nothing saved after the last checkpoint). Free space there or give another log.dir, "
                            "then resume with checkpoint.resume=auto (metrics.jsonl continues from the checkpoint)\n",
                    t->log_err.msg, s + 1);
        t->step++;
        return EXIT_USAGE;
    }
    return RUN_ON;
}

// Step s's checkpoint (checkpoint.every, the last step, a signal, an early stop; written in full
// before the run exits), then the stop on a signal or train.early_stop. Returns RUN_ON or an exit code.
static int run_save_or_stop(Trainer* t, RunState* r, int s, int32_t sig, int early, Err* e) {
    const TrainConfig* tc = &t->cfg.train;
    const int last = s + 1 == tc->steps;
    const int every = t->cfg.checkpoint.every > 0 && (s + 1) % t->cfg.checkpoint.every == 0;
    if (t->cfg.checkpoint.dir[0] && (every || last || sig || early)) {
        t->step++;
        watchdog_timeout(r->save_to);
        watchdog_stage(s + 1, "checkpoint save");
        int rc = trainer_save(t, e);
        if (!rc && (last || sig || early)) rc = trainer_save_wait(t, e);  // checkpoint.async: written before exit
        t->step--;
        if (rc) {
            if (t->rank == 0) fprintf(stderr, "moetrain: error: checkpoint save failed: %s\n", e->msg);
            return EXIT_USAGE;
        }
    }
    if (sig && !last) {
        if (t->cfg.checkpoint.dir[0])
            log_info("train: signal %d: checkpoint written at step %d; exiting with code %d (resume with checkpoint.resume=auto)\n",
                     sig, s + 1, EXIT_PREEMPTED);
        else
            log_info("train: signal %d at step %d: no checkpoint.dir, nothing saved; exiting with code %d\n", sig, s + 1,
                     EXIT_PREEMPTED);
        t->step++;
        if (t->rank == 0) metrics_summary(&t->met, t->cfg.source, "signal");
        return EXIT_PREEMPTED;
    }
    if (early && !last) {
        if (t->rank == 0)
            log_info("train: early stop after step %d: the validation loss has not improved on %.6f (step %d) in %d "
                     "validation(s) (train.early_stop=%d)%s%s%s\n",
                     s + 1, t->best_val, t->best_step, t->evals_since_best, tc->early_stop,
                     t->cfg.checkpoint.keep_best ? "; best checkpoint: " : "",
                     t->cfg.checkpoint.keep_best ? t->cfg.checkpoint.dir : "", t->cfg.checkpoint.keep_best ? "/best" : "");
        t->step++;
        if (t->rank == 0) metrics_summary(&t->met, t->cfg.source, "early_stop");
        return EXIT_OK;
    }
    return RUN_ON;
}

int trainer_run(Trainer* t) {
    CHECK(!t->infer, "trainer_run on the inference set-up (trainer_init_infer: no gradients, no optimizer)");
    RunState r;
    Err e = {{0}};
    run_start(t, &r);
    for (; t->step < t->cfg.train.steps; t->step++) {
        const int s = t->step;
        if (s == 1 && t->rank == r.fail_rank) FATAL("injected failure (failpoint train.fail_rank=%ld)", r.fail_rank);
        double loss, ce, aux, dt;
        const StepStats st = run_step(t, &r, s, &loss, &ce, &aux, &dt);
        int early, rc = run_observe(t, &r, s, loss, ce, aux, &st, dt, &early, &e);
        int32_t sig = 0;
        if (rc == RUN_ON) rc = run_agree(t, &r, s, &sig, &e);
        if (rc == RUN_ON) rc = run_save_or_stop(t, &r, s, sig, early, &e);
        if (rc != RUN_ON) return rc;
    }
    if (t->rank == 0) metrics_summary(&t->met, t->cfg.source, "steps");
    return EXIT_OK;
}
