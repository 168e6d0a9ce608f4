"""The sessions' rules as the classifier's tables (sessions.h): one bitmap of
rules per value of each field, so that the program ANDs six lookups and takes
the lowest bit per session, whatever the number of rules.

Rule i of the whole program (sessions in order, each one's rules in order) is
bit i. For each field, a value's bitmap holds the rules that field allows:

  direction   rules for that direction or any
  protocol    rules for that protocol or any (entry 255: a frame whose protocol
              is not known, only any-protocol rules)
  address     per family and side, one LPM entry per prefix some rule names,
              and /0: the rules whose prefix contains it, or that name none on
              that side (prefixes nest or are disjoint, so the longest match
              has exactly the rules that contain the address)
  port        per side, 65536 ports and "no port" (fragments, ICMP, ...): the
              rules whose range holds the port, or that name no port on that side

A rule of one family is in no entry of the other family's tries, so it never
matches the other family's frames.
"""

import ctypes
import ipaddress
import sys

from ebpf.abi import defines
from ebpf.vtap.sessions.config import DIRECTIONS

SESSIONS_H = defines("vtap/sessions/sessions.h")
WORDS = SESSIONS_H["SESS_WORDS"]
PORT_SLOTS = SESSIONS_H["SESS_PORT_SLOTS"]
NO_PORT = SESSIONS_H["SESS_NO_PORT"]
UNKNOWN_PROTO = 255


def rule_list(sessions):
    """[(session slot, rule)] in bit order."""
    return [(slot, r) for slot, s in enumerate(sessions) for r in s.rules]


def field_bits(sessions) -> dict:
    """Every table's content as Python ints (bit i = rule i)."""
    rules = rule_list(sessions)
    every = (1 << len(rules)) - 1

    def those(pred):
        return sum(1 << i for i, (_, r) in enumerate(rules) if pred(r))

    direction = [those(lambda r, d=d: r.direction in ("any", d)) for d in DIRECTIONS[1:]]
    any_proto = those(lambda r: r.proto is None)
    proto = [any_proto | those(lambda r, p=p: r.proto == p) for p in range(256)]
    proto[UNKNOWN_PROTO] = any_proto

    tries = {}
    for family in (4, 6):
        for side in (0, 1):

            def net_of(r, side=side):
                return r.src if side == 0 else r.dst

            fits = [r.family in (None, family) for _, r in rules]
            prefixes = {ipaddress.ip_network("0.0.0.0/0" if family == 4 else "::/0")}
            prefixes |= {net_of(r) for _, r in rules if net_of(r) is not None and net_of(r).version == family}
            for p in prefixes:
                bits = 0
                for i, (_, r) in enumerate(rules):
                    n = net_of(r)
                    if fits[i] and (n is None or p.subnet_of(n)):
                        bits |= 1 << i
                tries[(family, side, p)] = bits

    ports = []
    for side in (0, 1):
        table = [0] * PORT_SLOTS
        open_bits = 0
        for i, (_, r) in enumerate(rules):
            rng = r.sports if side == 0 else r.dports
            if rng is None:
                open_bits |= 1 << i
        # ranges as +/- events along the ports, so building costs O(ports + rules)
        delta = [0] * (65537)
        for i, (_, r) in enumerate(rules):
            rng = r.sports if side == 0 else r.dports
            if rng is not None:
                delta[rng[0]] ^= 1 << i
                delta[rng[1] + 1] ^= 1 << i
        cur = 0
        for port in range(65536):
            cur ^= delta[port]
            table[port] = cur | open_bits
        table[NO_PORT] = open_bits
        ports.append(table)
    return {
        "direction": direction,
        "proto": proto,
        "tries": tries,
        "sport": ports[0],
        "dport": ports[1],
        "rules": rules,
        "every": every,
    }


def to_bits(table, value: int):
    """A Python int as the map's struct sess_bits."""
    b = table.Leaf()
    for w in range(WORDS):
        b.w[w] = (value >> (64 * w)) & 0xFFFFFFFFFFFFFFFF
    return b


def write_array(table, base, values):
    """values[i] at key base + i, in one batch where the kernel has it. Built as bytes:
    the port tables are 65,537 entries each, written whole at every change of the
    sessions (a host an alert holds is one), and element by element that took 0.3 s."""
    n = len(values)
    key_size = ctypes.sizeof(table.Key)
    keys = (table.Key * n).from_buffer_copy(
        b"".join(k.to_bytes(key_size, sys.byteorder) for k in range(base, base + n))
    )
    cache = {}
    for v in set(values):
        cache[v] = bytes(to_bits(table, v))
    leaves = (table.Leaf * n).from_buffer_copy(b"".join(map(cache.__getitem__, values)))
    try:
        table.items_update_batch(keys, leaves)
    except Exception:  # an older kernel without batch operations on arrays
        for i in range(n):
            table[keys[i]] = leaves[i]


def trie_key(table, gen, side, net):
    k = table.Key()
    k.prefixlen = 16 + net.prefixlen
    k.gen, k.side = gen, side
    raw = net.network_address.packed
    for i, byte in enumerate(raw):
        k.addr[i] = byte
    return k


def write_tries(table, gen, tries):
    """Replace generation gen's entries in both tries with `tries` (table: the
    program's map by name)."""
    for family, name in ((4, "lpm4"), (6, "lpm6")):
        t = table(name)
        stale = [k for k in list(t.keys()) if k.gen == gen]
        for k in stale:
            del t[k]
        for (fam, side, net), bits in tries.items():
            if fam == family:
                t[trie_key(t, gen, side, net)] = to_bits(t, bits)


def write_array_u64(table, base, values):
    """values[i] (u64) at key base + i, in one batch where the kernel has it."""
    n = len(values)
    key_size = ctypes.sizeof(table.Key)
    keys = (table.Key * n).from_buffer_copy(
        b"".join(k.to_bytes(key_size, sys.byteorder) for k in range(base, base + n))
    )
    leaves = (table.Leaf * n)(*values)
    try:
        table.items_update_batch(keys, leaves)
    except Exception:  # an older kernel without batch operations on arrays
        for i in range(n):
            table[keys[i]] = leaves[i]
