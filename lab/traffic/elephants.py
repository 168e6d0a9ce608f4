"""Elephants: long TCP transfers whose signatures lie at known depths, for the IDS
experiment with a per-flow cutoff (`bench ids --cutoff`).

Most of what an IDS spends goes on the bulk of long flows whose first bytes already
told it everything; a cutoff at the tap keeps those first bytes and drops the rest.
What it costs in detection depends on where in a flow a signature lies: each elephant
here carries markers at fixed offsets of its client's stream (MARKS: 32 KiB and 512 KiB
in), each raising its own signature (lab/rules/vtap-lab.rules, sids 9100040 and
9100041) once. A cutoff of c bytes keeps every marker whose offset plus its length is
under c (truth_within()); the others the monitor's IDS cannot see. Suricata's own
stream.reassembly.depth (1 MiB, lab/daemons/suricata.py) bounds what the receiver's
sees too, so no marker lies past it.

    >>> frames, truth = elephants(flows=2, size=4 << 20, seed=1)     # doctest: +SKIP

Frames are built from bytes, not scapy (a 16 MB flow is 17,000 frames): IPv4 without
options, TCP without options, MSS-sized segments of filler, the server's ACK after
every second segment and the last, FIN from both sides; every checksum whole.
"""

import random
import struct
from collections import Counter

from .attacks import DST_MAC, MSS, SRC_MAC

MARKS = {32 << 10: 9100040, 512 << 10: 9100041}  # offset in the client's stream -> sid
MARK_TEXT = {off: f"VTL-BULK-MARK-{off >> 10}K".encode() for off in MARKS}
PORT = 5001  # the elephants' server port (the rules name it)
FILLER = bytes(range(32, 127)) * (MSS // 95 + 1)  # printable, no marker in it


def _sum16(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    return sum(struct.unpack(f"!{len(data) // 2}H", data))


def _fold(s: int) -> int:
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


class _Flow:
    def __init__(self, client, server, sport, rng):
        self.c, self.s = bytes(map(int, client.split("."))), bytes(map(int, server.split(".")))
        self.sport, self.rng = sport, rng
        self.cseq, self.sseq = rng.randrange(1 << 32), rng.randrange(1 << 32)
        self.ipid = rng.randrange(1 << 16)

    def frame(self, from_client, flags, payload=b""):
        src, dst = (self.c, self.s) if from_client else (self.s, self.c)
        sport, dport = (self.sport, PORT) if from_client else (PORT, self.sport)
        seq, ack = (self.cseq, self.sseq) if from_client else (self.sseq, self.cseq)
        tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 502 if from_client else 509, 0, 0)
        pseudo = src + dst + struct.pack("!BBH", 0, 6, len(tcp) + len(payload))
        csum = 0xFFFF - _fold(_sum16(pseudo) + _sum16(tcp) + _sum16(payload))
        tcp = tcp[:16] + struct.pack("!H", csum) + tcp[18:]
        self.ipid = (self.ipid + 1) & 0xFFFF
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp) + len(payload), self.ipid, 0x4000, 64, 6, 0, src, dst)
        ip = ip[:10] + struct.pack("!H", 0xFFFF - _fold(_sum16(ip))) + ip[12:]
        eth = bytes.fromhex(SRC_MAC.replace(":", "")) + bytes.fromhex(DST_MAC.replace(":", "")) + b"\x08\x00"
        if from_client:
            self.cseq = (self.cseq + len(payload) + (1 if flags & 0x03 else 0)) & 0xFFFFFFFF
        else:
            self.sseq = (self.sseq + len(payload) + (1 if flags & 0x03 else 0)) & 0xFFFFFFFF
        return eth + ip + tcp + payload


SYN, ACK, PSH, FIN = 0x02, 0x10, 0x08, 0x01


def _segments(size, marked=True):
    """The client's stream of `size` bytes in MSS segments, markers at their offsets
    (none when not `marked`: a transfer no signature names)."""
    stream = bytearray()
    while len(stream) < size:
        stream += FILLER
    del stream[size:]
    for off, text in MARK_TEXT.items():
        if marked and off + len(text) <= size:
            stream[off : off + len(text)] = text
    return [bytes(stream[i : i + MSS]) for i in range(0, size, MSS)]


def one(client, server, sport, size, rng, marked=True):
    """One elephant's frames, in order."""
    f = _Flow(client, server, sport, rng)
    yield f.frame(True, SYN)
    yield f.frame(False, SYN | ACK)
    yield f.frame(True, ACK)
    segs = _segments(size, marked)
    for i, seg in enumerate(segs):
        last = i == len(segs) - 1
        yield f.frame(True, ACK | (PSH if last else 0), seg)
        if last or i % 2 == 1:
            yield f.frame(False, ACK)
    yield f.frame(True, FIN | ACK)
    yield f.frame(False, FIN | ACK)
    yield f.frame(True, ACK)


def truth(flows, size) -> Counter:
    """What the elephants raise with nothing cut: each marker that fits, once a flow."""
    return Counter({sid: flows for off, sid in MARKS.items() if off + len(MARK_TEXT[off]) <= size})


def truth_within(flows, size, cutoff) -> Counter:
    """What a monitor behind a cutoff of `cutoff` payload bytes must still raise (0: no
    cutoff). The segment that crosses the line is copied whole, so a marker counts as
    within when it starts before the cut's segment ends; here, conservatively, when it
    ends before the cutoff."""
    if not cutoff:
        return truth(flows, size)
    return Counter({sid: n for sid, n in truth(flows, size).items() if _offset(sid) + _len(sid) <= cutoff})


def _offset(sid):
    return next(off for off, s in MARKS.items() if s == sid)


def _len(sid):
    return len(MARK_TEXT[_offset(sid)])


def elephants(flows=4, size=16 << 20, seed=1, home="198.18.1.{}", outside="198.19.200.{}"):
    """(frames, truth): `flows` transfers of `size` bytes each, interleaved segment by
    segment (as concurrent transfers would be), from outside hosts to home ones."""
    rng = random.Random(seed)
    gens = [one(outside.format(10 + i), home.format(100 + i), 50000 + i, size, rng) for i in range(flows)]
    frames = []
    while gens:
        for g in list(gens):
            try:
                frames.append(next(g))
            except StopIteration:
                gens.remove(g)
    return frames, truth(flows, size)


def staggered(a, flows=4, size=16 << 20, seed=1, home="198.18.1.{}", outside="198.19.200.{}"):
    """The attack mix `a` with `flows` transfers whose starts are spread over it: flow i
    starts i/flows of the way in and ends with the mix, its frames evenly spread over
    that span (as transfers that begin at different times would be; elephants() + mix()
    start them all together, so their first bytes arrive at once). The same flows
    (addresses, sequence numbers, bytes) as elephants() makes with the same seed."""
    import heapq  # noqa: PLC0415 -- only this workload merges by position

    rng = random.Random(seed)
    # built in elephants()'s order: each _Flow draws its numbers when made
    made = [list(one(outside.format(10 + i), home.format(100 + i), 50000 + i, size, rng)) for i in range(flows)]

    def placed(frames, start, rank):  # (where in the mix, who goes first at a tie, frame)
        return ((start + (1 - start) * j / len(frames), rank, f) for j, f in enumerate(frames))

    streams = [placed(a, 0.0, 0)] + [placed(fr, i / flows, 1 + i) for i, fr in enumerate(made)]
    return [f for _, _, f in heapq.merge(*streams, key=lambda x: (x[0], x[1]))]


def mix(a, b):
    """Two frame lists interleaved in proportion (the elephants spread over the mix)."""
    if not a or not b:
        return list(a) + list(b)
    out, j = [], 0
    for i, f in enumerate(a, 1):
        out.append(f)
        while j < len(b) and j * len(a) < i * len(b):
            out.append(b[j])
            j += 1
    out.extend(b[j:])
    return out


# --- the closed loop: paced transfers, some of them from attackers --------------------


def paced(attackers=20, benign=20, size=1 << 20, mbps=2.0, every=0.5, seed=1):
    """[(seconds, frame)] sorted by time, and the attackers' addresses: `attackers` +
    `benign` transfers of `size` bytes, one a client host, each paced at `mbps` (its
    frames evenly spread by bytes), one starting every `every` seconds, attackers and
    benign ones alternating. An attacker's transfer carries the markers (its 32 KiB one
    raises an alert early; its 512 KiB one is what a monitor behind a cutoff sees only
    if the alert had the rest of its traffic copied), a benign one none.
    The clients are outside hosts (198.19.201.x), the servers home ones."""
    if not 1 <= attackers + benign <= 200:
        raise ValueError(f"attackers + benign must be 1..200 hosts, not {attackers + benign}")
    rng = random.Random(seed)
    out, bad = [], []
    kinds, a, b = [], attackers, benign  # alternating while both are left
    while a or b:
        if a:
            kinds.append(True)
            a -= 1
        if b:
            kinds.append(False)
            b -= 1
    for i, marked in enumerate(kinds):
        client = f"198.19.201.{10 + i}"
        if marked:
            bad.append(client)
        t = i * every
        for frame in one(client, f"198.18.1.{100 + i % 28}", 40000 + i, size, rng, marked):
            out.append((t, frame))
            t += len(frame) * 8 / (mbps * 1e6)
    out.sort(key=lambda tf: tf[0])
    return out, bad


def truth_paced(attackers) -> Counter:
    """What the paced transfers raise with nothing cut: each attacker's markers, once."""
    return Counter(dict.fromkeys(MARKS.values(), attackers)) if attackers else Counter()


def write_timed_pcap(path, timed, epoch=1_700_000_000) -> tuple[int, int]:
    """A classic pcap whose timestamps are the frames' own times (seconds from the
    start): tcpreplay replays it at that pace (as_recorded). -> (frames, bytes)"""
    n = nbytes = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for t, frame in timed:
            n += 1
            us = epoch * 1_000_000 + round(t * 1e6)
            f.write(struct.pack("<IIII", us // 1_000_000, us % 1_000_000, len(frame), len(frame)))
            f.write(frame)
            nbytes += len(frame)
    return n, nbytes
