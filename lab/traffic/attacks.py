"""Attack traffic with ground truth, for the IDS experiment: a seeded scapy
generator that writes a pcap and a truth file (the alerts each signature of
lab/rules/vtap-lab.rules must raise on it).

    >>> traffic = generate(seed=1, repetitions=3)                      # doctest: +SKIP
    >>> write_pcap("attacks.pcap", traffic.frames); write_truth("truth.csv", traffic.truth)

What pytbull sends from a live attacker, crafted here, in the same categories:
port scans, floods, web attacks, a client-side attack, shellcode, failed logins,
fragments, bad traffic and evasion, among benign background (HTTP, DNS, ping,
fragmented UDP). Every TCP session is written in both directions (handshake,
data with its ACKs, teardown), so `flow:established` and HTTP rules fire with
no live server.

Each repetition is the whole mix again with fresh client ports, addresses and
sequence numbers: a replay loop of identical sessions would be retransmission
to an IDS, and its stateful rules would not fire again. So the truth for N
repetitions is exactly N times one repetition's, and a long run is a long pcap.

The same seed and repetitions give the same bytes (pcap timestamps included).
Addresses: the protected hosts are in 198.18.1.96/27 (HOME_NET, default), the
attackers and outside servers in 198.19.0.0/16. Frames carry MAC addresses of
no lab interface, so the receiving host's stack drops them at once, after its
taps (AF_PACKET, tc) have seen them.
"""

import csv
import random
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

HOME_NET = "198.18.1.96/27"
RULES = Path(__file__).resolve().parent.parent / "rules" / "vtap-lab.rules"
SRC_MAC = "02:76:74:6c:00:01"  # "vtl": locally administered, no lab interface has them
DST_MAC = "02:76:74:6c:00:02"
PCAP_EPOCH = 1_700_000_000  # fixed timestamps: the same seed gives the same file
PCAP_STEP_US = 100
MSS = 1448


def _scapy():
    # scapy is slow to import (~0.5 s): once, here, when traffic is generated; the truth files and
    # rule messages below, and the bench that imports this module for `python -m lab --help`, need none
    from scapy.layers.dns import DNS, DNSQR, DNSRR  # noqa: PLC0415 -- slow (see above)
    from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption, fragment  # noqa: PLC0415 -- slow (see above)
    from scapy.layers.l2 import Ether  # noqa: PLC0415 -- slow (see above)

    return {
        "IP": IP,
        "TCP": TCP,
        "UDP": UDP,
        "ICMP": ICMP,
        "DNS": DNS,
        "DNSQR": DNSQR,
        "DNSRR": DNSRR,
        "Ether": Ether,
        "fragment": fragment,
        "IPOption": IPOption,
    }


@dataclass
class Traffic:
    frames: list = field(default_factory=list)  # bytes, in replay order
    truth: Counter = field(default_factory=Counter)  # sid -> alerts expected
    seed: int = 0
    repetitions: int = 1


class _Builder:
    """One repetition after another, each with fresh addresses, ports and sequence numbers."""

    def __init__(self, seed):
        self.s = _scapy()
        self.rng = random.Random(seed)
        self.frames = []
        self.truth = Counter()
        self._port = 0

    # -- addresses and ports ------------------------------------------------------
    def home(self):
        return f"198.18.1.{self.rng.randrange(100, 124)}"

    def outside(self):
        return f"198.19.{self.rng.randrange(1, 255)}.{self.rng.randrange(1, 255)}"

    def client_port(self):
        # a new ephemeral port for every session of the run (wraps after 30,000
        # sessions; the addresses differ by then): no two sessions look alike
        self._port = (self._port + 1) % 30000
        return 32768 + self._port

    def isn(self):
        return self.rng.randrange(1 << 32)

    # -- frames -------------------------------------------------------------------
    def emit(self, pkt, expect=()):
        self.frames.append(bytes(self.s["Ether"](src=SRC_MAC, dst=DST_MAC) / pkt))
        for sid in expect:
            self.truth[sid] += 1

    def ip(self, src, dst, **kw):
        return self.s["IP"](src=src, dst=dst, id=self.rng.randrange(1 << 16), **kw)

    def tcp_session(self, client, server, sport, dport, exchanges, expect=()):
        """A complete TCP session: handshake, each (from_client, payload) with the
        other side's ACK, FIN from the client, FIN from the server, last ACK.
        `expect`: sids whose alert this session raises once."""
        IP, TCP = self.ip, self.s["TCP"]
        cseq, sseq = self.isn(), self.isn()
        c, s = (client, server), (server, client)
        self.emit(IP(*c) / TCP(sport=sport, dport=dport, flags="S", seq=cseq, window=64240))
        self.emit(IP(*s) / TCP(sport=dport, dport=sport, flags="SA", seq=sseq, ack=cseq + 1, window=65160))
        cseq += 1
        sseq += 1
        self.emit(IP(*c) / TCP(sport=sport, dport=dport, flags="A", seq=cseq, ack=sseq, window=502))
        for from_client, payload in exchanges:
            # MSS-sized segments; the receiver ACKs every second one and the last (delayed ACK)
            segs = [payload[i : i + MSS] for i in range(0, len(payload), MSS)]
            for i, seg in enumerate(segs):
                last = i == len(segs) - 1
                flags = "PA" if last else "A"
                if from_client:
                    self.emit(IP(*c) / TCP(sport=sport, dport=dport, flags=flags, seq=cseq, ack=sseq, window=502) / seg)
                    cseq += len(seg)
                else:
                    self.emit(IP(*s) / TCP(sport=dport, dport=sport, flags=flags, seq=sseq, ack=cseq, window=509) / seg)
                    sseq += len(seg)
                if last or i % 2 == 1:
                    if from_client:
                        self.emit(IP(*s) / TCP(sport=dport, dport=sport, flags="A", seq=sseq, ack=cseq, window=509))
                    else:
                        self.emit(IP(*c) / TCP(sport=sport, dport=dport, flags="A", seq=cseq, ack=sseq, window=502))
        self.emit(IP(*c) / TCP(sport=sport, dport=dport, flags="FA", seq=cseq, ack=sseq, window=502))
        self.emit(IP(*s) / TCP(sport=dport, dport=sport, flags="FA", seq=sseq, ack=cseq + 1, window=509))
        self.emit(IP(*c) / TCP(sport=sport, dport=dport, flags="A", seq=cseq + 1, ack=sseq + 1, window=502))
        for sid in expect:
            self.truth[sid] += 1

    def http(self, client, server, request, response, expect=()):
        self.tcp_session(client, server, self.client_port(), 80, [(True, request), (False, response)], expect)

    # -- one repetition of the mix ----------------------------------------------------------
    def repetition(self):
        parts = [
            self.scans,
            self.floods,
            self.web,
            self.client_side,
            self.shellcode,
            self.logins,
            self.fragments,
            self.bad_traffic,
            self.dns,
        ] + [self.background] * 4
        self.rng.shuffle(parts)
        for part in parts:
            part()

    def scans(self):
        IP, TCP, UDP = self.ip, self.s["TCP"], self.s["UDP"]
        scanner, victim = self.outside(), self.home()
        sport = self.client_port()
        for port in self.rng.sample(range(1, 1024), 20):  # SYN scan; closed ports answer RST
            seq = self.isn()
            self.emit(
                IP(scanner, victim) / TCP(sport=sport, dport=port, flags="S", seq=seq, window=1024), expect=[9100001]
            )
            self.emit(IP(victim, scanner) / TCP(sport=port, dport=sport, flags="RA", seq=0, ack=seq + 1, window=0))
        for port in self.rng.sample(range(1, 1024), 5):
            self.emit(
                IP(scanner, victim) / TCP(sport=sport, dport=port, flags="FPU", seq=self.isn(), window=1024),
                expect=[9100002],
            )
        for port in self.rng.sample(range(1, 1024), 5):
            self.emit(
                IP(scanner, victim) / TCP(sport=sport, dport=port, flags=0, seq=self.isn(), window=1024),
                expect=[9100003],
            )
        for port in self.rng.sample(range(1024, 33000), 10):
            self.emit(IP(scanner, victim) / UDP(sport=sport, dport=port), expect=[9100004])

    def floods(self):
        IP, TCP, UDP, ICMP = self.ip, self.s["TCP"], self.s["UDP"], self.s["ICMP"]
        attacker, victim = self.outside(), self.home()
        ident = self.rng.randrange(1 << 16)
        for seq in range(10):
            self.emit(IP(attacker, victim) / ICMP(type=8, id=ident, seq=seq) / (b"X" * 1400), expect=[9100005])
        for _ in range(5):  # land: a SYN from the victim to itself
            port = self.rng.choice([80, 139, 445])
            self.emit(
                IP(victim, victim) / TCP(sport=port, dport=port, flags="S", seq=self.isn(), window=8192),
                expect=[9100006],
            )
        for _ in range(20):  # chargen flood from spoofed sources
            self.emit(
                IP(self.outside(), victim) / UDP(sport=self.rng.randrange(1024, 65536), dport=19) / (b"A" * 64),
                expect=[9100007],
            )

    def web(self):
        server = self.home()
        ua = b"User-Agent: Mozilla/5.0 (X11; Linux x86_64)\r\n"
        ok = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\n\r\n<html></html>"
        attacks = [
            (b"/item.php?id=1%20UNION%20SELECT%20user,password%20FROM%20users", ua, 9100008),
            (b"/static/../../../../etc/passwd", ua, 9100009),
            (b"/search?q=%3Cscript%3Ealert(document.cookie)%3C/script%3E", ua, 9100010),
            (b"/cgi-bin/status", b"User-Agent: () { :; }; /bin/bash -c 'id'\r\n", 9100011),
        ]
        for uri, agent, sid in attacks:
            req = b"GET " + uri + b" HTTP/1.1\r\nHost: www.home.lab\r\n" + agent + b"Accept: */*\r\n\r\n"
            self.http(self.outside(), server, req, ok, expect=[sid])

    def client_side(self):
        body = (
            b"%PDF-1.4\n1 0 obj << /Type /Catalog /OpenAction 2 0 R >> endobj\n"
            b"2 0 obj << /S /JavaScript /JS (app.alert\\('x'\\)) >> endobj\n%%EOF\n"
        )
        resp = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/pdf\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        req = b"GET /invoice.pdf HTTP/1.1\r\nHost: files.outside.example\r\nUser-Agent: Mozilla/5.0\r\n\r\n"
        self.http(self.home(), self.outside(), req, resp, expect=[9100012])

    def shellcode(self):
        nops = b"\x90" * 64
        execve = (
            b"\x31\xc0\x50\x68\x2f\x2f\x73\x68\x68\x2f\x62\x69\x6e\x89\xe3\x50\x53\x89\xe1\xb0\x0b\xcd\x80/bin/sh\x00"
        )
        self.tcp_session(
            self.outside(),
            self.home(),
            self.client_port(),
            4444,
            [(True, b"HELO " + nops + b"\xcc" * 8)],
            expect=[9100013],
        )
        self.tcp_session(
            self.outside(), self.home(), self.client_port(), 9999, [(True, b"EXEC " + execve)], expect=[9100014]
        )

    def logins(self):
        ftp = [
            (False, b"220 ProFTPD Server ready.\r\n"),
            (True, b"USER admin\r\n"),
            (False, b"331 Password required for admin\r\n"),
            (True, b"PASS guess1\r\n"),
            (False, b"530 Login incorrect.\r\n"),
            (True, b"QUIT\r\n"),
            (False, b"221 Goodbye.\r\n"),
        ]
        pop = [
            (False, b"+OK POP3 server ready\r\n"),
            (True, b"USER alice\r\n"),
            (False, b"+OK\r\n"),
            (True, b"PASS 123456\r\n"),
            (False, b"-ERR authentication failed\r\n"),
            (True, b"QUIT\r\n"),
            (False, b"+OK bye\r\n"),
        ]
        attacker = self.outside()
        for _ in range(3):  # one failed login per session: brute force opens one after another
            self.tcp_session(attacker, self.home(), self.client_port(), 21, ftp, expect=[9100015])
        for _ in range(2):
            self.tcp_session(attacker, self.home(), self.client_port(), 110, pop, expect=[9100016])

    def fragments(self):
        UDP, ICMP = self.s["UDP"], self.s["ICMP"]
        attacker, victim = self.outside(), self.home()
        # tiny fragments: a UDP datagram cut into 8-byte pieces (every piece but
        # the last has More Fragments set: those are the tiny ones the rule flags)
        dgram = bytes(UDP(sport=self.rng.randrange(1024, 65536), dport=53) / (b"Q" * 32))
        ident = self.rng.randrange(1 << 16)
        pieces = [dgram[i : i + 8] for i in range(0, len(dgram), 8)]
        for i, piece in enumerate(pieces):
            more = i < len(pieces) - 1
            self.emit(
                self.s["IP"](src=attacker, dst=victim, id=ident, proto=17, flags="MF" if more else 0, frag=i) / piece,
                expect=[9100017] if more else [],
            )
        # overlapping fragments (teardrop-like): the second starts inside the first
        ident = self.rng.randrange(1 << 16)
        payload = bytes(ICMP(type=8, id=ident, seq=1) / (b"O" * 48))
        self.emit(self.s["IP"](src=attacker, dst=victim, id=ident, proto=1, flags="MF", frag=0) / payload[:32])
        self.emit(
            self.s["IP"](src=attacker, dst=victim, id=ident, proto=1, flags=0, frag=2) / payload[16:], expect=[9100018]
        )

    def bad_traffic(self):
        IP, TCP, IPOption = self.ip, self.s["TCP"], self.s["IPOption"]
        attacker, victim = self.outside(), self.home()
        for _ in range(5):  # TCP checksum wrong
            self.emit(
                IP(attacker, victim)
                / TCP(sport=self.client_port(), dport=80, flags="S", seq=self.isn(), window=8192, chksum=0xDEAD),
                expect=[9100019],
            )
        for _ in range(3):  # IP header checksum wrong (an ICMP echo, so no other rule looks)
            self.emit(
                self.s["IP"](src=attacker, dst=victim, id=self.rng.randrange(1 << 16), chksum=0xBEEF)
                / self.s["ICMP"](type=8, id=7, seq=1)
                / b"ping",
                expect=[9100020],
            )
        for _ in range(3):  # loose source route: traffic that asks to be routed via a host of the attacker's
            opt = bytes([0x83, 7, 4]) + bytes(map(int, attacker.split(".")))
            self.emit(
                IP(attacker, victim, options=[IPOption(opt)]) / self.s["ICMP"](type=8, id=9, seq=1) / b"route",
                expect=[9100021],
            )

    def dns(self):
        IP, UDP, DNS, DNSQR = self.ip, self.s["UDP"], self.s["DNS"], self.s["DNSQR"]
        client, resolver = self.home(), self.outside()
        ident = self.rng.randrange(1 << 16)
        sport = self.client_port()
        self.emit(
            IP(client, resolver)
            / UDP(sport=sport, dport=53)
            / DNS(id=ident, rd=1, qd=DNSQR(qname="update.malware.example")),
            expect=[9100022],
        )
        self.emit(
            IP(resolver, client)
            / UDP(sport=53, dport=sport)
            / DNS(id=ident, qr=1, ra=1, rcode=3, qd=DNSQR(qname="update.malware.example"))
        )

    def background(self):
        """Benign traffic no rule may flag: a web page, a DNS lookup, a ping and a
        fragmented UDP datagram (normal-sized fragments)."""
        IP, UDP, ICMP = self.ip, self.s["UDP"], self.s["ICMP"]
        DNS, DNSQR, DNSRR = self.s["DNS"], self.s["DNSQR"], self.s["DNSRR"]
        client, server = self.outside(), self.home()
        # pages of 1-24 kB: most bytes of real traffic are in full-sized segments
        page = b"<html><body>" + b"lorem ipsum " * self.rng.randrange(80, 2000) + b"</body></html>"
        self.http(
            client,
            server,
            b"GET /index.html HTTP/1.1\r\nHost: www.home.lab\r\nUser-Agent: curl/8.5\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: "
            + str(len(page)).encode()
            + b"\r\n\r\n"
            + page,
        )
        home, resolver = self.home(), self.outside()
        ident, sport = self.rng.randrange(1 << 16), self.client_port()
        self.emit(
            IP(home, resolver) / UDP(sport=sport, dport=53) / DNS(id=ident, rd=1, qd=DNSQR(qname="www.example.org"))
        )
        self.emit(
            IP(resolver, home)
            / UDP(sport=53, dport=sport)
            / DNS(
                id=ident,
                qr=1,
                ra=1,
                qd=DNSQR(qname="www.example.org"),
                an=DNSRR(rrname="www.example.org", rdata="198.19.200.1"),
            )
        )
        ident = self.rng.randrange(1 << 16)
        self.emit(IP(home, resolver) / ICMP(type=8, id=ident, seq=1) / (b"p" * 56))
        self.emit(IP(resolver, home) / ICMP(type=0, id=ident, seq=1) / (b"p" * 56))
        big = IP(client, server, flags=0) / UDP(sport=self.client_port(), dport=5001) / (b"D" * 3000)
        for frag in self.s["fragment"](big, fragsize=1480):
            self.emit(frag)


CRAFTED = 4  # repetitions scapy crafts; the rest are derived from them (see derive())


def generate(seed=1, repetitions=1) -> Traffic:
    """`repetitions` times the whole mix, in memory (see stream() for long runs)."""
    frames, truth = stream(seed, repetitions)
    return Traffic(list(frames), truth, seed, repetitions)


def stream(seed=1, repetitions=1):
    """(frames, truth): an iterator over `repetitions` times the whole mix, and
    the alerts it must raise. The first CRAFTED repetitions are made by scapy
    (about 1,000 frames/s here); the others are copies of them with new outside
    addresses and sequence numbers (about 100 times faster, and as exact),
    made as they are read, so a long run never sits in memory."""
    if not 1 <= repetitions <= MAX_REPETITIONS:
        raise ValueError(f"repetitions {repetitions} is outside 1..{MAX_REPETITIONS}")
    b = _Builder(seed)
    crafted = []
    for _ in range(min(repetitions, CRAFTED)):
        start = len(b.frames)
        b.repetition()
        crafted.append(b.frames[start:])
    per_rep = Counter({sid: n // len(crafted) for sid, n in b.truth.items()})
    truth = Counter({sid: n * repetitions for sid, n in per_rep.items()})

    def frames():
        for rep in crafted:
            yield from rep
        for k in range(len(crafted), repetitions):
            delta = b.rng.randrange(1, 1 << 32)
            for f in crafted[k % len(crafted)]:
                yield derive(f, k, delta)

    return frames(), truth


# --- derived repetitions ------------------------------------------------------------------
#
# A copy of a crafted frame for repetition k: every outside address (198.19.0.0/16)
# moved to another by a per-k bijection, every TCP sequence and acknowledgement
# number shifted by a per-k delta (the same in both directions, so sessions stay
# whole), and the checksums updated incrementally (RFC 1624): a checksum that was
# right stays right, one crafted wrong stays wrong by the same amount.

MAX_REPETITIONS = 20_000
_OUTSIDE = 254 * 254  # 198.19.a.b, a and b in 1..254
_STRIDE = 7919  # prime to _OUTSIDE: the k-th map repeats after _OUTSIDE repetitions


def _fold(x):
    while x >> 16:
        x = (x & 0xFFFF) + (x >> 16)
    return x


def _words(b):
    return sum(int.from_bytes(b[i : i + 2], "big") for i in range(0, len(b), 2))


def _moved(addr: bytes, k: int) -> bytes:
    if addr[0] != 198 or addr[1] != 19 or not (1 <= addr[2] <= 254 and 1 <= addr[3] <= 254):
        return addr
    n = ((addr[2] - 1) * 254 + addr[3] - 1 + k * _STRIDE) % _OUTSIDE
    return bytes((198, 19, n // 254 + 1, n % 254 + 1))


def derive(frame: bytes, k: int, delta: int) -> bytes:
    f = bytearray(frame)
    if f[12:14] != b"\x08\x00":
        return bytes(f)
    ip = 14
    ihl = (f[ip] & 0x0F) * 4
    old_src, old_dst = bytes(f[ip + 12 : ip + 16]), bytes(f[ip + 16 : ip + 20])
    src, dst = _moved(old_src, k), _moved(old_dst, k)
    if (src, dst) != (old_src, old_dst):
        old_addrs, new_addrs = old_src + old_dst, src + dst
        f[ip + 12 : ip + 20] = new_addrs
        _patch(f, ip + 10, old_addrs, new_addrs)  # IPv4 header checksum
    else:
        old_addrs = new_addrs = b""
    proto = f[ip + 9]
    first = (int.from_bytes(f[ip + 6 : ip + 8], "big") & 0x1FFF) == 0
    l4 = ip + ihl
    if not first:
        return bytes(f)
    if proto == 6 and len(f) >= l4 + 20:
        old = bytes(f[l4 + 4 : l4 + 12])
        seq = (int.from_bytes(old[:4], "big") + delta) & 0xFFFFFFFF
        ack = int.from_bytes(old[4:], "big")
        if f[l4 + 13] & 0x10:  # ACK set: the acknowledgement number is a sequence number too
            ack = (ack + delta) & 0xFFFFFFFF
        new = seq.to_bytes(4, "big") + ack.to_bytes(4, "big")
        f[l4 + 4 : l4 + 12] = new
        _patch(f, l4 + 16, old_addrs + old, new_addrs + new)  # pseudo-header + header
    elif proto == 17 and len(f) >= l4 + 8 and f[l4 + 6 : l4 + 8] != b"\x00\x00":
        _patch(f, l4 + 6, old_addrs, new_addrs)  # pseudo-header
        if f[l4 + 6 : l4 + 8] == b"\x00\x00":  # in UDP 0 means "no checksum": send its other form
            f[l4 + 6 : l4 + 8] = b"\xff\xff"
    return bytes(f)


def _patch(f, at, old, new):
    """Update the checksum at f[at:at+2] for words `old` replaced by `new`
    (RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'))."""
    if old == new:
        return
    hc = int.from_bytes(f[at : at + 2], "big")
    m_old = _fold(_words(old))
    m_new = _fold(_words(new))
    x = _fold((~hc & 0xFFFF) + (~m_old & 0xFFFF) + m_new)
    f[at : at + 2] = (~x & 0xFFFF).to_bytes(2, "big")


# --- files ---------------------------------------------------------------------------


def write_pcap(path, frames) -> tuple[int, int]:
    """A classic pcap (microseconds, Ethernet) with fixed timestamps, from any
    iterable of frames. Returns (frames, bytes) written."""
    n = nbytes = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for n, frame in enumerate(frames, start=1):
            t = PCAP_EPOCH * 1_000_000 + (n - 1) * PCAP_STEP_US
            f.write(struct.pack("<IIII", t // 1_000_000, t % 1_000_000, len(frame), len(frame)))
            f.write(frame)
            nbytes += len(frame)
    return n, nbytes


def read_pcap(path) -> list[bytes]:
    """Frames of a classic pcap (either byte order, micro- or nanosecond stamps)."""
    data = Path(path).read_bytes()
    if len(data) < 24:
        raise ValueError(f"{path}: not a pcap file (too short)")
    end = _byte_order(data[:4], path)
    frames, off = [], 24
    while off + 16 <= len(data):
        _, _, caplen, _ = struct.unpack(end + "IIII", data[off : off + 16])
        off += 16
        frames.append(data[off : off + caplen])
        off += caplen
    return frames


def pcap_stats(path) -> tuple[int, int, int]:
    """(frames, bytes on the wire without FCS, the longest frame) of a pcap: what
    one replay sends. Reads the record headers only."""
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24:
            raise ValueError(f"{path}: not a pcap file (too short)")
        end = _byte_order(head[:4], path)
        linktype = struct.unpack(end + "I", head[20:24])[0] & 0xFFFF
        if linktype != 1:
            raise ValueError(
                f"{path}: link type {linktype}, not Ethernet (1): the replay sends its frames "
                "as they are onto an Ethernet interface"
            )
        n = nbytes = longest = 0
        while len(rec := f.read(16)) == 16:
            caplen = struct.unpack(end + "I", rec[8:12])[0]
            f.seek(caplen, 1)
            n += 1
            nbytes += caplen
            longest = max(longest, caplen)
    return n, nbytes, longest


def _byte_order(magic, path):
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        return "<"
    if magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        return ">"
    raise ValueError(f"{path}: not a classic pcap file (pcapng is not read here; convert it with `editcap -F pcap`)")


def write_truth(path, truth: Counter, messages=None):
    """The truth file: one row per signature, `sid,expected,msg`."""
    messages = messages or rule_messages()
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sid", "expected", "msg"])
        for sid in sorted(set(truth) | set(messages)):
            w.writerow([sid, truth.get(sid, 0), messages.get(sid, "")])


def read_truth(path) -> Counter:
    """sid -> expected alerts from a truth file (`sid,expected[,msg]`), with a
    one-line ValueError for anything else."""
    out = Counter()
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        raise ValueError(f"truth file {path} not found") from None
    for n, row in enumerate(rows, start=2):
        try:
            out[int(row["sid"])] = int(row["expected"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path} line {n}: a truth file has the columns sid,expected[,msg]") from None
    return out


def rule_messages(rules=RULES) -> dict:
    """sid -> msg of every signature in a rules file."""
    out = {}
    for line in Path(rules).read_text().splitlines():
        sid = re.search(r"\bsid\s*:\s*(\d+)", line)
        msg = re.search(r'\bmsg\s*:\s*"([^"]*)"', line)
        if sid and not line.lstrip().startswith("#"):
            out[int(sid.group(1))] = msg.group(1) if msg else ""
    return out
