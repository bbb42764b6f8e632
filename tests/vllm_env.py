"""Runs a test under the vLLM 0.33.0 virtual environment that scripts/vllm-env
makes, so that it checks kvcached against vLLM's own installed code, never a
copy of it. reexec() is called first: outside the environment it starts the
same script again with the environment's python, or exits 77 saying why it
cannot (the environment is made by `scripts/vllm-env`, which CI runs)."""
import os
import subprocess
import sys

SRC = os.environ.get("MESON_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def reexec():
    if os.environ.get("KVT_IN_VLLM_ENV") == "1":
        return
    tool = os.path.join(SRC, "scripts", "vllm-env")
    try:
        p = subprocess.run([tool, "--path"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        print("SKIP: %s: %s" % (tool, e))
        sys.exit(77)
    py = p.stdout.strip()
    if p.returncode != 0 or not py:
        print("SKIP: no vLLM environment (run scripts/vllm-env to make it: vllm==0.33.0 "
              "from PyPI, about 9 GiB)")
        sys.exit(77)
    os.environ["KVT_IN_VLLM_ENV"] = "1"
    # vLLM imports without a GPU; keep its start quiet and on the CPU.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    sys.stdout.flush()
    os.execv(py, [py, os.path.abspath(sys.argv[0])] + sys.argv[1:])
