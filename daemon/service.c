/* sd_notify and socket activation; see service.h. */
#include "service.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvclock.h"
#include "kvconfig.h"
#if KV_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

int kv_service_built(void)
{
	return KV_HAVE_SYSTEMD;
}

int kv_service_notifying(void)
{
	const char *e = getenv("NOTIFY_SOCKET");

	return KV_HAVE_SYSTEMD && e && *e;
}

/* One datagram; a manager that went away is not our problem. */
static void notify(const char *msg)
{
#if KV_HAVE_SYSTEMD
	if (kv_service_notifying())
		sd_notify(0, msg);
#else
	(void)msg;
#endif
}

static void notify_status(const char *head, const char *status)
{
	char buf[1024];

	snprintf(buf, sizeof(buf), "%s%sSTATUS=%s", head, head[0] ? "\n" : "", status);
	notify(buf);
}

void kv_service_ready(const char *status)
{
	notify_status("READY=1", status);
}

void kv_service_status(const char *status)
{
	notify_status("", status);
}

void kv_service_reloading(void)
{
	char buf[128];

	snprintf(buf, sizeof(buf), "RELOADING=1\nSTATUS=reloading the configuration\n"
		 "MONOTONIC_USEC=%llu", (unsigned long long)kv_mono_us());
	notify(buf);
}

void kv_service_stopping(const char *status)
{
	notify_status("STOPPING=1", status);
}

void kv_service_watchdog(void)
{
	notify("WATCHDOG=1");
}

uint64_t kv_service_watchdog_usec(void)
{
#if KV_HAVE_SYSTEMD
	uint64_t usec = 0;

	if (sd_watchdog_enabled(0, &usec) > 0)
		return usec;
#endif
	return 0;
}

int kv_service_listen_fds(int *worker, int *admin, int *metrics, char *err, int errlen)
{
	*worker = *admin = *metrics = -1;
#if KV_HAVE_SYSTEMD
	char **names = NULL;
	int n = sd_listen_fds_with_names(1, &names), i, r = 0;

	if (n <= 0)
		return 0;
	for (i = 0; i < n && r == 0; i++) {
		int fd = SD_LISTEN_FDS_START + i;
		const char *name = names && names[i] ? names[i] : "unknown";
		int *slot = strstr(name, "admin") ? admin : strstr(name, "metrics") ? metrics : worker;

		if (slot == metrics ? sd_is_socket(fd, AF_UNSPEC, SOCK_STREAM, 1) <= 0
				    : sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
			snprintf(err, (size_t)errlen, "socket activation: fd %d ('%s') is not a "
				 "listening %sstream socket", fd, name,
				 slot == metrics ? "" : "AF_UNIX ");
			r = -EINVAL;
		} else if (*slot >= 0) {
			snprintf(err, (size_t)errlen, "socket activation: two %s sockets passed "
				 "(fds %d and %d); name them worker, admin and metrics",
				 slot == admin ? "admin" : slot == metrics ? "metrics" : "worker",
				 *slot, fd);
			r = -EINVAL;
		} else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0 ||
			   fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
			r = -errno;
			snprintf(err, (size_t)errlen, "socket activation: fd %d: %s", fd,
				 strerror(errno));
		} else {
			*slot = fd;
		}
	}
	if (r < 0) {
		for (i = 0; i < n; i++)
			close(SD_LISTEN_FDS_START + i);
		*worker = *admin = *metrics = -1;
	}
	for (i = 0; names && names[i]; i++)
		free(names[i]);
	free(names);
	return r < 0 ? r : (*worker >= 0) + (*admin >= 0) + (*metrics >= 0);
#else
	(void)err;
	(void)errlen;
	return 0;
#endif
}
