#!/usr/bin/env python3
"""The Debian packages scripts/deb builds (issue 39), as an operator installs,
upgrades and purges them, on this machine.

1. `apt-get install ./kvcached_*.deb ...` of the four packages: the kvcached
   user and group (sysusers), /run/kvcached, /var/lib/kvcached and
   /etc/kvcached (tmpfiles) with their owners and modes, the example
   configuration as the conffile /etc/kvcached/kvcached.conf, the two sockets
   enabled (socket activation) and the service and the metrics socket not, man
   pages and completion in place, and nothing started: systemd is not PID 1
   here (as in a chroot or an image build), and no kvcached process appears.
2. The installed daemon through socket activation, as systemd would start it
   from the installed units: systemd-socket-activate listens where
   kvcached.socket and kvcached-admin.socket say, with their
   FileDescriptorName=s, and runs kvcached.service's ExecStart as its User=
   and Group= (setpriv), with the configuration the operator edited
   (pool_size in the conffile). The installed kvctl, with no -s, reads it on
   the default admin socket; a C program built with `pkg-config kvcache`
   against the installed header and library (ldd says which) connects on the
   default worker socket, writes and seals two blocks; the installed Python
   package (Debian's python3, not the build tree) finds them by lookup with
   the same bytes. The daemon runs as kvcached; SIGTERM stops it (status 0).
3. An upgrade to a second build of the tree (scripts/deb --bump: a newer
   version): the edited conffile, the user's uid, the state directory's files
   and the enabled sockets stay, and step 2 passes again with the new
   version.
4. `apt-get purge`: no file of the four packages is left, nor /etc/kvcached,
   /var/lib/kvcached, /run/kvcached, the sockets' enable links or
   deb-systemd-helper's state of them. The kvcached user and group stay, as
   Debian leaves system users on purge (debian/kvcached.postrm says why);
   this test then removes them if it made them, to leave the machine as it
   was.

Needs root, apt-get, systemd-socket-activate, setpriv, cc and
KVCACHED_DIST (the folder of the .debs, with the second build in upgrade/),
else exits 77; also 77 if kvcached is already installed here (this test would
purge it). Runs alone (is_parallel false): while it runs, /usr holds the
packages' files.
  scripts/deb && scripts/deb --bump --out dist/upgrade &&
  KVCACHED_DIST=$PWD/dist meson test -C build --suite pkg
"""
import glob
import grp
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess

import kvt
from kvt import check

DIST = os.environ.get("KVCACHED_DIST")
PKGS = ["kvcached", "libkvcache0", "libkvcache-dev", "python3-kvcache"]
DIRS = {"/run/kvcached": (0o755, "kvcached", "kvcached"),
        "/var/lib/kvcached": (0o750, "kvcached", "kvcached"),
        "/etc/kvcached": (0o755, "root", "root")}
UNITDIR = "/lib/systemd/system"
WANTS = "/etc/systemd/system/sockets.target.wants"
APT_ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
CONF_EDIT = "\n# test_deb.py\npool_size = 16MiB\nsegment_size = 4MiB\n"

CLIENT_C = r"""
#include <kvcache.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
	kvc_conn *c;
	struct kvc_pool_desc d = { .name = "deb", .block_bytes = 4096, .block_tokens = 16 };
	uint32_t tokens[32];
	kvc_hash h[2];
	kvc_block b[2], sealed[2];
	int pool, r;

	for (int i = 0; i < 32; i++)
		tokens[i] = 2000 + i;
	if ((r = kvc_connect(NULL, NULL, &c)) < 0) {
		fprintf(stderr, "connect: %s\n", kvc_strerror(r));
		return 1;
	}
	if ((pool = kvc_register_pool(c, &d)) < 0 ||
	    (r = kvc_hash_chain(KVC_HASH_SHA256, tokens, 32, 16, NULL, h, 2)) < 0 ||
	    (r = kvc_alloc(c, pool, 2, b)) < 0) {
		fprintf(stderr, "pool/hash/alloc: %s\n", kvc_last_error(c));
		return 1;
	}
	for (int i = 0; i < 2; i++)
		memset(kvc_block_ptr(c, b[i]), 0x60 + i, 4096);
	if ((r = kvc_seal(c, pool, b, h, 2, sealed)) < 0 ||
	    (r = kvc_release(c, sealed, 2)) < 0) {
		fprintf(stderr, "seal/release: %s\n", kvc_last_error(c));
		return 1;
	}
	kvc_close(c);
	printf("SEALED 2\n");
	return 0;
}
"""

PY_PROBE = r"""
import kvcache, sys
assert kvcache.__file__ == "/usr/lib/python3/dist-packages/kvcache/__init__.py", kvcache.__file__
from kvcache import _paths
print(_paths.LIBKVCACHE)
with kvcache.connect() as c:
    pool = c.register_pool("deb", 4096, 16)
    hit = c.lookup(pool, kvcache.hash_chain(list(range(2000, 2032)), 16))
    assert len(hit) == 2, "lookup found %d" % len(hit)
    for i, b in enumerate(hit):
        assert bytes(c.buffer(pool, b)) == bytes([0x60 + i]) * 4096, "bytes of block %d" % i
    c.release(hit)
print("FOUND 2")
"""


def run(cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 300)
    return subprocess.run(cmd, **kw)


def must(cmd, what, **kw):
    r = run(cmd, **kw)
    check(r.returncode == 0, "%s: rc %d\n%s\n%s" % (what, r.returncode, r.stdout[-4000:],
                                                      r.stderr[-4000:]))
    return r


def debs(d):
    found = {}
    for p in glob.glob(os.path.join(d, "*.deb")):
        name, version = os.path.basename(p).split("_")[:2]
        found[name] = (os.path.abspath(p), version)
    check(sorted(found) == sorted(PKGS), "packages in %s: %s" % (d, sorted(found)))
    versions = {v for _, v in found.values()}
    check(len(versions) == 1, "one version in %s: %s" % (d, versions))
    return [p for p, _ in found.values()], versions.pop()


def installed_version(pkg):
    r = run(["dpkg-query", "-W", "-f=${db:Status-Abbrev} ${Version}", pkg])
    if r.returncode != 0 or not r.stdout.startswith("ii"):
        return None
    return r.stdout.split()[-1]


def unit_keys(path):
    keys = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if "=" in line and not line.startswith(("#", ";", "[")):
                k, v = line.split("=", 1)
                keys.setdefault(k.strip(), []).append(v.strip())
    return keys


def kvcached_pids():
    pids = []
    for p in glob.glob("/proc/[0-9]*/exe"):
        try:
            if os.readlink(p) == "/usr/sbin/kvcached":
                pids.append(int(p.split("/")[2]))
        except OSError:
            pass
    return pids


def check_installed(version):
    for p in PKGS:
        check(installed_version(p) == version, "%s not installed at %s" % (p, version))
    try:
        u = pwd.getpwnam("kvcached")
        g = grp.getgrnam("kvcached")
    except KeyError:
        kvt.fail("no kvcached user or group after install")
    check(u.pw_gid == g.gr_gid and u.pw_uid < 1000 and u.pw_dir == "/var/lib/kvcached" and
          u.pw_shell.endswith("nologin"), "kvcached user: %s" % (u,))
    for d, (mode, user, group) in DIRS.items():
        st = os.stat(d)
        check(stat.S_IMODE(st.st_mode) == mode and pwd.getpwuid(st.st_uid).pw_name == user and
              grp.getgrgid(st.st_gid).gr_name == group,
              "%s: %o %d:%d" % (d, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid))
    r = must(["dpkg-query", "-W", "-f=${Conffiles}", "kvcached"], "conffiles")
    check("/etc/kvcached/kvcached.conf" in r.stdout, "no conffile: " + r.stdout)
    for s in ("kvcached.socket", "kvcached-admin.socket"):
        link = os.path.join(WANTS, s)
        check(os.path.islink(link) and os.readlink(link) == os.path.join(UNITDIR, s),
              "%s not enabled" % s)
    check(not glob.glob("/etc/systemd/system/*.wants/kvcached.service") and
          not os.path.exists(os.path.join(WANTS, "kvcached-metrics.socket")),
          "the service or the metrics socket was enabled")
    for page in ("man8/kvcached.8", "man8/kvctl.8", "man5/kvcached.conf.5"):
        check(os.path.isfile("/usr/share/man/%s.gz" % page), "no man page " + page)
    check(os.path.isfile("/usr/share/bash-completion/completions/kvctl"), "no completion")
    check(not os.path.exists("/run/systemd/system") and not kvcached_pids(),
          "a kvcached runs after install: %s" % kvcached_pids())


def activate(d, tag):
    """kvcached from the installed units through systemd-socket-activate; the
    installed kvctl, a C client and the Python package against it."""
    sockets = {}
    for unit in ("kvcached.socket", "kvcached-admin.socket"):
        k = unit_keys(os.path.join(UNITDIR, unit))
        sockets[k["FileDescriptorName"][0]] = (k["ListenStream"][0], k["SocketMode"][0])
    svc = unit_keys(os.path.join(UNITDIR, "kvcached.service"))
    exe = svc["ExecStart"][-1].split()
    user, group = svc["User"][0], svc["Group"][0]
    check(exe[0] == "/usr/sbin/kvcached" and set(sockets) == {"worker", "admin"},
          "units: %s %s" % (exe, sockets))
    for path, _ in sockets.values():
        check(not os.path.exists(path), "%s exists before the start" % path)
    cmd = ["systemd-socket-activate", "-l", sockets["worker"][0], "-l", sockets["admin"][0],
           "--fdname=worker:admin", "-E", "RUNTIME_DIRECTORY=/run/kvcached",
           "-E", "STATE_DIRECTORY=/var/lib/kvcached",
           "-E", "CONFIGURATION_DIRECTORY=/etc/kvcached",
           "setpriv", "--reuid=" + user, "--regid=" + group, "--init-groups"] + exe
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KVCACHED_", "NOTIFY_", "LISTEN_"))}
    log = os.path.join(d, "daemon-%s.log" % tag)
    logf = open(log, "wb")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf,
                            stderr=subprocess.STDOUT, env=env)
    kvt._cleanup.append(lambda: proc.poll() is None and (proc.kill(), proc.wait()))
    check(kvt.wait_for(lambda: all(os.path.exists(p) for p, _ in sockets.values())
                       or proc.poll() is not None), "sockets did not appear", log)
    # What systemd does with SocketUser=, SocketGroup= and SocketMode=.
    for path, mode in sockets.values():
        shutil.chown(path, user, group)
        os.chmod(path, int(mode, 8))

    # The installed C library, through kvcache.pc, on the default socket.
    src = os.path.join(d, "client.c")
    with open(src, "w") as f:
        f.write(CLIENT_C)
    prog = os.path.join(d, "client-" + tag)
    pc = must(["pkg-config", "--cflags", "--libs", "kvcache"], "pkg-config kvcache",
              env={"PATH": "/usr/bin:/bin"})
    must(["cc", "-std=c17", "-Wall", "-Werror", "-o", prog, src] + pc.stdout.split(),
         "cc against the installed kvcache.h and kvcache.pc")
    ldd = must(["ldd", prog], "ldd", env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ""})
    m = re.search(r"libkvcache\.so\.0 => (\S+)", ldd.stdout)
    ours = [f for f in run(["dpkg-query", "-L", "libkvcache0"]).stdout.split()
            if os.path.basename(f) == "libkvcache.so.0"]
    check(m and len(ours) == 1 and os.path.realpath(m[1]) == os.path.realpath(ours[0]),
          "not libkvcache0's library (%s): %s" % (ours, ldd.stdout))
    r = run([prog], env={"PATH": "/usr/bin:/bin"}, timeout=60)
    check(r.returncode == 0 and "SEALED 2" in r.stdout, "C client: %s %s" % (r.stdout, r.stderr),
          log)
    pid = proc.pid
    check(proc.poll() is None, "the daemon exited: %s" % proc.returncode, log)
    with open("/proc/%d/status" % pid) as f:
        uid = [ln.split()[1:] for ln in f if ln.startswith("Uid:")][0]
    check(set(uid) == {str(pwd.getpwnam(user).pw_uid)}, "daemon uid %s" % uid, log)
    with open(log, errors="replace") as f:
        check("socket activation: worker and admin sockets from systemd" in f.read(),
              "no socket activation log line", log)

    # The installed Python package with Debian's python3, away from the tree.
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    r = run(["/usr/bin/python3", "-c", PY_PROBE], env=env, cwd="/", timeout=60)
    check(r.returncode == 0 and "FOUND 2" in r.stdout,
          "python3-kvcache: %s %s" % (r.stdout, r.stderr), log)
    check(r.stdout.startswith("/usr/lib/"), "_paths.LIBKVCACHE: " + r.stdout)

    # The installed kvctl on its default admin socket, as root.
    r = run(["/usr/bin/kvctl", "-o", "json", "status"], env=env, timeout=30)
    check(r.returncode == 0, "kvctl status: %s" % r.stderr, log)
    st = json.loads(r.stdout)
    cap = [t.get("capacity_bytes") for t in st.get("tiers", []) if t.get("tier") == "G1"]
    check(cap == [16 << 20], "G1 is not the conffile's 16MiB: %s" % st.get("tiers"), log)
    r = run(["/usr/bin/kvctl", "pools"], env=env, timeout=30)
    check(r.returncode == 0 and "deb" in r.stdout, "kvctl pools: %s %s" % (r.stdout, r.stderr),
          log)
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == 0, "exit status after SIGTERM: %s" % rc, log)
    for path, _ in sockets.values():
        os.unlink(path)   # systemd's, not the daemon's, to remove
    print("ok (%s): socket-activated kvcached as %s, kvctl, C client (ldd: installed "
          "libkvcache), python3-kvcache" % (tag, user))


def package_files():
    files = []
    for p in PKGS:
        r = run(["dpkg-query", "-L", p])
        files += [f for f in r.stdout.splitlines() if f.startswith("/")]
    return files


def main():
    if not DIST:
        kvt.skip("KVCACHED_DIST not set: scripts/deb && scripts/deb --bump --out dist/upgrade, "
                 "then KVCACHED_DIST=$PWD/dist meson test -C build --suite pkg")
    if os.geteuid() != 0:
        kvt.skip("not root: installs packages")
    for tool in ("apt-get", "dpkg-query", "systemd-socket-activate", "setpriv", "cc",
                 "pkg-config"):
        if not shutil.which(tool):
            kvt.skip("no " + tool)
    first, v1 = debs(DIST)
    second, v2 = debs(os.path.join(DIST, "upgrade"))
    check(run(["dpkg", "--compare-versions", v2, "gt", v1]).returncode == 0,
          "upgrade/ has %s, not newer than %s" % (v2, v1))
    for p in PKGS:
        if run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}", p]).stdout[:2] not in ("", "un"):
            kvt.skip("%s is installed on this machine: this test would purge it" % p)
    for d in DIRS:
        if os.path.exists(d):
            kvt.skip("%s exists: a kvcached installation's leftovers" % d)
    try:
        pwd.getpwnam("kvcached")
        had_user = True
    except KeyError:
        had_user = False

    def purge():
        run(["apt-get", "purge", "-y", "-q"] + PKGS, env=APT_ENV)
        if not had_user:
            run(["userdel", "kvcached"])
            run(["groupdel", "kvcached"])
    kvt._cleanup.append(purge)
    d = kvt.tmpdir()

    must(["apt-get", "install", "-y", "-q", "--no-install-recommends"] + first,
         "apt-get install ./dist/*.deb", env=APT_ENV)
    check_installed(v1)
    print("ok: installed %s: user, directories, conffile, sockets enabled, nothing started" % v1)
    with open("/etc/kvcached/kvcached.conf", "a") as f:
        f.write(CONF_EDIT)
    activate(d, v1)

    uid = pwd.getpwnam("kvcached").pw_uid
    state = "/var/lib/kvcached/test-deb-state"
    with open(state, "w") as f:
        f.write("kept\n")
    shutil.chown(state, "kvcached", "kvcached")
    must(["apt-get", "install", "-y", "-q", "--no-install-recommends"] + second,
         "apt-get install of the second build (upgrade)", env=APT_ENV)
    check_installed(v2)
    with open("/etc/kvcached/kvcached.conf") as f:
        check(f.read().endswith(CONF_EDIT), "the edited conffile was not kept")
    check(pwd.getpwnam("kvcached").pw_uid == uid and os.path.exists(state),
          "the user or the state changed on upgrade")
    print("ok: upgraded %s -> %s: conffile, user, state and enabled sockets kept" % (v1, v2))
    activate(d, v2)

    files = package_files()
    check(len(files) > 20, "dpkg -L: %d files" % len(files))
    must(["apt-get", "purge", "-y", "-q"] + PKGS, "apt-get purge", env=APT_ENV)
    for p in PKGS:
        r = run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}", p])
        check(r.stdout[:2] in ("", "un"), "%s still known to dpkg: %s" % (p, r.stdout))
    # Files and links, and the directories that are the packages' own (/usr,
    # /lib and the like are everybody's).
    ours = ("/etc/kvcached", "/usr/share/doc/", "/usr/lib/python3/dist-packages/kv")
    left = [f for f in files if os.path.lexists(f) and
            (not os.path.isdir(f) or f.startswith(ours))]
    left += [p for p in list(DIRS) + ["/usr/lib/python3/dist-packages/kvcache"]
             if os.path.lexists(p)]
    left += glob.glob("/etc/systemd/system/*/kvcached*")
    left += glob.glob("/var/lib/systemd/deb-systemd-helper-enabled/**/kvcached*",
                      recursive=True)
    left += glob.glob("/var/lib/systemd/deb-systemd-helper-masked/kvcached*")
    check(not left, "left after purge: %s" % sorted(set(left)))
    try:
        pwd.getpwnam("kvcached")
    except KeyError:
        kvt.fail("the kvcached user was removed on purge (Debian keeps system users)")
    print("ok: purged: no file, directory, enable link or state left; the kvcached user "
          "stays (Debian's convention)%s" % ("" if had_user else ", removed by this test"))
    kvt.cleanup()
    print("PASS")


if __name__ == "__main__":
    try:
        main()
    finally:
        kvt.cleanup()   # also after an exception: no daemon, no package left behind
