/* kvctl top: a refreshing view of the daemon, its pools and clients, with
 * rates between frames; on a terminal until q or a signal, else COUNT
 * frames (-o json: one compact document per line and frame). */
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "kvctl.h"


static volatile sig_atomic_t top_stop;
static struct termios top_saved;
static bool top_raw;

static void top_signal(int sig)
{
	(void)sig;
	top_stop = 1;
}

static void top_restore(void)
{
	if (top_raw) {
		tcsetattr(0, TCSANOW, &top_saved);
		fputs("\033[?25h", stdout);   /* cursor back */
		fflush(stdout);
		top_raw = false;
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const Kvcached__PoolInfo *find_pool(const Kvcached__StatsReply *s, uint32_t id)
{
	size_t i;

	for (i = 0; s && i < s->n_pools; i++)
		if (s->pools[i]->pool_id == id)
			return s->pools[i];
	return NULL;
}

static const Kvcached__ClientInfo *find_client(const Kvcached__ClientsReply *cr, uint64_t id)
{
	size_t i;

	for (i = 0; cr && i < cr->n_clients; i++)
		if (cr->clients[i]->session_id == id)
			return cr->clients[i];
	return NULL;
}

/* Per second between two counters; 0 without a previous frame. */
static double rate(uint64_t now, uint64_t before, double dt, bool have)
{
	return have && dt > 0 && now >= before ? (double)(now - before) / dt : 0.0;
}

static void top_frame_json(const Kvcached__StatsReply *s, const Kvcached__StatsReply *ps,
			   const Kvcached__ClientsReply *cr, double dt)
{
	struct json j = { .compact = true };
	struct timespec ts;
	size_t i;

	clock_gettime(CLOCK_REALTIME, &ts);
	json_open(&j, '{');
	json_u64(&j, "time_ms", (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000);
	json_stats_fields(&j, s);
	json_f64(&j, "requests_per_s", rate(s->requests, ps ? ps->requests : 0, dt, ps != NULL));
	json_key(&j, "pools");
	json_open(&j, '[');
	for (i = 0; i < s->n_pools; i++)
		json_pool(&j, s->pools[i]);
	json_close(&j, ']');
	json_key(&j, "clients");
	json_open(&j, '[');
	for (i = 0; cr && i < cr->n_clients; i++)
		json_client(&j, cr->clients[i]);
	json_close(&j, ']');
	json_close(&j, '}');
}

static void top_frame_human(const Kvcached__StatsReply *s, const Kvcached__StatsReply *ps,
			    const Kvcached__ClientsReply *cr, const Kvcached__ClientsReply *pcr,
			    double dt, bool tty, int rows)
{
	static const char *const phead[] = { "POOL", "NAMESPACE", "NAME", "BLOCK", "BLOCKS",
					     "WRITABLE", "SEALED", "CACHED", "ALLOC/s", "LOOKUP/s",
					     "HIT", "EVICT/s" };
	static const char *const chead[] = { "SESSION", "PID", "UID", "NAMESPACE", "NAME", "REFS",
					     "REQ/s" };
	struct table pt = { .ncol = 12, .head = phead, .align = "rllrrrrrrrrr" };
	struct table ct = { .ncol = 7, .head = chead, .align = "rrrllrr" };
	uint64_t used = s->pages_total - s->pages_free;
	bool have = ps != NULL;
	char *x, *y, clock[16];
	time_t t = time(NULL);
	struct tm tm;
	int lines, shown = 0;
	size_t i;

	localtime_r(&t, &tm);
	strftime(clock, sizeof(clock), "%H:%M:%S", &tm);
	if (tty)
		fputs("\033[H\033[2J", stdout);
	x = fmt_duration(s->uptime_ms);
	printf("kvctl top - %s  kvcached %s (%s), up %s, %s\n", clock, s->version, s->backend, x,
	       s->draining ? "DRAINING" : "serving");
	free(x);
	x = fmt_bytes(used * s->page_bytes);
	y = fmt_bytes(s->pages_total * s->page_bytes);
	printf("memory  %s of %s in use (%.1f%%), %" PRIu64 " of %" PRIu64 " pages free\n", x, y,
	       s->pages_total ? 100.0 * (double)used / (double)s->pages_total : 0.0, s->pages_free,
	       s->pages_total);
	free(x);
	free(y);
	printf("clients %" PRIu32 "  sessions %" PRIu32 "  requests %" PRIu64 " (%.1f/s)  enospc %"
	       PRIu64 "\n\n", s->clients, s->sessions, s->requests,
	       rate(s->requests, have ? ps->requests : 0, dt, have), s->enospc);
	lines = 4;
	for (i = 0; i < s->n_pools; i++) {
		const Kvcached__PoolInfo *p = s->pools[i], *q = find_pool(ps, p->pool_id);

		cell(&pt, "%" PRIu32, p->pool_id);
		cell(&pt, "%s", p->namespace_);
		cell(&pt, "%s", p->name);
		cell(&pt, "%s", x = fmt_bytes(p->block_bytes));
		free(x);
		cell(&pt, "%" PRIu64, p->runs * p->blocks_per_run);
		cell(&pt, "%" PRIu64, p->blocks_writable);
		cell(&pt, "%" PRIu64, p->blocks_sealed);
		cell(&pt, "%" PRIu64, p->blocks_cached);
		cell(&pt, "%.1f", rate(p->allocs, q ? q->allocs : 0, dt, q != NULL));
		cell(&pt, "%.1f", rate(p->lookups, q ? q->lookups : 0, dt, q != NULL));
		cell(&pt, "%s", x = fmt_pct(p->hits, p->lookups));
		free(x);
		cell(&pt, "%.1f", rate(p->evictions, q ? q->evictions : 0, dt, q != NULL));
	}
	if (s->n_pools) {
		table_print(&pt);
		lines += (int)s->n_pools + 2;
		putchar('\n');
	}
	for (i = 0; cr && i < cr->n_clients; i++) {
		const Kvcached__ClientInfo *ci = cr->clients[i], *pc;

		/* On a terminal, what fits; the rest is counted. */
		if (tty && rows > 0 && lines + shown + 3 > rows)
			break;
		pc = find_client(pcr, ci->session_id);
		cell(&ct, "%" PRIu64, ci->session_id);
		cell(&ct, "%" PRId32, ci->pid);
		cell(&ct, "%" PRIu32, ci->uid);
		cell(&ct, "%s", ci->namespace_);
		cell(&ct, "%s", ci->name);
		cell(&ct, "%" PRIu64, ci->refs);
		cell(&ct, "%.1f", rate(ci->requests, pc ? pc->requests : 0, dt, pc != NULL));
		shown++;
	}
	if (shown)
		table_print(&ct);
	if (cr && (size_t)shown < cr->n_clients)
		printf("... %zu more sessions\n", cr->n_clients - (size_t)shown);
	if (tty)
		fputs("\n(q to quit)", stdout);
	else
		putchar('\n');
}

int cmd_top(kvc_conn *c, const struct args *a)
{
	Kvcached__Response *st = NULL, *pst = NULL, *cl = NULL, *pcl = NULL;
	bool tty = isatty(1) && a->fmt == FMT_HUMAN, keys = tty && isatty(0);
	struct sigaction sa;
	double t = 0, pt = 0;
	int ret = 0;
	long i;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = top_signal;   /* no SA_RESTART: the wait returns */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (keys && tcgetattr(0, &top_saved) == 0) {
		struct termios raw = top_saved;

		raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
		raw.c_cc[VMIN] = 0;
		raw.c_cc[VTIME] = 0;
		if (tcsetattr(0, TCSANOW, &raw) == 0) {
			top_raw = true;
			atexit(top_restore);
			fputs("\033[?25l", stdout);   /* no cursor */
		}
	}
	for (i = 0; !top_stop && (a->count == 0 || i < a->count); i++) {
		struct winsize ws = { 0 };
		int rows = 0;

		if (tty && ioctl(1, TIOCGWINSZ, &ws) == 0)
			rows = ws.ws_row;
		st = get_stats(c);
		if (!st) {
			ret = 1;
			break;
		}
		cl = get_clients(c);
		if (!cl) {
			ret = 1;
			break;
		}
		t = now_s();
		if (a->fmt == FMT_JSON)
			top_frame_json(st->stats, pst ? pst->stats : NULL, cl->clients, t - pt);
		else
			top_frame_human(st->stats, pst ? pst->stats : NULL, cl->clients,
					pcl ? pcl->clients : NULL, t - pt, tty, rows);
		fflush(stdout);
		if (pst)
			kvcached__response__free_unpacked(pst, NULL);
		if (pcl)
			kvcached__response__free_unpacked(pcl, NULL);
		pst = st;
		pcl = cl;
		st = cl = NULL;
		pt = t;
		if (a->count && i + 1 >= a->count)
			break;
		/* The delay, cut short by q or a signal. */
		for (double end = now_s() + a->delay; !top_stop;) {
			double left = end - now_s();
			struct pollfd pfd = { .fd = 0, .events = POLLIN };
			char ch;

			if (left <= 0)
				break;
			if (poll(&pfd, keys ? 1 : 0, (int)(left * 1000) + 1) > 0 &&
			    read(0, &ch, 1) == 1 && (ch == 'q' || ch == 'Q'))
				top_stop = 1;
		}
	}
	if (tty)
		putchar('\n');
	top_restore();
	if (st)
		kvcached__response__free_unpacked(st, NULL);
	if (pst)
		kvcached__response__free_unpacked(pst, NULL);
	if (pcl)
		kvcached__response__free_unpacked(pcl, NULL);
	return ret;
}
