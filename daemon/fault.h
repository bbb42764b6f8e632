/* Fault injection for the tier I/O paths, so that tests can make a copy, a
 * disk write, a disk read or a G4 write's buffer fail on the n-th call.
 *
 * Points are armed from the environment at start:
 *
 *   KVCACHED_FAULTS="point=ERR[:skip=N][:count=M],..."
 *
 * point is one of the names below, ERR an errno name (EIO, ENOSPC, ...) or
 * "short" (a short transfer: the caller moves half of what it asked for);
 * the point passes skip calls, then fails count calls (default 1; 0 means
 * every call from then on). Unarmed points cost one load and a branch. */
#ifndef KV_FAULT_H
#define KV_FAULT_H

enum kv_fault_point {
	KV_FAULT_COPY,       /* backend copy_async (G1 <-> G2) */
	KV_FAULT_G3_WRITE,   /* a slot write to the disk tier */
	KV_FAULT_G3_READ,    /* a slot read from the disk tier */
	KV_FAULT_G3_INDEX,   /* an append to the disk tier's index journal */
	KV_FAULT_DEVICE,     /* cuda: a copy batch ends in a sticky error (the daemon exits 3) */
	KV_FAULT_G4_BUF,     /* a G4 write's value buffer (the write is dropped; ERR is ignored) */
	KV_FAULT_NPOINTS
};

/* What kv_fault() returns for "short". */
#define KV_FAULT_SHORT 1

/* Parses spec (the KVCACHED_FAULTS syntax). Returns 0, or -EINVAL with a
 * message in err. */
int kv_fault_parse(const char *spec, char *err, unsigned errlen);

extern unsigned kv_fault_armed;

int kv_fault_hit(enum kv_fault_point p);

/* 0 when the call is to go ahead, -errno to fail it, KV_FAULT_SHORT to make
 * it short. */
static inline int kv_fault(enum kv_fault_point p)
{
	return kv_fault_armed ? kv_fault_hit(p) : 0;
}

/* How often point p fired (tests read it through the log; stats show it). */
unsigned long kv_fault_fired(enum kv_fault_point p);

#endif
