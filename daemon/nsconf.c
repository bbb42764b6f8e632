/* The [namespace NAME] sections of the configuration file:
 *
 *   [namespace tenant-a]
 *   users = alice, 1001        # who may open it: user names or uids, or *
 *   groups = kvusers           # group names or gids (primary or supplementary)
 *   quota_g1 = 40%             # what it may hold per tier: a size or a % of the tier
 *   quota_g2 = 16GiB
 *   quota_g3 = 100GiB
 *   reserve_g1 = 10%           # G1 that other namespaces cannot take from it
 *   priority = 10              # eviction across namespaces: lower goes first
 *   ttl = 1h                   # a cached prefix older than this is not served
 *   events = hashes            # KV events of its pools: off, hashes, tokens
 *                              # (default: events_token_ids decides)
 *   remote = yes               # the G4 tier on Redis Cluster (docs/g4.md)
 *   quota_g4 = 10GiB           # what it may write there per remote_ttl
 *   remote_user = tenant-a     # its own ACL user there (start only)
 *   remote_password_file = /etc/kvcached/tenant-a.redis
 *   remote_key_file = /etc/kvcached/tenant-a.g4key  # HMAC key of its G4 values
 *   remote_write = demote      # when its blocks go to G4 (default: the daemon's)
 *   remote_auth = off          # read its G4 values unauthenticated (default: the
 *                              # daemon's remote_auth, required: remote_key_file)
 *   compress = fp8_e4m3        # tier copies of its FP16/BF16 pools in FP8: fp8_e4m3,
 *                              # fp8_e5m2 or off (default; fixed when a pool is
 *                              # created; docs/tiers.md)
 *
 * Every section is reloadable. Names of users and groups are looked up when
 * the file is read (start, reload), never while serving. tenant.c applies the
 * sections; docs/security.md says what they mean. */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kverr.h"
#include "ns.h"
#include "quant.h"
#include "units.h"

const struct kv_ns_conf *kv_nsconf_find(const struct kv_config *c, const char *name)
{
	for (uint32_t i = 0; i < c->nns; i++)
		if (!strcmp(c->ns[i].name, name))
			return &c->ns[i];
	return NULL;
}

/* A uid or gid: a number, or a name looked up in the passwd / group database. */
static int parse_id(const char *s, int group, uint32_t *out)
{
	char *end, buf[4096];
	unsigned long v;

	if (s[0] >= '0' && s[0] <= '9') {
		errno = 0;
		v = strtoul(s, &end, 10);
		if (errno || *end || v >= UINT32_MAX)
			return -EINVAL;
		*out = (uint32_t)v;
		return 0;
	}
	if (group) {
		struct group g, *gp = NULL;

		if (getgrnam_r(s, &g, buf, sizeof(buf), &gp) || !gp)
			return -ENOENT;
		*out = gp->gr_gid;
	} else {
		struct passwd pw, *pp = NULL;

		if (getpwnam_r(s, &pw, buf, sizeof(buf), &pp) || !pp)
			return -ENOENT;
		*out = pp->pw_uid;
	}
	return 0;
}

/* "alice, 1001 bob": a list separated by commas or spaces. */
static int parse_ids(const char *value, int group, struct kv_ns_conf *n, char *err, size_t errlen)
{
	uint32_t *ids = group ? n->gids : n->uids, *count = group ? &n->ngids : &n->nuids;
	char list[512], *tok, *save = NULL;

	if (strlen(value) >= sizeof(list))
		return kv_einval(err, errlen, "%s: the list is longer than %zu bytes",
			    group ? "groups" : "users", sizeof(list) - 1);
	strcpy(list, value);
	*count = 0;
	if (!group)
		n->anyone = 0;
	for (tok = strtok_r(list, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
		uint32_t id;
		int r;

		if (!group && !strcmp(tok, "*")) {
			n->anyone = 1;
			continue;
		}
		r = parse_id(tok, group, &id);
		if (r < 0)
			return kv_einval(err, errlen, "%s: %s '%s'", group ? "groups" : "users",
				    r == -ENOENT ? group ? "no such group" : "no such user"
						 : "not a name or number", tok);
		if (*count == KV_CFG_NS_IDS)
			return kv_einval(err, errlen, "%s: more than %d entries (use a group)",
				    group ? "groups" : "users", KV_CFG_NS_IDS);
		ids[(*count)++] = id;
	}
	return 0;
}

/* A size, or a percentage of the tier ("25%"), or 0 / "" for none. */
static int parse_size_pct(const char *key, const char *value, uint64_t *out, char *err,
			  size_t errlen)
{
	uint64_t v;

	if (!value[0] || !strcmp(value, "0") || !strcmp(value, "none")) {
		*out = 0;
		return 0;
	}
	if (strchr(value, '%') ? kv_parse_pct(value, &v) == 0 && (v |= KV_CFG_PCT_BIT)
			       : kv_parse_size(value, &v) == 0) {
		*out = v;
		return 0;
	}
	return kv_einval(err, errlen, "%s: '%s' is not a size (64GiB) or a percentage (25%%)", key,
		    value);
}

int kv_nsconf_set(struct kv_config *c, const char *name, const char *key, const char *value,
		  char *err, size_t errlen)
{
	struct kv_ns_conf *n = (struct kv_ns_conf *)kv_nsconf_find(c, name);
	char *end;

	if (!kv_ns_name_ok(name))
		return kv_einval(err, errlen, "[namespace %s]: a name is 1..%d of A-Z a-z 0-9 . _ : -",
			    name, KV_NAME_MAX - 1);
	if (!n) {
		if (c->nns == KV_CFG_MAX_NS)
			return kv_einval(err, errlen, "[namespace %s]: more than %d namespace sections",
				    name, KV_CFG_MAX_NS);
		n = &c->ns[c->nns++];
		memset(n, 0, sizeof(*n));
		strcpy(n->name, name);
	}
	if (!strcmp(key, "users"))
		return parse_ids(value, 0, n, err, errlen);
	if (!strcmp(key, "groups"))
		return parse_ids(value, 1, n, err, errlen);
	if (!strncmp(key, "quota_g", 7) && key[7] >= '1' && key[7] <= '3' && !key[8])
		return parse_size_pct(key, value, &n->quota[key[7] - '1'], err, errlen);
	if (!strcmp(key, "reserve_g1"))
		return parse_size_pct(key, value, &n->reserve, err, errlen);
	if (!strcmp(key, "priority")) {
		unsigned long v;

		errno = 0;
		v = strtoul(value, &end, 10);
		if (errno || end == value || *end || value[0] == '-' || v > 1000)
			return kv_einval(err, errlen, "priority: '%s' is not a number from 0 to 1000",
				    value);
		n->priority = (uint32_t)v;
		return 0;
	}
	if (!strcmp(key, "ttl")) {
		if (!value[0] || !strcmp(value, "0")) {
			n->ttl_ms = 0;
			return 0;
		}
		if (kv_parse_duration(value, &n->ttl_ms) < 0)
			return kv_einval(err, errlen, "ttl: '%s' is not a duration (30s, 10m, 1h)", value);
		return 0;
	}
	if (!strcmp(key, "events")) {
		static const char *const v[] = { "", "off", "hashes", "tokens" };
		int i;

		for (i = 0; i < 4; i++)
			if (!strcmp(value, v[i])) {
				n->events = i;
				return 0;
			}
		return kv_einval(err, errlen, "events: '%s' is not off, hashes or tokens", value);
	}
	if (!strcmp(key, "remote_user") || !strcmp(key, "remote_password_file")) {
		char *dst = key[7] == 'u' ? n->remote_user : n->remote_password_file;
		size_t len = key[7] == 'u' ? sizeof(n->remote_user) : sizeof(n->remote_password_file);

		if (strlen(value) >= len)
			return kv_einval(err, errlen, "%s: at most %zu bytes", key, len - 1);
		memcpy(dst, value, strlen(value) + 1);
		return 0;
	}
	if (!strcmp(key, "remote_key_file")) {
		if (strlen(value) >= sizeof(n->remote_key_file))
			return kv_einval(err, errlen, "%s: at most %zu bytes", key,
					 sizeof(n->remote_key_file) - 1);
		memcpy(n->remote_key_file, value, strlen(value) + 1);
		return 0;
	}
	if (!strcmp(key, "quota_g4")) {
		if (!value[0] || !strcmp(value, "0") || !strcmp(value, "none")) {
			n->quota_g4 = 0;
			return 0;
		}
		if (kv_parse_size(value, &n->quota_g4) < 0)
			return kv_einval(err, errlen, "quota_g4: '%s' is not a size (64GiB)", value);
		return 0;
	}
	if (!strcmp(key, "remote_write")) {
		static const char *const v[] = { "", "writeback", "demote", "off" };

		for (int i = 1; i < 4; i++)
			if (!strcmp(value, v[i])) {
				n->remote_write = i;
				return 0;
			}
		return kv_einval(err, errlen, "remote_write: '%s' is not writeback, demote or off",
				 value);
	}
	if (!strcmp(key, "remote_auth")) {
		if (!strcmp(value, "required"))
			n->remote_auth = KV_NS_AUTH_REQUIRED;
		else if (!strcmp(value, "off"))
			n->remote_auth = KV_NS_AUTH_OFF;
		else
			return kv_einval(err, errlen, "remote_auth: '%s' is not required or off", value);
		return 0;
	}
	if (!strcmp(key, "compress")) {
		if (!strcmp(value, "off")) {
			n->compress = KV_QFMT_RAW;
			return 0;
		}
		if (!strcmp(value, "fp8_e4m3")) {
			n->compress = KV_QFMT_E4M3;
			return 0;
		}
		if (!strcmp(value, "fp8_e5m2")) {
			n->compress = KV_QFMT_E5M2;
			return 0;
		}
		return kv_einval(err, errlen, "compress: '%s' is not fp8_e4m3, fp8_e5m2 or off",
				 value);
	}
	if (!strcmp(key, "remote")) {
		if (!strcmp(value, "yes") || !strcmp(value, "true") || !strcmp(value, "1"))
			n->remote = 1;
		else if (!strcmp(value, "no") || !strcmp(value, "false") || !strcmp(value, "0"))
			n->remote = 0;
		else
			return kv_einval(err, errlen, "remote: '%s' is not yes or no", value);
		return 0;
	}
	return kv_einval(err, errlen, "[namespace %s]: unknown key '%s' (users, groups, quota_g1, "
		    "quota_g2, quota_g3, reserve_g1, priority, ttl, events, remote, quota_g4, remote_user, "
		    "remote_password_file, remote_key_file, remote_write, remote_auth, compress)", name,
		    key);
}

_Static_assert(sizeof(((struct kv_tiers_config *)0)->remote_users) /
		       sizeof(struct kv_remote_user) >= KV_CFG_MAX_NS,
	       "a G4 user for every namespace section");
_Static_assert(sizeof(((struct kv_tiers_config *)0)->remote_keys) /
		       sizeof(struct kv_remote_key) >= KV_CFG_MAX_NS,
	       "a G4 key for every namespace section");

int kv_nsconf_finish(struct kv_config *c, char *err, size_t errlen)
{
	c->tiers.nremote_users = 0;
	c->tiers.nremote_keys = 0;
	c->tiers.remote_unauth[0] = 0;
	for (uint32_t i = 0; i < c->nns; i++) {
		const struct kv_ns_conf *n = &c->ns[i];
		uint64_t q = n->quota[0], r = n->reserve;

		if (n->remote_user[0] || n->remote_password_file[0]) {
			struct kv_remote_user *u = &c->tiers.remote_users[c->tiers.nremote_users++];

			snprintf(u->ns, sizeof(u->ns), "%s", n->name);
			snprintf(u->user, sizeof(u->user), "%s", n->remote_user);
			snprintf(u->password_file, sizeof(u->password_file), "%s",
				 n->remote_password_file);
		}
		if (n->remote_key_file[0]) {
			struct kv_remote_key *k = &c->tiers.remote_keys[c->tiers.nremote_keys++];

			snprintf(k->ns, sizeof(k->ns), "%s", n->name);
			snprintf(k->key_file, sizeof(k->key_file), "%s", n->remote_key_file);
		}

		/* G4 values are authenticated unless the operator opted out
		 * (issue 36): a namespace that reads the shared cluster needs its
		 * key, or remote_auth = off. */
		if (c->tiers.remote_seeds[0] && n->remote && !n->remote_key_file[0] &&
		    (n->remote_auth ? n->remote_auth
		     : strcmp(c->tiers.remote_auth, "off") ? KV_NS_AUTH_REQUIRED : KV_NS_AUTH_OFF) !=
			    KV_NS_AUTH_OFF)
			return kv_einval(err, errlen, "[namespace %s]: remote = yes, but its G4 values "
				    "cannot be authenticated: give it a remote_key_file (openssl rand "
				    "-hex 32 > FILE; chmod 600 FILE), or set remote_auth = off to "
				    "read what anyone who can write its keys in the cluster puts "
				    "there", n->name);

		if (n->remote && !n->remote_key_file[0]) {
			size_t l = strlen(c->tiers.remote_unauth);

			snprintf(c->tiers.remote_unauth + l, sizeof(c->tiers.remote_unauth) - l, "%s%s",
				 l ? ", " : "", n->name);
		}

		/* Both sizes, or both percentages of G1: comparable here. */
		if (q && r && !((q ^ r) & KV_CFG_PCT_BIT) && r > q)
			return kv_einval(err, errlen, "[namespace %s]: reserve_g1 is larger than quota_g1",
				    n->name);
	}
	return 0;
}

void kv_nsconf_format_size(uint64_t v, char *buf, size_t len)
{
	static const char *const units[] = { "", "KiB", "MiB", "GiB", "TiB" };
	int u = 0;

	if (!v) {
		snprintf(buf, len, "%s", "");
		return;
	}
	if (v & KV_CFG_PCT_BIT) {
		v &= ~KV_CFG_PCT_BIT;
		if (v % 100)
			snprintf(buf, len, "%llu.%02llu%%", (unsigned long long)(v / 100),
				 (unsigned long long)(v % 100));
		else
			snprintf(buf, len, "%llu%%", (unsigned long long)(v / 100));
		return;
	}
	while (u < 4 && v % 1024 == 0) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, "%llu%s", (unsigned long long)v, units[u]);
}

void kv_nsconf_write(const struct kv_config *c, FILE *f)
{
	for (uint32_t i = 0; i < c->nns; i++) {
		const struct kv_ns_conf *n = &c->ns[i];
		char v[32];
		uint32_t j;

		fprintf(f, "\n[namespace %s]\nusers =%s", n->name, n->anyone ? " *" : "");
		for (j = 0; j < n->nuids; j++)
			fprintf(f, "%s%u", j || n->anyone ? ", " : " ", n->uids[j]);
		fprintf(f, "\ngroups =");
		for (j = 0; j < n->ngids; j++)
			fprintf(f, "%s%u", j ? ", " : " ", n->gids[j]);
		fputc('\n', f);
		for (j = 0; j < 3; j++) {
			kv_nsconf_format_size(n->quota[j], v, sizeof(v));
			fprintf(f, "quota_g%u =%s%s\n", j + 1, v[0] ? " " : "", v);
		}
		kv_nsconf_format_size(n->reserve, v, sizeof(v));
		fprintf(f, "reserve_g1 =%s%s\npriority = %u\nttl = %llums\n", v[0] ? " " : "", v,
			n->priority, (unsigned long long)n->ttl_ms);
		if (n->events)
			fprintf(f, "events = %s\n", n->events == KV_NS_EVENTS_OFF ? "off"
				: n->events == KV_NS_EVENTS_HASHES ? "hashes" : "tokens");
		if (n->remote)
			fprintf(f, "remote = yes\n");
		if (n->quota_g4)
			fprintf(f, "quota_g4 = %llu\n", (unsigned long long)n->quota_g4);
		if (n->remote_user[0])
			fprintf(f, "remote_user = %s\n", n->remote_user);
		if (n->remote_password_file[0])
			fprintf(f, "remote_password_file = %s\n", n->remote_password_file);
		if (n->remote_key_file[0])
			fprintf(f, "remote_key_file = %s\n", n->remote_key_file);
		if (n->remote_auth)
			fprintf(f, "remote_auth = %s\n",
				n->remote_auth == KV_NS_AUTH_OFF ? "off" : "required");
	}
}
