// minijson.h — a small JSON parser for untrusted input (safetensors headers, config.json,
// model.safetensors.index.json) and a growable string buffer for writing JSON.
//
// The parser builds a tree in one arena. Limits: nesting depth, node count; strings with every
// JSON escape (\uXXXX with surrogate pairs → UTF-8; \u0000 is refused since names are C strings).
// Integers that fit int64 are kept exactly (is_int), every number also as a double.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { JS_NULL = 0, JS_BOOL, JS_NUM, JS_STR, JS_ARR, JS_OBJ } JsType;

typedef struct JsVal JsVal;
struct JsVal {
    JsType type;
    int n;          // JS_ARR / JS_OBJ: number of items
    int b;          // JS_BOOL
    int is_int;     // JS_NUM: an integer literal that fits int64 (then i is exact)
    int64_t i;
    double num;
    char* str;      // JS_STR: NUL-terminated
    JsVal* items;   // JS_ARR / JS_OBJ: [n]
    char** keys;    // JS_OBJ: [n] (duplicates are kept; callers decide)
};

typedef struct JsLimits {
    int max_depth;       // nesting of arrays/objects
    size_t max_nodes;    // values in the document
} JsLimits;
#define JS_DEFAULT_LIMITS ((JsLimits){64, 2u * 1024u * 1024u})

typedef struct JsDoc {
    JsVal root;
    void* arena;  // private
} JsDoc;

// Parses text[len] (need not be NUL-terminated). Returns 0, or -1 with "at byte N: what"
// in err[errn]. js_free the doc in both cases.
int js_parse(JsDoc* doc, const char* text, size_t len, JsLimits lim, char* err, size_t errn);
void js_free(JsDoc* doc);

// Member of an object by key (the first one), or NULL (also when obj is not an object).
const JsVal* js_get(const JsVal* obj, const char* key);
const char* js_type_name(JsType t);

// Growable NUL-terminated string buffer.
typedef struct Sb {
    char* s;
    size_t len, cap;
} Sb;
void sb_printf(Sb* b, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_putc(Sb* b, char c);
// Appends s as a quoted JSON string with escapes.
void sb_json_str(Sb* b, const char* s);
// Appends a float as the shortest decimal that reads back to the same float, always with a
// '.' or exponent so Python reads a float (e.g. 1e-05, 1000000.0).
void sb_json_float(Sb* b, float f);
void sb_free(Sb* b);
