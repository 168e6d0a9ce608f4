"""XdpGenerator: line-rate frames from the lab's own XDP program (ebpf.XdpGen).

    >>> with XdpGenerator(ns, "eth0", frames, cpu=0) as gen:   # doctest: +SKIP
    ...     gen.send(seconds=5)                     # the ceiling, for 5 s
    ...     gen.send(count=100_000, rate_pps=50_000, seconds=10)   # paced

The frames (scapy bytes, any protocol and size) are pushed through
BPF_PROG_TEST_RUN with live frames: each run() hands `burst` copies of one frame
to the veth in one syscall, and the frames take turns burst by burst, so several
flows interleave. In paced mode bursts shrink so that they are at most a
millisecond's worth, and the sender sleeps until each burst is due.

Each BPF_PROG_TEST_RUN call of an XDP program with repeat > 1 adds the program
to the kernel's XDP dispatcher and removes it again, and each change waits for
an RCU grace period: about 30 ms per call here, which capped the generator at
40 kpps. A program already attached to a device natively stays in the
dispatcher, so the generator attaches it to a veth pair of its own (HOLDER,
down, in the sender's namespace) for its lifetime: a call then costs about
20 us and bursts of 1024 frames reach 5+ Mpps.

The sending thread enters the namespace (the kernel resolves the ingress device
there) and is pinned to `cpu`, so the device under test can own the other core.
The receiving veth must have NAPI: a native XDP program or GRO on.
"""

import os
import secrets
import time

from ebpf.instruments.xdp_gen import XdpGen

from .. import netns
from .generator import Generator

CEILING_BURST = 4096
PACED_GRACE = 0.1  # a paced run may send its last packets this share of its seconds late (see _send)
HOLDER_PREFIX = "xgen"  # the veth pair that keeps the program in the XDP dispatcher: xgen<id>a/b


class XdpGenerator(Generator):
    name = "xdp"

    def __init__(self, ns, ifname, frames, cpu=None, burst=CEILING_BURST):
        super().__init__(ns, ifname, frames, cpu)
        self.burst = burst
        self._prog = XdpGen(max_frames=max(1, len(self.frames)), max_len=max(map(len, self.frames), default=64))
        self._live = None
        self._holder = None
        self.started = None  # CLOCK_MONOTONIC when the last send began (a test holds the sender in its clock)

    def _open(self):
        holder = f"{HOLDER_PREFIX}{secrets.token_hex(3)}"
        with netns.ipr(self.ns) as ip:
            ip.link("add", ifname=holder + "a", kind="veth", peer=holder + "b")
            ingress = ip.link_lookup(ifname=self.ifname)[0]
        self._holder = holder + "a"
        self._prog.attach_xdp(self._prog.FUNCTION, self._holder, self.ns)
        self._live = self._prog.frames(self.frames, ingress)

    def _close(self):
        try:
            self._prog.close()
        finally:
            if self._holder and netns.exists(self.ns):
                with netns.ipr(self.ns) as ip:
                    for idx in ip.link_lookup(ifname=self._holder):
                        ip.link("del", index=idx)  # its peer goes with it
            self._holder = None

    def _send(self, limit, seconds, rate_pps):
        burst = self.burst
        if rate_pps:
            burst = max(1, min(burst, int(rate_pps / 1000)))
        live = self._live
        saved = os.sched_getaffinity(0)
        sent = nbytes = i = 0
        try:
            if self.cpu is not None:
                os.sched_setaffinity(0, {self.cpu})  # this thread only
            with netns.entered(self.ns):
                start = self.started = time.monotonic()
                deadline = start + seconds
                if rate_pps:
                    # Paced, a run offers rate x seconds packets and never early. A sender
                    # the machine held up sends its last ones a little late (up to
                    # PACED_GRACE of the run) instead of stopping a burst short, so a run
                    # sends the same count however the VM scheduled it; the report's
                    # seconds say how long it took.
                    limit = min(limit, max(1, round(rate_pps * seconds)))
                    deadline = start + seconds * (1 + PACED_GRACE)
                now = start
                while sent < limit and now < deadline:
                    lf = live[i % len(live)]
                    n = min(burst, limit - sent)
                    lf.run(n)
                    sent += n
                    nbytes += n * len(lf.frame)
                    i += 1
                    now = time.monotonic()
                    if rate_pps:
                        due = start + sent / rate_pps
                        if due > now:
                            time.sleep(min(due - now, max(0.0, deadline - now)))
                            now = time.monotonic()
                seconds_sent = now - start
        finally:
            os.sched_setaffinity(0, saved)
        return sent, nbytes, seconds_sent
