/* The op table (daemon/ops.c) against kvcached.proto: every operation of the
 * Request's oneof has a row, under its field's name, and no two share a
 * metrics slot. Fails when an op is added to the protocol and not to the
 * table (its timings would be counted as "other"). The descriptor is
 * protoc-c's, generated from the .proto in this build. */
#include <stddef.h>
#include <string.h>

#include "check.h"
#include "daemon.h"
#include "kvcached.pb-c.h"
#include "ops.h"

int main(void)
{
	const ProtobufCMessageDescriptor *d = &kvcached__request__descriptor;
	int seen[KV_DAEMON_OPS] = { 0 }, nops = 0;

	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		unsigned k;

		/* The op oneof: the fields whose case is kept in op_case. */
		if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) ||
		    f->quantifier_offset != offsetof(Kvcached__Request, op_case))
			continue;
		nops++;
		k = kv_ops_index((int)f->id);
		if (k >= KV_DAEMON_OPS - 1) {
			fprintf(stderr, "op '%s' (field %u of Request) has no row in the op table "
				"(daemon/ops.c)\n", f->name, f->id);
			return 1;
		}
		CHECK(!strcmp(kv_ops_name(k), f->name));
		CHECK(!seen[k]++);
	}
	/* Every row is an op of the protocol, and "other" is last. */
	CHECK_EQ(nops, KV_DAEMON_OPS - 1);
	CHECK(!strcmp(kv_ops_name(KV_DAEMON_OPS - 1), "other"));
	CHECK_EQ(kv_ops_index(0), KV_DAEMON_OPS - 1);
	CHECK_EQ(kv_ops_index(30), KV_DAEMON_OPS - 1);
	fprintf(stderr, "op table: %d ops of kvcached.proto, each with its row\n", nops);
	return 0;
}
