"""Watch-lists: the IPv4/IPv6 networks whose traffic a vTAP copies, as
`--watch` and `--watch-file` give them, and as the program's LPM tries hold
them. Parsing is the standard library's; a bad entry is one line that names it
(and its file and line).

    >>> parse_watch_list(["198.18.0.0/24", "2001:2::1", "198.18.0.0/24"])
    [IPv4Network('198.18.0.0/24'), IPv6Network('2001:2::1/128')]
"""

import ctypes
import ipaddress
import sys

from ebpf.errors import InputError


def parse_watch_list(cidrs, where=None):
    """CIDR strings -> ip_network objects, duplicates dropped; a clear error for
    the first bad one (`where(i)` names entry i, e.g. a file and line)."""
    nets = {}
    for i, text in enumerate(cidrs):
        if isinstance(text, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
            nets.setdefault(text, None)  # parsed already (read_watch_file)
            continue
        at = f"{where(i)}: " if where else ""
        try:
            net = ipaddress.ip_network(text.strip(), strict=True)
        except ValueError as e:
            if "has host bits set" in str(e):
                fixed = ipaddress.ip_network(text.strip(), strict=False)
                raise InputError(f"{at}bad CIDR {text!r}: host bits set (did you mean {fixed}?)") from None
            raise InputError(f"{at}bad CIDR {text!r}: not an IPv4 or IPv6 address or network") from None
        nets.setdefault(net, None)
    return list(nets)


def read_watch_file(path):
    """A watch-list file: one CIDR per line; `#` starts a comment; blank lines are
    skipped. "-" reads standard input."""
    try:
        f = sys.stdin if path == "-" else open(path)
    except OSError as e:
        raise InputError(f"cannot read watch-list file {path}: {e.strerror}") from None
    with f:
        entries, lines = [], []
        for n, line in enumerate(f, 1):
            text = line.split("#", 1)[0].strip()
            if text:
                entries.append(text)
                lines.append(n)
    name = "standard input" if path == "-" else path
    return parse_watch_list(entries, where=lambda i: f"{name} line {lines[i]}")


def per_family(nets):
    """{4: IPv4 entries, 6: IPv6 entries}."""
    return {v: sum(n.version == v for n in nets) for v in (4, 6)}


def trie_key(table, net):
    """The LPM trie key of a network (struct watch_v4_key / watch_v6_key of
    vtap.h): its prefix length, then its address in network byte order."""
    key = table.Key()
    key.prefixlen = net.prefixlen
    packed = net.network_address.packed
    if net.version == 4:
        key.addr = ctypes.c_uint32.from_buffer_copy(packed).value  # keep network byte order
    else:
        key.addr = (ctypes.c_uint8 * 16)(*packed)
    return key
