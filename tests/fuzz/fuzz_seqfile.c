// fuzz_seqfile.c — the sequence-file parser (FASTA / FASTQ / text, gzip or not) on arbitrary
// bytes (libFuzzer): an error or a data set, never a crash, leak or out-of-bounds read.
#define _DEFAULT_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "data.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/fuzz_seqfile_%d.fa", (int)getpid());
    FILE* f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    DataConfig dc = {.format = size ? (DataFormat)(data[0] % 4) : DATA_AUTO, .val_frac = 0.3f, .sep_token = 10, .shuffle = 1};
    snprintf(dc.path, sizeof dc.path, "%s", path);
    DataSet* ds;
    Err e;
    if (data_open(&ds, &dc, 256, 4, 1, &e) == 0) {
        int32_t w[5];
        data_get(ds, 0, size, w);
        data_get(ds, 1, 0, w);
        data_close(ds);
    }
    return 0;
}
