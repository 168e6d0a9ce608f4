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

from lab import netns
from lab.cgroups import SocketCgroup
from lab.testbeds import BuiltTestbed
from lab.topology import Topology

GATEWAY4, GATEWAY6 = "169.254.1.1", "fe80::1"
TUNNEL_DEV = "vxlan0"  # tunnel=True: each node's collect-metadata VXLAN device
VXLAN_PORT = 4789
TUNNEL_MTU = 1450  # 1500 less VXLAN over IPv4's 50 bytes of headers
ROUTE_PROTO = netns.LAB_ROUTE_PROTO  # the routes to other nodes' pods: a host's cleanup flushes these
HOST_LXC, HOST_TUNNEL_DEV = "vtl-lxc", "vtl-vxlan0"  # on a user's host: names no CNI's devices have
FLANNEL_DEV, BRIDGE = "flannel.1", "cni0"  # bridge-vxlan's devices on a node of namespaces (flannel's names)
HOST_FLANNEL_DEV, HOST_BRIDGE = "vtl-flannel", "vtl-cni0"  # and on a user's host (who may run flannel)
HOST_DEVICES = (HOST_TUNNEL_DEV, HOST_FLANNEL_DEV, HOST_BRIDGE)  # what a run may make in a host's namespace
NFT_TABLE, HOST_NFT_TABLE = "kube-proxy", "vtl-kube-proxy"  # legacy's services: kube-proxy's table, and on a host


@dataclass(repr=False)
class PodsTestbed(BuiltTestbed):
    topo: Topology
    nodes: list
    pods: dict  # node -> [pod hosts]
    tunnel: bool = False
    lxc: dict = field(default_factory=dict)  # pod host -> its host-side veth's name in its node
    cgroup: SocketCgroup | None = None
    local: list | None = None  # the nodes built here (None: all; on a user's host, its own)
    underlay: dict | None = None  # node -> (IPv4, IPv6) underlay addresses (None: 198.18.99.N, 2001:2:99::N)
    underlay_dev: dict = field(default_factory=dict)  # node -> its underlay interface (default eth0)
    tunnel_dev: str = TUNNEL_DEV
    flannel_dev: str = FLANNEL_DEV
    bridge_dev: str = BRIDGE
    nft_table: str = NFT_TABLE  # legacy's services (a host's own kube-proxy keeps its table)

    # the pods' addresses of every node (198.18.(100+i).0/24): kube-proxy's --cluster-cidr
    cluster_cidr4: str = "198.18.96.0/19"

    @property
    def local_nodes(self) -> list:
        """The nodes whose side is built in this process (the peers attach there)."""
        return list(self.nodes) if self.local is None else list(self.local)

    def underlay_of(self, node) -> str:
        return self.underlay_dev.get(node, "eth0")

    def in_cgroup(self) -> dict:
        """subprocess keywords that start a process in the testbed's cgroup (the
        services' cgroup programs see its sockets)."""
        return {"preexec_fn": self.cgroup.joiner()}

    def node_of(self, pod) -> str:
        return next(n for n, ps in self.pods.items() if pod in ps)

    def underlay4(self, node) -> str:
        if self.underlay:
            return self.underlay[node][0]
        return f"198.18.99.{self.nodes.index(node) + 1}"

    def underlay6(self, node) -> str:
        if self.underlay:
            return self.underlay[node][1]
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
        first = self.local_nodes[0]
        self.cgroup = SocketCgroup(f"{self.ns(self.pods[first][0])}.pods").create()
        for node in self.local_nodes:
            for pod in self.pods[node]:
                t.run(pod, ["ip", "route", "add", GATEWAY4, "dev", "eth0", "scope", "link"])
                t.run(pod, ["ip", "route", "add", "default", "via", GATEWAY4, "dev", "eth0"])
                t.run(pod, ["ip", "-6", "route", "add", "default", "via", GATEWAY6, "dev", "eth0"])
            self.route_pods(node)
            if self.tunnel:
                dev = self.tunnel_dev
                t.run(node, ["ip", "link", "add", dev, "type", "vxlan", "external", "dstport", str(VXLAN_PORT)])
                t.run(node, ["ip", "link", "set", dev, "up"])

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
            if t.hosts[node].own:  # a user's host keeps its own forwarding: IPv4's is per ingress device
                netns.sysctl(None, f"net.ipv4.conf.{lxc}.forwarding", 1)
            # a gateway's MAC from before (a bridge's), and what redirects taught the pod
            t.run(pod, ["ip", "neigh", "flush", "dev", "eth0"])
            t.run(pod, ["ip", "route", "flush", "cache"])
            t.run(pod, ["ip", "-6", "route", "flush", "cache"])
        dev, proto = self.underlay_of(node), str(ROUTE_PROTO)
        for other in self.nodes:
            if other != node:
                t.run(
                    node,
                    ["ip", "route", "replace", self.prefix4(other), "via", self.underlay4(other), "dev", dev]
                    + ["proto", proto],
                )
                t.run(
                    node,
                    ["ip", "-6", "route", "replace", self.prefix6(other), "via", self.underlay6(other)]
                    + ["dev", dev, "proto", proto],
                )

    def release(self):
        try:
            for node in self.local_nodes:
                if self.topo.hosts[node].own:  # the host's own namespace stays: what the lab made there goes
                    self._unroute(node)
        finally:
            if self.cgroup is not None:
                self.cgroup.remove()

    def _unroute(self, node):
        t, dev = self.topo, self.underlay_of(node)
        for family in ("-4", "-6"):
            t.run(
                node,
                ["ip", family, "route", "flush", "dev", dev, "proto", str(ROUTE_PROTO)],
                check=False,
                capture_output=True,
            )
        if self.tunnel:
            t.run(node, ["ip", "link", "del", self.tunnel_dev], check=False, capture_output=True)


def pods_testbed(
    pods_per_node=2, tunnel=False, kernel_defaults=False, nodes=2, local=None, underlay=None, underlay_dev=None
) -> PodsTestbed:
    """Two (or `nodes`) nodes of pods in namespaces of their own, joined by a veth
    underlay; with `local` (a node's name, on a user's host), that node's side only, in
    the host's own namespace, on `underlay_dev` with `underlay`'s addresses (the
    module's docstring)."""
    if local is None and nodes != 2:
        raise ValueError("a testbed of namespaces has two nodes (on hosts: as many as the inventory's nodes)")
    names = [f"n{i}" for i in range(nodes)]
    pods = {n: [f"p{i}{j}" for j in range(pods_per_node)] for i, n in enumerate(names)}
    tb = PodsTestbed(None, names, pods, tunnel, local=None if local is None else [local], underlay=underlay)
    t = Topology("pods", kernel_defaults=kernel_defaults)
    mtu = TUNNEL_MTU if tunnel else 1500
    if local is not None:
        tb.underlay_dev = {local: underlay_dev}
        tb.tunnel_dev, tb.flannel_dev, tb.bridge_dev = HOST_TUNNEL_DEV, HOST_FLANNEL_DEV, HOST_BRIDGE
        tb.nft_table = HOST_NFT_TABLE
        t.add_host(local, own=True)
    else:
        for node in names:
            t.add_host(node, forwarding=True)
    for node in tb.local_nodes:
        for j, pod in enumerate(pods[node]):
            t.add_host(pod)
            tb.lxc[pod] = f"{HOST_LXC if local is not None else 'lxc'}{j}"
            # the pod's addresses are set after the build: a /32 and /128 with no on-link prefix
            t.add_link(node, pod, a_if=tb.lxc[pod], a_addrs=[], b_addrs=[], mtu=mtu)
    if local is None:
        for a, b in zip(names, names[1:], strict=False):  # (two nodes: one veth between them)
            t.add_link(
                a,
                b,
                a_addrs=[f"{tb.underlay4(a)}/24", f"{tb.underlay6(a)}/64"],
                b_addrs=[f"{tb.underlay4(b)}/24", f"{tb.underlay6(b)}/64"],
            )
    for node in tb.local_nodes:
        for pod in pods[node]:
            t.add_address(pod, "eth0", f"{tb.pod4(pod)}/32")
            t.add_address(pod, "eth0", f"{tb.pod6(pod)}/128")
    tb.topo = t
    return tb
