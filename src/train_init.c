// train_init.c — a trainer's start-up and teardown (see train.h): the stages of trainer_init under
// the watchdog, the backend and its communicator, the data, the model, log.dir; trainer_free.
#define _POSIX_C_SOURCE 200809L
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "failpoint.h"
#include "logfile.h"
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
                          .fp8 = cfg->precision.fp8,
                          .fp8_wcodes = !infer && config_fp8_wcodes(cfg, t->world),
                          .inference = infer};
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
