"""The vTAP throughput bench's roles on a host (lab.hosts.runner runs one per host
per run): the same steps a namespace run takes (rig.CountingSide, rig.DutSide,
the bench's generator), in the host's own namespace, on the interfaces the
inventory names, counting only the lab's frames (UDP from the sender's test
address to the bench's port: a real NIC also receives LLDP and neighbour
discovery).

Each takes the run's spec and the runner's signals, and returns its result (JSON):

    sender    opens the generator (its program compiled), says ready, waits for go,
              sends for the run's seconds, returns the send report
    tap       the DUT: its sink and NAPI thread, the mirror attached and measured
              from ready to stop (CPU, the mirror's counters, arrivals), detached
    receiver, monitor   a counting sink from ready to stop
"""

import os
import socket
import time

from lab.bench import common
from lab.metrics import CpuSampler, read_proc_stat
from lab.rig import Rig
from lab.traffic import GENERATORS

from .peers import MIRRORS
from .rig import CountingSide, DutSide


def sender(spec, signals):
    frames = common.udp_frames(
        spec["src4"], spec["dst4"], spec["src_mac"], spec["dst_mac"], spec["size"], spec["flows"], dport=spec["port"]
    )
    gen = GENERATORS[spec["generator"]](None, spec["iface"], frames, cpu=spec["gen_cpu"])
    try:
        gen.open()
        signals.ready()
        if not signals.wait("go"):
            return {"report": None}
        # bounded twice: by the run's seconds, and by what is left of the runner's own deadline
        seconds = min(float(spec["duration"]), max(0.1, signals.seconds_left() - 2))
        rep = gen.send(seconds=seconds, rate_pps=spec.get("rate_pps"))
        return {
            "report": {
                "packets": rep.packets,
                "bytes": rep.bytes,
                "seconds": rep.seconds,
                "generator": rep.generator,
                "dropped": rep.dropped,
            }
        }
    finally:
        gen.close()


POLL = 0.005  # s between looks at a sink's count: the window's edges are this exact


class Window:
    """This host's own window of a run: from the last look before its first counted
    frame to the look after its last, found by reading its sink every POLL seconds
    (and /proc/stat with it, where the host is the DUT: its CPU over that window).
    Rates are taken over each host's own window: no clock is compared with another
    host's."""

    def __init__(self, packets, cpu=False):
        self.packets, self.cpu = packets, cpu
        self.first = self.last = None  # (time, proc stat) readings

    def _reading(self):
        return (time.monotonic(), read_proc_stat() if self.cpu else None)

    def watch(self, signals):
        """Until `stop` (or the runner's deadline)."""
        seen, before = self.packets(), self._reading()
        while not signals.poll("stop"):
            time.sleep(POLL)
            n, now = self.packets(), self._reading()
            if n != seen:
                self.first = self.first or before
                self.last = now
                seen = n
            before = now

    @property
    def seconds(self) -> float:
        return self.last[0] - self.first[0] if self.first else 0.0

    def sampler(self):
        return CpuSampler.of([self.first, self.last] if self.first else [])


class _Sockets:
    """What Rig.udp_sink() keeps its sockets in, for a runner that has no testbed."""

    def __init__(self):
        self.sockets: list[socket.socket] = []

    def udp_sink(self, ns, port):
        Rig.udp_sink(self, ns, port)

    def close(self):
        for s in self.sockets:
            s.close()


def tap(spec, signals):
    match = (spec["src4"], spec["port"])
    held = _Sockets()
    dut = DutSide(
        None,
        spec["iface"],
        spec["dut_cpu"],
        spec["gen_cpu"],
        [spec["monitor_iface"]],
        spec["port"] if spec.get("receiver_here") else None,
        match=match,
    )
    peer = None
    # this runner's own polling stays off the DUT's core
    os.sched_setaffinity(0, {spec["gen_cpu"]})
    try:
        dut.set_up(held)
        peer = MIRRORS[spec["mirror"]](None, spec["iface"], spec["monitor_iface"], cpu=spec["dut_cpu"], **spec["kw"])
        dut.begin(peer)
        window = Window(lambda: dut.counting.counters()["packets"], cpu=True)
        try:
            signals.ready()
            window.watch(signals)
        finally:
            measured = dut.end()
        cpu = window.sampler()
        return {
            "counts": measured["counts"],
            "mirrored": measured["mirrored"],
            "cpu": cpu.summary().reset_index().to_dict("records") if window.first else [],
            "window_s": window.seconds,
        }
    finally:
        if peer is not None:
            peer.close()
        dut.close()
        held.close()


def counting(spec, signals):
    side = CountingSide("drop", None, spec["iface"], (spec["src4"], spec["port"])).open()
    try:
        side.reset()
        window = Window(lambda: side.counters()["packets"])
        signals.ready()
        window.watch(signals)
        return {"counts": {spec["role"]: side.counters()}, "window_s": window.seconds}
    finally:
        side.close()


ROLES = {"sender": sender, "tap": tap, "receiver": counting, "monitor": counting}
