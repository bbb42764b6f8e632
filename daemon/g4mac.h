/* Authenticated G4 values (issue 29, docs/security.md "G4 values").
 *
 * A namespace with remote_key_file has a 32-byte secret; each value it
 * writes to the cluster ends with an HMAC-SHA-256 tag (libcrypto) over the
 * slot header and the payload before it, and a value it reads is served
 * only when its tag checks out under the same key. The header names the
 * namespace, the layout and the block hash, so a tag binds a value to its
 * key in the cluster: a value copied under another hash fails too. CRC32C
 * stays (it catches corruption for every namespace, keyed or not); the tag
 * is what a party without the key cannot make.
 *
 * The key file holds the key as 64 hexadecimal digits (a newline may
 * follow): `openssl rand -hex 32 > FILE` (umask 077 first). It must
 * not be readable by group or others. */
#ifndef KV_G4MAC_H
#define KV_G4MAC_H

#include <stddef.h>
#include <stdint.h>

#define KV_G4MAC_KEY_BYTES 32
#define KV_G4MAC_TAG_BYTES 32

/* Reads the key in path. Returns 0, or -errno with a message in err (a
 * missing file, a mode open to group or others, not 64 hex digits). */
int kv_g4mac_load(const char *path, uint8_t key[KV_G4MAC_KEY_BYTES], char *err, size_t errlen);

/* The tag of len bytes at data under key. Returns 0 or -EIO. Thread-safe. */
int kv_g4mac_tag(const uint8_t key[KV_G4MAC_KEY_BYTES], const void *data, size_t len,
		 uint8_t tag[KV_G4MAC_TAG_BYTES]);

/* The tag of the data in two pieces (a's alen bytes, then b's blen): a
 * value sent from a G2 slot, its header made apart. Returns 0 or -EIO.
 * Thread-safe. */
int kv_g4mac_tag2(const uint8_t key[KV_G4MAC_KEY_BYTES], const void *a, size_t alen,
		  const void *b, size_t blen, uint8_t tag[KV_G4MAC_TAG_BYTES]);

/* Whether tag is data's under key (constant time in the tag). */
int kv_g4mac_check(const uint8_t key[KV_G4MAC_KEY_BYTES], const void *data, size_t len,
		   const uint8_t tag[KV_G4MAC_TAG_BYTES]);
/* The same for the data in two pieces (a's alen bytes, then b's blen): a
 * value read into a G2 slot, header at its start and payload further on.
 * Thread-safe. */
int kv_g4mac_check2(const uint8_t key[KV_G4MAC_KEY_BYTES], const void *a, size_t alen,
		    const void *b, size_t blen, const uint8_t tag[KV_G4MAC_TAG_BYTES]);

#endif
