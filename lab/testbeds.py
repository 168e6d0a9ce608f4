"""The vTAP paper's testbeds (seed 003, Figure 4) as namespace topologies.

Testbed 1: the vTAP runs on the receiver.

    sender eth0 ---- eth0 receiver mon0 ---- eth0 monitor
                          (vTAP on eth0 ingress, clones out mon0)

Testbed 2: the vTAP runs on a separate node that bridges sender and receiver.

    sender eth0 ---- eth0 [br0] eth1 ---- eth0 receiver
                        tapnode mon0 ---- eth0 monitor
                        (vTAP on eth0 ingress, clones out mon0)

Sender and receiver share one segment, 198.18.1.0/24 and 2001:2:0:1::/64. Besides
its own .1/::1 the sender holds .10/::10 and .20/::20 so that tests can send from a
watched and an unwatched source; the receiver holds .2/::2 and .3/::3 likewise.
"""

from dataclasses import dataclass

from .topology import Topology

SENDER_V4 = ["198.18.1.1/24", "198.18.1.10/24", "198.18.1.20/24"]
SENDER_V6 = ["2001:2:0:1::1/64", "2001:2:0:1::10/64", "2001:2:0:1::20/64"]
RECEIVER_V4 = ["198.18.1.2/24", "198.18.1.3/24"]
RECEIVER_V6 = ["2001:2:0:1::2/64", "2001:2:0:1::3/64"]


def _ip(cidr):
    return cidr.split("/")[0]


@dataclass
class Testbed:
    topo: Topology
    number: int
    tap_host: str           # where the vTAP runs
    tap_iface: str          # the interface it taps
    tap_direction: str      # on which hook the traffic from sender to receiver passes
    monitor_iface: str      # the vTAP's --monitor, on tap_host
    sender: str = "sender"
    receiver: str = "receiver"
    monitor: str = "monitor"
    sender_iface: str = "eth0"
    receiver_iface: str = "eth0"
    monitor_capture_iface: str = "eth0"   # where copies arrive, on the monitor host
    bridge: tuple | None = None           # (name, ports) when the tap host bridges sender and receiver
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

    def __enter__(self):
        self.topo.build()
        return self

    def __exit__(self, *exc):
        self.topo.teardown()
        return False

    def ns(self, host):
        return self.topo.ns(host)

    @property
    def next_hop_mac(self):
        """Destination MAC for frames the sender crafts to the receiver."""
        return self.topo.mac(self.receiver, self.receiver_iface)

    @property
    def sender_mac(self):
        return self.topo.mac(self.sender, self.sender_iface)


def testbed1() -> Testbed:
    t = Topology("testbed1")
    for h in ("sender", "receiver", "monitor"):
        t.add_host(h)
    t.add_link("sender", "receiver", a_addrs=SENDER_V4 + SENDER_V6, b_addrs=RECEIVER_V4 + RECEIVER_V6)
    t.add_link("receiver", "monitor", a_if="mon0", a_addrs=[], b_addrs=[])
    return Testbed(t, 1, tap_host="receiver", tap_iface="eth0", tap_direction="ingress", monitor_iface="mon0")


def testbed2() -> Testbed:
    t = Topology("testbed2")
    for h in ("sender", "tapnode", "receiver", "monitor"):
        t.add_host(h)
    t.add_link("sender", "tapnode", a_addrs=SENDER_V4 + SENDER_V6, b_addrs=[])
    t.add_link("tapnode", "receiver", a_if="eth1", a_addrs=[], b_addrs=RECEIVER_V4 + RECEIVER_V6)
    t.add_bridge("tapnode", "br0", ["eth0", "eth1"])
    t.add_link("tapnode", "monitor", a_if="mon0", a_addrs=[], b_addrs=[])
    return Testbed(t, 2, tap_host="tapnode", tap_iface="eth0", tap_direction="ingress", monitor_iface="mon0",
                   bridge=("br0", ["eth0", "eth1"]))


def pair(a="a", b="b", name="pair") -> Topology:
    """Two hosts and one veth link (198.18.1.1 and .2): the smallest lab, for
    trying one program or one tool."""
    t = Topology(name)
    t.add_host(a)
    t.add_host(b)
    t.add_link(a, b)
    return t


TESTBEDS = {1: testbed1, 2: testbed2}
