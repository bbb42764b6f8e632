#!/usr/bin/env python3
"""pip install of this checkout (pyproject.toml, meson-python) with the vLLM
virtual environment's pip, into a folder of its own (the shared environment
is left as it is), then, with that folder on the path and not the build
tree: `import kvcache` and `import kvcache.vllm` import no vLLM; the wheel's
own libkvcache talks to a real daemon; kvcache.vllm.KvcachedConnector loads
(and only then vLLM). Exits 77 without the vLLM environment."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_connector_common as vc  # noqa: E402

PROBE = r"""
import sys
import kvcache, kvcache.vllm, kvcache.vllm.datapath
assert "vllm" not in sys.modules, "import kvcache.vllm imported vLLM"
from kvcache import _paths
assert _paths.LIBKVCACHE.startswith(sys.argv[1]), _paths.LIBKVCACHE
assert kvcache.__file__.startswith(sys.argv[1]), kvcache.__file__
with kvcache.connect(sys.argv[2]) as c:
    p = c.register_pool("pip-probe", 4096, 16)
    b = c.alloc(p, 2)
    c.release(b)
C = kvcache.vllm.KvcachedConnector
assert "vllm" in sys.modules
print("OK", C.__module__)
"""


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    daemon = kvt.Daemon(d, "--pool-size", "4MiB", "--segment-size", "1MiB", "--page-size",
                        "64KiB")
    prefix = os.path.join(d, "prefix")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-deps", "--no-index", "--prefix", prefix,
                        "--config-settings=build-dir=" + os.path.join(d, "build"), vc.SRC],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-8000:])
        kvt.fail("pip install failed")
    site = subprocess.run([sys.executable, "-c",
                           "import sysconfig,sys; print(sysconfig.get_path('platlib', "
                           "vars={'platbase': sys.argv[1], 'base': sys.argv[1]}))", prefix],
                          capture_output=True, text=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVCACHE_LIB")}
    env["PYTHONPATH"] = site
    r = subprocess.run([sys.executable, "-c", PROBE, site, daemon.sock], capture_output=True,
                       text=True, env=env, timeout=300, cwd=d)
    if r.returncode != 0 or "OK" not in r.stdout:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-8000:])
        kvt.fail("the pip-installed package does not work", daemon.log)
    print(r.stdout.strip().splitlines()[-1])
    kvt.cleanup()
    print("PASS")


if __name__ == "__main__":
    vc.need_vllm()
    main()
