// strmap.h — a small open-addressing hash map from string to int (tensor name → index).
// Keys are borrowed: the caller keeps them alive while the map is used.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct StrMap {
    const char** key;  // [cap], NULL = empty slot
    int* val;          // [cap]
    size_t cap, n;
} StrMap;

void strmap_init(StrMap* m);
void strmap_free(StrMap* m);
// Inserts key → val. Returns 1 if the
// key was already present (then *old receives its value and nothing changes), 0 if inserted.
int strmap_put(StrMap* m, const char* key, int val, int* old);
// Value of key, or -1.
int strmap_get(const StrMap* m, const char* key);
