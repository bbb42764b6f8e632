/* The daemon's life as a service: signals, drain, reload, the watchdog and
 * status timers, and what a stop does before it returns.
 *
 *   SERVING --SIGTERM / SIGINT / Drain--> DRAINING --no client left--> STOPPING
 *   DRAINING --drain_timeout--> stopped (nothing written back: no time left)
 *   SERVING, DRAINING --second SIGTERM / SIGINT--> stopped
 *   STOPPING --G2 clean, or the drain deadline--> stopped
 *
 *   DRAINING  the worker socket no longer accepts (d->stop_accepting: a
 *             bound one is closed and unlinked, so a new daemon can start;
 *             an activated one is left to systemd, whose queue the next
 *             instance serves); the admin socket still does. Register,
 *             Alloc, Lookup, Fork, Cow and SwapIn get ESHUTDOWN; Release and
 *             Seal work. "No client left" means every session still open
 *             came through the admin socket and holds no reference.
 *   STOPPING  with a disk tier, the dirty G2 copies are written back to G3
 *             (d->flushing) until none is left or the drain deadline passes,
 *             so that a planned restart finds its warm cache; without dirty
 *             copies this state is left at once.
 *   stopped   the loop returns; the server closes every session. */
#ifndef KV_LIFECYCLE_H
#define KV_LIFECYCLE_H

#include <stddef.h>

#include "daemon.h"

/* Blocks SIGTERM, SIGINT and SIGHUP and polls them through a signalfd.
 * Returns 0 or -errno. */
int kv_lifecycle_init(struct kv_daemon *d);
/* Applies the configuration, starts the watchdog and status timers and tells
 * systemd the daemon is ready. */
void kv_lifecycle_start(struct kv_daemon *d);
/* After the loop returned: tells systemd the daemon stops. */
void kv_lifecycle_stopped(struct kv_daemon *d);
void kv_lifecycle_fini(struct kv_daemon *d);

/* Starts draining with timeout_ms (0: stop now). why goes to the log.
 * Returns 0, or -EALREADY when draining already. */
int kv_daemon_drain(struct kv_daemon *d, uint64_t timeout_ms, const char *why);
/* A session closed: ends a drain when no client is left. */
void kv_daemon_drain_check(struct kv_daemon *d);

/* Reads the configuration again (d->src) and applies the reloadable keys
 * that changed. report(ctx, line, applied) is called for each key that
 * differs ("log_level: info -> debug"); applied 0 means it needs a restart.
 * Returns 0, or -EINVAL with the reason in err when the configuration is
 * invalid (nothing changed then). Logs the outcome. */
int kv_daemon_reload(struct kv_daemon *d,
		     void (*report)(void *ctx, const char *line, int applied), void *ctx,
		     char *err, size_t errlen);

#endif
