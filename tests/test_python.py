"""The Python binding (python/kvcache) against a real kvcached: pytest.

Each test starts its own daemon on private sockets (tests/kvt.py). A second
process (a real python3 child) reads what the first sealed, through its own
connection and mapping. Run through meson (`meson test -C build python`),
which puts build/python first on PYTHONPATH and runs this file: it exits 77
when the binding was not built (or pytest or numpy is missing), else runs
pytest on itself."""
import ctypes
import json
import os
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvt  # noqa: E402

try:
    import pytest
    import numpy as np
    import kvcache
except ImportError as e:  # not built (meson -Dpython=disabled), or no pytest/numpy
    print("SKIP:", e)
    sys.exit(77)

SHAPE = (2, 2, 4, 16, 32)  # layers, K/V, kv heads, tokens, head dim: fp16 -> 16 KiB
BLOCK = int(np.prod(SHAPE)) * 2


@pytest.fixture
def daemon():
    if not kvt.BIN:
        pytest.skip("KVCACHED_BIN not set (run through meson test)")
    d = kvt.Daemon(kvt.tmpdir(), "--pool-size", "4MiB", "--segment-size", "1MiB", "--page-size", "64KiB",
                   "--host-tier-size", "2MiB")
    yield d
    d.kill()


def pool_of(c):
    return c.register_pool("py/tiny", block_bytes=BLOCK, block_tokens=16, dtype="fp16",
                           layout=b'{"shape":[2,2,4,16,32]}', shape=SHAPE, model="tiny")


def test_connect_is_a_context_manager(daemon):
    with kvcache.connect(daemon.sock, client_name="pytest") as c:
        assert not c.closed and c.restarts == 0
    assert c.closed
    with pytest.raises(kvcache.KvError) as e:
        c.alloc(0, 1)
    assert e.value.name == "EBADF"


def test_connect_refused_is_a_kverror(tmp_path):
    with pytest.raises(kvcache.KvError) as e:
        kvcache.connect(str(tmp_path / "nobody.sock"))
    assert e.value.code < 0


def test_seal_in_one_process_read_in_another(daemon):
    tokens = list(range(1000, 1000 + 3 * 16))
    chain = kvcache.hash_chain(tokens, 16)
    assert len(chain) == 3
    with kvcache.connect(daemon.sock) as c:
        pool = pool_of(c)
        blocks = c.alloc(pool, 3)
        for i, b in enumerate(blocks):
            v = c.view(pool, b)
            assert v.shape == SHAPE and v.dtype == np.float16
            v[...] = np.arange(v.size, dtype=np.float32).reshape(SHAPE) * 0.5 + i
        sealed = c.seal(pool, blocks, chain, token_ids=tokens)
        assert sealed == blocks
        c.release(sealed)
        # Another process: its own connection, its own mapping.
        child = textwrap.dedent(f"""
            import kvcache, numpy as np, sys
            c = kvcache.connect({daemon.sock!r})
            pool = c.register_pool("py/tiny", block_bytes={BLOCK}, block_tokens=16,
                                   dtype="fp16", layout=b'{{"shape":[2,2,4,16,32]}}',
                                   shape={SHAPE})
            chain = kvcache.hash_chain(list(range(1000, 1048)), 16)
            hit = c.lookup(pool, chain)
            assert len(hit) == 3, hit
            for i, b in enumerate(hit):
                want = np.arange(int(np.prod({SHAPE})), dtype=np.float32).reshape({SHAPE}) * 0.5 + i
                assert np.array_equal(c.view(pool, b), want.astype(np.float16)), i
            c.release(hit)
            print("child ok")
            """)
        r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "child ok" in r.stdout


def test_view_is_zero_copy_and_keeps_the_connection(daemon):
    c = kvcache.connect(daemon.sock)
    pool = pool_of(c)
    b = c.alloc(pool, 1)[0]
    v = c.view(pool, b)
    raw = c.buffer(pool, b)
    v[0, 0, 0, 0, 0] = 3.0
    assert np.frombuffer(raw, dtype=np.float16)[0] == 3.0
    assert v.ctypes.data == c.block_ptr(b)
    del c  # the view holds the connection: its mapping stays
    v[1, 1, 3, 15, 31] = 7.0
    assert v[1, 1, 3, 15, 31] == 7.0


def test_fork_cow_release_and_stale_handles(daemon):
    with kvcache.connect(daemon.sock) as c:
        pool = pool_of(c)
        (b,) = c.alloc(pool, 1)
        c.view(pool, b)[...] = 1.0
        (f,) = c.fork([b])
        assert f == b
        # Two references: cow gives a copy and drops one of them.
        (w,) = c.cow([b])
        assert w != b
        assert np.all(c.view(pool, w) == 1.0)
        c.release([b])      # the last reference on b: freed (never sealed)
        with pytest.raises(kvcache.KvError) as e:
            c.release([b])
        assert e.value.code == kvcache.ESTALE and e.value.name == "KV_ESTALE"
        c.release([w])


def test_full_pool_is_enospc(daemon):
    with kvcache.connect(daemon.sock) as c:
        pool = pool_of(c)
        held = []
        with pytest.raises(kvcache.KvError) as e:
            while True:
                held += c.alloc(pool, 8)
        assert e.value.code == kvcache.ENOSPC
        assert "pool" in str(e.value)
        assert len(held) > 0
        c.release(held)
        c.release(c.alloc(pool, 8))  # room again


def test_bad_arguments(daemon):
    with kvcache.connect(daemon.sock) as c:
        with pytest.raises(kvcache.KvError) as e:
            c.register_pool("bad", block_bytes=100, block_tokens=16)
        assert e.value.code == kvcache.EINVAL
        pool = pool_of(c)
        with pytest.raises(kvcache.KvError) as e:
            c.register_pool("py/tiny", block_bytes=BLOCK * 2, block_tokens=16, dtype="fp16")
        assert e.value.code == kvcache.EEXIST
        with pytest.raises(ValueError):
            c.seal(pool, c.alloc(pool, 1), [])
        with pytest.raises(ValueError):
            c.register_pool("py/shape", block_bytes=BLOCK, block_tokens=16, dtype="fp16",
                            shape=(3, 3))


def test_swap_out_and_in(daemon):
    with kvcache.connect(daemon.sock) as c:
        pool = pool_of(c)
        blocks = c.alloc(pool, 4)
        for i, b in enumerate(blocks):
            c.view(pool, b)[...] = i + 0.25
        sw = c.swap_out(blocks)
        back = c.swap_in(sw, 4)
        assert len(back) == 4
        for i, b in enumerate(back):
            assert np.all(c.view(pool, b) == i + 0.25)
        c.release(back)


def test_hash_helpers():
    tokens = list(range(50))
    chain = kvcache.hash_chain(tokens, 16)
    assert len(chain) == 3
    parent = None
    for i, h in enumerate(chain):
        parent = kvcache.hash_block(tokens[16 * i:16 * (i + 1)], parent)
        assert parent == h
    assert kvcache.hash_block(tokens[:16]) == kvcache.hash_block(tokens[:16], kvcache.hash_seed())
    # Salts and LoRA ids separate caches; numpy token arrays hash the same.
    assert kvcache.hash_chain(tokens, 16, salt=b"a") != kvcache.hash_chain(tokens, 16, salt=b"b")
    assert kvcache.hash_chain(tokens, 16, lora_id=3) != chain
    assert kvcache.hash_chain(np.array(tokens, dtype=np.int64), 16) == chain
    x = kvcache.hash_chain(tokens, 16, algo="xxh3")
    assert x != chain and all(h[16:] == bytes(16) for h in x)
    # vLLM's: the chain is the blocks hashed one after another from the seed.
    v = kvcache.vllm_chain(tokens, 16, pythonhashseed="0", cache_salt="s")
    parent = kvcache.vllm_seed("0")
    for i, h in enumerate(v):
        parent = kvcache.vllm_block(parent, tokens[16 * i:16 * (i + 1)], first=i == 0,
                                    cache_salt="s")
        assert parent == h


def test_vllm_hash_against_cbor2_reference():
    cbor2 = pytest.importorskip("cbor2")
    import hashlib

    def sha256_cbor(obj):
        return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()

    none_hash = sha256_cbor("0")
    assert kvcache.vllm_seed("0") == none_hash
    tokens = list(range(7, 39))
    h0 = sha256_cbor((none_hash, tuple(tokens[:16]), None))
    h1 = sha256_cbor((h0, tuple(tokens[16:]), None))
    assert kvcache.vllm_chain(tokens, 16, "0") == [h0, h1]


def test_strerror_and_constants():
    assert "pool" in kvcache.strerror(kvcache.ENOSPC).lower() or kvcache.strerror(kvcache.ENOSPC)
    e = kvcache.KvError(kvcache.EQUOTA, "namespace 'a' is at its quota")
    assert e.code == -1018 and e.name == "KV_EQUOTA" and "quota" in str(e)


def test_meson_install_imports(tmp_path):
    """`meson install` puts the package into python3's site-packages and
    libkvcache into libdir; the installed copy imports and hashes."""
    build = os.environ.get("KVT_BUILD_ROOT")
    if not build:
        pytest.skip("KVT_BUILD_ROOT not set")
    dest = tmp_path / "root"
    r = subprocess.run(["meson", "install", "-C", build, "--destdir", str(dest), "--no-rebuild",
                        "--quiet"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    inits = list(dest.rglob("kvcache/__init__.py"))
    libs = list(dest.rglob("libkvcache.so.0"))
    assert len(inits) == 1 and len(libs) == 1, (inits, libs)
    paths = (inits[0].parent / "_paths.py").read_text()
    # The installed copy names the installed library (here under destdir).
    assert str(libs[0]).endswith(paths.split('"')[1]), paths
    env = dict(os.environ, PYTHONPATH=str(inits[0].parent.parent), KVCACHE_LIB=str(libs[0]))
    r = subprocess.run([sys.executable, "-c",
                        "import kvcache; print(kvcache.__file__); print(len(kvcache.hash_seed()))"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert str(dest) in r.stdout and r.stdout.strip().endswith("32")


if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", __file__]))


def _stopped(pid, stopped=True):
    """Whether /proc says process (or thread) pid is stopped (state T)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return (f.read().rsplit(")", 1)[1].split()[0] == "T") == stopped
    except OSError:
        return False


def _in_poll(tid):
    """Whether thread tid of this process is in poll() (x86-64: 7, ppoll
    271; aarch64: ppoll 73): where a call waits for the daemon."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            nr = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return nr in ((7, 271) if os.uname().machine == "x86_64" else (73,))


def _held(d):
    """Blocks held (writable or sealed with references) over every pool."""
    r = d.kvctl("-o", "json", "pools")
    assert r.returncode == 0, r.stderr
    return sum(p["blocks_writable"] + p["blocks_sealed"] for p in json.loads(r.stdout)["pools"])


def test_timeout_on_a_stopped_daemon(daemon):
    """Deadlines (client/kvcache.h): with the daemon stopped (SIGSTOP) each
    call raises KvError(ETIMEDOUT) past its deadline instead of hanging,
    connect() too, and a second thread waiting for the first's call on the
    same connection; after SIGCONT the next call reconnects and works, and
    nothing is left held."""
    import errno
    import signal
    import threading
    import time
    assert kvcache.ETIMEDOUT == -errno.ETIMEDOUT
    tmo = 300
    chain = kvcache.hash_chain(list(range(64)), 16)
    with kvcache.connect(daemon.sock) as c:
        pool = pool_of(c)
        c.release(c.seal(pool, c.alloc(pool, 4), chain))
    conns = [kvcache.connect(daemon.sock, client_name=f"t{i}", timeout_ms=tmo)
             for i in range(3)]
    assert all(x.timeout_ms == tmo for x in conns)
    ca, cl, cr = conns
    pools = [pool_of(x) for x in conns]
    held = cr.alloc(pools[2], 2)
    ct = kvcache.connect(daemon.sock, "", "threads")     # the default deadline
    assert ct.timeout_ms is None
    tpool = pool_of(ct)
    with pytest.raises(TypeError):
        ct.set_timeout(1.5)

    daemon.signal(signal.SIGSTOP)
    try:
        assert kvt.wait_for(lambda: _stopped(daemon.proc.pid), timeout=60)

        def timed_out(fn, *args):
            t0 = time.monotonic()
            with pytest.raises(kvcache.KvError) as e:
                fn(*args)
            dt = time.monotonic() - t0
            assert e.value.code == kvcache.ETIMEDOUT and e.value.name == "ETIMEDOUT", e.value
            assert tmo / 1000 - 0.01 <= dt < 30, dt   # no sooner than the deadline; returns
            return e.value

        e = timed_out(kvcache.connect, daemon.sock, None, "late", None, tmo)
        assert e.call == "connect"
        assert "deadline" in str(timed_out(ca.alloc, pools[0], 1))
        timed_out(cl.lookup, pools[1], chain)
        timed_out(cr.release, held)

        # Two threads on ct: the first's call waits for the daemon (60 s);
        # the second, with a short deadline set meanwhile, waits for the
        # first's and gives up at its own deadline.
        ct.set_timeout(60000)
        first = {}

        def alloc():
            first["tid"] = threading.get_native_id()
            try:
                first["blocks"] = ct.alloc(tpool, 1)
            except kvcache.KvError as x:
                first["error"] = x

        th = threading.Thread(target=alloc)
        th.start()
        assert kvt.wait_for(lambda: "tid" in first and _in_poll(first["tid"]), timeout=60)
        ct.set_timeout(tmo)
        assert ct.timeout_ms == tmo
        e = timed_out(ct.lookup, tpool, chain)
        assert "another thread" in str(e)
        assert th.is_alive()
        t0 = time.monotonic()
        ca.close()                       # never waits for the daemon
        assert time.monotonic() - t0 < 30
    finally:
        daemon.signal(signal.SIGCONT)
    assert kvt.wait_for(lambda: _stopped(daemon.proc.pid, False), timeout=60)
    # The first thread's call is answered: the second left the connection alone.
    th.join(60)
    assert not th.is_alive() and "error" not in first, first
    ct.release(first["blocks"])
    assert ct.restarts == 0
    # What the dropped connections held is released; each reconnects.
    assert kvt.wait_for(lambda: _held(daemon) == 0, timeout=60)
    hit = cl.lookup(pools[1], chain)
    assert len(hit) == 4 and cl.restarts == 1
    cl.release(hit)
    with pytest.raises(kvcache.KvError) as e:
        cr.release(held)                 # handles from before the drop are stale
    assert e.value.code == kvcache.ESTALE and cr.restarts == 1
    for x in (cl, cr, ct):
        x.close()
    assert kvt.wait_for(lambda: _held(daemon) == 0, timeout=60)


def test_lookup_tiers(daemon):
    """lookup(tiers=True) says where each block came from: G1, or G2 for one
    promoted from the host tier for this lookup."""
    chain = kvcache.hash_chain(list(range(500, 548)), 16)
    with kvcache.connect(daemon.sock) as c:
        pool = pool_of(c)

        def put(i, j):
            blocks = c.alloc(pool, j - i)
            for k, b in enumerate(blocks):
                c.view(pool, b)[...] = i + k + 0.5
            c.release(c.seal(pool, blocks, chain[i:j]))

        put(2, 3)
        r = daemon.kvctl("evict", "--all", "--tier", "g1")
        assert r.returncode == 0, r.stderr
        daemon.wait_tiers_idle()
        put(0, 2)
        blocks, tiers = c.lookup(pool, chain, tiers=True)
        assert tiers == [kvcache.TIER_G1, kvcache.TIER_G1, kvcache.TIER_G2], tiers
        for k, b in enumerate(blocks):
            assert np.all(c.view(pool, b) == k + 0.5)
        c.release(blocks)
        blocks, tiers = c.lookup(pool, chain, tiers=True)
        assert tiers == [kvcache.TIER_G1] * 3
        c.release(blocks)
        assert c.lookup(pool, [], tiers=True) == ([], [])
        blocks = c.lookup(pool, chain)
        assert len(blocks) == 3
        c.release(blocks)


def test_lookup_many(daemon):
    """lookup_many(): several chains in one call answer what lookup() of
    each does (blocks, tiers, a reference each); an empty chain, other
    forms of hashes, and bad hashes refused with lookup()'s message before
    anything is sent; a refused lookup (max_block_refs is not lowered here,
    so a pool that does not exist) raises and holds nothing."""
    chain = kvcache.hash_chain(list(range(900, 1028)), 16)     # 8 blocks
    other = kvcache.hash_chain(list(range(2000, 2064)), 16)
    with kvcache.connect(daemon.sock) as c:
        pool = pool_of(c)
        c.release(c.seal(pool, c.alloc(pool, 5), chain[:5]))
        chains = [chain, [], chain[:2], other, chain[:5] + other, iter(chain[:1])]
        got = c.lookup_many(pool, chains)
        assert [len(x) for x in got] == [5, 0, 2, 0, 5, 1]
        for blocks, ch in zip(got, chains[:5]):
            assert blocks == c.lookup(pool, ch)[:len(blocks)]
            c.release(blocks)
            c.release(blocks)
        c.release(got[5])
        got = c.lookup_many(pool, [chain, [bytearray(h) for h in chain[:3]],
                                   [list(h) for h in chain[:2]]], tiers=True)
        assert [len(b) for b, _ in got] == [5, 3, 2]
        assert all(t == [kvcache.TIER_G1] * len(b) for b, t in got)
        for b, _ in got:
            c.release(b)
        assert c.lookup_many(pool, []) == []
        # Chains as their hashes concatenated (what the vLLM connector passes).
        got = c.lookup_many(pool, [b"".join(chain), b"", b"".join(chain[:3]), chain[:4]])
        assert [len(x) for x in got] == [5, 0, 3, 4]
        for b in got:
            c.release(b)
        with pytest.raises(ValueError, match="not a multiple of 32"):
            c.lookup_many(pool, [b"".join(chain)[:-1]])
        with pytest.raises(ValueError, match="hash 1: 31 bytes"):
            c.lookup_many(pool, [chain[:2], [chain[0], chain[1][:31], chain[2] + b"x"]])
        with pytest.raises(kvcache.KvError) as e:
            c.lookup_many(4000, [chain, chain])
        assert e.value.code == kvcache.ENOENT
        assert c.lookup_many(pool, [chain[:1]]) == [c.lookup(pool, chain[:1])]
    assert kvt.wait_for(lambda: _held(daemon) == 0, timeout=60)


def test_hash_arguments_copied_whole(daemon):
    """A chain's hashes go to the library in one copy: every one is checked
    (a 31- and a 33-byte hash make 64 bytes, and are still refused, naming
    the first), and bytes, bytearray, memoryview and 32 ints find the same
    blocks."""
    chain = kvcache.hash_chain(list(range(700, 748)), 16)
    with kvcache.connect(daemon.sock) as c:
        pool = pool_of(c)
        with pytest.raises(ValueError, match="hash 1: 31 bytes"):
            c.lookup(pool, [chain[0], chain[1][:31], chain[2] + b"x"])
        with pytest.raises(ValueError, match="hash 0: 33 bytes"):
            c.lookup(pool, (h for h in [chain[0] + b"x", chain[1][:31]]))
        with pytest.raises(ValueError):
            c.seal(pool, c.alloc(pool, 2), [chain[0][:31], chain[1] + b"x"])
        c.release(c.seal(pool, c.alloc(pool, 3), chain))
        for form in (list(chain), tuple(chain), [bytearray(h) for h in chain],
                     [memoryview(h) for h in chain], [list(h) for h in chain],
                     iter(chain)):
            blocks = c.lookup(pool, form)
            assert len(blocks) == 3, type(form)
            c.release(blocks)
