"""Ways to connect pods on the two-node testbed (lab.fastpaths.pods.testbed), behind
lab.peer.Peer, each built on the testbed the bench hands it:

    host    node to node, no pods between: the limit
    legacy  the kernel routes the pods' traffic (the testbed's routes, forwarding on):
            Cilium's "legacy host routing"
    ebpf    ebpf.TcPods, native routing: into a pod by its veth's peer, to another
            node's pods by the FIB
    ebpf-vxlan  ebpf.TcPods, tunnel mode: to another node's pods through a
            collect-metadata VXLAN device it makes on each node (pods_vxlan)

Still to come: bridge-vxlan (pods on a Linux bridge, a kernel VXLAN
device between the nodes: flannel's shape) and the services of each.
"""

import contextlib

from ebpf.pods.tc_pods import TcPods
from lab.peer import Peer

TUNNEL_DEV = "pods_vxlan"


class PodPeer(Peer):
    name = "legacy"
    kind = "pods"
    colour = "#E69F00"

    def __init__(self, tb, mode=None):
        super().__init__(mode)
        self.tb = tb


class Host(PodPeer):
    name = "host"
    colour = "#555555"  # the limit: no pods at all


class Legacy(PodPeer):
    """Nothing to attach: the testbed's routes are how the kernel carries pod traffic."""


class Ebpf(PodPeer):
    name = "ebpf"
    colour = "#0072B2"
    tunnel = False

    def attach(self):
        self.progs = {}
        try:
            for node in self.tb.nodes:
                self.progs[node] = self._datapath(node)
        except BaseException:
            self.detach()
            raise
        self.attached = True

    def _datapath(self, node):
        tb = self.tb
        kw = dict(mode="tunnel", tunnel=TUNNEL_DEV, vni=1) if self.tunnel else {}
        p = TcPods(netns=tb.ns(node), **kw)
        for pod in tb.pods[node]:
            p.add_pod(tb.lxc[pod], [tb.pod4(pod), tb.pod6(pod)], mac=tb.topo.mac(pod, "eth0"))
        for other in tb.nodes:
            if other != node:
                for prefix in (tb.prefix4(other), tb.prefix6(other)):
                    p.add_remote(prefix, tb.underlay4(other) if self.tunnel else None)
        p.load_program()
        for pod in tb.pods[node]:
            p.attach_pod(tb.lxc[pod])
        p.attach_node("eth0")
        if self.tunnel:
            p.attach_node(TUNNEL_DEV)
        return p

    def counters(self):
        out = {}
        for p in getattr(self, "progs", {}).values():
            for k, v in p.counters().items():
                out[k] = out.get(k, 0) + v
        return out

    def detach(self):
        for p in getattr(self, "progs", {}).values():
            p.close()
        self.progs = {}
        self.attached = False


class EbpfVxlan(Ebpf):
    name = "ebpf-vxlan"
    colour = "#56B4E9"
    tunnel = True

    def _datapath(self, node):
        t = self.tb.topo
        t.run(node, ["ip", "link", "add", TUNNEL_DEV, "type", "vxlan", "external", "dstport", "4789"])
        t.run(node, ["ip", "link", "set", TUNNEL_DEV, "up"])
        return super()._datapath(node)

    def detach(self):
        super().detach()
        for node in self.tb.nodes:
            with contextlib.suppress(Exception):
                self.tb.topo.run(node, ["ip", "link", "del", TUNNEL_DEV], capture_output=True)


PEERS = {cls.name: cls for cls in (Host, Legacy, Ebpf, EbpfVxlan)}
