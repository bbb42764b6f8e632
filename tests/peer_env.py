"""Runs a test under one of the reused virtual environments that a script of
ours makes (scripts/vllm-env, scripts/sglang-env), so that it checks kvcached
against the other project's own installed code, never a copy of it.
tests/vllm_env.py and tests/sglang_env.py name the environment; their
reexec() is called first."""
import os
import subprocess
import sys

SRC = os.environ.get("MESON_SOURCE_ROOT",
                     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def reexec(script: str, flag: str, missing: str, env: dict) -> None:
    """Outside the environment: starts the same script again with the
    python that `scripts/SCRIPT --path` names, with flag=1 and env's
    defaults set; or exits 77 printing missing (the environment is not
    made). Inside it (flag is 1): returns."""
    if os.environ.get(flag) == "1":
        return
    tool = os.path.join(SRC, "scripts", script)
    try:
        p = subprocess.run([tool, "--path"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        print("SKIP: %s: %s" % (tool, e))
        sys.exit(77)
    py = p.stdout.strip()
    if p.returncode != 0 or not py:
        print("SKIP: " + missing)
        sys.exit(77)
    os.environ[flag] = "1"
    for k, v in env.items():
        os.environ.setdefault(k, v)
    sys.stdout.flush()
    os.execv(py, [py, os.path.abspath(sys.argv[0])] + sys.argv[1:])
