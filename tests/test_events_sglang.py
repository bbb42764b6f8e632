#!/usr/bin/env python3
"""KV events read by SGLang's own event classes (issue 35): SGLang 0.5.23's
sglang.srt.disaggregation.kv_events (KVEventBatch, BlockStored, BlockRemoved,
AllBlocksCleared: msgspec structs, block hashes declared list[int]), imported
from the SGLang environment (/var/cache/kvcached/sglang-0.5.23, made by
scripts/sglang-env; KVCACHED_SGLANG_ENV elsewhere).

- A real daemon with G1, G2 and G3 and the default events_hash_format (int):
  a workload of chains (one with a LoRA and extra keys), demotion,
  write-back, promotion and `kvctl evict`. Every batch, live and replayed, is
  decoded by msgspec.msgpack.Decoder(SGLang's KVEventBatch); the (hash,
  medium) the decoded events add up to equal kvctl dump (the hash's last 8
  bytes) once the daemon is idle, and the tier stores carry the token ids.
- The same daemon with events_hash_format = bytes (the default before issue
  35): SGLang's decoder refuses its first BlockStored ("Expected `int`, got
  `bytes`"), which is why int is the default.

Exit 77 without the SGLang environment or a daemon built with events."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_env  # noqa: E402

sglang_env.reexec()

import msgspec  # noqa: E402
import zmq  # noqa: E402
from sglang.srt.disaggregation.kv_events import (AllBlocksCleared, BlockRemoved,  # noqa: E402
                                                   BlockStored, KVEventBatch)

import kvt  # noqa: E402

END = 2**64 - 1
MEDIUM = {"G1": "GPU", "G2": "CPU", "G3": "STORAGE"}
DECODER = msgspec.msgpack.Decoder(KVEventBatch)


class Stream:
    def __init__(self, ctx, name, *extra):
        self.d = kvt.tmpdir()
        self.ep = "ipc://" + os.path.join(self.d, "ev.sock")
        self.rep = "ipc://" + os.path.join(self.d, "rp.sock")
        self.daemon = kvt.events_daemon(
            self.d, "--pool-size", "2MiB", "--page-size", "128KiB", "--host-tier-size", "2MiB",
            "--disk-path", os.path.join(self.d, "disk"), "--disk-size", "8MiB",
            "--writeback-low", "25", "--events-endpoint", self.ep,
            "--events-replay-endpoint", self.rep, "--events-buffer", "100000",
            "--events-token-ids", "yes", "--node-name", name, *extra)
        self.ctx = ctx
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(self.ep)
        self.batches = {}

    def catch_up(self):
        while self.sub.poll(0):
            _, seq, payload = self.sub.recv_multipart()
            self.batches[int.from_bytes(seq, "big")] = payload
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.RCVTIMEO, 20000)
        s.connect(self.rep)
        # From the first batch missing: a SUB that joined late (ZMQ's slow
        # joiner) missed the first ones, not only the ones after its last.
        start = 0
        while start in self.batches:
            start += 1
        s.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            fr = s.recv_multipart()
            seq = int.from_bytes(fr[2], "big")
            if seq == END:
                break
            self.batches[seq] = fr[3]
        s.close(linger=0)


def ok(w, line):
    r = w.cmd(line)
    kvt.check(r.startswith("ok"), "worker: %s -> %s" % (line, r))


def workload(s):
    w = kvt.Worker(s.daemon.sock)
    kvt.check(w.ok(), "worker: %s" % w.hello, s.daemon.log)
    ok(w, "mpool p 16384 model-a")
    ok(w, "lchain 7777 6")
    for seed in range(1, 40):
        ok(w, "chain %d 8" % seed)
        s.daemon.wait_tiers_idle()
    for seed in range(1, 20, 3):
        w.cmd("lookup %d 8" % seed)
        s.daemon.wait_tiers_idle()
    r = s.daemon.kvctl("evict", "--tier", "g1", "--all")
    kvt.check(r.returncode == 0, "kvctl evict: %s" % r.stderr, s.daemon.log)
    s.daemon.wait_tiers_idle()
    w.quit()


def dump(daemon):
    r = daemon.kvctl("dump")
    kvt.check(r.returncode == 0, "kvctl dump: %s" % r.stderr, daemon.log)
    out = set()
    for line in r.stdout.splitlines():
        _, tier, h = line.split()
        out.add((int.from_bytes(bytes.fromhex(h)[-8:], "big"), MEDIUM[tier]))
    return out


def main():
    kvt.need_bins()
    ctx = zmq.Context()
    s = Stream(ctx, "node-a")
    workload(s)
    state = set()
    stats = {"batches": 0, "tier_tokens": 0, "lora": 0}

    def same():
        s.catch_up()
        state.clear()
        stats.update(batches=0, tier_tokens=0, lora=0)
        for seq in range(len(s.batches)):
            kvt.check(seq in s.batches, "no batch %d" % seq, s.daemon.log)
            try:
                b = DECODER.decode(s.batches[seq])
            except msgspec.ValidationError as e:
                kvt.fail("SGLang's KVEventBatch refuses batch %d: %s" % (seq, e), s.daemon.log)
            stats["batches"] += 1
            for ev in b.events:
                if isinstance(ev, AllBlocksCleared):
                    state.clear()
                elif isinstance(ev, BlockStored):
                    kvt.check(all(isinstance(h, int) for h in ev.block_hashes), "hashes")
                    for h in ev.block_hashes:
                        state.add((h, ev.medium))
                    if ev.medium != "GPU" and ev.token_ids:
                        stats["tier_tokens"] += 1
                    stats["lora"] += ev.lora_name == "lora-7777"
                elif isinstance(ev, BlockRemoved):
                    for h in ev.block_hashes:
                        state.discard((h, ev.medium))
        return state == dump(s.daemon)
    kvt.check(kvt.wait_for(same, timeout=30, step=0.2),
              "SGLang's decoded events add up to %d pairs, kvctl dump %d" %
              (len(state), len(dump(s.daemon))), s.daemon.log)
    media = {m for (_, m) in state}
    kvt.check(media >= {"CPU", "STORAGE"}, "media %s" % media, s.daemon.log)
    kvt.check(stats["tier_tokens"] > 0, "no tier store carried token ids")
    kvt.check(stats["lora"] > 0, "no BlockStored with the LoRA")
    print("SGLang %s's KVEventBatch decoded %d batches; %d pairs equal kvctl dump (%s); %d tier "
          "stores with token ids" % (__import__("sglang").__version__, stats["batches"],
                                     len(state), sorted(media), stats["tier_tokens"]))
    s.daemon.kill()

    # The bytes form: SGLang cannot read it.
    b = Stream(ctx, "node-b", "--events-hash-format", "bytes")
    w = kvt.Worker(b.daemon.sock)
    kvt.check(w.ok(), "worker: %s" % w.hello, b.daemon.log)
    ok(w, "mpool p 16384 model-a")
    ok(w, "chain 5 2")
    w.quit()
    refused = [None]

    def refuses():
        b.catch_up()
        for seq in sorted(b.batches):
            try:
                DECODER.decode(b.batches[seq])
            except msgspec.ValidationError as e:
                refused[0] = str(e)
                return True
        return False
    kvt.check(kvt.wait_for(refuses, timeout=20, step=0.1),
              "SGLang decoded the bytes form", b.daemon.log)
    kvt.check("Expected `int`, got `bytes`" in refused[0], "SGLang said %r" % refused[0])
    print("events_hash_format = bytes: SGLang refuses it (%s)" % refused[0])
    b.daemon.kill()
    kvt.cleanup()
    print("ok")


if __name__ == "__main__":
    try:
        main()
    finally:
        kvt.cleanup()
