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

from ebpf.instruments.xdp_sink import XdpSink

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


class _Built(_Shown):
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
class Testbed(_Built):
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


@dataclass(repr=False)
class RouterTestbed(_Built):
    """The set-up of the student report on netfilter vs XDP: a client, a router
    (the device under test) that the service address is routed to, and a server
    behind it in a namespace of its own.

        client eth0 ---- eth0 dut eth1 ---- eth0 server
        .1.1 / 1::1       .1.2 / 1::2        .2.1 / 2::1       .2.2 / 2::2
        service 198.18.0.17 / 2001:2::17: routed to the dut (or, with vip_on_router, its own)

    The client reaches the server through the router (a route each way). In the
    report, the service address (10.0.8.17) was the router's own; here the router
    is the way to it but does not hold it, as a load balancer's VIP: a reply
    rewritten to come *from* an address of the router's own would be dropped by
    the router's kernel as a martian source on its way to the client (with
    `pass`, where the kernel routes it; IPv4's fib_validate_source). The client
    and the server keep TX checksum offload on, as a veth comes (their
    checksums reach the router partial), unless tx_csum_offload=False. One thing
    the data path needs on veth, done here for every method alike:
    XDP pass programs sit on the client's and the server's interfaces, because a
    frame that XDP redirects into a veth reaches the far end only if an XDP
    program runs there (it turns on the veth's NAPI).
    """

    topo: Topology
    client: str = "client"
    dut: str = "dut"
    server: str = "server"
    client4: str = "198.18.1.1"
    dut_in4: str = "198.18.1.2"
    vip4: str = "198.18.0.17"
    dut_out4: str = "198.18.2.1"
    server4: str = "198.18.2.2"
    client6: str = "2001:2:0:1::1"
    dut_in6: str = "2001:2:0:1::2"
    vip6: str = "2001:2::17"
    dut_out6: str = "2001:2:0:2::1"
    server6: str = "2001:2:0:2::2"
    service_port: int = 8080
    backend_port: int = 8083
    dut_in: str = "eth0"
    dut_out: str = "eth1"
    tx_csum_offload: bool = True  # as a veth comes; False: the client and server send whole checksums
    vip_on_router: bool = False  # True: the service addresses are the router's own (the report's design)

    def __post_init__(self):
        self.sinks = {}  # host -> its XDP pass sink (ebpf.XdpSink): also counts what arrives

    def checksum_hosts(self):
        return [self.client, self.server]

    def prepare(self):
        for host in (self.client, self.server):
            sink = XdpSink("pass")
            self.sinks[host] = sink
            sink.attach("eth0", netns=self.ns(host))

    def release(self):
        try:
            for sink in self.sinks.values():
                sink.close()
        finally:
            self.sinks.clear()

    def rules(self, proto="udp", families=(4, 6)):
        """The service -> backend rules for this testbed, in the command line's form."""
        ends = {4: (self.vip4, self.server4), 6: (f"[{self.vip6}]", f"[{self.server6}]")}
        return [
            f"{proto}:{vip}:{self.service_port}={backend}:{self.backend_port}"
            for family, (vip, backend) in ends.items()
            if family in families
        ]


def router_testbed(tx_csum_offload=True, vip_on_router=False) -> RouterTestbed:
    """tx_csum_offload=False: the client and the server send whole checksums
    (the kernel's default is on). vip_on_router: the service addresses are
    addresses of the router's eth0, as in the netfilter-vs-XDP report, instead
    of routed to it."""
    tb = RouterTestbed(None, tx_csum_offload=tx_csum_offload, vip_on_router=vip_on_router)
    t = Topology("router")
    for h in (tb.client, tb.dut, tb.server):
        t.add_host(h, forwarding=h == tb.dut)
    t.add_link(
        tb.client,
        tb.dut,
        b_if=tb.dut_in,
        a_addrs=[f"{tb.client4}/24", f"{tb.client6}/64"],
        b_addrs=[f"{tb.dut_in4}/24", f"{tb.dut_in6}/64"],
    )
    t.add_link(
        tb.dut,
        tb.server,
        a_if=tb.dut_out,
        a_addrs=[f"{tb.dut_out4}/24", f"{tb.dut_out6}/64"],
        b_addrs=[f"{tb.server4}/24", f"{tb.server6}/64"],
    )
    if vip_on_router:
        t.add_address(tb.dut, tb.dut_in, f"{tb.vip4}/32")
        t.add_address(tb.dut, tb.dut_in, f"{tb.vip6}/128")
    t.add_route(tb.client, f"{tb.vip4}/32", tb.dut_in4)
    t.add_route(tb.client, f"{tb.vip6}/128", tb.dut_in6)
    t.add_route(tb.client, "198.18.2.0/24", tb.dut_in4)
    t.add_route(tb.client, "2001:2:0:2::/64", tb.dut_in6)
    t.add_route(tb.server, "198.18.1.0/24", tb.dut_out4)
    t.add_route(tb.server, "2001:2:0:1::/64", tb.dut_out6)
    tb.topo = t
    return tb


@dataclass(repr=False)
class LbTestbed(_Built):
    """The set-up of the two load-balancer articles: clients, a load balancer and
    web servers on one layer-2 segment, a bridge in a "switch" namespace joining them.

        client eth0 --+                              +-- eth0 be1  .11 / ::11
        .10 / ::10    |-- [br0 in switch] --+-- eth0 lb  .2 / ::2, VIP .100 / ::100
                      +-- eth0 be2  .12 / ::12

    The VIP is an address of the LB's interface, so the clients' static
    neighbour entry sends it to the LB's MAC; the LB forwards (its program's
    bpf_fib_lookup needs that). The switch's port towards the LB carries an
    XDP program of its own (the lab attaches it): on veth, XDP_TX frames reach
    the peer only when the peer runs XDP.
    """

    topo: Topology
    backends: list
    client: str = "client"
    lb: str = "lb"
    switch: str = "switch"
    lb4: str = "198.18.5.2"
    lb6: str = "2001:2:0:5::2"
    vip4: str = "198.18.5.100"
    vip6: str = "2001:2:0:5::100"
    client4: str = "198.18.5.10"
    client6: str = "2001:2:0:5::10"
    attacker: str = "attacker"
    attacker4: str = "198.18.5.20"
    attacker6: str = "2001:2:0:5::20"
    backend_port: int = 8080
    service_port: int = 80
    tx_csum_offload: bool = True  # as a veth comes; False: clients and backends send whole checksums

    def backend4(self, i):
        return f"198.18.5.{11 + i}"

    def backend6(self, i):
        return f"2001:2:0:5::{11 + i:x}"

    def checksum_hosts(self):
        return [self.client, *self.backends]


def lb_testbed(backends=2, dsr=False, attacker=False, tx_csum_offload=True) -> LbTestbed:
    """dsr: the backends hold the VIPs on their loopback, to answer clients directly.
    attacker: one more host on the switch (.20 / ::20), for floods from outside
    the clients' namespace. tx_csum_offload=False: clients and backends send
    whole checksums (the kernel's default is on)."""
    tb = LbTestbed(None, [f"be{i + 1}" for i in range(backends)], tx_csum_offload=tx_csum_offload)
    t = Topology("lb")
    t.add_host(tb.switch)
    t.add_host(tb.client)
    t.add_host(tb.lb, forwarding=True)
    hosts = {
        tb.client: [f"{tb.client4}/24", f"{tb.client6}/64"],
        tb.lb: [f"{tb.lb4}/24", f"{tb.lb6}/64", f"{tb.vip4}/24", f"{tb.vip6}/64"],
    }
    if attacker:
        t.add_host(tb.attacker)
        hosts[tb.attacker] = [f"{tb.attacker4}/24", f"{tb.attacker6}/64"]
    for i, be in enumerate(tb.backends):
        t.add_host(be)
        hosts[be] = [f"{tb.backend4(i)}/24", f"{tb.backend6(i)}/64"]
    for host, addrs in hosts.items():
        t.add_link(host, tb.switch, b_if=host, a_addrs=addrs, b_addrs=[])
    t.add_bridge(tb.switch, "br0", list(hosts))
    if dsr:
        for be in tb.backends:
            t.add_address(be, "lo", f"{tb.vip4}/32")
            t.add_address(be, "lo", f"{tb.vip6}/128")
    tb.topo = t
    return tb


# --- as users build them -----------------------------------------------------------
# Plain topologies with the kernel's defaults (Topology(kernel_defaults=True)):
# neighbours resolved on demand, TX checksum offload and GRO as a veth comes, no
# XDP program anywhere the lab did not put one, forwarding off but on a router a
# user built as one. What the fast paths need beyond that, their commands check
# and say; the tests run what they print.


@dataclass(repr=False)
class UserRouter(_Built):
    """client eth0 -- eth0 router eth1 -- eth0 server, the service address routed
    to the router (198.18.0.17, 2001:2::17), or held by it (198.18.1.254,
    2001:2:0:1::fe: the netfilter-vs-XDP report's design)."""

    topo: Topology
    client4: str = "198.18.1.1"
    client6: str = "2001:2:0:1::1"
    router4: str = "198.18.1.2"
    router6: str = "2001:2:0:1::2"
    server4: str = "198.18.2.2"
    server6: str = "2001:2:0:2::2"
    routed4: str = "198.18.0.17"
    routed6: str = "2001:2::17"
    held4: str = "198.18.1.254"
    held6: str = "2001:2:0:1::fe"


def user_router() -> UserRouter:
    tb = UserRouter(None)
    t = Topology("urouter", kernel_defaults=True)
    t.add_host("client")
    t.add_host("router", forwarding=True)
    t.add_host("server")
    t.add_link(
        "client",
        "router",
        a_addrs=[f"{tb.client4}/24", f"{tb.client6}/64"],
        b_addrs=[f"{tb.router4}/24", f"{tb.router6}/64", f"{tb.held4}/24", f"{tb.held6}/64"],
    )
    t.add_link(
        "router",
        "server",
        a_if="eth1",
        a_addrs=["198.18.2.1/24", "2001:2:0:2::1/64"],
        b_addrs=[f"{tb.server4}/24", f"{tb.server6}/64"],
    )
    for dst in ("198.18.0.0/24", "198.18.2.0/24"):
        t.add_route("client", dst, tb.router4)
    for dst in ("2001:2::/64", "2001:2:0:2::/64"):
        t.add_route("client", dst, tb.router6)
    t.add_route("server", "198.18.1.0/24", "198.18.2.1")
    t.add_route("server", "2001:2:0:1::/64", "2001:2:0:2::1")
    tb.topo = t
    return tb


@dataclass(repr=False)
class UserSegment(_Built):
    """A client, a load balancer and backends on one bridge (in a `switch`
    namespace), the VIP an address of the LB's eth0 beside its own (.2 / ::2)."""

    topo: Topology
    backends: list
    client4: str = "198.18.9.10"
    client6: str = "2001:2:0:9::10"
    lb4: str = "198.18.9.2"
    lb6: str = "2001:2:0:9::2"
    vip4: str = "198.18.9.100"
    vip6: str = "2001:2:0:9::100"

    def backend4(self, i):
        return f"198.18.9.{11 + i}"

    def backend6(self, i):
        return f"2001:2:0:9::{11 + i:x}"


def user_segment(backends=2, dsr=False, vip_only=False) -> UserSegment:
    """dsr: the backends hold the VIPs on their loopback and neither answer ARP
    for it nor announce it (arp_ignore=1, arp_announce=2), as DSR needs.
    vip_only: the VIPs are the LB's only addresses, as the XDP load-balancer
    articles set it up (lb4 and lb6 unused)."""
    tb = UserSegment(None, [f"be{i + 1}" for i in range(backends)])
    t = Topology("useg", kernel_defaults=True)
    t.add_host("switch")
    t.add_host("client")
    t.add_host("lb")
    hosts = {
        "client": [f"{tb.client4}/24", f"{tb.client6}/64"],
        "lb": ([] if vip_only else [f"{tb.lb4}/24", f"{tb.lb6}/64"]) + [f"{tb.vip4}/24", f"{tb.vip6}/64"],
    }
    arp = {"net.ipv4.conf.all.arp_ignore": 1, "net.ipv4.conf.all.arp_announce": 2} if dsr else {}
    for i, be in enumerate(tb.backends):
        t.add_host(be, sysctls=arp)
        hosts[be] = [f"{tb.backend4(i)}/24", f"{tb.backend6(i)}/64"]
    for host, addrs in hosts.items():
        t.add_link(host, "switch", b_if=host, a_addrs=addrs, b_addrs=[])
    t.add_bridge("switch", "br0", list(hosts))
    if dsr:
        for be in tb.backends:
            t.add_address(be, "lo", f"{tb.vip4}/32")
            t.add_address(be, "lo", f"{tb.vip6}/128")
    tb.topo = t
    return tb


TESTBEDS = {1: testbed1, 2: testbed2, 3: testbed3}
