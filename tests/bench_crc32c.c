// bench_crc32c.c — checksum throughput (make bench-crc): zlib's crc32 against CRC-32C (this
// CPU's implementation and the portable loop) over a 1 GiB buffer in memory, and, with a file
// argument, the streamed check of that file (file_checksum, what checkpoint verification runs).
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "crc32c.h"
#include "safetensors.h"
#include "util.h"

static double rate(const char* what, int algo, const unsigned char* buf, size_t n, int portable) {
    double best = 1e30;
    uint32_t c = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_sec();
        if (portable) c = crc32c_portable(0, buf, n);
        else c = cksum_update((CksumAlgo)algo, 0, buf, n);
        double dt = now_sec() - t0;
        if (dt < best) best = dt;
    }
    printf("  %-34s %7.2f GB/s  (%08x)\n", what, (double)n / best / 1e9, c);
    return (double)n / best / 1e9;
}

int main(int argc, char** argv) {
    const size_t N = (size_t)1 << 30;
    unsigned char* buf = xmalloc(N);
    Rng r;
    rng_seed(&r, 1);
    for (size_t i = 0; i < N; i += 8) {
        uint64_t v = rng_u64(&r);
        memcpy(buf + i, &v, 8);
    }
    printf("checksum throughput, 1 GiB in memory, one thread (best of 3):\n");
    double z = rate("crc32 (zlib)", CKSUM_CRC32, buf, N, 0);
    double c = rate("crc32c", CKSUM_CRC32C, buf, N, 0);
    rate("crc32c (portable loop)", CKSUM_CRC32C, buf, N, 1);
    printf("  crc32c runs on: %s; %.1fx zlib\n", crc32c_impl(), c / z);
    free(buf);
    for (int i = 1; i < argc; i++) {
        for (int algo = 0; algo < 2; algo++) {
            uint32_t crc;
            uint64_t bytes;
            Err e = {{0}};
            double t0 = now_sec();
            if (file_checksum(argv[i], algo, &crc, &bytes, &e)) {
                fprintf(stderr, "%s\n", e.msg);
                return 1;
            }
            double dt = now_sec() - t0;
            printf("file %s: %s %.2f GB in %.2f s = %.2f GB/s\n", argv[i], cksum_name((CksumAlgo)algo), bytes / 1e9, dt,
                   bytes / dt / 1e9);
        }
    }
    return 0;
}
