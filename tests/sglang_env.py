"""Runs a test under the SGLang 0.5.23 virtual environment that
scripts/sglang-env makes, so that it checks kvcache.sglang against SGLang's
own installed code, never a copy of it. reexec() is called first: outside the
environment it starts the same script again with the environment's python, or
exits 77 saying why it cannot (the environment is made by
`scripts/sglang-env`, which CI runs)."""
import peer_env  # tests/peer_env.py (the test's folder is first on sys.path)


def reexec():
    # SGLang imports without a GPU; keep it on the CPU, its threads few (none
    # started at import: the tests fork their instances) and its JIT-built
    # helpers in a cache of their own.
    peer_env.reexec("sglang-env", "KVT_IN_SGLANG_ENV",
                    "no SGLang environment (run scripts/sglang-env to make it: "
                    "sglang==0.5.23 from PyPI, about 11 GiB)",
                    {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                     "OPENBLAS_NUM_THREADS": "1", "SGLANG_LOGGING_LEVEL": "WARNING"})
