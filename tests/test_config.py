#!/usr/bin/env python3
"""The configuration file and command line against the real daemon: a file
with every key is parsed (--print-config shows each value, and a daemon
started with it shows the effects), the command line wins, a percentage is of
RAM on the host backend, each kind of bad value is refused with a message
naming the key, the value and what is allowed (exit 2), so are unknown keys
and sections, syntax errors, a missing --config file and broken rules between
keys. SIGHUP and kvctl reload apply a changed log level (and report what needs
a restart) without dropping a connected client; an invalid file changes
nothing; the command line keeps winning across reloads."""
import grp
import json
import os
import signal
import stat
import subprocess

import kvt
from kvt import check

kvt.need_bins()
d = kvt.tmpdir()
group = grp.getgrgid(os.getgid()).gr_name


def run(*args):
    return subprocess.run([kvt.BIN, *args], capture_output=True, text=True, timeout=30,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("KVCACHED_SOCKET", "KVCACHED_ADMIN_SOCKET")})


def printed(*args):
    r = run(*args, "--print-config")
    check(r.returncode == 0, "--print-config %s: %s" % (args, r.stderr))
    out = {}
    for line in r.stdout.splitlines():
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


# Every key, each at a value other than its default.
ALL = {
    "socket": os.path.join(d, "all.sock"),
    "socket_mode": "0640",
    "socket_group": group,
    "admin_socket": os.path.join(d, "all-adm.sock"),
    "admin_socket_mode": "0660",
    "admin_socket_group": group,
    "worker_socket_admin": "no",
    "backend": "host",
    "pool_size": "64MiB",
    "segment_size": "16MiB",
    "page_size": "1MiB",
    "max_frame": "8MiB",
    "max_batch": "1000",
    "max_block_refs": "1000000",
    "max_connections": "100",
    "max_connections_per_uid": "50",
    "frame_timeout": "10s",
    "max_output_per_connection": "16MiB",
    "max_fds_per_connection": "64",
    "max_fds_in_flight": "5000",
    "max_fds_per_uid": "3000",
    "max_memory_per_uid": "128MiB",
    "max_connection_memory": "512MiB",
    "log_level": "debug",
    "log_target": "stderr",
    "drain_timeout": "2m",
    "status_interval": "1500ms",
    "max_layout_bytes": "1MiB",
    "max_pools_per_namespace": "100",
    "max_swap_per_session": "1GiB",
    "host_tier_size": "8MiB",
    "disk_path": os.path.join(d, "g3"),
    "disk_size": "16MiB",
    "disk_index": os.path.join(d, "g3.index"),
    "disk_queue_depth": "32",
    "demote_low": "5%",
    "demote_high": "30%",
    "writeback_low": "15%",
    "writeback_high": "40%",
    # G4: an empty seed list keeps it off whatever the build.
    "remote_seeds": "",
    "remote_prefix": "fleet-a",
    "remote_ttl": "30m",
    "remote_timeout": "500ms",
    "remote_user": "kvcached",
    "remote_password_file": "",
    "remote_max_inflight": "32MiB",
    "remote_write_rate": "100MiB",
    "remote_write": "off",
    "remote_min_rate": "2MiB",
    "remote_fetch_timeout": "5s",
    "remote_readers": "4",
    "remote_auth": "off",
    "remote_write_timeout": "7s",
    "metrics_listen": "127.0.0.1:0",
    "metrics_min_interval": "2s",
    "metrics_header_timeout": "3s",
    "metrics_max_connections": "32",
    "metrics_max_connections_per_address": "8",
    "loop_lag_warn": "250ms",
    # KV events: an empty endpoint keeps them off whatever the build.
    "events_endpoint": "",
    "events_connect": "yes",
    "events_replay_endpoint": "",
    "events_buffer": "500",
    "events_hwm": "100",
    "events_subscriber_max_bytes": "32MiB",
    "events_replay_max_bytes": "16MiB",
    "events_interval": "2ms",
    "events_token_ids": "yes",
    "events_hash_format": "bytes",
    "events_buffer_max_bytes": "16MiB",
    "events_dp_rank": "3",
    "node_name": "node-1",
}
defaults = printed("--config=")
check(set(defaults) == set(ALL), "keys of --print-config %s differ from this test's %s: a new "
      "key needs a line here" % (sorted(defaults), sorted(ALL)))
full = write(os.path.join(d, "all.conf"), "# every key\n[kvcached]\n" +
             "".join("%s = %s\n" % kv for kv in ALL.items()))
got = printed("--config=" + full)
check(got == ALL, "printed %s, expected %s" % (got, ALL))
print("ok: every key parsed:", len(ALL))

# Their effects on a daemon.
dm = kvt.Daemon(d, argv0=[kvt.BIN, "--config=" + full], wait=False)
dm.sock, dm.admin = ALL["socket"], ALL["admin_socket"]
check(kvt.wait_for(lambda: kvt.can_connect(dm.admin) or dm.proc.poll() is not None), "start",
      dm.log)
check(stat.S_IMODE(os.stat(dm.sock).st_mode) == 0o640, "socket_mode", dm.log)
check(stat.S_IMODE(os.stat(dm.admin).st_mode) == 0o660, "admin_socket_mode", dm.log)
st = json.loads(dm.kvctl("-o", "json", "status").stdout)
check(st["page_bytes"] == 1 << 20 and st["pages_total"] == 64 and
      st["segment_bytes"] == 16 << 20, "sizes: %s" % st, dm.log)
tiers = {t["tier"]: t for t in st["tiers"]}
check(tiers["G2"]["capacity_bytes"] == 8 << 20 and tiers["G3"]["capacity_bytes"] == 16 << 20,
      "tiers: %s" % st["tiers"], dm.log)
check(os.path.exists(ALL["disk_path"]), "disk_path not created", dm.log)
r = dm.kvctl("clients", admin=False)
check(r.returncode == 1 and "admin operation" in r.stderr,
      "worker_socket_admin = no: clients on the worker socket: %r" % r.stderr, dm.log)
w = kvt.Worker(dm.sock)
check(w.ok(), "worker", dm.log)
check("session 2: pid" in dm.logtext(), "log_level debug", dm.log)
w.quit()
dm.signal(signal.SIGTERM)
check(dm.wait(10) == 0, "exit", dm.log)
print("ok: effects of the keys")

# The command line wins over the file; a percentage is of RAM.
check(printed("--config=" + full, "--pool-size=32MiB")["pool_size"] == "32MiB", "override")
mem = [int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal:")][0]
want = mem // 100 // (2 << 20) * (2 << 20)
got = printed("--config=", "--pool-size=1%", "--segment-size=2MiB")["pool_size"]
check(got in ("%d" % want, "%dMiB" % (want >> 20), "%dGiB" % (want >> 30)),
      "1%% of %d bytes: %s, expected %d" % (mem, got, want))
print("ok: command line wins; 1% of RAM is", got)

# Bad values: one per kind, in the file and on the command line.
BAD = [
    ("pool_size", "12XB"), ("pool_size", "150%"), ("max_batch", "0"), ("max_batch", "many"),
    ("socket", "/" + "x" * 140), ("backend", "gpu"), ("log_target", "syslog"),
    ("socket_mode", "0999"), ("socket_group", "no-such-group-kvt"),
    ("worker_socket_admin", "maybe"), ("drain_timeout", "5parsecs"), ("drain_timeout", "48h"),
    ("log_level", "loud"), ("max_frame", "2GiB"), ("demote_low", "120"),
    ("writeback_high", "-5%"), ("disk_queue_depth", "0"), ("host_tier_size", "lots"),
]
for k, v in BAD:
    f = write(os.path.join(d, "bad.conf"), "# bad\n%s = %s\n" % (k, v))
    for args in (["--config=" + f, "--check-config"],
                 ["--config=", "--%s=%s" % (k.replace("_", "-"), v), "--check-config"]):
        r = run(*args)
        err = r.stderr.strip()
        check(r.returncode == 2, "%s accepted (%d)" % (args, r.returncode))
        check(len(err.splitlines()) == 1 and k in err and v in err and "allowed" in err,
              "message for %s = %s: %s" % (k, v, err))
    check(":2:" in run("--config=" + f).stderr, "file errors name the line")
print("ok: %d bad values refused" % len(BAD))

for text, want in [("frobnicate = 1\n", "unknown key 'frobnicate'"),
                   ("[tiers]\npool_size = 1GiB\n", "unknown section [tiers]"),
                   ("pool_size 1GiB\n", "syntax error"),
                   ("pool_size = 64MiB\nsegment_size = 48MiB\n", "multiple of the segment"),
                   ("max_batch = 1000000\n", "max_frame"),
                   ("socket = /tmp/a.sock\nadmin_socket = /tmp/a.sock\n", "admin_socket"),
                   ("host_tier_size = 64MiB\ndisk_path = /tmp/g3\n", "needs disk_size"),
                   ("disk_path = /tmp/g3\ndisk_size = 1GiB\n", "host tier"),
                   ("demote_low = 50\ndemote_high = 40\n", "low watermark"),
                   # Checked once the file is read (kv_config_finish, http.c).
                   ("metrics_listen = localhost:9469\n", "metrics_listen: bad value"),
                   ("metrics_listen = [::1]9469\n", "metrics_listen: bad value"),
                   ("metrics_listen = 127.0.0.1:65536\n", "metrics_listen: bad value"),
                   # Namespace keys: compress names a format.
                   ("[namespace a]\ncompress = fp8\n", "is not fp8_e4m3, fp8_e5m2 or off"),
                   ("[namespace a]\ncompress = \n", "compress")]:
    f = write(os.path.join(d, "bad.conf"), text)
    r = run("--config=" + f, "--check-config")
    check(r.returncode == 2 and want in r.stderr, "%r: %d %s" % (text, r.returncode, r.stderr))
r = run("--config=", "--frobnicate=1")
check(r.returncode == 2 and "frobnicate" in r.stderr, "unknown option: " + r.stderr)
r = run("--config=" + os.path.join(d, "missing.conf"), "--check-config")
check(r.returncode == 2 and "missing.conf" in r.stderr, "missing explicit file: " + r.stderr)
if not os.path.exists("/etc/kvcached/kvcached.conf"):
    r = run("--check-config")
    check(r.returncode == 0, "missing default file: " + r.stderr)
for v in ("fp8_e4m3", "fp8_e5m2", "off"):
    f = write(os.path.join(d, "ok.conf"), "[namespace a]\ncompress = %s\n" % v)
    r = run("--config=" + f, "--check-config")
    check(r.returncode == 0, "compress = %s refused: %s" % (v, r.stderr))
print("ok: unknown keys and sections, syntax, rules, missing files")

# Reload with a client connected.
conf = write(os.path.join(d, "live.conf"), "pool_size = 16MiB\nsegment_size = 4MiB\n"
             "log_level = info\ndrain_timeout = 30s\n")
dm = kvt.Daemon(kvt.tmpdir(), argv0=[kvt.BIN, "--config=" + conf, "--socket=" + d + "/r.sock",
                                     "--status-interval=7s"], wait=False)
dm.sock, dm.admin = d + "/r.sock", d + "/r-admin.sock"
check(kvt.wait_for(lambda: kvt.can_connect(dm.admin) or dm.proc.poll() is not None), "start",
      dm.log)
w = kvt.Worker(dm.sock)
check(w.ok() and w.cmd("pool p 65536").startswith("ok") and w.cmd("alloc 4") == "ok 4",
      "worker", dm.log)
check("session" not in dm.logtext(), "debug lines at info", dm.log)
write(conf, "pool_size = 32MiB\nsegment_size = 4MiB\nlog_level = debug\n"
      "drain_timeout = 30s\nstatus_interval = 9s\n")
dm.signal(signal.SIGHUP)
check(dm.wait_log("reloaded"), "no reload log line", dm.log)
log = dm.logtext()
check("applied log_level: info -> debug" in log, "log_level not applied", dm.log)
check("not applied (needs a restart): pool_size: 16MiB -> 32MiB" in log, "pool_size", dm.log)
check("status_interval" not in log, "the command line's status_interval was overridden", dm.log)
check(w.cmd("alloc 2") == "ok 2" and w.cmd("release") == "ok 6", "client after SIGHUP", dm.log)
w2 = kvt.Worker(dm.sock)
check(w2.ok() and dm.wait_log("pid %d uid" % w2.proc.pid), "debug line after the reload",
      dm.log)
w2.quit()
print("ok: SIGHUP applied log_level with a client connected")

write(conf, "pool_size = 32MiB\nsegment_size = 4MiB\nlog_level = debug\ndrain_timeout = 10s\n")
r = dm.kvctl("-o", "json", "reload")
check(r.returncode == 0, "kvctl reload: " + r.stderr, dm.log)
js = json.loads(r.stdout)
check(js["applied"] == ["drain_timeout: 30s -> 10s"] and js["config_path"] == conf and
      js["not_applied"] == ["pool_size: 16MiB -> 32MiB"], "reload reply: %s" % js, dm.log)
r = dm.kvctl("reload")
check(r.returncode == 0 and "restart" in r.stdout, "kvctl reload human: " + r.stdout, dm.log)
write(conf, "pool_size = 32MiB\nlog_level = chatty\n")
r = dm.kvctl("reload")
check(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "log_level" in r.stderr
      and "chatty" in r.stderr, "invalid reload: %r" % r.stderr, dm.log)
check("reload failed" in dm.logtext(), "no 'reload failed' log line", dm.log)
check(w.cmd("alloc 1") == "ok 1", "client after a failed reload", dm.log)
st = json.loads(dm.kvctl("-o", "json", "status").stdout)
check(st["reloads"] == 4 and st["reload_failures"] == 1, "reload counters: %s" % st, dm.log)
w.quit()
dm.signal(signal.SIGTERM)
check(dm.wait(10) == 0, "exit", dm.log)
print("ok: kvctl reload, applied / not applied / invalid")
kvt.cleanup()
