// fuzz_safetensors.c — libFuzzer target: the input is a whole safetensors file image. The
// header (length, JSON, every validation rule) is parsed from memory; when it is accepted every
// F32/BF16/F16 tensor is read and converted, which must stay inside the buffer. The JSON parser
// also gets the raw input. Seeds: tests/fuzz/seeds/fuzz_safetensors/.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "minijson.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    JsDoc doc;
    char msg[256];
    js_parse(&doc, (const char*)data, size, (JsLimits){32, 1u << 16}, msg, sizeof msg);
    js_free(&doc);

    StFile* f = NULL;
    Err e;
    if (st_parse_buffer(&f, "fuzz.safetensors", data, size, &e) == 0) {
        for (int i = 0; i < f->n; i++) {
            const StTensor* t = &f->t[i];
            if (t->numel > (1u << 20)) continue;
            float* y = malloc(sizeof(float) * (t->numel ? t->numel : 1));
            st_read_f32(f, t, y, &e);
            free(y);
            if (st_find(f, t->name) != t) abort();  // the index agrees with the table
        }
        st_meta(f, "format");
        st_close(f);
    }
    return 0;
}
