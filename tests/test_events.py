"""KV events (docs/events.md) with a real daemon, real worker processes and real
ZeroMQ subscribers (python3-zmq, python3-msgpack):

  - several workers seal chains with token ids in a daemon with host and disk
    tiers small enough that blocks are demoted, written back, evicted and
    promoted; a subscriber rebuilds, from the events alone, the set of
    (hash, medium) pairs, which must equal kvctl dump;
  - a subscriber that connects after the workload catches up through the
    replay socket and ends with the same set;
  - kvctl events prints the stream (-o json);
  - a Seal with a wrong number of token ids is EINVAL, and only that request
    fails;
  - a subscriber that never reads does not hold the daemon up: the workload
    completes and kvcached_events_dropped_total counts the batches it missed.

No fixed sleeps: the slow joiner is handled the way a real subscriber must
(replay from 0, then replay again on a gap), and every wait is for a
condition. Exit 77 when the daemon was built without events."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvt  # noqa: E402

try:
    import msgpack
    import zmq
except ImportError as e:
    kvt.skip("python3-zmq and python3-msgpack are needed: %s" % e)

MEDIUM = {"G1": "GPU", "G2": "CPU", "G3": "STORAGE"}
END = 2**64 - 1


class Subscriber:
    """Follows the stream as a router would: SUB first, then a replay from
    `start` on the ROUTER socket; a gap in the live sequence numbers is
    filled by another replay. Keeps {(topic, hash, medium)}."""

    def __init__(self, ctx, ep, replay_ep, start=0):
        self.ctx = ctx
        self.replay_ep = replay_ep
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.sub.connect(ep)
        self.state = set()
        self.next = {}     # topic -> next seq to apply
        self.batches = 0
        self.types = set()
        self.lora = {}     # hash -> (lora_name, lora_id, extra keys) of BlockStored
        self.tokens = 0
        self.first = {}    # hash -> (tokens, parent, lora) of its Seal's store (GPU)
        self.moves = 0     # tier stores that repeated them
        self.orphans = 0   # tier stores of blocks whose parent had gone
        self.replays = 0
        self.replay(start, TOPIC.encode())

    def apply(self, topic, seq, payload):
        if seq < self.next.get(topic, 0):
            return
        batch = msgpack.unpackb(payload)
        kvt.check(len(batch) == 3, "batch of %d elements, not [ts, events, rank]" % len(batch))
        ts, events, rank = batch
        kvt.check(isinstance(ts, float), "batch timestamp %r is not a float" % (ts,))
        kvt.check(rank == 0, "data_parallel_rank %r, not the default 0" % (rank,))
        gone = {}          # hash -> media removed earlier in this batch
        for ev in events:
            kvt.check(isinstance(ev, dict) and "type" in ev, "event %r is not a tagged map" % ev)
            t = ev["type"]
            self.types.add(t)
            if t == "AllBlocksCleared":
                self.state = {x for x in self.state if x[0] != topic}
            elif t == "BlockStored":
                hs = ev["block_hashes"]
                kvt.check(all(isinstance(h, bytes) and len(h) == 32 for h in hs),
                          "block hashes are not 32 bytes: %r" % hs)
                toks = ev["token_ids"]
                kvt.check(len(toks) in (0, len(hs) * ev["block_size"]),
                          "%d token ids for %d blocks of %d" % (len(toks), len(hs),
                                                               ev["block_size"]))
                self.tokens += len(toks)
                for k in ("parent_block_hash", "lora_id", "lora_name", "medium", "group_idx"):
                    kvt.check(k in ev, "BlockStored without %s: %r" % (k, ev))
                if ev["lora_name"] is not None:
                    keys = ev.get("extra_keys") or [None] * len(hs)
                    kvt.check(len(keys) == len(hs), "%d extra_keys for %d blocks" %
                              (len(keys), len(hs)))
                    for h, k in zip(hs, keys):
                        self.lora[h] = (ev["lora_name"], ev["lora_id"], k)
                bs = ev["block_size"]
                for i, h in enumerate(hs):
                    self.state.add((topic, h.hex(), ev["medium"]))
                    # Issue 35: a tier move's store comes before the
                    # remove it goes with, and says what the Seal said.
                    kvt.check(not (gone.get(h, set()) - {ev["medium"]}),
                              "block %s removed from %s before it was stored in %s (one "
                              "batch)" % (h.hex()[:12], gone.get(h), ev["medium"]))
                    par = ev["parent_block_hash"] if i == 0 else hs[i - 1]
                    mine = (toks[i * bs:(i + 1) * bs], par, ev["lora_name"])
                    seal = self.first.get((topic, h))
                    if seal is None:
                        if ev["medium"] == "GPU":
                            self.first[(topic, h)] = mine
                    elif mine != seal:
                        # Only where the parent is held nowhere any more:
                        # then without token ids and parent (a router
                        # places it by the block's own key).
                        par = seal[1]
                        kvt.check(mine[:2] == ([], None) and par is not None and
                                  not any((topic, par.hex(), m) in self.state
                                          for m in MEDIUM.values()),
                                  "the %s store of %s says %r, its Seal said %r" %
                                  (ev["medium"], h.hex()[:12], mine, seal))
                        self.orphans += 1
                    else:
                        self.moves += ev["medium"] != "GPU" and mine[0] != []
            elif t == "BlockRemoved":
                kvt.check(ev.get("group_idx") == 0, "BlockRemoved without group_idx 0: %r" % ev)
                for h in ev["block_hashes"]:
                    self.state.discard((topic, h.hex(), ev["medium"]))
                    gone.setdefault(h, set()).add(ev["medium"])
            else:
                kvt.fail("unknown event type %r" % t)
        self.next[topic] = seq + 1
        self.batches += 1

    def replay(self, start, topic=None):
        """vLLM >= 0.26's replay: [b"", seq] to the ROUTER, [b"", topic, seq,
        payload] back until [b"", b"", seq -1, b""]."""
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.RCVTIMEO, 20000)
        s.connect(self.replay_ep)
        s.send_multipart([b"", start.to_bytes(8, "big")] + ([topic] if topic else []))
        self.replays += 1
        while True:
            fr = s.recv_multipart()
            kvt.check(len(fr) == 4 and fr[0] == b"" and len(fr[2]) == 8,
                      "bad replay frame %r" % fr[:3])
            seq = int.from_bytes(fr[2], "big")
            if seq == END:
                kvt.check(fr[1] == b"" and fr[3] == b"", "end marker with a topic or payload")
                break
            kvt.check(not topic or fr[1] == topic, "replay of another topic %r" % fr[1])
            self.apply(fr[1].decode(), seq, fr[3])
        s.close(linger=0)

    def poll(self, timeout_ms):
        """Applies what has arrived; returns the number of messages."""
        n = 0
        while self.sub.poll(timeout_ms if n == 0 else 0):
            topic, seq, payload = self.sub.recv_multipart()
            topic = topic.decode()
            seq = int.from_bytes(seq, "big")
            if seq > self.next.get(topic, 0):
                self.replay(self.next.get(topic, 0), topic.encode())
            self.apply(topic, seq, payload)
            n += 1
        return n

    def catch_up(self):
        """Applies what has arrived, then what was published after it (a
        tail the live socket has not delivered yet, or lost)."""
        self.poll(0)
        self.replay(self.next.get(TOPIC, 0), TOPIC.encode())

    def pairs(self):
        return {(h, m) for (t, h, m) in self.state}


def replay_seqs(ctx, ep, request):
    """The seqs of one replay's batches, up to its end marker."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.RCVTIMEO, 20000)
    s.connect(ep)
    s.send_multipart(request)
    seqs = []
    while True:
        fr = s.recv_multipart()
        seq = int.from_bytes(fr[2], "big")
        if seq == END:
            break
        seqs.append(seq)
    s.close(linger=0)
    return seqs


def dump(daemon):
    r = daemon.kvctl("dump")
    kvt.check(r.returncode == 0, "kvctl dump: %s" % r.stderr, daemon.log)
    out = set()
    for line in r.stdout.splitlines():
        pool, tier, h = line.split()
        out.add((h, MEDIUM[tier]))
    return out


def ok(w, line):
    r = w.cmd(line)
    kvt.check(r.startswith("ok"), "worker: %s -> %s" % (line, r))
    return int(r.split()[1])


def main():
    global TOPIC
    kvt.need_bins()
    d = kvt.tmpdir()
    ep = "ipc://" + os.path.join(d, "ev.sock")
    rep = "ipc://" + os.path.join(d, "rp.sock")
    TOPIC = "kv@node-a@model-a"
    daemon = kvt.events_daemon(d, "--pool-size", "2MiB", "--page-size", "128KiB",
                               "--host-tier-size", "2MiB", "--disk-path", os.path.join(d, "disk"),
                               "--disk-size", "8MiB", "--writeback-low", "25",
                               "--events-endpoint", ep, "--events-replay-endpoint", rep,
                               "--events-buffer", "100000", "--events-token-ids", "yes",
                               "--node-name", "node-a", "--events-hash-format", "bytes")
    ctx = zmq.Context()
    sub = Subscriber(ctx, ep, rep)

    # Socket files: the admin socket's mode (0600 by default).
    for f in ("ev.sock", "rp.sock"):
        mode = os.stat(os.path.join(d, f)).st_mode & 0o777
        kvt.check(mode == 0o600, "%s has mode %o, not 0600" % (f, mode))

    # Several workers, one model; 16 KiB blocks: G1 holds 128, G2 128, G3 512.
    workers = [kvt.Worker(daemon.sock) for _ in range(4)]
    for w in workers:
        kvt.check(w.ok(), "worker: %s" % w.hello)
        ok(w, "mpool p 16384 model-a")

    # Only the bad Seal fails; its connection carries on.
    r = workers[0].cmd("badtokens")
    kvt.check(r.startswith("err") and "token ids" in r, "badtokens: %s" % r, daemon.log)
    ok(workers[0], "chain 999 2")
    # A Seal with the LoRA and extra keys (kvc_seal_events).
    ok(workers[1], "lchain 7777 6")
    # An empty digest key (issue 36, item 6: NULL to memcpy; the sanitizer
    # build aborts on it).
    ok(workers[2], "echain 4242")

    # The workload: chains of 8 blocks, more than G1 + G2 hold, interleaved
    # across the workers, the subscriber reading as it goes; then lookups of
    # early chains, which promote what the lower tiers kept.
    seed = 1
    for rnd in range(24):
        for w in workers:
            ok(w, "chain %d 8" % seed)
            daemon.wait_tiers_idle()  # what reaches G2 and G3 must not hang on speed
            seed += 1
        sub.poll(0)
    for s in range(1, 40, 3):
        workers[s % 4].cmd("lookup %d 8" % s)
        daemon.wait_tiers_idle()
        sub.poll(0)
    for w in workers:
        w.quit()

    # The daemon's background work (demotion, write-back) settles; the
    # events must add up to the index whenever it is idle. The events can
    # add up before the write-back to G3 has begun (nothing of it published
    # yet, nothing of it in the dump): so first the tiers idle with blocks in
    # every medium.
    kvt.check(kvt.wait_for(lambda: daemon.tiers_idle() and
                           {m for (h, m) in dump(daemon)} >= {"GPU", "CPU", "STORAGE"},
                           timeout=60, step=0.1),
              "the tiers did not settle with blocks in every medium: %s" %
              {m for (h, m) in dump(daemon)}, daemon.log)
    want = [None]

    def same():
        sub.catch_up()
        want[0] = dump(daemon)
        return sub.pairs() == want[0]

    if not kvt.wait_for(same, timeout=30, step=0.1):
        got = sub.pairs()
        kvt.fail("events say %d pairs, kvctl dump %d: %d only in events %s, %d only in the "
                 "dump %s" % (len(got), len(want[0]), len(got - want[0]),
                              sorted(got - want[0])[:4], len(want[0] - got),
                              sorted(want[0] - got)[:4]), daemon.log)
    media = {m for (h, m) in want[0]}
    kvt.check(media >= {"GPU", "CPU", "STORAGE"},
              "the workload should leave blocks in every medium: %s" % media, daemon.log)
    kvt.check({"BlockStored", "BlockRemoved", "AllBlocksCleared"} <= sub.types,
              "event types seen: %s" % sub.types)
    kvt.check(sub.tokens > 0, "no token ids published")
    kvt.check(sub.moves > 0, "no tier move's store carried its token ids")
    # lchain's blocks (tests/kvt_worker.c): the LoRA and each block's keys.
    kvt.check(len(sub.lora) == 6, "%d blocks with a LoRA, not 6" % len(sub.lora))
    nil = 0
    for name, lid, keys in sub.lora.values():
        kvt.check(name == "lora-7777" and lid == 7778, "LoRA %r, id %r" % (name, lid))
        if keys is None:
            nil += 1
            continue
        i = int(keys[0].split("-")[1])
        exp = ["t7777-%d" % i, bytes([i]) * 32, ["img%d" % i, -1000 * i - 7]][:i % 4]
        kvt.check(keys == exp, "block %d's extra keys %r, not %r" % (i, keys, exp))
    kvt.check(nil == 2, "%d blocks without extra keys, not 2" % nil)
    print("events: %d batches, %d replays, %d pairs (%s), %d tier stores with their Seal's "
          "token ids, %d without (their parent gone)" % (sub.batches, sub.replays, len(want[0]),
                                               sorted(media), sub.moves, sub.orphans))

    # A late subscriber: everything from the replay buffer.
    late = Subscriber(ctx, ep, rep)
    kvt.check(late.pairs() == want[0], "the late subscriber rebuilt %d pairs, not %d" %
              (len(late.pairs()), len(want[0])), daemon.log)
    kvt.check(int(daemon.metric("kvcached_events_replay_requests_total")) >= 1,
              "replays not counted", daemon.log)

    # kvctl events: the replayed batches, then one live one.
    outf = open(os.path.join(d, "kvctl-events.out"), "w+")
    kp = subprocess.Popen([kvt.KVCTL, "-o", "json", "events", "--endpoint", ep,
                           "--replay-endpoint", rep, "--from", "0", "-n", "1"],
                          stdout=outf, stderr=subprocess.PIPE, text=True)
    kvt._cleanup.append(lambda: kp.poll() is None and kp.kill())
    w = kvt.Worker(daemon.sock)
    ok(w, "mpool p 16384 model-a")
    n = [1000]

    def kvctl_done():
        n[0] += 1
        ok(w, "chain %d 1" % n[0])
        return kp.poll() is not None
    kvt.check(kvt.wait_for(kvctl_done, timeout=20, step=0.05), "kvctl events did not end")
    err = kp.communicate()[1]
    kvt.check(kp.returncode == 0, "kvctl events: %s" % err)
    outf.seek(0)
    out = outf.read()
    lines = [json.loads(x) for x in out.splitlines()]
    kvt.check(lines and lines[0]["type"] == "AllBlocksCleared" and lines[0]["seq"] == 0,
              "kvctl events began with %r" % (lines[:1],))
    kvt.check(any(x["type"] == "BlockStored" and x.get("tokens") for x in lines),
              "kvctl events printed no BlockStored with tokens")
    kvt.check(any(x.get("lora_name") == "lora-7777" and x.get("lora_id") == 7778
                  for x in lines), "kvctl events printed no LoRA")
    w.quit()

    # Requests vLLM's _service_replay answers, answered as it does: the start
    # read as int.from_bytes(start, "big"), of any length, unsigned; the
    # delimiter frame not looked at (issue 35).
    total = len(replay_seqs(ctx, rep, [b"", (0).to_bytes(8, "big")]))
    for req, first in (([b"", b"\x00" * 7], 0),               # a short start: 0
                       ([b"", b""], 0),                        # an empty one: 0
                       ([b"x", (0).to_bytes(8, "big")], 0),    # any delimiter
                       ([b"", b"\x80" + b"\x00" * 7], None),   # the top bit: 2**63
                       ([b"", b"\x01" + b"\x00" * 8], None),   # past 2**64
                       ([b"", (total - 1).to_bytes(8, "big")], total - 1)):
        got = replay_seqs(ctx, rep, req)
        kvt.check((got[:1] or [None])[0] == first and (first is None or len(got) >= total - first),
                  "replay of %r: %d batches from %r, not from %r" % (req, len(got), got[:1], first))
    # Hostile replay requests: ignored and counted; the socket still serves.
    bad = ctx.socket(zmq.DEALER)
    bad.connect(rep)
    bad.send_multipart([b"", (0).to_bytes(8, "big"), b"t", b"extra"])  # too many frames
    bad.send_multipart([b"", (0).to_bytes(8, "big"), b"t" * 1000])     # topic too long
    kvt.check(kvt.wait_for(lambda: int(daemon.metric("kvcached_events_replay_bad_total")) >= 2,
                           timeout=10, step=0.05), "bad replay requests not counted", daemon.log)
    bad.close(linger=0)
    again = Subscriber(ctx, ep, rep)
    kvt.check(kvt.wait_for(lambda: again.catch_up() or again.pairs() == dump(daemon),
                           timeout=30, step=0.1),
              "replay after bad requests differs from kvctl dump", daemon.log)
    daemon.kill()

    namespace_hashes_only()
    slow_subscriber()
    kvt.cleanup()
    print("ok")


def namespace_hashes_only():
    """[namespace X] events = hashes: its stores carry no token ids, even with
    events_token_ids = yes; events = off: nothing about its pools."""
    global TOPIC
    d = kvt.tmpdir()
    ep = "ipc://" + os.path.join(d, "ev.sock")
    rep = "ipc://" + os.path.join(d, "rp.sock")
    conf = os.path.join(d, "k.conf")
    with open(conf, "w") as f:
        f.write("events_token_ids = yes\nnode_name = n\nevents_hash_format = bytes\n"
                "[namespace quiet]\nusers = *\nevents = hashes\n"
                "[namespace silent]\nusers = *\nevents = off\n")
    daemon = kvt.Daemon(d, "--config=" + conf, "--events-endpoint", ep,
                        "--events-replay-endpoint", rep,
                        argv0=[kvt.BIN, "--socket=" + os.path.join(d, "w.sock")])
    ctx = zmq.Context()
    for ns, model in (("quiet", "m-quiet"), ("silent", "m-silent"), (None, "m-loud")):
        w = kvt.Worker(daemon.sock, ns)
        kvt.check(w.ok(), "worker in %s: %s" % (ns, w.hello), daemon.log)
        ok(w, "mpool p 16384 " + model)
        ok(w, "chain 5 4")
        w.quit()
    seen = {}
    for model in ("m-quiet", "m-silent", "m-loud"):
        TOPIC = "kv@n@" + model
        sub = Subscriber(ctx, ep, rep)
        sub.sub.close(linger=0)
        seen[model] = sub
    kvt.check(seen["m-silent"].batches == 0, "a namespace with events = off was published")
    kvt.check(seen["m-quiet"].pairs() and seen["m-quiet"].tokens == 0,
              "events = hashes: %d pairs, %d token ids" % (len(seen["m-quiet"].pairs()),
                                                          seen["m-quiet"].tokens))
    kvt.check(seen["m-loud"].tokens == 4 * 16, "events_token_ids = yes: %d token ids" %
              seen["m-loud"].tokens)
    daemon.kill()


def slow_subscriber():
    """A subscriber that stops reading: the daemon goes on, drops counted."""
    d = kvt.tmpdir()
    ep = "ipc://" + os.path.join(d, "ev.sock")
    daemon = kvt.Daemon(d, "--pool-size", "2MiB", "--page-size", "128KiB",
                        "--events-endpoint", ep, "--events-hwm", "1", "--events-interval", "0",
                        "--events-token-ids", "yes")
    ctx = zmq.Context()
    slow = ctx.socket(zmq.SUB)
    slow.setsockopt(zmq.RCVHWM, 1)
    slow.setsockopt(zmq.RCVBUF, 4096)
    slow.setsockopt(zmq.SUBSCRIBE, b"")
    slow.connect(ep)
    w = kvt.Worker(daemon.sock)
    kvt.check(w.ok(), "worker: %s" % w.hello)
    ok(w, "mpool p 16384 model-a")
    # Connected once it has received something; from then on it never reads.
    seed = [1]

    def heard():
        ok(w, "chain %d 1" % seed[0])
        seed[0] += 1
        return slow.poll(50) != 0
    kvt.check(kvt.wait_for(heard, timeout=20, step=0), "the subscriber never heard anything")
    slow.recv_multipart()
    w2 = kvt.Worker(daemon.sock)
    ok(w2, "mpool p 16384 model-a")
    for i in range(1500):
        ok(w if i % 2 else w2, "chain %d 8" % (10000 + i))
    dropped = int(daemon.metric("kvcached_events_dropped_total"))
    published = int(daemon.metric("kvcached_events_published_total"))
    kvt.check(dropped > 0, "no drops counted (%d published)" % published, daemon.log)
    print("slow subscriber: %d of %d batches dropped for it" % (dropped, published))
    w.quit()
    w2.quit()
    slow.close(linger=0)
    daemon.kill()


if __name__ == "__main__":
    try:
        main()
    finally:
        kvt.cleanup()
