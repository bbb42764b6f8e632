#!/usr/bin/env python3
"""KvcachedConnector's asynchronous loads with vLLM 0.33's real Scheduler and
the worker side against a real kvcached (docs/vllm.md, "Asynchronous
loads"): a prefix kvcached had in its host tier (kvctl evict --all) is
answered (n, True); the request waits in WAITING_FOR_REMOTE_KVS while the
worker's load thread copies it - held back by the test until another
request has run a forward meanwhile - and is scheduled beyond the loaded
prefix once get_finished reported it (bytes checked); a prefix in
kvcached's device pool (G1) is answered (n, False) and loaded before the
forward; an async load whose blocks are gone reports them as load errors
in the step it finishes; nothing referenced afterwards.

Runs under the vLLM virtual environment (scripts/vllm-env); exits 77
without it. Exit 0 pass, 1 fail, 77 skip."""
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_connector_common as vc  # noqa: E402

BS = vc.BS
P_HOST = vc.SYSTEM + vc.user(40)
P_DEV = [900 - t for t in vc.SYSTEM] + vc.user(41)
P_OTHER = [150 + t // 2 for t in vc.SYSTEM] + vc.user(42)


def role_fill(sock, admin, which):
    f = vc.Instance(sock, layout="LBNHC")
    f.add("fill-" + which, P_HOST if which == "host" else P_DEV)
    f.run()
    assert f.stats.get("saved_blocks", 0) >= 6, f.stats
    vc.out(stats=f.stats)
    f.close()


def role_async(sock, admin):
    from vllm.v1.request import RequestStatus
    kvctl = os.environ["KVCTL_BIN"]
    i = vc.Instance(sock, layout="LBNHC", extra={"save": "none"})
    answers = {}
    real = i.conn.get_num_new_matched_tokens

    def gnm(request, n):
        r = real(request, n)
        if r[0]:
            answers[request.request_id] = list(r)
        return r
    i.conn.get_num_new_matched_tokens = gnm
    # The load thread waits until another request ran a forward meanwhile.
    gate = threading.Event()
    wk = i.worker.connector_worker
    real_load = wk._load_async

    def load_async(ld):
        assert gate.wait(120), "the gate was never opened"
        return real_load(ld)
    wk._load_async = load_async

    n_host = (len(P_HOST) - 1) // BS
    i.add("a-host", P_HOST)
    i.step()
    r = i.reqs["a-host"]
    assert answers.get("a-host") == [n_host * BS, True], answers
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS, r.status
    assert "a-host" not in i.first_sched
    # Another request runs its forwards while the load is in flight.
    i.add("a-other", P_OTHER)
    for _ in range(3):
        so = i.step()
        assert "a-host" not in so.num_scheduled_tokens
    assert i.first_sched.get("a-other") == len(P_OTHER), i.first_sched
    assert r.status == RequestStatus.WAITING_FOR_REMOTE_KVS, r.status
    gate.set()
    i.run()
    assert i.first_sched["a-host"] == len(P_HOST) - n_host * BS, i.first_sched
    assert i.stats.get("loaded_blocks", 0) == n_host, i.stats
    assert i.load_errors == 0
    # A hit in kvcached's device pool: synchronous.
    n_dev = (len(P_DEV) - 1) // BS
    i.add("a-dev", P_DEV)
    i.run()
    assert answers.get("a-dev") == [n_dev * BS, False], answers
    assert i.first_sched["a-dev"] == len(P_DEV) - n_dev * BS, i.first_sched
    assert i.stats.get("loaded_blocks", 0) == n_host + n_dev, i.stats
    assert i.held() == 0
    assert vc.kvctl_refs(kvctl, admin, os.getpid()) == 0, "references left"
    vc.out(answers=answers, first=i.first_sched, stats=i.stats)
    i.close()


def role_gone(sock, admin):
    """An async load whose blocks the daemon no longer has (the test
    load looks up a chain kvcached lacks): its blocks are load errors of
    the step that reports it finished; vLLM asks again, and the second
    answer (kvcached's device pool now: synchronous) loads them (bytes
    checked)."""
    kvctl = os.environ["KVCTL_BIN"]
    i = vc.Instance(sock, layout="LBNHC", extra={"save": "none"})
    wk = i.worker.connector_worker
    real_lookup = wk._lookup_for_load

    asyncs = []

    def lookup(ld, hold):
        if ld.async_:
            asyncs.append(ld.req_id)
            ld.hashes = [b"\x77" * 32] + list(ld.hashes[1:])   # a chain kvcached lacks
        return real_lookup(ld, hold)
    wk._lookup_for_load = lookup
    i.add("g-host", P_HOST + [5])
    i.run()
    n = (len(P_HOST) - 1) // BS
    assert asyncs == ["g-host"], asyncs
    assert i.load_errors == n, (i.load_errors, n)
    assert i.stats.get("loaded_blocks", 0) == n, i.stats
    assert i.held() == 0
    assert vc.kvctl_refs(kvctl, admin, os.getpid()) == 0, "references left"
    vc.out(errors=i.load_errors, stats=i.stats)
    i.close()


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    daemon = kvt.Daemon(d, "--pool-size", "1MiB", "--segment-size", "1MiB", "--page-size",
                        "64KiB", "--host-tier-size", "4MiB")

    def run(role, *rest):
        return vc.run_child(__file__, [role, daemon.sock, daemon.admin, *rest], daemon.log,
                            timeout=300)

    def to_host():
        r = daemon.kvctl("evict", "--all")
        kvt.check(r.returncode == 0, "kvctl evict: " + r.stderr, daemon.log)
        daemon.wait_tiers_idle()

    run("fill", "host")
    to_host()
    run("fill", "dev")
    run("async")
    to_host()
    run("gone")
    daemon.kill()
    print("PASS")
    kvt.cleanup()
    sys.exit(0)


if __name__ == "__main__":
    vc.main_or_child(main, {"fill": role_fill, "async": role_async, "gone": role_gone})
