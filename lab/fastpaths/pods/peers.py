"""Ways to connect pods on the two-node testbed (lab.fastpaths.pods.testbed), behind
lab.peer.Peer, each built on the testbed the bench hands it:

    host    node to node, no pods between: the limit
    legacy  the kernel routes the pods' traffic (the testbed's routes, forwarding on):
            Cilium's "legacy host routing"
    ebpf    ebpf.TcPods, native routing: into a pod by its veth's peer, to another
            node's pods by the FIB
    ebpf-vxlan  ebpf.TcPods, tunnel mode: to another node's pods through the
            testbed's collect-metadata VXLAN device (pods_testbed(tunnel=True), whose
            pods' MTU leaves room for VXLAN's 50 bytes)

Still to come: bridge-vxlan (pods on a Linux bridge, a kernel VXLAN
device between the nodes: flannel's shape) and the services of each.
"""

from ebpf.pods.tc_pods import TcPods
from lab.fastpaths.pods.testbed import TUNNEL_DEV
from lab.netns import LabError
from lab.peer import Peer


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
    tunnel_dev = None

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
        kw = dict(mode="tunnel", tunnel=self.tunnel_dev, vni=1) if self.tunnel else {}
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
            p.attach_node(self.tunnel_dev)
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
    tunnel_dev = TUNNEL_DEV

    def attach(self):
        if not self.tb.tunnel:
            raise LabError(
                "ebpf-vxlan runs on a testbed with a VXLAN device and room for its headers: pods_testbed(tunnel=True)"
            )
        super().attach()


PEERS = {cls.name: cls for cls in (Host, Legacy, Ebpf, EbpfVxlan)}
