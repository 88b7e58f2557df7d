// test_messages.c — the messages of the start-up checks, with the real binary: an empty config,
// a directory as --config, limits the kernels have, nested YAML refused fast, inspect on an
// unreadable rank file, NaN weights from init_from, resume on other data or another
// precision.fp8.
#define _GNU_SOURCE
#include <dirent.h>
#include <sys/stat.h>

#include "safetensors.h"

#include "run_util.h"

static void test_config_messages(void) {
    char out[65536], p[400];
    snprintf(p, sizeof p, "%s/empty.yaml", g_dir);
    FILE* f = fopen(p, "w");
    fputs("# nothing here\n", f);
    fclose(f);
    int rc = run(out, sizeof out, NULL, "%s --config %s", g_bin, p);
    EXPECT(rc == 2 && strstr(out, "the config is empty (no sections)"), "empty config: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s --config %s", g_bin, g_dir);
    EXPECT(rc == 2 && strstr(out, "is a directory; give a file in it"), "--config DIR: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s plan --config L0_sanity model.experts=128", g_bin);
    EXPECT(rc == 2 && strstr(out, "model.experts: 128 is out of range (expected 1 to 64)"), "experts: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s plan --config L0_sanity model.top_k=17", g_bin);
    EXPECT(rc == 2 && strstr(out, "model.top_k: 17 is out of range (expected 1 to 16)"), "top_k: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s plan --config L0_sanity parallel.ep=128", g_bin);
    EXPECT(rc == 2 && strstr(out, "parallel.ep: 128 is out of range (expected 1 to 64)"), "ep: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s plan --config L0_sanity model.hidden=4096 model.heads=2 model.kv_heads=1", g_bin);
    EXPECT(rc == 2 && strstr(out, "exceeds 1024"), "head dim: rc %d, %s", rc, out);
    // 200 KB of nested brackets: refused at once (libyaml alone takes minutes over it)
    snprintf(p, sizeof p, "%s/nested.yaml", g_dir);
    f = fopen(p, "w");
    for (int i = 0; i < 100000; i++) fputc('[', f);
    for (int i = 0; i < 100000; i++) fputc(']', f);
    fclose(f);
    double secs;
    rc = run(out, sizeof out, &secs, "timeout 60 %s --config %s", g_bin, p);
    EXPECT(rc == 2 && strstr(out, "nested more than 32 levels deep"), "nested YAML: rc %d, %s", rc, out);
    EXPECT(secs < 10, "refused within seconds (%.1f s)", secs);
}

// A rank file whose header cannot be read, listed in a manifest that agrees with it (sizes and
// checksums hold): inspect says BAD and exits 1.
static void test_inspect_unreadable_header(void) {
    char out[65536], ck[400], p[600];
    snprintf(ck, sizeof ck, "%s/insp", g_dir);
    int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=2 checkpoint.dir=%s", g_bin, ck);
    EXPECT(rc == 0, "train (rc %d): %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s inspect %s", g_bin, ck);
    EXPECT(rc == 0 && strstr(out, "result: OK"), "intact: rc %d, %s", rc, out);
    // garble the header length, then rewrite the manifest with the file's new crc
    snprintf(p, sizeof p, "%s/step_00000002/rank_00000.safetensors", ck);
    int fd = open(p, O_WRONLY);
    uint64_t huge = (uint64_t)1 << 62;
    EXPECT(fd >= 0 && pwrite(fd, &huge, 8, 0) == 8, "garble %s", p);
    close(fd);
    rc = sh("cd %s/step_00000002 && crc=$(python3 -c \"import zlib;print('%%08x'%%(zlib.crc32(open('rank_00000.safetensors','rb').read())))\") && "
            "awk -v c=$crc '/^file rank_00000/{$4=c} !/^crc32/{print}' manifest.txt > m && "
            "python3 -c \"import zlib;t=open('m','rb').read();open('manifest.txt','wb').write(t+b'crc32 %%08x\\n'%%zlib.crc32(t))\" && rm m", ck);
    EXPECT(rc == 0, "manifest rewritten");
    rc = run(out, sizeof out, NULL, "%s inspect %s", g_bin, ck);
    EXPECT(rc == 1 && strstr(out, "rank_00000.safetensors: BAD: header unreadable") && strstr(out, "result: BAD"),
           "inspect fails on the unreadable file: rc %d, %s", rc, out);
}

// init_from a Hugging Face directory with a NaN in one tensor: the message says the weights are
// damaged (not "lower the learning rate").
static void test_init_from_nan(void) {
    char out[65536], ck[400], hf[400];
    snprintf(ck, sizeof ck, "%s/nan_ck", g_dir);
    snprintf(hf, sizeof hf, "%s/nan_hf", g_dir);
    int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=1 checkpoint.dir=%s && %s export --ckpt %s --out %s --dtype fp32",
                 g_bin, ck, g_bin, ck, hf);
    EXPECT(rc == 0, "train + export (rc %d): %s", rc, out);
    int hit = 0;
    DIR* d = opendir(hf);
    for (struct dirent* de; d && (de = readdir(d));) {
        if (!strstr(de->d_name, ".safetensors") || strstr(de->d_name, ".json")) continue;
        char p[700];
        snprintf(p, sizeof p, "%s/%s", hf, de->d_name);
        StFile* f;
        Err e;
        if (st_open(&f, p, &e)) continue;
        const StTensor* t = st_find(f, "model.norm.weight");
        if (t) {
            float nan = NAN;
            int fd = open(p, O_WRONLY);
            hit = fd >= 0 && pwrite(fd, &nan, 4, (off_t)(f->data_start + t->begin + 4)) == 4;
            close(fd);
        }
        st_close(f);
    }
    if (d) closedir(d);
    EXPECT(hit, "a NaN written into model.norm.weight");
    rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=2 checkpoint.init_from=%s", g_bin, hf);
    EXPECT(rc == 2 && strstr(out, "model.norm.weight holds 1 non-finite value") && strstr(out, "damaged") &&
               !strstr(out, "lower optim.lr"),
           "the message says what is true: rc %d, %s", rc, out);
}

// resume=auto with another data.path: a warning names both; another precision.fp8: a note.
static void test_resume_other_data(void) {
    char out[65536], ck[400], a[400], b[400];
    snprintf(ck, sizeof ck, "%s/data_ck", g_dir);
    snprintf(a, sizeof a, "%s/a.txt", g_dir);
    snprintf(b, sizeof b, "%s/b.txt", g_dir);
    for (int k = 0; k < 2; k++) {
        FILE* f = fopen(k ? b : a, "w");
        for (int i = 0; i < 400; i++) fprintf(f, "line %d of file %c: some text to train on\n", i, 'a' + k);
        fclose(f);
    }
    const char* cfg = "--config L0_sanity parallel.ep=1 train.device=cpu model.hidden=32 model.ffn=48 train.seq_len=16 "
                      "train.micro_batch=2 train.global_batch=2 optim.warmup=1 train.eval_batches=1 data.format=text log.dir=";
    int rc = run(out, sizeof out, NULL, "%s %s train.steps=2 checkpoint.dir=%s data.path=%s", g_bin, cfg, ck, a);
    EXPECT(rc == 0, "train on a (rc %d): %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s %s train.steps=3 checkpoint.dir=%s data.path=%s checkpoint.resume=auto", g_bin, cfg,
             ck, b);
    EXPECT(rc == 0 && strstr(out, "warning: saved with data.path=") && strstr(out, "a.txt") && strstr(out, "b.txt"),
           "the warning: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s %s train.steps=4 checkpoint.dir=%s data.path=%s checkpoint.resume=auto", g_bin, cfg,
             ck, b);
    EXPECT(rc == 0 && !strstr(out, "warning: saved with data.path="), "no warning on the same data: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s %s train.steps=5 checkpoint.dir=%s data.path=%s checkpoint.resume=auto "
             "precision.fp8=experts", g_bin, cfg, ck, b);
    EXPECT(rc == 0 && strstr(out, "note: saved with precision.fp8=none; this run uses experts"),
           "a note on another precision.fp8: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s %s train.steps=6 checkpoint.dir=%s data.path=%s checkpoint.resume=auto "
             "precision.fp8=experts", g_bin, cfg, ck, b);
    EXPECT(rc == 0 && !strstr(out, "saved with precision.fp8"), "none on the same: rc %d, %s", rc, out);
}

int main(int argc, char** argv) {
    if (run_begin(argc, argv, "messages")) return 1;
    RUN_IF(test_config_messages);
    RUN_IF(test_inspect_unreadable_header);
    RUN_IF(test_init_from_nan);
    RUN_IF(test_resume_other_data);
    if (!t_failed) sh("rm -rf %s", g_dir);
    TEST_END();
}
