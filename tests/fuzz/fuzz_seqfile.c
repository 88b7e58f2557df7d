// fuzz_seqfile.c — the data layer on arbitrary bytes (libFuzzer): FASTA / FASTQ / text parsers,
// gzip in memory, .bin header checks, split and windows. Each input is opened as every format
// (auto, fasta, fastq, text, bin) through data_open_buffer; each open must give an error or a
// data set whose windows can be read, never a crash, leak or out-of-bounds read.
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "data.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const DataFormat fmts[] = {DATA_AUTO, DATA_FASTA, DATA_FASTQ, DATA_TEXT, DATA_BIN};
    const int vocab = size % 2 ? 100 : 256;  // odd sizes also check bytes >= vocab
    for (int k = 0; k < 5; k++) {
        DataConfig dc;
        memset(&dc, 0, sizeof dc);
        dc.format = fmts[k];
        dc.val_frac = k == 3 ? 0.0f : 0.3f;
        dc.sep_token = 10;
        dc.shuffle = 1;
        DataSet* ds = NULL;
        Err e;
        e.msg[0] = 0;
        if (data_open_buffer(&ds, &dc, "fuzz.in", data, size, vocab, 4, size, &e) == 0) {
            int32_t w[5];
            const uint64_t probes[3] = {0, size, ~(uint64_t)0};
            for (int s = 0; s < 2; s++) {
                if (!data_num_windows(ds, s)) continue;
                for (int j = 0; j < 3; j++) {
                    data_get(ds, s, probes[j], w);
                    for (int t = 0; t < 5; t++)
                        if (w[t] < 0 || w[t] >= vocab) __builtin_trap();  // a token outside the vocabulary
                }
            }
            char d[512];
            data_describe(ds, d, sizeof d);
            data_close(ds);
        } else if (!e.msg[0]) {
            __builtin_trap();  // an error without a message
        }
    }
    return 0;
}
