"""Crafted frames for the lab: frames out of one namespace, exact counts
of them wherever they arrive.

Every frame of a Flow carries a marker in its payload (run token, flow number,
sequence number), so a Capture counts exactly the frames a test sent and nothing
the kernel adds on its own (IPv6 MLD, RSTs, ...). Frames that cannot carry a
marker (truncated headers) are counted by their exact bytes instead.

    >>> flows = [Flow("a", "198.18.1.10", "198.18.1.2", count=100)]      # doctest: +SKIP
    >>> with Capture(ns_rx, "eth0", marker) as rx:
    ...     report = send_frames(ns_tx, "eth0", build(flows, marker, src_mac, dst_mac))
    >>> rx.counts  # {"a": 100}
"""

import ctypes
import ipaddress
import secrets
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass

from .. import netns
from ..counters import iface_counters
from .report import MAX_PACKETS, MAX_SECONDS, SendReport

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_AUXDATA = 8
PACKET_STATISTICS = 6
PACKET_OUTGOING = 4
TP_STATUS_VLAN_VALID = 0x10
TP_STATUS_VLAN_TPID_VALID = 0x40


@dataclass
class Flow:
    """A bounded stream of frames of one shape. size is the Ethernet frame length
    without the 4-byte FCS (frames are padded up to it, never cut below their headers)."""

    name: str
    src: str
    dst: str
    proto: str = "udp"  # udp, tcp or raw (payload straight after IP)
    sport: int = 40000
    dport: int = 5001
    count: int = 100
    size: int = 128
    vlans: tuple = ()  # ((tpid, vid), ...), outermost first
    ip_options: bytes = b""  # IPv4 options (padded to 4 bytes)
    fragment: int = 0  # >0: IPv4 fragments of at most this many payload bytes


class Marker:
    """Tags frames of one run: b"VTL", a 4-byte run token, flow number, sequence
    number and the frame's own length. The length tells a frame from a copy of it
    quoted inside another packet (an ICMP error carries the original), which
    would otherwise count twice."""

    HEAD = b"VTL"
    LEN = 3 + 4 + 2 + 4 + 2

    def __init__(self):
        self.token = secrets.token_bytes(4)
        self.names = []

    def flow_id(self, name):
        if name not in self.names:
            self.names.append(name)
        return self.names.index(name)

    def encode(self, name, seq, frame_len) -> bytes:
        return self.HEAD + self.token + struct.pack("!HIH", self.flow_id(name), seq, frame_len & 0xFFFF)

    def __call__(self, frame: bytes):
        """Flow name of a marked frame of this run, else None."""
        i = frame.find(self.HEAD + self.token)
        if i < 0 or i + self.LEN > len(frame):
            return None
        fid, _, length = struct.unpack_from("!HIH", frame, i + 7)
        if length != len(frame) & 0xFFFF or fid >= len(self.names):
            return None
        return self.names[fid]


class ExactFrames:
    """Classifies frames by their exact bytes: for frames too short for a marker."""

    def __init__(self, named_frames: dict):
        self.by_bytes = {bytes(f): name for name, frames in named_frames.items() for f in frames}

    def __call__(self, frame: bytes):
        return self.by_bytes.get(frame)


def _l2(flow, src_mac, dst_mac):
    from scapy.layers.l2 import Dot1AD, Dot1Q, Ether  # noqa: PLC0415 -- slow (~0.5 s): only to build frames

    l2 = Ether(src=src_mac, dst=dst_mac)
    for tpid, vid in flow.vlans:
        l2 = l2 / (Dot1AD(vlan=vid) if tpid == 0x88A8 else Dot1Q(vlan=vid))
    return l2


def flow_frames(flow: Flow, marker: Marker, src_mac: str, dst_mac: str) -> list[bytes]:
    """The frames of one flow, built with scapy, each with its own sequence number.
    With flow.fragment, each packet becomes several IPv4 fragments; only the first
    carries the marker, so count fragments with ExactFrames.

    Frames of one flow differ only in the sequence number (the marker's, IPv4's id,
    TCP's seq) and so in their checksums: scapy builds the first and the others are
    its bytes with those fields and checksums written again, byte for byte what
    scapy builds for each (tests/test_frames.py), at 1/20 of the time. Building
    every frame with scapy was most of the test suite's CPU."""
    if flow.count > MAX_PACKETS:
        raise ValueError(f"flow {flow.name}: {flow.count} packets is over the lab's bound of {MAX_PACKETS}")
    if flow.fragment or flow.count <= 1 or (flow.proto == "tcp" and (flow.count - 1) * 1000 > 0xFFFFFFFF):
        return scapy_flow_frames(flow, marker, src_mac, dst_mac)
    first = bytearray(scapy_flow_frames(flow, marker, src_mac, dst_mac, seqs=[0])[0])
    return [bytes(first)] + [_patched(first, flow, marker, seq) for seq in range(1, flow.count)]


def scapy_flow_frames(flow: Flow, marker: Marker, src_mac: str, dst_mac: str, seqs=None) -> list[bytes]:
    """flow_frames() with every frame built by scapy (those of sequence numbers `seqs`: all by default)."""
    from scapy.layers.inet import IP, TCP, UDP, fragment  # noqa: PLC0415 -- slow (~0.5 s): only to build frames
    from scapy.layers.inet6 import IPv6  # noqa: PLC0415 -- slow (~0.5 s): only to build frames

    v6 = ipaddress.ip_address(flow.src).version == 6
    frames = []
    for seq in range(flow.count) if seqs is None else seqs:
        if v6:
            l3 = IPv6(src=flow.src, dst=flow.dst)
        else:
            l3 = IP(src=flow.src, dst=flow.dst, id=seq & 0xFFFF, options=flow.ip_options or [])
        if flow.proto == "udp":
            l3 = l3 / UDP(sport=flow.sport, dport=flow.dport)
        elif flow.proto == "tcp":
            l3 = l3 / TCP(sport=flow.sport, dport=flow.dport, flags="PA", seq=seq * 1000)
        head_len = len(_l2(flow, src_mac, dst_mac) / l3)
        pad = max(0, flow.size - head_len - Marker.LEN)
        l3 = l3 / (marker.encode(flow.name, seq, head_len + Marker.LEN + pad) + b"\0" * pad)
        pieces = fragment(l3, fragsize=flow.fragment) if flow.fragment else [l3]
        frames += [bytes(_l2(flow, src_mac, dst_mac) / piece) for piece in pieces]
    return frames


def _csum(data) -> int:
    """The Internet checksum (RFC 1071) of data."""
    if len(data) % 2:
        data = bytes(data) + b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _patched(first: bytearray, flow, marker, seq) -> bytes:
    """Frame `seq` of the flow whose frame 0 is `first`."""
    f = bytearray(first)
    l3 = 14 + 4 * len(flow.vlans)
    v6 = f[l3] >> 4 == 6
    if v6:
        l4, proto, pseudo_addrs = l3 + 40, f[l3 + 6], f[l3 + 8 : l3 + 40]
    else:
        l4, proto, pseudo_addrs = l3 + (f[l3] & 0x0F) * 4, f[l3 + 9], f[l3 + 12 : l3 + 20]
        struct.pack_into("!H", f, l3 + 4, seq & 0xFFFF)
    if flow.proto == "tcp":
        struct.pack_into("!I", f, l4 + 4, seq * 1000)
        payload = l4 + (f[l4 + 12] >> 4) * 4
    else:
        payload = l4 + 8 if flow.proto == "udp" else l4
    f[payload : payload + Marker.LEN] = marker.encode(flow.name, seq, len(f))
    if not v6:
        struct.pack_into("!H", f, l3 + 10, 0)
        struct.pack_into("!H", f, l3 + 10, _csum(f[l3:l4]))
    if flow.proto in ("udp", "tcp"):
        at = l4 + (6 if flow.proto == "udp" else 16)
        struct.pack_into("!H", f, at, 0)
        seg = f[l4:]
        ck = _csum(
            pseudo_addrs
            + struct.pack("!IxxxB" if v6 else "!xBH", *((len(seg), proto) if v6 else (proto, len(seg))))
            + seg
        )
        if flow.proto == "udp" and ck == 0:
            ck = 0xFFFF  # RFC 768: a sum of 0 is sent as all ones (0 means "no checksum")
        struct.pack_into("!H", f, at, ck)
    return bytes(f)


def build(flows, marker, src_mac, dst_mac, interleave=True) -> list[bytes]:
    """All frames of all flows; interleaved round-robin so no flow goes first."""
    per_flow = [flow_frames(f, marker, src_mac, dst_mac) for f in flows]
    if not interleave:
        return [fr for frames in per_flow for fr in frames]
    out = []
    for i in range(max((len(p) for p in per_flow), default=0)):
        out += [p[i] for p in per_flow if i < len(p)]
    return out


def packet_socket(ns, ifname, proto=0):
    """An AF_PACKET socket made inside a lab namespace, bound to ifname."""
    with netns.entered(ns):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(proto))
        s.bind((ifname, proto))
    return s


def send_frames(ns, ifname, frames, rate_pps=None, max_seconds=MAX_SECONDS, stop=None) -> SendReport:
    """Send every frame once from ns/ifname, optionally paced to rate_pps.
    Bounded: stops at max_seconds even if frames remain, and when `stop` (a
    threading.Event) is set. Reports what was sent."""
    if len(frames) > MAX_PACKETS:
        raise ValueError(f"{len(frames)} frames is over the lab's bound of {MAX_PACKETS}")
    sent = nbytes = 0
    with packet_socket(ns, ifname) as s:
        start = time.monotonic()
        deadline = start + max_seconds
        for i, frame in enumerate(frames):
            if rate_pps:
                due = start + i / rate_pps
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
            if time.monotonic() > deadline or (stop is not None and stop.is_set()):
                break
            while True:
                try:
                    nbytes += s.send(frame)
                    break
                except OSError as e:  # ENOBUFS: the device queue is full; wait, do not lose it
                    if e.errno != 105 or time.monotonic() > deadline:
                        raise
                    time.sleep(0.0005)
            sent += 1
        seconds = time.monotonic() - start
    return SendReport(sent, nbytes, seconds)


class _Aux(ctypes.Structure):
    _fields_ = [
        ("tp_status", ctypes.c_uint32),
        ("tp_len", ctypes.c_uint32),
        ("tp_snaplen", ctypes.c_uint32),
        ("tp_mac", ctypes.c_uint16),
        ("tp_net", ctypes.c_uint16),
        ("tp_vlan_tci", ctypes.c_uint16),
        ("tp_vlan_tpid", ctypes.c_uint16),
    ]


class Capture:
    """Counts classified frames arriving on (or leaving, direction="out") one
    interface of a lab namespace, in a background thread.

    A VLAN tag the kernel moved into packet metadata is put back into the frame
    (as libpcap does), so frames are seen as they were on the wire. `counts` maps
    classifier results to counts; `frames` keeps the raw frames if keep=True.

    A run ends (the `with` block's exit, or finish()) once the counts reach
    `expect`, if given, and then once the socket has read every frame the
    interface has counted: on the state, never on a quiet period. `unseen`:
    frames the run sends that the interface counts but its kernel discards
    before any packet socket (a VLAN tag cut short).
    """

    def __init__(self, ns, ifname, classify, direction="in", keep=False, expect=None, unseen=0):
        self.ns, self.ifname, self.classify = ns, ifname, classify
        self.direction, self.keep, self.expect, self.unseen = direction, keep, expect, unseen
        self.counts = Counter()
        self.frames = []
        self.kernel_drops = 0
        self._stop = threading.Event()
        self._read = 0  # frames of `direction` taken off the socket, classified or not
        self._dropped = 0  # frames the socket's queue dropped (either direction)

    def __enter__(self):
        self.sock = packet_socket(self.ns, self.ifname, ETH_P_ALL)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, 33, 32 << 20)  # SO_RCVBUFFORCE: room for bursts
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
        self.sock.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
        self.sock.settimeout(0.05)
        self._base = self._device_frames()
        self._socket_stats()  # (reading them resets them: start from zero)
        self._dropped = 0
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        size = ctypes.sizeof(_Aux)
        while not self._stop.is_set():
            try:
                data, anc, _, addr = self.sock.recvmsg(65536, socket.CMSG_SPACE(size))
            except socket.timeout:
                continue
            except OSError:
                return
            outgoing = addr[2] == PACKET_OUTGOING
            if (self.direction == "in" and outgoing) or (self.direction == "out" and not outgoing):
                continue
            self._read += 1
            for level, kind, payload in anc:
                if level == SOL_PACKET and kind == PACKET_AUXDATA and len(payload) >= size:
                    aux = _Aux.from_buffer_copy(payload[:size])
                    if aux.tp_status & TP_STATUS_VLAN_VALID:
                        tpid = aux.tp_vlan_tpid if aux.tp_status & TP_STATUS_VLAN_TPID_VALID else 0x8100
                        data = data[:12] + struct.pack("!HH", tpid, aux.tp_vlan_tci) + data[12:]
            key = self.classify(data)
            if key is None:
                continue
            self.counts[key] += 1
            if self.keep:
                self.frames.append(data)

    def _device_frames(self) -> int:
        """Frames the interface received (or sent, direction="out"), by the
        kernel's own count: a received frame is counted before packet sockets
        see it, so this socket has read it once its count is reached."""
        return iface_counters(self.ns, self.ifname)["rx_packets" if self.direction == "in" else "tx_packets"]

    def _socket_stats(self):
        self._dropped += struct.unpack("II", self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))[1]

    def reached(self, expect) -> bool:
        """The counts have reached `expect`: a total, or {key: count}."""
        if isinstance(expect, int):
            return sum(self.counts.values()) >= expect
        return all(self.counts[k] >= n for k, n in expect.items())

    def wait_for(self, expect, timeout=10.0) -> bool:
        """Wait until the counts reach `expect` (see reached()); False if they do
        not within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self.reached(expect):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def drain(self, timeout=2.0) -> bool:
        """Wait until every frame the interface has counted so far (in this
        capture's direction, by the kernel) has passed this socket and been
        classified: then no frame that reached the interface is still on its
        way to `counts`. False if that does not happen within `timeout` (frames
        the interface counts but never hands to packet sockets: those an XDP
        program there drops or sends back)."""
        deadline = time.monotonic() + timeout
        target = self._device_frames() - self._base
        while True:
            self._socket_stats()
            if self._read + self._dropped + self.unseen >= target:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)

    def finish(self, expect=None, timeout=10.0):
        """End of a run: wait for `expect` (if given), then for every frame the
        interface has counted to be classified. No waiting on silence."""
        if expect is not None:
            self.wait_for(expect, timeout)
        self.drain()

    def __exit__(self, *exc):
        if exc[0] is None:
            self.finish(self.expect)
        self._stop.set()
        self._thread.join()
        self._socket_stats()
        self.kernel_drops = self._dropped
        self.sock.close()
        return False


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def syn_flood(src_net, dst, dport, src_mac, dst_mac, count, first_port=1024) -> list[bytes]:
    """`count` TCP SYNs to dst:dport, each from a different (address of the IPv4
    network src_net, port) pair, checksums valid: what fills a load balancer's
    table of half-open connections. Plain struct packing (no scapy): a flood is
    100,000s of frames."""
    net = ipaddress.ip_network(src_net)
    hosts = [h.packed for h in net.hosts()]
    ports = 65536 - first_port
    if count > len(hosts) * ports:
        raise ValueError(f"{src_net} has fewer than {count} (address, port) pairs from port {first_port}")
    l2 = bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", "")) + b"\x08\x00"
    daddr = ipaddress.ip_address(dst).packed
    frames = []
    for i in range(count):
        saddr, sport = hosts[i % len(hosts)], first_port + i // len(hosts)
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, i & 0xFFFF, 0x4000, 64, 6, 0, saddr, daddr)
        ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
        tcp = struct.pack("!HHIIBBHHH", sport, dport, 0x10000 * i & 0xFFFFFFFF, 0, 5 << 4, 0x02, 64240, 0, 0)
        pseudo = saddr + daddr + struct.pack("!BBH", 0, 6, len(tcp))
        tcp = tcp[:16] + struct.pack("!H", _checksum(pseudo + tcp)) + tcp[18:]
        frames.append(l2 + ip + tcp)
    return frames


def tcp_frame(dst_mac: bytes, src_mac: bytes, src, sport, dst, dport, flags, payload=b"x" * 10) -> bytes:
    """One Ethernet/IPv4/TCP frame (MACs as 6 bytes each, flags as the TCP header's byte),
    every checksum right. Plain struct packing, as syn_flood(): a bench times tens of
    thousands of these, one each."""
    tcp = struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, flags, 65535, 0, 0) + payload
    saddr, daddr = ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed
    tcp = tcp[:16] + struct.pack("!H", _checksum(saddr + daddr + struct.pack("!BBH", 0, 6, len(tcp)) + tcp)) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, saddr, daddr)
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    return dst_mac + src_mac + b"\x08\x00" + ip + tcp
