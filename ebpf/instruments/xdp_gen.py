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

The program writes each frame over its page on every run (the C says why), from
a map that frames() fills: at most `max_frames` frames of at most `max_len` bytes.
"""

import ctypes

from ebpf.errors import InputError
from ebpf.program import BpfProgram
from ebpf.testrun import LiveFrames, libbpf


class XdpGen(BpfProgram):
    SOURCE = "xdp_gen.bpf.c"
    FUNCTION = "xdp_gen"

    def __init__(self, max_frames=1024, max_len=1536, source=None):
        self.max_frames, self.max_len = int(max_frames), -(-int(max_len) // 8) * 8
        super().__init__([f"-DGEN_MAX_FRAMES={self.max_frames}", f"-DGEN_MAX_LEN={self.max_len}"], source)

    def frames(self, frames, ingress_ifindex, batch_size=0) -> list:
        """One GenFrames per frame; ingress_ifindex is resolved in the namespace
        of the thread that later calls run()."""
        if len(frames) > self.max_frames or any(not 0 < len(f) <= self.max_len for f in frames):
            raise InputError(f"the generator was built for {self.max_frames} frames of 1..{self.max_len} bytes")
        fd = self.load(self.FUNCTION, "XDP").fd
        table = self.table("frames")
        for i, f in enumerate(frames):
            v = table.Leaf()
            v.len = len(f)
            ctypes.memmove(v.data, f, len(f))
            table[table.Key(i)] = v
        current = self.table("current").map_fd
        return [GenFrames(fd, f, ingress_ifindex, batch_size, current, i) for i, f in enumerate(frames)]

    def counters(self) -> dict:
        return self.percpu_totals("stats")

    def reset_counters(self):
        self.zero_percpu("stats")


class GenFrames(LiveFrames):
    """LiveFrames that first tell the program which stored frame to write (one
    map update, a syscall of about a microsecond, per burst)."""

    def __init__(self, prog_fd, frame, ingress_ifindex, batch_size, current_fd, index):
        super().__init__(prog_fd, frame, ingress_ifindex, batch_size)
        self._current_fd = current_fd
        self._key = ctypes.c_uint32(0)
        self._index = ctypes.c_uint32(index)
        self._update = libbpf().bpf_map_update_elem

    def run(self, repeat: int):
        if self._update(self._current_fd, ctypes.byref(self._key), ctypes.byref(self._index), 0) != 0:
            raise OSError(ctypes.get_errno(), "the generator's frame index")
        super().run(repeat)
