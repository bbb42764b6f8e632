/* Prints the layout of the public structs the Python binding mirrors with
 * ctypes (python/kvcache/_native.py), for test_py_structs.py: one line per
 * struct, "NAME size SIZE", then one per field, "NAME FIELD OFFSET SIZE".
 * The fields are listed here by hand, but the compiler checks each exists,
 * and the test compares the sizes, so that a field added to a struct and not
 * to this list, or to the mirror, fails the test too. */
#include <stddef.h>
#include <stdio.h>

#include "kvcache.h"

#define S(py, t) printf("%s size %zu\n", py, sizeof(t))
#define F(py, t, f) printf("%s %s %zu %zu\n", py, #f, offsetof(t, f), sizeof(((t *)0)->f))

int main(void)
{
	S("Hash", kvc_hash);
	F("Hash", kvc_hash, b);

	S("Options", struct kvc_options);
	F("Options", struct kvc_options, ns);
	F("Options", struct kvc_options, client_name);
	F("Options", struct kvc_options, cuda_device);
	F("Options", struct kvc_options, timeout_ms);

	S("PoolDesc", struct kvc_pool_desc);
	F("PoolDesc", struct kvc_pool_desc, name);
	F("PoolDesc", struct kvc_pool_desc, device);
	F("PoolDesc", struct kvc_pool_desc, block_bytes);
	F("PoolDesc", struct kvc_pool_desc, block_tokens);
	F("PoolDesc", struct kvc_pool_desc, dtype);
	F("PoolDesc", struct kvc_pool_desc, layout);
	F("PoolDesc", struct kvc_pool_desc, layout_len);

	S("HashExtra", struct kvc_hash_extra);
	F("HashExtra", struct kvc_hash_extra, lora_id);
	F("HashExtra", struct kvc_hash_extra, salt);
	F("HashExtra", struct kvc_hash_extra, salt_len);
	F("HashExtra", struct kvc_hash_extra, mm);
	F("HashExtra", struct kvc_hash_extra, mm_len);

	S("VllmKeys", struct kvc_vllm_keys);
	F("VllmKeys", struct kvc_vllm_keys, lora_name);
	F("VllmKeys", struct kvc_vllm_keys, cache_salt);

	S("VllmMm", struct kvc_vllm_mm);
	F("VllmMm", struct kvc_vllm_mm, identifier);
	F("VllmMm", struct kvc_vllm_mm, offset);
	F("VllmMm", struct kvc_vllm_mm, length);

	S("VllmExtra", struct kvc_vllm_extra);
	F("VllmExtra", struct kvc_vllm_extra, lora_name);
	F("VllmExtra", struct kvc_vllm_extra, lora_path);
	F("VllmExtra", struct kvc_vllm_extra, cache_salt);
	F("VllmExtra", struct kvc_vllm_extra, mm);
	F("VllmExtra", struct kvc_vllm_extra, nmm);
	F("VllmExtra", struct kvc_vllm_extra, prompt_embeds);
	F("VllmExtra", struct kvc_vllm_extra, nprompt_embeds);

	S("EventKey", struct kvc_event_key);
	F("EventKey", struct kvc_event_key, kind);
	F("EventKey", struct kvc_event_key, data);
	F("EventKey", struct kvc_event_key, len);
	F("EventKey", struct kvc_event_key, offset);

	S("SealInfo", struct kvc_seal_info);
	F("SealInfo", struct kvc_seal_info, parent);
	F("SealInfo", struct kvc_seal_info, token_ids);
	F("SealInfo", struct kvc_seal_info, ntokens);
	F("SealInfo", struct kvc_seal_info, lora_name);
	F("SealInfo", struct kvc_seal_info, lora_id);
	F("SealInfo", struct kvc_seal_info, nkeys);
	F("SealInfo", struct kvc_seal_info, keys);
	return 0;
}
