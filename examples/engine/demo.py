#!/usr/bin/env python3
"""The quick start's engine demo: one engine process answers a question
under a long system prompt, sealing its KV blocks in kvcached; then a second
process, with the same system prompt and another question, finds the
prompt's blocks in kvcached and computes only the rest.

    python3 examples/engine/demo.py [--socket PATH] [--tokens N] [--question TEXT]

With no --question it runs the two processes itself (each a new python3
process, its own connection) and prints what each generated, its time to
first token, and how many prompt tokens it found in kvcached. With
--question it is one such process (what the first mode starts twice)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

SYSTEM = (
    "You are the help desk of a small company that runs GPU inference servers. "
    "kvcached is a daemon that keeps the key-value cache of language models in one pool of "
    "memory per machine. Engines connect to it over a Unix socket, allocate blocks, seal a "
    "block under a hash of the tokens it holds, and look prefixes up so that a prompt that "
    "another process has already seen is not computed twice. Blocks that are not in use "
    "move to host memory and to disk when the device is full, and come back on a hit. "
    "Operators run it as a systemd service and inspect it with kvctl. Tenants get their "
    "own namespaces, so one tenant never reads another's cache. Answer questions about "
    "the service briefly and plainly, in one or two sentences.")
QUESTIONS = ["What does kvcached do?", "Why would two engines share a prompt?"]


def one(socket: str | None, question: str, tokens: int) -> int:
    from engine.engine import Engine
    from engine.model import Model

    model = Model.load()
    prompt = model.tok.encode_chat([{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": question}])
    with Engine(model, socket) as eng:
        (o,) = eng.generate([prompt], tokens)
    print("pid %d  question: %s" % (os.getpid(), question))
    print("          answer: %s" % o.text.strip().replace("\n", " "))
    print("          prompt %d tokens: %d found in kvcached, %d computed; time to first token "
          "%.0f ms" % (len(prompt), o.hit_tokens, o.computed_tokens, 1000 * o.ttft_s))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", help="the daemon's worker socket (default: $KVCACHED_SOCKET, "
                                     "else the library's default)")
    ap.add_argument("--tokens", type=int, default=40, help="tokens to generate")
    ap.add_argument("--question")
    a = ap.parse_args(argv)
    if a.question:
        return one(a.socket, a.question, a.tokens)
    for i, q in enumerate(QUESTIONS):
        print("==> engine process %d of 2%s" % (i + 1, " (same system prompt)" if i else ""),
              flush=True)
        t0 = time.perf_counter()
        cmd = [sys.executable, os.path.abspath(__file__), "--question", q,
               "--tokens", str(a.tokens)] + (["--socket", a.socket] if a.socket else [])
        r = subprocess.run(cmd)
        if r.returncode:
            return r.returncode
        print("          (process %.1f s in all, loading the model included)"
              % (time.perf_counter() - t0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
