"""xdp_lb.bpf.c through BPF_PROG_TEST_RUN: frames in, verdicts and frames out.

The program looks up the backends' MAC addresses in the kernel's neighbour
table (bpf_fib_lookup), so the runs happen inside a small namespace pair: the
LB's interface is `lb`'s eth0 (198.18.1.1, 2001:2:0:1::1), and the backends
are addresses of the other host, whose neighbour entries the topology fills.
"""

import ctypes
import time

import pytest
from fixtures.lb import (
    BE1,
    BE2,
    BE6,
    BE6B,
    CLIENT_MAC,
    PORT_COUNT,
    PORT_MIN,
    SELF4,
    SELF6,
    VIP,
    VIP6,
    Rig,
    lb_fixture_net,
)
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import (
    ICMPv6EchoRequest,
    ICMPv6MLReport2,
    ICMPv6ND_NA,
    ICMPv6ND_NS,
    ICMPv6NDOptSrcLLAddr,
    ICMPv6PacketTooBig,
    IPv6,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
)
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from ebpf import maps
from ebpf.errors import InputError
from ebpf.lb.maglev import maglev_table
from ebpf.lb.xdp_lb import RING_SIZE, XdpLoadBalancer, nat_ports
from ebpf.xdp import attached
from lab import netns


@pytest.fixture(scope="module")
def net():
    with lb_fixture_net() as t:
        yield t


@pytest.fixture(scope="module", params=["xdp", "tc"])
def hook(request):
    """Every test runs at both hooks: xdp_lb.bpf.c and tc_lb.bpf.c keep the same sessions
    (lb_sessions.h) and must give the same answers; only the frames' MACs differ (at TC
    the kernel's neighbour table sets them as the frame leaves)."""
    return request.param


@pytest.fixture(scope="module", params=["process", "child"])
def default_rig(net, hook, request):
    """Every test on the rig runs twice per hook: on BCC's tables, and on the libbpf ones a
    program compiled in a child is worked through (lab lb's): what either reads or writes
    differs in nothing the tests can see."""
    r = Rig(net, hook=hook, compile_in=request.param)
    yield r
    r.close()


@pytest.fixture
def rig(default_rig):
    """The default service, as a new program has it: the module's one program, reset."""
    default_rig.reset()
    return default_rig


def checksums_valid(frame: bytes) -> bool:
    """Every checksum in the frame equals what scapy computes from scratch."""
    pkt = Ether(frame)
    for layer in (IP, TCP, UDP):
        if layer in pkt:
            redo = Ether(frame)
            del redo[layer].chksum
            if Ether(bytes(redo))[layer].chksum != pkt[layer].chksum:
                return False
    return True


CLIENT4, CLIENT6 = "198.18.7.7", "2001:2:0:7::7"  # the fixtures' client (Rig.from_client)
FAMILIES = pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])


def l3(v6):
    return IPv6 if v6 else IP


def handshake(rig, sport=40000, src=CLIENT4, v6=False):
    """SYN, SYN-ACK, ACK through the LB; returns (syn out, synack out, ack out)."""
    syn = rig.run(rig.from_client(TCP(sport=sport, dport=80, flags="S", seq=1000), src=src, v6=v6))
    assert syn.action == "sent"
    out = Ether(syn.data)
    lb_port = out[TCP].sport
    synack = rig.run(
        rig.from_backend(TCP(sport=8080, dport=lb_port, flags="SA", seq=5000, ack=1001), src=out[l3(v6)].dst, v6=v6)
    )
    ack = rig.run(rig.from_client(TCP(sport=sport, dport=80, flags="A", seq=1001, ack=5001), src=src, v6=v6))
    return syn, synack, ack


def test_the_sweep_deletes_an_idle_session_and_its_reverse_entry(rig):
    """Through either table layer (BCC's, or the libbpf one of a program compiled in a child):
    a half-open session idle past its timeout goes, with the entry that maps replies back."""
    rig.run(rig.from_client(TCP(sport=40001, dport=80, flags="S", seq=1)))
    assert len(rig.lb.sessions()) == 1 and len(rig.lb.table("reverse_half")) == 1
    saved = dict(rig.lb.timeouts)
    rig.lb.timeouts["syn"] = 0.0
    try:
        time.sleep(0.01)
        assert rig.lb.sweep() == 1
    finally:
        rig.lb.timeouts.update(saved)
    assert rig.lb.sessions() == [] and len(rig.lb.table("reverse_half")) == 0


def test_a_session_stamped_by_another_cpu_after_this_one_read_its_clock_is_not_expired(rig):
    """The two directions of a session run on two CPUs: the backend's side may stamp
    last_seen just after the client's side read the clock. That stamp is ahead of the
    client side's `now`; taken as an idle time it wrapped to 2^64 ns and ended a live
    session mid-connection (found on a VXLAN segment: the client's FIN dropped, no
    session). Here the stamp is put ahead by hand and the client sends again."""
    syn = rig.from_client(TCP(sport=40002, dport=80, flags="S", seq=1))
    assert rig.run(syn).action == "sent"
    t = rig.lb.table("half_open")
    ((k, v),) = t.items()
    v.last_seen = time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 10**9  # bpf_ktime_get_ns()'s clock
    t[k] = v
    assert rig.run(syn).action == "sent"  # the SYN again: the same session
    c = rig.lb.counters()
    assert c["expired"] == 0 and c["new_sessions"] == 1, c


def test_syn_creates_a_half_open_session_and_leaves_rewritten(rig):
    r = rig.run(rig.from_client(TCP(sport=40000, dport=80, flags="S", seq=1000)))
    assert r.action == "sent"
    out = Ether(r.data)
    # XDP: from us, to the backend's MAC (neighbour table); TC: as they came, for the kernel
    # to set as the frame leaves (bpf_redirect_neigh)
    assert (out.src, out.dst) == ((rig.mac, rig.be_mac) if rig.hook == "xdp" else (CLIENT_MAC, rig.mac))
    assert (out[IP].src, out[IP].dst, out[TCP].dport) == (SELF4, BE1, 8080)
    assert PORT_MIN <= out[TCP].sport < PORT_MIN + PORT_COUNT
    assert out[TCP].seq == 1000 and out[TCP].flags == "S"
    assert checksums_valid(r.data)
    (s,) = rig.lb.sessions()
    assert s["half_open"] and s["state"] == "syn" and s["lb_port"] == out[TCP].sport and s["client_port"] == 40000
    c = rig.lb.counters()
    assert c["new_sessions"] == 1 and c["to_backend"] == 1 and c[rig.SENT] == 1


@FAMILIES
def test_reply_is_translated_back_and_the_handshake_establishes(rig, v6):
    syn, synack, ack = handshake(rig, v6=v6)
    assert synack.action == "sent"
    back = Ether(synack.data)
    assert (back.src, back.dst) == ((rig.mac, CLIENT_MAC) if rig.hook == "xdp" else (rig.be_mac, rig.mac))
    assert (back[l3(v6)].src, back[TCP].sport, back[l3(v6)].dst, back[TCP].dport) == (
        (VIP6, 80, CLIENT6, 40000) if v6 else (VIP, 80, CLIENT4, 40000)
    )
    assert checksums_valid(synack.data)
    assert ack.action == "sent" and checksums_valid(ack.data)
    assert Ether(ack.data)[TCP].sport == Ether(syn.data)[TCP].sport  # the same LB port all along
    (s,) = rig.lb.sessions()
    assert not s["half_open"] and s["state"] == "established"
    assert rig.lb.counters()["established"] == 1


@FAMILIES
def test_fin_from_both_sides_and_the_last_ack_end_the_session(rig, v6):
    syn, *_ = handshake(rig, v6=v6)
    lb_port = Ether(syn.data)[TCP].sport
    assert rig.run(rig.from_client(TCP(sport=40000, dport=80, flags="FA", seq=1001, ack=5001), v6=v6)).action == "sent"
    assert (
        rig.run(rig.from_backend(TCP(sport=8080, dport=lb_port, flags="FA", seq=5001, ack=1002), v6=v6)).action
        == "sent"
    )
    assert len(rig.lb.sessions()) == 1
    last = rig.run(rig.from_client(TCP(sport=40000, dport=80, flags="A", seq=1002, ack=5002), v6=v6))
    assert last.action == "sent"  # the last ACK still reaches the backend
    assert rig.lb.sessions() == [] and rig.lb.counters()["closed_fin"] == 1
    assert len(rig.lb.table("reverse")) == 0 == len(rig.lb.table("reverse_half"))  # its LB port is free again
    # and nothing of it is left: a stray ACK now has no session
    assert rig.run(rig.from_client(TCP(sport=40000, dport=80, flags="A", seq=1002, ack=5002), v6=v6)).action == "drop"
    assert rig.lb.counters()["dropped_no_session"] == 1


@FAMILIES
def test_a_half_closed_connection_keeps_its_session_until_the_backend_fins_too(rig, v6):
    """The client's FIN half-closes: the backend may go on sending, and the client ACKs what it gets.
    Those ACKs must not end the session; only the ACK after both FINs does."""
    syn, *_ = handshake(rig, v6=v6)
    lb_port = Ether(syn.data)[TCP].sport
    assert rig.run(rig.from_client(TCP(sport=40000, dport=80, flags="FA", seq=1001, ack=5001), v6=v6)).action == "sent"
    for i in range(3):  # the backend's data after the client's FIN, each ACKed
        data = rig.run(
            rig.from_backend(
                TCP(sport=8080, dport=lb_port, flags="PA", seq=5001 + 100 * i, ack=1002) / Raw(b"x" * 100), v6=v6
            )
        )
        assert data.action == "sent" and Ether(data.data)[TCP].dport == 40000
        ack = rig.run(rig.from_client(TCP(sport=40000, dport=80, flags="A", seq=1002, ack=5101 + 100 * i), v6=v6))
        assert ack.action == "sent"
        (s,) = rig.lb.sessions()
        assert s["state"] == "established" and s["fin"] == 0x10  # half-closed (the client's FIN seen), still there
    assert rig.lb.counters()["closed_fin"] == 0
    assert (
        rig.run(rig.from_backend(TCP(sport=8080, dport=lb_port, flags="FA", seq=5301, ack=1002), v6=v6)).action
        == "sent"
    )
    assert rig.run(rig.from_client(TCP(sport=40000, dport=80, flags="A", seq=1002, ack=5302), v6=v6)).action == "sent"
    assert rig.lb.sessions() == [] and rig.lb.counters()["closed_fin"] == 1


# Each close order as the two ends send it: (who, flags, seq, ack, payload). The client's
# data ends at 1001 (its FIN, with 10 bytes of data before it, acknowledged by 1012), the
# backend's at 5001 (its FIN acknowledged by 5002). The session must outlive every packet
# but the last, which must still be forwarded, and end with it.
CLOSE_ORDERS = {
    "client-first": [
        ("client", "FA", 1001, 5001, 10),
        ("backend", "A", 5001, 1012, 0),  # the client's FIN acknowledged
        ("backend", "FA", 5001, 1012, 0),
        ("client", "A", 1012, 5002, 0),  # the last
    ],
    "backend-first": [
        ("backend", "FA", 5001, 1001, 0),
        ("client", "A", 1001, 5002, 0),  # the backend's FIN acknowledged: not the last
        ("client", "PA", 1001, 5002, 10),  # the client still sends (half-closed by the backend)
        ("backend", "A", 5002, 1011, 0),
        ("client", "FA", 1011, 5002, 0),
        ("backend", "A", 5002, 1012, 0),  # the last: the backend's ACK of the client's FIN
    ],
    "simultaneous": [
        ("client", "FA", 1001, 5001, 10),
        ("backend", "FA", 5001, 1001, 0),  # sent before the client's FIN arrived: acknowledges none of it
        ("client", "A", 1012, 5002, 0),
        ("backend", "A", 5002, 1012, 0),  # the last
    ],
    "both-in-one": [  # the backend ACKs the client's FIN and sends its own in one segment
        ("client", "FA", 1001, 5001, 0),
        ("backend", "FA", 5001, 1002, 0),
        ("client", "A", 1002, 5001, 0),  # a duplicate ACK, below the backend's FIN: not the last
        ("client", "A", 1002, 5002, 0),  # the last
    ],
}


@FAMILIES
@pytest.mark.parametrize("order", list(CLOSE_ORDERS))
def test_the_ack_of_the_second_fin_ends_the_session_whoever_closes_first(rig, order, v6):
    """Every packet of the close reaches the other end, and only the last one ends the
    session. Before, a session ended at the first client ACK after both FINs: right when the
    client closes first, but when the backend does, its ACK of the client's FIN found no
    session and went to the LB host's kernel, which answered the backend with a RST, and the
    client sent its FIN again and again into a session that was gone."""
    syn, *_ = handshake(rig, v6=v6)
    lb_port = Ether(syn.data)[TCP].sport
    steps = CLOSE_ORDERS[order]
    for i, (who, flags, seq, ack, payload) in enumerate(steps):
        if who == "client":
            seg = TCP(sport=40000, dport=80, flags=flags, seq=seq, ack=ack)
        else:
            seg = TCP(sport=8080, dport=lb_port, flags=flags, seq=seq, ack=ack)
        frame = (rig.from_client if who == "client" else rig.from_backend)(seg / Raw(b"x" * payload), v6=v6)
        r = rig.run(frame)
        assert r.action == "sent", (i, who, flags, rig.lb.counters())
        assert checksums_valid(r.data)
        if i < len(steps) - 1:
            (s,) = rig.lb.sessions()
            assert s["state"] == "established", (i, s)
            assert rig.lb.counters()["closed_fin"] == 0, i
    assert rig.lb.sessions() == [] and rig.lb.counters()["closed_fin"] == 1
    assert len(rig.lb.table("reverse")) == 0 == len(rig.lb.table("reverse_half"))


@FAMILIES
@pytest.mark.parametrize("side", ["client", "backend"])
def test_rst_from_either_side_ends_the_session(rig, side, v6):
    syn, *_ = handshake(rig, v6=v6)
    lb_port = Ether(syn.data)[TCP].sport
    if side == "client":
        r = rig.run(rig.from_client(TCP(sport=40000, dport=80, flags="R", seq=1001), v6=v6))
    else:
        r = rig.run(rig.from_backend(TCP(sport=8080, dport=lb_port, flags="R", seq=5001), v6=v6))
    assert r.action == "sent" and checksums_valid(r.data)
    assert rig.lb.sessions() == [] and rig.lb.counters()["closed_rst"] == 1
    assert len(rig.lb.table("reverse")) == 0 == len(rig.lb.table("reverse_half"))


def test_two_clients_with_the_same_source_port_get_different_lb_ports(rig):
    ports = set()
    for src in ("198.18.7.7", "198.18.7.8", "198.18.8.7"):
        r = rig.run(rig.from_client(TCP(sport=40000, dport=80, flags="S", seq=1), src=src))
        assert r.action == "sent"
        ports.add(Ether(r.data)[TCP].sport)
    assert len(ports) == 3


def test_when_no_lb_port_is_free_the_syn_is_dropped_and_counted(net, hook):
    r = Rig(net, hook=hook, port_count=2)
    try:
        verdicts = [
            r.run(r.from_client(TCP(sport=40000 + i, dport=80, flags="S"), src=f"198.18.7.{i + 1}")).action
            for i in range(3)
        ]
        assert verdicts == ["sent", "sent", "drop"]
        assert r.lb.counters()["dropped_no_port"] == 1
        assert sorted(s["lb_port"] for s in r.lb.sessions()) == [PORT_MIN, PORT_MIN + 1]
        # the range's first and last ports are both the LB's: the backend's
        # replies to each go back to their client
        for s in r.lb.sessions():
            back = r.run(r.from_backend(TCP(sport=8080, dport=s["lb_port"], flags="SA")))
            assert back.action == "sent" and Ether(back.data)[IP].dst == s["client"], s
        assert r.lb.counters()["to_client"] == 2
    finally:
        r.close()


def test_traffic_not_for_a_service_passes_unchanged(rig):
    frames = [
        Ether(src=CLIENT_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(pdst=VIP, psrc="198.18.7.7"),
        rig.from_client(ICMP()),  # ping to the VIP
        rig.from_client(TCP(sport=40000, dport=81, flags="S")),  # another port
        rig.from_client(UDP(sport=40000, dport=80) / b"x"),  # another protocol
        rig.from_client(TCP(sport=40000, dport=80, flags="S"), dst=SELF4),  # the LB's own address
        rig.from_backend(TCP(sport=8080, dport=PORT_MIN + 5, flags="A")),  # to an LB port no session holds
    ]
    for f in frames:
        r = rig.run(f)
        assert r.action == "pass" and r.data == bytes(f), f.summary()
    assert rig.lb.sessions() == []


def test_fragments_and_ip_options_to_a_vip_are_dropped_and_counted(rig):
    frag = rig.from_client(TCP(sport=40000, dport=80, flags="S"))
    frag[IP].flags = "MF"
    opts = (
        Ether(src=CLIENT_MAC, dst=rig.mac)
        / IP(src="198.18.7.7", dst=VIP, options=b"\x94\x04\x00\x00")
        / TCP(sport=40000, dport=80, flags="S")
    )
    assert rig.run(frag).action == "drop"
    assert rig.run(opts).action == "drop"
    c = rig.lb.counters()
    assert c["dropped_fragment"] == 1 and c["dropped_ip_options"] == 1 and rig.lb.sessions() == []
    # to another address, the same frames are none of the LB's business
    other = rig.from_client(TCP(sport=40000, dport=80, flags="S"), dst="198.18.1.200")
    other[IP].flags = "MF"
    assert rig.run(other).action == "pass"


def test_what_no_service_owns_at_l4_reaches_the_stack_untouched_in_both_families(rig):
    """The VIP is often the LB host's own address: its ICMPv6 (neighbour
    discovery, echo, packet-too-big), ICMP and other protocols are the stack's,
    with or without fragmentation or extension headers. Only TCP/UDP to a VIP
    that the program would forward wrongly drops, each by a named reason."""
    c6 = "2001:2:0:7::7"
    e6 = Ether(src=CLIENT_MAC, dst=rig.mac)
    big_echo = IP(src="198.18.7.7", dst=VIP, flags="MF", id=9) / ICMP() / (b"e" * 64)
    frames = [
        e6 / IPv6(src=c6, dst=VIP6) / ICMPv6ND_NS(tgt=VIP6) / ICMPv6NDOptSrcLLAddr(lladdr=CLIENT_MAC),
        e6 / IPv6(src=c6, dst=VIP6) / ICMPv6ND_NA(tgt=c6, R=0, S=1),  # an answer to the LB's own NS
        e6 / IPv6(src=c6, dst=VIP6) / ICMPv6EchoRequest(data=b"ping"),
        e6 / IPv6(src=c6, dst=VIP6) / ICMPv6PacketTooBig(mtu=1280) / IPv6(src=VIP6, dst=c6) / TCP(sport=80),
        e6 / IPv6(src=c6, dst=VIP6) / IPv6ExtHdrHopByHop() / ICMPv6MLReport2(),  # MLD has a hop-by-hop header
        e6 / IPv6(src=c6, dst=VIP6) / IPv6ExtHdrFragment(m=1, nh=58) / ICMPv6EchoRequest(data=b"f" * 64),
        Ether(src=CLIENT_MAC, dst=rig.mac) / big_echo,  # an ICMP fragment
        rig.from_client(ICMP(type=3, code=4, nexthopmtu=1400) / IP(src=VIP, dst="198.18.7.7") / TCP(sport=80)),
        Ether(src=CLIENT_MAC, dst=rig.mac) / IP(src="198.18.7.7", dst=VIP, proto=47) / (b"g" * 24),  # GRE
        # TCP to the VIP on a port no service has, with IPv4 options
        Ether(src=CLIENT_MAC, dst=rig.mac)
        / IP(src="198.18.7.7", dst=VIP, options=b"\x94\x04\x00\x00")
        / TCP(sport=40000, dport=22, flags="S"),
        # a TCP header cut short, to an address that is no VIP
        Raw(bytes(rig.from_client(TCP(sport=40000, dport=80, flags="S"), dst="198.18.1.200"))[: 14 + 20 + 10]),
    ]
    for f in frames:
        r = rig.run(f)
        assert (r.verdict, r.data) == (rig.PASS, bytes(f)), f.summary()
    c = rig.lb.counters()
    # every one passed; each counted by what it is, as every program says it:
    # the two ICMP fragments are fragments, the cut-short TCP header malformed
    assert c["pass"] == len(frames) and c["drop"] == 0
    assert (c["fragment"], c["malformed"], c["unmatched"]) == (2, 1, len(frames) - 3)
    assert rig.lb.sessions() == []


@pytest.mark.parametrize(
    "what, frame, reason",
    [
        (
            "tcp6 fragment to a vip",
            lambda r: (
                Ether(src=CLIENT_MAC, dst=r.mac)
                / IPv6(src="2001:2:0:7::7", dst=VIP6)
                / IPv6ExtHdrFragment(m=1)
                / TCP(sport=40000, dport=80, flags="S")
            ),
            "dropped_fragment",
        ),
        (
            "later tcp6 fragment",
            lambda r: (
                Ether(src=CLIENT_MAC, dst=r.mac)
                / IPv6(src="2001:2:0:7::7", dst=VIP6)
                / IPv6ExtHdrFragment(offset=8, nh=6)
                / (b"x" * 16)
            ),
            "dropped_fragment",
        ),
        (
            "tcp6 service traffic behind a hop-by-hop header",
            lambda r: (
                Ether(src=CLIENT_MAC, dst=r.mac)
                / IPv6(src="2001:2:0:7::7", dst=VIP6)
                / IPv6ExtHdrHopByHop()
                / TCP(sport=40000, dport=80, flags="S")
            ),
            "dropped_ip_options",
        ),
        (
            "later udp4 fragment to a vip",
            lambda r: Ether(src=CLIENT_MAC, dst=r.mac) / IP(src="198.18.7.7", dst=VIP, frag=8, proto=17) / (b"x" * 16),
            "dropped_fragment",
        ),
        (
            "a tcp header cut short, to a vip",
            lambda r: Raw(bytes(r.from_client(TCP(sport=1, dport=80)))[: 14 + 20 + 10]),
            "dropped_malformed",
        ),
    ],
)
def test_service_traffic_it_cannot_forward_right_is_dropped_by_reason(rig, what, frame, reason):
    assert rig.run(frame(rig)).action == "drop", what
    c = rig.lb.counters()
    assert c[reason] == 1 == c["drop"] and rig.lb.sessions() == [], what


@pytest.mark.parametrize("flags", ["A", "SA", "FA", "PA"])
def test_a_non_syn_without_a_session_is_dropped(rig, flags):
    """Only a SYN (without ACK) opens a session: a SYN-ACK from outside is an
    answer to nothing here (a reflection, or a scan) and opens none."""
    r = rig.run(rig.from_client(TCP(sport=40000, dport=80, flags=flags, seq=5)))
    assert r.action == "drop" and rig.lb.counters()["dropped_no_session"] == 1
    assert rig.lb.sessions() == [] and rig.lb.counters()["new_sessions"] == 0


@FAMILIES
def test_udp_session_and_reply(net, hook, v6):
    r = Rig(net, hook=hook, services=("udp",))
    ip = l3(v6)
    want_out = (SELF6, BE6, 8080) if v6 else (SELF4, BE1, 8080)
    want_back = (VIP6, 80, CLIENT6, 5353) if v6 else (VIP, 80, CLIENT4, 5353)
    try:
        q = r.run(r.from_client(UDP(sport=5353, dport=80) / b"query", v6=v6))
        assert q.action == "sent" and checksums_valid(q.data)
        out = Ether(q.data)
        assert (out[ip].src, out[ip].dst, out[UDP].dport) == want_out and out[UDP].load == b"query"
        assert out[UDP].chksum != 0  # a UDP checksum is never dropped, in IPv6 it is mandatory
        a = r.run(r.from_backend(UDP(sport=8080, dport=out[UDP].sport) / b"answer", v6=v6))
        assert a.action == "sent" and checksums_valid(a.data)
        back = Ether(a.data)
        assert (back[ip].src, back[UDP].sport, back[ip].dst, back[UDP].dport) == want_back
        (s,) = r.lb.sessions()
        assert s["state"] == "udp" and not s["half_open"]
        # the same flow again: the same session, the same LB port
        q2 = r.run(r.from_client(UDP(sport=5353, dport=80) / b"again", v6=v6))
        assert Ether(q2.data)[UDP].sport == out[UDP].sport and len(r.lb.sessions()) == 1
    finally:
        r.close()


def test_ipv6_session_both_ways(rig):
    r = rig.run(rig.from_client(TCP(sport=41000, dport=80, flags="S", seq=7), v6=True))
    assert r.action == "sent" and checksums_valid(r.data)
    out = Ether(r.data)
    assert (out[IPv6].src, out[IPv6].dst, out[TCP].dport) == (SELF6, BE6, 8080)
    assert out.dst == (rig.be_mac if rig.hook == "xdp" else rig.mac)
    back = rig.run(rig.from_backend(TCP(sport=8080, dport=out[TCP].sport, flags="SA", ack=8), v6=True))
    assert back.action == "sent" and checksums_valid(back.data)
    b = Ether(back.data)
    assert (b[IPv6].src, b[TCP].sport, b[IPv6].dst, b[TCP].dport) == (VIP6, 80, "2001:2:0:7::7", 41000)


def test_dsr_rewrites_only_the_mac(net, hook):
    r = Rig(net, hook=hook, mode="dsr")
    try:
        f = r.from_client(TCP(sport=40000, dport=80, flags="S", seq=9) / b"")
        out = r.run(f)
        assert out.action == "sent"
        want = Ether(bytes(f))
        if hook == "xdp":  # at TC not even that: the backend is the next hop bpf_redirect_neigh is given
            want.src, want.dst = r.mac, r.be_mac
        assert out.data == bytes(want)
    finally:
        r.close()


@FAMILIES
def test_maglev_spreads_by_weight_and_drain_keeps_existing_sessions(net, hook, v6):
    one, three = (BE6, BE6B) if v6 else (BE1, BE2)
    r = Rig(net, hook=hook, backends=((BE1, 1), (BE2, 3)), backends6=((BE6, 1), (BE6B, 3)))
    ip = l3(v6)
    vip, be = (f"tcp:[{VIP6}]:80", lambda a: f"[{a}]:8080") if v6 else (f"tcp:{VIP}:80", lambda a: f"{a}:8080")

    def client(i):
        return f"2001:2:0:{7 + i // 200:x}::{i % 200 + 1:x}" if v6 else f"198.18.{7 + i // 200}.{i % 200 + 1}"

    def syn(i, sport):
        l4 = TCP(sport=sport, dport=80, flags="S")
        return (
            Ether(src=CLIENT_MAC, dst=r.mac)
            / (IPv6(src=client(i), dst=VIP6) if v6 else IP(src=client(i), dst=VIP))
            / l4
        )

    try:
        dst = []
        for i in range(400):
            res = r.run(syn(i, 30000 + i))
            assert res.action == "sent"
            dst.append(Ether(res.data)[ip].dst)
        assert set(dst) == {one, three}
        share = dst.count(three) / len(dst)
        assert 0.65 <= share <= 0.85, share  # 3 of 4 by weight, within a stated tolerance
        # drain the heavier one: new sessions avoid it, a session it holds goes on
        held = next(i for i, d in enumerate(dst) if d == three)
        r.lb.set_backends(vip, {be(one): 1, be(three): 0})
        again = r.run(syn(held, 30000 + held))
        assert Ether(again.data)[ip].dst == three  # its half-open session still holds it
        fresh = [Ether(r.run(syn(399, 50000 + i)).data)[ip].dst for i in range(50)]
        assert set(fresh) == {one}
    finally:
        r.close()


def kernel_ring(lb):
    """The first service's Maglev table as the program reads it: backend indexes
    from the kernel's `rings` map (0: empty), not from what user space remembers."""
    rings = lb.table("rings")
    return [rings[ctypes.c_int(i)].value for i in range(RING_SIZE)]


def differing(a, b, first=5):
    """The first few slots where two tables of one size differ (a short answer:
    pytest's own diff of two 65537-slot lists takes minutes under CI=true,
    where it does not cut its explanations short)."""
    assert len(a) == len(b)
    return [(i, x, y) for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y][:first]


def test_maglev_minimal_disruption(net):
    names = {f"10.0.0.{i}:80": 1 for i in range(1, 9)}
    before = maglev_table(names)
    after = maglev_table({n: w for n, w in names.items() if n != "10.0.0.3:80"})
    moved = sum(1 for a, b in zip(before, after, strict=True) if a != b and a != "10.0.0.3:80")
    assert moved / len(before) < 1 / 8  # others' slots barely move
    assert all(b != "10.0.0.3:80" for b in after)
    assert differing(maglev_table(dict(reversed(list(names.items())))), before) == []  # order does not matter
    # re-adding it (last, after the seven that stayed) restores the table before its removal
    readded = {n: w for n, w in names.items() if n != "10.0.0.3:80"} | {"10.0.0.3:80": 1}
    assert list(readded) != list(names) and differing(maglev_table(readded), before) == []
    assert differing(maglev_table(readded | {"10.0.0.3:80": 2}), before) != []  # (the comparison tells them apart)
    # the same in the kernel, where set_backends writes only the slots that change
    lb = XdpLoadBalancer(self4=SELF4, netns=net.ns("lb"))
    try:
        svc = lb.add_service(f"tcp:{VIP}:80")
        eight = {f"198.18.1.{i}:8080": 1 for i in range(10, 18)}
        lb.set_backends(svc, eight)
        first = kernel_ring(lb)
        assert 0 not in first and len(set(first)) == 8
        lb.set_backends(svc, {b: w for b, w in eight.items() if b != "198.18.1.12:8080"})
        without = kernel_ring(lb)
        assert 0 not in without and len(set(without)) == 7 and differing(without, first) != []
        lb.set_backends(svc, eight)
        assert differing(kernel_ring(lb), first) == []
    finally:
        lb.close()


def test_attach_refuses_an_interface_that_does_not_forward(net):
    """bpf_fib_lookup() answers only where forwarding is on: without it every
    SYN was dropped as "no neighbour" (found writing these fixtures)."""
    lb = XdpLoadBalancer(self4=BE1, netns=net.ns("be"))
    try:
        lb.add_service(f"tcp:{VIP}:80")
        with pytest.raises(InputError, match=r"forwarding is off on eth0 \(net.ipv4.conf.eth0.forwarding = 0\)"):
            lb.attach("eth0")
        assert attached(net.ns("be")) == []
    finally:
        lb.close()


def age(lb, table, seconds):
    """Make every session of a table look idle for `seconds`, as the program
    reads it (last_seen against bpf_ktime_get_ns(), CLOCK_MONOTONIC)."""
    t = lb.table(table)
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    for k, v in list(t.items()):
        v.last_seen = now - int(seconds * 1e9)
        t[k] = v


@pytest.mark.parametrize("proto, table, state", [("udp", "sessions", "udp"), ("tcp", "half_open", "syn")])
def test_the_program_expires_a_session_idle_past_its_timeout_when_it_is_next_seen(net, hook, proto, table, state):
    """Between sweeps the program itself ends a session idle longer than its
    state's timeout, when its flow sends again, and starts a new one; one idle
    for less stays. (Its age is written into the map: no test waits for time.)"""
    r = Rig(net, hook=hook, services=(proto,))
    timeout = r.lb.timeouts[state]
    l4 = (
        (lambda: UDP(sport=5353, dport=80) / b"q")
        if proto == "udp"
        else (lambda: TCP(sport=40000, dport=80, flags="S"))
    )
    try:
        assert r.run(r.from_client(l4())).action == "sent"
        age(r.lb, table, 0.75 * timeout)
        assert r.run(r.from_client(l4())).action == "sent"
        c = r.lb.counters()
        assert (c["new_sessions"], c["expired"]) == (1, 0) and len(r.lb.sessions()) == 1
        age(r.lb, table, 1.25 * timeout)
        assert r.run(r.from_client(l4())).action == "sent"
        c = r.lb.counters()
        assert (c["new_sessions"], c["expired"]) == (2, 1)
        (s,) = r.lb.sessions()
        assert s["idle_s"] < 1  # the new one, seen just now
    finally:
        r.close()


def test_idle_sessions_are_swept_from_both_tables(net, hook):
    """A half-open session whose client went away, and an idle UDP flow: user
    space's sweep removes them and their LB ports, and the port is free again."""
    r = Rig(net, hook=hook, services=("tcp", "udp"), port_count=1)
    r.lb.timeouts.update(syn=0.2, udp=0.2)
    r.lb.maps_created()  # write the shorter timeouts
    try:
        assert r.run(r.from_client(TCP(sport=40000, dport=80, flags="S"))).action == "sent"
        assert r.run(r.from_client(UDP(sport=5353, dport=80) / b"q")).action == "sent"
        assert len(r.lb.sessions()) == 2
        assert r.run(r.from_client(TCP(sport=40001, dport=80, flags="S"), src="198.18.7.9")).action == "drop"
        time.sleep(0.3)
        assert r.lb.sweep() == 2 and r.lb.sessions() == []
        assert len(r.lb.table("reverse_half")) == 0 and len(r.lb.table("reverse")) == 0
        # the one LB port is free again
        assert r.run(r.from_client(TCP(sport=40001, dport=80, flags="S"), src="198.18.7.9")).action == "sent"
    finally:
        r.close()


def test_nat_ports_and_the_hosts_own_ephemeral_ports_never_meet(net):
    """A backend's packet to an LB port is a reply to the session that holds it;
    were the port also one the LB host's kernel gave its own connection to that
    backend (a health check), the program would hand the host's packets to a
    client. So the NAT ports are the larger span the host's ephemeral range
    (net.ipv4.ip_local_port_range) leaves, in the LB's namespace; too few is
    refused with the fix."""
    ns = net.ns("lb")
    key = "net.ipv4.ip_local_port_range"
    saved = netns.read_sysctl(ns, key)
    try:
        for rng, want in (("32768 60999", (1024, 31744)), ("10000 50000", (50001, 15535)), ("1500 65000", None)):
            netns.sysctl(ns, key, rng)
            if want is None:
                with pytest.raises(InputError, match="fewer than 1024 ports.*fix: sysctl -w"):
                    XdpLoadBalancer(self4=SELF4, netns=ns)
                continue
            lb = XdpLoadBalancer(self4=SELF4, netns=ns)
            lo, hi = map(int, rng.split())
            assert (lb.port_min, lb.port_count) == nat_ports(ns) == want
            assert lb.port_min + lb.port_count - 1 < lo or lb.port_min > hi
            lb.close()
    finally:
        netns.sysctl(ns, key, saved)


def test_a_ring_read_in_batches_is_the_ring_written(rig):
    """A taken-over LB reads the kept Maglev tables back in batches (ebpf.maps.array_slice)
    to write only what differs: each service's slice, from the first and from a later
    service, is what set_backends() wrote, slot for slot, as one lookup per slot reads it."""
    fd, rings = rig.lb.table("rings").map_fd, rig.lb.table("rings")
    index = {str(b): i for b, i in rig.lb._backends.items()}
    for svc in rig.lb.services:
        sid = rig.lb._services[svc]
        got = maps.array_slice(fd, sid * RING_SIZE, RING_SIZE)
        assert got == [index[n] if n else 0 for n in rig.lb.ring(svc)]
        for i in (0, 1, RING_SIZE // 2, RING_SIZE - 1):  # and as BCC reads single slots
            assert got[i] == rings[ctypes.c_int(sid * RING_SIZE + i)].value
    assert any(sid > 0 for sid in rig.lb._services.values())  # a slice that starts past 0 was read


def test_maglev_shares_follow_weights_that_do_not_divide_each_other():
    """Weights 2:3, 3:5, 1:2:4, and 1:2:4 beside a drained backend: each backend
    holds weight/total of the slots, within the population's rounding, at the
    program's table size and at a small one where the rounding weighs more.

    The bound, from maglev_table(): each round, every live backend adds its weight
    w to its credit and takes its next free slot when the credit reaches wmax (the
    largest weight), spending wmax. A credit left below wmax, plus w <= wmax, is
    below 2 wmax: one slot a round at most. So after r whole rounds a backend holds
    floor(r w / wmax); the table fills partway through some round R, maybe before
    a backend's turn in it. With t = R / wmax, each holds t w - e, e in
    [0, 1 + w / wmax) (the floor's fraction, plus that last turn if it came too
    late). The counts sum to the size S, so t = (S + sum of the e) / W, W the total
    weight, and a backend's count less its share S w / W is
    w/W * (the others' e) - (1 - w/W) * its own e, strictly within
        -(1 + w/wmax) (1 - w/W)  and  w/W * (n - 1 + (W - w) / wmax)
    (n live backends): at most a slot either way for two backends, under 2 for
    these three, whatever the size; the bound is reached to within a tenth of a
    slot by some weights and names. A drained backend (weight 0) takes no turn:
    no slot, and the others' slots are the table without it."""
    for size in (251, RING_SIZE):
        for weights in (
            {"10.0.0.1:80": 2, "10.0.0.2:80": 3},
            {"10.0.0.1:80": 3, "10.0.0.2:80": 5},
            {"10.0.0.1:80": 1, "10.0.0.2:80": 2, "10.0.0.3:80": 4},
            {"10.0.0.1:80": 1, "10.0.0.2:80": 2, "10.0.0.3:80": 4, "10.0.0.4:80": 0},
        ):
            table = maglev_table(weights, size)
            live = {b: w for b, w in weights.items() if w}
            n, total, wmax = len(live), sum(live.values()), max(live.values())
            held = {b: table.count(b) for b in weights}
            assert len(table) == size == sum(held.values()), (size, weights)
            for b, w in live.items():
                off = held[b] - size * w / total
                low, high = -(1 + w / wmax) * (1 - w / total), w / total * (n - 1 + (total - w) / wmax)
                assert low < off < high, (size, weights, b, held[b], size * w / total, (low, high))
            if len(live) < len(weights):
                assert held["10.0.0.4:80"] == 0 and differing(table, maglev_table(live, size)) == []


def test_at_tc_a_frame_too_big_for_the_interface_gets_the_icmp_error_forwarding_would_send(net):
    """bpf_redirect_neigh() bypasses IP forwarding, so nothing fragments or answers for the
    LB at TC: a frame that does not fit the interface it would leave by (here the test
    run's device, the LB's eth0, MTU 1500) goes back to its sender as "fragmentation
    needed" (IPv4, DF set) or "packet too big" (IPv6), from the address it was sent to,
    quoting its headers; without DF it is dropped. Each counted too_big; one that fits
    goes on. (Live traffic on one interface never has such a frame: it arrived through
    that MTU; a GSO frame is checked by its segments, tests/test_tc_lb.py.)"""
    r = Rig(net, hook="tc", services=("udp",))
    try:
        fits = r.run(r.from_client(UDP(sport=5000, dport=80) / (b"x" * (1500 - 28))))
        assert fits.action == "sent" and Ether(fits.data)[IP].dst == BE1
        big = r.from_client(UDP(sport=5000, dport=80) / (b"x" * (1500 - 27)))
        assert r.run(big).verdict == "TC_ACT_SHOT"  # no DF: it should be fragmented, not answered
        big[IP].flags = "DF"
        # cut to the error's length, the skb is no longer CHECKSUM_COMPLETE (the kernel's trim
        # makes it CHECKSUM_NONE: the receiver sums it), which the test run's check of
        # skb->csum does not look at: run on a plain skb
        out = r.run(big, checksum_complete=False)
        assert out.verdict == "TC_ACT_REDIRECT"
        e = Ether(out.data)
        assert (e.src, e.dst) == (r.mac, CLIENT_MAC) and len(out.data) == 14 + 56
        assert (e[IP].src, e[IP].dst, e[IP].proto, e[ICMP].type, e[ICMP].code) == (VIP, CLIENT4, 1, 3, 4)
        assert e[ICMP].nexthopmtu == 1500 and bytes(e[ICMP].payload) == bytes(big[IP])[:28]
        assert checksums_valid(out.data) and icmp_valid(e[ICMP])
        big6 = r.from_client(UDP(sport=5000, dport=80) / (b"x" * (1500 - 47)), v6=True)
        out6 = r.run(big6, checksum_complete=False)
        assert out6.verdict == "TC_ACT_REDIRECT" and len(out6.data) == 14 + 96
        e6 = Ether(out6.data)
        assert (e6[IPv6].src, e6[IPv6].dst, e6[IPv6].nh, e6[IPv6].plen) == (VIP6, CLIENT6, 58, 56)
        ptb = e6[ICMPv6PacketTooBig]
        assert ptb.mtu == 1500 and bytes(ptb.payload) == bytes(big6[IPv6])[:48]
        redo = Ether(out6.data)
        del redo[ICMPv6PacketTooBig].cksum
        assert Ether(bytes(redo))[ICMPv6PacketTooBig].cksum == ptb.cksum
        c = r.lb.counters()
        assert (c["too_big"], c["dropped_too_big"], c["drop"], c["redirect"]) == (3, 1, 1, 3), c
        assert r.lb.backend_counters()[f"{BE1}:8080"]["packets"] == 1  # only what went on
        assert r.lb.sessions()[0]["client_port"] == 5000 and len(r.lb.sessions()) == 1  # the one that fit
    finally:
        r.close()


def icmp_valid(icmp) -> bool:
    redo = ICMP(bytes(icmp))
    del redo.chksum
    return ICMP(bytes(redo)).chksum == icmp.chksum
