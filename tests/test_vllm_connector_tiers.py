#!/usr/bin/env python3
"""KvcachedConnector's hit sources with vLLM 0.33's real Scheduler against a
real kvcached (docs/vllm.md, "Hit sources"): a prefix whose blocks were
demoted to the host tier (kvctl evict --all) reaches vLLM's prefix-cache
stats as "host", one still in kvcached's device pool (G1) as "device";
each request's split sums to the tokens it loaded.

Runs under the vLLM virtual environment (scripts/vllm-env); exits 77
without it. Exit 0 pass, 1 fail, 77 skip."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_connector_common as vc  # noqa: E402

BS = vc.BS
# Two prompts with no block in common (different first block).
PROMPT_HOST = vc.SYSTEM + vc.user(40)
PROMPT_DEV = [900 - t for t in vc.SYSTEM] + vc.user(41)


def role_fill(sock, admin, which):
    """Computes and saves one prompt."""
    f = vc.Instance(sock, layout="LBNHC")
    f.add("fill-" + which, PROMPT_HOST if which == "host" else PROMPT_DEV)
    f.run()
    assert f.stats.get("saved_blocks", 0) >= 6, f.stats
    vc.out(stats=f.stats)
    f.close()


def role_sources(sock, admin):
    """Another engine loads both prompts, one after the other; what vLLM's
    scheduler recorded as each one's hit sources is compared with where
    the blocks were."""
    i = vc.Instance(sock, layout="LBNHC")
    seen = []
    real = i.sched.schedule

    def schedule():
        so = real()
        st = i.sched.connector_prefix_cache_stats
        if st is not None and st.hits_by_source:
            seen.append({k.value: v for k, v in st.hits_by_source.items()})
            st.hits_by_source = {}
        return so
    i.sched.schedule = schedule
    res = {}
    for name, prompt in (("host", PROMPT_HOST), ("device", PROMPT_DEV)):
        seen.clear()
        i.add("src-" + name, prompt)
        i.run()
        want = (len(prompt) - 1) // BS * BS
        res[name] = list(seen)
        assert seen == [{name: want}], (name, seen, want)
    assert i.held() == 0
    vc.out(sources=res, stats=i.stats)
    i.close()


def main():
    import kvt
    kvt.need_bins()
    d = kvt.tmpdir()
    daemon = kvt.Daemon(d, "--pool-size", "1MiB", "--segment-size", "1MiB", "--page-size",
                        "64KiB", "--host-tier-size", "4MiB")

    def run(role, *rest):
        return vc.run_child(__file__, [role, daemon.sock, daemon.admin, *rest], daemon.log)

    run("fill", "host")
    r = daemon.kvctl("evict", "--all")          # every cached device block to the host tier
    kvt.check(r.returncode == 0, "kvctl evict: " + r.stderr, daemon.log)
    daemon.wait_tiers_idle()
    run("fill", "dev")                          # stays in G1
    run("sources")
    daemon.kill()
    print("PASS")
    kvt.cleanup()
    sys.exit(0)


if __name__ == "__main__":
    vc.main_or_child(main, {"fill": role_fill, "sources": role_sources})
