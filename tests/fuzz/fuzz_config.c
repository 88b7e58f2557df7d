// fuzz_config.c — the config loader on arbitrary bytes (libFuzzer + ASan/UBSan): it must return
// a config or an error, never crash, leak or read out of bounds. What loads must also survive
// print → load unchanged (config_print's promise), and must validate without crashing.
// Input starting with "O:" is a command-line override instead (section.key=value).
#define _DEFAULT_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

static void roundtrip(const Config* c) {
    char* text = NULL;
    size_t n = 0;
    FILE* f = open_memstream(&text, &n);
    if (!f) return;
    config_print(c, f);
    fclose(f);
    Config b;
    Err e;
    const char* diff = "";
    config_defaults(&b);
    if (config_load_string(&b, text, n, "<printed>", &e) != 0 || !config_equal(c, &b, &diff)) {
        fprintf(stderr, "round trip broke (%s; first difference %s):\n%s\n", e.msg, diff, text);
        abort();
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    Config c;
    Err e;
    e.msg[0] = 0;
    config_defaults(&c);
    int rc;
    if (size >= 2 && data[0] == 'O' && data[1] == ':') {
        char* kv = malloc(size - 1);
        memcpy(kv, data + 2, size - 2);
        kv[size - 2] = 0;
        rc = config_override(&c, kv, &e);
        free(kv);
    } else {
        rc = config_load_string(&c, (const char*)data, size, "<fuzz>", &e);
    }
    if (rc == 0) {
        roundtrip(&c);
        (void)config_validate(&c, 1 + (int)(size % 8), &e);
        (void)config_validate_run(&c, &e);
    } else if (!e.msg[0]) {
        fprintf(stderr, "an error without a message\n");
        abort();
    }
    return 0;
}
