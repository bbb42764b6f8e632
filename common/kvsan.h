/* KV_ASAN, KV_TSAN: 1 in a build with AddressSanitizer or ThreadSanitizer,
 * else 0. GCC says so with __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__,
 * clang with __has_feature() (the project's sanitizer builds are clang's:
 * scripts/test --asan, --tsan), so both are asked. Header only. */
#ifndef KV_KVSAN_H
#define KV_KVSAN_H

#ifndef __has_feature
#define KV_HAS_FEATURE(x) 0
#else
#define KV_HAS_FEATURE(x) __has_feature(x)
#endif

#if defined(__SANITIZE_ADDRESS__) || KV_HAS_FEATURE(address_sanitizer)
#define KV_ASAN 1
#else
#define KV_ASAN 0
#endif

#if defined(__SANITIZE_THREAD__) || KV_HAS_FEATURE(thread_sanitizer)
#define KV_TSAN 1
#else
#define KV_TSAN 0
#endif

#endif
