/* HMAC-SHA-256 tags of G4 values; see g4mac.h. */
#include "g4mac.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int kv_g4mac_load(const char *path, uint8_t key[KV_G4MAC_KEY_BYTES], char *err, size_t errlen)
{
	char buf[2 * KV_G4MAC_KEY_BYTES + 4];
	struct stat st;
	ssize_t n;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		r = -errno;
		snprintf(err, errlen, "remote_key_file %s: %s", path, strerror(errno));
		return r;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077)) {
		close(fd);
		snprintf(err, errlen, "remote_key_file %s: must be a regular file readable by its "
			 "owner only (chmod 600)", path);
		return -EPERM;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		n = 0;
	buf[n] = '\0';
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		buf[--n] = '\0';
	if (n != 2 * KV_G4MAC_KEY_BYTES)
		goto bad;
	for (int i = 0; i < KV_G4MAC_KEY_BYTES; i++) {
		int hi = hexval(buf[2 * i]), lo = hexval(buf[2 * i + 1]);

		if (hi < 0 || lo < 0)
			goto bad;
		key[i] = (uint8_t)(hi << 4 | lo);
	}
	OPENSSL_cleanse(buf, sizeof(buf));
	return 0;
bad:
	OPENSSL_cleanse(buf, sizeof(buf));
	snprintf(err, errlen, "remote_key_file %s: not a key (64 hexadecimal digits; make one "
		 "with: openssl rand -hex 32 > FILE)", path);
	return -EINVAL;
}

int kv_g4mac_tag(const uint8_t key[KV_G4MAC_KEY_BYTES], const void *data, size_t len,
		 uint8_t tag[KV_G4MAC_TAG_BYTES])
{
	unsigned out = 0;

	if (!HMAC(EVP_sha256(), key, KV_G4MAC_KEY_BYTES, data, len, tag, &out) ||
	    out != KV_G4MAC_TAG_BYTES)
		return -EIO;
	return 0;
}

static EVP_MAC *hmac;
static pthread_once_t hmac_once = PTHREAD_ONCE_INIT;

static void hmac_fetch(void)
{
	hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
}

int kv_g4mac_check2(const uint8_t key[KV_G4MAC_KEY_BYTES], const void *a, size_t alen,
		    const void *b, size_t blen, const uint8_t tag[KV_G4MAC_TAG_BYTES])
{
	char digest[] = "SHA256";
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
		OSSL_PARAM_construct_end(),
	};
	uint8_t want[KV_G4MAC_TAG_BYTES];
	size_t out = 0;
	EVP_MAC_CTX *ctx;
	int ok;

	pthread_once(&hmac_once, hmac_fetch);
	if (!hmac || !(ctx = EVP_MAC_CTX_new(hmac)))
		return 0;
	ok = EVP_MAC_init(ctx, key, KV_G4MAC_KEY_BYTES, params) && EVP_MAC_update(ctx, a, alen) &&
	     EVP_MAC_update(ctx, b, blen) && EVP_MAC_final(ctx, want, &out, sizeof(want)) &&
	     out == KV_G4MAC_TAG_BYTES && CRYPTO_memcmp(want, tag, KV_G4MAC_TAG_BYTES) == 0;
	EVP_MAC_CTX_free(ctx);
	return ok;
}

int kv_g4mac_tag2(const uint8_t key[KV_G4MAC_KEY_BYTES], const void *a, size_t alen,
		  const void *b, size_t blen, uint8_t tag[KV_G4MAC_TAG_BYTES])
{
	char digest[] = "SHA256";
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
		OSSL_PARAM_construct_end(),
	};
	size_t out = 0;
	EVP_MAC_CTX *ctx;
	int ok;

	pthread_once(&hmac_once, hmac_fetch);
	if (!hmac || !(ctx = EVP_MAC_CTX_new(hmac)))
		return -EIO;
	ok = EVP_MAC_init(ctx, key, KV_G4MAC_KEY_BYTES, params) && EVP_MAC_update(ctx, a, alen) &&
	     EVP_MAC_update(ctx, b, blen) && EVP_MAC_final(ctx, tag, &out, KV_G4MAC_TAG_BYTES) &&
	     out == KV_G4MAC_TAG_BYTES;
	EVP_MAC_CTX_free(ctx);
	return ok ? 0 : -EIO;
}

int kv_g4mac_check(const uint8_t key[KV_G4MAC_KEY_BYTES], const void *data, size_t len,
		   const uint8_t tag[KV_G4MAC_TAG_BYTES])
{
	uint8_t want[KV_G4MAC_TAG_BYTES];

	if (kv_g4mac_tag(key, data, len, want) < 0)
		return 0;
	return CRYPTO_memcmp(want, tag, KV_G4MAC_TAG_BYTES) == 0;
}
