"""Copies must never be copied again: the hooks a monitor's copies pass (its veth
peer, a tunnel's underlay, a bridge's ports) are refused or skipped, and copies
that do not fit the monitor are counted. Real devices, real VXLAN, real packets."""

import json
import subprocess
import sys

import pytest
from helpers import frames_in, invariant, wait_for

from ebpf import InputError, TcMirror, tc
from lab.topology import Topology
from lab.traffic import Capture, Flow, Marker, build, send_frames

N = 300


def tunnel_topology():
    """sender -- eth0 tapnode eth2 -- collector; the tap node's monitor is a VXLAN
    (vx0) to the collector, over eth2. A bridge monitor br1 with port eth3 goes to
    the collector too, and mon0 is a veth to it."""
    t = Topology("loops")
    for h in ("sender", "tapnode", "collector"):
        t.add_host(h)
    t.add_link("sender", "tapnode")  # 198.18.1.0/24
    t.add_link("tapnode", "collector", a_if="eth2", b_if="eth0")  # 198.18.2.0/24, underlay
    t.add_link("tapnode", "collector", a_if="eth3", b_if="eth3", a_addrs=[], b_addrs=[])
    t.add_link("tapnode", "collector", a_if="mon0", b_if="m0", a_addrs=[], b_addrs=[])
    t.add_bridge("tapnode", "br1", ["eth3"])
    return t


def add_vxlan(t, host, local, remote, dev, name="vx0", mtu=None):
    t.run(
        host,
        [
            "ip",
            "link",
            "add",
            name,
            "type",
            "vxlan",
            "id",
            "42",
            "local",
            local,
            "remote",
            remote,
            "dstport",
            "4789",
            "dev",
            dev,
        ]
        + (["mtu", str(mtu)] if mtu else []),
    )
    t.run(host, ["ip", "link", "set", name, "up"])


def vtap(t, host, *args, timeout=60):
    return t.run(
        host, [sys.executable, "-m", "vtap", *args], check=False, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def tun():
    t = tunnel_topology()
    with t:
        add_vxlan(t, "tapnode", t.addr("tapnode", "eth2"), t.addr("collector", "eth0"), "eth2")
        add_vxlan(t, "collector", t.addr("collector", "eth0"), t.addr("tapnode", "eth2"), "eth0")
        yield t


@pytest.mark.parametrize(
    "monitor, iface, direction, why",
    [
        ("vx0", "eth2", "egress", "vx0's underlay device"),
        ("vx0", "eth2", "both", "vx0's underlay device"),
        ("br1", "eth3", "egress", "a port of br1"),
        ("mon0", "mon0", "ingress", "monitor mon0 is also a tapped interface"),
    ],
)
def test_hooks_that_carry_the_copies_are_refused(tun, monitor, iface, direction, why):
    ns = tun.ns("tapnode")
    before = tc.hook_snapshot(ns)
    with TcMirror(monitor=monitor, netns=ns) as tap:
        with pytest.raises(InputError, match=why):
            tap.attach(iface, direction)
    r = vtap(tun, "tapnode", "--monitor", monitor, "--iface", iface, "--direction", direction)
    assert r.returncode == 2 and r.stderr.startswith("vtap: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert tc.hook_snapshot(ns) == before


def test_the_underlay_route_is_followed_without_a_dev(tun):
    """A VXLAN made without `dev` still leaves through the route to its remote."""
    tun.run(
        "tapnode",
        [
            "ip",
            "link",
            "add",
            "vx1",
            "type",
            "vxlan",
            "id",
            "7",
            "remote",
            tun.addr("collector", "eth0"),
            "dstport",
            "4790",
        ],
    )
    with TcMirror(monitor="vx1", netns=tun.ns("tapnode")) as tap:
        why = tap.loop_reason("eth2", "egress")
    assert why and f"the route to {tun.addr('collector', 'eth0')}" in why
    assert tap.loop_reason("eth2", "ingress") is None  # the copies leave by eth2's egress only


def test_default_selection_skips_the_underlay_and_the_copies_arrive_once(tun):
    """Before: the default tapped eth2 too, both ways, and the collector got copies
    of copies nested VXLAN in VXLAN. Now eth2 is skipped and said so, and the
    collector gets exactly one copy per frame."""
    marker = Marker()
    frames = build(
        [Flow("w", tun.addr("sender", "eth0"), tun.addr("tapnode", "eth0"), count=N)],
        marker,
        tun.mac("sender", "eth0"),
        tun.mac("tapnode", "eth0"),
    )
    for name in ("eth3", "mon0"):  # leave only eth0 and the underlay eth2 UP besides the monitor
        tun.run("tapnode", ["ip", "link", "set", name, "down"])
    at_collector = frames_in(tun.ns("collector"), "vx0")
    proc = tun.popen(
        "tapnode",
        [sys.executable, "-m", "vtap", "--monitor", "vx0", "--direction", "both", "--json", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = json.loads(proc.stdout.readline())
    assert first["event"] == "attached" and sorted(first["ifaces"]) == ["br1", "eth0"]
    with Capture(tun.ns("collector"), "vx0", marker) as coll:
        send_frames(tun.ns("sender"), "eth0", frames, rate_pps=20000)
    proc.send_signal(2)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert (
        "not tapping eth2: its egress carries the copies to monitor vx0 (vx0's underlay device): they would "
        "be copied again; --iface eth2 --direction ingress taps it safely"
    ) in err
    assert coll.counts["w"] == N  # once each: no copy of a copy
    final = json.loads(out.splitlines()[-1])
    # every copy made arrived, once (the tap node's replies to the sender are copied too)
    assert final["cloned"] == final["matched"] == at_collector() >= N and invariant(final)


def test_a_veth_peer_in_a_bridge_floods_the_copies_to_the_other_ports():
    """mon0's peer is a port of a bridge in the same namespace: the copies arrive
    there and are flooded out of the bridge's other ports, so those ports' egress
    is on the copies' way too."""
    t = Topology("peerbridge")
    t.add_host("h")
    t.add_host("far")
    t.add_link("h", "far", a_if="eth1", b_if="eth0", a_addrs=[], b_addrs=[])
    with t:
        t.run("h", ["ip", "link", "add", "mon0", "type", "veth", "peer", "name", "mon0p"])
        t.run("h", ["ip", "link", "add", "br0", "type", "bridge"])
        for dev in ("mon0p", "eth1"):
            t.run("h", ["ip", "link", "set", dev, "master", "br0"])
        for dev in ("mon0", "mon0p", "br0"):
            t.run("h", ["ip", "link", "set", dev, "up"])
        with TcMirror(monitor="mon0", netns=t.ns("h")) as tap:
            assert "the other end of mon0's veth pair" in tap.loop_reason("mon0p", "ingress")
            assert "floods what mon0p receives" in tap.loop_reason("eth1", "egress")
            assert "br0, which mon0p belongs to" in tap.loop_reason("br0", "ingress")
            assert tap.loop_reason("eth1", "ingress") is None
            chosen, skipped = tap.default_interfaces("both")
            assert chosen == [] and set(skipped) == {"br0", "eth1", "mon0p"}


def test_a_refused_monitor_change_leaves_the_old_monitor(tun):
    """The monitor setter checks before it stores: a monitor whose copies would
    pass a tapped hook is refused and mirroring goes on to the old one."""
    marker = Marker()
    frames = build(
        [Flow("a", tun.addr("sender", "eth0"), tun.addr("tapnode", "eth0"), count=N)],
        marker,
        tun.mac("sender", "eth0"),
        tun.mac("tapnode", "eth0"),
    )
    with TcMirror(monitor="mon0", netns=tun.ns("tapnode")) as tap:
        tap.attach("eth0", "ingress")
        tap.attach("eth2", "egress")
        with pytest.raises(InputError, match="monitor vx0 refused: eth2 egress"):
            tap.monitor = "vx0"
        with pytest.raises(InputError, match="monitor eth0 refused"):
            tap.monitor = "eth0"
        assert tap.monitor == "mon0"
        tap.reset_counters()
        with Capture(tun.ns("collector"), "m0", marker) as mon:
            send_frames(tun.ns("sender"), "eth0", frames, rate_pps=20000)
        c = tap.counters()
    assert mon.counts["a"] == N and c["cloned"] == N and c["failed"] == 0


@pytest.mark.parametrize("clone", ["action", "helper"])
def test_copies_longer_than_the_monitors_mtu_are_counted(clone):
    """A monitor with a smaller MTU than the tapped link: the veth drops the copies
    it cannot carry. They are counted as oversize, and those that fit are not."""
    t = Topology("mtu")
    for h in ("sender", "receiver", "monitor"):
        t.add_host(h)
    t.add_link("sender", "receiver")
    t.add_link("receiver", "monitor", a_if="mon0", a_addrs=[], b_addrs=[], mtu=1000)
    with t:
        marker = Marker()
        src, dst = t.addr("sender", "eth0"), t.addr("receiver", "eth0")
        # the QinQ frame's IP packet is exactly 1000 bytes too: its outer tag
        # leaves the data at ingress (skb->vlan_tci), its inner one stays there
        flows = [
            Flow("big", src, dst, count=N, size=1200),
            Flow("fits", src, dst, count=N, size=1014),
            Flow("fits-qinq", src, dst, count=N, size=1022, vlans=((0x88A8, 5), (0x8100, 7))),
        ]
        frames = build(flows, marker, t.mac("sender", "eth0"), t.mac("receiver", "eth0"))
        with TcMirror(monitor="mon0", netns=t.ns("receiver"), clone=clone) as tap:
            tap.attach("eth0", "ingress")
            tap.reset_counters()
            at_monitor = frames_in(t.ns("monitor"), "eth0")
            with Capture(t.ns("monitor"), "eth0", marker) as mon:
                send_frames(t.ns("sender"), "eth0", frames, rate_pps=20000)
            c = tap.counters()
            arrived = at_monitor()
    assert dict(mon.counts) == {"fits": N, "fits-qinq": N}  # IP packets of exactly 1000 bytes
    # of the 3N copies, the N oversize ones never arrived: mirred says so (failed), the helper cannot
    assert c["matched"] == 3 * N and c["oversize"] == N and arrived == 2 * N
    assert (c["cloned"], c["failed"]) == ((2 * N, N) if clone == "action" else (3 * N, 0)) and invariant(c)


def test_gso_copies_count_their_wire_packets():
    """An egress tap of local TCP sees GSO frames (one skb, up to 64 KB). Each is
    one copy, and cloned_segs counts its wire packets (gso_segs). Checked against
    the wire: the monitor host bridges the copies on to a port without TSO or GSO,
    where the kernel cuts them into real segments, and an nftables counter at the
    far end counts those."""
    t = Topology("gso")
    for h in ("client", "server", "monitor", "sink"):
        t.add_host(h)
    t.add_link("client", "server")
    t.add_link("client", "monitor", a_if="mon0", b_if="m0", a_addrs=[], b_addrs=[])
    t.add_link("monitor", "sink", a_if="m1", b_if="eth0", a_addrs=[], b_addrs=[])
    t.add_bridge("monitor", "br0", ["m0", "m1"])
    with t:
        t.run("monitor", ["ethtool", "-K", "m1", "tso", "off", "gso", "off"], capture_output=True)
        client, server = t.addr("client", "eth0"), t.addr("server", "eth0")
        t.run(
            "sink",
            ["nft", "-f", "-"],
            text=True,
            input=(
                "table netdev vtl_count {\n chain in {\n type filter hook ingress device eth0 priority 0;\n"
                f" ip saddr {client} tcp dport 5201 counter\n }}\n}}\n"
            ),
        )
        srv = t.popen(
            "server",
            [
                sys.executable,
                "-c",
                "import socket\ns=socket.socket()\ns.bind(('0.0.0.0',5201))\ns.listen()\n"
                "c,_=s.accept()\nwhile c.recv(1<<16): pass\n",
            ],
        )
        with TcMirror(monitor="mon0", netns=t.ns("client"), watch=[f"{client}/32"], match="src") as tap:
            tap.attach("eth0", "egress")
            t.run(
                "client",
                [
                    sys.executable,
                    "-c",
                    "import socket,time\nfor i in range(50):\n    try:\n"
                    f"        s=socket.create_connection(('{server}',5201)); break\n"
                    "    except OSError: time.sleep(0.1)\n"
                    "s.sendall(b'x'*4_000_000)\ns.shutdown(socket.SHUT_WR)\ns.recv(1)\ns.close()\n",
                ],
                timeout=60,
            )
            srv.wait(timeout=30)
            c = tap.counters()  # the client has ended: nothing more leaves its eth0

        def on_wire():
            out = t.run(
                "sink", ["nft", "-j", "list", "table", "netdev", "vtl_count"], capture_output=True, text=True
            ).stdout
            rule = next(x["rule"] for x in json.loads(out)["nftables"] if "rule" in x)
            return next(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)

        wait_for(lambda: on_wire() >= c["cloned_segs"], what=f"{c['cloned_segs']} segments at the sink")
        on_wire = on_wire()
    assert c["cloned"] < c["cloned_segs"], "expected GSO frames at an egress tap of local TCP"
    assert c["cloned_segs"] == on_wire and c["oversize"] == 0 and invariant(c)
