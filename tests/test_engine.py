"""The reference engine (examples/engine/engine.py) on a real kvcached with
the real SmolLM2-135M-Instruct (issue 12): pytest.

Greedy tokens must be identical, and logits within a tight tolerance, between
  (a) the model with a plain contiguous KV cache and no kvcached at all,
  (b) the engine computing everything,
  (c) the engine reusing a prefix another process computed and sealed,
  (d) the same after that prefix was demoted to G2, then written to G3 and
      dropped from G1 and G2, and promoted back,
  (e) sequences preempted (swap, and recompute) and resumed,
  (f) n parallel samples that share their prompt's blocks (the handles and
      the daemon's block count prove the sharing);
and a process with another cache salt reuses nothing.

Needs the model (scripts/fetch-model): exits 77 without it (or without
pytest, numpy or the binding), else runs pytest on itself. Run through meson
(`meson test -C build engine`), which puts build/python on PYTHONPATH."""
import json
import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import kvt  # noqa: E402

try:
    import pytest
    import kvcache  # noqa: F401
    import numpy as np
    from engine import model as model_mod
    from engine.engine import Engine
except ImportError as e:
    print("SKIP:", e)
    sys.exit(77)
if not os.path.exists(model_mod.model_path() or ""):
    print("SKIP: no model file (scripts/fetch-model)")
    sys.exit(77)

PROMPT = ("The capital of France is Paris. The capital of Germany is Berlin. "
          "The capital of Spain is Madrid. The capital of Italy is")
OTHERS = ["Once upon a time, in a small village by the sea, there lived an old fisherman who",
          "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:"]
NEW = 8
# Logits: float16 KV in both (the same rounding), so only the order of
# float32 sums differs.
ATOL = 2e-2


@pytest.fixture(scope="module")
def model():
    return model_mod.Model.load(allow_random=False)


@pytest.fixture(scope="module")
def reference(model):
    """(a): the plain contiguous implementation, no kvcached."""
    out = {}
    for p in [PROMPT] + OTHERS:
        out[p] = model_mod.generate(model, p, NEW, keep_logits=True, stop_at_eog=False)
    return out


def start_daemon(*args):
    if not kvt.BIN:
        pytest.skip("KVCACHED_BIN not set (run through meson test)")
    return kvt.Daemon(kvt.tmpdir(), "--segment-size", "4MiB", "--page-size", "64KiB", *args)


@pytest.fixture
def daemon():
    d = start_daemon("--pool-size", "64MiB")
    yield d
    d.kill()


def same(out, ref):
    assert out.tokens == ref.tokens, (out.text, ref.text)
    assert len(out.logits) == len(ref.logits)
    for a, b in zip(out.logits, ref.logits):
        assert np.max(np.abs(a - b)) < ATOL


def other_process(sock, prompt, salt=None):
    """Another engine process: generates for prompt, seals its blocks, exits."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.join(os.path.dirname(HERE), 'examples')!r})
        from engine.model import Model
        from engine.engine import Engine
        with Engine(Model.load(allow_random=False), {sock!r}, salt={salt!r}) as e:
            (o,) = e.generate([{prompt!r}], {NEW}, stop_at_eog=False)
        print("hit", o.hit_tokens, "computed", o.computed_tokens)
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def tiers_of(d, hashes):
    """hash -> the tiers that hold it (kvctl dump)."""
    r = d.kvctl("-o", "json", "dump")
    assert r.returncode == 0, r.stderr
    where = {h: set() for h in hashes}
    for e in json.loads(r.stdout):
        if e["hash"] in where:
            where[e["hash"]].add(e["tier"])
    return where


def settled(d):
    """Waits until no tier copy or disk I/O is in flight: an Evict starts
    the copies and returns (on a busy machine a G1 -> G2 copy may still run
    when the next Evict looks at G2)."""
    def idle():
        r = d.kvctl("-o", "json", "status")
        assert r.returncode == 0, r.stderr
        return all(t["inflight"] == 0 for t in json.loads(r.stdout)["tiers"])
    assert kvt.wait_for(idle, 60), "tier copies still in flight after 60 s"


def full_blocks(model, prompt):
    n = len(model.tok.encode(prompt))
    return (n - 1) // 16 * 16


def test_b_engine_computes_everything(model, reference, daemon):
    with Engine(model, daemon.sock) as e:
        outs = e.generate([PROMPT] + OTHERS, NEW, keep_logits=True, stop_at_eog=False)
    for o, p in zip(outs, [PROMPT] + OTHERS):
        assert o.hit_tokens == 0
        same(o, reference[p])


def test_c_prefix_from_another_process(model, reference, daemon):
    print(other_process(daemon.sock, PROMPT))
    with Engine(model, daemon.sock) as e:
        (o,) = e.generate([PROMPT], NEW, keep_logits=True, stop_at_eog=False)
    assert o.hit_tokens == full_blocks(model, PROMPT) > 0
    same(o, reference[PROMPT])


def test_d_prefix_back_from_g2_and_g3(model, reference):
    d = kvt.Daemon(kvt.tmpdir(), "--segment-size", "4MiB", "--page-size", "64KiB",
                   "--pool-size", "64MiB", "--host-tier-size", "32MiB")
    try:
        other_process(d.sock, PROMPT)
        # G1 -> G2: every cached block demoted.
        r = d.kvctl("evict", "--tier", "g1", "--all")
        assert r.returncode == 0, r.stderr
        settled(d)
        with Engine(model, d.sock) as e:
            (o,) = e.generate([PROMPT], NEW, keep_logits=True, stop_at_eog=False)
        assert o.hit_tokens == full_blocks(model, PROMPT)
        same(o, reference[PROMPT])
    finally:
        d.kill()
    disk = kvt.tmpdir()
    d = kvt.Daemon(kvt.tmpdir(), "--segment-size", "4MiB", "--page-size", "64KiB",
                   "--pool-size", "64MiB", "--host-tier-size", "32MiB",
                   "--disk-path", os.path.join(disk, "g3"), "--disk-size", "64MiB")
    try:
        other_process(d.sock, PROMPT)
        # G1 -> G2, then G2 -> G3 (written, then dropped from G2): on disk only.
        for tier in ("g1", "g2"):
            r = d.kvctl("evict", "--tier", tier, "--all")
            assert r.returncode == 0, r.stderr
            settled(d)
        chain = [h.hex() for h in kvcache.hash_chain(model.tok.encode(PROMPT), 16)]
        where = tiers_of(d, chain)
        assert all(where[h] == {"G3"} for h in chain), where
        with Engine(model, d.sock) as e:
            (o,) = e.generate([PROMPT], NEW, keep_logits=True, stop_at_eog=False)
        assert o.hit_tokens == full_blocks(model, PROMPT)
        same(o, reference[PROMPT])
        where = tiers_of(d, chain)
        assert all("G1" in where[h] for h in chain), where
    finally:
        d.kill()


@pytest.mark.parametrize("policy", ["swap", "recompute"])
def test_e_preempted_and_resumed(model, reference, policy):
    # 4 blocks of 360 KiB (two per 1 MiB segment); each sequence needs 2
    # (at most 32 tokens): two of the three fit at a time, so the third runs
    # only after preemptions.
    d = kvt.Daemon(kvt.tmpdir(), "--pool-size", "2MiB", "--segment-size", "1MiB",
                   "--page-size", "4KiB", "--host-tier-size", "8MiB")
    try:
        with Engine(model, d.sock, preempt=policy, max_batch=3) as e:
            outs = e.generate([PROMPT] + OTHERS, NEW, keep_logits=True, stop_at_eog=False)
            pre = e.stats["preemptions"]
        assert pre > 0, "the pool was meant to be too small for all three"
        for o, p in zip(outs, [PROMPT] + OTHERS):
            same(o, reference[p])
    finally:
        d.kill()


def test_f_parallel_samples_share_prompt_blocks(model, reference, daemon):
    seen = []

    def on_step(e):
        tables = list(e.kv.tables.values())
        held = [h for t in tables for h in t]
        seen.append((len(tables), len(held), len(set(held))))

    with Engine(model, daemon.sock) as e:
        outs = e.generate([PROMPT], NEW, n=4, keep_logits=True, stop_at_eog=False,
                          on_step=on_step)
        status = json.loads(daemon.kvctl("-o", "json", "status").stdout)
    assert len(outs) == 4
    for o in outs:
        same(o, reference[PROMPT])   # greedy: every sample is the reference
    full = full_blocks(model, PROMPT) // 16
    tables, held, distinct = seen[0]
    assert tables == 4
    # Each table: the prompt's full blocks (shared) and its own last block.
    assert distinct == full + 4 and held == 4 * (full + 1), seen[0]
    print("status after:", json.dumps(status)[:300])


def test_other_salt_reuses_nothing(model, reference, daemon):
    print(other_process(daemon.sock, PROMPT, salt="tenant-a"))
    out = other_process(daemon.sock, PROMPT, salt="tenant-b")
    assert out.startswith("hit 0 "), out
    out = other_process(daemon.sock, PROMPT, salt="tenant-a")
    assert out.startswith(f"hit {full_blocks(model, PROMPT)} "), out


if __name__ == "__main__":
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", __file__]))
