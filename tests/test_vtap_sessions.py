"""`vtap --sessions FILE` as a user runs it, on a router built as users build
one (kernel defaults: neighbours resolved on demand, offloads on): a bad file
refused in one line with nothing attached, the file changed while it runs
(applied whole, or a bad version said and the sessions in force kept), exact
copies at a collector, and what a killed run leaves to --cleanup."""

import sys
from collections import Counter

from conftest import ROOT
from helpers import PORT, Tool, echo_servers, exchange, stop_all
from scapy.layers.inet import TCP, UDP
from scapy.layers.inet6 import IPv6, in6_chksum
from scapy.layers.l2 import Ether

from ebpf import netdev, tc
from ebpf.vtap.sessions.config import Rule, Session
from ebpf.vtap.sessions.tc_sessions import SessionMirror
from lab import netns
from lab.collector import decap
from lab.topology import Topology
from lab.traffic import Capture, Flow, Marker, build, send_frames

CLIENT4, SERVER4, COLLECTOR4 = "198.18.1.1", "198.18.2.2", "198.18.5.2"
CLIENT6, SERVER6, COLLECTOR6 = "2001:2:0:1::1", "2001:2:0:2::2", "2001:2:0:5::2"


def plain_router():
    """client eth0 -- eth0 router eth1 -- eth0 server; router eth2 -- eth0 collector."""
    t = Topology("usess", kernel_defaults=True)
    for h in ("client", "server", "collector"):
        t.add_host(h)
    t.add_host("router", forwarding=True)
    t.add_link(
        "client", "router", a_addrs=[f"{CLIENT4}/24", f"{CLIENT6}/64"], b_addrs=["198.18.1.254/24", "2001:2:0:1::fe/64"]
    )
    t.add_link(
        "router",
        "server",
        a_if="eth1",
        a_addrs=["198.18.2.254/24", "2001:2:0:2::fe/64"],
        b_addrs=[f"{SERVER4}/24", f"{SERVER6}/64"],
    )
    t.add_link(
        "router",
        "collector",
        a_if="eth2",
        a_addrs=["198.18.5.1/24", "2001:2:0:5::1/64"],
        b_addrs=[f"{COLLECTOR4}/24", f"{COLLECTOR6}/64"],
    )
    t.add_route("client", "198.18.2.0/24", "198.18.1.254")
    t.add_route("client", "2001:2:0:2::/64", "2001:2:0:1::fe")
    t.add_route("server", "198.18.1.0/24", "198.18.2.254")
    t.add_route("server", "2001:2:0:1::/64", "2001:2:0:2::fe")
    return t


def session_file(path, port, truncate=128, kind="vxlan", cutoff=0):
    target = {"vxlan": f"vxlan://{COLLECTOR4}/100", "erspan": f"erspan://{COLLECTOR4}/3"}[kind]
    path.write_text(f"""\
[[session]]
target = "{target}"
truncate = {truncate}{f"{chr(10)}cutoff = {cutoff}" if cutoff else ""}

  [[session.rule]]
  action = "accept"
  protocol = "udp"
  destination_ports = "{port}"
""")


def vtap(ns, *args, timeout=120):
    return netns.run(
        ns,
        [sys.executable, "-m", "vtap", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


def send(t, flows):
    """Frames from the client through the router; (sent frames, copies' inner frames at the collector)."""
    marker = Marker()
    frames = build(flows, marker, t.mac("client", "eth0"), t.mac("router", "eth0"))
    with (
        Capture(t.ns("server"), "eth0", marker) as rx,
        Capture(t.ns("collector"), "eth0", lambda f: decap(f) and "copy", keep=True) as col,
    ):
        send_frames(t.ns("client"), "eth0", frames)
        rx.finish(Counter(marker(f) for f in frames))
        col.finish()
    return frames, [decap(f).inner for f in col.frames]


def test_a_bad_sessions_file_is_refused_with_nothing_attached(tmp_path):
    with plain_router() as t:
        ns = t.ns("router")
        bad = tmp_path / "s.toml"
        bad.write_text(
            '[[session]]\ntarget = "mon0"\n\n[[session.rule]]\naction = "accept"\nsource = "198.18.0.0/33"\n'
        )
        r = vtap(ns, "--sessions", str(bad))
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip() == f"vtap: error: {bad}:6: rule 1 of session 1: bad CIDR '198.18.0.0/33'"
        r = vtap(ns, "--sessions", str(tmp_path / "none.toml"))
        assert r.returncode == 2 and "cannot read" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        session_file(bad, 5001)
        bad.write_text(bad.read_text().replace(COLLECTOR4, "203.0.113.9"))  # no route to it
        r = vtap(ns, "--sessions", str(bad))
        assert r.returncode == 2 and "no route to collector 203.0.113.9" in r.stderr, r.stderr
        r = vtap(ns, "--sessions", str(bad), "--monitor", "eth1")
        assert r.returncode == 2 and "--monitor cannot go with --sessions" in r.stderr
        with netdev.ipr(ns) as ip:
            assert not [d for d in netdev.devices(ip).values() if d.name.startswith("vtaps")]
        assert not [e for i in ("eth0", "eth1", "eth2") for e in tc_entries(ns, i)]


def tc_entries(ns, ifname):
    with netdev.ipr(ns) as ip:
        idx = netdev.ifindex_of(ip, ifname, ns)
        return [e for p in tc.PARENTS.values() for e in tc.entries(ip, idx, p)]


def test_the_running_tool_follows_its_file(tmp_path):
    """Port 5001 copied; the file changed to 5002: applied whole; then a bad
    version: said once (file and line), the 5002 session kept."""
    with plain_router() as t:
        ns = t.ns("router")
        f = tmp_path / "s.toml"
        session_file(f, 5001)
        tool = Tool(ns, "vtap", "--sessions", str(f), "--iface", "eth0")
        try:
            flows = [
                Flow("a", CLIENT4, SERVER4, dport=5001, count=20, size=300),
                Flow("b", CLIENT4, SERVER4, dport=5002, count=10, size=300),
            ]
            sent, got = send(t, flows)
            assert sorted(got) == sorted(fr[:128] for fr in sent if fr[36:38] == b"\x13\x89")
            session_file(f, 5002, kind="erspan")
            tool.err.wait_for("applied", timeout=20)
            sent, got = send(t, flows)
            assert sorted(got) == sorted(fr[:128] for fr in sent if fr[36:38] == b"\x13\x8a")
            f.write_text(f.read_text().replace('"5002"', '"70000"'))
            said = tool.err.wait_for("the sessions in force stay", timeout=20)
            assert f"{f}:8: rule 1 of session 1: bad port range '70000'" in said
            sent, got = send(t, flows)
            assert len(got) == 10
            final, warnings = tool.stop()
        finally:
            tool.kill()
        s = final["sessions"]["session 1"]
        assert s["accepted"] == s["sent"] == s["truncated"] == 40
        assert not [w for w in warnings if "applied" not in w and "stay" not in w], warnings


def test_a_cutoff_the_file_gains_while_it_runs(tmp_path):
    """Started with --flows and a file without a cutoff: every datagram copied; the file
    gains cutoff = 10 datagrams' payload: applied, and a flow then sends its first ten.
    Started without --flows, the same change is said once and the sessions kept; and
    --cutoff itself is refused with --sessions (exit 2, one line)."""
    with plain_router() as t:
        ns = t.ns("router")
        f = tmp_path / "s.toml"
        r = vtap(ns, "--sessions", str(f), "--cutoff", "1K")
        assert r.returncode == 2 and "--cutoff cannot go with --sessions" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        for flows, applied in (("64", True), (None, False)):
            session_file(f, 5001)
            tool = Tool(ns, "vtap", "--sessions", str(f), "--iface", "eth0", *(["--flows", flows] if flows else []))
            try:
                one = [Flow("a", CLIENT4, SERVER4, dport=5001, count=20, size=300)]
                assert len(send(t, one)[1]) == 20
                session_file(f, 5001, cutoff=(300 - 42) * 10)
                if applied:
                    tool.err.wait_for("applied", timeout=20)
                    assert (
                        len(send(t, [Flow("b", CLIENT4, SERVER4, dport=5001, sport=40001, count=20, size=300)])[1])
                        == 10
                    )
                else:
                    said = tool.err.wait_for("the sessions in force stay", timeout=20)
                    assert "a cutoff needs the flow table" in said
                    assert len(send(t, one)[1]) == 20
                final, _ = tool.stop()
            finally:
                tool.kill()
            s = final["sessions"]["session 1"]
            assert s["cut"] == (10 if applied else 0) and s["sent"] == (30 if applied else 40)


def test_a_killed_run_is_cleaned_up(tmp_path):
    with plain_router() as t:
        ns = t.ns("router")
        f = tmp_path / "s.toml"
        session_file(f, 5001)
        tool = Tool(ns, "vtap", "--sessions", str(f), "--iface", "eth0")
        sender = tool.attached["sender"]
        tool.kill()
        with netdev.ipr(ns) as ip:
            assert ip.link_lookup(ifname=sender)
        assert tc_entries(ns, "eth0")
        r = vtap(ns, "--cleanup")
        assert r.returncode == 0, r.stderr
        assert f"removed sender device {sender}" in r.stdout, r.stdout
        with netdev.ipr(ns) as ip:
            assert not ip.link_lookup(ifname=sender)
        assert not tc_entries(ns, "eth0")


def finished(frame):
    """The frame with its TCP/UDP checksum made right (scapy recomputes it)."""
    p = Ether(frame)
    for layer in (TCP, UDP):
        if layer in p:
            del p[layer].chksum
    return bytes(p)


def test_partial_checksums_of_socket_traffic_reach_an_ipv6_collector_right():
    """Real UDP and TCP exchanges from sockets on links with TX checksum
    offload on (as a veth comes): the frames the tap copies carry partial
    checksums, which the last device finishes. The outer UDP checksum (IPv6
    needs one) is built for the finished frame, as the kernel's own tunnels
    do: with each inner checksum made right, every outer one holds."""
    with plain_router() as t:
        s = Session(
            target=f"vxlan://[{COLLECTOR6}]/9", rules=[Rule("accept", protocol="tcp"), Rule("accept", protocol="udp")]
        )
        servers = echo_servers(t, ["server"])
        try:
            with (
                SessionMirror([s], netns=t.ns("router")) as m,
                Capture(t.ns("collector"), "eth0", lambda f: decap(f) and "copy", keep=True) as col,
            ):
                m.attach("eth0", "ingress")
                for dst in (SERVER4, SERVER6):
                    r = exchange(t, "client", dst, PORT)
                    assert r["udp"] == r["tcp"] == r["n"], r
                sent = m.session_counters()["session 1"]["sent"]
                col.wait_for(sent)
        finally:
            stop_all(servers)
    assert sent == len(col.frames) > 0
    partial = 0
    for f in col.frames:
        d = decap(f)
        right = finished(d.inner)
        partial += right != d.inner
        whole = f[: len(f) - len(d.inner)] + right
        p = Ether(whole)
        u = bytes(p[IPv6][UDP])
        assert in6_chksum(17, p[IPv6], u[:6] + b"\0\0" + u[8:]) == p[IPv6][UDP].chksum
    assert partial > len(col.frames) // 2  # the client's frames: partial; the path was taken


def test_gro_frames_fit_the_path_by_their_segments():
    """The router's eth0 with GRO on (as most NICs come): its ingress hook sees
    TCP as GSO frames of many segments, longer than any MTU. A copy is too big
    only if a segment is (the kernel cuts the tunnelled frame into segments
    where the path needs): with a path that takes a segment and the tunnel,
    every copy is sent, none counted oversize, and the copies carry every byte
    the client sent."""
    with plain_router() as t:
        t.run("router", ["ethtool", "-K", "eth0", "gro", "on"], check=True, capture_output=True)
        # a link to the collector with room for a whole segment and the tunnel's 50 bytes
        t.run("router", ["ip", "link", "set", "eth2", "mtu", "1600"], check=True)
        t.run("collector", ["ip", "link", "set", "eth0", "mtu", "1600"], check=True)
        s = Session(target=f"vxlan://{COLLECTOR4}/9", rules=[Rule("accept", protocol="tcp", destination_ports=PORT)])
        servers = echo_servers(t, ["server"])
        try:
            with (
                SessionMirror([s], netns=t.ns("router")) as m,
                Capture(t.ns("collector"), "eth0", lambda f: decap(f) and "copy", keep=True) as col,
            ):
                m.attach("eth0", "ingress")
                r = exchange(t, "client", SERVER4, PORT)
                assert r["tcp"] == r["n"], r
                c = m.session_counters()["session 1"]
                col.wait_for(c["sent"])
        finally:
            stop_all(servers)
    assert c["oversize"] == c["failed"] == 0 and c["sent"] == c["accepted"] == len(col.frames) > 0
    inner = [Ether(decap(f).inner) for f in col.frames]
    assert max(len(p) for p in inner) > 1514  # GRO made some: the path was taken
    # every byte of every connection is in some copy: the client's stream
    # (tests/echo.py: connection i sends 1 + (i * 7919) % 40000 bytes) from
    # its SYN's sequence number on, covered by the copies' segments
    isn, covered = {}, {}
    for p in inner:
        tcp = p[TCP]
        if tcp.flags.S:
            isn[tcp.sport] = tcp.seq
        if len(tcp.payload):
            covered.setdefault(tcp.sport, []).append((tcp.seq, tcp.seq + len(tcp.payload)))
    want = sorted(1 + (i * 7919) % 40000 for i in range(r["n"]))
    got = []
    for sport, start in isn.items():
        end = start + 1
        for a, b in sorted(covered.get(sport, [])):
            if a <= end:
                end = max(end, b)
        got.append(end - start - 1)
    assert sorted(got) == want


def test_what_is_removed_from_outside_stops_the_tool(tmp_path):
    """The sender device deleted from outside: copies would fail silently, so
    the tool stops, says why in one line and exits 1."""
    with plain_router() as t:
        ns = t.ns("router")
        f = tmp_path / "s.toml"
        session_file(f, 5001)
        tool = Tool(ns, "vtap", "--sessions", str(f), "--iface", "eth0", interval=0.2)
        try:
            t.run("router", ["ip", "link", "del", tool.attached["sender"]], check=True)
            assert tool.p.wait(timeout=20) == 1
            err = [ln for ln in iter(tool.err.q.get, None)]
        finally:
            tool.kill()
        assert (
            err[-1].strip() == f"vtap: error: stopped: the sender device {tool.attached['sender']} is gone "
            "(deleted from outside)"
        ), err
        assert not tc_entries(ns, "eth0")
