// test_crc32c.c — CRC-32C: the published check value, the fast path (SSE4.2, three streams)
// against the portable loop over lengths and alignments around the block boundaries, chaining,
// and the manifest's algorithm names (crc32 = zlib's).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "crc32c.h"
#include "test.h"
#include "util.h"

static void test_check_value(void) {
    EXPECT(crc32c(0, "123456789", 9) == 0xE3069283u, "crc32c(123456789) = %08x", crc32c(0, "123456789", 9));
    EXPECT(crc32c_portable(0, "123456789", 9) == 0xE3069283u, "portable = %08x", crc32c_portable(0, "123456789", 9));
    EXPECT(crc32c(0, "", 0) == 0, "empty");
    unsigned char z[32] = {0};
    EXPECT(crc32c(0, z, 32) == 0x8A9136AAu, "32 zero bytes: %08x", crc32c(0, z, 32));  // RFC 3720 B.4
    printf("     crc32c runs on: %s\n", crc32c_impl());
}

static void test_fast_equals_portable(void) {
    const size_t N = 3 * 4096 * 5 + 77;
    unsigned char* buf = xmalloc(N + 8);
    Rng r;
    rng_seed(&r, 11);
    for (size_t i = 0; i < N + 8; i++) buf[i] = (unsigned char)(rng_u64(&r) >> 56);
    const size_t lens[] = {0, 1, 7, 8, 9, 63, 4096, 3 * 4096 - 1, 3 * 4096, 3 * 4096 + 1, 3 * 4096 + 13,
                           2 * 3 * 4096 + 5, N};
    int bad = 0;
    for (int off = 0; off < 8; off++)
        for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
            uint32_t a = crc32c(0, buf + off, lens[k]), b = crc32c_portable(0, buf + off, lens[k]);
            if (a != b && bad++ < 5) EXPECT(0, "offset %d length %zu: %08x vs %08x", off, lens[k], a, b);
        }
    // chaining at arbitrary cut points equals one pass
    const uint32_t whole = crc32c(0, buf, N);
    const size_t cuts[] = {1, 5, 4096, 12289, 40000, N - 3};
    for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
        uint32_t c = crc32c(crc32c(0, buf, cuts[k]), buf + cuts[k], N - cuts[k]);
        EXPECT(c == whole, "chained at %zu: %08x vs %08x", cuts[k], c, whole);
    }
    buf[N / 2] ^= 1;
    EXPECT(crc32c(0, buf, N) != whole, "a flipped bit changes the crc");
    free(buf);
}

static void test_algorithms(void) {
    EXPECT(cksum_parse("crc32c") == CKSUM_CRC32C && cksum_parse("crc32") == CKSUM_CRC32 && cksum_parse("md5") == -1,
           "parse");
    EXPECT(!strcmp(cksum_name(CKSUM_CRC32C), "crc32c") && !strcmp(cksum_name(CKSUM_CRC32), "crc32"), "names");
    const char* s = "moetrain checkpoint";
    EXPECT(cksum_update(CKSUM_CRC32, 0, s, strlen(s)) == (uint32_t)crc32_z(0, (const unsigned char*)s, strlen(s)),
           "crc32 is zlib's");
    EXPECT(cksum_update(CKSUM_CRC32C, 0, s, strlen(s)) == crc32c(0, s, strlen(s)), "crc32c");
}

int main(void) {
    RUN(test_check_value);
    RUN(test_fast_equals_portable);
    RUN(test_algorithms);
    TEST_END();
}
