"""XdpGen: the lab's own packet generator (xdp_gen.bpf.c) driven by BPF_PROG_TEST_RUN.

    >>> with XdpGen() as gen:                                        # doctest: +SKIP
    ...     frames = gen.frames([frame_bytes], ingress_ifindex)      # in the sender's netns
    ...     frames[0].run(64)                                        # 64 copies onto the wire
    ...     gen.counters()
    {'packets': 64, 'bytes': ...}

The program returns XDP_TX, which BPF_PROG_TEST_RUN with live frames turns into
a transmit on the context's ingress device. On veth the peer must have NAPI
(a native XDP program, or GRO) or the frames are dropped. Attach the program
natively to some idle device while generating (attach_xdp): otherwise every
call pays an RCU grace period to add it to the XDP dispatcher and remove it. Pacing, flow mixing
and namespaces are the caller's business (lab.traffic.XdpGenerator).
"""

from .program import BpfProgram
from .testrun import LiveFrames


class XdpGen(BpfProgram):
    SOURCE = "xdp_gen.bpf.c"
    FUNCTION = "xdp_gen"

    def frames(self, frames, ingress_ifindex, batch_size=0) -> list:
        """One LiveFrames per frame; ingress_ifindex is resolved in the namespace
        of the thread that later calls run()."""
        fd = self.load(self.FUNCTION, "XDP").fd
        return [LiveFrames(fd, f, ingress_ifindex, batch_size) for f in frames]

    def counters(self) -> dict:
        return self.percpu_totals("stats")

    def reset_counters(self):
        self.zero_percpu("stats")
