/* The client's map for a daemon on the cuda backend, where CUDA cannot run
 * ($KVCACHED_LIBCUDA points at the stub driver or nowhere): connecting works
 * (CUDA is not touched before the first segment), the first segment fails
 * cleanly with -ENODEV and a description, its fd is consumed, nothing reads
 * as mapped. A library built without CUDA refuses the map with -ENOTSUP. An
 * unknown backend name is a protocol error. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "kvc_internal.h"
#include "kvconfig.h"

int main(void)
{
	struct kvc_map *m = NULL;
	int fd, r;

	CHECK_EQ(kvc_map_new("tpu", 1, 4 << 20, 2 << 20, &m), -EPROTO);
	CHECK_EQ(kvc_map_new("host", 1, 4 << 20, 2 << 20, &m), 0);
	CHECK(!kvc_map_is_cuda(m));
	kvc_map_free(m);
	r = kvc_map_new("cuda", 2, 4 << 20, 2 << 20, &m);
#if !KV_HAVE_CUDA
	CHECK_EQ(r, -ENOTSUP);
	return 0;
#endif
	CHECK_EQ(r, 0);
	CHECK(kvc_map_is_cuda(m));
	CHECK(kvc_map_base(m, 0) == NULL);
	CHECK_EQ(kvc_map_reserve(m, 0), 0);
	CHECK_EQ(kvc_map_reserve(m, 2), -EINVAL);

	/* A segment that does not fit: -EPROTO, fd consumed, CUDA untouched. */
	fd = memfd_create("x", MFD_CLOEXEC);
	CHECK(fd >= 0);
	CHECK_EQ(kvc_map_segment(m, 0, 1, 0, 2 << 20, fd), -EPROTO);
	CHECK(fcntl(fd, F_GETFD) < 0 && errno == EBADF);

	/* No usable driver here. */
	fd = memfd_create("x", MFD_CLOEXEC);
	CHECK(fd >= 0);
	r = kvc_map_segment(m, 0, 1, 2 << 20, 2 << 20, fd);
	fprintf(stderr, "kvc_map_segment: %d: %s\n", r, kvc_map_error(m));
	if (r == 0)
		SKIP("a usable CUDA driver and device are present");
	CHECK_EQ(r, -ENODEV);
	CHECK(strstr(kvc_map_error(m), "CUDA is unusable") != NULL);
	CHECK(fcntl(fd, F_GETFD) < 0 && errno == EBADF);
	CHECK(!kvc_map_is_mapped(m, 0, 1));
	CHECK(kvc_map_base(m, 0) == NULL);
	kvc_map_free(m);
	return 0;
}
