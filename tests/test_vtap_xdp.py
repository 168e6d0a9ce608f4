"""`vtap --hook xdp` as a user runs it, on a router built as users build one
(Topology(kernel_defaults=True): neighbours resolved on demand, TX checksum
offload and GRO as a veth comes, no XDP program the lab did not put there):
what it refuses and the fix it prints, exact copies of real TCP and UDP
exchanges, and what a killed run leaves to --cleanup."""

import ipaddress
import re
import subprocess
import sys

import pytest
from conftest import ROOT
from helpers import PORT, Tool, echo_servers, exchange, stop_all

from ebpf import xdp
from lab import netns
from lab.topology import Topology
from lab.traffic import Capture

CLIENT4, CLIENT6 = "198.18.1.1", "2001:2:0:1::1"
SERVER4, SERVER6 = "198.18.2.2", "2001:2:0:2::2"
WATCH = ["--watch", f"{SERVER4}/32", "--watch", f"{SERVER6}/128"]


def plain_router(forwarding=True):
    """client eth0 -- eth0 router eth1 -- eth0 server, and router mon0 -- eth0 monitor."""
    t = Topology("uxtap", kernel_defaults=True)
    t.add_host("client")
    t.add_host("router", forwarding=forwarding)
    t.add_host("server")
    t.add_host("monitor")
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
    t.add_link("router", "monitor", a_if="mon0", a_addrs=[], b_addrs=[])
    t.add_route("client", "198.18.2.0/24", "198.18.1.254")
    t.add_route("client", "2001:2:0:2::/64", "2001:2:0:1::fe")
    t.add_route("server", "198.18.1.0/24", "198.18.2.254")
    t.add_route("server", "2001:2:0:1::/64", "2001:2:0:2::fe")
    return t


def copies_of(*addrs):
    """A Capture classifier: "copy" for an IPv4/IPv6 frame from or to one of the
    addresses (what the vTAP copies), None for the rest (the monitor's link
    carries the kernel's own too: router solicitations, MLD, as users' hosts send)."""
    packed = {ipaddress.ip_address(a).packed for a in addrs}

    def classify(frame):
        kind = frame[12:14]
        if kind == b"\x08\x00":
            ends = (frame[26:30], frame[30:34])
        elif kind == b"\x86\xdd":
            ends = (frame[22:38], frame[38:54])
        else:
            return None
        return "copy" if packed & set(ends) else None

    return classify


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


def test_refuses_until_the_router_can_do_it_and_prints_the_fix():
    """Forwarding off: nothing would be sent on. A monitor whose veth peer runs
    no XDP program: no copy would arrive. Each refused in one line, exit 2,
    with the command that fixes it; the fixes run, it starts."""
    with plain_router(forwarding=False) as t:
        ns = t.ns("router")
        r = vtap(ns, "--hook", "xdp", "--monitor", "mon0", "--iface", "eth0", *WATCH, "--duration", "1")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        fix = re.search(r"fix: (sysctl -w .*?)(;|$)", r.stderr).group(1)
        assert fix == "sysctl -w net.ipv4.conf.eth0.forwarding=1 net.ipv6.conf.eth0.forwarding=1"
        netns.run(ns, fix.split(), capture_output=True, check=True)
        r = vtap(ns, "--hook", "xdp", "--monitor", "mon0", "--iface", "eth0", *WATCH, "--duration", "1")
        assert r.returncode == 2 and "no copy would reach the monitor" in r.stderr and "--prepare-peer" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert xdp.attached(ns) == []  # nothing half-attached
        r = vtap(
            ns, "--hook", "xdp", "--monitor", "mon0", "--iface", "eth0", *WATCH, "--duration", "1", "--prepare-peer"
        )
        assert r.returncode == 0, r.stderr
        assert xdp.attached(ns) == [] and xdp.attached(t.ns("monitor")) == []


@pytest.mark.parametrize(
    "args, said",
    [
        (["--direction", "both"], "--direction both cannot apply with --hook xdp"),
        (["--clone", "helper"], "--clone cannot apply with --hook xdp"),
        (["--xdp-mode", "offload"], "--xdp-mode offload cannot apply"),
    ],
)
def test_what_cannot_apply_at_xdp_is_refused(args, said):
    r = subprocess.run(
        [sys.executable, "-m", "vtap", "--hook", "xdp", "--monitor", "mon0", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_xdp_options_without_the_xdp_hook_are_refused():
    r = subprocess.run(
        [sys.executable, "-m", "vtap", "--monitor", "mon0", "--forward", "all"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 2 and "--forward go(es) with --hook xdp" in r.stderr


def test_mirrors_real_exchanges_exactly_on_a_plain_router():
    """TCP and UDP, both families, through a router with cold neighbour caches
    and offloads as they come, every interface tapped (the default): every
    watched frame, both ways, is copied, or sent to the kernel by a named
    reason (the first ones to a neighbour not resolved yet, and what is for the
    router itself); the monitor gets
    exactly the copies; the hosts see no checksum error."""
    with plain_router() as t:
        servers = echo_servers(t, ["server"])
        tool = Tool(t.ns("router"), "vtap", "--hook", "xdp", "--monitor", "mon0", *WATCH, "--prepare-peer")
        try:
            assert tool.attached["ifaces"] == ["eth0", "eth1"] and tool.attached["egresses"] == ["eth0", "eth1"]
            with Capture(t.ns("monitor"), "eth0", copies_of(SERVER4, SERVER6)) as mon:
                got = [exchange(t, "client", dst, PORT, n=20) for dst in (SERVER4, SERVER6)]
                final, warnings = tool.stop()
                mon.expect = {"copy": final["cloned"]}  # then until the socket has read all the link counted
            copies = mon.counts["copy"]
            assert mon.kernel_drops == 0
        finally:
            tool.kill()
            stop_all(servers)
        for host in ("client", "router", "server", "monitor"):
            assert xdp.attached(t.ns(host)) == []  # the pass programs --prepare-peer attached are gone too
    assert got == [{"udp": 20, "tcp": 20, "n": 20}] * 2, warnings
    assert final["failed"] == 0 and final["cloned"] > 4 * 20 * 2  # both ways, both protocols and families
    assert final["matched"] == final["cloned"] + final["to_kernel"] + final["sampled_out"]
    # what went the kernel's way: the first frames to a neighbour not resolved yet, and
    # the watched server's own neighbour discovery with the router (for the node itself)
    assert final["to_kernel"] == final["no_neigh"] + final["not_forwarded"] and final["no_neigh"] >= 2, final
    assert copies == final["cloned"]
    assert final["forwarded"] == final["cloned"]


def test_a_second_run_is_refused_and_a_killed_one_left_to_cleanup():
    with plain_router() as t:
        ns = t.ns("router")
        tool = Tool(ns, "vtap", "--hook", "xdp", "--monitor", "mon0", *WATCH, "--prepare-peer")
        second = vtap(ns, "--hook", "xdp", "--monitor", "mon0", "--iface", "eth1", *WATCH, "--prepare-peer")
        assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1
        assert f"another XDP vTAP is on its hook (native; pid {tool.p.pid})" in second.stderr, second.stderr
        tool.kill()  # SIGKILL: no teardown
        second = vtap(ns, "--hook", "xdp", "--monitor", "mon0", "--iface", "eth1", *WATCH, "--prepare-peer")
        assert second.returncode == 2 and "a killed run left it" in second.stderr and "vtap --cleanup" in second.stderr
        assert sorted(a[0] for a in xdp.attached(ns)) == ["eth0", "eth1"]
        assert [a[0] for a in xdp.attached(t.ns("monitor"))] == ["eth0"]
        r = vtap(ns, "--cleanup")
        assert r.returncode == 0, r.stderr
        assert "removed xdp_mirror on eth0 (native)" in r.stdout and "removed xdp_mirror on eth1 (native)" in r.stdout
        assert f"removed xdp_peer_pass on eth0 (native) (namespace {t.ns('monitor')})" in r.stdout
        for host in ("client", "router", "server", "monitor"):
            assert xdp.attached(t.ns(host)) == []


def test_a_tunnel_monitor_takes_copies_in_generic_mode_only():
    """A VXLAN monitor's driver transmits no XDP frames: native is refused with
    the fix; generic copies as skbs, which the tunnel carries to the far end."""
    with plain_router() as t:
        r, m = t.ns("router"), t.ns("monitor")
        for ns, mine, far, dev in (
            (r, "198.18.9.1/24", "198.18.9.2", "mon0"),
            (m, "198.18.9.2/24", "198.18.9.1", "eth0"),
        ):
            for argv in (
                ["ip", "addr", "add", mine, "dev", dev],
                ["ip", "link", "add", "vx0", "type", "vxlan", "id", "42", "remote", far, "dstport", "4789", "dev", dev],
                ["ip", "link", "set", "vx0", "up"],
            ):
                netns.run(ns, argv, check=True, capture_output=True)
        refused = vtap(r, "--hook", "xdp", "--monitor", "vx0", "--iface", "eth0", *WATCH, "--duration", "1")
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
        assert (
            "vx0's driver does not transmit XDP frames" in refused.stderr
            and "fix: --xdp-mode generic" in refused.stderr
        )
        tool = Tool(r, "vtap", "--hook", "xdp", "--xdp-mode", "generic", "--monitor", "vx0", "--iface", "eth0", *WATCH)
        try:
            with Capture(m, "vx0", copies_of(SERVER4, SERVER6)) as far_end:
                t.run("client", ["ping", "-c", "5", "-i", "0.05", "-q", SERVER4], check=True, capture_output=True)
                final, _ = tool.stop()
                far_end.expect = {"copy": final["cloned"]}
        finally:
            tool.kill()
        assert final["cloned"] + final["no_neigh"] == final["matched"] == 5
        assert far_end.counts["copy"] == final["cloned"] > 0


def test_an_interface_that_carries_the_copies_is_not_tapped():
    """The monitor's veth peer in the router's own namespace carries every copy:
    tapping it would copy the copies; refused by name, skipped by default."""
    t = plain_router()
    t.add_link("router", "router", a_if="mon1", b_if="mon1p", a_addrs=[], b_addrs=[])
    with t:
        r = t.ns("router")
        refused = vtap(r, "--hook", "xdp", "--monitor", "mon1", "--iface", "mon1p", *WATCH, "--duration", "1")
        assert (
            refused.returncode == 2 and "cannot tap mon1p" in refused.stderr and "carries the copies" in refused.stderr
        ), refused.stderr
        tool = Tool(r, "vtap", "--hook", "xdp", "--monitor", "mon1", *WATCH, "--xdp-mode", "generic")
        try:
            assert "mon1p" not in tool.attached["ifaces"] and "eth0" in tool.attached["ifaces"]
            _, warnings = tool.stop()
        finally:
            tool.kill()
        assert any(w.startswith("vtap: warning: not tapping mon1p: ") for w in warnings), warnings
