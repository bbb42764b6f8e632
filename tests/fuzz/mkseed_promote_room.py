#!/usr/bin/env python3
# Writes tests/fuzz/dispatch*/scenario-promote-room: usage mkseed_promote_room.py OUT
# Encodes a fuzz_dispatch input (tests/fuzz/fuzz_dispatch.c, step()) from a
# scenario, mirroring how the harness tracks handles (keep appends, forget
# swap-removes) so that picks name the intended blocks.
out = bytearray()
held = {0: [], 1: [], 2: []}
ctr = [0]

def fresh():
    ctr[0] += 1
    return ctr[0]

def forget(i, h):
    L = held[i]
    for k in range(len(L)):
        if L[k] == h:
            L[k] = L[-1]; L.pop(); return

def head(i, op, idx):
    """idx: list of indices into held[i] to pick (or [None] for a dummy)."""
    out.extend([i, op, len(idx) - 1])
    picked = []
    for x in idx:
        if x is None or not held[i]:
            out.append(0)
            if not held[i]:
                out.extend([0] * 8)
            picked.append(None)
        else:
            out.append(x)
            picked.append(held[i][x % len(held[i])])
    return picked

def register(i, which):
    head(i, 1, [None]); out.append(which)

def alloc(i, pidx, count):
    head(i, 2, [None]); out.extend([0, pidx, count - 1])
    for _ in range(count): held[i].append(fresh())

def seal(i, idx, base, pidx):
    hs = head(i, 3, idx); out.append(base)
    out.extend([1] * len(idx)); out.extend([pidx, 1])
    for h in hs: forget(i, h)
    for _ in hs: held[i].append(fresh())

def release(i, idx):
    for h in head(i, 5, idx): forget(i, h)

def swap_out(i, idx):
    for h in head(i, 8, idx): forget(i, h)

def evict(i, tier):
    head(i, 10, [None]); out.extend([tier, 1])

def pump(i=0):
    head(i, 14, [None])

def lookup(i, base, pidx):
    head(i, 4, [None]); out.extend([base, pidx])
    held[i].append(fresh())  # a hit (the scenario expects one)

# The scenario of tests/test_promote_room.c: G2 full of 7 swapped blocks of
# pool A (4 KiB) and one cached copy X; G1 full of pool B's (8 KiB) cached
# blocks and A's held ones; a lookup of X must make room in G1.
register(0, 0)            # A: pool[0]
register(0, 1)            # B: pool[1]
alloc(0, 0, 4); alloc(0, 0, 3)
swap_out(0, [0, 1, 2, 3])
swap_out(0, [0, 1, 2])
alloc(0, 0, 1)
seal(0, [0], 5, 0)
release(0, [0])
evict(0, 0); pump()
for r in range(10):
    alloc(0, 1, 1)
    seal(0, [len(held[0]) - 1], 40 + r * 4, 1)
    release(0, [len(held[0]) - 1])
alloc(0, 0, 1); alloc(0, 0, 1)
lookup(0, 5, 0)
pump()
import sys
open(sys.argv[1], 'wb').write(out)
