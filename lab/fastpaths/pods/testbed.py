"""Two nodes of pods, built the way a CNI builds them (Calico's and Cilium's shape):

    pod p00 eth0 --- lxc0 [node n0] eth0 --- underlay --- eth0 [node n1] lxc0 --- eth0 pod p10
    pod p01 eth0 --- lxc1                                                 lxc1 --- eth0 pod p11

- a pod is a namespace; its eth0 is a veth whose other end (lxcJ) stays in the node;
- the pod holds one /32 and one /128 (node i's pods: 198.18.(100+i).(j+1),
  2001:2:(100+i)::(j+1)); its default route goes via 169.254.1.1 and fe80::1 on eth0,
  which are its host-side veth's own addresses (every pod's veth has the same two, as
  every Cilium pod's gateway is the node's one router address), so the node answers
  the pod's ARP and neighbour solicitations for its gateway itself;
- the node routes to each pod through its veth (a host route) and to the other node's
  pod prefix (198.18.(100+i).0/24, 2001:2:(100+i)::/64) via that node's underlay address
  (native routing), forwarding on;
- tunnel=True: each node also has a collect-metadata VXLAN device, vxlan0, and the
  pods' MTU leaves room for its 50 bytes (1450);
- a cgroup v2 directory of its own (tb.cgroup, made on build, removed on close):
  processes started with tb.in_cgroup() among their keywords (topo.run(pod, argv,
  **tb.in_cgroup())) have their sockets seen by the services' cgroup programs (as
  every process of a Kubernetes node is under the root Cilium attaches to); all
  others are translated per packet.
"""

from dataclasses import dataclass, field

from lab.cgroups import SocketCgroup
from lab.testbeds import BuiltTestbed
from lab.topology import Topology

GATEWAY4, GATEWAY6 = "169.254.1.1", "fe80::1"
TUNNEL_DEV = "vxlan0"  # tunnel=True: each node's collect-metadata VXLAN device
VXLAN_PORT = 4789
TUNNEL_MTU = 1450  # 1500 less VXLAN over IPv4's 50 bytes of headers


@dataclass(repr=False)
class PodsTestbed(BuiltTestbed):
    topo: Topology
    nodes: list
    pods: dict  # node -> [pod hosts]
    tunnel: bool = False
    lxc: dict = field(default_factory=dict)  # pod host -> its host-side veth's name in its node
    cgroup: SocketCgroup | None = None

    def in_cgroup(self) -> dict:
        """subprocess keywords that start a process in the testbed's cgroup (the
        services' cgroup programs see its sockets)."""
        return {"preexec_fn": self.cgroup.joiner()}

    def node_of(self, pod) -> str:
        return next(n for n, ps in self.pods.items() if pod in ps)

    def underlay4(self, node) -> str:
        return f"198.18.99.{self.nodes.index(node) + 1}"

    def underlay6(self, node) -> str:
        return f"2001:2:99::{self.nodes.index(node) + 1:x}"

    def pod4(self, pod) -> str:
        node = self.node_of(pod)
        return f"198.18.{100 + self.nodes.index(node)}.{self.pods[node].index(pod) + 1}"

    def pod6(self, pod) -> str:
        node = self.node_of(pod)
        return f"2001:2:{100 + self.nodes.index(node)}::{self.pods[node].index(pod) + 1:x}"

    def prefix4(self, node) -> str:
        return f"198.18.{100 + self.nodes.index(node)}.0/24"

    def prefix6(self, node) -> str:
        return f"2001:2:{100 + self.nodes.index(node)}::/64"

    def prepare(self):
        t = self.topo
        # named for a namespace of the run: lab cleanup removes it once that is gone
        self.cgroup = SocketCgroup(f"{self.ns(self.nodes[0])}.pods").create()
        for node in self.nodes:
            for pod in self.pods[node]:
                t.run(pod, ["ip", "route", "add", GATEWAY4, "dev", "eth0", "scope", "link"])
                t.run(pod, ["ip", "route", "add", "default", "via", GATEWAY4, "dev", "eth0"])
                t.run(pod, ["ip", "-6", "route", "add", "default", "via", GATEWAY6, "dev", "eth0"])
            self.route_pods(node)
            if self.tunnel:
                t.run(node, ["ip", "link", "add", TUNNEL_DEV, "type", "vxlan", "external", "dstport", str(VXLAN_PORT)])
                t.run(node, ["ip", "link", "set", TUNNEL_DEV, "up"])

    def route_pods(self, node):
        """A node's side as a CNI leaves it: each pod's veth holds the gateway addresses
        and the route to the pod; the other node's prefixes via its underlay address.
        Again on a node that has them: each is put back as it was (a peer that rebuilt
        the node, bridge-vxlan, restores the testbed with it)."""
        t = self.topo
        for pod in self.pods[node]:
            lxc = self.lxc[pod]
            t.run(node, ["ip", "addr", "replace", f"{GATEWAY4}/32", "dev", lxc])
            t.run(node, ["ip", "addr", "replace", f"{GATEWAY6}/64", "dev", lxc, "nodad"])
            t.run(node, ["ip", "route", "replace", f"{self.pod4(pod)}/32", "dev", lxc])
            t.run(node, ["ip", "-6", "route", "replace", f"{self.pod6(pod)}/128", "dev", lxc])
            # a gateway's MAC from before (a bridge's), and what redirects taught the pod
            t.run(pod, ["ip", "neigh", "flush", "dev", "eth0"])
            t.run(pod, ["ip", "route", "flush", "cache"])
            t.run(pod, ["ip", "-6", "route", "flush", "cache"])
        for other in self.nodes:
            if other != node:
                t.run(node, ["ip", "route", "replace", self.prefix4(other), "via", self.underlay4(other)])
                t.run(node, ["ip", "-6", "route", "replace", self.prefix6(other), "via", self.underlay6(other)])

    def release(self):
        if self.cgroup is not None:
            self.cgroup.remove()


def pods_testbed(pods_per_node=2, tunnel=False, kernel_defaults=False) -> PodsTestbed:
    nodes = ["n0", "n1"]
    pods = {n: [f"p{i}{j}" for j in range(pods_per_node)] for i, n in enumerate(nodes)}
    tb = PodsTestbed(None, nodes, pods, tunnel)
    t = Topology("pods", kernel_defaults=kernel_defaults)
    for node in nodes:
        t.add_host(node, forwarding=True)
    mtu = TUNNEL_MTU if tunnel else 1500
    for node in nodes:
        for j, pod in enumerate(pods[node]):
            t.add_host(pod)
            tb.lxc[pod] = f"lxc{j}"
            # the pod's addresses are set after the build: a /32 and /128 with no on-link prefix
            t.add_link(node, pod, a_if=f"lxc{j}", a_addrs=[], b_addrs=[], mtu=mtu)
    t.add_link(
        nodes[0],
        nodes[1],
        a_addrs=[f"{tb.underlay4(nodes[0])}/24", f"{tb.underlay6(nodes[0])}/64"],
        b_addrs=[f"{tb.underlay4(nodes[1])}/24", f"{tb.underlay6(nodes[1])}/64"],
    )
    for node in nodes:
        for pod in pods[node]:
            t.add_address(pod, "eth0", f"{tb.pod4(pod)}/32")
            t.add_address(pod, "eth0", f"{tb.pod6(pod)}/128")
    tb.topo = t
    return tb
