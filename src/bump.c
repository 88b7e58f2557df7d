// bump.c — chained bump arena of backend memory (see Bump in model.h).
#include "bump.h"

#include <stdlib.h>

#include "util.h"

typedef struct BumpChunk {
    char* base;
    size_t size, used;
    struct BumpChunk* next;
} BumpChunk;

static BumpChunk* chunk_new(Backend* be, size_t size) {
    BumpChunk* c = xcalloc(1, sizeof *c);
    c->base = be->alloc(be, size);
    c->size = size;
    return c;
}

void bump_init(Bump* b, Backend* be, size_t planned) {
    b->be = be;
    b->chunks = b->cur = chunk_new(be, planned < 4096 ? 4096 : planned);
    b->grown = 0;
}

void bump_reset(Bump* b) {
    for (BumpChunk* c = b->chunks; c; c = c->next) c->used = 0;
    b->cur = b->chunks;
}

void* bump_all(Bump* b, size_t* bytes) {
    bump_reset(b);
    *bytes = b->chunks->size;
    return b->chunks->base;
}

size_t bump_planned(const Bump* b) { return b->chunks->size; }

void* bump_alloc(Bump* b, size_t bytes) {
    bytes = (bytes + 255) & ~(size_t)255;
    for (;;) {
        BumpChunk* c = b->cur;
        if (c->used + bytes <= c->size) {
            void* p = c->base + c->used;
            c->used += bytes;
            return p;
        }
        if (c->next) {
            b->cur = c->next;
            continue;
        }
        // More rows than any earlier micro-batch needed: grow once, keep the chunk for later.
        size_t sz = c->size > bytes ? c->size : bytes;
        c->next = chunk_new(b->be, sz);
        b->cur = c->next;
        b->grown++;
    }
}

void* bump_rest(Bump* b, size_t bytes, size_t* got) {
    char* p = bump_alloc(b, bytes);
    BumpChunk* c = b->cur;
    *got = c->size - (size_t)(p - c->base);
    c->used = c->size;
    return p;
}

void bump_free(Bump* b) {
    BumpChunk* c = b->chunks;
    while (c) {
        BumpChunk* n = c->next;
        b->be->free(b->be, c->base);
        free(c);
        c = n;
    }
    b->chunks = b->cur = NULL;
}
