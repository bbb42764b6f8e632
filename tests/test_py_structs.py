#!/usr/bin/env python3
"""The Python binding's ctypes mirrors (python/kvcache/_native.py) against the
C structs of kvcache.h: every mirrored struct has the C struct's size, and
every field the same name, offset and size, in both directions. The C side
is printed by tests/py_structs (offsetof/sizeof, compiled against the
header). Exit 0 pass, 1 fail, 77 skip.

Usage: test_py_structs.py PY_STRUCTS_BIN (PYTHONPATH: the build's python/)."""
import ctypes
import subprocess
import sys

try:
    from kvcache import _native
except OSError as e:  # libkvcache not loadable: nothing to compare with
    print(f"skip: {e}", file=sys.stderr)
    sys.exit(77)


def main():
    out = subprocess.run([sys.argv[1]], capture_output=True, text=True, check=True).stdout
    c = {}
    for line in out.splitlines():
        w = line.split()
        if w[1] == "size":
            c.setdefault(w[0], {"size": int(w[2]), "fields": {}})
        else:
            c[w[0]]["fields"][w[1]] = (int(w[2]), int(w[3]))
    mirrors = {n: v for n, v in vars(_native).items()
               if isinstance(v, type) and issubclass(v, ctypes.Structure)}
    bad = []
    for name in sorted(set(c) | set(mirrors)):
        if name not in mirrors:
            bad.append(f"{name}: the C struct is listed but _native.py has no mirror")
            continue
        if name not in c:
            bad.append(f"{name}: _native.py mirrors it but tests/py_structs.c does not print it")
            continue
        py, cs = mirrors[name], c[name]
        if ctypes.sizeof(py) != cs["size"]:
            bad.append(f"{name}: {ctypes.sizeof(py)} bytes in Python, {cs['size']} in C")
        pyf = {f[0] for f in py._fields_}
        for f in sorted(pyf | set(cs["fields"])):
            if f not in cs["fields"]:
                bad.append(f"{name}.{f}: in the mirror, not in C")
            elif f not in pyf:
                bad.append(f"{name}.{f}: in C, not in the mirror")
            else:
                d = getattr(py, f)
                if (d.offset, d.size) != cs["fields"][f]:
                    bad.append(f"{name}.{f}: offset/size {d.offset}/{d.size} in Python, "
                               f"{cs['fields'][f][0]}/{cs['fields'][f][1]} in C")
    for b in bad:
        print(b, file=sys.stderr)
    print(f"{len(mirrors)} mirrored structs checked", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
