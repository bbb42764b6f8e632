/* kvmac: what authenticating G4 values costs (issue 29): HMAC-SHA-256
 * (libcrypto, g4mac.h) against CRC32C (kernels/crc32c.h), both over the
 * same values of BLOCK bytes (default 64 KiB, 2 MiB and 8 MiB), one
 * thread, GB/s. Figures, never assertions (docs/benchmarks.md).
 *
 *   kvmac [SECONDS]      (default 1 per measurement) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crc32c.h"
#include "g4mac.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	static const size_t sizes[] = { 64u << 10, 2u << 20, 8u << 20 };
	double secs = argc > 1 ? atof(argv[1]) : 1.0;
	uint8_t key[KV_G4MAC_KEY_BYTES], tag[KV_G4MAC_TAG_BYTES];
	uint8_t *buf = malloc(8u << 20);
	volatile uint32_t sink = 0;

	if (!buf)
		return 1;
	for (size_t i = 0; i < (8u << 20); i++)
		buf[i] = (uint8_t)(i * 2654435761u >> 24);
	memset(key, 7, sizeof(key));
	printf("%-10s %12s %12s %8s\n", "value", "CRC32C GB/s", "HMAC GB/s", "ratio");
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t n = sizes[s];
		double t0, t, crc_gbs, mac_gbs;
		uint64_t done;

		for (done = 0, t0 = now_s(); (t = now_s() - t0) < secs; done += n)
			sink += kv_crc32c(0, buf, n);
		crc_gbs = (double)done / t / 1e9;
		for (done = 0, t0 = now_s(); (t = now_s() - t0) < secs; done += n) {
			kv_g4mac_tag(key, buf, n, tag);
			sink += tag[0];
		}
		mac_gbs = (double)done / t / 1e9;
		printf("%6zu KiB %12.2f %12.2f %7.1fx\n", n >> 10, crc_gbs, mac_gbs, crc_gbs / mac_gbs);
	}
	(void)sink;
	free(buf);
	return 0;
}
