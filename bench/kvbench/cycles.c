/* kvbench sections b and c: alloc, seal and release of 1 block (b), and of
 * 16 and 256 blocks per request (c), each op timed and the whole cycle,
 * against the floor of the same frames. */
#include <stdio.h>

#include "kvbench.h"

void section_cycles(struct bench_conn *bc, char section, uint32_t n, double target)
{
	struct samples s[4] = { { 0 } };
	struct frames f[3] = { fr(OP_ALLOC, n), fr(OP_SEAL, n), fr(OP_RELEASE, n) };
	double fl[4] = { floor_op(OP_ALLOC, n), floor_op(OP_SEAL, n), floor_op(OP_RELEASE, n),
			 floor_cycle(n) };
	struct row *r;
	char name[48];
	struct snap s0 = snap_take(bc), s1;
	double ev;
	int i;

	cycles_run(bc, n, section == 'b' ? D.single : D.batch, s);
	s1 = snap_take(bc);
	for (i = 0; i < 4; i++) {
		if (i < 3)
			snprintf(name, sizeof(name), "%s %u", opname[i], n);
		else
			snprintf(name, sizeof(name), "alloc+seal+release %u", n);
		r = add_row(section, name);
		row_from(r, &s[i], 1);
		r->req = i < 3 ? f[i].req : f[0].req + f[1].req + f[2].req;
		r->resp = i < 3 ? f[i].resp : f[0].resp + f[1].resp + f[2].resp;
		r->floor_p50 = fl[i];
		r->target = target;
		if (i == 3)
			r->ops_unit = "cycles/s";
		print_row(r);
	}
	if (n > 1) {
		r = add_row(section, "");
		snprintf(r->name, sizeof(r->name), "  per block (cycle / %u)", n);
		row_from(r, &s[3], n);
		r->p50 /= n;
		r->p99 /= n;
		r->ops_unit = "blocks/s";
		print_row(r);
	}
	ev = evicted_note(s0, s1);
	for (i = 0; i < 4 + (n > 1); i++)
		rows[nrows - 1 - (size_t)i].evicted = ev;
	for (i = 0; i < 4; i++)
		sample_free(&s[i]);
	/* The daemon's CPU per request (not its latency): a pass of its own,
	 * after the timed one, so that the reads do not touch the figures
	 * above. */
	if (cycles_cpu(bc, n, n > 16 ? 1000 : 2000, s)) {
		for (i = 0; i < 3; i++) {
			snprintf(name, sizeof(name), "%s %u", opname[i], n);
			cpu_row(section, name, &s[i]);
			sample_free(&s[i]);
		}
	}
}
