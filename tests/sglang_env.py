"""Runs a test under the SGLang 0.5.23 virtual environment that
scripts/sglang-env makes, so that it checks kvcache.sglang against SGLang's
own installed code, never a copy of it. reexec() is called first: outside the
environment it starts the same script again with the environment's python, or
exits 77 saying why it cannot (the environment is made by
`scripts/sglang-env`, which CI runs)."""
import os
import subprocess
import sys

SRC = os.environ.get("MESON_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def reexec():
    if os.environ.get("KVT_IN_SGLANG_ENV") == "1":
        return
    tool = os.path.join(SRC, "scripts", "sglang-env")
    try:
        p = subprocess.run([tool, "--path"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        print("SKIP: %s: %s" % (tool, e))
        sys.exit(77)
    py = p.stdout.strip()
    if p.returncode != 0 or not py:
        print("SKIP: no SGLang environment (run scripts/sglang-env to make it: sglang==0.5.23 "
              "from PyPI, about 11 GiB)")
        sys.exit(77)
    os.environ["KVT_IN_SGLANG_ENV"] = "1"
    # SGLang imports without a GPU; keep it on the CPU, its threads few and
    # its JIT-built helpers in a cache of their own.
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("SGLANG_LOGGING_LEVEL", "WARNING")
    sys.stdout.flush()
    os.execv(py, [py, os.path.abspath(sys.argv[0])] + sys.argv[1:])
