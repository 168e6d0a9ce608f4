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

A kernel may refuse live-frame test runs to a root that lacks a capability
(EPERM, on a VM whose root had every capability but CAP_SYS_RESOURCE) while it
runs every other test run. The generator then hands the same frames, burst by
burst and paced alike, to the same device through an AF_PACKET socket that
bypasses the qdisc (pktsend.c, sendmmsg): `path` says which, the run says it
once on stderr, and a bench's sidecar records it. Those frames reach the peer as
skbs (no NAPI needed there) and cost the sender a copy each: a rate is
comparable only with a rate sent the same way.
"""

import ctypes
import functools
import os
import secrets
import time
from pathlib import Path

from ebpf import ctools
from ebpf.errors import BpfError
from ebpf.instruments.xdp_gen import XdpGen
from ebpf.testrun import live_frames_refusal

from .. import netns
from ..console import warn
from .generator import Generator

CEILING_BURST = 4096
PACED_GRACE = 0.1  # a paced run may send its last packets this share of its seconds late (see _send)
HOLDER_PREFIX = "xgen"  # the veth pair that keeps the program in the XDP dispatcher: xgen<id>a/b
LIVE, PACKET = "live frames", "AF_PACKET"


def generator_path():
    """How the XDP generator sends on this kernel: LIVE, or PACKET with the reason."""
    why = live_frames_refusal()
    return LIVE if why is None else f"{PACKET} (live frames refused: {why})"


@functools.cache
def _pktsend():
    try:
        built = ctools.build(Path(__file__).with_name("pktsend.c"), "the generator's sender", shared=True)
        so = ctypes.CDLL(str(built))
    except BpfError as e:
        raise netns.LabError(str(e)) from None
    so.pktsend_open.argtypes = [ctypes.c_int]
    so.pktsend_send.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint, ctypes.c_long]
    so.pktsend_send.restype = ctypes.c_long
    return so


@functools.cache
def _say_path(why):
    warn(f"this kernel refuses live-frame test runs ({why}): the XDP generator sends through AF_PACKET instead")


class PacketFrames:
    """One frame and an AF_PACKET socket on the device: run(n) hands it n copies
    (the live path's GenFrames.run, the other way out)."""

    def __init__(self, fd, frame):
        self.fd, self.frame = fd, frame
        self._send = _pktsend().pktsend_send

    def run(self, repeat):
        r = self._send(self.fd, self.frame, len(self.frame), repeat)
        if r < 0:
            raise netns.LabError(f"sending on an AF_PACKET socket: {os.strerror(-r)}")


class XdpGenerator(Generator):
    name = "xdp"

    def __init__(self, ns, ifname, frames, cpu=None, burst=CEILING_BURST, path=None):
        """path: None (live frames where the kernel runs them, else AF_PACKET) or PACKET."""
        if path not in (None, PACKET):
            raise ValueError(f"path: None or {PACKET!r}")
        super().__init__(ns, ifname, frames, cpu)
        self._want = path
        self.burst = burst
        self._prog = XdpGen(max_frames=max(1, len(self.frames)), max_len=max(map(len, self.frames), default=64))
        self._live = None
        self._holder = None
        self._sock = None
        self.path = None  # LIVE or PACKET, once open
        self.started = None  # CLOCK_MONOTONIC when the last send began (a test holds the sender in its clock)

    def _open(self):
        why = None if self._want == PACKET else live_frames_refusal()
        if why is not None or self._want == PACKET:
            if why is not None:
                _say_path(why)
            self.path = PACKET
            with netns.ipr(self.ns) as ip:
                ifindex = ip.link_lookup(ifname=self.ifname)[0]
            with netns.entered(self.ns):  # the socket binds to the device of its namespace
                fd = _pktsend().pktsend_open(ifindex)
            if fd < 0:
                raise netns.LabError(f"an AF_PACKET socket on {self.ifname}: {os.strerror(-fd)}")
            self._sock = fd
            self._live = [PacketFrames(fd, f) for f in self.frames]
            return
        self.path = LIVE
        holder = f"{HOLDER_PREFIX}{secrets.token_hex(3)}"
        with netns.ipr(self.ns) as ip:
            ip.link("add", ifname=holder + "a", kind="veth", peer=holder + "b")
            ingress = ip.link_lookup(ifname=self.ifname)[0]
        self._holder = holder + "a"
        self._prog.attach_xdp(self._prog.FUNCTION, self._holder, self.ns)
        self._live = self._prog.frames(self.frames, ingress)

    def _close(self):
        if self._sock is not None:
            os.close(self._sock)
            self._sock = None
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
