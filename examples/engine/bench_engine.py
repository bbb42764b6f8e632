#!/usr/bin/env python3
"""The engine benchmark (issue 12): a trace of requests served by engine
processes (engine.py, the real SmolLM2-135M) in four set-ups, and the same
prefix KV fetched from a Redis server beside kvcached's lookup + mapping.

    scripts/bench --engine [--full] [...]          (builds, then runs this)
    python3 examples/engine/bench_engine.py --kvcached build/daemon/kvcached \\
        --kvctl build/client/kvctl [--full] [--requests N] [--procs 4] ...

The trace: system prompts cut from this repository's docs (real English),
picked with Zipf popularity (s = 1), each followed by a user turn of its own
and a number of tokens to generate; request i goes to process i mod procs;
each process serves its requests one after another, all processes at once.
The default is scaled to a 2-CPU machine (about 4 minutes); --full is the
issue's trace (200 requests, 8 system prompts of 1-2k tokens, user turns of
50-200 tokens, 32-128 generated): about an hour of numpy on 2 CPUs.

Set-ups, each on a fresh daemon:
  (1) none     no prefix caching: every prompt computed in full;
  (2) private  kvcached, but each process with its own cache salt: it reuses
               only what it computed itself (an in-engine prefix cache);
  (3) shared   kvcached shared by all processes;
  (4) tiered   (3) with G1 too small for the prefixes: a host tier (G2) and
               a disk tier (G3) below it, prefixes come back from them.
Per set-up: TTFT p50/p99 (admission to the first token: the prompt's lookup
and prefill; no queueing, a process serves one request at a time), generated
tokens/s over the whole run, hit rate (prompt tokens found in kvcached over
prompt tokens), prefill tokens computed, and the bytes the daemon's tiers
moved (demotions, write-backs, promotions from G2 and from G3, the latter
two copies each; from `kvctl -o json status`).

The Redis peer (an LMCache-style same-node store): one system prompt's KV
blocks SET in a redis-server on a Unix socket, then fetched (pipelined GET)
and copied into the engine's blocks, against kvcached: lookup of the chain
and the zero-copy views of the blocks, with a memcpy of the same bytes as
the floor. Best of --repeat runs each.

Figures only: nothing here asserts a speed."""
from __future__ import annotations

import argparse
import glob
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import kvcache  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.model import REPO_ROOT, Model  # noqa: E402

SETUPS = ("none", "private", "shared", "tiered")


# ------------------------------------------------------------------ the trace
def corpus(tok) -> list:
    """Token ids of this repository's docs, concatenated (real text)."""
    text = []
    for path in sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "*.md"))) + \
            [os.path.join(REPO_ROOT, "README.md")]:
        with open(path, encoding="utf-8") as f:
            text.append(f.read())
    return tok.encode("\n\n".join(text))


def make_trace(ids: list, a, rng: np.random.Generator) -> tuple:
    """(system prompts, requests): requests are (prompt index, token ids,
    tokens to generate)."""
    systems, off = [], 0
    for _ in range(a.prompts):
        n = int(rng.integers(a.system[0], a.system[1] + 1))
        if off + n > len(ids):
            off = 0
        systems.append(ids[off:off + n])
        off += n
    w = 1.0 / np.arange(1, a.prompts + 1)
    w /= w.sum()
    reqs = []
    for _ in range(a.requests):
        k = int(rng.choice(a.prompts, p=w))
        n = int(rng.integers(a.user[0], a.user[1] + 1))
        o = int(rng.integers(0, len(ids) - n))
        reqs.append((k, systems[k] + ids[o:o + n], int(rng.integers(a.gen[0], a.gen[1] + 1))))
    return systems, reqs


# ------------------------------------------------------------------ daemons
class Daemon:
    """kvcached on a private socket in dir."""

    def __init__(self, a, d, *args, page="64KiB", segment="16MiB"):
        self.sock = os.path.join(d, "kv.sock")
        self.admin = os.path.join(d, "kv-admin.sock")
        self.kvctl_bin = a.kvctl
        self.logf = open(os.path.join(d, "kvcached.log"), "ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVCACHED_")}
        self.proc = subprocess.Popen(
            [a.kvcached, "--config=", "--socket=" + self.sock, "--page-size", page,
             "--segment-size", segment, *args],
            stdin=subprocess.DEVNULL, stdout=self.logf, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise SystemExit("kvcached exited at start; its log: %s" % self.logf.name)
            if self.kvctl("status").returncode == 0:
                break
            if time.monotonic() > deadline:
                raise SystemExit("kvcached does not answer on " + self.admin)
            time.sleep(0.05)

    def kvctl(self, *args):
        return subprocess.run([self.kvctl_bin, "-s", self.admin, *args], capture_output=True,
                              text=True, timeout=60)

    def status(self) -> dict:
        r = self.kvctl("-o", "json", "status")
        if r.returncode:
            raise SystemExit("kvctl status: " + r.stderr)
        return json.loads(r.stdout)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.logf.close()


# ------------------------------------------------------------------ a run
def serve(idx, model, sock, setup, reqs, barrier, out):
    """One engine process: its share of the trace, one request at a time."""
    salt = "proc-%d" % idx if setup == "private" else None
    with Engine(model, sock, salt=salt, prefix_cache=setup != "none", max_batch=1) as eng:
        barrier.wait()
        t0 = time.perf_counter()
        res = []
        for _, ids, gen in reqs:
            (o,) = eng.generate([ids], gen, stop_at_eog=False)
            res.append((o.ttft_s, len(o.tokens), o.hit_tokens, len(ids)))
        out.put((idx, time.perf_counter() - t0, res))


def run_setup(a, model, setup, reqs, sizes, tmp) -> dict:
    d = tempfile.mkdtemp(dir=tmp)
    args = ["--pool-size", "%dMiB" % sizes["g1_big"]]
    if setup == "tiered":
        args = ["--pool-size", "%dMiB" % sizes["g1_small"],
                "--host-tier-size", "%dMiB" % sizes["g2"],
                "--disk-path", os.path.join(d, "g3"), "--disk-size", "%dMiB" % sizes["g3"]]
    dm = Daemon(a, d, *args)
    try:
        ctx = mp.get_context("fork")
        barrier, out = ctx.Barrier(a.procs + 1), ctx.Queue()
        procs = [ctx.Process(target=serve, args=(i, model, dm.sock, setup, reqs[i::a.procs],
                                                 barrier, out)) for i in range(a.procs)]
        for p in procs:
            p.start()
        barrier.wait(timeout=300)
        t0 = time.perf_counter()
        got = [out.get(timeout=a.timeout) for _ in procs]
        wall = time.perf_counter() - t0
        for p in procs:
            p.join()
            if p.exitcode:
                raise SystemExit("an engine process of set-up %s failed (%d)" % (setup, p.exitcode))
        st = dm.status()
    finally:
        dm.stop()
    res = [r for _, _, rs in got for r in rs]
    ttft = np.array([r[0] for r in res]) * 1000
    gen = sum(r[1] for r in res)
    hit = sum(r[2] for r in res)
    prompt = sum(r[3] for r in res)
    # Copies between tiers, in blocks: demotions (G1 -> G2), write-backs
    # (G2 -> G3), and promotions by where they started (a tier's hits): a
    # G3 hit is read into G2 and copied up, two copies.
    tiers = {t["tier"]: t for t in st["tiers"]}
    moved = {"G1->G2": tiers.get("G2", {}).get("demotions", 0),
             "G2->G3": tiers.get("G3", {}).get("demotions", 0),
             "G2->G1": tiers.get("G2", {}).get("hits", 0),
             "G3->G1": tiers.get("G3", {}).get("hits", 0)}
    copies = sum(moved.values()) + moved["G3->G1"]
    return {"setup": setup, "requests": len(res), "wall_s": wall,
            "ttft_p50_ms": float(np.percentile(ttft, 50)),
            "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "tok_s": gen / wall, "hit_rate": hit / prompt, "computed": prompt - hit,
            "moved_blocks": moved, "moved_bytes": copies * sizes["block"],
            "g1_evicted": tiers["G1"]["evictions"], "tiers": st["tiers"]}


# ------------------------------------------------------------------ Redis peer
class Resp:
    """A RESP2 client over a Unix socket (just what the peer needs: pipelined
    SET and GET of bulk strings)."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.f = self.s.makefile("rb", buffering=1 << 20)

    def send(self, *cmds):
        buf = bytearray()
        for cmd in cmds:
            buf += b"*%d\r\n" % len(cmd)
            for x in cmd:
                x = x if isinstance(x, (bytes, bytearray, memoryview)) else str(x).encode()
                buf += b"$%d\r\n" % len(x)
                buf += x
                buf += b"\r\n"
        self.s.sendall(buf)

    def reply(self):
        line = self.f.readline()
        if line[:1] == b"$":
            n = int(line[1:])
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return memoryview(data)[:n]
        if line[:1] in (b"+", b":"):
            return line[1:].strip()
        raise RuntimeError("redis: " + line.decode(errors="replace"))


def redis_peer(a, model, system, tmp) -> dict:
    """One system prompt's KV: Redis SET/GET + copy vs kvcached lookup + views."""
    server = shutil.which("redis-server")
    if not server:
        return {"skipped": "no redis-server (apt-get install redis-server)"}
    d = tempfile.mkdtemp(dir=tmp)
    rsock = os.path.join(d, "redis.sock")
    rs = subprocess.Popen([server, "--port", "0", "--unixsocket", rsock, "--save", "",
                           "--appendonly", "no", "--dir", d],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dm = Daemon(a, tempfile.mkdtemp(dir=tmp), "--pool-size", "256MiB")  # 16 MiB segments
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(rsock):
            if rs.poll() is not None or time.monotonic() > deadline:
                return {"skipped": "redis-server did not start"}
            time.sleep(0.02)
        r = Resp(rsock)
        with Engine(model, dm.sock) as eng:
            (o,) = eng.generate([system], 1, stop_at_eog=False)   # computes and seals
            chain = kvcache.hash_chain(system, eng.layout.block_size)
            n = len(chain)
            held = eng.conn.lookup(eng.pool, chain)
            blobs = [np.array(eng.conn.view(eng.pool, h), copy=True) for h in held]
            eng.conn.release(held)
            block = blobs[0].nbytes
            r.send(*[("SET", h.hex(), memoryview(b).cast("B")) for h, b in zip(chain, blobs)])
            for _ in chain:
                r.reply()
            # The engine's blocks the Redis bytes are copied into.
            dst = eng.conn.alloc(eng.pool, n)
            dviews = [eng.conn.view(eng.pool, h) for h in dst]
            t_redis, t_kv, t_copy = [], [], []
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                r.send(*[("GET", h.hex()) for h in chain])
                for v in dviews:
                    v.reshape(-1).view(np.uint8)[:] = np.frombuffer(r.reply(), np.uint8)
                t_redis.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                got = eng.conn.lookup(eng.pool, chain)
                views = [eng.conn.view(eng.pool, h) for h in got]
                t_kv.append(time.perf_counter() - t0)
                assert len(views) == n and all(np.array_equal(v, b) for v, b in zip(views, blobs))
                assert all(np.array_equal(v, b) for v, b in zip(dviews, blobs))
                eng.conn.release(got)
                t0 = time.perf_counter()
                for v, b in zip(dviews, blobs):
                    v[...] = b
                t_copy.append(time.perf_counter() - t0)
            eng.conn.release(dst)
    finally:
        dm.stop()
        rs.terminate()
        rs.wait()
    return {"blocks": n, "block_bytes": block, "tokens": n * eng.layout.block_size,
            "redis_ms": 1000 * min(t_redis), "kvcached_ms": 1000 * min(t_kv),
            "memcpy_ms": 1000 * min(t_copy)}


# ------------------------------------------------------------------ main
def pair(s):
    lo, _, hi = s.partition("-")
    return int(lo), int(hi or lo)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvcached", default=os.path.join(REPO_ROOT, "build", "daemon", "kvcached"))
    ap.add_argument("--kvctl", default=os.path.join(REPO_ROOT, "build", "client", "kvctl"))
    ap.add_argument("--full", action="store_true", help="the issue's trace (about an hour here)")
    ap.add_argument("--requests", type=int)
    ap.add_argument("--prompts", type=int, help="system prompts")
    ap.add_argument("--system", type=pair, help="system prompt tokens, LO-HI")
    ap.add_argument("--user", type=pair, help="user turn tokens, LO-HI")
    ap.add_argument("--gen", type=pair, help="generated tokens, LO-HI")
    ap.add_argument("--procs", type=int, default=4, help="engine processes")
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--repeat", type=int, default=5, help="runs of the Redis peer")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=7200)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args(argv)
    scale = dict(requests=200, prompts=8, system=(1024, 2048), user=(50, 200), gen=(32, 128)) \
        if a.full else dict(requests=48, prompts=8, system=(256, 512), user=(16, 48), gen=(8, 16))
    for k, v in scale.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    setups = [s for s in a.setups.split(",") if s]
    for s in setups:
        if s not in SETUPS:
            ap.error("unknown set-up %r (of %s)" % (s, ", ".join(SETUPS)))

    model = Model.load(allow_random=False)
    ids = corpus(model.tok)
    systems, reqs = make_trace(ids, a, np.random.default_rng(a.seed))
    layout = model.kv_layout(16, "float16")
    blk = layout.block_bytes
    sys_blocks = sum(len(s) // 16 for s in systems)
    seq_blocks = -(-(a.system[1] + a.user[1] + a.gen[1] + 1) // 16)
    # Whole 16 MiB segments (runs of 17 pages of 64 KiB hold 3 blocks: a
    # segment holds 45, one page left over).
    mib = lambda blocks: -(-blocks // 45) * 16  # noqa: E731
    sizes = {"block": blk,
             # every prefix cached twice over, and every process's sequence
             "g1_big": mib(2 * sys_blocks + 2 * a.procs * seq_blocks),
             # the running sequences and little else: the prefixes come
             # back from G2 and G3
             "g1_small": mib(a.procs * seq_blocks),
             "g2": mib(sys_blocks // 4), "g3": mib(4 * sys_blocks)}
    print("model: %s; %d CPUs, OPENBLAS_NUM_THREADS=%s" % (
        model.source, os.cpu_count(), os.environ.get("OPENBLAS_NUM_THREADS")))
    print("trace: %d requests over %d system prompts (%d-%d tokens, Zipf s=1), user turns "
          "%d-%d tokens, %d-%d generated; %d engine processes; seed %d" % (
              a.requests, a.prompts, a.system[0], a.system[1], a.user[0], a.user[1],
              a.gen[0], a.gen[1], a.procs, a.seed))
    print("blocks: 16 tokens, %d bytes; G1 %d MiB (tiered: %d MiB, G2 %d MiB, G3 %d MiB)" % (
        blk, sizes["g1_big"], sizes["g1_small"], sizes["g2"], sizes["g3"]))
    tmp = tempfile.mkdtemp(prefix="kvcached-bench-engine.", dir=os.environ.get("KVBENCH_DISK_DIR",
                                                                                 "/var/tmp"))
    results = {}
    try:
        print("\n%-8s %8s %9s %9s %7s %6s %9s %11s  %s" % (
            "set-up", "requests", "TTFT p50", "TTFT p99", "tok/s", "hit", "computed",
            "moved", "tier copies (blocks)"))
        for s in setups:
            r = run_setup(a, model, s, reqs, sizes, tmp)
            results[s] = r
            mv = ", ".join("%s %d" % kv for kv in r["moved_blocks"].items() if kv[1])
            print("%-8s %8d %7.0fms %7.0fms %7.1f %5.0f%% %9d %8.1fMiB  %s" % (
                s, r["requests"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["tok_s"],
                100 * r["hit_rate"], r["computed"], r["moved_bytes"] / 2**20, mv or "-"),
                flush=True)
        if "shared" in results:
            sh = results["shared"]
            for base in ("none", "private", "tiered"):
                if base in results:
                    b = results[base]
                    print("shared vs %-8s TTFT p50 %.2fx lower, p99 %.2fx, tok/s %.2fx" % (
                        base, b["ttft_p50_ms"] / sh["ttft_p50_ms"],
                        b["ttft_p99_ms"] / sh["ttft_p99_ms"], sh["tok_s"] / b["tok_s"]))
        peer = redis_peer(a, model, systems[0], tmp)
        results["redis_peer"] = peer
        if "skipped" in peer:
            print("\nRedis peer: skipped:", peer["skipped"])
        else:
            mb = peer["blocks"] * peer["block_bytes"] / 2**20
            print("\nprefix of %d tokens (%d blocks, %.1f MiB): Redis GET + copy %.2f ms, "
                  "kvcached lookup + views %.2f ms (%.1fx), memcpy of the bytes %.2f ms" % (
                      peer["tokens"], peer["blocks"], mb, peer["redis_ms"],
                      peer["kvcached_ms"], peer["redis_ms"] / peer["kvcached_ms"],
                      peer["memcpy_ms"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(a).items()}, "sizes": sizes,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
