#!/usr/bin/env python3
"""The vLLM connector's scheduler-side cost (issue 34: at most 0.05 ms a
request at 2k-token prompts): vLLM 0.33's own Scheduler schedules the same
N requests of L tokens twice in this one run - without a KV connector (the
floor) and with KvcachedConnector against a real kvcached - and prints the
time of add_request + the schedule()/update_from_output() loop for each, the
difference per request, and the ratio. Prompts are distinct (every lookup
is a miss that still goes to the daemon, every full block is a save the
scheduler side plans).

    KVCACHED_BIN=build/daemon/kvcached PYTHONPATH=build/python \\
        $(scripts/vllm-env --path) bench/vllm_sched.py [--requests 200] [--tokens 2048]

Run on a busy machine the figures move; the ratio is the one to read, and
the CPU-time line (this process's threads, the connector's ops thread
included) moves less than wall time.

A third run uses NullConnector (below: a connector that finds nothing and
plans nothing): what vLLM's scheduler itself does for any KV connector
(block ids for request_finished, the connector's output), so the line
"kvcached over a null connector" is the connector's own work. The daemon's
CPU (it answers the lookups) is not in these figures: it is another
process.

How it measures (a run's figures moved by 0.03-0.07 ms a request for the
same code when each kind was timed once a repetition and the best of each
taken): every repetition times the three kinds one after the other, in an
order that rotates from one repetition to the next; the figure is the
median, over the repetitions, of each one's difference (kvcached less the
floor of the same repetition), printed with its spread. Each timed run
starts from a collected heap (gc.collect() after the scheduler and the
requests are made, as vLLM's engine collects and freezes its heap once it
is built): a full collection of what earlier runs left behind would
otherwise land in one timed run or another (300 ms each here). The
collections the timed part itself causes - its allocations, the
connector's included - stay in the figures, and are printed (--gc). The
connector's connection to kvcached is made before the timed part, as at an
engine's start (the scheduler side connects on its thread when it is made).
"""
import argparse
import gc
import os
import random
import statistics
import sys
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "tests"))

BS = 16

_NullConnector = None


def null_connector_class():
    """A KV connector that finds nothing and plans nothing (the floor of
    any connector's scheduler side), made once vLLM is imported."""
    global _NullConnector
    if _NullConnector is None:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                      KVConnectorMetadata)

        class NullConnector(KVConnectorBase_V1):
            def get_num_new_matched_tokens(self, request, num_computed_tokens):
                return 0, False

            def update_state_after_alloc(self, request, blocks, num_external_tokens):
                pass

            def build_connector_meta(self, scheduler_output):
                return KVConnectorMetadata()

            def start_load_kv(self, forward_context, **kwargs):
                pass

            def wait_for_layer_load(self, layer_name):
                pass

            def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
                pass

            def wait_for_save(self):
                pass

        _NullConnector = NullConnector
        globals()["NullConnector"] = NullConnector    # what vLLM's factory looks up
    return _NullConnector


# kv_connector_extra_config beyond the socket (--lookup-batch).
EXTRA: dict = {}


def make_sched(sock, connector, nblocks, nreq, ntok):
    import torch
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    import vllm_connector_common as vc
    mc = ModelConfig(model=vc.model_dir(), skip_tokenizer_init=True, dtype="float16", seed=0,
                     max_model_len=ntok + 16)
    sc = SchedulerConfig(max_num_seqs=nreq, max_num_batched_tokens=nreq * (ntok + 16),
                         max_model_len=ntok + 16, enable_chunked_prefill=True,
                         is_encoder_decoder=False)
    cc = CacheConfig(block_size=BS, cache_dtype="auto", enable_prefix_caching=True)
    cc.kv_cache_layout = "LBNHC"
    kt = None
    if connector == "null":
        null_connector_class()
        kt = KVTransferConfig(kv_connector="NullConnector", kv_connector_module_path=__name__,
                              kv_role="kv_both", kv_load_failure_policy="recompute")
    elif connector:
        kt = KVTransferConfig(kv_connector="KvcachedConnector",
                              kv_connector_module_path="kvcache.vllm", kv_role="kv_both",
                              kv_connector_extra_config={"socket": sock, "model": "bench",
                                                         "lookup_timeout_ms": 10000,
                                                         **EXTRA},
                              kv_load_failure_policy="recompute")
    cfg = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc,
                     kv_transfer_config=kt, device_config=DeviceConfig("cpu"))
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=vc.HEADS, head_size=vc.HEAD,
                             dtype=torch.float16)
    kvc = KVCacheConfig(num_blocks=nblocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(list(vc.LAYERS), spec)])
    cfg.cache_config.num_gpu_blocks = nblocks
    return Scheduler(vllm_config=cfg, kv_cache_config=kvc, log_stats=True,
                     structured_output_manager=StructuredOutputManager(cfg), block_size=BS)


# --phases: the CPU time of each of the connector's scheduler-side calls
# (time.thread_time() around each, on the thread that runs it; the cost of
# the timing itself, measured on an empty method, taken off).
PHASES = ("on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc",
          "build_connector_meta", "update_connector_output", "request_finished",
          "_op_lookup_many", "_op_flush")


def _timing_cost():
    class _E:
        def f(self):
            pass
    e, n = _E(), 20000
    t = time.thread_time()
    for _ in range(n):
        t0 = time.thread_time()
        e.f()
        _ = time.thread_time() - t0
    return (time.thread_time() - t) / n


def time_phases(side, acc):
    """Wraps side's methods named in PHASES (the instance's attributes) to
    add each call's thread CPU time to acc[name] = [seconds, calls]."""
    for name in PHASES:
        f = getattr(side, name, None)
        if f is None:
            continue

        def w(*a, _f=f, _n=name, **k):
            t0 = time.thread_time()
            try:
                return _f(*a, **k)
            finally:
                x = acc.setdefault(_n, [0.0, 0])
                x[0] += time.thread_time() - t0
                x[1] += 1
        setattr(side, name, w)


# The cyclic GC's collections in the timed part: generation -> [count,
# thread CPU seconds], while _GC_ON.
_GC_ON = [False]
_GC_ACC: dict = {}
_GC_T0: dict = {}


def _gc_cb(phase, info):
    if not _GC_ON[0]:
        return
    if phase == "start":
        _GC_T0["t"] = time.thread_time()
        return
    t0 = _GC_T0.pop("t", None)
    if t0 is not None:
        x = _GC_ACC.setdefault(info["generation"], [0, 0.0])
        x[0] += 1
        x[1] += time.thread_time() - t0


def one_run(sock, connector, nreq, ntok, seed, phases=None):
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BS, sha256)
    nblocks = nreq * (ntok // BS + 2) + 16
    s = make_sched(sock, connector, nblocks, nreq, ntok)
    if phases is not None and connector is True:
        time_phases(s.connector.connector_scheduler, phases)
    rng = random.Random(seed)
    reqs = []
    for i in range(nreq):
        sp = SamplingParams(max_tokens=1, ignore_eos=True)
        sp.update_from_generation_config({}, 2)
        toks = [100 + t for t in rng.randbytes(ntok)]     # distinct blocks, made fast
        reqs.append(Request(request_id=f"r{seed}-{i}", prompt_token_ids=toks,
                            sampling_params=sp, pooling_params=None, mm_features=None,
                            block_hasher=hasher))
    if connector is True:
        # Started: the scheduler side connects to kvcached on its thread when
        # it is made (an engine's start), not in the timed part.
        s.connector.drain()
    # The same heap for every kind at the start: what earlier runs left is
    # collected here, not in the timed part (vLLM's engine collects and
    # freezes its startup heap too: utils/gc_utils.py freeze_gc_heap).
    gc.collect()
    _GC_ACC.clear()
    _GC_ON[0] = True
    c0 = time.process_time()
    t0 = time.perf_counter()
    for r in reqs:
        s.add_request(r)
    t_add = time.perf_counter() - t0
    t_sched = 0.0
    steps = 0
    while s.has_unfinished_requests():
        t1 = time.perf_counter()
        so = s.schedule()
        ids = list(so.num_scheduled_tokens)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[[5] for _ in ids], logprobs=None,
                                prompt_logprobs_dict={}, pooler_output=[])
        s.update_from_output(so, mro)
        t_sched += time.perf_counter() - t1
        steps += 1
        if steps > 10000:
            raise SystemExit("did not finish")
    cpu = time.process_time() - c0      # this process's threads: the ops thread's too
    _GC_ON[0] = False
    gcs = {g: tuple(v) for g, v in _GC_ACC.items()}
    if connector is True:
        s.connector.shutdown()
    return t_add, t_sched, steps, cpu, gcs


def _spread(xs):
    """median [min, max] of a list of ms-a-request figures."""
    return (f"{statistics.median(xs):.4f} ms a request "
            f"[{min(xs):.4f}, {max(xs):.4f}]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=9,
                    help="repetitions, each timing the three kinds in a rotating order")
    ap.add_argument("--lookup-batch", type=int, default=None,
                    help="the connector's lookup_batch (default: the connector's own)")
    ap.add_argument("--gc", action="store_true",
                    help="also the cyclic GC's collections in the timed part, per kind")
    ap.add_argument("--phases", action="store_true",
                    help="also the CPU time of each of the connector's calls, in runs of "
                    "their own (the timing costs CPU too)")
    a = ap.parse_args()
    if a.lookup_batch is not None:
        EXTRA["lookup_batch"] = a.lookup_batch
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    daemon = kvt.Daemon(d, "--pool-size", "64MiB", "--segment-size", "16MiB",
                        "--page-size", "64KiB")
    gc.callbacks.append(_gc_cb)
    kinds = (False, "null", True)
    names = {False: "no connector", "null": "null conn.", True: "kvcached"}
    res = {c: [] for c in kinds}
    one_run(daemon.sock, True, 8, a.tokens, 999)        # warm every path
    one_run(daemon.sock, "null", 8, a.tokens, 997)
    one_run(daemon.sock, False, 8, a.tokens, 998)
    for rep in range(a.reps):
        # The order rotates: no kind always runs first (or after another).
        for k in range(len(kinds)):
            conn = kinds[(rep + k) % len(kinds)]
            res[conn].append(one_run(daemon.sock, conn, a.requests, a.tokens,
                                     rep * 3 + kinds.index(conn)))
    n = a.requests
    ms = 1e3 / n        # seconds of a run -> ms a request
    print(f"{n} requests of {a.tokens} tokens, one schedule() step; {a.reps} repetitions, "
          f"each kind once a repetition in a rotating order; medians [min, max]:")
    for c in kinds:
        v = res[c]
        print(f"{names[c]:>13}: CPU {statistics.median(x[3] for x in v) * 1e3:7.2f} ms "
              f"[{min(x[3] for x in v) * 1e3:.2f}, {max(x[3] for x in v) * 1e3:.2f}], "
              f"wall (add_request + schedule + update) "
              f"{statistics.median(x[0] + x[1] for x in v) * 1e3:7.2f} ms, "
              f"{v[0][2]} step(s)")
    # Differences within one repetition (the same moment of the machine),
    # then their median: a kind that met a busier moment moves one pair.
    cpu = {c: [x[3] for x in res[c]] for c in kinds}
    wall = {c: [x[0] + x[1] for x in res[c]] for c in kinds}
    d_kv = [(k - b) * ms for k, b in zip(cpu[True], cpu[False])]
    d_null = [(k - b) * ms for k, b in zip(cpu[True], cpu["null"])]
    d_nf = [(k - b) * ms for k, b in zip(cpu["null"], cpu[False])]
    w_kv = [(k - b) * ms for k, b in zip(wall[True], wall[False])]
    ratio = statistics.median(k / b for k, b in zip(cpu[True], cpu[False]))
    print(f"connector's scheduler work (CPU over the floor, this process's threads, the "
          f"connector's lookup thread included): {_spread(d_kv)}; ratio {ratio:.2f}x")
    print(f"  kvcached over the null connector: {_spread(d_null)}")
    print(f"  null connector over the floor (vLLM's own work for any connector): "
          f"{_spread(d_nf)}")
    print(f"  wall time over the floor: {_spread(w_kv)}")
    cb, cc = min(cpu[False]), min(cpu[True])
    print(f"  best of each kind (the earlier figure): {cb * 1e3:.2f} ms without, "
          f"{cc * 1e3:.2f} ms with: {(cc - cb) * ms:.4f} ms a request")
    if a.gc:
        print("cyclic GC in the timed part (collections, thread CPU ms; median over the "
              "repetitions):")
        for c in kinds:
            parts = []
            for g in (0, 1, 2):
                cnt = statistics.median(x[4].get(g, (0, 0.0))[0] for x in res[c])
                t = statistics.median(x[4].get(g, (0, 0.0))[1] for x in res[c])
                parts.append(f"gen{g} {cnt:g} x, {t * 1e3:.2f} ms")
            print(f"  {names[c]:>13}: " + "; ".join(parts))
    if a.phases:
        cost = _timing_cost()
        best: dict = {}
        for rep in range(a.reps):
            acc: dict = {}
            one_run(daemon.sock, True, a.requests, a.tokens, 1000 + rep, phases=acc)
            for k, (sec, calls) in acc.items():
                v = max(0.0, sec - cost * calls)
                best.setdefault(k, []).append((v, calls))
        print(f"the connector's calls, thread CPU time a request (median [min] of {a.reps}; "
              f"timing's own {cost * 1e6:.2f} us a call taken off):")
        for k in PHASES:
            if k in best:
                v = [x[0] for x in best[k]]
                print(f"  {k:28s} {statistics.median(v) / n * 1e6:7.2f} us "
                      f"[{min(v) / n * 1e6:.2f}]  ({best[k][0][1]} calls)")
        tot = [sum(best[k][i][0] for k in best) for i in range(a.reps)]
        print(f"  {'sum':28s} {statistics.median(tot) / n * 1e6:7.2f} us "
              f"[{min(tot) / n * 1e6:.2f}]")
    kvt.cleanup()


if __name__ == "__main__":
    main()
