// util.h — errors, check macros, logging, small helpers shared by every layer.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// Status of a recoverable operation: 0 = ok. On failure the callee has written a message
// into an Err that the caller prints (on every rank) before exiting with code 2.
typedef struct Err {
    char msg[1024];
} Err;

// Formats into e->msg and returns -1, so callers can `return err_set(e, "...", ...)`.
int err_set(Err* e, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// The rank and device that fatal messages name; set once by dist/runtime setup.
void util_set_rank(int rank, int device);
int util_rank(void);

// Fatal: print "moetrain: rank R: file:line: message" and abort every rank.
// The abort hook is set by the MPI layer (MPI_Abort); default is exit(1).
void fatal_at(const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
void util_set_abort_hook(void (*hook)(int code));
void util_abort(int code) __attribute__((noreturn));
#define FATAL(...) fatal_at(__FILE__, __LINE__, __VA_ARGS__)
#define CHECK(cond, ...) do { if (!(cond)) FATAL(__VA_ARGS__); } while (0)

// Logging to stdout; rank 0 only unless log_all.
void log_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Where log_info writes (stdout until set; NULL = nowhere): `generate` keeps stdout for the text.
void log_set_stream(FILE* f);

void* xmalloc(size_t n);           // aborts on failure; never returns NULL
void* xcalloc(size_t n, size_t sz);
char* xstrdup(const char* s);
double now_sec(void);              // monotonic clock, seconds
// 16 hex digits from /dev/urandom (from the pid and the clock where it cannot be read) into out [n].
void random_id(char* out, size_t n);

// Deterministic RNG (splitmix64 seeded xorshift). State is plain data: it goes in checkpoints.
typedef struct Rng { uint64_t s; } Rng;
void rng_seed(Rng* r, uint64_t seed);
uint64_t rng_u64(Rng* r);
float rng_uniform(Rng* r);         // [0, 1)
float rng_normal(Rng* r);          // N(0, 1)

// bf16 <-> fp32 on the host (round to nearest even).
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t h);

// Levenshtein distance, for "did you mean" suggestions.
int edit_distance(const char* a, const char* b);
// Splits a comma list into trimmed (spaces, tabs), non-empty items, in place in buf: at most max
// items into items[]; returns how many.
int split_list_inplace(char* buf, char** items, int max);
