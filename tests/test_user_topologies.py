"""The XDP fast paths on topologies built as users build them (lab.testbeds
user_router and user_segment: the kernel's defaults, TX checksum offload on,
neighbours resolved on demand, no XDP program the lab did not put there), driven
through their command lines as a user runs them, with the preparation those
commands print. The judges are the receivers: sockets that get every byte back
(tests/echo.py), and their kernels' checksum-error counters."""

import json
import re
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from helpers import PORT, N, Tool, assert_run_averages, echo_servers, exchange, stop_all
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.inet6 import ICMPv6PacketTooBig, IPv6
from scapy.layers.l2 import Ether

from ebpf import AttachError, XdpSink, xdp
from lab import hostcheck, netns
from lab.fastpaths.lb.testbed import user_segment
from lab.fastpaths.redirect.testbed import user_router
from lab.topology import Topology
from lab.traffic import send_frames


def csum_errors(ns):
    """Checksum errors the host's TCP and UDP counted (IPv4 and IPv6)."""
    snmp = netns.run(ns, ["cat", "/proc/net/snmp", "/proc/net/snmp6"], capture_output=True, text=True).stdout
    total, header = 0, {}
    for line in snmp.splitlines():
        parts = line.split()
        if parts and parts[0].endswith(":"):
            if parts[0] in header:
                names = header.pop(parts[0])
                total += sum(int(v) for k, v in zip(names, parts[1:], strict=True) if k == "InCsumErrors")
            else:
                header[parts[0]] = parts[1:]
        elif len(parts) == 2 and parts[0] in ("Udp6InCsumErrors", "UdpLite6InCsumErrors"):
            total += int(parts[1])
    return total


def serve_and_exchange(topo, servers, ns, cmd, args, targets, n=N):
    """Echo servers on `servers`, the tool running in `ns`, an exchange with
    each target address from the client; ([results], final counters, warnings)."""
    procs = echo_servers(topo, servers)
    tool = Tool(ns, cmd, *args)
    try:
        got = [exchange(topo, "client", dst, port, n) for dst, port in targets]
        final, warnings = tool.stop()
    finally:
        tool.kill()
        stop_all(procs)
    return tool, got, final, warnings


# --- the load balancer ---------------------------------------------------------------


def lb_args(tb, n_backends=2):
    args = ["--iface", "eth0"]
    for vip in (tb.vip4, f"[{tb.vip6}]"):
        args += ["--service", f"tcp:{vip}:{PORT}", "--service", f"udp:{vip}:{PORT}"]
    for i in range(n_backends):
        args += ["--backend", f"{tb.backend4(i)}:{PORT}", "--backend", f"[{tb.backend6(i)}]:{PORT}"]
    return args


def as_typed(tb, args):
    """The command run once as given: (exit status, its warnings, its errors)."""
    r = netns.run(
        tb.ns("lb"),
        [sys.executable, "-m", "lab", "lb", *args, "--duration", "1"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    lines = r.stderr.strip().splitlines()
    assert all(" warning: " in ln or " error: " in ln for ln in lines), r.stderr  # nothing else, no traceback
    return r.returncode, [ln for ln in lines if " warning: " in ln], [ln for ln in lines if " error: " in ln]


def fix_forwarding(tb, args):
    """Run the command, read the line it refuses with, and run the fix it prints."""
    rc, warnings, errors = as_typed(tb, args)  # the other start-up checks' findings first
    assert rc == 2 and len(errors) == 1, (warnings, errors)
    refusal = errors[0]
    fix = re.search(r"for this interface only: (sysctl -w .*)$", refusal).group(1)
    assert fix == "sysctl -w net.ipv4.conf.eth0.forwarding=1 net.ipv6.conf.eth0.forwarding=1"
    netns.run(tb.ns("lb"), fix.split(), capture_output=True)


@pytest.mark.parametrize("xdp_mode", ["native", "generic"])
def test_lb_nat_serves_a_plain_segment_on_default_offloads(xdp_mode):
    """The issue's own report: client, LB and backends on a bridge, every veth
    with TX checksum offload on, the VIP the LB's own address, nothing resolved
    in advance. After the one fix the command prints (forwarding), and with
    --prepare-peer, every exchange of both families and protocols comes back
    whole, and no host counts a checksum error."""
    with user_segment() as tb:
        args = lb_args(tb) + ["--xdp-mode", xdp_mode]
        fix_forwarding(tb, args)
        _, (got4, got6), final, warnings = serve_and_exchange(
            tb.topo, tb.backends, tb.ns("lb"), "lb", args + ["--prepare-peer"], [(tb.vip4, PORT), (tb.vip6, PORT)]
        )
        assert got4 == got6 == {"udp": N, "tcp": N, "n": N}, (got4, got6, warnings)
        assert [csum_errors(tb.ns(h)) for h in ["client", *tb.backends]] == [0, 0, 0]
        # the senders' checksums were partial: native finished them, generic kept them so
        assert 0 < final["csum_partial"] <= final["tx"]
        assert all(b["healthy"] for b in final["backends"].values())
        assert_run_averages(final, final["backends"])
        assert not any("will be lost" in w for w in warnings)
        # --prepare-peer's program is gone with the tool
        assert not [a for a in xdp.attached(tb.ns("switch")) if a[0] == "lb"]


SENDER = (
    """
import socket, sys, time
socks = [(socket.socket(socket.AF_INET6 if ':' in a else socket.AF_INET, socket.SOCK_DGRAM), a)
         for a in sys.argv[2:]]
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    for s, a in socks:
        try:
            s.sendto(b'x' * 64, (a, %d))
        except OSError:
            pass  # the ICMP errors of the time before the LB attached
    time.sleep(0.001)
"""
    % PORT
)


def test_lb_started_under_traffic_from_cold_caches_drops_nothing_for_a_neighbour():
    """Found by hand: clients already sending when the LB starts, no backend's
    MAC known yet. The LB attached before it had the kernel resolve the
    backends (and before it prepared the veth peer), so the first packets of
    each flow were dropped (no-neigh): a TCP client waited a second for its
    SYN again. Now both are ready before the program attaches."""
    with user_segment() as tb:
        netns.run(
            tb.ns("lb"),
            ["sysctl", "-w", "net.ipv4.conf.eth0.forwarding=1", "net.ipv6.conf.eth0.forwarding=1"],
            capture_output=True,
        )
        procs = echo_servers(tb.topo, tb.backends)
        sender = tb.topo.popen("client", [sys.executable, "-c", SENDER, "30", tb.vip4, tb.vip6])
        tool = None
        try:
            time.sleep(0.2)  # the client's datagrams reach the LB's kernel; no backend's MAC is known there
            known = netns.run(tb.ns("lb"), ["ip", "neigh", "show"], capture_output=True, text=True).stdout
            assert not [b for i in range(2) for b in (tb.backend4(i), tb.backend6(i)) if f"{b} " in known], known
            tool = Tool(tb.ns("lb"), "lb", *lb_args(tb), "--prepare-peer", interval=0.2)
            tool.out.wait_for('"counters"', timeout=10)
            tool.out.wait_for('"counters"', timeout=10)
            final, warnings = tool.stop()
        finally:
            if tool:
                tool.kill()
            stop_all([*procs, sender])
        assert final["dropped_no_neigh"] == 0, (final, warnings)
        assert final["to_backend"] > 0 and final["to_client"] > 0, final
        assert not any("no neighbour entry" in w for w in warnings), warnings


def test_lb_dsr_serves_a_plain_segment_both_families():
    """DSR rewrites only MAC addresses, yet XDP_TX drops the skb's "checksum to
    finish" state: the program finishes it. Health checks of IPv6 backends come
    from the LB's own address, not from the VIP it also holds (a backend holding
    the VIP would answer them locally)."""
    with user_segment(dsr=True) as tb:
        netns.run(
            tb.ns("lb"),
            ["sysctl", "-w", "net.ipv4.conf.eth0.forwarding=1", "net.ipv6.conf.eth0.forwarding=1"],
            capture_output=True,
        )
        args = lb_args(tb) + ["--mode", "dsr", "--prepare-peer", "--check-interval", "0.3"]
        _, (got4, got6), final, warnings = serve_and_exchange(
            tb.topo, tb.backends, tb.ns("lb"), "lb", args, [(tb.vip4, PORT), (tb.vip6, PORT)]
        )
        assert got4 == got6 == {"udp": N, "tcp": N, "n": N}, (got4, got6, warnings)
        assert [csum_errors(tb.ns(h)) for h in ["client", *tb.backends]] == [0, 0, 0]
        assert all(b["healthy"] for b in final["backends"].values()), warnings
        assert not any("unhealthy" in w for w in warnings)
        assert final["to_client"] == 0 < final["csum_partial"]  # replies went straight to the client


@pytest.mark.parametrize("hook", ["auto", "xdp"])
@pytest.mark.parametrize("mode", ["nat", "dsr"])
def test_lb_on_the_articles_topology_as_typed(mode, hook):
    """The XDP load-balancer articles' set-up, typed as it is: client, LB and two
    backends on one bridge, the VIP the LB's only address, kernel defaults,
    nothing resolved. The first run says every problem of the host at once, each
    with its fix, and none about the LB's own address: NAT uses the VIP. At XDP
    (--hook xdp): the veth peer without XDP, forwarding off. As typed (--hook auto,
    which on a veth is TC) neither is a problem: NAT serves on the first run. DSR
    cannot send from the VIP what the backends must answer (they hold it): IPv4's
    ARP and both families' health checks; that is said at either hook, each with
    its fix; at TC, where the kernel's own ARP asks for the backends, the address
    added is not enough while the VIP is the subnet's first: said, with the fix
    (the VIP a /32). With the fixes it printed (DSR: an IPv4 address added, IPv6
    without health checks), every exchange of both families and both protocols
    comes back whole."""
    with user_segment(dsr=mode == "dsr", vip_only=True) as tb:
        at_xdp = hook == "xdp"
        args = lb_args(tb) + ["--mode", mode] + (["--hook", "xdp"] if at_xdp else [])
        rc, warnings, errors = as_typed(tb, args)
        if at_xdp:
            assert rc == 2 and len(warnings) == 1 and "fix: --prepare-peer" in warnings[0], (warnings, errors)
            assert "forwarding is off on eth0" in errors[-1], errors
        else:
            assert not warnings and not any("forwarding" in e for e in errors), (warnings, errors)
        if mode == "nat":
            assert (rc, len(errors)) == ((2, 1) if at_xdp else (0, 0)), errors
        else:
            assert rc == 2 and len(errors) == 2 + at_xdp, errors  # IPv4's address, IPv6's health checks[, forwarding]
            assert "DSR needs an IPv4 address of this host that is not a VIP" in errors[0], errors
            assert "the ARP requests that find their MACs" in errors[0]
            assert errors[0].endswith("give one with --self ADDR, or add one: ip addr add ADDR/PREFIX dev eth0")
            assert "DSR health checks need an IPv6 address" in errors[1]
            assert errors[1].endswith("--health-check none"), errors
            netns.run(tb.ns("lb"), ["ip", "addr", "add", f"{tb.lb4}/24", "dev", "eth0"], capture_output=True)
            args += ["--health-check", "none"]
            if not at_xdp:
                # the address added is the subnet's second: ARP would still ask from the VIP
                rc, warnings, errors = as_typed(tb, args)
                assert rc == 2 and len(errors) == 1 and "would come from the VIP" in errors[0], errors
                fix = re.search(r"so that this host's own address is used: (.*); or run at XDP", errors[0]).group(1)
                for cmd in fix.split(" && "):
                    netns.run(tb.ns("lb"), cmd.split(), check=True, capture_output=True)
        if at_xdp:
            fix = re.search(r"for this interface only: (sysctl -w .*)$", errors[-1]).group(1)
            netns.run(tb.ns("lb"), fix.split(), capture_output=True)
            args += ["--prepare-peer"]
        tool, (got4, got6), final, warnings = serve_and_exchange(
            tb.topo, tb.backends, tb.ns("lb"), "lb", args, [(tb.vip4, PORT), (tb.vip6, PORT)]
        )
        assert got4 == got6 == {"udp": N, "tcp": N, "n": N}, (got4, got6, warnings)
        assert [csum_errors(tb.ns(h)) for h in ["client", *tb.backends]] == [0, 0, 0]
        assert tool.attached["hook"] == ("xdp" if at_xdp else "tc"), tool.attached
        assert final["dropped_no_neigh" if at_xdp else "dropped_too_big"] == 0, final
        if mode == "nat":
            assert tool.attached["own_addresses"] == [tb.vip4, tb.vip6]
            assert final["to_client"] > 0
        else:
            assert final["to_client"] == 0 < final["to_backend"]


def test_lb_without_an_address_of_its_own_says_so_with_every_other_problem():
    """NAT with no IPv4 address on --iface at all (the VIP routed to the LB):
    the refusal names --self and the line that adds an address, and the other
    problems of the host are said with it; nothing is left attached. With
    --self, it runs; a --self that is no address is refused as input."""
    with user_segment(vip_only=True) as tb:
        netns.run(tb.ns("lb"), ["ip", "addr", "del", f"{tb.vip4}/24", "dev", "eth0"], capture_output=True)
        args = ["--iface", "eth0", "--service", f"tcp:{tb.vip4}:{PORT}", "--backend", f"{tb.backend4(0)}:{PORT}"]
        args += ["--hook", "xdp"]  # where the host has more to fix
        rc, warnings, errors = as_typed(tb, args)
        assert rc == 2 and len(errors) == 2 and len(warnings) == 1, (warnings, errors)
        assert "NAT mode needs an IPv4 address" in errors[0] and "eth0 has none" in errors[0]
        assert errors[0].endswith("give one with --self ADDR, or add one: ip addr add ADDR/PREFIX dev eth0")
        assert "forwarding is off on eth0" in errors[1]
        assert not [a for a in xdp.attached(tb.ns("lb"))]
        rc, _, errors = as_typed(tb, args + ["--self", "nonsense"])
        assert rc == 2 and errors == [
            "python -m lab lb: error: bad --self 'nonsense': want an IPv4 or IPv6 address of this host"
        ], errors
        netns.run(tb.ns("lb"), ["sysctl", "-w", "net.ipv4.conf.eth0.forwarding=1"], capture_output=True)
        netns.run(tb.ns("lb"), ["ip", "addr", "add", f"{tb.lb4}/24", "dev", "eth0"], capture_output=True)
        rc, warnings, errors = as_typed(tb, args + ["--self", tb.lb4, "--prepare-peer", "--health-check", "none"])
        assert rc == 0 and not errors, (warnings, errors)


def test_lb_says_why_traffic_fails_without_a_peer_program():
    """No --prepare-peer: one line at start names the peer and the option that
    fixes it; while running, each backend that gets packets and sends nothing
    back carries a hint in --json (and one warning line)."""
    with user_segment() as tb:
        netns.run(
            tb.ns("lb"),
            ["sysctl", "-w", "net.ipv4.conf.eth0.forwarding=1", "net.ipv6.conf.eth0.forwarding=1"],
            capture_output=True,
        )
        servers = echo_servers(tb.topo, tb.backends)
        tool = Tool(tb.ns("lb"), "lb", *lb_args(tb), "--hook", "xdp", "--health-check", "none")
        try:
            start = tool.err.wait_for("will be lost", timeout=10)
            assert "veth peer lb" in start and f"({'namespace ' + tb.ns('switch')})" in start
            assert start.rstrip().endswith("fix: --prepare-peer (attaches a pass program to lb while this runs)")
            got = exchange(tb.topo, "client", tb.vip4, PORT, n=2, expect_none=True)
            hinted = json.loads(tool.out.wait_for('"hint"', timeout=15))
            warning = tool.err.wait_for("no replies", timeout=5)
            final, _ = tool.stop()
        finally:
            tool.kill()
            stop_all(servers)
        assert got == {"udp": 0, "tcp": 0, "n": 2}
        silent = [b for b, row in hinted["backends"].items() if "hint" in row]
        assert silent and all(
            hinted["backends"][b]["unanswered"] > 0 == hinted["backends"][b]["reply_packets"] for b in silent
        )
        assert "--prepare-peer" in warning and silent[0] in warning
        assert final["tx"] > 0 and final["to_client"] == 0


def test_a_killed_lb_leaves_its_peer_program_to_cleanup():
    with user_segment() as tb:
        netns.run(tb.ns("lb"), ["sysctl", "-w", "net.ipv4.conf.eth0.forwarding=1"], capture_output=True)
        tool = Tool(
            tb.ns("lb"),
            "lb",
            "--iface",
            "eth0",
            "--service",
            f"tcp:{tb.vip4}:{PORT}",
            "--backend",
            f"{tb.backend4(0)}:{PORT}",
            "--prepare-peer",
            "--health-check",
            "none",
        )
        tool.kill()
        assert [a[0] for a in xdp.attached(tb.ns("switch"))] == ["lb"]  # the peer program outlived it
        r = netns.run(
            tb.ns("lb"), [sys.executable, "-m", "lab", "lb", "--cleanup"], capture_output=True, text=True, cwd=ROOT
        )
        assert "removed xdp_lb on eth0" in r.stdout
        assert f"removed xdp_peer_pass on lb (native) (namespace {tb.ns('switch')})" in r.stdout
        assert xdp.attached(tb.ns("switch")) == [] and xdp.attached(tb.ns("lb")) == []


# --- the redirect ------------------------------------------------------------------


def redirect_args(tb, vip4, vip6):
    args = ["--iface", "eth0"]
    for vip, server in ((vip4, tb.server4), (f"[{vip6}]", f"[{tb.server6}]")):
        args += ["--rule", f"udp:{vip}:8080={server}:{PORT}", "--rule", f"tcp:{vip}:8080={server}:{PORT}"]
    return args


CASES = [
    ("pass", "routed", False),
    ("pass", "held", False),
    ("forward", "routed", False),
    ("forward", "held", False),
    ("pass", "held", True),
]


@pytest.mark.parametrize(
    "action, vip, egress_csum_off",
    CASES,
    ids=[f"{a}-vip {v}" + ("-router egress without offload" if o else "") for a, v, o in CASES],
)
def test_redirect_serves_a_plain_router_on_default_offloads(action, vip, egress_csum_off):
    """client -> router -> server, offloads as veths come: UDP and TCP, IPv4
    and IPv6, through a connected client socket (it takes only replies that come
    from the service's address). With the service address on the router itself
    (the netfilter-vs-XDP report's design), `pass` translates replies after
    routing, at TC egress, and says so at start. With the router's own egress
    not offloading, the kernel finishes the checksums `pass` kept partial: they
    must still be right."""
    with user_router() as tb:
        vip4, vip6 = (tb.routed4, tb.routed6) if vip == "routed" else (tb.held4, tb.held6)
        if egress_csum_off:
            for ifname in ("eth0", "eth1"):
                tb.topo.run("router", ["ethtool", "-K", ifname, "tx", "off"], capture_output=True)
        extra = ["--prepare-peer"] if action == "forward" else []
        tool, (got4, got6), final, warnings = serve_and_exchange(
            tb.topo,
            ["server"],
            tb.ns("router"),
            "redirect",
            redirect_args(tb, vip4, vip6) + ["--action", action, *extra],
            [(vip4, 8080), (vip6, 8080)],
        )
        assert got4 == got6 == {"udp": N, "tcp": N, "n": N}, (got4, got6, warnings)
        assert csum_errors(tb.ns("client")) == csum_errors(tb.ns("server")) == 0
        at_egress = tool.attached["replies_at_tc_egress"]
        if action == "pass" and vip == "held":
            assert at_egress == {"ifaces": ["eth0"], "rules": [r for r in tool.attached["rules"]]}
        else:
            assert at_egress["rules"] == []
        assert all(r["reply_packets"] > 0 and "hint" not in r for r in final["rules"].values())
        assert not [w for w in warnings if "will be lost" in w or "forwarding is off" in w]
        # what the tool attached is gone: XDP, TC egress, the peers' programs
        for host in ("client", "router", "server"):
            assert xdp.attached(tb.ns(host)) == []


def test_redirect_forward_says_why_traffic_fails_without_peer_programs():
    with user_router() as tb:
        servers = echo_servers(tb.topo, ["server"])
        tool = Tool(tb.ns("router"), "redirect", *redirect_args(tb, tb.routed4, tb.routed6), "--action", "forward")
        try:
            lost = sorted([tool.err.wait_for("will be lost", timeout=10), tool.err.wait_for("will be lost", 10)])
            got = exchange(tb.topo, "client", tb.routed4, 8080, n=2, expect_none=True)
            tool.out.wait_for('"hint"', timeout=15)
            tool.stop()
        finally:
            tool.kill()
            stop_all(servers)
        assert "out of eth0" in lost[0] and "veth peer eth0" in lost[0] and "--prepare-peer" in lost[0]
        assert "out of eth1" in lost[1] and f"namespace {tb.ns('server')}" in lost[1]
        assert got == {"udp": 0, "tcp": 0, "n": 2}


def test_host_checks_name_what_is_missing_and_the_fix():
    """The checks the commands print at start, on a plain pair of veths: GRO in
    generic mode, a veth peer without XDP (found in its own namespace), a jumbo
    MTU that native XDP on veth cannot take (the kernel says only "Numerical
    result out of range")."""
    t = Topology("uchk", kernel_defaults=True)
    t.add_host("a")
    t.add_host("b")
    t.add_link("a", "b", mtu=9000)
    with t:
        assert hostcheck.check_gro("eth0", "generic", t.ns("a")) == []  # a veth comes with GRO off
        t.run("a", ["ethtool", "-K", "eth0", "gro", "on"])
        (gro,) = hostcheck.check_gro("eth0", "generic", t.ns("a"))
        assert gro.fix == f"ip netns exec {t.ns('a')} ethtool -K eth0 gro off"
        assert hostcheck.check_gro("eth0", "native", t.ns("a")) == []  # native runs before GRO
        (peer,) = hostcheck.check_veth_peer("eth0", t.ns("a"))
        assert f"its veth peer eth0 (namespace {t.ns('b')}) runs no native XDP program" in peer.what
        with XdpSink("pass") as sink:
            with pytest.raises(AttachError, match=r"peer MTU must fit a native XDP frame.*mtu 1500"):
                sink.attach("eth0", netns=t.ns("b"))
            for host in ("a", "b"):
                t.run(host, ["ip", "link", "set", "dev", "eth0", "mtu", "1500"])
            sink.attach("eth0", netns=t.ns("b"))
            assert hostcheck.check_veth_peer("eth0", t.ns("a")) == []  # now it has one
        assert hostcheck.check_forwarding("eth0", {4, 6}, t.ns("a"))[0].fix == (
            f"ip netns exec {t.ns('a')} sysctl -w net.ipv4.conf.eth0.forwarding=1 net.ipv6.conf.eth0.forwarding=1"
        )


MTU_PROBE = r"""
import socket, sys
fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(fam, socket.SOCK_DGRAM)
if fam == socket.AF_INET6:
    s.setsockopt(socket.IPPROTO_IPV6, 23, 2)   # IPV6_MTU_DISCOVER = IPV6_PMTUDISC_DO
else:
    s.setsockopt(socket.IPPROTO_IP, 10, 2)     # IP_MTU_DISCOVER = IP_PMTUDISC_DO
s.bind((sys.argv[1], 5555))
s.connect((sys.argv[2], 6666))
s.send(b"m" * 1400)
print("sent", flush=True)
sys.stdin.readline()
print(s.getsockopt(socket.IPPROTO_IPV6, 24) if fam == socket.AF_INET6 else s.getsockopt(socket.IPPROTO_IP, 14),
      flush=True)                               # IPV6_MTU / IP_MTU: the path MTU the kernel now keeps
"""


@pytest.mark.parametrize("family", [4, 6])
def test_the_lb_hosts_own_traffic_from_the_vip_keeps_its_icmp(family):
    """The VIP is the LB host's own address, so its own traffic leaves from it:
    a ping to it is answered, and a packet-too-big in the middle of its own
    conversation from the VIP (a port no service has) lowers that path's MTU.
    Before, the program dropped every ICMPv6 packet to a VIP."""
    with user_segment() as tb:
        netns.run(
            tb.ns("lb"),
            ["sysctl", "-w", "net.ipv4.conf.eth0.forwarding=1", "net.ipv6.conf.eth0.forwarding=1"],
            capture_output=True,
        )
        vip, client = (tb.vip4, tb.client4) if family == 4 else (tb.vip6, tb.client6)
        tool = Tool(tb.ns("lb"), "lb", *lb_args(tb), "--prepare-peer", "--health-check", "none")
        probe = tb.topo.popen(
            "lb",
            [sys.executable, "-c", MTU_PROBE, vip, client],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            ping = tb.topo.run(
                "client", ["ping", f"-{family}", "-c", "2", "-W", "2", vip], check=False, capture_output=True, text=True
            )
            assert probe.stdout.readline().strip() == "sent"
            inner = (
                IP(src=vip, dst=client) / UDP(sport=5555, dport=6666) / (b"m" * 64)
                if family == 4
                else IPv6(src=vip, dst=client) / UDP(sport=5555, dport=6666) / (b"m" * 64)
            )
            outer = (
                IP(src=client, dst=vip) / ICMP(type=3, code=4, nexthopmtu=1000)
                if family == 4
                else IPv6(src=client, dst=vip) / ICMPv6PacketTooBig(mtu=1280)
            )
            frame = Ether(src=tb.topo.mac("client", "eth0"), dst=tb.topo.mac("lb", "eth0")) / outer / inner
            send_frames(tb.ns("client"), "eth0", [bytes(frame)])
            probe.stdin.write("\n")
            probe.stdin.flush()
            mtu = int(probe.stdout.readline())
            final, _ = tool.stop()
        finally:
            tool.kill()
            probe.kill()
            probe.wait()
        assert ping.returncode == 0, ping.stdout + ping.stderr
        assert mtu == (1000 if family == 4 else 1280)
        assert final["drop"] == 0 and final["unmatched"] > 0
