/* kvcached: the node's KV-cache memory daemon. Reads the configuration (file
 * and command line, config.h) and runs the server; see kvcached(8) and
 * docs/operations.md. */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "config.h"
#include "fault.h"
#include "kvconfig.h"
#include "log.h"
#include "server.h"
#include "service.h"

enum { OPT_CHECK = 1000, OPT_PRINT, OPT_KEY = 2000 };

static const char *metavar(const struct kv_cfg_key *k)
{
	switch (k->type) {
	case KV_CFG_SIZE: return "SIZE";
	case KV_CFG_SIZE_PCT: return "SIZE|PCT%";
	case KV_CFG_UINT: return "N";
	case KV_CFG_STRING: return "PATH";
	case KV_CFG_CHOICE: return k->choices;
	case KV_CFG_MODE: return "MODE";
	case KV_CFG_GROUP: return "GROUP";
	case KV_CFG_BOOL: return "yes|no";
	case KV_CFG_DURATION: return "DURATION";
	case KV_CFG_LOG_LEVEL: return "LEVEL";
	case KV_CFG_PERCENT: return "PCT";
	}
	return "VALUE";
}

/* Writes text indented by `indent`, wrapped at 79 columns. */
static void wrap(FILE *f, int indent, const char *text)
{
	int col = indent;

	fprintf(f, "%*s", indent, "");
	while (*text) {
		int len = (int)strcspn(text, " ");

		if (col > indent && col + 1 + len > 79) {
			fprintf(f, "\n%*s", indent, "");
			col = indent;
		} else if (col > indent) {
			fputc(' ', f);
			col++;
		}
		fprintf(f, "%.*s", len, text);
		col += len;
		text += len;
		while (*text == ' ')
			text++;
	}
	fputc('\n', f);
}

static void usage(FILE *f)
{
	size_t i, j;

	fprintf(f,
		"Usage: kvcached [OPTION]...\n"
		"The KV-cache memory daemon: owns the node's KV memory as a page pool and\n"
		"serves it to inference workers over a Unix socket (kvcached(8)).\n\n"
		"  -c, --config=PATH      configuration file (default %s;\n"
		"                         a missing default file is fine, '' reads none)\n"
		"      --check-config     check the configuration and exit 0 if it is valid\n"
		"      --print-config     print the resulting configuration and exit\n"
		"  -h, --help             this text\n"
		"  -V, --version          the version and build features\n\n"
		"Configuration keys (kvcached.conf(5)): 'key = value' in the file, --key-name=VALUE\n"
		"here; the command line wins. [R] marks keys a reload (SIGHUP) changes.\n",
		KV_CONFIG_PATH);
	for (i = 0; i < kv_cfg_nkeys; i++) {
		const struct kv_cfg_key *k = &kv_cfg_keys[i];
		char opt[96], doc[512];
		int n;

		n = snprintf(opt, sizeof(opt), "  %c%c%c --", k->short_opt ? '-' : ' ',
			     k->short_opt ? k->short_opt : ' ', k->short_opt ? ',' : ' ');
		for (j = 0; k->name[j] && n < (int)sizeof(opt) - 1; j++)
			opt[n++] = k->name[j] == '_' ? '-' : k->name[j];
		opt[n] = 0;
		fprintf(f, "%s=%s\n", opt, metavar(k));
		snprintf(doc, sizeof(doc), "%s%s%s%s%s", k->doc, k->def[0] ? " (default " : "",
			 k->def, k->def[0] ? ")" : "", k->flags & KV_CFG_RELOAD ? " [R]" : "");
		wrap(f, 8, doc);
	}
	fputs("\nSIZE takes a unit: 4096, 64KiB, 2MiB, 1GiB (K, M, G, T and KB, MB... are binary\n"
	      "too). DURATION: 500ms, 30s, 2m, 1h (a bare number is seconds). The pool size\n"
	      "must be a multiple of the segment size, the segment size of the page size.\n"
	      "A percentage pool_size is of device memory (host backend: of RAM), rounded\n"
	      "down to whole segments.\n\n"
	      "Signals: SIGTERM or SIGINT drains (a second one exits at once), SIGHUP reloads.\n", f);
}

static int bad(const char *msg)
{
	fprintf(stderr, "kvcached: %s\n", msg);
	return 2;
}

int main(int argc, char **argv)
{
	struct option *opts = calloc(kv_cfg_nkeys + 8, sizeof(*opts));
	char **names = calloc(kv_cfg_nkeys, sizeof(char *));
	struct kv_config_source src;
	struct kv_config cfg;
	struct kv_server srv;
	char shortopts[64] = "c:hV", err[1024];
	int c, r, check = 0, print = 0, ret = 2;
	size_t i, j, n = 0;

	memset(&src, 0, sizeof(src));
	snprintf(src.path, sizeof(src.path), "%s", KV_CONFIG_PATH);
	if (!opts || !names)
		return bad("out of memory");
	opts[n++] = (struct option){ "config", required_argument, NULL, 'c' };
	opts[n++] = (struct option){ "check-config", no_argument, NULL, OPT_CHECK };
	opts[n++] = (struct option){ "print-config", no_argument, NULL, OPT_PRINT };
	opts[n++] = (struct option){ "help", no_argument, NULL, 'h' };
	opts[n++] = (struct option){ "version", no_argument, NULL, 'V' };
	for (i = 0; i < kv_cfg_nkeys; i++) {
		const struct kv_cfg_key *k = &kv_cfg_keys[i];

		names[i] = strdup(k->name);
		if (!names[i]) {
			ret = bad("out of memory");
			goto out;
		}
		for (j = 0; names[i][j]; j++)
			if (names[i][j] == '_')
				names[i][j] = '-';
		opts[n++] = (struct option){ names[i], required_argument, NULL,
					     k->short_opt ? k->short_opt : OPT_KEY + (int)i };
		if (k->short_opt) {
			size_t l = strlen(shortopts);

			shortopts[l] = k->short_opt;
			shortopts[l + 1] = ':';
			shortopts[l + 2] = 0;
		}
	}
	while ((c = getopt_long(argc, argv, shortopts, opts, NULL)) != -1) {
		const struct kv_cfg_key *k = NULL;

		switch (c) {
		case 'c':
			if (strlen(optarg) >= sizeof(src.path)) {
				ret = bad("--config: path too long");
				goto out;
			}
			snprintf(src.path, sizeof(src.path), "%s", optarg);
			src.explicit_path = 1;
			continue;
		case OPT_CHECK:
			check = 1;
			continue;
		case OPT_PRINT:
			print = 1;
			continue;
		case 'h':
			usage(stdout);
			ret = 0;
			goto out;
		case 'V':
			printf("kvcached %s (%csystemd %chttp %cevents)\n", KV_VERSION,
			       kv_service_built() ? '+' : '-', kv_http_built() ? '+' : '-',
			       KV_HAVE_EVENTS ? '+' : '-');
			ret = 0;
			goto out;
		case '?':
			fputs("Try 'kvcached --help'.\n", stderr);
			goto out;
		default:
			break;
		}
		if (c >= OPT_KEY)
			k = &kv_cfg_keys[c - OPT_KEY];
		for (i = 0; !k && i < kv_cfg_nkeys; i++)
			if (kv_cfg_keys[i].short_opt == c)
				k = &kv_cfg_keys[i];
		if (!k)
			goto out;
		/* Checked now, so that the message names the option; applied
		 * after the file by kv_config_build(). */
		kv_config_defaults(&cfg);
		if (kv_config_set(&cfg, k, optarg, err, sizeof(err)) < 0) {
			fprintf(stderr, "kvcached: --%s: %s\n", names[k - kv_cfg_keys], err);
			goto out;
		}
		if (kv_config_source_add(&src, k, optarg) < 0) {
			ret = bad("out of memory");
			goto out;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvcached: unexpected argument '%s'\n", argv[optind]);
		goto out;
	}
	if (kv_config_build(&cfg, &src, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvcached: %s\n", err);
		goto out;
	}
	if (getenv("KVCACHED_FAULTS") &&
	    kv_fault_parse(getenv("KVCACHED_FAULTS"), err, sizeof(err)) < 0) {
		fprintf(stderr, "kvcached: bad value '%s' for KVCACHED_FAULTS: %s\n",
			getenv("KVCACHED_FAULTS"), err);
		goto out;
	}
	if (print)
		kv_config_write(&cfg, stdout);
	if (check || print) {
		if (check)
			fprintf(print ? stderr : stdout, "kvcached: configuration ok%s%s\n",
				src.path[0] ? ": " : "", src.path);
		ret = 0;
		goto out;
	}

	kv_log_level = cfg.log_level;
	kv_log_set_target(cfg.log_target);
#ifdef M_MMAP_THRESHOLD
	/* Connection buffers (a frame of up to max_frame, replies a peer has
	 * not read yet) come and go with clients: from 128 KiB up
	 * they are mmap()ed and given back to the kernel when freed. Setting
	 * the threshold stops glibc from raising it after such a free, which
	 * would move the next ones onto the heap, where freed memory stays. */
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
	{
		/* Every client connection is an fd, every segment fd passed on
		 * is a dup first, and the kernel bounds the fds in flight for
		 * the daemon's user by this limit too: take what we may. */
		struct rlimit rl;

		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
			rlim_t cur = rl.rlim_cur;

			rl.rlim_cur = rl.rlim_max;
			if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
				kv_warn("RLIMIT_NOFILE: cannot raise %llu to %llu: %s",
					(unsigned long long)cur, (unsigned long long)rl.rlim_max,
					strerror(errno));
		}
	}
	r = kv_server_init(&srv, &cfg, &src);
	if (r == 0)
		r = kv_server_run(&srv);
	kv_server_fini(&srv);
	if (r < 0) {
		kv_err("exiting: %s", strerror(-r));
		ret = 1;
	} else {
		kv_info("stopped");
		ret = 0;
	}
out:
	kv_config_source_free(&src);
	for (i = 0; names && i < kv_cfg_nkeys; i++)
		free(names[i]);
	free(names);
	free(opts);
	return ret;
}
