#include "fault.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const point_names[KV_FAULT_NPOINTS] = {
	[KV_FAULT_COPY] = "copy",
	[KV_FAULT_G3_WRITE] = "g3_write",
	[KV_FAULT_G3_READ] = "g3_read",
	[KV_FAULT_G3_INDEX] = "g3_index",
	[KV_FAULT_DEVICE] = "device",
	[KV_FAULT_G4_BUF] = "g4_buf",
};

static const struct {
	const char *name;
	int err;
} errnos[] = {
	{ "EIO", EIO }, { "ENOSPC", ENOSPC }, { "EDQUOT", EDQUOT }, { "ENOMEM", ENOMEM },
	{ "EAGAIN", EAGAIN }, { "EINVAL", EINVAL }, { "EFAULT", EFAULT }, { "ENODEV", ENODEV },
};

struct fault {
	int err;             /* -errno or KV_FAULT_SHORT; 0 = unarmed */
	unsigned long skip, count, fired;
};

unsigned kv_fault_armed;
static struct fault faults[KV_FAULT_NPOINTS];

int kv_fault_hit(enum kv_fault_point p)
{
	struct fault *f = &faults[p];

	if (!f->err)
		return 0;
	if (f->skip) {
		f->skip--;
		return 0;
	}
	if (f->count && f->fired >= f->count)
		return 0;
	f->fired++;
	return f->err;
}

unsigned long kv_fault_fired(enum kv_fault_point p)
{
	return faults[p].fired;
}

static int parse_one(char *item, char *err, unsigned errlen)
{
	char *save = NULL, *tok = strtok_r(item, ":", &save), *eq;
	struct fault f = { .count = 1 };
	int p = -1;
	size_t i;

	if (!tok || !(eq = strchr(tok, '='))) {
		snprintf(err, errlen, "'%s': expected point=ERR", item);
		return -EINVAL;
	}
	*eq++ = '\0';
	for (i = 0; i < KV_FAULT_NPOINTS; i++)
		if (!strcmp(tok, point_names[i]))
			p = (int)i;
	if (p < 0) {
		int n = snprintf(err, errlen, "unknown fault point '%s' (", tok);

		for (i = 0; i < KV_FAULT_NPOINTS && n >= 0 && (size_t)n < errlen; i++)
			n += snprintf(err + n, errlen - (size_t)n, "%s%s", i ? ", " : "",
				      point_names[i]);
		if (n >= 0 && (size_t)n < errlen)
			snprintf(err + n, errlen - (size_t)n, ")");
		return -EINVAL;
	}
	if (!strcmp(eq, "short"))
		f.err = KV_FAULT_SHORT;
	for (i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++)
		if (!strcmp(eq, errnos[i].name))
			f.err = -errnos[i].err;
	if (!f.err) {
		snprintf(err, errlen, "fault point %s: unknown error '%s'", tok, eq);
		return -EINVAL;
	}
	while ((tok = strtok_r(NULL, ":", &save))) {
		char *end;
		unsigned long v;

		if (!(eq = strchr(tok, '='))) {
			snprintf(err, errlen, "fault option '%s': expected skip=N or count=N", tok);
			return -EINVAL;
		}
		*eq++ = '\0';
		errno = 0;
		v = strtoul(eq, &end, 10);
		if (errno || end == eq || *end) {
			snprintf(err, errlen, "fault option %s: bad number '%s'", tok, eq);
			return -EINVAL;
		}
		if (!strcmp(tok, "skip"))
			f.skip = v;
		else if (!strcmp(tok, "count"))
			f.count = v;
		else {
			snprintf(err, errlen, "unknown fault option '%s'", tok);
			return -EINVAL;
		}
	}
	faults[p] = f;
	kv_fault_armed = 1;
	return 0;
}

int kv_fault_parse(const char *spec, char *err, unsigned errlen)
{
	char *copy = strdup(spec), *save = NULL, *item;
	int r = 0;

	if (!copy)
		return -ENOMEM;
	for (item = strtok_r(copy, ",", &save); item && !r; item = strtok_r(NULL, ",", &save))
		r = parse_one(item, err, errlen);
	free(copy);
	return r;
}
