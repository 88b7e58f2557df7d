// data_bin.c — token shards: 256 × int32 header ([0] = magic, [1] = version, [2] = token count),
// then the tokens, little-endian. Three headers are read: llm.c's 20240520 version 1 (uint16
// tokens), llm.c's 20240801 version 7 (uint32 tokens, what its Llama-3 tools write) and this
// project's 20240520 version 2 (uint32 tokens). Files are mmap'd read-only (the kernel pages them
// in and out: a corpus larger than RAM works); each is checked once (size, every token < vocab).
#define _DEFAULT_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_impl.h"

int bin_map(const char* path, MapFile* m, Err* e) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return err_set(e, "data: cannot open %s (%s)", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return err_set(e, "data: cannot stat %s (%s)", path, strerror(errno));
    }
    if (st.st_size == 0) {
        close(fd);
        return err_set(e, "data: %s is empty (0 bytes)", path);
    }
    void* p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return err_set(e, "data: cannot mmap %s (%s)", path, strerror(errno));
    m->base = p;
    m->size = (size_t)st.st_size;
    return 0;
}

void bin_unmap(MapFile* m) {
    if (m->base) munmap(m->base, m->size);
    memset(m, 0, sizeof *m);
}

static uint32_t le32(const uint8_t* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// First token >= vocab, or n when there is none.
static uint64_t first_bad(const uint8_t* p, uint64_t n, int width, uint64_t vocab) {
    if (width == 2) {
        if (vocab > 65535) return n;
        for (uint64_t i = 0; i < n; i++) {
            uint16_t t;
            memcpy(&t, p + 2 * i, 2);
            if (t >= vocab) return i;
        }
    } else {
        for (uint64_t i = 0; i < n; i++) {
            uint32_t t;
            memcpy(&t, p + 4 * i, 4);
            if (t >= vocab) return i;
        }
    }
    return n;
}

int bin_check(const char* name, const uint8_t* p, size_t size, int vocab, Seg* seg, Err* e) {
    if (size < BIN_HEADER_BYTES)
        return err_set(e, "data: %s: truncated .bin: %zu bytes, the llm.c header alone is %d bytes", name, size,
                       BIN_HEADER_BYTES);
    uint32_t magic = le32(p), version = le32(p + 4), count = le32(p + 8);
    if (magic != BIN_MAGIC && magic != BIN_MAGIC_U32)
        return err_set(e, "data: %s: bad magic %u in the .bin header (token shards start with %d or %d: llm.c's "
                       "uint16 and uint32 shards); make shards with scripts/tokenize_data.py, or set data.format to "
                       "match the file", name, magic, BIN_MAGIC, BIN_MAGIC_U32);
    if (magic == BIN_MAGIC && version != 1 && version != 2)
        return err_set(e, "data: %s: unsupported .bin version %u for magic %d (1 = uint16 tokens, 2 = uint32 "
                       "tokens)", name, version, BIN_MAGIC);
    if (magic == BIN_MAGIC_U32 && version != 7)
        return err_set(e, "data: %s: unsupported .bin version %u for magic %d (llm.c's uint32 shards are version 7)",
                       name, version, BIN_MAGIC_U32);
    int width = magic == BIN_MAGIC && version == 1 ? 2 : 4;
    uint64_t want = BIN_HEADER_BYTES + (uint64_t)count * (uint64_t)width;
    if ((uint64_t)size != want)
        return err_set(e, "data: %s: %s .bin: the header says %u tokens (uint%d) = %llu bytes with the header, "
                       "the file has %zu bytes", name, (uint64_t)size < want ? "truncated" : "oversized", count,
                       8 * width, (unsigned long long)want, size);
    if (count == 0) return err_set(e, "data: %s: the .bin shard has no tokens", name);
    const uint8_t* tok = p + BIN_HEADER_BYTES;
    uint64_t bad = first_bad(tok, count, width, (uint64_t)vocab);
    if (bad < count) {
        uint32_t t = 0;
        memcpy(&t, tok + bad * (uint64_t)width, (size_t)width);  // little-endian host
        return err_set(e, "data: %s: token %u at token offset %llu (byte offset %llu) is >= model.vocab_size %d; "
                       "the shard was made for a larger vocabulary: raise model.vocab_size", name, t,
                       (unsigned long long)bad, (unsigned long long)(BIN_HEADER_BYTES + bad * (uint64_t)width), vocab);
    }
    seg->p = tok;
    seg->n = count;
    seg->width = width;
    return 0;
}
