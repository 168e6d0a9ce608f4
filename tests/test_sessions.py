"""vTAP sessions (ebpf.SessionMirror, tc_sessions.bpf.c) with real traffic
through Testbed 3 and a collector two hops away: rules, several sessions,
truncation, sampling, every tunnel kind decoded byte for byte at the collector,
exact counts per session and per rule."""

import asyncio
import re
import struct
import subprocess
from collections import Counter

import pytest
from conftest import require_tool
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrFragment, fragment6
from scapy.layers.l2 import Ether

from ebpf import InputError, netdev
from ebpf.vtap.sessions.config import Rule, Session
from ebpf.vtap.sessions.tc_sessions import SessionMirror
from lab import testbeds
from lab.collector import decap
from lab.daemons.suricata import Suricata
from lab.testbeds import COLLECTOR_V4, COLLECTOR_V6
from lab.traffic import Capture, Flow, Marker, build, send_frames

RATE = 20_000
KINDS = {
    "vxlan": "vxlan://{}/4242",
    "geneve": "geneve://{}/77",
    "gre": "gre://{}/9",
    "gre-nokey": "gre://{}",
    "erspan": "erspan://{}/5",
    "erspan3": "erspan3://{}/1023",
}
KEYS = {"vxlan": 4242, "geneve": 77, "gre": 9, "gre-nokey": None, "erspan": 5, "erspan3": 1023}


@pytest.fixture(scope="module")
def tb():
    with testbeds.testbed3(collector=True) as t:
        yield t


def collector_url(kind, family):
    addr = COLLECTOR_V4 if family == 4 else f"[{COLLECTOR_V6}]"
    return KINDS[kind].format(addr)


def identify(marker):
    """A frame's (flow, seq) by its marker, whatever its length (a cut copy
    keeps the marker when the cut is past it)."""
    head = Marker.HEAD + marker.token

    def key(frame):
        i = frame.find(head)
        if i < 0 or i + Marker.LEN > len(frame):
            return None
        fid, seq, _ = struct.unpack_from("!HIH", frame, i + 7)
        return (marker.names[fid], seq) if fid < len(marker.names) else None

    return key


def send(tb, flows, monitor=False, collector=False, rate=RATE):
    """Send flows from the sender to the receiver through the tap node; return
    (sent frames by (flow, seq), receiver counts, monitor frames, decoded
    collector copies)."""
    marker = Marker()
    frames = build(flows, marker, tb.sender_mac, tb.next_hop_mac)
    ident = identify(marker)
    sent = {ident(f): f for f in frames}
    caps = []
    rx = Capture(tb.ns("receiver"), "eth0", marker)
    mon = Capture(tb.ns("monitor"), "eth0", lambda f: ident(f), keep=True)
    col = Capture(tb.ns("collector"), "eth0", lambda f: (lambda d: d and ident(d.inner))(decap(f)), keep=True)
    with rx, mon, col:
        report = send_frames(tb.ns("sender"), "eth0", frames, rate_pps=rate)
        rx.finish(Counter(marker(f) for f in frames if marker(f)))
        caps = (mon, col)
        for c in caps:
            c.finish()
    assert report.packets == len(frames)
    assert rx.kernel_drops == mon.kernel_drops == col.kernel_drops == 0
    return sent, rx.counts, mon.frames, [decap(f) for f in col.frames]


def tap(tb, sessions, where=(("eth0", "ingress"),)):
    m = SessionMirror(sessions, netns=tb.ns("tapnode"))
    for ifname, direction in where:
        m.attach(ifname, direction)
    return m


def flows(n=20, size=300):
    return [
        Flow("u4", tb_src4(), tb_dst4(), dport=5001, count=n, size=size),
        Flow("u6", "2001:2:0:1::10", "2001:2:0:2::2", dport=5001, count=n, size=size),
        Flow("other4", tb_src4(), tb_dst4(), dport=6000, count=n, size=size),
    ]


def tb_src4():
    return testbeds.Testbed.src4


def tb_dst4():
    return "198.18.2.2"


@pytest.mark.parametrize("family", [4, 6])
def test_each_tunnel_kind_reaches_the_collector_byte_exact(tb, family):
    """A session per tunnel kind (VXLAN, GENEVE, GRE with and without a key,
    ERSPAN II and III), all to the collector: UDP to port 5001 (both families)
    is accepted, cut to 128 bytes and sent through every tunnel; port 6000 is
    not. At the collector, each kind's copies are the frames the tap saw, cut
    at 128 bytes, each once, with the session's key; IPv6 UDP has a checksum,
    ERSPAN numbers its copies without a gap and sets its T bit."""
    ss = [
        Session(
            target=collector_url(kind, family),
            truncate=128,
            name=kind,
            rules=[Rule("accept", protocol="udp", destination_ports="5001")],
        )
        for kind in KINDS
    ]
    with tap(tb, ss) as m:
        sent, rx, _, got = send(tb, flows(), collector=True)
        c, sc, rc = m.counters(), m.session_counters(), m.rule_counters()
    assert rx == {"u4": 20, "u6": 20, "other4": 20}
    assert len(got) == 40 * len(KINDS)
    cut = sorted(f[:128] for (flow, _), f in sent.items() if flow in ("u4", "u6"))  # port 5001's
    assert len(cut) == 40 and all(len(f) == 300 for f in sent.values())
    for kind in KINDS:
        mine = [d for d in got if (d.kind, d.key) == (kind.split("-")[0], KEYS[kind])]
        assert sorted(d.inner for d in mine) == cut, kind  # the 40 frames, each once, cut at 128
        if kind.startswith("erspan"):
            seqs = sorted(d.seq for d in mine)
            assert seqs == list(range(seqs[0], seqs[0] + 40)) and all(d.truncated for d in mine), kind
        if family == 6 and kind in ("vxlan", "geneve"):
            assert all(d.udp_checksum for d in mine), kind
        row = sc[kind]
        assert (row["accepted"], row["handed"], row["sent"], row["truncated"]) == (40, 40, 40, 40), kind
        assert row["frame_bytes"] == 40 * 300 and row["oversize"] == row["failed"] == row["sampled_out"] == 0
    assert (c["seen"], c["mirrored"], c["unmatched"]) == (60, 40, 20)
    assert list(rc.values()) == [40] * len(KINDS)


def test_outer_checksums_are_right(tb):
    """IPv4 header checksum of the outer packet, and the IPv6 UDP checksum,
    recomputed by scapy from what the collector got."""
    raw_frames = []
    for family in (4, 6):
        s = Session(target=collector_url("vxlan", family), rules=[Rule("accept", protocol="udp")])
        marker = Marker()
        frames = build(
            [Flow("a", tb_src4(), tb_dst4(), dport=5001, count=5, size=700 + family)],
            marker,
            tb.sender_mac,
            tb.next_hop_mac,
        )
        with tap(tb, [s]), Capture(tb.ns("collector"), "eth0", lambda f: decap(f) and "c", keep=True, expect=5) as col:
            send_frames(tb.ns("sender"), "eth0", frames)
        raw_frames += col.frames
    assert len(raw_frames) == 10
    for f in raw_frames:
        p = Ether(f)
        if p.type == 0x0800:  # the outer packet's (the inner frame is IPv4 in both)
            again = Ether(f)
            del again[IP].chksum
            assert Ether(bytes(again))[IP].chksum == p[IP].chksum
            assert p[IP][UDP].chksum == 0  # RFC 7348 over IPv4
        else:
            assert p.type == 0x86DD
            again = Ether(f)
            del again[IPv6][UDP].chksum
            assert Ether(bytes(again))[IPv6][UDP].chksum == p[IPv6][UDP].chksum != 0


def test_rules_first_match_per_session(tb):
    """One session to the monitor: reject port 5001 from the unwatched source,
    accept UDP ports 5000-5010, accept IPv6 anything, reject everything else.
    Each flow lands on exactly one rule; rules after the first match never count."""
    src_alt = testbeds.Testbed.alt_src4
    s = Session(
        target="mon0",
        rules=[
            Rule("reject", protocol="udp", source=f"{src_alt}/32", destination_ports=5001),
            Rule("accept", protocol="udp", destination_ports="5000-5010"),
            Rule("accept", source="2001:2::/32"),
            Rule("reject"),
        ],
    )
    fl = [
        Flow("alt5001", src_alt, tb_dst4(), dport=5001, count=7),
        Flow("alt5002", src_alt, tb_dst4(), dport=5002, count=11),
        Flow("main5010", tb_src4(), tb_dst4(), dport=5010, count=13),
        Flow("main5011", tb_src4(), tb_dst4(), dport=5011, count=5),
        Flow("v6tcp", "2001:2:0:1::10", "2001:2:0:2::2", proto="tcp", dport=80, count=9),
        Flow("v6range", "2001:2:0:1::10", "2001:2:0:2::2", dport=5003, count=3),
    ]
    with tap(tb, [s]) as m:
        sent, rx, mon, _ = send(tb, fl, monitor=True)
        rc = list(m.rule_counters().values())
        sc = m.session_counters()["session 1"]
    got = Counter(k[0] for k in map(identify_any(sent), mon) if k)
    assert got == {"alt5002": 11, "main5010": 13, "v6tcp": 9, "v6range": 3}
    assert rc == [7, 11 + 13 + 3, 9, 5]
    assert (sc["accepted"], sc["rejected"], sc["sent"]) == (36, 12, 36)
    for f in mon:  # local target, whole frames: exactly what the tap saw
        assert f in sent.values()


def identify_any(sent):
    by_bytes = {f: k for k, f in sent.items()}
    return lambda f: by_bytes.get(f)


def test_several_sessions_one_frame_and_a_shared_target(tb):
    """Session 1 (monitor, cut to 64) and session 2 (collector) both take the
    flow: one copy each. Session 3 has session 1's target: it gives way
    (shadowed), so the monitor gets each frame once."""
    rules = [Rule("accept", protocol="udp", destination_ports=5001)]
    ss = [
        Session(target="mon0", truncate=64, rules=rules, number=1),
        Session(target=collector_url("geneve", 4), rules=rules, number=2),
        Session(target="mon0", rules=rules, number=3, name="late"),
    ]
    with tap(tb, ss) as m:
        sent, rx, mon, got = send(tb, [Flow("a", tb_src4(), tb_dst4(), dport=5001, count=25, size=200)])
        sc = m.session_counters()
    assert len(mon) == 25 and all(len(f) == 64 for f in mon)
    assert sorted(mon) == sorted(f[:64] for f in sent.values())
    assert sorted(d.inner for d in got) == sorted(sent.values())
    assert sc["session 1"]["sent"] == sc["session 2"]["sent"] == 25
    assert sc["late"]["accepted"] == sc["late"]["shadowed"] == 25 and sc["late"]["sent"] == 0


def test_fragments_match_as_frames_without_ports(tb):
    """Every piece of a fragmented datagram is matched alike, as a frame
    without ports: a rule naming ports copies none of them, a rule naming
    only the protocol copies all of them (first pieces included)."""
    fl = [Flow("frag", tb_src4(), tb_dst4(), dport=5001, count=10, size=1000, fragment=400)]
    ports = Session(target="mon0", rules=[Rule("accept", protocol="udp", destination_ports=5001)], number=1)
    proto = Session(target=collector_url("vxlan", 4), rules=[Rule("accept", protocol="udp")], number=2)
    with tap(tb, [ports, proto]) as m:
        marker = Marker()
        frames = build(fl, marker, tb.sender_mac, tb.next_hop_mac)
        assert len(frames) == 30
        with (
            Capture(tb.ns("collector"), "eth0", lambda f: decap(f) and "c", keep=True, expect=30) as col,
            Capture(tb.ns("monitor"), "eth0", lambda f: "m") as mon,
        ):
            send_frames(tb.ns("sender"), "eth0", frames)
        sc = m.session_counters()
    assert sorted(decap(f).inner for f in col.frames) == sorted(frames)
    assert sum(mon.counts.values()) == 0
    assert sc["session 1"]["accepted"] == 0 and sc["session 2"]["sent"] == 30


def test_vlan_tag_is_in_the_copy(tb):
    """A tagged frame (the tag held beside the frame by the kernel) reaches the
    collector with its tag back in place, and the truncation counts it."""
    fl = [Flow("tagged", tb_src4(), tb_dst4(), dport=5001, count=10, size=300, vlans=((0x8100, 42),))]
    s = Session(target=collector_url("erspan3", 4), truncate=100, rules=[Rule("accept", protocol="udp")])
    with tap(tb, [s]):
        marker = Marker()
        frames = build(fl, marker, tb.sender_mac, tb.next_hop_mac)
        with Capture(tb.ns("collector"), "eth0", lambda f: decap(f) and "c", keep=True, expect=10) as col:
            send_frames(tb.ns("sender"), "eth0", frames)
    got = sorted(decap(f).inner for f in col.frames)
    assert got == sorted(f[:100] for f in frames)
    assert got[0][12:14] == b"\x81\x00"


def test_sampling_per_session(tb):
    """1 in 4 for one session, all for the other: counts add up exactly."""
    rules = [Rule("accept", protocol="udp")]
    ss = [Session(target="mon0", rules=rules, sample=4), Session(target=collector_url("gre", 4), rules=rules)]
    with tap(tb, ss) as m:
        sent, rx, mon, got = send(tb, [Flow("a", tb_src4(), tb_dst4(), count=400)])
        sc = m.session_counters()
    s1 = sc["session 1"]
    assert s1["accepted"] == 400 == s1["sampled_out"] + s1["sent"]
    assert s1["sent"] == len(mon) and 40 < len(mon) < 200
    assert sc["session 2"]["sent"] == len(got) == 400


def test_oversize_is_counted_or_cut_to_fit(tb):
    """A path MTU of 600 to the collector: 1000-byte frames do not fit once
    wrapped. Counted oversize and not sent, or with fit cut to fit; never
    fragmented."""
    run = tb.topo.run
    run("tapnode", ["ip", "route", "replace", "198.18.6.0/24", "via", "198.18.5.1", "mtu", "lock", "600"], check=True)
    try:
        for fit in (False, True):
            s = Session(target=collector_url("vxlan", 4), fit=fit, rules=[Rule("accept", protocol="udp")])
            with tap(tb, [s]) as m:
                sent, rx, mon, got = send(tb, [Flow("a", tb_src4(), tb_dst4(), count=10, size=1000)])
                sc = m.session_counters()["session 1"]
            if fit:
                assert sc["sent"] == sc["truncated"] == 10 and len(got) == 10
                overhead = 20 + 8 + 8  # outer IPv4, UDP, VXLAN
                assert all(len(d.inner) == 600 - overhead for d in got)
                assert all(d.inner == sent[identify_any_prefix(sent, d.inner)][: len(d.inner)] for d in got)
            else:
                assert sc["oversize"] == 10 and sc["sent"] == 0 and got == []
    finally:
        run("tapnode", ["ip", "route", "replace", "198.18.6.0/24", "via", "198.18.5.1"], check=True)


def identify_any_prefix(sent, inner):
    return next(k for k, f in sent.items() if f.startswith(inner))


def test_own_copies_are_never_copied_again(tb):
    """Tapping the interface the tunnel leaves by, egress, with a session that
    takes everything: its own copies pass it uncopied (own_copies)."""
    s = Session(target=collector_url("vxlan", 4), rules=[Rule("accept", protocol="udp")])
    with tap(tb, [s], where=(("eth0", "ingress"), ("eth2", "egress"))) as m:
        sent, rx, mon, got = send(tb, [Flow("a", tb_src4(), tb_dst4(), count=30)])
        c = m.counters()
    assert len(got) == 30
    assert c["own_copies"] == 30


def test_sessions_change_live(tb):
    """set_sessions() between two runs on one attached object: the second run
    follows the new rules exactly, and a session kept by number keeps its counts."""
    a = Session(target="mon0", number=1, rules=[Rule("accept", protocol="udp", destination_ports=5001)])
    with tap(tb, [a]) as m:
        send(tb, [Flow("a", tb_src4(), tb_dst4(), dport=5001, count=10)])
        b = Session(target="mon0", number=1, rules=[Rule("accept", protocol="udp", destination_ports=5002)])
        m.set_sessions([b])
        sent, rx, mon, _ = send(
            tb,
            [
                Flow("a", tb_src4(), tb_dst4(), dport=5001, count=10),
                Flow("b", tb_src4(), tb_dst4(), dport=5002, count=7),
            ],
        )
        sc = m.session_counters()["session 1"]
        rc = m.rule_counters()
    assert len(mon) == 7
    assert sc["sent"] == 17
    assert list(rc.values()) == [7]


def test_close_removes_the_sender_device(tb):
    s = Session(target="mon0", rules=[Rule("accept")])
    m = tap(tb, [s])
    name = m.sender
    with netdev.ipr(tb.ns("tapnode")) as ip:
        assert ip.link_lookup(ifname=name)
    m.close()
    with netdev.ipr(tb.ns("tapnode")) as ip:
        assert not ip.link_lookup(ifname=name)


def test_the_api_inside_a_running_asyncio_loop(tb):
    """As a notebook cell calls it: a loop runs in this very thread. The object
    explains itself (repr, a notebook's table, a DataFrame per session)."""

    async def main():
        asyncio.get_running_loop()
        s = Session(target=collector_url("geneve", 6), name="cell", truncate=96, rules=[Rule("accept", protocol="udp")])
        with tap(tb, [s]) as m:
            sent, rx, mon, got = send(tb, [Flow("a", tb_src4(), tb_dst4(), count=12)])
            m.set_sessions([Session(target="mon0", name="cell", rules=[Rule("accept", protocol="udp")])])
            sent2, _, mon2, _ = send(tb, [Flow("a", tb_src4(), tb_dst4(), count=5)])
            return got, mon2, m.counters_frame(), repr(m), m._repr_html_()

    got, mon2, frame, text, html = asyncio.run(main())
    assert len(got) == 12 and all(len(d.inner) == 96 for d in got) and len(mon2) == 5
    assert frame.loc["cell", "sent"] == 17 and frame.index.name == "session"
    assert "SessionMirror" in text and "cell -> mon0" in text
    assert "<table>" in html and "cell" in html


def test_direction_rules(tb):
    """Tapped at eth0 ingress and eth1 egress (the same frames pass both): an
    ingress rule's session gets each frame once, from the ingress hook; an
    egress rule's, once, from the egress hook, as the router sent it on."""
    ss = [
        Session(target="mon0", rules=[Rule("accept", direction="ingress", protocol="udp")]),
        Session(target=collector_url("erspan3", 4), rules=[Rule("accept", direction="egress", protocol="udp")]),
    ]
    with tap(tb, ss, where=(("eth0", "ingress"), ("eth1", "egress"))) as m:
        sent, rx, mon, got = send(tb, [Flow("a", tb_src4(), tb_dst4(), count=15)])
        sc = m.session_counters()
    assert sorted(mon) == sorted(sent.values())
    assert len(got) == 15 and all(d.direction == 1 for d in got)

    # the IP packet as sent, but for the TTL and header checksum the router changed
    def unrouted(ip):
        return ip[:8] + ip[9:10] + ip[12:]

    assert sorted(unrouted(d.inner[14:]) for d in got) == sorted(unrouted(f[14:]) for f in sent.values())
    assert all(d.inner[22] == 63 for d in got)  # TTL 64, less the router's hop
    assert sc["session 1"]["sent"] == sc["session 2"]["sent"] == 15


def test_ipv6_fragments_match_as_frames_without_ports(tb):
    """IPv6 fragments (a fragment header after the fixed header): every piece
    matched alike, as a frame without ports, as IPv4's are."""
    frames = []
    for i in range(5):
        pkt = (
            IPv6(src="2001:2:0:1::10", dst="2001:2:0:2::2")
            / IPv6ExtHdrFragment(id=100 + i)
            / UDP(sport=40000, dport=5001)
            / (bytes([i]) * 900)
        )
        frames += [bytes(Ether(src=tb.sender_mac, dst=tb.next_hop_mac) / p) for p in fragment6(pkt, 500)]
    n = len(frames)
    assert n >= 10 and all(b"\x2c" == f[20:21] for f in frames)  # every piece has a fragment header
    ports = Session(target="mon0", rules=[Rule("accept", protocol="udp", destination_ports=5001)], number=1)
    proto = Session(
        target=collector_url("gre", 6), rules=[Rule("accept", protocol="udp", source="2001:2:0:1::/64")], number=2
    )
    with tap(tb, [ports, proto]) as m:
        with (
            Capture(tb.ns("collector"), "eth0", lambda f: decap(f) and "c", keep=True, expect=n) as col,
            Capture(tb.ns("monitor"), "eth0", lambda f: f in frames and "m") as mon,
        ):
            send_frames(tb.ns("sender"), "eth0", frames)
        sc = m.session_counters()
    assert sorted(decap(f).inner for f in col.frames) == sorted(frames)
    assert sum(mon.counts.values()) == 0
    assert sc["session 1"]["accepted"] == 0 and sc["session 2"]["sent"] == n


def test_suricata_and_tcpdump_at_the_collector_decode_each_tunnel(tb, tmp_path):
    """What a sensor makes of the copies as they arrive, a session per tunnel
    kind, each frame copied to all of them: Suricata (af-packet on the
    collector's interface) alerts on the inner packets, once per copy, and
    tcpdump prints each copy's inner flow (as far as each decodes the format)."""
    require_tool("tcpdump")
    rules = tmp_path / "copies.rules"
    # a payload match (the marker every frame of the run carries): a rule of
    # header matches only is checked once per flow, not per packet
    rules.write_text(
        'alert udp 198.18.1.10 any -> 198.18.2.2 5001 (msg:"a copied frame"; content:"VTL"; sid:9001; rev:1;)\n'
    )
    n, kinds = 20, ["vxlan", "geneve", "gre", "erspan", "erspan3"]
    ss = [Session(target=collector_url(k, 4), name=k, rules=[Rule("accept", protocol="udp")]) for k in kinds]
    ids = Suricata(tb.ns("collector"), "eth0", rules)
    dump = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            tb.ns("collector"),
            "tcpdump",
            "-i",
            "eth0",
            "-n",
            "-l",
            "-c",
            str(n * len(kinds)),
            "udp or proto 47",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ids.start()
        with tap(tb, ss) as m:
            send(tb, [Flow("a", tb_src4(), tb_dst4(), dport=5001, count=n, size=240)])
            sent = {k: c["sent"] for k, c in m.session_counters().items()}
        out, _ = dump.communicate(timeout=30)
        ids.wait_idle(n * len(kinds))
        res = ids.stop()
    finally:
        dump.kill()
        ids.close()
    assert sent == {k: n for k in kinds} and res.kernel_packets >= n * len(kinds)
    # Suricata 7 decodes ERSPAN types I and II (GRE 0x88be), not III (0x22eb):
    # type III copies reach it, and it takes them for GRE of an unknown payload
    assert dict(res.alerts) == {9001: n * 4}
    # tcpdump: the inner flow of each VXLAN, GENEVE and GRE copy; Debian's
    # tcpdump (4.99) prints ERSPAN as GRE of its protocol number without going
    # in, so there: n packets of each, numbered without a gap
    assert out.count("198.18.1.10.40000 > 198.18.2.2.5001: UDP") == 3 * n, out
    for word in ("VXLAN", "Geneve", "GREv0, key=0x9"):
        assert out.count(word) == n, (word, out)
    for proto in ("0x88be", "0x22eb"):
        seqs = [int(x) for x in re.findall(rf"GREv0, seq (\d+), length \d+: gre-proto-{proto}", out)]
        assert len(seqs) == n and seqs == list(range(seqs[0], seqs[0] + n)), out


def test_each_session_cuts_at_its_own_cutoff(tb):
    """Session 1 (monitor) with a cutoff of ten datagrams' payload, session 2 (collector)
    without: the monitor gets each flow's first ten, the collector all 25; one flow in
    the table, counted once for both. The cut frames are in session 1's counters."""
    rules = [Rule("accept", protocol="udp", destination_ports=5001)]
    payload = 200 - 42  # Ethernet, IPv4 and UDP headers of a 200-byte frame
    ss = [
        Session(target="mon0", rules=rules, number=1, cutoff=payload * 10),
        Session(target=collector_url("geneve", 4), rules=rules, number=2),
    ]
    with tap(tb, ss) as m:
        assert m.flows == 65536
        sent, rx, mon, got = send(tb, [Flow("a", tb_src4(), tb_dst4(), dport=5001, count=25, size=200)])
        sc, c = m.session_counters(), m.counters()
    assert sum(rx.values()) == 25 and len(got) == 25
    ident = {f: k for k, f in sent.items()}
    assert sorted(ident[f][1] for f in mon) == list(range(10))
    s1, s2 = sc["session 1"], sc["session 2"]
    assert (s1["accepted"], s1["cut"], s1["cut_bytes"], s1["sent"]) == (25, 15, 15 * 200, 10)
    assert s1["accepted"] == s1["sampled_out"] + s1["shadowed"] + s1["cut"] + s1["handed"]
    assert (s2["cut"], s2["sent"]) == (0, 25)
    assert (c["flows_new"], c["flows"], c["evicted"]) == (1, 1, 0)


def test_a_cutoff_added_live_needs_the_table(tb):
    """A tap made without a cutoff has no flow table: a session given one later is
    refused, nothing changed; made with flows=, it takes it live."""
    plain = Session(target="mon0", number=1, rules=[Rule("accept")])
    cut = Session(target="mon0", number=1, rules=[Rule("accept")], cutoff="64K")
    with SessionMirror([plain], netns=tb.ns("tapnode")) as m:
        m.load_program()
        with pytest.raises(InputError, match="session 1: a cutoff needs the flow table"):
            m.set_sessions([cut])
        assert m.sessions[0].cutoff == 0 and m.flows is None
    with SessionMirror([plain], netns=tb.ns("tapnode"), flows=64) as m:
        m.load_program()
        m.set_sessions([cut])
        assert m.sessions[0].cutoff == 65536 and m.flows == 64
