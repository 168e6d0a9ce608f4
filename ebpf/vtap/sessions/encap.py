"""Tunnel headers for vTAP session targets, built once per session in user
space; the program copies them in front of each copy and fills in what
changes per copy (lengths, checksums, UDP source port, GRE sequence, ERSPAN
timestamp, truncation and direction bits).

    kind     outer      header after the outer IP                      inner
    vxlan    UDP 4789   flags 0x08, VNI (RFC 7348)                     Ethernet
    geneve   UDP 6081   version 0, no options, 0x6558, VNI (RFC 8926)   Ethernet
    gre      GRE        0x6558 (transparent Ethernet), key if given     Ethernet
    erspan   GRE+seq    0x88be, ERSPAN type II: version 1, session id   Ethernet
    erspan3  GRE+seq    0x22eb, ERSPAN type III: version 2, session id,  Ethernet
                        timestamp (100 us units), direction bit

The outer source address and the interface towards the collector come from the
namespace's routes (path()), looked up again while the tool runs.
"""

import ipaddress
import socket
import struct
from dataclasses import dataclass

from ebpf import netdev
from ebpf.errors import InputError

GRE_PROTO = {"gre": 0x6558, "erspan": 0x88BE, "erspan3": 0x22EB}
IPPROTO = {"vxlan": 17, "geneve": 17, "gre": 47, "erspan": 47, "erspan3": 47}
TTL = 64


@dataclass
class Path:
    ifindex: int
    ifname: str
    source: object  # ipaddress of the outer source
    mtu: int


def path(netns, address) -> Path:
    """How this namespace reaches the collector: the interface, the source
    address the kernel would choose, the MTU (the route's, else the device's)."""
    with netdev.ipr(netns) as ip:
        try:
            routes = ip.route("get", dst=str(address))
        except Exception as e:
            raise InputError(f"no route to collector {address}{netdev.where(netns)}: {netdev.reason(e)}") from None
        r = routes[0]
        oif = r.get_attr("RTA_OIF")
        src = r.get_attr("RTA_PREFSRC")
        metrics = r.get_attr("RTA_METRICS")
        mtu = metrics.get_attr("RTAX_MTU") if metrics else None
        dev = netdev.device(ip, oif) if oif else None
        if dev is None or src is None:
            raise InputError(
                f"no route to collector {address}{netdev.where(netns)} with a source address "
                f"(add one: ip route add {address} via GATEWAY)"
            )
        if oif == 1 or dev.name == "lo":
            raise InputError(f"collector {address} is an address of this namespace: copies would never leave it")
    return Path(oif, dev.name, ipaddress.ip_address(src), mtu or dev.mtu)


def header(target, source) -> bytes:
    """Outer IP header (lengths and checksum 0) and everything up to the inner
    Ethernet header."""
    kind, dst = target.kind, target.address
    if source.version != dst.version:
        raise InputError(f"collector {dst} and source {source} are of different families")
    proto = IPPROTO[kind]
    if dst.version == 4:
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 0, 0, 0x4000, TTL, proto, 0, source.packed, dst.packed)
    else:
        ip = struct.pack("!IHBB16s16s", 6 << 28, 0, proto, TTL, source.packed, dst.packed)
    if kind == "vxlan":
        return ip + struct.pack("!HHHH", 0, target.port, 0, 0) + struct.pack("!II", 0x08 << 24, target.key << 8)
    if kind == "geneve":
        return ip + struct.pack("!HHHH", 0, target.port, 0, 0) + struct.pack("!BBHI", 0, 0, 0x6558, target.key << 8)
    if kind == "gre":
        if target.key is None:
            return ip + struct.pack("!HH", 0, GRE_PROTO[kind])
        return ip + struct.pack("!HHI", 0x2000, GRE_PROTO[kind], target.key)
    gre = struct.pack("!HHI", 0x1000, GRE_PROTO[kind], 0)  # S: a sequence number follows
    if kind == "erspan":
        # ver 1, vlan 0 | cos 0, en 0, t 0, session | reserved 0, index 0
        return ip + gre + struct.pack("!HHI", 1 << 12, target.key & 0x3FF, 0)
    # ver 2, vlan 0 | cos 0, bso 0, t 0, session | timestamp | sgt 0 | p ft hwid d gra o (all 0)
    return ip + gre + struct.pack("!HHIHH", 2 << 12, target.key & 0x3FF, 0, 0, 0)


def overhead(target) -> int:
    """Bytes the tunnel adds before the inner Ethernet header's first byte, outer
    IP included (the inner Ethernet header itself is the copy's own)."""
    any_src = ipaddress.ip_address("0.0.0.0" if target.address.version == 4 else "::")
    return len(header(target, any_src))


def family_of(address) -> int:
    return socket.AF_INET if address.version == 4 else socket.AF_INET6
