#!/usr/bin/env python3
"""scripts/gpu-vllm-datapath --rehearse-cpu: the GPU data-path script's
checks (vLLM's layouts, kvcached's bytes against vLLM's view, round trip,
results.json) on the host backend, so the script the GPU run depends on is
exercised where there is no GPU. Runs under the vLLM environment (torch);
exits 77 without it."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_connector_common as vc  # noqa: E402


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    build = os.environ.get("KVT_BUILD_ROOT") or os.path.dirname(
        os.path.dirname(os.environ["KVCACHED_BIN"]))
    r = subprocess.run([sys.executable, os.path.join(vc.SRC, "scripts", "gpu-vllm-datapath"),
                        "--out", d, "--build", build, "--rehearse-cpu", "--blocks", "8",
                        "--reps", "1"], capture_output=True, text=True, timeout=300)
    print(r.stdout)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-6000:])
        kvt.fail(f"gpu-vllm-datapath --rehearse-cpu exited {r.returncode}")
    with open(os.path.join(d, "results.json")) as f:
        res = json.load(f)
    runs = res["runs"]
    kvt.check(len(runs) == 3 and all(x.get("exact_kvcached_bytes") and x.get("exact_round_trip")
                                     for x in runs), f"results: {runs}")
    kvt.cleanup()
    print("PASS")


if __name__ == "__main__":
    vc.need_vllm()
    main()
