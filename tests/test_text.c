/* kv_text_clean() (common/kvtext.h), the one cleaner of text for logs,
 * metrics and terminals: the daemon's client names, the client library's and
 * kvctl's output all go through it. */
#include <string.h>

#include "check.h"
#include "kvtext.h"

static void clean_is(const char *in, size_t cap, const char *want)
{
	char out[64];

	CHECK(cap < sizeof(out));
	CHECK_EQ(kv_text_clean(out, cap, in), strlen(want));
	if (strcmp(out, want)) {
		fprintf(stderr, "kv_text_clean(\"%s\", %zu) = \"%s\", not \"%s\"\n", in, cap, out,
			want);
		exit(1);
	}
}

int main(void)
{
	clean_is("worker-1", 32, "worker-1");
	clean_is("a\tb\x7f" "c", 32, "a?b?c");               /* C0, DEL */
	clean_is("x\xc2\x9b" "1m", 32, "x?1m");              /* C1 (CSI): one '?' */
	clean_is("\xc2\xa0" "nbsp", 32, "\xc2\xa0" "nbsp");  /* U+00A0 is text */
	clean_is("caf\xc3\xa9", 32, "caf\xc3\xa9");
	clean_is("bad\xff\xc3" "x", 32, "bad??x");            /* invalid, truncated */
	clean_is("\xed\xa0\x80", 32, "???");                 /* a surrogate */
	clean_is("caf\xc3\xa9", 4, "caf");                   /* cut between characters */
	clean_is("ab", 0, "");
	return 0;
}
