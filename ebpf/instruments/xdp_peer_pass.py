"""XdpPeerPass: a native XDP program that passes everything, for a veth peer
(xdp_peer_pass.bpf.c says why a veth needs one to receive XDP frames).

    >>> with XdpPeerPass() as p:                       # doctest: +SKIP
    ...     p.attach("sw-lb", netns="/run/netns/sw")
"""

from ebpf import xdp
from ebpf.program import BpfProgram


class XdpPeerPass(BpfProgram):
    SOURCE = "xdp_peer_pass.bpf.c"
    FUNCTION = "xdp_peer_pass"

    def attach(self, ifname, netns=None):
        return self.attach_xdp(self.FUNCTION, ifname, netns, "native")

    @classmethod
    def cleanup(cls, netns=None, spare_live=True):
        """Remove the ones a killed run left in that namespace (see xdp.cleanup)."""
        return xdp.cleanup(cls.FUNCTION, netns, spare_live)
