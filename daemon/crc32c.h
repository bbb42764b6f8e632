/* CRC32C (Castagnoli), as iSCSI and ext4 use it: crc32c(0, "123456789", 9)
 * is 0xE3069283. Chainable: kv_crc32c(kv_crc32c(0, a, n), b, m) is the CRC of
 * a followed by b. Uses the SSE4.2 instruction where the CPU has it. */
#ifndef KV_CRC32C_H
#define KV_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t kv_crc32c(uint32_t crc, const void *p, size_t n);

#endif
