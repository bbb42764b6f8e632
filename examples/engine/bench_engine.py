#!/usr/bin/env python3
"""The engine benchmark (issues 12 and 27): a trace of requests served by
engine processes (engine.py) in five set-ups, and on the CPU the same
prefix KV fetched from a Redis server beside kvcached's lookup + mapping.

    scripts/bench --engine [--full] [...]                   (numpy, CPU)
    scripts/bench --engine --device cuda [...]              (PyTorch, one GPU)
    python3 examples/engine/bench_engine.py --kvcached build/daemon/kvcached \\
        --kvctl build/client/kvctl [--device cuda] [--model M] [--procs N] ...

Models (--model): "gguf" (the real SmolLM2-135M-Instruct, scripts/fetch-model;
the CPU default), "smollm2-135m" (its shape, seeded random weights), or on
--device cuda a torch_model.SHAPES name with seeded random weights in
bfloat16 ("llama-3.2-3b", the GPU default; "llama-3.1-8b"): real prefill
and decode costs, meaningless text. The numpy model runs on the CPU
(engine processes forked from one loaded model); the torch model on the GPU
(processes spawned, each building the same seeded weights), its KV in the
cuda backend's blocks, read and written in place (torch_model.py).

The trace: system prompts cut from this repository's docs, picked with Zipf
popularity (s = 1), each followed by a user turn of its own and a number of
tokens to generate; request i goes to process i mod procs; each process
serves its requests one after another, all processes at once. CPU default:
scaled to a 2-CPU machine (about 7 minutes); --full is issue 12's trace (200
requests, 8 system prompts of 1-2k tokens, user turns of 50-200 tokens,
32-128 generated): about an hour of numpy on 2 CPUs; --tiny: a CI smoke
test (seconds). GPU default: 64 requests over 8 system prompts of 1-8k
tokens, user turns of 50-200, 16-32 generated, 4 processes (2 when the
GPU's memory cannot hold 4), --budget seconds per set-up at most (a process
stops taking requests after it; the figures say how many were served).

Set-ups, each on a fresh daemon:
  none     no prefix caching: every prompt computed in full;
  private  kvcached, but each process with its own cache salt: it reuses
           only what it computed itself (an in-engine prefix cache: vLLM's);
  offload  private, with G1 too small for the prefixes and a host tier (G2)
           behind it: prefixes come back over PCIe (LMCache's CPU backend,
           vLLM's CPU offloading);
  shared   kvcached shared by all processes (one G1 pool, prefixes shared
           zero-copy);
  tiered   shared, G1 small, a host tier (G2) and a disk tier (G3) below it.
The same G1 for none, private and shared (the same device memory).
Per set-up: TTFT p50/p99 (admission to the first token: the prompt's lookup
and prefill; no queueing, a process serves one request at a time), generated
tokens/s over the whole run, hit rate (prompt tokens found in kvcached over
prompt tokens), prefill tokens computed, KV bytes reused in place, and the
bytes the daemon's tiers moved (demotions, write-backs, promotions from G2
and from G3, the latter two copies each; from `kvctl -o json status`).

The Redis peer (CPU only; an LMCache-style same-node store): one system
prompt's KV blocks SET in a redis-server on a Unix socket, then fetched
(pipelined GET) and copied into the engine's blocks, against kvcached:
lookup of the chain and the zero-copy views of the blocks, with a memcpy of
the same bytes as the floor. Best of --repeat runs each.

Figures only: nothing here asserts a speed (exit 0 when everything ran)."""
from __future__ import annotations

import argparse
import glob
import json
import multiprocessing as mp
import os
import queue
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
from engine.model import REPO_ROOT, Config, Model  # noqa: E402

SETUPS = ("none", "private", "offload", "shared", "tiered")
# set-ups whose processes have a cache salt each, and whose G1 is small
PRIVATE = ("private", "offload")
SMALL_G1 = ("offload", "tiered")


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
        # a cuda daemon pins its host tier (GiBs) before it answers
        deadline = time.monotonic() + 120
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
def serve(idx, model, sock, setup, reqs, go, out, budget=0.0, spec=None):
    """One engine process: says ("ready", idx) once connected, waits for go,
    then serves its share of the trace, one request at a time; after budget
    seconds (0: none) it takes no more. spec: (device, model name, seed,
    dtype) of a torch model to build here (spawned process). Puts (idx,
    seconds, results), or (idx, -1, error) when it fails."""
    try:
        if spec is not None:
            model = torch_process_model(*spec)
        salt = "proc-%d" % idx if setup in PRIVATE else None
        kvd = spec[3] if spec is not None else "float16"
        with Engine(model, sock, salt=salt, prefix_cache=setup != "none", max_batch=1,
                    dtype=kvd) as eng:
            out.put(("ready", idx))
            go.wait()
            t0 = time.perf_counter()
            res = []
            for _, ids, gen in reqs:
                if budget and time.perf_counter() - t0 > budget:
                    break
                (o,) = eng.generate([ids], gen, stop_at_eog=False)
                res.append((o.ttft_s, len(o.tokens), o.hit_tokens, len(ids)))
            out.put((idx, time.perf_counter() - t0, res))
    except BaseException as e:  # noqa: BLE001: the parent reports it
        out.put((idx, -1.0, repr(e)))
        raise


def torch_process_model(device, name, seed, dtype):
    """The model of a spawned GPU engine process, warmed up (cuBLAS, the
    attention kernels of a prompt, of a prompt after a cached prefix, and of
    decode) on in-process blocks, so that no request pays the first calls."""
    from engine.torch_model import TorchLocalAllocator, TorchModel, TorchPagedKV
    m = TorchModel.random(name, seed, device, dtype)
    lay = m.kv_layout(16, dtype)
    kv = TorchPagedKV(TorchLocalAllocator(lay, 80, device), device)
    toks = list(range(300, 300 + 1024))
    m.forward([("w", toks[:512], 0)], kv)
    m.forward([("w", toks[512:], 512)], kv)
    m.forward([("w", [7], 1024)], kv)
    kv.free("w")
    return m


def block_sizes(block, page, segment):
    """Blocks one segment holds (an estimate from below: a block smaller
    than a page packs into pages, a larger one takes whole pages)."""
    if block <= page:
        return (segment // page) * (page // block)
    return (segment // page) // -(-block // page)


def run_setup(a, model, setup, reqs, sizes, tmp) -> dict:
    d = tempfile.mkdtemp(dir=tmp)
    if setup in SMALL_G1:
        args = ["--pool-size", "%dMiB" % sizes["g1_small"]]
        if setup == "offload":
            args += ["--host-tier-size", "%dMiB" % sizes["g2_offload"]]
        else:
            args += ["--host-tier-size", "%dMiB" % sizes["g2"],
                     "--disk-path", os.path.join(d, "g3"), "--disk-size", "%dMiB" % sizes["g3"]]
    else:
        args = ["--pool-size", "%dMiB" % sizes["g1_big"]]
    if a.device != "cpu":
        args += ["--backend", "cuda"]
    cuda = a.torch
    t_start = time.perf_counter()
    dm = Daemon(a, d, *args, page=sizes["page"], segment=sizes["segment"])
    procs = []
    try:
        ctx = mp.get_context("spawn" if cuda else "fork")
        go, out = ctx.Event(), ctx.Queue()
        spec = (a.device, a.model, a.model_seed, a.kv_dtype) if cuda else None
        procs = [ctx.Process(target=serve, args=(i, None if cuda else model, dm.sock, setup,
                                                 reqs[i::a.procs], go, out, a.budget, spec))
                 for i in range(a.procs)]
        for p in procs:
            p.start()

        def take(what):
            """The next message; a process that failed or died ends the set-up."""
            deadline = time.monotonic() + a.timeout
            while True:
                try:
                    m = out.get(timeout=2)
                except queue.Empty:
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise SystemExit("an engine process of set-up %s died (exit %s) %s" % (
                            setup, dead[0].exitcode, what))
                    if time.monotonic() > deadline:
                        raise SystemExit("set-up %s: nothing after %.0f s %s" % (
                            setup, a.timeout, what))
                    continue
                if m[0] != "ready" and m[1] < 0:
                    raise SystemExit("an engine process of set-up %s failed %s: %s" % (
                        setup, what, m[2]))
                return m

        for _ in procs:
            take("while starting")
        start_s = time.perf_counter() - t_start
        go.set()
        t0 = time.perf_counter()
        got = [take("while serving") for _ in procs]
        wall = time.perf_counter() - t0
        for p in procs:
            p.join(60)
        for p in procs:
            if p.exitcode:
                raise SystemExit("an engine process of set-up %s failed (%s)" % (setup, p.exitcode))
        st = dm.status()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(10)
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
    return {"setup": setup, "requests": len(res), "of": len(reqs), "wall_s": wall,
            "start_s": start_s,
            "ttft_p50_ms": float(np.percentile(ttft, 50)) if len(res) else float("nan"),
            "ttft_p99_ms": float(np.percentile(ttft, 99)) if len(res) else float("nan"),
            "tok_s": gen / wall, "hit_rate": hit / max(prompt, 1), "computed": prompt - hit,
            "reused_bytes": hit * sizes["token"],
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


def gpu_procs(want, weights, g1_bytes) -> int:
    """4 engine processes when the GPU holds 4 models, 4 x 3 GiB of
    activations and context, and the G1 pool with 4 GiB to spare; else 2."""
    import torch
    free, total = torch.cuda.mem_get_info()
    if want:
        return want
    need4 = 4 * (weights + (3 << 30)) + g1_bytes + (4 << 30)
    return 4 if free >= need4 else 2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvcached", default=os.path.join(REPO_ROOT, "build", "daemon", "kvcached"))
    ap.add_argument("--kvctl", default=os.path.join(REPO_ROOT, "build", "client", "kvctl"))
    ap.add_argument("--device", default="cpu", help="cpu (numpy) or cuda (PyTorch)")
    ap.add_argument("--model", help="gguf, smollm2-135m, llama-3.2-3b, llama-3.1-8b "
                    "(default: gguf on the CPU, llama-3.2-3b on cuda)")
    ap.add_argument("--model-seed", type=int, default=0, help="seed of random weights")
    ap.add_argument("--torch", action="store_true", help="the PyTorch engine on --device cpu "
                    "(a rehearsal of the GPU path: slow)")
    ap.add_argument("--full", action="store_true", help="issue 12's trace (about an hour here)")
    ap.add_argument("--tiny", action="store_true", help="a CI smoke test (seconds)")
    ap.add_argument("--requests", type=int)
    ap.add_argument("--prompts", type=int, help="system prompts")
    ap.add_argument("--system", type=pair, help="system prompt tokens, LO-HI")
    ap.add_argument("--user", type=pair, help="user turn tokens, LO-HI")
    ap.add_argument("--gen", type=pair, help="generated tokens, LO-HI")
    ap.add_argument("--procs", type=int, help="engine processes (CPU: 4; cuda: 4 or 2)")
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--budget", type=float, help="seconds per set-up after which a process "
                    "takes no more requests (cuda: 30; 0 = none)")
    ap.add_argument("--deadline", type=float, default=0, help="seconds for the whole run: a "
                    "set-up that would start after deadline - 2 x budget is skipped (0: none)")
    ap.add_argument("--peer", action=argparse.BooleanOptionalAction, default=None,
                    help="the Redis peer (CPU default: on)")
    ap.add_argument("--repeat", type=int, default=5, help="runs of the Redis peer")
    ap.add_argument("--seed", type=int, default=1, help="seed of the trace")
    ap.add_argument("--timeout", type=float, default=7200)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args(argv)
    t_begin = time.monotonic()
    cuda = a.device != "cpu"
    a.torch = a.torch or cuda
    if a.full:
        scale = dict(requests=200, prompts=8, system=(1024, 2048), user=(50, 200), gen=(32, 128))
    elif a.tiny:
        scale = dict(requests=8, prompts=4, system=(96, 160), user=(4, 12), gen=(2, 3))
    elif cuda:
        scale = dict(requests=64, prompts=8, system=(1024, 8192), user=(50, 200), gen=(16, 32))
    else:
        scale = dict(requests=48, prompts=8, system=(256, 512), user=(16, 48), gen=(8, 16))
    for k, v in scale.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.model is None:
        a.model = "llama-3.2-3b" if cuda else "gguf"
    if a.budget is None:
        a.budget = 30.0 if cuda else 0.0
    if a.peer is None:
        a.peer = not cuda and not a.tiny
    setups = [s for s in a.setups.split(",") if s]
    for s in setups:
        if s not in SETUPS:
            ap.error("unknown set-up %r (of %s)" % (s, ", ".join(SETUPS)))

    if a.torch:
        try:
            import torch
        except ImportError as e:
            print("SKIP: %s" % e)
            return 77
        from engine.torch_model import SHAPES, kv_bytes_per_token
        if a.model not in SHAPES:
            ap.error("the torch engine: --model is one of %s" % ", ".join(SHAPES))
        if cuda and not torch.cuda.is_available():
            print("SKIP: torch sees no CUDA device")
            return 77
        cfg = SHAPES[a.model]
        a.kv_dtype = "bfloat16"
        from engine.model import byte_tokenizer
        tok = byte_tokenizer(cfg.n_vocab)
        token_bytes = kv_bytes_per_token(cfg, a.kv_dtype)
        n_params = (cfg.n_vocab * cfg.n_embd + cfg.n_layers * (
            cfg.n_embd * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim +
            cfg.n_heads * cfg.head_dim * cfg.n_embd + 3 * cfg.n_embd * cfg.n_ff))
        weights = 2 * n_params
        model = None
        source = "%s, seeded random weights (seed %d), bfloat16, on %s (%s), torch %s" % (
            a.model, a.model_seed, a.device,
            torch.cuda.get_device_name(0) if cuda else "PyTorch's CPU", torch.__version__)
        page, segment = (2 << 20, 1 << 30) if cuda else (64 << 10, (4 if a.tiny else 16) << 20)
    else:
        a.kv_dtype = "float16"
        if a.model == "gguf":
            model = Model.load(allow_random=False)
        elif a.model == "smollm2-135m":
            model = Model.random_model(Config(), seed=a.model_seed)
        else:
            ap.error("--device cpu: --model is gguf or smollm2-135m")
        tok = model.tok
        token_bytes = model.kv_layout(16, "float16").token_bytes
        source = model.source + ("" if not model.random else
                                 " (SmolLM2-135M's shape, seeded random weights)")
        # tiny: 4 MiB segments, so that G1 holds few blocks more than it must
        page, segment = 64 << 10, (4 if a.tiny else 16) << 20
    ids = corpus(tok)
    systems, reqs = make_trace(ids, a, np.random.default_rng(a.seed))
    blk = 16 * token_bytes
    sys_blocks = sum(len(s) // 16 for s in systems)
    seq_blocks = -(-(a.system[1] + a.user[1] + a.gen[1] + 1) // 16)
    per_seg = block_sizes(blk, page, segment)
    mib = lambda blocks: max(1, -(-blocks // per_seg)) * (segment >> 20)  # noqa: E731
    if cuda:
        a.procs = gpu_procs(a.procs, weights, mib(2 * sys_blocks + 8 * seq_blocks) << 20)
    elif a.procs is None:
        a.procs = 2 if a.tiny else 4
    sizes = {"block": blk, "token": token_bytes, "page": "%dKiB" % (page >> 10),
             "segment": "%dMiB" % (segment >> 20),
             # every prefix cached twice over, and every process's sequence
             "g1_big": mib(2 * sys_blocks + 2 * a.procs * seq_blocks),
             # the running sequences and little else: the prefixes come
             # back from G2 (and G3)
             "g1_small": mib(a.procs * seq_blocks + 1),
             # offload: every process's private copy of every prefix
             # (3/4 of it: a process sees most prompts, not all)
             "g2_offload": mib(a.procs * sys_blocks * 3 // 4 + 1),
             "g2": mib(sys_blocks // 4 + 1), "g3": mib(2 * sys_blocks + 1)}
    print("model: %s; %d CPUs%s" % (source, os.cpu_count(), "" if cuda else
                                    ", OPENBLAS_NUM_THREADS=%s" % os.environ.get(
                                        "OPENBLAS_NUM_THREADS")))
    print("trace: %d requests over %d system prompts (%d-%d tokens, Zipf s=1), user turns "
          "%d-%d tokens, %d-%d generated; %d engine processes; seed %d%s" % (
              a.requests, a.prompts, a.system[0], a.system[1], a.user[0], a.user[1],
              a.gen[0], a.gen[1], a.procs, a.seed,
              "; at most %.0f s per set-up" % a.budget if a.budget else ""))
    print("KV: %s, %d bytes/token, blocks of 16 tokens (%d bytes); G1 %d MiB (offload: %d MiB "
          "+ G2 %d MiB; tiered: %d MiB + G2 %d MiB + G3 %d MiB)%s" % (
              a.kv_dtype, token_bytes, blk, sizes["g1_big"], sizes["g1_small"],
              sizes["g2_offload"], sizes["g1_small"], sizes["g2"], sizes["g3"],
              "; cuda backend" if cuda else ""), flush=True)
    disk = os.environ.get("KVBENCH_DISK_DIR", "/var/tmp")
    if not os.path.isdir(disk):
        disk = tempfile.gettempdir()
    tmp = tempfile.mkdtemp(prefix="kvcached-bench-engine.", dir=disk)
    results = {}
    failed = []
    try:
        print("\n%-8s %9s %9s %9s %8s %6s %9s %10s %10s  %s" % (
            "set-up", "requests", "TTFT p50", "TTFT p99", "tok/s", "hit", "computed",
            "reused", "moved", "tier copies (blocks)"))
        for s in setups:
            left = a.deadline - (time.monotonic() - t_begin)
            if a.deadline and left < 2 * max(a.budget, 20):
                print("%-8s SKIPPED: %.0f s left of --deadline %.0f" % (s, left, a.deadline),
                      flush=True)
                failed.append(s)
                continue
            try:
                r = run_setup(a, model, s, reqs, sizes, tmp)
            except (Exception, SystemExit) as e:  # noqa: BLE001: the next set-up still runs
                print("%-8s FAILED: %s" % (s, e), flush=True)
                failed.append(s)
                continue
            results[s] = r
            mv = ", ".join("%s %d" % kv for kv in r["moved_blocks"].items() if kv[1])
            print("%-8s %4d/%-4d %7.0fms %7.0fms %8.1f %5.0f%% %9d %7.0fMiB %7.0fMiB  %s" % (
                s, r["requests"], r["of"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["tok_s"],
                100 * r["hit_rate"], r["computed"], r["reused_bytes"] / 2**20,
                r["moved_bytes"] / 2**20, mv or "-"), flush=True)
        if "shared" in results and results["shared"]["requests"]:
            sh = results["shared"]
            for base in ("none", "private", "offload", "tiered"):
                if base in results:
                    b = results[base]
                    print("shared vs %-8s TTFT p50 %.2fx lower, p99 %.2fx, tok/s %.2fx" % (
                        base, b["ttft_p50_ms"] / sh["ttft_p50_ms"],
                        b["ttft_p99_ms"] / sh["ttft_p99_ms"], sh["tok_s"] / max(b["tok_s"], 1e-9)))
        print("(start-up of each set-up's daemon and processes, not in the figures: %s)" % (
            ", ".join("%s %.0f s" % (k, v["start_s"]) for k, v in results.items())))
        if a.peer:
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
            json.dump({"args": {k: v for k, v in vars(a).items()}, "model": source,
                       "sizes": sizes, "results": results, "failed": failed}, f, indent=1)
    if failed:
        print("set-ups that failed: %s" % ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
