/* The one reading of the clocks, for the daemon, the client library and the
 * tools: CLOCK_MONOTONIC for every interval, timeout and deadline (setting
 * the clock neither ends nor extends them), CLOCK_REALTIME only for what
 * people compare with dates. Header only; any thread. */
#ifndef KV_KVCLOCK_H
#define KV_KVCLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t kv_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CLOCK_MONOTONIC in microseconds (systemd's MONOTONIC_USEC). */
static inline uint64_t kv_mono_us(void)
{
	return kv_mono_ns() / 1000u;
}

/* CLOCK_MONOTONIC in milliseconds: when prefixes are born (index.h), the
 * deadlines and timers of the daemon. */
static inline uint64_t kv_mono_ms(void)
{
	return kv_mono_ns() / 1000000u;
}

#endif
