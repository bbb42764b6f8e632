#!/usr/bin/env python3
"""KvcachedConnector's pool identity (docs/vllm.md, "Which engines share"):
two vLLM 0.33 configurations that differ in one thing that changes the K/V
bytes - the weights' revision, the weights' files, rope_theta, rope
scaling, sliding window, KV cache dtype, quantization, block size, head
geometry with the same bytes a block, TP size - never get the same pool;
the same weights from two paths get the same pool through the ``model``
extra config, and not without it. Then through a real daemon: an engine
with another rope_theta finds nothing of what the first saved, one with
the same finds it. Sleep mode is refused by vLLM's own config check.

Runs under the vLLM virtual environment (scripts/vllm-env); exits 77
without it. Exit 0 pass, 1 fail, 77 skip."""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_connector_common as vc  # noqa: E402


def model_copy(root, name, **cfg_changes):
    """A model folder: the tests' tiny config (with changes) and a weights
    file."""
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(vc.model_dir(), "config.json")) as f:
        cfg = json.load(f)
    cfg.update(cfg_changes)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(b"weights-v1")
    return d


def pool_name(model, extra=None, block_size=vc.BS, heads=vc.HEADS, head=vc.HEAD,
              cache_dtype="auto", tp=1, **model_kw):
    import torch
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                             ParallelConfig, SchedulerConfig, VllmConfig)
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    from kvcache.vllm.identity import PoolSpec

    mc = ModelConfig(model=model, skip_tokenizer_init=True, dtype="float16", seed=0,
                     max_model_len=4096, **model_kw)
    cc = CacheConfig(block_size=block_size, cache_dtype=cache_dtype, enable_prefix_caching=True)
    cc.kv_cache_layout = "LBNHC"
    cfg = VllmConfig(model_config=mc, cache_config=cc,
                     scheduler_config=SchedulerConfig(max_model_len=4096,
                                                      is_encoder_decoder=False),
                     parallel_config=ParallelConfig(tensor_parallel_size=tp),
                     kv_transfer_config=KVTransferConfig(
                         kv_connector="KvcachedConnector", kv_role="kv_both",
                         kv_connector_module_path="kvcache.vllm",
                         kv_connector_extra_config=extra or {}),
                     device_config=DeviceConfig("cpu"))
    kv_dtype = torch.float16 if cache_dtype == "auto" else torch.uint8
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=head,
                             dtype=kv_dtype)
    kvc = KVCacheConfig(num_blocks=8, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(list(vc.LAYERS), spec)])
    return PoolSpec(cfg, kvc, extra or {}, 0).desc("NHC")[0]


def check_names():
    root = tempfile.mkdtemp(prefix="kvt-ident-")
    try:
        base = model_copy(root, "base")
        same = pool_name(base)
        assert pool_name(base) == same, "one configuration, two pool names"
        differ = {
            "revision": lambda: pool_name(base, revision="other-revision"),
            "rope_theta": lambda: pool_name(model_copy(root, "base", rope_theta=20000.0)),
            "rope_theta override": lambda: pool_name(base, hf_overrides={"rope_theta": 5e5}),
            "rope scaling": lambda: pool_name(base, hf_overrides={"rope_scaling": {
                "rope_type": "linear", "factor": 2.0}}),
            "sliding window": lambda: pool_name(base, hf_overrides={"sliding_window": 64}),
            "block size": lambda: pool_name(base, block_size=2 * vc.BS),
            "head geometry, same bytes": lambda: pool_name(base, heads=2 * vc.HEADS,
                                                           head=vc.HEAD // 2),
            "KV dtype fp8_e4m3": lambda: pool_name(base, cache_dtype="fp8_e4m3"),
            "quantization config": lambda: pool_name(base, hf_overrides={
                "quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}}),
            "TP size": lambda: pool_name(base, tp=2),
        }
        for what, make in differ.items():
            # Each case rewrites nothing shared: restore the base folder first.
            model_copy(root, "base")
            os.utime(os.path.join(base, "model.safetensors"), ns=(10**18, 10**18))
            same = pool_name(base)
            try:
                other = make()
            except Exception as e:           # vLLM refused the configuration itself
                print(f"  {what}: vLLM refuses it here ({type(e).__name__}: {e})")
                continue
            model_copy(root, "base")
            assert other != same, f"{what}: the same pool ({same}) for different K/V bytes"
            print(f"  {what}: another pool")
        # The weights rewritten in place (same path, same config).
        model_copy(root, "base")
        w = os.path.join(base, "model.safetensors")
        os.utime(w, ns=(10**18, 10**18))
        before = pool_name(base)
        with open(w, "wb") as f:
            f.write(b"weights-v2")
        os.utime(w, ns=(10**18 + 10**9, 10**18 + 10**9))
        assert pool_name(base) != before, "weights rewritten in place: the same pool"
        print("  weights rewritten in place: another pool")
        # The same weights from two paths: one pool through `model`.
        other = model_copy(root, "elsewhere")
        assert pool_name(base) != pool_name(other), "two folders without `model`: one pool"
        assert (pool_name(base, extra={"model": "tiny@v1"}) ==
                pool_name(other, extra={"model": "tiny@v1"})), \
            "the same weights from two paths with one `model` name: two pools"
        print("  same weights, two paths: one pool through `model`, two without")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def check_sleep_refused():
    """Sleep mode is refused (supports_sleep_mode False): vLLM's own config
    check stops an engine that asks for both at start."""
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                             SchedulerConfig, VllmConfig)
    kt = dict(kv_connector="KvcachedConnector", kv_role="kv_both",
              kv_connector_module_path="kvcache.vllm", kv_load_failure_policy="recompute")
    for sleep in (False, True):
        mc = ModelConfig(model=vc.model_dir(), skip_tokenizer_init=True, dtype="float16",
                         seed=0, max_model_len=4096)
        # vLLM's CPU platform has no sleep mode (ModelConfig refuses it): the
        # flag as a GPU platform lets it through, for VllmConfig's check.
        mc.enable_sleep_mode = sleep
        try:
            VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=vc.BS),
                       scheduler_config=SchedulerConfig(max_model_len=4096,
                                                        is_encoder_decoder=False),
                       kv_transfer_config=KVTransferConfig(**kt),
                       device_config=DeviceConfig("cpu"))
            err = None
        except ValueError as e:
            err = str(e)
        if sleep:
            assert err and "KvcachedConnector does not support sleep mode" in err, \
                f"sleep mode with the connector: {err!r}"
        else:
            assert err is None, err
    print("  sleep mode: refused by vLLM's config check")


def role(sock, admin, theta, expect_hit):
    over = {"rope_theta": float(theta)} if theta != "-" else None
    x = vc.Instance(sock, layout="LBNHC", hf_overrides=over)
    full = vc.SYSTEM + vc.user(70)
    x.add("r", full)
    x.run()
    hit = (len(full) - 1) // vc.BS * vc.BS
    want = len(full) - hit if expect_hit == "1" else len(full)
    got = x.first_sched["r"]
    assert got == want, f"rope_theta {theta}: scheduled {got} tokens first, want {want}"
    vc.out(first=got, stats=x.stats)
    x.close()


def main():
    import kvt
    kvt.need_bins()
    check_names()
    check_sleep_refused()
    d = kvt.tmpdir()
    daemon = kvt.Daemon(d, "--pool-size", "8MiB", "--segment-size", "4MiB", "--page-size",
                        "64KiB")

    def run(*args):
        vc.run_child(__file__, [daemon.sock, daemon.admin, *args], daemon.log, what=str(args))

    run("-", "0")                 # saves, with the model's own rope_theta
    run("20000", "0")             # another rope_theta: nothing to load
    run("20000", "1")             # the same one again: loads what the second saved
    run("-", "1")
    kvt.cleanup()
    print("PASS")


if __name__ == "__main__":
    vc.main_or_child(main, role)
