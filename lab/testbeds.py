"""The vTAP paper's testbeds (its Figure 4) as namespace topologies.

Testbed 1: the vTAP runs on the receiver.

    sender eth0 ---- eth0 receiver mon0 ---- eth0 monitor
                          (vTAP on eth0 ingress, clones out mon0)

Testbed 2: the vTAP runs on a separate node that bridges sender and receiver.

    sender eth0 ---- eth0 [br0] eth1 ---- eth0 receiver
                        tapnode mon0 ---- eth0 monitor
                        (vTAP on eth0 ingress, clones out mon0)

Testbed 3: the vTAP runs on a node that routes between sender and receiver
(the XDP vTAP's place: it sends each watched frame out of its egress and to
the monitor before the kernel builds an skb; not in the paper).

    sender eth0 ---- eth0 tapnode eth1 ---- eth0 receiver
    198.18.1.0/24     (routes) mon0 ---- eth0 monitor     198.18.2.0/24

In Testbeds 1 and 2 sender and receiver share one segment, 198.18.1.0/24 and
2001:2:0:1::/64; in Testbed 3 the receiver is on 198.18.2.0/24 and
2001:2:0:2::/64, with the same host numbers. Besides
its own .1/::1 the sender holds .10/::10 and .20/::20 so that tests can send from a
watched and an unwatched source; the receiver holds .2/::2 and .3/::3 likewise.
"""

import ipaddress
import threading
from dataclasses import dataclass, fields
from html import escape

from .awaitable import in_thread
from .topology import Topology
from .traffic import MAX_SECONDS, Capture, Marker, build, send_frames

SENDER_V4 = ["198.18.1.1/24", "198.18.1.10/24", "198.18.1.20/24"]
SENDER_V6 = ["2001:2:0:1::1/64", "2001:2:0:1::10/64", "2001:2:0:1::20/64"]
RECEIVER_V4 = ["198.18.1.2/24", "198.18.1.3/24"]
RECEIVER_V6 = ["2001:2:0:1::2/64", "2001:2:0:1::3/64"]


def _ip(cidr):
    return cidr.split("/")[0]


class _Shown:
    """repr() and a notebook's table for a testbed: its roles (fields naming a
    host), its addresses, its settings, then its topology."""

    def _parts(self):
        roles, addrs, settings = {}, {}, {}
        hosts = self.topo.hosts if self.topo is not None else {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "topo" or v is None:
                continue
            if isinstance(v, str) and v in hosts and f.name != v:
                roles[f.name] = v
            elif isinstance(v, str) and _is_address(v):
                addrs[f.name] = v
            elif isinstance(v, (str, int, bool, list, tuple)) and f.name not in hosts and v != f.name:
                settings[f.name] = v
        return roles, addrs, settings

    def __repr__(self):
        roles, addrs, settings = self._parts()
        lines = [
            f"{type(self).__name__}"
            + (f" ({', '.join(f'{k}={v!r}' for k, v in settings.items())})" if settings else "")
        ]
        if roles:
            lines.append("  roles: " + ", ".join(f"{k}={v}" for k, v in roles.items()))
        if addrs:
            lines.append("  addresses: " + ", ".join(f"{k}={v}" for k, v in addrs.items()))
        lines += ["  " + ln for ln in repr(self.topo).splitlines()]
        return "\n".join(lines)

    def _repr_html_(self):
        roles, addrs, settings = self._parts()

        def row(k, v):
            return f"<tr><th style='text-align:left'>{escape(k)}</th><td style='text-align:left'>{escape(v)}</td></tr>"

        head = "".join(row(k, str(v)) for k, v in settings.items())
        head += row("roles", ", ".join(f"{k}={v}" for k, v in roles.items())) if roles else ""
        head += row("addresses", ", ".join(f"{k}={v}" for k, v in addrs.items())) if addrs else ""
        return f"<b>{escape(type(self).__name__)}</b><table>{head}</table>{self.topo._repr_html_()}"


def _is_address(text):
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


class BuiltTestbed(_Shown):
    """A testbed whose `topo` is built on entry (or build()) and torn down on
    exit (or close(); at the latest when Python exits). A testbed that needs
    more once built says so in prepare() and undoes it in release(); one with
    tx_csum_offload=False turns TX checksum offload off on checksum_hosts()."""

    def ns(self, host):
        """The network namespace of `host` (vtl-<run id>-<host>)."""
        return self.topo.ns(host)

    def build(self):
        """Build the namespaces, links, addresses and routes; returns the testbed."""
        self.topo.build()
        try:
            # By default the hosts keep TX checksum offload on, as a veth comes:
            # their TCP/UDP checksums reach the device under test partial, and
            # the programs must keep or finish them (rewrite_helpers.h). Off,
            # they send whole checksums.
            if not getattr(self, "tx_csum_offload", True):
                for host in self.checksum_hosts():
                    self.topo.run(host, ["ethtool", "-K", "eth0", "tx", "off"], capture_output=True)
            self.prepare()
        except BaseException:
            self.close()
            raise
        return self

    def checksum_hosts(self):
        return []

    def prepare(self):
        """What the testbed needs once built (nothing, by default)."""

    def release(self):
        """Undo prepare()."""

    def close(self):
        """Tear everything down (idempotent)."""
        try:
            self.release()
        finally:
            self.topo.teardown()

    def __enter__(self):
        return self.build()

    def __exit__(self, *exc):
        self.close()
        return False


@dataclass(repr=False)
class Testbed(BuiltTestbed):
    topo: Topology
    number: int
    tap_host: str  # where the vTAP runs
    tap_iface: str  # the interface it taps
    tap_direction: str  # on which hook the traffic from sender to receiver passes
    monitor_iface: str  # the vTAP's --monitor, on tap_host
    sender: str = "sender"
    receiver: str = "receiver"
    monitor: str = "monitor"
    sender_iface: str = "eth0"
    receiver_iface: str = "eth0"
    monitor_capture_iface: str = "eth0"  # where copies arrive, on the monitor host
    bridge: tuple | None = None  # (name, ports) when the tap host bridges sender and receiver
    gateway: tuple | None = None  # (host, iface) the sender's frames are addressed to when
    # the tap host routes (Testbed 3); else the receiver
    # The addresses traffic uses, the same in both testbeds: the load's (and a
    # watched) source and its destination, and a second of each (unwatched
    # source, a destination the demo watches).
    src4: str = _ip(SENDER_V4[1])
    alt_src4: str = _ip(SENDER_V4[2])
    dst4: str = _ip(RECEIVER_V4[0])
    alt_dst4: str = _ip(RECEIVER_V4[1])
    src6: str = _ip(SENDER_V6[1])
    alt_src6: str = _ip(SENDER_V6[2])
    dst6: str = _ip(RECEIVER_V6[0])
    alt_dst6: str = _ip(RECEIVER_V6[1])

    @property
    def next_hop_mac(self):
        """Destination MAC for frames the sender crafts to the receiver."""
        return self.topo.mac(*(self.gateway or (self.receiver, self.receiver_iface)))

    @property
    def sender_mac(self):
        return self.topo.mac(self.sender, self.sender_iface)

    # --- traffic, as a notebook sends it ---------------------------------------------
    @property
    def marker(self):
        """The Marker that tags this testbed's frames (send()) and tells them
        apart on arrival (capture())."""
        if getattr(self, "_marker", None) is None:
            self._marker = Marker()
        return self._marker

    def send(self, flows, rate_pps=None, max_seconds=None, stop=None):
        """Send lab.Flow(s) from the sender to the receiver, each frame once and
        marked (capture() counts them by flow name); paced to rate_pps when
        given, bounded in packets and seconds. Returns a SendReport (packets,
        bytes, seconds, pps). `stop`: a threading.Event that ends it early."""
        flows = [flows] if not isinstance(flows, (list, tuple)) else list(flows)
        frames = build(flows, self.marker, self.sender_mac, self.next_hop_mac)
        return send_frames(
            self.ns(self.sender),
            self.sender_iface,
            frames,
            rate_pps=rate_pps,
            max_seconds=max_seconds or MAX_SECONDS,
            stop=stop,
        )

    async def asend(self, flows, rate_pps=None, max_seconds=None):
        """send() without blocking the caller's event loop (a notebook's top-level
        `await`, e.g. beside `await Sampler(tap).arun(3)` in asyncio.gather)."""
        stop = threading.Event()  # set when the cell is interrupted: the send ends too
        return await in_thread(self.send, flows, rate_pps, max_seconds, stop, stop=stop)

    def capture(self, host=None, ifname=None, direction="in", expect=None):
        """A Capture (use it in a `with` block) that counts this testbed's
        frames by flow name as they arrive at host/ifname: by default the
        monitor's eth0, where the vTAP's copies arrive. The block ends once the
        interface's frames have all been counted; with `expect` ({flow: count}),
        first once the counts reach it (frames still queued on another host
        are otherwise not waited for)."""
        host = host or self.monitor
        if ifname is None:
            ifname = {
                self.monitor: self.monitor_capture_iface,
                self.receiver: self.receiver_iface,
                self.sender: self.sender_iface,
            }.get(host, "eth0")
        return Capture(self.ns(host), ifname, self.marker, direction=direction, expect=expect)


def testbed1(mtu=1500, collector=False) -> Testbed:
    """The vTAP on the receiver: sender eth0 -- eth0 receiver mon0 -- eth0 monitor.
    Returns a Testbed, not yet built (build() or `with`). mtu: of every link (a
    replayed pcap of tunnelled frames needs more than 1500). collector=True: a
    remote sensor two hops away, as in testbed3(); its links have room for a
    whole frame in a tunnel (mtu + 100)."""
    t = Topology("testbed1")
    for h in ("sender", "receiver", "monitor"):
        t.add_host(h)
    t.add_link("sender", "receiver", a_addrs=SENDER_V4 + SENDER_V6, b_addrs=RECEIVER_V4 + RECEIVER_V6, mtu=mtu)
    t.add_link("receiver", "monitor", a_if="mon0", a_addrs=[], b_addrs=[], mtu=mtu)
    if collector:
        _add_collector(t, "receiver", mtu + 100)
    return Testbed(t, 1, tap_host="receiver", tap_iface="eth0", tap_direction="ingress", monitor_iface="mon0")


def testbed2() -> Testbed:
    """The vTAP on a separate node (tapnode) that bridges sender and receiver;
    its copies leave through mon0 to the monitor."""
    t = Topology("testbed2")
    for h in ("sender", "tapnode", "receiver", "monitor"):
        t.add_host(h)
    t.add_link("sender", "tapnode", a_addrs=SENDER_V4 + SENDER_V6, b_addrs=[])
    t.add_link("tapnode", "receiver", a_if="eth1", a_addrs=[], b_addrs=RECEIVER_V4 + RECEIVER_V6)
    t.add_bridge("tapnode", "br0", ["eth0", "eth1"])
    t.add_link("tapnode", "monitor", a_if="mon0", a_addrs=[], b_addrs=[])
    return Testbed(
        t,
        2,
        tap_host="tapnode",
        tap_iface="eth0",
        tap_direction="ingress",
        monitor_iface="mon0",
        bridge=("br0", ["eth0", "eth1"]),
    )


def _routed(cidr, subnet):
    """The same host number on another subnet: 198.18.1.2/24 -> 198.18.2.2/24."""
    iface = ipaddress.ip_interface(cidr)
    net = ipaddress.ip_network(subnet)
    host = int(iface.ip) - int(iface.network.network_address)
    return f"{net.network_address + host}/{net.prefixlen}"


COLLECTOR_V4, COLLECTOR_V6 = "198.18.6.2", "2001:2:0:6::2"


def _add_collector(t, tap_host, mtu):
    """A remote sensor for vTAP sessions' tunnels, two hops from the tap host:
    tap_host eth2 (198.18.5.254, 2001:2:0:5::fe) ---- eth0 router eth1 ---- eth0
    collector (COLLECTOR_V4, COLLECTOR_V6), the router forwarding."""
    t.add_host("router", forwarding=True)
    t.add_host("collector")
    t.add_link(
        tap_host,
        "router",
        a_if="eth2",
        a_addrs=["198.18.5.254/24", "2001:2:0:5::fe/64"],
        b_addrs=["198.18.5.1/24", "2001:2:0:5::1/64"],
        mtu=mtu,
    )
    t.add_link(
        "router",
        "collector",
        a_if="eth1",
        a_addrs=["198.18.6.1/24", "2001:2:0:6::1/64"],
        b_addrs=[f"{COLLECTOR_V4}/24", f"{COLLECTOR_V6}/64"],
        mtu=mtu,
    )
    t.add_route(tap_host, "198.18.6.0/24", "198.18.5.1")
    t.add_route(tap_host, "2001:2:0:6::/64", "2001:2:0:5::1")
    t.add_route("collector", "198.18.5.0/24", "198.18.6.1")
    t.add_route("collector", "2001:2:0:5::/64", "2001:2:0:6::1")


def testbed3(collector=False, collector_mtu=1500) -> Testbed:
    """The vTAP on a node that routes between sender and receiver (tapnode,
    forwarding on); its copies leave through mon0 to the monitor.

    collector=True adds a remote sensor two hops away, for vTAP sessions'
    tunnels: tapnode eth2 (198.18.5.254, 2001:2:0:5::fe) ---- eth0 router eth1
    ---- eth0 collector (COLLECTOR_V4, COLLECTOR_V6), the router forwarding;
    collector_mtu on both links (a whole 1514-byte frame needs some 1570 in a
    tunnel: the bench gives it 3000, as a cloud gives a jumbo underlay)."""
    t = Topology("testbed3")
    for h in ("sender", "receiver", "monitor"):
        t.add_host(h)
    t.add_host("tapnode", forwarding=True)
    if collector:
        _add_collector(t, "tapnode", collector_mtu)
    receiver = [_routed(a, "198.18.2.0/24") for a in RECEIVER_V4] + [_routed(a, "2001:2:0:2::/64") for a in RECEIVER_V6]
    t.add_link("sender", "tapnode", a_addrs=SENDER_V4 + SENDER_V6, b_addrs=["198.18.1.254/24", "2001:2:0:1::fe/64"])
    t.add_link("tapnode", "receiver", a_if="eth1", a_addrs=["198.18.2.254/24", "2001:2:0:2::fe/64"], b_addrs=receiver)
    t.add_link("tapnode", "monitor", a_if="mon0", a_addrs=[], b_addrs=[])
    t.add_route("sender", "198.18.2.0/24", "198.18.1.254")
    t.add_route("sender", "2001:2:0:2::/64", "2001:2:0:1::fe")
    t.add_route("receiver", "198.18.1.0/24", "198.18.2.254")
    t.add_route("receiver", "2001:2:0:1::/64", "2001:2:0:2::fe")
    dst = {
        k: _ip(a) for k, a in zip(("dst4", "alt_dst4", "dst6", "alt_dst6"), receiver[:2] + receiver[2:], strict=True)
    }
    return Testbed(
        t,
        3,
        tap_host="tapnode",
        tap_iface="eth0",
        tap_direction="ingress",
        monitor_iface="mon0",
        gateway=("tapnode", "eth0"),
        **dst,
    )


def pair(a="a", b="b", name="pair") -> Topology:
    """Two hosts and one veth link (198.18.1.1 and .2): the smallest lab, for
    trying one program or one tool."""
    t = Topology(name)
    t.add_host(a)
    t.add_host(b)
    t.add_link(a, b)
    return t


TESTBEDS = {1: testbed1, 2: testbed2, 3: testbed3}
