"""Runs a test under the vLLM 0.33.0 virtual environment that scripts/vllm-env
makes, so that it checks kvcached against vLLM's own installed code, never a
copy of it. reexec() is called first: outside the environment it starts the
same script again with the environment's python, or exits 77 saying why it
cannot (the environment is made by `scripts/vllm-env`, which CI runs)."""
import peer_env  # tests/peer_env.py (the test's folder is first on sys.path)


def reexec():
    # vLLM imports without a GPU; keep its start quiet and on the CPU.
    peer_env.reexec("vllm-env", "KVT_IN_VLLM_ENV",
                    "no vLLM environment (run scripts/vllm-env to make it: vllm==0.33.0 "
                    "from PyPI, about 9 GiB)",
                    {"VLLM_LOGGING_LEVEL": "ERROR", "CUDA_VISIBLE_DEVICES": ""})
