/* The daemon assembled with its sockets; see server.h. */
#include "server.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "lifecycle.h"
#include "log.h"
#include "metrics.h"
#include "service.h"

static void stop_accepting(struct kv_daemon *d)
{
	struct kv_server *s = kv_container_of(d, struct kv_server, d);

	kv_listener_close(&s->worker);
}

static const char *worker_name(struct kv_daemon *d, char *buf, size_t len)
{
	struct kv_server *s = kv_container_of(d, struct kv_server, d);
	char tmp[160];

	snprintf(buf, len, "%s", kv_listener_name(&s->worker, tmp, sizeof(tmp)));
	return buf;
}

/* Fds open now. */
static uint64_t open_fds(void)
{
	DIR *dir = opendir("/proc/self/fd");
	uint64_t n = 0;

	if (!dir)
		return 64;   /* no /proc: a guess */
	while (readdir(dir))
		n++;
	closedir(dir);
	return n > 3 ? n - 3 : 0;   /* ".", "..", the directory's own fd */
}

/* What bounds the segment fds passed to clients (kv_daemon_fds_max): the
 * fd limit, and the fds the daemon needs besides worker connections and
 * those: its own now, the admin socket's connections, a margin for the
 * files it opens as it runs (the G3 journal's rewrite, /proc). */
static void fds_limits(struct kv_daemon *d)
{
	struct rlimit rl;
	uint64_t max;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		d->fd_limit = rl.rlim_cur;
	d->fd_reserved = open_fds() + KV_ADMIN_CONNS_MAX + 64;
	max = kv_daemon_fds_max(d);
	if (max < d->cfg.max_fds_per_conn)
		kv_warn("RLIMIT_NOFILE %llu leaves room for %llu segment fds in flight, fewer than "
			"max_fds_per_connection (%u), with %llu fds of the daemon's and %u "
			"connections: requests that need them will get EAGAIN; raise LimitNOFILE or "
			"lower max_connections", (unsigned long long)d->fd_limit,
			(unsigned long long)max, d->cfg.max_fds_per_conn,
			(unsigned long long)d->fd_reserved, d->cfg.max_connections);
	else
		kv_info("segment fds in flight: at most %llu (RLIMIT_NOFILE %llu, max_fds_in_flight "
			"%u), %u per connection, %llu per uid", (unsigned long long)max,
			(unsigned long long)d->fd_limit, d->cfg.max_fds_in_flight,
			d->cfg.max_fds_per_conn,
			(unsigned long long)kv_daemon_fds_per_uid_max(d));
}

int kv_server_init(struct kv_server *s, const struct kv_config *cfg,
		   const struct kv_config_source *src)
{
	char err[256], wname[160], aname[160];
	int wfd, afd, mfd, r;

	memset(s, 0, sizeof(*s));
	s->d.sigfd = -1;
	/* Taken first: a failure below must not leave them to a child. */
	r = kv_service_listen_fds(&wfd, &afd, &mfd, err, sizeof(err));
	if (r < 0) {
		kv_err("%s", err);
		return r;
	}
	kv_conns_init(&s->conns, &s->d);
	kv_listener_init(&s->worker, &s->conns, "worker", 0, wfd);
	kv_listener_init(&s->admin, &s->conns, "admin", 1, afd);
	if ((r = kv_daemon_init(&s->d, cfg)) < 0) {
		if (mfd >= 0)
			close(mfd);
		return r;
	}
	s->d.src = src;
	s->d.stop_accepting = stop_accepting;
	s->d.close_session = kv_conn_close_session;
	s->d.worker_name = worker_name;
	s->d.refresh_fds = kv_conns_refresh_fds;
	s->d.queue_stats = kv_conns_queue_stats;
	s->d.conns = &s->conns;   /* kv_daemon_init() cleared what kv_conns_init() set */
	if ((r = kv_lifecycle_init(&s->d)) < 0 ||
	    (r = kv_listener_bind(&s->worker, cfg->socket_path, cfg->socket_mode,
				  cfg->socket_group)) < 0 ||
	    (r = kv_listener_bind(&s->admin, cfg->admin_socket_path, cfg->admin_socket_mode,
				  cfg->admin_socket_group)) < 0 ||
	    (r = kv_listener_start(&s->worker)) < 0 || (r = kv_listener_start(&s->admin)) < 0) {
		if (mfd >= 0)
			close(mfd);
		return r;
	}
	/* GET /metrics: on the socket systemd passed, else on metrics_listen. */
	if (mfd >= 0 && cfg->metrics_listen[0])
		kv_info("metrics_listen %s not bound: the metrics socket came from systemd",
			cfg->metrics_listen);
	if ((mfd >= 0 || cfg->metrics_listen[0]) &&
	    (r = kv_http_start(&s->d, kv_metrics_page, cfg->metrics_listen, mfd, &s->http)) < 0)
		return r;
	s->d.http = s->http;
	fds_limits(&s->d);
	kv_info("listening on %s (workers) and %s (admin): backend %s, %llu MiB in %llu segments "
		"of %llu KiB, pages of %llu KiB",
		kv_listener_name(&s->worker, wname, sizeof(wname)),
		kv_listener_name(&s->admin, aname, sizeof(aname)), s->d.be->name,
		(unsigned long long)(cfg->pool_bytes >> 20),
		(unsigned long long)(cfg->pool_bytes / cfg->segment_bytes),
		(unsigned long long)(cfg->segment_bytes >> 10),
		(unsigned long long)(cfg->page_bytes >> 10));
	if (s->worker.activated || s->admin.activated)
		kv_info("socket activation: %s socket%s from systemd, not bound here",
			s->worker.activated && s->admin.activated ? "worker and admin"
			: s->worker.activated ? "worker" : "admin",
			s->worker.activated && s->admin.activated ? "s" : "");
	return 0;
}

int kv_server_run(struct kv_server *s)
{
	int r;

	kv_lifecycle_start(&s->d);
	r = kv_loop_run(&s->d.loop);
	kv_lifecycle_stopped(&s->d);
	return r;
}

void kv_server_fini(struct kv_server *s)
{
	/* Nothing runs any more: a session closed now must not start a stop. */
	kv_loop_stop(&s->d.loop);
	kv_conns_fini(&s->conns);
	kv_http_stop(s->http);
	s->http = NULL;
	s->d.http = NULL;
	kv_listener_close(&s->worker);
	kv_listener_close(&s->admin);
	kv_lifecycle_fini(&s->d);
	kv_daemon_fini(&s->d);
}
