"""What a collector receives from vTAP sessions, decoded: the tunnel, its key
and the copied frame inside, from the bytes on the collector's wire. The lab's
own decoder (no tunnel device needed at the collector, as a sensor reading its
interface has none), used by the tests to check copies byte for byte and handy
in a notebook:

    >>> d = decap(frame)                                   # doctest: +SKIP
    >>> d.kind, d.key, d.truncated, len(d.inner)
    ('erspan', 7, True, 128)

Formats: VXLAN (RFC 7348), GENEVE (RFC 8926), GRE carrying Ethernet (0x6558,
with or without a key), ERSPAN type II (GRE 0x88be) and type III (0x22eb), over
IPv4 or IPv6. Returns None for anything else.
"""

import struct
from dataclasses import dataclass

UDP_PORTS = {4789: "vxlan", 6081: "geneve"}


@dataclass
class Decoded:
    kind: str  # vxlan, geneve, gre, erspan, erspan3
    key: int | None  # VNI, GRE key, ERSPAN session id
    inner: bytes  # the copied frame, as the tap saw it (cut if truncated)
    outer_src: bytes
    outer_dst: bytes
    seq: int | None = None  # GRE sequence number (ERSPAN)
    truncated: bool | None = None  # ERSPAN's T bit (the other formats have none)
    direction: int | None = None  # ERSPAN III's D bit: 0 ingress, 1 egress
    timestamp: int | None = None  # ERSPAN III, 100 us units
    udp_checksum: int | None = None
    udp_sport: int | None = None


def _outer(frame):
    """(protocol, src, dst, payload) of an IPv4/IPv6 packet in an Ethernet frame."""
    if len(frame) < 14:
        return None
    etype = struct.unpack_from("!H", frame, 12)[0]
    if etype == 0x0800 and len(frame) >= 34:
        ihl = (frame[14] & 0x0F) * 4
        total = struct.unpack_from("!H", frame, 16)[0]
        return frame[23], frame[26:30], frame[30:34], frame[14 + ihl : 14 + total]
    if etype == 0x86DD and len(frame) >= 54:
        plen = struct.unpack_from("!H", frame, 18)[0]
        return frame[20], frame[22:38], frame[38:54], frame[54 : 54 + plen]
    return None


def decap(frame: bytes, udp_ports=None) -> Decoded | None:
    ports = udp_ports or UDP_PORTS
    o = _outer(frame)
    if o is None:
        return None
    proto, src, dst, p = o
    if proto == 17 and len(p) >= 16:
        sport, dport, _, csum = struct.unpack_from("!HHHH", p)
        kind = ports.get(dport)
        if kind == "vxlan" and p[8] & 0x08:
            return Decoded(kind, int.from_bytes(p[12:15], "big"), p[16:], src, dst, udp_checksum=csum, udp_sport=sport)
        if kind == "geneve":
            optlen = (p[8] & 0x3F) * 4
            if struct.unpack_from("!H", p, 10)[0] != 0x6558:
                return None
            return Decoded(
                kind, int.from_bytes(p[12:15], "big"), p[16 + optlen :], src, dst, udp_checksum=csum, udp_sport=sport
            )
        return None
    if proto != 47 or len(p) < 4:
        return None
    flags, gproto = struct.unpack_from("!HH", p)
    off = 4 + (4 if flags & 0x8000 else 0)
    key = seq = None
    if flags & 0x2000:
        key = struct.unpack_from("!I", p, off)[0]
        off += 4
    if flags & 0x1000:
        seq = struct.unpack_from("!I", p, off)[0]
        off += 4
    if gproto == 0x6558:
        return Decoded("gre", key, p[off:], src, dst, seq=seq)
    if gproto == 0x88BE and len(p) >= off + 8:
        b0, b2 = struct.unpack_from("!HH", p, off)
        if b0 >> 12 != 1:
            return None
        return Decoded("erspan", b2 & 0x3FF, p[off + 8 :], src, dst, seq=seq, truncated=bool(b2 & 0x0400))
    if gproto == 0x22EB and len(p) >= off + 12:
        b0, b2, ts, _, low = struct.unpack_from("!HHIHH", p, off)
        if b0 >> 12 != 2:
            return None
        optional = 8 if low & 1 else 0
        return Decoded(
            "erspan3",
            b2 & 0x3FF,
            p[off + 12 + optional :],
            src,
            dst,
            seq=seq,
            truncated=bool(b2 & 0x0400),
            direction=(low >> 3) & 1,
            timestamp=ts,
        )
    return None
