"""The load balancer's testbeds: the XDP load-balancer articles' one-armed
segment (lb_testbed: a client, the LB and backends on one bridge, for the
benches and tests), and one as users build it (user_segment, with the kernel's
defaults)."""

from dataclasses import dataclass

from lab.testbeds import BuiltTestbed
from lab.topology import Topology


@dataclass(repr=False)
class LbTestbed(BuiltTestbed):
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
    """dsr: the backends hold the VIPs on their loopback, to answer clients directly,
    and do not answer ARP for them.
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
    # dsr: the backends must not answer the clients' ARP for the VIP they hold (the LB does)
    arp = {"net.ipv4.conf.all.arp_ignore": 1, "net.ipv4.conf.all.arp_announce": 2} if dsr else {}
    for i, be in enumerate(tb.backends):
        t.add_host(be, sysctls=arp)
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


@dataclass(repr=False)
class UserSegment(BuiltTestbed):
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
