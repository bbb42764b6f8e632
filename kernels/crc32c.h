/* CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78), the
 * checksum of iSCSI, ext4 and memcached's extstore: what G3 slots carry.
 *
 * kv_crc32c(0, "123456789", 9) == 0xE3069283. The value is chainable:
 * kv_crc32c(kv_crc32c(0, a, na), b, nb) == the CRC of a followed by b.
 *
 * The host version uses the SSE4.2 crc32 instruction (three interleaved
 * streams) where the CPU has it, else slicing-by-8 tables; both give the same
 * value, and so does the device kernel (kernels/kernels.cu), which computes
 * per-thread pieces and joins them with kv_crc32c_combine's algebra.
 *
 * Thread-safe: the tables are built by a constructor before main(). */
#ifndef KV_CRC32C_H
#define KV_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The CRC32C of n bytes at p, continuing from crc (0 to start). p may be
 * NULL when n is 0. */
uint32_t kv_crc32c(uint32_t crc, const void *p, size_t n);

/* The CRC of A followed by B from crc_a = kv_crc32c(0, A), crc_b =
 * kv_crc32c(0, B) and len_b = |B|, without reading the bytes. */
uint32_t kv_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* Copies n bytes from src to dst (which must not overlap) and returns
 * kv_crc32c(crc, src, n), in one pass over the bytes where the CPU has the
 * crc32 instruction (each 8 bytes summed as they are stored: the demotion's
 * copy of a block whose G4 value needs its sum; issue 38), else a memcpy
 * and the table path over dst. */
uint32_t kv_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t n);

/* The slicing-by-8 path alone, whatever the CPU has (tests compare both). */
uint32_t kv_crc32c_sw(uint32_t crc, const void *p, size_t n);

/* "sse4.2" or "table": what kv_crc32c uses on this CPU. */
const char *kv_crc32c_impl(void);

#ifdef __cplusplus
}
#endif
#endif
