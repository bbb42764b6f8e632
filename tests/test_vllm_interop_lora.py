#!/usr/bin/env python3
"""BlockStored with the LoRA and the extra keys, against vLLM 0.33.0's own code
(issue 25). A real daemon with events on; real vLLM requests (a LoRA with its
name, path and id; multimodal items, one begun in an earlier block; a cache
salt of 300 bytes; prompt embeddings; all together; none), hashed by vLLM's
own block hasher; the Python binding seals their blocks, in two Seals a
request, with what the vLLM connector computes for its saves
(kvcache.vllm.connector._event_meta, vLLM's generate_block_hash_extra_keys
and to_event_extra_keys). A real ZMQ subscriber (and the replay socket for
what it missed) reads the batches; for every BlockStored kvcached published:

  - vLLM's decoder reads the batch and its encoder writes it back byte for
    byte;
  - vLLM's own BlockPool, caching the same blocks of the same request
    (cache_full_blocks with enable_kv_cache_events), makes a BlockStored
    equal to kvcached's, group_idx 0 included (issue 35), and vLLM's
    encoding of that event is found, byte for byte, in kvcached's payload.

A namespace with `events = hashes` gets the LoRA but no token ids and no
extra keys. Hostile Seals (a LoRA name of 257 bytes, 65 keys a block, a key
of 1025 bytes) fail with EINVAL and seal nothing; the connection and the
daemon go on (the same blocks seal afterwards).

Runs under scripts/vllm-env's python (tests/vllm_env.py); exits 77 without
it or when the daemon was built without events. No fixed sleeps."""
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_env  # noqa: E402

vllm_env.reexec()

# The bytes form (events_hash_format = bytes below).
os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "0"

import msgspec  # noqa: E402
import torch  # noqa: E402
import zmq  # noqa: E402
import vllm.v1.core.kv_cache_utils as kcu  # noqa: E402
from vllm.distributed.kv_events import (BlockStored, KVEventBatch,  # noqa: E402
                                        MEDIUM_GPU)
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.utils import tensor_data  # noqa: E402

import kvcache  # noqa: E402
from kvcache.vllm.connector import _event_meta  # noqa: E402
import kvt  # noqa: E402

BS = 16
NB = 6
# A Seal at the bounds (64 keys a block, 1024 bytes a key), with every
# integer and string width msgspec picks, which vLLM's encoder must write
# back byte for byte: mm offsets from int64's least to uint64, texts and
# digests of 31 to 1024 bytes.
OFFSETS = [-2**63, -2**31 - 1, -32769, -129, -33, -32, -1, 0, 127, 128, 255, 256, 65535, 65536,
           2**32 - 1, 2**32, 2**63 - 1]
BOUND_KEYS = [tuple(["k"] * (64 - len(OFFSETS)) + [("m%d" % i, o) for i, o in
                                                   enumerate(OFFSETS)]),
              ("s" * 1024, b"\1" * 1024, ("i" * 1024, -2**63), "t" * 31, "u" * 32, "v" * 255,
               "w" * 256, b"x" * 255, b"y" * 256, "ünï" * 20, b"")]
DECODER = msgspec.msgpack.Decoder(KVEventBatch)
ENCODER = msgspec.msgpack.Encoder()


def vllm_request(rid, tokens, lora=None, salt=None, mm=None, embeds=None):
    feats = [MultiModalFeatureSpec(data=None, modality="image", identifier=ident,
                                   mm_position=PlaceholderRange(offset=off, length=n))
             for ident, off, n in (mm or [])]
    return Request(request_id=rid, prompt_token_ids=list(tokens),
                   sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                   lora_request=LoRARequest(*lora) if lora else None,
                   cache_salt=salt, mm_features=feats or None, prompt_embeds=embeds,
                   block_hasher=kcu.get_request_block_hasher(BS, sha256_cbor))


def vllm_event(req, a, b):
    """vLLM's own BlockStored for blocks [a, b) of req, from its BlockPool."""
    pool = BlockPool(num_gpu_blocks=NB + 2, enable_caching=True, hash_block_size=BS,
                     enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(NB)
    pool.cache_full_blocks(req, blocks, a, b, BS, 0)
    evs = [e for e in pool.take_events() if isinstance(e, BlockStored)]
    kvt.check(len(evs) == 1, "vLLM's block pool made %d BlockStored" % len(evs))
    return evs[0]


class Sub:
    """A SUB socket on the daemon, with the replay socket for what it missed."""

    def __init__(self, ctx, ep, rep, daemon):
        self.ctx, self.rep, self.daemon = ctx, rep, daemon
        self.s = ctx.socket(zmq.SUB)
        self.s.setsockopt(zmq.SUBSCRIBE, b"")
        self.s.connect(ep)
        self.batches = {}    # (topic, seq) -> payload

    def poll(self):
        while self.s.poll(0):
            t, seq, p = self.s.recv_multipart()
            self.batches[(t, int.from_bytes(seq, "big"))] = p

    def replay(self):
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.RCVTIMEO, 20000)
        d.connect(self.rep)
        d.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            fr = d.recv_multipart()
            if fr[1] == b"":
                break
            self.batches[(fr[1], int.from_bytes(fr[2], "big"))] = fr[3]
        d.close(linger=0)

    def stored(self):
        """[(topic, payload, BlockStored)] of every batch so far."""
        self.poll()
        self.replay()
        out = []
        for (t, _), p in sorted(self.batches.items()):
            for ev in DECODER.decode(p).events:
                if isinstance(ev, BlockStored):
                    out.append((t, p, ev))
        return out


def seal(c, pool, req, a, b, meta=True):
    blocks = c.alloc(pool, b - a)
    hs = [bytes(h) for h in req.block_hashes[a:b]]
    kw = {}
    if meta:
        name, lid, keys = _event_meta(req, a, b, BS)
        kw = dict(lora_name=name, lora_id=lid, extra_keys=keys)
    out = c.seal(pool, blocks, hs, token_ids=req.all_token_ids[a * BS:b * BS],
                 parent=bytes(req.block_hashes[a - 1]) if a else None, **kw)
    c.release(out)
    return hs


def hostile(c, pool, daemon):
    """Past each bound: EINVAL for that Seal alone, nothing sealed."""
    blocks = c.alloc(pool, 2)
    hs = [hashlib.sha256(b"hostile%d" % i).digest() for i in range(2)]
    cases = [
        ("a LoRA name of 257 bytes", dict(lora_name="x" * 257), "lora_name"),
        ("65 keys in a block", dict(extra_keys=[None, ("k",) * 65]), "extra keys"),
        ("a key of 1025 bytes", dict(extra_keys=[("s" * 1025,), None]), "1024"),
        ("a digest of 1025 bytes", dict(extra_keys=[None, (b"\0" * 1025,)]), "1024"),
        ("an mm identifier of 1025 bytes", dict(extra_keys=[(("i" * 1025, -3),), None]),
         "1024"),
    ]
    for what, kw, word in cases:
        try:
            c.seal(pool, blocks, hs, **kw)
            kvt.fail("a Seal with %s was accepted" % what, daemon.log)
        except kvcache.KvError as e:
            kvt.check(e.code == kvcache.EINVAL and word in str(e),
                      "a Seal with %s: %s, not EINVAL naming %r" % (what, e, word), daemon.log)
    for what, kw in [("a key of another type", dict(extra_keys=[(1.5,), None])),
                     ("extra_keys for 1 of 2 blocks", dict(extra_keys=[None]))]:
        try:
            c.seal(pool, blocks, hs, **kw)
            kvt.fail("the binding sent a Seal with %s" % what)
        except (TypeError, ValueError):
            pass
    # Nothing was sealed, and the connection goes on: the blocks seal now,
    # at the bounds exactly.
    kvt.check(c.lookup(pool, hs) == [], "a refused Seal sealed blocks", daemon.log)
    out = c.seal(pool, blocks, hs, lora_name="y" * 256, lora_id=2**64 - 1,
                 extra_keys=BOUND_KEYS)
    c.release(out)
    return hs


def main():
    kvt.need_bins()
    d = kvt.tmpdir()
    ep = "ipc://" + os.path.join(d, "ev.sock")
    rep = "ipc://" + os.path.join(d, "rp.sock")
    conf = os.path.join(d, "k.conf")
    with open(conf, "w") as f:
        f.write("events_token_ids = yes\nnode_name = n\nevents_buffer = 100000\n"
                "events_hash_format = bytes\n"
                "[namespace quiet]\nusers = *\nevents = hashes\n")
    daemon = kvt.events_daemon(d, "--config=" + conf, "--events-endpoint", ep,
                               "--events-replay-endpoint", rep, "--pool-size", "16MiB",
                               argv0=[kvt.BIN, "--socket=" + os.path.join(d, "w.sock")])
    ctx = zmq.Context()
    sub = Sub(ctx, ep, rep, daemon)

    tokens = [(i * 7919 + 13) % 200000 for i in range(NB * BS)] + [5]
    embeds = torch.randn(len(tokens), 8, generator=torch.Generator().manual_seed(25))
    lora = ("adapter-ü", 7, "/models/adapters/a1")
    mm = [("img-" + "a" * 40, 3, 20), ("img-b", 40, 8), ("audio-c", 48, 16), ("img-d", 70, 12)]
    kinds = {
        "none": {},
        "lora": {"lora": lora},
        "salt": {"salt": "tenant-a"},
        "mm": {"mm": mm},
        "prompt_embeds": {"embeds": embeds},
        "all": {"lora": ("big-" + "l" * 60, 2**40, "/p"), "salt": "s" * 300, "mm": mm,
                "embeds": embeds},
    }
    os.environ.pop("PYTHONHASHSEED", None)    # vLLM's default NONE_HASH
    kcu.init_none_hash(sha256_cbor)
    c = kvcache.connect(daemon.sock, client_name="lora-test")
    pool = c.register_pool("p", 16384, BS, model="m")
    reqs = {}
    fill = set()
    for i, (name, k) in enumerate(kinds.items()):
        # Another token at the head of each: distinct chains.
        req = vllm_request(name, [i] + tokens[1:], k.get("lora"), k.get("salt"), k.get("mm"),
                           k.get("embeds"))
        kvt.check(len(req.block_hashes) == NB, "vLLM hashed %d blocks" % len(req.block_hashes))
        reqs[bytes(req.block_hashes[0])] = req
        seal(c, pool, req, 0, 2)
        # A block of no chain between the two Seals: the second one is an
        # event of its own (blocks 2.., with a parent; no cache salt; an
        # mm item begun before its first token).
        h = hashlib.sha256(b"filler %d" % i).digest()
        c.release(c.seal(pool, c.alloc(pool, 1), [h]))
        fill.add(h)
        seal(c, pool, req, 2, NB)
        # vLLM's hashes, as the binding computes them: the same blocks.
        kw = k.get("lora") or (None, None, None)
        got = kvcache.vllm_chain(req.all_token_ids, BS, None, lora_name=kw[0],
                                 lora_path=kw[2], cache_salt=k.get("salt"), mm=k.get("mm"),
                                 prompt_embeds=[hashlib.sha256(tensor_data(
                                     embeds[j * BS:(j + 1) * BS])).digest()
                                     for j in range(NB)] if "embeds" in k else None)
        kvt.check(got == [bytes(h) for h in req.block_hashes], "binding's hashes for %s" % name)
    bad = hostile(c, pool, daemon)
    # events = hashes: the LoRA, no token ids, no extra keys.
    q = kvcache.connect(daemon.sock, "quiet", "lora-quiet")
    qpool = q.register_pool("p", 16384, BS, model="mq")
    qreq = vllm_request("quiet", [99] + tokens[1:], lora, "salt-q", mm)
    qh = seal(q, qpool, qreq, 0, NB)

    index = {}     # block hash -> (request, index)
    for req in reqs.values():
        for j, h in enumerate(req.block_hashes):
            index[bytes(h)] = (req, j)
    want = set(index) | set(bad) | set(qh) | fill
    seen = [set()]

    def all_seen():
        seen[0] = {h for (_, _, ev) in sub.stored() for h in ev.block_hashes}
        return want <= seen[0]

    kvt.check(kvt.wait_for(all_seen, timeout=60, step=0.1),
              "%d of %d sealed blocks published" % (len(want & seen[0]), len(want)), daemon.log)
    checked = 0
    with_keys = set()
    starts = set()
    for topic, payload, ev in sub.stored():
        kvt.check(ENCODER.encode(DECODER.decode(payload)) == payload,
                  "a batch is not what vLLM encodes")
        if topic == b"kv@n@mq":
            kvt.check(ev.lora_name == lora[0] and ev.lora_id == lora[1] and
                      ev.token_ids == [] and ev.extra_keys is None,
                      "events = hashes published %r" % (ev,))
            continue
        h0 = ev.block_hashes[0]
        if h0 in fill:
            continue
        if h0 in bad:
            # Without token ids each block is its own BlockStored.
            keys = [tuple(list(k) if isinstance(k, tuple) else k for k in ks)
                    for ks in BOUND_KEYS]
            kvt.check(ev.lora_name == "y" * 256 and ev.lora_id == 2**64 - 1 and
                      ev.extra_keys == [keys[bad.index(h0)]],
                      "the Seal at the bounds published %r" % (ev.extra_keys,))
            continue
        kvt.check(h0 in index, "a BlockStored of blocks not sealed here")
        req, a = index[h0]
        b = a + len(ev.block_hashes)
        # group_idx as vLLM's block pool writes it (0: one KV-cache group).
        theirs = vllm_event(req, a, b)
        # Compared as vLLM's decoder reads both (a tuple in an extra key
        # comes back a list).
        back = msgspec.msgpack.decode(ENCODER.encode(theirs), type=BlockStored)
        kvt.check(ev == back, "request %s blocks [%d, %d):\n ours %r\n vLLM %r" %
                  (req.request_id, a, b, ev, back))
        kvt.check(ENCODER.encode(theirs) in payload,
                  "request %s blocks [%d, %d): vLLM's encoding of its event is not in the "
                  "payload" % (req.request_id, a, b))
        kvt.check(ev.medium == MEDIUM_GPU, "medium %r" % ev.medium)
        starts.add(a)
        if any(ev.extra_keys or ()):
            with_keys.add(req.request_id)
        checked += 1
    kvt.check(starts == {0, 2}, "events began at blocks %s, not 0 and 2" % sorted(starts))
    kvt.check(with_keys == set(kinds) - {"none"},
              "requests whose events carried extra keys: %s" % sorted(with_keys))
    print("%d BlockStored of %d requests (LoRA, multimodal, cache salt, prompt embeddings) "
          "equal to vLLM %s's own BlockPool events and byte for byte in the payloads; "
          "events = hashes keeps the keys back; hostile Seals refused" %
          (checked, len(reqs), __import__("vllm").__version__))
    c.close()
    q.close()
    daemon.kill()
    kvt.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
