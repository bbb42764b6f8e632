/* The G3 index journal written by the worker thread (journal.h, worker.h):
 * a compaction made a chunk at a time while records keep being appended
 * between the chunks replays to exactly the state the appends describe; a
 * compaction cut short (the daemon stops or dies before its end) leaves the
 * old file whole and complete.
 *
 * A model of the disk's runs and slots is changed at random; every change is
 * appended, as the tiers do. The replay here applies the rules of
 * tier/adopt.c's replay_rec(): a run record makes the run anew (dropping
 * what it overlaps), a run-free drops it, slot records set or clear a slot
 * of a known run and are ignored otherwise. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "journal.h"
#include "worker.h"

#define NPAGES 256
#define MAXSLOTS 8

struct run {
	int live;
	uint32_t npages, nslots;
	uint8_t valid[MAXSLOTS];
	uint8_t hash[MAXSLOTS][32];
};

/* at[p]: the run starting at page p. */
struct state {
	struct run at[NPAGES];
};

static uint64_t rng = 88172645463325252ull;

static uint32_t rnd(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % n);
}

/* ---- the replay (tier/adopt.c's rules) ---- */

static void replay(void *ctx, const struct kv_jrec *r)
{
	struct state *s = ctx;
	uint32_t p;

	switch (r->type) {
	case KV_J_RUN:
		if (r->page >= NPAGES || !r->npages || r->npages > NPAGES - r->page ||
		    !r->nslots || r->nslots > MAXSLOTS)
			return;
		for (p = 0; p < r->page + r->npages; p++)
			if (s->at[p].live && p + s->at[p].npages > r->page)
				s->at[p].live = 0;
		memset(&s->at[r->page], 0, sizeof(s->at[0]));
		s->at[r->page] = (struct run){ .live = 1, .npages = r->npages, .nslots = r->nslots };
		break;
	case KV_J_RUN_FREE:
		if (r->page < NPAGES)
			s->at[r->page].live = 0;
		break;
	case KV_J_SLOT:
	case KV_J_SLOT_FREE:
		if (r->page >= NPAGES || !s->at[r->page].live || r->slot >= s->at[r->page].nslots)
			return;
		s->at[r->page].valid[r->slot] = r->type == KV_J_SLOT;
		if (r->type == KV_J_SLOT)
			memcpy(s->at[r->page].hash[r->slot], r->hash, 32);
		break;
	}
}

/* The same state: every run holding a valid slot, as tier/adopt.c keeps. */
static void same(const struct state *model, const struct state *got)
{
	for (uint32_t p = 0; p < NPAGES; p++) {
		const struct run *m = &model->at[p], *g = &got->at[p];
		int mused = 0, gused = 0;

		for (uint32_t s = 0; m->live && s < m->nslots; s++)
			mused += m->valid[s];
		for (uint32_t s = 0; g->live && s < g->nslots; s++)
			gused += g->valid[s];
		CHECK_EQ(!!mused, !!gused);
		if (!mused)
			continue;
		CHECK_EQ(m->npages, g->npages);
		CHECK_EQ(m->nslots, g->nslots);
		for (uint32_t s = 0; s < m->nslots; s++) {
			CHECK_EQ(m->valid[s], g->valid[s]);
			CHECK(!m->valid[s] || !memcmp(m->hash[s], g->hash[s], 32));
		}
	}
}

/* ---- changes, each appended as the tiers append them ---- */

static void append(struct kv_journal *j, struct kv_jrec *r)
{
	CHECK_EQ(kv_journal_append(j, r), 0);
}

static int overlaps(const struct state *s, uint32_t page, uint32_t n)
{
	for (uint32_t p = 0; p < page + n && p < NPAGES; p++)
		if (s->at[p].live && p + s->at[p].npages > page)
			return 1;
	return 0;
}

static void change(struct state *s, struct kv_journal *j)
{
	uint32_t p = rnd(NPAGES), k = rnd(10);
	struct run *r = &s->at[p];
	struct kv_jrec rec = { .page = p };

	if (!r->live) {
		uint32_t n = 1 + rnd(4);

		if (p + n > NPAGES || overlaps(s, p, n))
			return;
		memset(r, 0, sizeof(*r));
		*r = (struct run){ .live = 1, .npages = n, .nslots = 1 + rnd(MAXSLOTS) };
		rec.type = KV_J_RUN;
		rec.npages = r->npages;
		rec.nslots = r->nslots;
		rec.slot_bytes = 4096;
	} else if (k == 0) {
		r->live = 0;
		rec.type = KV_J_RUN_FREE;
	} else {
		uint32_t slot = rnd(r->nslots);

		rec.slot = (uint16_t)slot;
		if (k < 7) {
			r->valid[slot] = 1;
			for (int b = 0; b < 32; b++)
				r->hash[slot][b] = (uint8_t)rnd(256);
			memcpy(rec.hash, r->hash[slot], 32);
			rec.type = KV_J_SLOT;
		} else {
			r->valid[slot] = 0;
			rec.type = KV_J_SLOT_FREE;
		}
	}
	append(j, &rec);
}

/* Adds the records of the runs starting in [from, to) to the compaction. */
static void chunk(const struct state *s, struct kv_journal *j, uint32_t from, uint32_t to)
{
	for (uint32_t p = from; p < to; p++) {
		const struct run *r = &s->at[p];
		struct kv_jrec rec = { .type = KV_J_RUN, .page = p };

		if (!r->live)
			continue;
		rec.npages = r->npages;
		rec.nslots = r->nslots;
		rec.slot_bytes = 4096;
		CHECK_EQ(kv_journal_compact_add(j, &rec), 0);
		for (uint32_t k = 0; k < r->nslots; k++) {
			if (!r->valid[k])
				continue;
			rec = (struct kv_jrec){ .type = KV_J_SLOT, .page = p, .slot = (uint16_t)k };
			memcpy(rec.hash, r->hash[k], 32);
			CHECK_EQ(kv_journal_compact_add(j, &rec), 0);
		}
	}
	kv_journal_compact_push(j);
}

static void reopen_and_compare(const char *path, const struct state *model)
{
	static struct state got;
	struct kv_journal j;
	char err[256];

	memset(&got, 0, sizeof(got));
	CHECK_EQ(kv_journal_open(&j, path, 4096, 1 << 30, replay, &got, err, sizeof(err)), 0);
	same(model, &got);
	kv_journal_close(&j);
}

static void one_round(const char *path, int finish)
{
	static struct state model;
	struct kv_journal j;
	struct kv_worker w;
	char err[256], tmp[300];
	uint64_t before;
	int efd_pipe[2];

	memset(&model, 0, sizeof(model));
	unlink(path);
	CHECK_EQ(kv_journal_open(&j, path, 4096, 1 << 30, replay, &model, err, sizeof(err)), 0);
	CHECK(pipe(efd_pipe) == 0);
	CHECK_EQ(kv_worker_start(&w, efd_pipe[1]), 0);
	kv_journal_attach(&j, &w);
	/* History: many changes, most of them superseded. */
	for (int i = 0; i < 20000; i++) {
		change(&model, &j);
		if (i % 97 == 0)
			kv_journal_flush(&j);
	}
	kv_journal_flush(&j);
	kv_worker_wait_idle(&w);
	before = j.records;
	CHECK(before > 1000);
	/* A compaction in chunks, with changes between them. */
	CHECK_EQ(kv_journal_compact_begin(&j), 0);
	CHECK_EQ(kv_journal_compact_begin(&j), -EBUSY);
	for (uint32_t p = 0; p < NPAGES;) {
		uint32_t n = 1 + rnd(24);

		if (p + n > NPAGES)
			n = NPAGES - p;
		chunk(&model, &j, p, p + n);
		p += n;
		for (uint32_t k = rnd(40); k; k--)
			change(&model, &j);
		if (!finish && p > NPAGES / 2)
			break;
	}
	if (finish) {
		kv_journal_compact_end(&j);
		for (int i = 0; i < 300; i++)
			change(&model, &j);
		kv_journal_flush(&j);
		kv_worker_wait_idle(&w);
		CHECK_EQ(kv_journal_compacting(&j), 0);
		/* Compact: far fewer records than the history had. */
		CHECK(j.records < before / 2);
		CHECK_EQ(j.errors, 0);
	}
	/* Stopping: what is staged is written; a compaction without its end
	 * goes, and the old file has everything. */
	kv_journal_detach(&j);
	kv_worker_stop(&w);
	kv_journal_close(&j);
	snprintf(tmp, sizeof(tmp), "%s.new", path);
	CHECK(access(tmp, F_OK) < 0);
	close(efd_pipe[0]);
	close(efd_pipe[1]);
	reopen_and_compare(path, &model);
}

int main(void)
{
	char dir[] = "/tmp/kvjournal.XXXXXX", path[300];

	CHECK(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/g3.idx", dir);
	for (int round = 0; round < 8; round++) {
		one_round(path, 1);
		one_round(path, 0);
	}
	unlink(path);
	rmdir(dir);
	puts("ok");
	return 0;
}
