#!/usr/bin/env python3
"""KV events read by Dynamo's own compiled KV indexer (issue 35): PyPI's
ai-dynamo-runtime 1.6.1, `dynamo._core.run_kv_indexer`, the standalone
indexer (`python -m dynamo.indexer`) with its ZMQ listener subscribed to a
kvcached endpoint as to a vLLM worker's (POST /register), and its
HTTP /dump (its radix tree, as stored events with their storage tier). It
runs in its own small environment (scripts/dynamo-env,
/var/cache/kvcached/dynamo-1.6.1); 77 without it.

- The indexer registered as a router registers a worker (POST /register,
  kvcached's replay endpoint as the worker's), after the first chains were
  published: it finds the gap and replays it from kvcached.
- G1 only: chains sealed with token ids, more than G1 holds (evictions): at
  every quiet point the indexer's `device` blocks equal kvctl dump's G1,
  and it logs no warning but the gap it filled.
- With G2 and G3 (demotion, write-back, promotion): nothing the indexer
  holds in a tier (`device`, `host_pinned`, `disk`) is a block kvcached does
  not hold there; what it leaves out is what its radix tree refuses by
  design (a block whose parent is not in the same tier: "Failed to find
  parent block"), counted and printed.
- events_hash_format = bytes (the default before issue 35): the indexer
  decodes none of it (its hashes are 64-bit integers) and holds nothing.

No fixed sleeps: every check waits for its condition."""
import json
import os
import socket
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
SRC = os.environ.get("MESON_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def reexec():
    if os.environ.get("KVT_IN_DYNAMO_ENV") == "1":
        return
    try:
        p = subprocess.run([os.path.join(SRC, "scripts", "dynamo-env"), "--path"],
                           capture_output=True, text=True, timeout=30)
    except OSError as e:
        print("SKIP: scripts/dynamo-env: %s" % e)
        sys.exit(77)
    py = p.stdout.strip()
    if p.returncode != 0 or not py:
        print("SKIP: no Dynamo environment (scripts/dynamo-env makes it: ai-dynamo-runtime "
              "from PyPI)")
        sys.exit(77)
    os.environ["KVT_IN_DYNAMO_ENV"] = "1"
    sys.stdout.flush()
    os.execv(py, [py, os.path.abspath(sys.argv[0])] + sys.argv[1:])


reexec()

import kvt  # noqa: E402

TIER = {"G1": "device", "G2": "host_pinned", "G3": "disk"}
INDEXER = r'''
import sys
from dynamo._core import run_kv_indexer
run_kv_indexer(sys.argv[1:])
'''


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Indexer:
    """Dynamo's standalone indexer with kvcached's endpoint ep registered as
    worker 1 (POST /register, as a Dynamo worker registers itself), with
    kvcached's replay endpoint rep when given: a gap in the sequence is
    then filled from kvcached's replay buffer."""

    def __init__(self, d, ep, rep=None):
        self.port = free_port()
        self.log = os.path.join(d, "indexer.log")
        self.logf = open(self.log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", INDEXER, "--port", str(self.port), "--threads", "1"],
            stdout=self.logf, stderr=subprocess.STDOUT)
        kvt._cleanup.append(self.kill)
        kvt.check(kvt.wait_for(lambda: self.get("/workers") is not None, timeout=60, step=0.1),
                  "the Dynamo indexer did not start", self.log)
        reg = {"instance_id": 1, "endpoint": ep, "model_name": "model-a", "block_size": 16}
        if rep:
            reg["replay_endpoint"] = rep
        req = urllib.request.Request("http://127.0.0.1:%d/register" % self.port,
                                     data=json.dumps(reg).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                st = r.status
        except OSError as e:
            st = e
        kvt.check(st in (200, 201), "the Dynamo indexer refused /register: %s" % st, self.log)

    def complaints(self):
        """Its WARN and ERROR lines, but for the gaps it filled by replay
        (a subscriber that joins late misses what was published before it:
        ZMQ's PUB/SUB; each gap must be followed by a replay)."""
        lines = [ln for ln in self.logtext().splitlines() if "WARN" in ln or "ERROR" in ln]
        gaps = [ln for ln in lines if "Gap detected" in ln]
        replays = self.logtext().count("Replay complete")
        return [ln for ln in lines if "Gap detected" not in ln] + \
            (["%d gaps, %d replays" % (len(gaps), replays)] if len(gaps) > replays else [])

    def get(self, path):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path),
                                        timeout=5) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def pairs(self):
        """(block hash, storage tier) of its radix trees, worker 1."""
        out = set()
        for v in (self.get("/dump") or {}).values():
            for e in v["events"]:
                st = e["event"]["data"].get("stored")
                if e["worker_id"] == 1 and st:
                    out.update((b["block_hash"], e["storage_tier"]) for b in st["blocks"])
        return out

    def logtext(self):
        self.logf.flush()
        with open(self.log, errors="replace") as f:
            return f.read()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def dump(daemon):
    r = daemon.kvctl("dump")
    kvt.check(r.returncode == 0, "kvctl dump: %s" % r.stderr, daemon.log)
    out = set()
    for line in r.stdout.splitlines():
        _, tier, h = line.split()
        out.add((int.from_bytes(bytes.fromhex(h)[-8:], "big"), TIER[tier]))
    return out


def ok(w, line):
    r = w.cmd(line)
    kvt.check(r.startswith("ok"), "worker: %s -> %s" % (line, r))


def setup(*extra):
    d = kvt.tmpdir()
    ep = "ipc://" + os.path.join(d, "ev.sock")
    rep = "ipc://" + os.path.join(d, "rp.sock")
    daemon = kvt.events_daemon(d, "--pool-size", "2MiB", "--page-size", "128KiB",
                               "--events-endpoint", ep, "--events-replay-endpoint", rep,
                               "--events-token-ids", "yes", "--node-name", "n", *extra)
    w = kvt.Worker(daemon.sock)
    kvt.check(w.ok(), "worker: %s" % w.hello, daemon.log)
    ok(w, "mpool p 16384 model-a")
    # Published before the indexer subscribes (a router started after the
    # engine): it finds a gap and fills it from kvcached's replay buffer.
    for s in range(800000, 800003):
        ok(w, "chain %d 1" % s)
    ix = Indexer(d, ep, rep)
    # The listener is subscribed once a first chain reaches it.
    seed = [900000]

    def heard():
        ok(w, "chain %d 1" % seed[0])
        seed[0] += 1
        return bool(ix.pairs())
    kvt.check(kvt.wait_for(heard, timeout=60, step=0.2), "the indexer heard nothing", ix.log)
    return daemon, ix, w


def main():
    kvt.need_bins()
    # --- G1 only: the device tier equals kvctl dump --------------------------
    daemon, ix, w = setup()
    for rnd in range(4):
        for s in range(rnd * 40, rnd * 40 + 40):
            ok(w, "chain %d 8" % (s + 1))
        want = [None]

        def same():
            want[0] = dump(daemon)
            return ix.pairs() == want[0]
        kvt.check(kvt.wait_for(same, timeout=30, step=0.2),
                  "round %d: Dynamo's indexer holds %d blocks, kvctl dump %d (%d only in the "
                  "indexer, %d only in the dump)" %
                  (rnd, len(ix.pairs()), len(want[0]), len(ix.pairs() - want[0]),
                   len(want[0] - ix.pairs())), ix.log)
    kvt.check(not ix.complaints(), "the indexer complained: %s" % ix.complaints()[:3], ix.log)
    kvt.check("Replay complete" in ix.logtext(), "the indexer never replayed what it missed",
              ix.log)
    print("G1 only: Dynamo %s's indexer equals kvctl dump (%d blocks) after %d chains with "
          "evictions" % ("1.6.1", len(want[0]), 160))
    w.quit()
    ix.kill()
    daemon.kill()

    # --- G2 and G3: never a block kvcached does not hold -----------------------
    d = kvt.tmpdir()
    daemon, ix, w = setup("--host-tier-size", "2MiB", "--disk-path", os.path.join(d, "disk"),
                          "--disk-size", "8MiB", "--writeback-low", "25")
    for s in range(1, 40):
        ok(w, "chain %d 8" % s)
        daemon.wait_tiers_idle()
    for s in range(1, 20, 3):
        w.cmd("lookup %d 8" % s)
        daemon.wait_tiers_idle()
    theirs = set()

    def subset():
        want[0] = dump(daemon)
        theirs.clear()
        theirs.update(ix.pairs())
        return theirs <= want[0] and {t for (_, t) in theirs} >= {"device", "host_pinned", "disk"}
    kvt.check(kvt.wait_for(subset, timeout=30, step=0.2),
              "Dynamo's indexer holds %d (block, tier) kvcached does not: %s" %
              (len(theirs - want[0]), sorted(theirs - want[0])[:4]), ix.log)
    per = {t: (len([1 for x in theirs if x[1] == t]), len([1 for x in want[0] if x[1] == t]))
           for t in TIER.values()}
    skipped = ix.logtext().count("Failed to find parent block")
    print("G1, G2, G3: Dynamo's indexer holds, of kvctl dump's blocks, %s; %d stores skipped "
          "by its radix tree (parent not in the same tier)" %
          (", ".join("%s %d of %d" % (t, a, b) for t, (a, b) in per.items()), skipped))
    w.quit()
    ix.kill()
    daemon.kill()

    # --- the bytes form: Dynamo reads none of it -------------------------------
    d = kvt.tmpdir()
    ep = "ipc://" + os.path.join(d, "ev.sock")
    daemon = kvt.events_daemon(d, "--pool-size", "2MiB", "--page-size", "128KiB",
                               "--events-endpoint", ep, "--events-token-ids", "yes",
                               "--events-hash-format", "bytes", "--node-name", "n")
    ix = Indexer(d, ep)
    w = kvt.Worker(daemon.sock)
    kvt.check(w.ok(), "worker: %s" % w.hello, daemon.log)
    ok(w, "mpool p 16384 model-a")
    n = [0]

    def refused():
        n[0] += 1
        ok(w, "chain %d 2" % n[0])
        return "rror" in ix.logtext() or "ailed" in ix.logtext()
    kvt.check(kvt.wait_for(refused, timeout=60, step=0.2), "no error from the indexer", ix.log)
    kvt.check(not ix.pairs(), "Dynamo's indexer read the bytes form: %d blocks" %
              len(ix.pairs()), ix.log)
    line = [x for x in ix.logtext().splitlines() if "rror" in x or "ailed" in x][0]
    print("events_hash_format = bytes: Dynamo's indexer holds nothing; it logs: %s" %
          line[-160:])
    w.quit()
    ix.kill()
    daemon.kill()
    kvt.cleanup()
    print("ok")


if __name__ == "__main__":
    try:
        main()
    finally:
        kvt.cleanup()
