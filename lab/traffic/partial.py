"""Frames as a sender with TX checksum offload hands them on (CHECKSUM_PARTIAL):
the TCP/UDP checksum field holds only the pseudo-header's sum, folded, not
inverted. The generator sends crafted frames; this makes them look, to the
program under test, like what a socket on a default veth sends."""

import struct

from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether


def _fold(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def partial(frame: bytes) -> bytes:
    """The frame with its TCP/UDP checksum as the sender's offload leaves it
    (frames that are neither are returned as they are)."""
    pkt = Ether(frame)
    l4 = pkt[TCP] if TCP in pkt else pkt[UDP] if UDP in pkt else None
    if l4 is None or (IP not in pkt and IPv6 not in pkt):
        return frame
    start = len(frame) - len(bytes(l4))
    proto = 6 if TCP in pkt else 17
    if IP in pkt:
        raw = bytes(pkt[IP])
        length = pkt[IP].len - pkt[IP].ihl * 4
        pseudo = raw[12:20] + struct.pack("!BBH", 0, proto, length)
    else:
        raw = bytes(pkt[IPv6])
        length = pkt[IPv6].plen - (start - (len(frame) - len(raw)) - 40)  # less any extension headers
        pseudo = raw[8:40] + struct.pack("!IxxxB", length, proto)
    off = start + (16 if proto == 6 else 6)
    return frame[:off] + struct.pack("!H", _fold(pseudo)) + frame[off + 2 :]
