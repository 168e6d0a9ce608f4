"""TcRedirect (tc_redirect.bpf.c): XdpRedirect's rules at the TC ingress hook.

The golden fixtures of the XDP program (tests/fixtures/redirect.py) through
BPF_PROG_TEST_RUN as a SCHED_CLS program: the same output bytes, and TC_ACT_OK
where the XDP program says XDP_PASS; each run also as a CHECKSUM_COMPLETE skb,
whose skb->csum the kernel checks against the output (the skb helpers must keep
it in step). The same rows on real skbs, at a real hook. Then the real kernel
in the report's set-up (lab.fastpaths.redirect.testbed.router_testbed): a file arrives whole in pass
and forward, IPv4 and IPv6, at a connected client; the counters are exact; the
forward fallbacks are counted, and an unknown neighbour is not one (the helper
resolves it); nothing is left on the hooks after close."""

from collections import Counter

import pytest
from fixtures import redirect as fx
from helpers import nft_udp_counter, wait_for
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from ebpf import BpfError, TcRedirect, tc, testrun
from lab import netns
from lab.fastpaths.redirect.testbed import router_testbed
from lab.traffic import Capture, FileTransfer, FileTransferServer, Flow, Marker, build, send_frames

PASS = fx.pass_fixtures()
FORWARD = fx.forward_fixtures_without_route()
TC_ACT_OK, TC_ACT_REDIRECT = 0, 7
TC_VERDICTS = {"XDP_PASS": TC_ACT_OK}  # the fixtures' XDP verdicts, as TC says them
N = 300


def run_complete(fd, frame, ifindex=0):
    """A test run with the skb CHECKSUM_COMPLETE (testrun.run): (retval, output bytes)."""
    r = testrun.run(fd, frame, ingress_ifindex=ifindex, xdp=False, checksum_complete=True)
    return r.retval, r.data


def short_l3(frame: bytes):
    """An IPv4 or IPv6 ethertype followed by less than the fixed IP header. The
    kernel's test run refuses such a frame (EINVAL, since "bpf: reject short
    IPv4/IPv6 inputs in bpf_prog_test_run_skb", 2026, in the stable kernels
    too), though a real hook sees them: test_every_fixture_on_real_skbs runs them."""
    kind = frame[12:14]
    return (kind == b"\x08\x00" and len(frame) < 14 + 20) or (kind == b"\x86\xdd" and len(frame) < 14 + 40)


@pytest.fixture(scope="module")
def redirect_pass():
    with TcRedirect(fx.RULES, action="pass") as r:
        yield r


@pytest.fixture(scope="module")
def redirect_forward():
    with TcRedirect(fx.RULES, action="forward") as r:
        yield r


def check(prog, f):
    fd = prog.load_program().fd
    data = bytes(f.frame)
    want = data if f.expected is None else f.expected
    try:
        r = testrun.run(fd, data, xdp=False)
    except BpfError as e:
        assert short_l3(data) and "Invalid argument" in str(e), (f.description, e)
        return
    assert r.retval == TC_VERDICTS[f.verdict], f.description
    assert r.data == want, (f.description, Ether(r.data).show2(dump=True), Ether(want).show2(dump=True))
    # the same as a CHECKSUM_COMPLETE skb: same bytes, and skb->csum kept in step
    assert run_complete(fd, data) == (r.retval, want), f.description


@pytest.mark.parametrize("f", PASS, ids=[f.description for f in PASS])
def test_pass(redirect_pass, f):
    check(redirect_pass, f)


@pytest.mark.parametrize("f", FORWARD, ids=[f.description for f in FORWARD])
def test_forward_without_route(redirect_forward, f):
    check(redirect_forward, f)


def test_fixture_counters_are_exact():
    """Each fixture the kernel runs, once: every frame in `seen`, in TC_ACT_OK
    (pass), and in the one counter its row names; per rule, packets and replies."""
    rows = [f for f in PASS if not short_l3(bytes(f.frame))]
    with TcRedirect(fx.RULES, action="pass") as prog:
        fd = prog.load_program().fd
        for f in rows:
            testrun.run(fd, bytes(f.frame), xdp=False)
        c = prog.counters()
        per_rule = prog.rule_counters()
    want = Counter(f.counted for f in rows)
    assert c["seen"] == len(rows) == c["pass"]
    assert c["redirect"] == c["drop"] == c["aborted"] == 0
    for name in ("to_backend", "to_client", "not_ip", "unmatched", "fragment", "malformed"):
        assert c[name] == want[name], name

    def udp4(f, counted):
        return f.counted == counted and UDP in f.frame and IP in f.frame

    rule = per_rule[fx.RULES[0]]  # udp:VIP4:8080=BACKEND4:8083
    assert rule["packets"] == sum(udp4(f, "to_backend") for f in rows) > 0
    assert rule["reply_packets"] == sum(udp4(f, "to_client") for f in rows) > 0
    assert sum(v["packets"] for v in per_rule.values()) == want["to_backend"]
    assert sum(v["reply_packets"] for v in per_rule.values()) == want["to_client"]


def test_rules_change_live(redirect_pass):
    """XdpRedirect's rule code, unchanged, drives the TC program's maps."""
    fd = redirect_pass.load_program().fd
    data = bytes(fx.U4)
    redirect_pass.remove_rule(fx.RULES[0])
    assert testrun.run(fd, data, xdp=False).data == data
    redirect_pass.add_rule(fx.RULES[0])
    assert testrun.run(fd, data, xdp=False).data == fx.to_backend(fx.U4)
    assert redirect_pass.load_program().fd == fd


# --- the real kernel -------------------------------------------------------------------
@pytest.fixture
def rtb():
    with router_testbed() as tb:
        yield tb


def test_every_fixture_on_real_skbs(rtb):
    """Every row, the two the test run refuses included, through a real hook:
    the program on the client's egress (skb->data is the Ethernet header there
    too), each frame captured as it arrives at the router."""
    client, dut = rtb.ns("client"), rtb.ns("dut")
    src = bytes.fromhex("020000000001")  # the fixtures' source MAC; nothing else in the lab sends from it
    with TcRedirect(fx.RULES, action="pass", netns=client) as prog:
        prog.attach_tc(prog.FUNCTION, "eth0", "egress", client, owner=prog.OWNER)
        with Capture(dut, rtb.dut_in, lambda fr: "fixture" if fr[6:12] == src else None, keep=True) as cap:
            send_frames(client, "eth0", [bytes(f.frame) for f in PASS], rate_pps=2000)
        c = prog.counters()
    assert len(cap.frames) == len(PASS)
    for f, got in zip(PASS, cap.frames, strict=True):
        want = bytes(f.frame) if f.expected is None else f.expected
        assert got == want, (f.description, Ether(got).show2(dump=True), Ether(want).show2(dump=True))
    want = Counter(f.counted for f in PASS)
    for name in ("to_backend", "to_client", "fragment", "malformed"):
        assert c[name] == want[name], name
    # the client's own frames (IPv6 router solicitations, MLD) pass the hook too
    assert c["unmatched"] >= want["unmatched"] and c["not_ip"] >= want["not_ip"]
    assert c["pass"] == c["seen"]


def router_frame(tb, proto, family, reply=False, ttl=64):
    """A frame as it arrives at the router's interface: to the service, or (reply)
    from the backend to the client."""
    client, vip, server = (tb.client4, tb.vip4, tb.server4) if family == 4 else (tb.client6, tb.vip6, tb.server6)
    l3 = (
        (IP(src=server, dst=client, ttl=ttl) if reply else IP(src=client, dst=vip, ttl=ttl))
        if family == 4
        else (IPv6(src=server, dst=client, hlim=ttl) if reply else IPv6(src=client, dst=vip, hlim=ttl))
    )
    l4cls = UDP if proto == "udp" else TCP
    l4 = l4cls(sport=tb.backend_port, dport=40000) if reply else l4cls(sport=40000, dport=tb.service_port)
    host, ifname = ("server", "eth0") if reply else ("client", "eth0")
    to = tb.dut_out if reply else tb.dut_in
    return Ether(src=tb.topo.mac(host, ifname), dst=tb.topo.mac("dut", to)) / l3 / l4 / Raw(b"x" * 40)


def forwarded(tb, frame, reply=False):
    """What `forward` must hand to bpf_redirect_neigh: rewritten, TTL minus one,
    every checksum recomputed by scapy (the MACs are the helper's job, later)."""
    p = frame.copy()
    l3 = p[IP] if IP in p else p[IPv6]
    l4 = p[UDP] if UDP in p else p[TCP]
    if reply:
        l3.src = tb.vip4 if IP in p else tb.vip6
        l4.sport = tb.service_port
    else:
        l3.dst = tb.server4 if IP in p else tb.server6
        l4.dport = tb.backend_port
    if IP in p:
        l3.ttl -= 1
        del l3.chksum
    else:
        l3.hlim -= 1
    del l4.chksum
    return bytes(p.__class__(bytes(p)))


@pytest.mark.parametrize("family", [4, 6])
def test_forward_on_a_route_as_a_test_run(rtb, family):
    """`forward` where the route exists: a test run inside the router's namespace,
    as received on its interfaces. TC_ACT_REDIRECT, the packet rewritten with TTL
    or hop limit minus one, and a CHECKSUM_COMPLETE skb->csum kept in step."""
    dut = rtb.ns("dut")
    with TcRedirect(rtb.rules("udp") + rtb.rules("tcp"), action="forward", netns=dut) as prog:
        fd = prog.load_program().fd
        for proto in ("udp", "tcp"):
            for reply in (False, True):
                frame = router_frame(rtb, proto, family, reply)
                ifindex = rtb.topo.ifindex("dut", rtb.dut_out if reply else rtb.dut_in)
                with netns.entered(dut):  # bpf_fib_lookup looks in the namespace of the run
                    got = run_complete(fd, bytes(frame), ifindex=ifindex)
                assert got == (TC_ACT_REDIRECT, forwarded(rtb, frame, reply)), (proto, reply)
        c = prog.counters()
    assert c["redirect"] == c["seen"] == 4 and c["to_backend"] == c["to_client"] == 2


def to_service(tb, n, ttl=64, size=200):
    """n IPv4 datagrams from the client to the service, as crafted frames (one flow)."""
    flow = Flow("s", tb.client4, tb.vip4, "udp", sport=40000, dport=tb.service_port, count=n, size=size)
    frames = build([flow], Marker(), tb.topo.mac("client", "eth0"), tb.topo.mac("dut", "eth0"))
    if ttl != 64:

        def with_ttl(p):
            p[IP].ttl = ttl
            del p[IP].chksum
            return bytes(p.__class__(bytes(p)))

        frames = [with_ttl(Ether(f)) for f in frames]
    return frames


@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize("action", ["pass", "forward"])
def test_a_file_arrives_whole_and_nothing_is_left_behind(rtb, action, family):
    vip, server = (rtb.vip4, rtb.server4) if family == 4 else (rtb.vip6, rtb.server6)
    dut = rtb.ns("dut")
    before = tc.hook_snapshot(dut)
    with TcRedirect(rtb.rules("udp"), action=action, netns=dut) as prog:
        prog.attach(rtb.dut_in)
        for ifname in prog.reply_interfaces():  # the backends' side: eth1
            prog.attach(ifname)
        attached = tc.hook_snapshot(dut)
        with FileTransferServer(rtb.ns("server"), server, rtb.backend_port) as srv:
            # a connected client: a reply from anywhere but vip:8080 never reaches it
            rep = FileTransfer(rtb.ns("client"), "eth0", vip, rtb.service_port, size=2 << 20).send(seconds=30)
            done = srv.wait_result(timeout=10)
        c = prog.counters()
        rules = prog.rule_counters()
    assert rep.extra["ok"] and done["ok"] and rep.extra["sha256"] == done["sha256"]
    rule = rules[rtb.rules("udp")[0 if family == 4 else 1]]
    assert rule["packets"] == c["to_backend"] == rep.extra["datagrams"]  # every datagram the client sent
    assert rule["reply_packets"] == c["to_client"] > 0
    assert c["seen"] == c["pass"] + c["redirect"] + c["drop"] + c["aborted"]
    assert c["seen"] == sum(c[k] for k in ("to_backend", "to_client", "not_ip", "unmatched", "fragment", "malformed"))
    assert c["drop"] == c["aborted"] == c["fragment"] == c["malformed"] == 0
    assert sum(c[k] for k in ("slow_no_neigh", "slow_ttl", "slow_too_big", "slow_no_route")) == 0
    if action == "pass":
        assert c["pass"] == c["seen"] and c["redirect"] == 0
    else:  # every rewritten packet took the fast path; the rest went on to the stack
        assert c["redirect"] == c["to_backend"] + c["to_client"]
        assert c["pass"] == c["not_ip"] + c["unmatched"]
    # attached: a clsact qdisc and our filter on each side's ingress; closed: as before
    for ifname in (rtb.dut_in, rtb.dut_out):
        has, filters = attached[ifname]
        assert has and [(d, n) for d, _, _, n in filters] == [("ingress", "redirect+clsact:tc_redirect")]
    assert tc.hook_snapshot(dut) == before


def udp_checksum_errors(tb, host):
    """UDP datagrams a host's kernel refused for a bad checksum, IPv4 and IPv6."""
    text = netns.run(tb.ns(host), ["cat", "/proc/net/snmp", "/proc/net/snmp6"], capture_output=True, text=True).stdout
    lines = text.splitlines()
    names, values = [ln.split() for ln in lines if ln.startswith("Udp:")]
    v6 = next(int(ln.split()[1]) for ln in lines if ln.startswith("Udp6InCsumErrors"))
    return int(values[names.index("InCsumErrors")]) + v6


@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize("action", ["pass", "forward"])
def test_senders_with_checksum_offload(rtb, action, family):
    """What the skb helpers buy: the senders' TX checksum offload on (the lab
    turns it off for XDP), so the datagrams reach the router as CHECKSUM_PARTIAL
    skbs, whose checksum field holds only the pseudo-header's sum. The router's
    own interfaces have it off, so the kernel finishes each checksum in software
    on the way out, and the receivers check them: a port change folded into
    the field, or an address change left out, would be refused there."""
    vip, server = (rtb.vip4, rtb.server4) if family == 4 else (rtb.vip6, rtb.server6)
    for host, ifname in (("client", "eth0"), ("server", "eth0")):
        rtb.topo.run(host, ["ethtool", "-K", ifname, "tx", "on"], capture_output=True)
    for ifname in (rtb.dut_in, rtb.dut_out):
        rtb.topo.run("dut", ["ethtool", "-K", ifname, "tx", "off"], capture_output=True)
    with TcRedirect(rtb.rules("udp"), action=action, netns=rtb.ns("dut")) as prog:
        prog.attach(rtb.dut_in)
        prog.attach(rtb.dut_out)
        with FileTransferServer(rtb.ns("server"), server, rtb.backend_port) as srv:
            rep = FileTransfer(rtb.ns("client"), "eth0", vip, rtb.service_port, size=1 << 20).send(seconds=30)
            done = srv.wait_result(timeout=10)
        c = prog.counters()
    assert rep.extra["ok"] and done["ok"] and rep.extra["sha256"] == done["sha256"]
    assert rep.extra["retransmitted"] == 0  # not one datagram lost to a bad checksum
    assert c["to_backend"] == rep.extra["datagrams"] and c["to_client"] > 0
    assert udp_checksum_errors(rtb, "server") == udp_checksum_errors(rtb, "client") == 0


def test_forward_fallbacks_are_counted_and_a_neighbour_is_resolved(rtb):
    """TTL 1 (the kernel sends the ICMP error) and larger than the egress MTU (the
    kernel fragments) go to the kernel rewritten, counted by reason. An unknown
    next hop is no fallback at TC: bpf_redirect_neigh resolves it, and every
    datagram is redirected (XDP has to hand such packets to the kernel)."""
    at_server = nft_udp_counter(rtb.ns("server"), rtb.backend_port)
    with TcRedirect(rtb.rules("udp", families=(4,)), action="forward", netns=rtb.ns("dut")) as prog:
        prog.attach(rtb.dut_in)
        prog.attach(rtb.dut_out)
        send_frames(rtb.ns("client"), "eth0", to_service(rtb, 20, ttl=1), rate_pps=2000)
        wait_for(lambda: prog.counters()["slow_ttl"] >= 20, what="20 datagrams with TTL 1 at the router")
        c = prog.counters()
        assert c["slow_ttl"] == 20 and c["to_backend"] == 20 and c["redirect"] == 0 and at_server() == 0

        prog.reset_counters()
        rtb.topo.run("dut", ["ip", "neigh", "del", rtb.server4, "dev", rtb.dut_out])
        send_frames(rtb.ns("client"), "eth0", to_service(rtb, N), rate_pps=20000)
        wait_for(lambda: at_server() >= N, what=f"{N} datagrams at the server")
        c = prog.counters()
        assert c["to_backend"] == c["redirect"] == N and c["slow_no_neigh"] == 0 and at_server() == N
        assert c["not_ip"] >= 1  # the server's ARP reply, seen on its way in at eth1

        prog.reset_counters()
        rtb.topo.run("dut", ["ip", "link", "set", rtb.dut_out, "mtu", "1000"])
        send_frames(rtb.ns("client"), "eth0", to_service(rtb, 20, size=1200), rate_pps=2000)
        wait_for(lambda: prog.counters()["slow_too_big"] >= 20, what="20 datagrams too big for eth1")
        c = prog.counters()
        assert c["slow_too_big"] == 20 and c["to_backend"] == 20 and c["redirect"] == 0
        wait_for(lambda: at_server() >= N + 20, what=f"{N + 20} datagrams at the server")
    assert at_server() == N + 20  # the kernel delivered the big ones too, in fragments


def test_nothing_is_left_on_the_hooks_after_close(rtb):
    """Two instances on the same hooks: each removes only its own filter (by
    program id), the clsact qdisc goes with the last, and the hooks end as they
    began."""
    dut = rtb.ns("dut")
    before = tc.hook_snapshot(dut)
    first = TcRedirect(rtb.rules(), action="forward", netns=dut)
    second = TcRedirect(rtb.rules("tcp"), action="pass", netns=dut)
    try:
        for prog in (first, second):
            prog.attach(rtb.dut_in)
            prog.attach(rtb.dut_out)
        names = sorted(n for _, _, _, n in tc.hook_snapshot(dut)[rtb.dut_in][1])
        assert names == ["redirect+clsact:tc_redirect", "redirect+clsact:tc_redirect"]
        first.close()
        has, filters = tc.hook_snapshot(dut)[rtb.dut_in]
        assert has and [n for _, _, _, n in filters] == ["redirect+clsact:tc_redirect"]
    finally:
        first.close()
        second.close()
    assert tc.hook_snapshot(dut) == before
    assert tc.filters_of(TcRedirect.OWNER, dut) == []
