// golden_fixture.h — the reader of tests/fixtures/golden/tiny_mixtral.golden (written by
// scripts/make_golden.py: a comment line, one line per tensor "name f32|i32 ndim dims... offset",
// "end HEADER_BYTES", then the raw little-endian data). Shared by test_golden.c and
// test_export_golden.c. load_fixture checks every tensor lies inside the file.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define FIXTURE "tests/fixtures/golden/tiny_mixtral.golden"

typedef struct GTensor { char name[128]; int i32; int ndim; int64_t shape[4]; size_t off, numel; } GTensor;
static GTensor g_t[512];
static int g_n;
static char* g_data;

static int load_fixture(void) {
    FILE* f = fopen(FIXTURE, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char* all = xmalloc((size_t)size + 1);
    size_t got = fread(all, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) return -1;
    all[size] = 0;
    char* line = strchr(all, '\n');  // skip the comment line
    size_t head = 0;
    while (line && *++line && g_n < 512) {
        char* nl = strchr(line, '\n');
        if (!nl) break;
        *nl = 0;
        if (!strncmp(line, "end ", 4)) {
            head = (size_t)atoll(line + 4);
            break;
        }
        GTensor* t = &g_t[g_n++];
        char dt[8];
        int used = 0;
        if (sscanf(line, "%127s %7s %d%n", t->name, dt, &t->ndim, &used) != 3 || t->ndim < 0 || t->ndim > 4) return -1;
        t->i32 = !strcmp(dt, "i32");
        char* p = line + used;
        t->numel = 1;
        for (int d = 0; d < t->ndim; d++) t->shape[d] = strtoll(p, &p, 10), t->numel *= (size_t)t->shape[d];
        t->off = (size_t)strtoull(p, &p, 10);
        line = nl;
    }
    for (int i = 0; i < g_n; i++)
        if (head + g_t[i].off + 4 * g_t[i].numel > (size_t)size) return -1;
    g_data = all + head;
    return head ? 0 : -1;
}

static const GTensor* get(const char* name) {
    for (int i = 0; i < g_n; i++)
        if (!strcmp(g_t[i].name, name)) return &g_t[i];
    return NULL;
}
static const float* getf(const char* name, size_t numel) {
    const GTensor* t = get(name);
    if (!t || t->i32 || t->numel != numel) return NULL;
    return (const float*)(g_data + t->off);
}
