// strmap.c — see strmap.h.
#include "strmap.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

static uint64_t hash(const char* s) {  // FNV-1a
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

void strmap_init(StrMap* m) { memset(m, 0, sizeof *m); }

void strmap_free(StrMap* m) {
    free(m->key);
    free(m->val);
    memset(m, 0, sizeof *m);
}

static void grow(StrMap* m) {
    StrMap g;
    g.cap = m->cap ? 2 * m->cap : 64;
    g.n = 0;
    g.key = xcalloc(g.cap, sizeof *g.key);
    g.val = xcalloc(g.cap, sizeof *g.val);
    for (size_t i = 0; i < m->cap; i++)
        if (m->key[i]) strmap_put(&g, m->key[i], m->val[i], NULL);
    free(m->key);
    free(m->val);
    *m = g;
}

int strmap_put(StrMap* m, const char* key, int val, int* old) {
    if (2 * (m->n + 1) > m->cap) grow(m);
    size_t i = hash(key) & (m->cap - 1);
    while (m->key[i]) {
        if (strcmp(m->key[i], key) == 0) {
            if (old) *old = m->val[i];
            return 1;
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->key[i] = key;
    m->val[i] = val;
    m->n++;
    return 0;
}

int strmap_get(const StrMap* m, const char* key) {
    if (!m->cap) return -1;
    size_t i = hash(key) & (m->cap - 1);
    while (m->key[i]) {
        if (strcmp(m->key[i], key) == 0) return m->val[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}
