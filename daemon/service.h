/* systemd integration: readiness, status, watchdog and stop notifications
 * (sd_notify), and the listening sockets of socket activation.
 *
 * Built without libsystemd (KV_HAVE_SYSTEMD 0), the notifications do nothing
 * and no socket is taken from the environment; the daemon binds its own. */
#ifndef KV_SERVICE_H
#define KV_SERVICE_H

#include <stdint.h>

/* Whether this build talks to systemd. */
int kv_service_built(void);
/* Whether a service manager listens ($NOTIFY_SOCKET is set). */
int kv_service_notifying(void);

/* READY=1 with a STATUS= line. */
void kv_service_ready(const char *status);
/* STATUS= only. */
void kv_service_status(const char *status);
/* RELOADING=1 with MONOTONIC_USEC= (systemd >= 253 wants it); READY=1 follows
 * through kv_service_ready() when the reload is done. */
void kv_service_reloading(void);
/* STOPPING=1 with a STATUS= line. */
void kv_service_stopping(const char *status);
/* WATCHDOG=1. */
void kv_service_watchdog(void);

/* The watchdog interval systemd asks this process for (WATCHDOG_USEC, and
 * WATCHDOG_PID if set names us), in microseconds; 0 if none. The daemon pings
 * at half of it. */
uint64_t kv_service_watchdog_usec(void);

/* Takes the sockets passed by socket activation (sd_listen_fds_with_names):
 * the one named "worker" (or the only one not named like "admin" or
 * "metrics"), the one named "admin" (or any name containing "admin") and the
 * one named "metrics" (any name containing "metrics": GET /metrics over
 * HTTP, http.h). The worker and admin sockets must be listening AF_UNIX
 * stream sockets, the metrics one a listening stream socket of any family
 * (kvcached-metrics.socket passes a TCP one); each is made non-blocking and
 * close-on-exec. Sets *worker, *admin and *metrics to the fds, or -1 for one
 * not passed. Returns the number taken, or -EINVAL (message in err) for a
 * socket that does not fit; every passed fd is closed then. */
int kv_service_listen_fds(int *worker, int *admin, int *metrics, char *err, int errlen);

#endif
