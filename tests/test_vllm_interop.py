#!/usr/bin/env python3
"""KV events against vLLM 0.33.0's own code and llm-d's decoding rules (issue
25). Two real daemons with G1, G2 and G3 run the same workload of chains
sealed with token ids (demotion, write-back, eviction, promotion): A with
events_hash_format = bytes and data_parallel_rank 0, B with the default hash
form (int, vLLM's default since issue 35), events_dp_rank = 3 and
events_interval = 0 (more, smaller batches).
For every batch, live and replayed:

  - vLLM's decoder, msgspec.msgpack.Decoder(KVEventBatch), reads it, and
    vLLM's encoder (msgspec.msgpack.Encoder(), what ZmqEventPublisher uses)
    writes the decoded batch back to the same bytes;
  - a strict decoder written here after llm-d's indexer
    (llm-d-kv-cache pkg/kvevents/engineadapter/vllm_adapter.go: three
    frames, topic kv@<pod>@<model>, an array-encoded batch of exactly three
    fields, each event a tagged array or a map with its "type", hashes as
    uint64 or bytes whose last 8 bytes it keeps) accepts it;
  - the events add up to kvctl dump (hash, medium) once the daemon is idle.

Then vLLM's own ZmqEventPublisher publishes A's decoded batches, and its
replay socket and A's are asked for everything from 0: the multipart frames
(vLLM >= 0.26's [b"", topic, seq, payload] ... [b"", b"", -1, b""]) must be
identical, payloads included. The keys llm-d derives from A's bytes equal
B's integers (vLLM's maybe_convert_block_hash of the same digests).

Runs under scripts/vllm-env's python (tests/vllm_env.py); exits 77 without
it or when the daemon was built without events. No fixed sleeps."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_env  # noqa: E402

vllm_env.reexec()

import msgspec  # noqa: E402
import zmq  # noqa: E402
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved,  # noqa: E402
                                        BlockStored, KVEventBatch, ZmqEventPublisher,
                                        MEDIUM_CPU, MEDIUM_GPU, MEDIUM_STORAGE)

import kvt  # noqa: E402

MEDIUM = {"G1": MEDIUM_GPU, "G2": MEDIUM_CPU, "G3": MEDIUM_STORAGE}
END = (-1).to_bytes(8, "big", signed=True)
MODEL = "model-a"
DECODER = msgspec.msgpack.Decoder(KVEventBatch)
ENCODER = msgspec.msgpack.Encoder()


# ---- a strict msgpack reader and llm-d's rules ----

class Bad(Exception):
    pass


class Reader:
    """msgpack, strictly: every byte accounted for; maps keep their order;
    floats are returned as ("float", value) so that their type is seen."""

    def __init__(self, b):
        self.b, self.i = b, 0

    def take(self, n):
        if self.i + n > len(self.b):
            raise Bad("truncated at %d" % self.i)
        v = self.b[self.i:self.i + n]
        self.i += n
        return v

    def uint(self, n):
        return int.from_bytes(self.take(n), "big")

    def value(self):
        c = self.take(1)[0]
        if c <= 0x7f:
            return c
        if c >= 0xe0:
            return c - 0x100
        if 0x80 <= c <= 0x8f:
            return self.map(c & 0x0f)
        if 0x90 <= c <= 0x9f:
            return [self.value() for _ in range(c & 0x0f)]
        if 0xa0 <= c <= 0xbf:
            return self.take(c & 0x1f).decode("utf-8")
        simple = {0xc0: None, 0xc2: False, 0xc3: True}
        if c in simple:
            return simple[c]
        if c in (0xc4, 0xc5, 0xc6):
            return bytes(self.take(self.uint(1 << (c - 0xc4))))
        if c == 0xca:
            return ("float", struct.unpack(">f", self.take(4))[0])
        if c == 0xcb:
            return ("float", struct.unpack(">d", self.take(8))[0])
        if 0xcc <= c <= 0xcf:
            return self.uint(1 << (c - 0xcc))
        if 0xd0 <= c <= 0xd3:
            return int.from_bytes(self.take(1 << (c - 0xd0)), "big", signed=True)
        if c in (0xd9, 0xda, 0xdb):
            return self.take(self.uint(1 << (c - 0xd9))).decode("utf-8")
        if c in (0xdc, 0xdd):
            return [self.value() for _ in range(self.uint(2 << (c - 0xdc)))]
        if c in (0xde, 0xdf):
            return self.map(self.uint(2 << (c - 0xde)))
        raise Bad("msgpack type 0x%02x" % c)

    def map(self, n):
        m = {}
        for _ in range(n):
            k = self.value()
            if not isinstance(k, str) or k in m:
                raise Bad("map key %r" % (k,))
            m[k] = self.value()
        return m


STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name"]
REMOVED_FIELDS = ["block_hashes", "medium"]


def llmd_hash(v):
    """getHashAsUint64: an integer as it is, bytes by their last 8."""
    if isinstance(v, bool) or not isinstance(v, (int, bytes)):
        raise Bad("hash of type %s" % type(v).__name__)
    if isinstance(v, int):
        if not 0 <= v < 2**64:
            raise Bad("hash %d out of uint64" % v)
        return v
    if not v:
        raise Bad("empty hash")
    return int.from_bytes(v[-8:].rjust(8, b"\0"), "big")


def llmd_decode(frames):
    """What llm-d's vLLM adapter accepts; returns [(tag, [uint64], tier)]."""
    if len(frames) != 3:
        raise Bad("%d frames" % len(frames))
    topic, seq, payload = frames
    if len(seq) != 8:
        raise Bad("sequence of %d bytes" % len(seq))
    parts = topic.decode().split("@")
    if len(parts) != 3 or parts[0] != "kv" or parts[2] != MODEL:
        raise Bad("topic %r" % topic)
    r = Reader(payload)
    batch = r.value()
    if r.i != len(payload):
        raise Bad("%d bytes after the batch" % (len(payload) - r.i))
    # An array-encoded struct of three fields: any other length is refused.
    if not isinstance(batch, list) or len(batch) != 3:
        raise Bad("batch is not a 3-element array: %r" % (batch,))
    ts, events, rank = batch
    if not (isinstance(ts, tuple) and ts[0] == "float") or not isinstance(events, list):
        raise Bad("batch fields %r %r" % (ts, type(events)))
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise Bad("data_parallel_rank %r" % (rank,))
    out = []
    for ev in events:
        if isinstance(ev, dict):
            if next(iter(ev), None) != "type":
                raise Bad("map event without its tag first: %r" % ev)
            tag, f = ev["type"], ev
        elif isinstance(ev, list) and ev and isinstance(ev[0], str):
            tag = ev[0]
            names = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(tag, [])
            f = dict(zip(names, ev[1:]))
        else:
            raise Bad("event %r is neither a tagged map nor a tagged array" % (ev,))
        if tag == "AllBlocksCleared":
            out.append((tag, [], None))
            continue
        if tag not in ("BlockStored", "BlockRemoved"):
            raise Bad("unknown tag %r" % tag)
        if not isinstance(f.get("block_hashes"), list):
            raise Bad("block_hashes %r" % f.get("block_hashes"))
        hashes = [llmd_hash(h) for h in f["block_hashes"]]
        medium = f.get("medium")
        if medium is not None and not isinstance(medium, str):
            raise Bad("medium %r" % medium)
        if tag == "BlockStored":
            if f.get("parent_block_hash") is not None:
                llmd_hash(f["parent_block_hash"])
            toks = f.get("token_ids")
            if not isinstance(toks, list) or not all(
                    isinstance(t, int) and 0 <= t < 2**32 for t in toks):
                raise Bad("token_ids %r" % (toks,))
            if not isinstance(f.get("block_size"), int):
                raise Bad("block_size %r" % f.get("block_size"))
            for k in ("lora_id",):
                if f.get(k) is not None and not isinstance(f[k], int):
                    raise Bad("%s %r" % (k, f[k]))
            if f.get("lora_name") is not None and not isinstance(f["lora_name"], str):
                raise Bad("lora_name %r" % f["lora_name"])
        out.append((tag, hashes, (medium or "gpu").lower()))
    return out


# ---- the daemons and the stream ----

class Stream:
    """A daemon with events on, a SUB socket on it, and what it has said."""

    def __init__(self, ctx, name, *extra):
        self.d = kvt.tmpdir()
        self.ep = "ipc://" + os.path.join(self.d, "ev.sock")
        self.rep = "ipc://" + os.path.join(self.d, "rp.sock")
        self.topic = "kv@%s@%s" % (name, MODEL)
        self.daemon = kvt.events_daemon(
            self.d, "--pool-size", "2MiB", "--page-size", "128KiB", "--host-tier-size", "2MiB",
            "--disk-path", os.path.join(self.d, "disk"), "--disk-size", "8MiB",
            "--writeback-low", "25", "--events-endpoint", self.ep,
            "--events-replay-endpoint", self.rep, "--events-buffer", "100000",
            "--events-token-ids", "yes", "--node-name", name, *extra)
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(self.ep)
        self.ctx = ctx
        self.live = {}      # seq -> the three frames, as they came
        self.batches = {}   # seq -> payload, live or replayed

    def poll(self):
        while self.sub.poll(0):
            fr = self.sub.recv_multipart()
            seq = int.from_bytes(fr[1], "big")
            self.live[seq] = fr
            self.batches[seq] = fr[2]

    def replay(self, start=0, topic=None):
        """The replay as a vLLM client asks for it (a DEALER sends [b"", seq]),
        or with kvcached's optional topic frame; returns the reply frames."""
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.RCVTIMEO, 20000)
        s.connect(self.rep)
        s.send_multipart([b"", start.to_bytes(8, "big")] + ([topic] if topic else []))
        out = []
        while True:
            fr = s.recv_multipart()
            out.append(fr)
            if len(fr) == 4 and fr[2] == END:
                break
        s.close(linger=0)
        return out

    def catch_up(self):
        self.poll()
        # From the first batch missing: a SUB that joined late (ZMQ's slow
        # joiner) missed the first ones, not only the ones after its last.
        start = 0
        while start in self.batches:
            start += 1
        for fr in self.replay(start)[:-1]:
            kvt.check(len(fr) == 4 and fr[0] == b"" and fr[1] == self.topic.encode(),
                      "replay frame %r" % fr[:3], self.daemon.log)
            self.batches[int.from_bytes(fr[2], "big")] = fr[3]

    def pairs(self):
        """(hash hex or int, medium) the stream adds up to, decoded by vLLM."""
        state = set()
        for seq in range(len(self.batches)):
            kvt.check(seq in self.batches, "no batch %d" % seq, self.daemon.log)
            for ev in DECODER.decode(self.batches[seq]).events:
                if isinstance(ev, AllBlocksCleared):
                    state.clear()
                elif isinstance(ev, BlockStored):
                    state |= {(key(h), ev.medium) for h in ev.block_hashes}
                else:
                    state -= {(key(h), ev.medium) for h in ev.block_hashes}
        return state

    def dump(self, as_int):
        r = self.daemon.kvctl("dump")
        kvt.check(r.returncode == 0, "kvctl dump: %s" % r.stderr, self.daemon.log)
        out = set()
        for line in r.stdout.splitlines():
            _, tier, h = line.split()
            out.add((int.from_bytes(bytes.fromhex(h)[-8:], "big") if as_int else h,
                     MEDIUM[tier]))
        return out


def key(h):
    return h if isinstance(h, int) else h.hex()


def workload(s):
    w = kvt.Worker(s.daemon.sock)
    kvt.check(w.ok(), "worker: %s" % w.hello)
    kvt.check(w.cmd("mpool p 16384 %s" % MODEL).startswith("ok"), "mpool")
    # Token ids seed * 1000 + i: seed 0 gives fixint and uint8 ids, the
    # others uint16 and uint32 ones, so every integer width msgspec picks.
    for seed, n in [(0, 16), (100000, 2), (4294967, 2)] + [(i, 8) for i in range(1, 49)]:
        kvt.check(w.cmd("chain %d %d" % (seed, n)).startswith("ok"), "chain %d" % seed)
        s.daemon.wait_tiers_idle()
        s.poll()
    for seed in range(1, 40, 3):
        w.cmd("lookup %d 8" % seed)
        s.daemon.wait_tiers_idle()
        s.poll()
    w.quit()


def tiers_settled(s, media=()):
    """True once no tier copy or disk I/O is in flight and the blocks are
    in every medium of media (kvctl dump). The workload overflows G1 and G2:
    demotions and G2's write-back to G3 go on in the background after the
    last request, so the media are known only once the tiers are idle."""
    if not s.daemon.tiers_idle():
        return False
    return {m for (_, m) in s.dump(False)} >= set(media)


def settle(s, as_int, media=()):
    if not kvt.wait_for(lambda: tiers_settled(s, media), timeout=60, step=0.1):
        seen = sorted({m for (_, m) in s.dump(False)})
        kvt.fail("the tiers did not settle with blocks in %s: media %s, kvctl status:\n%s" %
                 (sorted(media), seen, s.daemon.kvctl("status").stdout), s.daemon.log)
    want = [None]

    def same():
        s.catch_up()
        want[0] = s.dump(as_int)
        return s.pairs() == want[0]

    kvt.check(kvt.wait_for(same, timeout=60, step=0.1),
              "the events do not add up to kvctl dump", s.daemon.log)
    return want[0]


def check_batches(s, rank, int_hashes):
    """Every batch: vLLM decodes it and re-encodes the same bytes; llm-d's
    rules accept it. Returns the GPU keys llm-d would index."""
    keys, types = set(), set()
    for seq in sorted(s.batches):
        payload = s.batches[seq]
        try:
            b = DECODER.decode(payload)
        except msgspec.DecodeError as e:
            kvt.fail("vLLM cannot decode batch %d: %s: %r" % (seq, e, payload[:64]))
        kvt.check(b.data_parallel_rank == rank, "batch %d: data_parallel_rank %r, not %d" %
                  (seq, b.data_parallel_rank, rank))
        again = ENCODER.encode(b)
        kvt.check(again == payload, "batch %d is not what vLLM encodes:\n ours %s\n vLLM %s" %
                  (seq, payload[:96].hex(), again[:96].hex()))
        for ev in b.events:
            types.add(type(ev).__name__)
            if not isinstance(ev, AllBlocksCleared):
                kvt.check(ev.medium in MEDIUM.values(), "medium %r" % ev.medium)
                kvt.check(all(isinstance(h, int) if int_hashes else
                              isinstance(h, bytes) and len(h) == 32 for h in ev.block_hashes),
                          "hash form in batch %d" % seq)
        if seq in s.live:
            kvt.check(s.live[seq][2] == payload, "replayed batch %d differs from live" % seq)
            frames = s.live[seq]
        else:
            frames = [s.topic.encode(), seq.to_bytes(8, "big"), payload]
        try:
            for tag, hs, tier in llmd_decode(frames):
                if tag == "BlockStored" and tier == "gpu":
                    keys |= set(hs)
        except Bad as e:
            kvt.fail("llm-d's rules refuse batch %d: %s" % (seq, e))
    kvt.check({"BlockStored", "BlockRemoved", "AllBlocksCleared"} <= types,
              "event types seen: %s" % types)
    return keys


def same_replay_as_vllm(ctx, s):
    """vLLM's publisher and its replay service, fed A's decoded batches."""
    d = kvt.tmpdir()
    pub = ZmqEventPublisher(data_parallel_rank=0, endpoint="ipc://" + os.path.join(d, "vp"),
                            replay_endpoint="ipc://" + os.path.join(d, "vr"),
                            buffer_steps=100000, topic=s.topic)
    try:
        n = len(s.batches)
        for seq in range(n):
            b = DECODER.decode(s.batches[seq])
            pub.publish(KVEventBatch(ts=b.ts, events=b.events))  # the publisher sets the rank
        theirs = [None]

        def all_there():
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.RCVTIMEO, 20000)
            sock.connect(pub._replay_endpoint)
            sock.send_multipart([b"", (0).to_bytes(8, "big")])
            out = []
            while True:
                fr = sock.recv_multipart()
                out.append(fr)
                if len(fr) >= 3 and fr[-2] == END:
                    break
            sock.close(linger=0)
            theirs[0] = out
            return len(out) == n + 1

        kvt.check(kvt.wait_for(all_there, timeout=60, step=0.1),
                  "vLLM's publisher replayed %d of %d batches" % (len(theirs[0]) - 1, n))
        ours = s.replay(0)
        kvt.check(len(ours) == n + 1, "kvcached replayed %d of %d batches" % (len(ours) - 1, n))
        for a, b in zip(ours, theirs[0]):
            kvt.check(a == b, "replay frames differ from vLLM's publisher:\n ours %r\n vLLM %r" %
                      ([f[:40] for f in a], [f[:40] for f in b]), s.daemon.log)
        # With kvcached's topic frame: the same frames.
        kvt.check(s.replay(0, s.topic.encode()) == ours, "replay naming the topic differs")
        # A start past the end: only the end marker, as vLLM answers.
        kvt.check(s.replay(n + 5) == [[b"", b"", END, b""]], "replay past the end")

        # Requests vLLM's _service_replay reads its own way (issue 35): the
        # start as int.from_bytes(start, "big"), unsigned, of any length, the
        # delimiter not looked at. kvcached answers each as vLLM's publisher.
        def ask(ep, req):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.RCVTIMEO, 20000)
            sock.connect(ep)
            sock.send_multipart(req)
            out = []
            while True:
                fr = sock.recv_multipart()
                out.append(fr)
                if len(fr) >= 3 and fr[-2] == END:
                    break
            sock.close(linger=0)
            return out
        for req in ([b"", b""], [b"", b"\x00" * 7], [b"", (n - 3).to_bytes(3, "big")],
                    [b"x", (n - 2).to_bytes(8, "big")], [b"", b"\x80" + b"\x00" * 7],
                    [b"", b"\x00" * 8 + (n - 1).to_bytes(4, "big")],
                    [b"", b"\x01" + b"\x00" * 8]):
            a, b = ask(s.rep, req), ask(pub._replay_endpoint, req)
            kvt.check(a == b, "replay of %r: kvcached sent %d messages, vLLM %d (%r / %r)" %
                      (req, len(a), len(b), [f[:3] for f in a[:2]], [f[:3] for f in b[:2]]),
                      s.daemon.log)
    finally:
        pub.shutdown()
    return n


def main():
    kvt.need_bins()
    ctx = zmq.Context()
    a = Stream(ctx, "node-a", "--events-hash-format", "bytes")
    b = Stream(ctx, "node-b", "--events-dp-rank", "3",
               "--events-interval", "0")
    workload(a)
    workload(b)
    pa = settle(a, False, (MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE))
    pb = settle(b, True)
    media = {m for (_, m) in pa}
    kvt.check(media >= {MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE},
              "the workload should leave blocks in every medium: %s" % media, a.daemon.log)
    keys_a = check_batches(a, 0, False)
    keys_b = check_batches(b, 3, True)
    kvt.check(keys_a and keys_a == keys_b,
              "llm-d's keys from bytes (%d) differ from the int form (%d)" %
              (len(keys_a), len(keys_b)))
    n = same_replay_as_vllm(ctx, a)
    print("%d + %d batches (%d live) decoded by vLLM %s and re-encoded byte for byte; llm-d's "
          "rules accept them; %d replayed as vLLM's publisher replays; media %s" %
          (len(a.batches), len(b.batches), len(a.live) + len(b.live),
           __import__("vllm").__version__, n, sorted(media)))
    a.daemon.kill()
    b.daemon.kill()
    kvt.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
