/* Latency histograms; see hist.h. */
#include "hist.h"

#include <inttypes.h>

const uint64_t kv_hist_bounds_ns[KV_HIST_BOUNDS] = {
	1000, 2500, 5000,                               /* 1 us .. */
	10000, 25000, 50000,
	100000, 250000, 500000,
	1000000, 2500000, 5000000,                      /* 1 ms .. */
	10000000, 25000000, 50000000,
	100000000, 250000000, 500000000,
	1000000000, 2500000000u, 5000000000u, 10000000000u,  /* 1 s .. 10 s */
};

void kv_hist_write(FILE *f, const char *name, const char *labels, const struct kv_hist *h)
{
	const char *sep = labels[0] ? "," : "";
	uint64_t cum = 0;
	unsigned i;

	for (i = 0; i < KV_HIST_BOUNDS; i++) {
		cum += h->n[i];
		/* %g of ns / 1e9: 1e-06, 2.5e-06, 0.001, 2.5 (exact enough
		 * for bounds that are decimal in nanoseconds). */
		fprintf(f, "%s_bucket{%s%sle=\"%g\"} %" PRIu64 "\n", name, labels, sep,
			(double)kv_hist_bounds_ns[i] / 1e9, cum);
	}
	cum += h->n[KV_HIST_BOUNDS];
	fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %" PRIu64 "\n", name, labels, sep, cum);
	fprintf(f, "%s_sum%s%s%s %.9f\n", name, labels[0] ? "{" : "", labels, labels[0] ? "}" : "",
		(double)h->sum_ns / 1e9);
	fprintf(f, "%s_count%s%s%s %" PRIu64 "\n", name, labels[0] ? "{" : "", labels,
		labels[0] ? "}" : "", h->count);
}
