#!/usr/bin/env python3
"""KV events as llm-d's KV-cache indexer reads them (issue 35). llm-d is Go
and does not run here, so this is a model of its index written from its
source, llm-d/llm-d-kv-cache at commit 7be76e119ca50c5700b3bca65a19b6a0218a9b62
(2026-06-12); each rule below names the file and lines it follows:

  common.go       pkg/kvevents/engineadapter/common.go
  vllm_adapter.go pkg/kvevents/engineadapter/vllm_adapter.go
  pool.go         pkg/kvevents/pool.go
  in_memory.go    pkg/kvcache/kvblock/in_memory.go
  token_proc.go   pkg/kvcache/kvblock/token_processor.go

(Events as tagged maps, which llm-d-kv-cache reads since its PR #661, are read
here by field name; that snapshot decodes arrays, positions 1-8 of BlockStored
in the same order, vllm_adapter.go:150-280.)

A real daemon with G1, G2 and G3 and the default configuration but
events_token_ids = yes (what llm-d needs) and events_connect = yes (llm-d's
SUB binds, the publisher connects), two models' pools from the start, a pool
without a model, and a third model's pool registered after blocks were
stored. The workload seals chains (one with a LoRA and extra keys), lets
blocks be demoted and written back, looks early chains up (promotions),
evicts G1 with `kvctl evict --tier g1 --all` (demotions and evictions), and
seals the third model's chains. At every quiet point (tiers idle, the model
caught up with the stream) the model's index, as (engine key, device tier)
per model, equals `kvctl dump` (hash's last 8 bytes, tier), for every model,
and nothing of the pool without a model was published. The stream's one
sequence increases by one across topics (the issue's report of llm-d's
per-endpoint rule: equal dropped, lower taken for a reset).

Fails on kvcached before issue 35: a demotion's remove came before its store
and the store had no token ids (the index lost every block that changed
tier), the topic of a new model began with AllBlocksCleared (llm-d clears
the whole pod: pool.go:453-473), a pool without a model published under a
made-up one. Exit 77 without python3-zmq/python3-msgpack or events."""
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvt  # noqa: E402

try:
    import msgpack
    import zmq
except ImportError as e:
    kvt.skip("python3-zmq and python3-msgpack are needed: %s" % e)

END = 2**64 - 1
TIER = {"G1": "gpu", "G2": "cpu", "G3": "storage"}
BLOCK = 16          # kvt_worker's block_tokens, llm-d's blockSizeTokens (token_proc.go:30-32)


def u64(h):
    """getHashAsUint64 (common.go:50-64): an integer as is, bytes by their
    last 8, big endian."""
    if isinstance(h, int):
        return h & (2**64 - 1)
    return int.from_bytes(h[-8:], "big")


def fnv(*parts):
    """Stands for chunkedTokenDatabase.hash (token_proc.go:136-160): a
    digest of [parent, tokens, extra]; only its inputs matter here."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


class Index:
    """InMemoryIndex (in_memory.go:79-89): request key -> pod entries, and
    engine key -> request keys, shared by every pod and model."""

    def __init__(self):
        self.data = {}      # rk -> set of (pod, tier, group)
        self.e2r = {}       # ek -> [rk]

    def add(self, eks, rks, entries):
        # in_memory.go:157-232: with engine keys, the mapping by the ratio of
        # the lengths (replacing each engine key's); entries added per rk.
        if eks is not None:
            n = max(len(eks), len(rks))
            new = {}
            for i in range(n):
                new.setdefault(eks[i * len(eks) // n], []).append(rks[i * len(rks) // n])
            self.e2r.update(new)
        for rk in rks:
            self.data.setdefault(rk, set()).update(entries)

    def _evict_rk(self, rk, entries):
        # in_memory.go:279-313: entries removed, the rk dropped when empty.
        pc = self.data.get(rk)
        if pc is None:
            return
        pc.difference_update(entries)
        if not pc:
            del self.data[rk]

    def evict(self, ek, entries):
        # in_memory.go:237-275: unknown engine key: nothing; the mapping
        # goes once every request key of it is empty.
        rks = self.e2r.get(ek)
        if rks is None:
            return
        for rk in rks:
            self._evict_rk(rk, entries)
        if all(not self.data.get(rk) for rk in rks):
            del self.e2r[ek]

    def clear(self, pod):
        # in_memory.go:324-350: every entry of the pod, every tier; the
        # engine-key mapping left as it is.
        for rk in list(self.data):
            self._evict_rk(rk, {e for e in self.data[rk] if e[0] == pod})

    def request_key(self, ek):
        # in_memory.go:355-361: the last request key of the engine key.
        rks = self.e2r.get(ek)
        return rks[-1] if rks else None

    def pairs(self, pod):
        """(engine key, tier) of pod's entries."""
        out = set()
        for ek, rks in self.e2r.items():
            for rk in rks:
                for (p, tier, _) in self.data.get(rk, ()):
                    if p == pod:
                        out.add((ek, tier))
        return out


class Indexer:
    """pool.go's processEventBatch over vLLM's batches (vllm_adapter.go)."""

    def __init__(self):
        self.index = Index()
        self.models = {}    # engine key -> the topic's model of its last store
        self.stores = self.dropped = self.tier_updates = 0
        self.hist = {}      # engine key -> what happened to it, for a failure's message

    def keys(self, parent_rk, tokens, model, extra):
        # TokensToKVBlockKeys (token_proc.go:197-226): from the parent's key
        # or the model's initial hash, one key per full chunk of BLOCK
        # tokens (chunkTokens, :183-195; prefixHashes, :162-175).
        prefix = parent_rk if parent_rk is not None else fnv("init", model)
        out = []
        for i in range(len(tokens) // BLOCK):
            prefix = fnv(prefix, tokens[i * BLOCK:(i + 1) * BLOCK],
                         repr(extra[i]) if extra and extra[i] is not None else None)
            out.append(prefix)
        return out

    def batch(self, topic, payload):
        # parseTopic (common.go:39-45): kv@<pod>@<model>.
        parts = topic.split("@")
        pod, model = (parts[1], parts[2]) if len(parts) == 3 else (topic, "")
        ts, events, rank = msgpack.unpackb(payload)   # vllm_adapter.go:64-96
        for ev in events:
            t = ev["type"]
            if t == "BlockStored":
                self.stored(pod, model, ev)
            elif t == "BlockRemoved":
                # pool.go:427-451: tier lowercased, default gpu; each engine
                # key evicted for this pod entry (group included).
                tier = (ev.get("medium") or "gpu").lower()
                entry = (pod, tier, ev.get("group_idx"))
                for h in ev["block_hashes"]:
                    self.hist.setdefault(u64(h), []).append("-" + tier)
                    self.index.evict(u64(h), {entry})
            elif t == "AllBlocksCleared":
                self.index.clear(pod)                 # pool.go:453-473
            else:
                kvt.fail("unknown event %r" % t)

    def stored(self, pod, model, ev):
        self.stores += 1
        tier = (ev.get("medium") or "gpu").lower()     # pool.go:314-317
        eff = ev.get("lora_name") or model            # pool.go:320-323
        entry = (pod, tier, ev.get("group_idx"))      # pool.go:326-336
        eks = [u64(h) for h in ev["block_hashes"]]    # pool.go:338-341
        for i, ek in enumerate(eks):
            self.hist.setdefault(ek, []).append("+%s%s%s" % (
                tier, "" if ev["token_ids"] else "(no tokens)",
                "" if i or ev.get("parent_block_hash") is None else
                "(parent %d)" % u64(ev["parent_block_hash"])))
        parent_rk = None
        if ev.get("parent_block_hash") is not None and u64(ev["parent_block_hash"]) != 0:
            # pool.go:343-353: a parent whose key is unknown drops the event.
            parent_rk = self.index.request_key(u64(ev["parent_block_hash"]))
            if parent_rk is None:
                self.dropped += 1
                return
        extra = ev.get("extra_keys")                  # pool.go:355-378
        if extra is not None and len(ev["token_ids"]) // BLOCK == 0:
            extra = None
        rks = self.keys(parent_rk, ev["token_ids"], eff, extra)
        if not rks:
            # pool.go:414-416, handleDeviceTierUpdate :265-299: no token ids:
            # the engine keys it knows, by their request keys.
            self.tier_updates += 1
            known = []
            for ek in eks:
                rk = self.index.request_key(ek)
                if rk is not None and rk not in known:
                    known.append(rk)
            if known:
                self.index.add(None, known, {entry})
            return
        self.index.add(eks, rks, {entry})             # pool.go:419-425
        for ek in eks:
            self.models[ek] = model

    def pairs(self, pod, model):
        return {(ek, tier) for (ek, tier) in self.index.pairs(pod)
                if self.models.get(ek) == model}


class Stream:
    """llm-d's SUB (it binds: vllm_adapter.go's subscriber, zmq_subscriber.go
    :90-100), with the replay kvcached offers to catch up from 0 first."""

    def __init__(self, ctx, ep, replay_ep):
        self.ctx = ctx
        self.replay_ep = replay_ep
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.sub.bind(ep)
        self.next = 0
        self.topics = set()
        self.idx = Indexer()

    def apply(self, topic, seq, payload):
        if seq < self.next:
            return
        kvt.check(seq == self.next, "sequence %d after %d: a gap left" % (seq, self.next - 1))
        self.topics.add(topic)
        self.idx.batch(topic, payload)
        self.next = seq + 1

    def replay(self):
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.RCVTIMEO, 20000)
        s.connect(self.replay_ep)
        s.send_multipart([b"", self.next.to_bytes(8, "big")])
        last = None
        while True:
            fr = s.recv_multipart()
            seq = int.from_bytes(fr[2], "big")
            if seq == END:
                break
            # One sequence across every topic: each replayed batch the next.
            kvt.check(last is None or seq == last + 1, "replay: seq %d after %r" % (seq, last))
            last = seq
            self.apply(fr[1].decode(), seq, fr[3])
        s.close(linger=0)

    def catch_up(self):
        while self.sub.poll(0):
            topic, seq, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq, "big")
            if seq > self.next:
                self.replay()
            self.apply(topic.decode(), seq, payload)
        self.replay()


def dump(daemon, pools):
    r = daemon.kvctl("dump")
    kvt.check(r.returncode == 0, "kvctl dump: %s" % r.stderr, daemon.log)
    out = {}
    for line in r.stdout.splitlines():
        pool, tier, h = line.split()
        out.setdefault(pools.get(pool, "?"), set()).add(
            (int.from_bytes(bytes.fromhex(h)[-8:], "big"), TIER[tier]))
    return out


def ok(w, line):
    r = w.cmd(line)
    kvt.check(r.startswith("ok"), "worker: %s -> %s" % (line, r))
    return int(r.split()[1])


def main():
    kvt.need_bins()
    d = kvt.tmpdir()
    ep = "ipc://" + os.path.join(d, "llmd.sock")
    rep = "ipc://" + os.path.join(d, "rp.sock")
    ctx = zmq.Context()
    st = Stream(ctx, ep, rep)
    daemon = kvt.events_daemon(d, "--pool-size", "2MiB", "--page-size", "128KiB",
                               "--host-tier-size", "2MiB", "--disk-path", os.path.join(d, "disk"),
                               "--disk-size", "8MiB", "--writeback-low", "25",
                               "--events-endpoint", ep, "--events-connect", "yes",
                               "--events-replay-endpoint", rep, "--events-buffer", "100000",
                               "--events-token-ids", "yes", "--node-name", "pod-1")
    pools = {}
    wa, wb, wn = (kvt.Worker(daemon.sock) for _ in range(3))
    for w in (wa, wb, wn):
        kvt.check(w.ok(), "worker: %s" % w.hello, daemon.log)
    pools[str(ok(wa, "mpool pa 16384 model-a"))] = "model-a"
    pools[str(ok(wb, "mpool pb 16384 model-b"))] = "model-b"
    pools[str(ok(wn, "pool pn 16384"))] = None       # no model: nothing published
    checks = [0]

    def quiet(what):
        """The tiers idle with the model caught up: its index is the dump."""
        daemon.wait_tiers_idle()
        got = [None]

        def same():
            st.catch_up()
            want = dump(daemon, pools)
            got[0] = want
            return all(st.idx.pairs("pod-1", m) == want.get(m, set())
                       for m in ("model-a", "model-b", "model-c"))
        if not kvt.wait_for(same, timeout=30, step=0.1):
            want = got[0]
            for m in ("model-a", "model-b", "model-c"):
                mine, theirs = st.idx.pairs("pod-1", m), want.get(m, set())
                if mine != theirs:
                    kvt.fail("%s: llm-d's index holds %d (key, tier) of %s, kvctl dump %d: "
                             "%d only in the index %s, %d only in the dump %s (stores %d, "
                             "dropped %d, tier updates %d)" %
                             (what, len(mine), m, len(theirs), len(mine - theirs),
                              sorted(mine - theirs)[:3], len(theirs - mine),
                              sorted(theirs - mine)[:3], st.idx.stores, st.idx.dropped,
                              st.idx.tier_updates) + "".join(
                                  "\n  %d: %s" % (k, " ".join(st.idx.hist.get(k, [])))
                                  for (k, _) in sorted(mine ^ theirs)[:4]), daemon.log)
        checks[0] += 1
        tiers = {t for s in got[0].values() for (_, t) in s}
        print("%s: the index equals kvctl dump (%s; tiers %s)" %
              (what, ", ".join("%s %d" % (m, len(s)) for m, s in sorted(got[0].items(),
                                                                       key=str)),
               sorted(tiers)))
        return got[0]

    # Stores in two models and in the pool without one; demotion and
    # write-back as G1 and G2 fill (16 KiB blocks: G1 128, G2 128, G3 512).
    ok(wa, "lchain 7777 6")
    seed = 1
    for _ in range(30):
        ok(wa, "chain %d 8" % seed)
        ok(wb, "chain %d 8" % (100000 + seed))
        ok(wn, "chain %d 2" % (200000 + seed))
        daemon.wait_tiers_idle()
        seed += 1
    want = quiet("stores, demotions, write-backs")
    kvt.check({"cpu", "storage"} <= {t for s in want.values() for (_, t) in s},
              "the workload should leave blocks in G2 and G3: %s" %
              {t for s in want.values() for (_, t) in s})
    # Promotions: early chains looked up.
    for s in range(1, 9):
        (wa if s % 2 else wb).cmd("lookup %d 8" % (s if s % 2 else 100000 + s))
        daemon.wait_tiers_idle()
    quiet("promotions")
    # Demotions and evictions of everything idle in G1.
    r = daemon.kvctl("evict", "--tier", "g1", "--all")
    kvt.check(r.returncode == 0, "kvctl evict: %s %s" % (r.stdout, r.stderr), daemon.log)
    quiet("kvctl evict --tier g1 --all")
    for s in range(1, 12, 3):
        wa.cmd("lookup %d 8" % s)
        daemon.wait_tiers_idle()
    quiet("promotions after the eviction")
    # A third model once blocks were stored: the others stay in the index.
    wc = kvt.Worker(daemon.sock)
    pools[str(ok(wc, "mpool pc 16384 model-c"))] = "model-c"
    for s in range(6):
        ok(wc, "chain %d 8" % (300000 + s))
        ok(wa, "chain %d 4" % (400000 + s))
        daemon.wait_tiers_idle()
    quiet("a third model registered later, two models' traffic")

    kvt.check(not any(t.endswith("@None") or "/" in t.split("@")[2] for t in st.topics),
              "a topic without a model: %s" % st.topics)
    kvt.check(st.topics == {"kv@pod-1@model-a", "kv@pod-1@model-b", "kv@pod-1@model-c"},
              "topics %s" % sorted(st.topics))
    r = daemon.kvctl("-o", "json", "events")
    kvt.check(r.returncode == 0 and json.loads(r.stdout)["no_model_pools"] == 1,
              "kvctl events: %s" % r.stdout, daemon.log)
    print("llm-d's index model: %d quiet points equal to kvctl dump; %d stores (%d placed by "
          "their engine key alone, %d dropped for an unknown parent); %d batches in one "
          "sequence over %d topics" % (checks[0], st.idx.stores, st.idx.tier_updates,
                                       st.idx.dropped, st.next, len(st.topics)))
    for w in (wa, wb, wn, wc):
        w.quit()
    daemon.kill()
    kvt.cleanup()
    print("ok")


if __name__ == "__main__":
    try:
        main()
    finally:
        kvt.cleanup()
