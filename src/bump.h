// bump.h — chained bump arena of backend memory, reset per micro-batch (or per layer).
// The first chunk is planned up front; a chunk is added only when a micro-batch needs more
// than every earlier one did (MoE routing imbalance), and kept, so the steady state never
// allocates.
#pragma once
#include <stddef.h>

#include "backend.h"

typedef struct BumpChunk BumpChunk;
typedef struct Bump {
    Backend* be;
    BumpChunk* chunks;  // list; the first one is the planned size
    BumpChunk* cur;
    size_t grown;       // chunks added after planning
} Bump;

void bump_init(Bump* b, Backend* be, size_t planned_bytes);
void* bump_alloc(Bump* b, size_t bytes);  // 256-byte aligned
void bump_reset(Bump* b);
// Resets b and hands out its first (planned) chunk whole, *bytes of it: one op's workspace
// (the attention backward's dS), valid until the next bump_alloc or reset.
void* bump_all(Bump* b, size_t* bytes);
// At least `bytes`, and all that is left of the chunk it comes from (*got ≥ bytes): a workspace
// that uses the room the arena holds anyway. Nothing more is handed out of that chunk until the
// next reset.
void* bump_rest(Bump* b, size_t bytes, size_t* got);
// Bytes of the planned (first) chunk.
size_t bump_planned(const Bump* b);
void bump_free(Bump* b);
