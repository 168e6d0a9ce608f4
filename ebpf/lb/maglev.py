"""Maglev consistent hashing (Eisenbud et al., NSDI 2016), with weights: the
lookup table the load balancer's program indexes by a flow's hash.

    >>> table = maglev_table({"a": 1, "b": 1, "c": 2}, size=13)
    >>> len(table), sorted(set(table))
    (13, ['a', 'b', 'c'])

Every backend walks its own permutation of the table's slots (an offset and a
skip from two hashes of its name; the size is prime, so every skip visits every
slot) and takes the next free slot of it in turn. A weight w lets a backend take
a turn w/wmax as often (Katran's MaglevHashV2). Properties the tests check:
- balance: each backend holds about weight/total of the slots;
- minimal disruption: removing one of N backends moves only its own slots and
  about 1/N of the others; adding one back restores the table exactly;
- weight 0 takes no slots (a drained backend gets no new flows).
The table depends only on the backends' names and weights, never on the order
they are given in.

maglev_table() is the reference, in pure Python (0.1 s for 2 backends, 0.45 s for
1000); maglev_slots() fills the same table in C (native.c, built with cc on first
use) in a few milliseconds, and is what the load balancer writes. The tests hold the
two to the same tables over random backend sets and weights.
"""

import hashlib

from ebpf.abi import defines
from ebpf.lb import native

# the program's ring: a prime, one slot per ~15 flows at 1M flows over 64 backends
SIZE = defines("lb/xdp_lb.h")["LB_RING_SIZE"]


def _hash64(name: str, salt: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8, key=salt).digest(), "little")


def permutation(name: str, size: int) -> tuple[int, int]:
    """(offset, skip) of a backend's walk over a table of prime `size`."""
    return _hash64(name, b"maglev-offset") % size, _hash64(name, b"maglev-skip") % (size - 1) + 1


def _live(weights: dict, size: int) -> list:
    """The backends that take slots, sorted by name: [(name, weight)], checked."""
    if size < 3 or any(size % d == 0 for d in range(2, int(size**0.5) + 1)):
        raise ValueError(f"a Maglev table's size must be a prime, not {size}")
    if any(w < 0 for w in weights.values()):
        raise ValueError("backend weights must be 0 or more")
    live = sorted((n, w) for n, w in weights.items() if w > 0)
    if len(live) > size:
        raise ValueError(f"{len(live)} backends do not fit a table of {size} slots")
    return live


def maglev_slots(weights: dict, size: int = SIZE, index: dict | None = None):
    """The same table as maglev_table(), built in C (native.c): `size` u32 (a ctypes
    array), each slot index[name] of the backend holding it (default: its position
    among the backends with weight, sorted by name), or None when no backend has
    weight."""
    live = _live(weights, size)
    if not live:
        return None
    names = [name for name, _ in live]
    return native.maglev_fill(
        size,
        [permutation(name, size) for name in names],
        [w for _, w in live],
        [index[name] for name in names] if index is not None else range(len(names)),
    )


def maglev_table(weights: dict, size: int = SIZE) -> list:
    """The table: `size` slots, each holding a backend name from `weights`
    ({name: weight >= 0}), or None everywhere when no backend has weight. The
    reference builder, in Python: maglev_slots() builds the same in C."""
    live = _live(weights, size)
    if not live:
        return [None] * size
    wmax = max(w for _, w in live)
    walk = [permutation(n, size) for n, _ in live]
    nxt = [0] * len(live)
    credit = [0] * len(live)
    table = [None] * size
    filled = 0
    while True:
        for i, (name, w) in enumerate(live):
            credit[i] += w
            if credit[i] < wmax:
                continue
            credit[i] -= wmax
            offset, skip = walk[i]
            c = (offset + nxt[i] * skip) % size
            while table[c] is not None:
                nxt[i] += 1
                c = (offset + nxt[i] * skip) % size
            table[c] = name
            nxt[i] += 1
            filled += 1
            if filled == size:
                return table
