"""The CPU side of issue 27 (the engine on the GPU), on a real daemon.

    python3 tests/test_engine_gpu_cpu.py random   the seeded random-weight
        models are reproducible: SmolLM2-135M's shape built twice with one
        seed is identical (numpy; and the torch one on torch's CPU when
        torch is importable), another seed differs.
    python3 tests/test_engine_gpu_cpu.py bench    the engine benchmark's CI
        smoke: `bench_engine.py --tiny --model smollm2-135m` (numpy, the
        command the GPU runs with --device cuda) on real daemons, its JSON
        checked: five set-ups, every request served, no hits without
        prefix caching, hits with it, blocks demoted to G2 in offload.
    python3 tests/test_engine_gpu_cpu.py torch    the torch engine on
        torch's CPU against the numpy reference (check_torch.py --device
        cpu, host backend; check 3 in Llama-3.2-3B's KV geometry), with
        this python's torch or the vLLM environment's (scripts/vllm-env
        --path); skips (77) with neither.
    python3 tests/test_engine_gpu_cpu.py prefix   check 3's cached-prefix
        checks alone (check_torch.py --device cpu --only prefix: float64
        verdict, the float32 and bfloat16 attention after a prefix, the
        cached path under other kernels' rounding, as on a GPU) pass, and
        fail with each deliberately wrong prefix (--fault shift, mask,
        blocks); the same torch (this part re-run under its python, which
        imports torch and check_torch.py once and forks each run, see
        tests/forkchild.py); skips (77) without.

Exits 0, 1, or 77 (no numpy; for torch: no torch). Needs KVCACHED_BIN,
KVCTL_BIN and build/python on PYTHONPATH (meson sets them)."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
sys.path.insert(0, EXAMPLES)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

try:
    import numpy as np
    from engine.model import Config, Model
except ImportError as e:
    print("SKIP:", e)
    sys.exit(77)

fails = 0


def check(ok, what):
    global fails
    print("%s %s" % ("ok  " if ok else "FAIL", what), flush=True)
    if not ok:
        fails += 1


def same_weights(a, b) -> bool:
    if not np.array_equal(a.tok_embd, b.tok_embd):
        return False
    return all(np.array_equal(x[k], y[k]) for x, y in zip(a.layers, b.layers) for k in x)


def test_random():
    a = Model.random_model(Config(), seed=7)
    b = Model.random_model(Config(), seed=7)
    check(same_weights(a, b), "SmolLM2-135M's shape, seed 7, built twice: identical weights")
    check(a.name == b.name == "smollm2-135m-random-s7",
          "its pool name carries the seed: %s" % a.name)
    toks = list(range(300, 340))
    from engine.kv import ContiguousKV
    la = a.forward([(0, toks, 0)], ContiguousKV(a.kv_layout()))[0]
    lb = b.forward([(0, toks, 0)], ContiguousKV(b.kv_layout()))[0]
    check(np.array_equal(la, lb), "and identical logits")
    del b
    c = Model.random_model(Config(), seed=8)
    check(not np.array_equal(a.tok_embd, c.tok_embd), "another seed: other weights")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("(no torch here: the torch model's reproducibility is checked where torch is)")
        return
    from engine.torch_model import TorchModel
    t1 = TorchModel.random("llama-3.2-3b", 3, "cpu", "float32", n_layers=1)
    t2 = TorchModel.random("llama-3.2-3b", 3, "cpu", "float32", n_layers=1)
    check(torch.equal(t1.tok_embd, t2.tok_embd) and all(
        torch.equal(x[k], y[k]) for x, y in zip(t1.layers, t2.layers) for k in x),
        "torch: Llama-3.2-3B's shape (1 layer), seed 3, built twice: identical weights")


def test_bench():
    with tempfile.TemporaryDirectory() as d:
        js = os.path.join(d, "bench.json")
        cmd = [sys.executable, os.path.join(EXAMPLES, "engine", "bench_engine.py"), "--tiny",
               "--model", "smollm2-135m", "--kvcached", os.environ["KVCACHED_BIN"],
               "--kvctl", os.environ["KVCTL_BIN"], "--json", js]
        env = dict(os.environ, KVBENCH_DISK_DIR=d)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        print(r.stdout[-3000:], r.stderr[-3000:])
        check(r.returncode == 0, "bench_engine.py --tiny exits 0 (%d)" % r.returncode)
        if r.returncode:
            return
        res = json.load(open(js))["results"]
        setups = ["none", "private", "offload", "shared", "tiered"]
        check(all(s in res for s in setups), "all five set-ups ran: %s" % ", ".join(res))
        check(all(res[s]["requests"] == res[s]["of"] == 8 for s in setups),
              "every set-up served all 8 requests")
        check(res["none"]["hit_rate"] == 0, "none: no prefix hits")
        check(all(res[s]["hit_rate"] > 0 for s in setups[1:]), "every cache finds prefixes")
        check(res["offload"]["moved_blocks"]["G1->G2"] > 0,
              "offload: private prefixes went to G2 (%s)" % res["offload"]["moved_blocks"])
        check(all("TTFT" in r.stdout and s in r.stdout for s in setups), "the table is printed")


def torch_python():
    """A python with torch and numpy: this one, else the vLLM environment's
    (scripts/vllm-env --path: vLLM brings torch, a CUDA build that runs on
    the CPU too), else None."""
    try:
        import torch  # noqa: F401
        return sys.executable
    except ImportError:
        pass
    src = os.environ.get("MESON_SOURCE_ROOT") or os.path.dirname(HERE)
    try:
        r = subprocess.run([os.path.join(src, "scripts", "vllm-env"), "--path"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    py = r.stdout.strip()
    if r.returncode or not py:
        return None
    # Installed (not imported: that is 2.5 s of CPU, paid again by the check).
    ok = subprocess.run([py, "-c", "import importlib.util as u, sys; sys.exit(not all("
                         "u.find_spec(m) for m in ('torch', 'numpy')))"],
                        capture_output=True, timeout=60)
    return py if ok.returncode == 0 else None


def test_torch():
    py = torch_python()
    if py is None:
        print("SKIP: no python with torch here, nor a complete scripts/vllm-env (the GPU "
              "machines have torch; scripts/gpu-check runs this with --device cuda)")
        sys.exit(77)
    print("torch from", py)
    # check 3 with Llama-3.2-3B's shape: on a CPU its KV geometry (28 layers,
    # 8 KV heads of 128: blocks of 1.75 MiB, runs of 7 pages of 2 MiB, the
    # blocks crossing pages) around a narrow model, light on a CI machine
    cmd = [py, os.path.join(EXAMPLES, "engine", "check_torch.py"), "--device", "cpu",
           "--kvcached", os.environ["KVCACHED_BIN"], "--kvctl", os.environ["KVCTL_BIN"],
           "--shape", "llama-3.2-3b"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(r.stdout[-5000:], r.stderr[-3000:])
    check(r.returncode == 0, "check_torch.py --device cpu exits 0 (%d)" % r.returncode)


def check_torch_module():
    """examples/engine/check_torch.py, imported (once)."""
    import importlib.util
    m = sys.modules.get("check_torch")
    if m is None:
        spec = importlib.util.spec_from_file_location(
            "check_torch", os.path.join(EXAMPLES, "engine", "check_torch.py"))
        m = importlib.util.module_from_spec(spec)
        sys.modules["check_torch"] = m
        spec.loader.exec_module(m)
    return m


def check_torch(*argv):
    """A `check` child: check_torch.py's main(ARGV) (imported by the process
    it is forked from, tests/forkchild.py), its status the exit."""
    sys.exit(check_torch_module().main(list(argv)))


ROLES = {"check": check_torch}


def test_prefix():
    py = torch_python()
    if py is None:
        print("SKIP: no python with torch here, nor a complete scripts/vllm-env")
        sys.exit(77)
    if py != sys.executable:
        # This part under the python with torch, which imports torch and
        # check_torch.py once; each run below is a process of its own,
        # forked from it.
        sys.stdout.flush()
        os.execv(py, [py, os.path.abspath(__file__), "prefix"])
    print("torch from", py)
    import forkchild
    check_torch_module()
    forkchild.set_roles(ROLES)
    base = ["--device", "cpu", "--kvcached", os.environ["KVCACHED_BIN"],
            "--kvctl", os.environ["KVCTL_BIN"], "--shape", "llama-3.2-3b", "--only", "prefix"]
    # what each wrong prefix must fail: the float64 comparison of the model,
    # and for the mask also the attention alone (float32 and bfloat16)
    for fault, fails_expected in ((None, 0), ("shift", 1), ("blocks", 1), ("mask", 3)):
        c = forkchild.start_child(__file__, ["check"] + base + (["--fault", fault] if fault
                                                                 else []))
        rc, out, err = c.finish(600)
        print(out[-3000:], err[-2000:] if rc not in (0, 1) else "")
        failed = [ln for ln in out.splitlines() if ln.startswith("FAIL 3 ")]
        passed = [ln for ln in out.splitlines() if ln.startswith("PASS 3 ")]
        if fault is None:
            check(rc == 0 and len(passed) == 3 and not failed,
                  "the right prefix: 3 checks pass, exit 0 (%s)" % rc)
            continue
        model = [ln for ln in failed if "cached prefix vs computing it" in ln]
        check(rc == 1 and len(failed) == fails_expected and len(model) == 1,
              "--fault %s: exit 1 (%s), %d failed check(s) of 3 (%d), the float64 comparison "
              "among them" % (fault, rc, fails_expected, len(failed)))


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        import forkchild
        return forkchild.run_role(sys.argv[2:], ROLES)
    what = sys.argv[1] if len(sys.argv) > 1 else "random"
    {"random": test_random, "bench": test_bench, "torch": test_torch,
     "prefix": test_prefix}[what]()
    print("%d failed" % fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
