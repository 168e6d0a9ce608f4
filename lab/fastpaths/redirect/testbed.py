"""The redirect's testbeds: the router of the student report on netfilter vs XDP
(router_testbed, for the benches and tests), and a router as users build one
(user_router, with the kernel's defaults)."""

from dataclasses import dataclass

from ebpf.instruments.xdp_sink import XdpSink
from lab.testbeds import BuiltTestbed
from lab.topology import Topology


@dataclass(repr=False)
class RouterTestbed(BuiltTestbed):
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


# --- as users build them -----------------------------------------------------------
# Plain topologies with the kernel's defaults (Topology(kernel_defaults=True)):
# neighbours resolved on demand, TX checksum offload and GRO as a veth comes, no
# XDP program anywhere the lab did not put one, forwarding off but on a router a
# user built as one. What the fast paths need beyond that, their commands check
# and say; the tests run what they print.


@dataclass(repr=False)
class UserRouter(BuiltTestbed):
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
