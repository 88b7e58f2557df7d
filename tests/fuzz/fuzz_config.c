// fuzz_config.c — the config loader on arbitrary bytes (libFuzzer): it must return an error
// or a config, never crash, leak or read out of bounds.
#define _DEFAULT_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/fuzz_config_%d.yaml", (int)getpid());
    FILE* f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    Config c;
    Err e;
    config_defaults(&c);
    if (config_load_file(&c, path, &e) == 0) (void)config_validate(&c, 1, &e);
    return 0;
}
