/* What the fuzz harnesses share: a tiny daemon of the host backend driven
 * without sockets or an event loop (ops.h), its sessions, and the pumping of
 * tier completions. One daemon per process, in fz_d. */
#ifndef KV_FUZZD_H
#define KV_FUZZD_H

#include "config.h"
#include "daemon.h"
#include "ops.h"
#include "session.h"
#include "tier.h"

#define FZ_NSESS 3
#define FZ_ADMIN FZ_NSESS     /* fz_s[FZ_ADMIN] came through the admin socket */

extern struct kv_daemon fz_d;
extern struct kv_session fz_s[FZ_NSESS + 1];
/* Called when session i is opened afresh (the harness forgets its handles). */
extern void (*fz_on_open)(int i);

/* Makes a fresh directory from template (mkdtemp's "...XXXXXX", rewritten in
 * place) whose files and itself are removed when the process exits; exits
 * on failure. */
void fz_tmpdir(char *template);
/* A finding: the message, then abort() (libFuzzer keeps the input). */
void fz_finding(const char *what) __attribute__((noreturn));
/* The tiny daemon's configuration: a 64 KiB pool in 16 KiB segments of
 * 4 KiB pages, a 64 KiB host tier and, with disk, a 256 KiB disk tier at
 * dir/g3 (journal dir/g3.idx). Quiet unless $FUZZ_LOG is set. */
void fz_config(struct kv_config *c, const char *dir, int disk);
/* A daemon on fz_config(dir, disk) in fz_d (dir: a fresh temporary
 * directory from template, removed at exit); exits on failure. */
void fz_start(char *template, int disk);
/* Opens session i afresh, past its Hello in namespace ns. */
void fz_open(int i, const char *ns);
/* Runs the completions of copies and disk I/O until nothing is in flight. */
void fz_pump(void);
/* Dispatches rq for session i as the transport would (a parked request runs
 * again once woken; fds count as read at once); returns the reply, valid
 * until the arena is reset, or NULL when the session was closed (and opened
 * afresh). $FUZZ_TRACE prints each request's outcome. */
Kvcached__Response *fz_run(int i, Kvcached__Request *rq);
/* kvctl check through the admin session: 1 when clean (problems printed). */
int fz_check(void);
/* kvctl evict --tier tier --all, and the completions it starts. */
void fz_evict(Kvcached__Tier tier);
/* Blocks writable or sealed in every pool (nothing should be, once every
 * session has closed). */
uint64_t fz_held_blocks(void);

#endif
