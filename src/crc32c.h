// crc32c.h — CRC-32C (Castagnoli) with the CPU's crc32 instruction where there is one, and the
// checksum algorithms a checkpoint manifest may name.
#pragma once
#include <stddef.h>
#include <stdint.h>

// crc32c(0, buf, n) is the CRC-32C of buf; chaining crc32c(crc32c(0, a, na), b, nb) gives the
// CRC of a‖b (zlib's crc32 convention). SSE4.2 (three interleaved streams) when the CPU has
// it, else a portable table loop; both give the same value. Thread-safe.
uint32_t crc32c(uint32_t crc, const void* buf, size_t n);
// The portable loop alone (the reference the tests hold the fast path to).
uint32_t crc32c_portable(uint32_t crc, const void* buf, size_t n);
// "sse4.2 (3 streams)" or "portable (slicing-by-8)": what crc32c runs on this CPU.
const char* crc32c_impl(void);

// The file checksums of a checkpoint manifest: "crc32" (zlib's CRC-32, checkpoints written
// before CRC-32C) and "crc32c" (what saves write now).
typedef enum { CKSUM_CRC32 = 0, CKSUM_CRC32C = 1 } CksumAlgo;
const char* cksum_name(CksumAlgo a);
// -1 when name is not an algorithm.
int cksum_parse(const char* name);
// Running update, crc32c's convention for both (start from 0).
uint32_t cksum_update(CksumAlgo a, uint32_t crc, const void* buf, size_t n);
