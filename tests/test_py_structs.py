#!/usr/bin/env python3
"""The Python binding's ctypes mirrors (python/kvcache/_native.py) against
kvcache.h. Structs: every mirrored struct has the C struct's size, and every
field the same name, offset and size, in both directions; the C side is
printed by tests/py_structs (offsetof/sizeof, compiled against the header).
Functions: every one the binding declares has the header's prototype (the
number of parameters; each parameter and the result the same kind: an
integer of the same size and sign, or a pointer to the same thing). Exit 0
pass, 1 fail, 77 skip.

Usage: test_py_structs.py PY_STRUCTS_BIN KVCACHE_H (PYTHONPATH: the build's
python/)."""
import ctypes
import re
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
    nfun = check_functions(sys.argv[2], mirrors, bad)
    for b in bad:
        print(b, file=sys.stderr)
    print(f"{len(mirrors)} mirrored structs and {nfun} functions checked", file=sys.stderr)
    return 1 if bad else 0


# C types by what a ctypes mirror must match: an integer (size, signed), or
# the thing a pointer points at.
C_INT = {"int": (4, True), "uint8_t": (1, False), "uint32_t": (4, False), "uint64_t": (8, False),
         "size_t": (ctypes.sizeof(ctypes.c_size_t), False), "kvc_block": (8, False),
         "enum kvc_hash_algo": (4, True)}
C_STRUCT = {"kvc_hash": "Hash", "struct kvc_options": "Options",
            "struct kvc_pool_desc": "PoolDesc", "struct kvc_hash_extra": "HashExtra",
            "struct kvc_vllm_keys": "VllmKeys", "struct kvc_vllm_mm": "VllmMm",
            "struct kvc_vllm_extra": "VllmExtra", "struct kvc_event_key": "EventKey",
            "struct kvc_seal_info": "SealInfo"}


def c_kind(t):
    """A C type ("const kvc_hash *") as (base, pointer depth)."""
    t = re.sub(r"\bconst\b", "", t)
    depth = t.count("*")
    base = " ".join(t.replace("*", " ").split())
    if base == "kvc_conn":
        base, depth = "void", depth  # opaque: the binding passes it as void *
    if base in C_INT:
        base = C_INT[base]
    elif base in C_STRUCT:
        base = C_STRUCT[base]
    return base, depth


def py_kind(t):
    """A ctypes type as c_kind() would say it."""
    if t is None:
        return "void", 0
    if t is ctypes.c_char_p:
        return "char", 1
    if t is ctypes.c_void_p:
        return "void", 1
    if isinstance(t, type) and issubclass(t, ctypes.Structure):
        return t.__name__, 0
    if hasattr(t, "_type_") and not isinstance(t._type_, str):  # POINTER(x)
        base, depth = py_kind(t._type_)
        return base, depth + 1
    return (ctypes.sizeof(t), t(-1).value < 0), 0


def check_functions(header, mirrors, bad):
    src = open(header, encoding="utf-8").read()
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r"//[^\n]*", "", src)
    protos = {}
    for m in re.finditer(r"([A-Za-z_][\w \t*]*?)\b(kvc_\w+)\s*\(([^;{]*?)\)\s*;", src):
        ret = m.group(1).split("\n")[-1].strip()
        params = [p.strip() for p in m.group(3).replace("\n", " ").split(",")]
        params = [] if params == ["void"] else [re.sub(r"\w+$", "", p) for p in params]
        protos[m.group(2)] = (ret, params)
    n = 0
    for f in _native.lib.__dict__.values():
        if not isinstance(f, ctypes._CFuncPtr):
            continue
        n += 1
        name = f.__name__
        if name not in protos:
            bad.append(f"{name}: declared by the binding, not in kvcache.h")
            continue
        ret, params = protos[name]
        if f.argtypes is None:
            bad.append(f"{name}: called by the binding without argtypes")
            continue
        if c_kind(ret) != py_kind(f.restype):
            bad.append(f"{name}: returns {ret} in C, {f.restype} in the binding")
        if len(params) != len(f.argtypes):
            bad.append(f"{name}: {len(params)} parameters in C, {len(f.argtypes)} in the binding")
            continue
        for i, (cp, pt) in enumerate(zip(params, f.argtypes)):
            # An input array of hashes may be passed as bytes holding them
            # back to back: kvc_hash is 32 uint8_t (size 32, alignment 1),
            # so the bytes are the array, with no copy into Hash objects.
            if (pt is ctypes.c_char_p and c_kind(cp) == ("Hash", 1)
                    and re.search(r"\bconst\b", cp)
                    and ctypes.sizeof(_native.Hash) == 32
                    and ctypes.alignment(_native.Hash) == 1):
                continue
            if c_kind(cp) != py_kind(pt):
                bad.append(f"{name}: parameter {i} is {cp.strip()} in C, {pt} in the binding")
    return n


if __name__ == "__main__":
    sys.exit(main())
