// crc32c.c — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), see crc32c.h.
//
// Two implementations, chosen once at run time:
// * SSE4.2's crc32 instruction (x86-64), three independent streams interleaved: the instruction
//   has a latency of 3 cycles and a throughput of 1 per cycle, so one stream runs at a third of
//   the possible rate. The buffer is cut into blocks of 3·LANE bytes; lanes 1 and 2 start from a
//   zero register, and the three registers are joined by the linearity of the CRC register:
//   the register after A‖B is shift(reg after A, |B|) ⊕ (reg of B from zero), where shift(r, L)
//   is r advanced over L zero bytes — a linear map of the 32 register bits, applied as four
//   256-entry tables built once at start-up.
// * A portable slicing-by-8 table loop, for CPUs without SSE4.2 (and the reference in tests).
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82F63B78u
#define LANE 4096  // bytes per stream in one block

static uint32_t g_tab[8][256];      // slicing-by-8
static uint32_t g_shift[4][256];    // register advanced over LANE zero bytes
static int g_hw;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

// ---- portable ---------------------------------------------------------------------------------
static uint32_t sw_update(uint32_t r, const unsigned char* p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        r = (r >> 8) ^ g_tab[0][(r ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= r;  // little-endian: the register meets the first four bytes
        r = g_tab[7][w & 0xff] ^ g_tab[6][(w >> 8) & 0xff] ^ g_tab[5][(w >> 16) & 0xff] ^ g_tab[4][(w >> 24) & 0xff] ^
            g_tab[3][(w >> 32) & 0xff] ^ g_tab[2][(w >> 40) & 0xff] ^ g_tab[1][(w >> 48) & 0xff] ^
            g_tab[0][(w >> 56) & 0xff];
        p += 8;
        n -= 8;
    }
    while (n--) r = (r >> 8) ^ g_tab[0][(r ^ *p++) & 0xff];
    return r;
}

static uint32_t shift_apply(uint32_t r) {
    return g_shift[0][r & 0xff] ^ g_shift[1][(r >> 8) & 0xff] ^ g_shift[2][(r >> 16) & 0xff] ^ g_shift[3][r >> 24];
}

// ---- SSE4.2 -----------------------------------------------------------------------------------
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_X86 1

__attribute__((target("sse4.2"))) static uint32_t hw_serial(uint32_t r, const unsigned char* p, size_t n) {
    uint64_t r64 = r;
    while (n && ((uintptr_t)p & 7)) r64 = _mm_crc32_u8((uint32_t)r64, *p++), n--;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        r64 = _mm_crc32_u64(r64, w);
        p += 8;
        n -= 8;
    }
    while (n--) r64 = _mm_crc32_u8((uint32_t)r64, *p++);
    return (uint32_t)r64;
}

__attribute__((target("sse4.2"))) static uint32_t hw_update(uint32_t r, const unsigned char* p, size_t n) {
    // align to 8 first so the three streams load aligned words
    while (n && ((uintptr_t)p & 7)) r = _mm_crc32_u8(r, *p++), n--;
    while (n >= 3 * LANE) {
        uint64_t a = r, b = 0, c = 0;
        const unsigned char *pa = p, *pb = p + LANE, *pc = p + 2 * LANE;
        for (size_t i = 0; i < LANE; i += 8) {
            uint64_t wa, wb, wc;
            memcpy(&wa, pa + i, 8);
            memcpy(&wb, pb + i, 8);
            memcpy(&wc, pc + i, 8);
            a = _mm_crc32_u64(a, wa);
            b = _mm_crc32_u64(b, wb);
            c = _mm_crc32_u64(c, wc);
        }
        r = shift_apply(shift_apply((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)c;
        p += 3 * LANE;
        n -= 3 * LANE;
    }
    return hw_serial(r, p, n);
}
#else
#define HAVE_X86 0
#endif

// ---- set-up -----------------------------------------------------------------------------------
static void init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t r = i;
        for (int k = 0; k < 8; k++) r = r & 1 ? (r >> 1) ^ POLY : r >> 1;
        g_tab[0][i] = r;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int s = 1; s < 8; s++) g_tab[s][i] = (g_tab[s - 1][i] >> 8) ^ g_tab[0][g_tab[s - 1][i] & 0xff];
    // shift over LANE zero bytes: the image of each register bit, then per byte the XOR of the
    // images of its set bits
    static const unsigned char zeros[LANE];
    uint32_t col[32];
    for (int b = 0; b < 32; b++) col[b] = sw_update(1u << b, zeros, LANE);
    for (int byte = 0; byte < 4; byte++)
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t x = 0;
            for (int k = 0; k < 8; k++)
                if (v >> k & 1) x ^= col[8 * byte + k];
            g_shift[byte][v] = x;
        }
#if HAVE_X86
    __builtin_cpu_init();
    g_hw = __builtin_cpu_supports("sse4.2");
#endif
}

uint32_t crc32c(uint32_t crc, const void* buf, size_t n) {
    pthread_once(&g_once, init);
    const unsigned char* p = buf;
    uint32_t r = ~crc;
#if HAVE_X86
    if (g_hw) return ~hw_update(r, p, n);
#endif
    return ~sw_update(r, p, n);
}

uint32_t crc32c_portable(uint32_t crc, const void* buf, size_t n) {
    pthread_once(&g_once, init);
    return ~sw_update(~crc, buf, n);
}

const char* crc32c_impl(void) {
    pthread_once(&g_once, init);
    return g_hw ? "sse4.2 (3 streams)" : "portable (slicing-by-8)";
}

// ---- the algorithms a manifest names ---------------------------------------------------------
#include <zlib.h>

const char* cksum_name(CksumAlgo a) { return a == CKSUM_CRC32C ? "crc32c" : "crc32"; }

int cksum_parse(const char* name) {
    if (!strcmp(name, "crc32c")) return CKSUM_CRC32C;
    if (!strcmp(name, "crc32")) return CKSUM_CRC32;
    return -1;
}

uint32_t cksum_update(CksumAlgo a, uint32_t crc, const void* buf, size_t n) {
    if (a == CKSUM_CRC32C) return crc32c(crc, buf, n);
    return (uint32_t)crc32_z(crc, (const unsigned char*)buf, n);
}
