/* kv_assert(): invariants that must hold, checked in every build this project
 * makes (meson's default b_ndebug=false leaves NDEBUG undefined, so the test
 * and CI builds keep them; a -Db_ndebug=true build compiles them out).
 *
 * For what cannot happen unless the code is wrong: a failed check prints the
 * expression and where it is, then aborts, so that the core dump (and
 * systemd's restart) come from the broken invariant, not from whatever the
 * corrupted state would have done next. Input from a client never reaches an
 * assertion: that is validated and refused with an error. Shared by the
 * daemon, the client library and the tools; header only. */
#ifndef KV_KVASSERT_H
#define KV_KVASSERT_H

#include <stdio.h>
#include <stdlib.h>

static inline _Noreturn void kv_assert_fail(const char *expr, const char *file, int line,
					    const char *func)
{
	fprintf(stderr, "assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
	fflush(stderr);
	abort();
}

#ifdef NDEBUG
#define kv_assert(e) ((void)0)
#else
#define kv_assert(e) ((e) ? (void)0 : kv_assert_fail(#e, __FILE__, __LINE__, __func__))
#endif

#endif
