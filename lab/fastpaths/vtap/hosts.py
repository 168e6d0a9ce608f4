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
              from ready to stop (CPU, the mirror's counters, arrivals), detached;
              in Testbed 2 its bridge (made at prepare) forwards to the receiver
    receiver, monitor   a counting sink from ready to stop

Each also returns its host's CPU over its own window (`host_cpu`: busy, sys and soft
percent of all the host's cores), the bench's CPU per host.
"""

import os
import socket

from lab.bench import common
from lab.metrics import CpuSampler, host_cpu
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
        with CpuSampler(interval=0.1) as cpu:  # the host's CPU while it sends
            rep = gen.send(seconds=seconds, rate_pps=spec.get("rate_pps"))
        return {
            "host_cpu": host_cpu(cpu),
            "report": {
                "packets": rep.packets,
                "bytes": rep.bytes,
                "seconds": rep.seconds,
                "generator": rep.generator,
                "dropped": rep.dropped,
            },
        }
    finally:
        gen.close()


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
        [spec["monitor_iface"], *([spec["out_iface"]] if spec.get("out_iface") else [])],
        spec["port"] if spec.get("receiver_here") else None,  # Testbed 2: its bridge forwards them on
        match=match,
        window=True,  # the tap's own window: its sink's first and last frame, nothing polled
        cpu_interval=0.1,  # /proc/stat every 0.1 s: the CPU over that window, within 0.1 s each side
    )
    peer = None
    os.sched_setaffinity(0, {spec["gen_cpu"]})  # the runner itself stays off the DUT's core
    try:
        dut.set_up(held)
        peer = MIRRORS[spec["mirror"]](None, spec["iface"], spec["monitor_iface"], cpu=spec["dut_cpu"], **spec["kw"])
        dut.begin(peer)  # CPU sampled from here to end(), as in namespaces
        try:
            signals.ready()
            signals.wait("stop")
        finally:
            measured = dut.end()
        dut_counts = measured["counts"]["dut"]
        cpu = measured["cpu"]
        if dut_counts["first_s"] is not None:
            cpu = cpu.within(dut_counts["first_s"], dut_counts["last_s"])
        return {
            "counts": measured["counts"],
            "mirrored": measured["mirrored"],
            "cpu": cpu.summary().reset_index().to_dict("records"),
            "host_cpu": host_cpu(cpu),  # (already within the sink's window)
            "window_s": dut_counts["window_s"],
        }
    finally:
        if peer is not None:
            peer.close()
        dut.close()
        held.close()


def counting(spec, signals):
    match = (spec["src4"], spec["port"])
    side = CountingSide("drop", None, spec["iface"], match, window=True, mode=spec.get("xdp_mode", "native")).open()
    try:
        side.reset()
        with CpuSampler(interval=0.1) as cpu:
            signals.ready()
            signals.wait("stop")
        counted = side.counters()
        if counted["first_s"] is not None:
            cpu = cpu.within(counted["first_s"], counted["last_s"])
        return {"counts": {spec["role"]: counted}, "window_s": counted["window_s"], "host_cpu": host_cpu(cpu)}
    finally:
        side.close()


ROLES = {"sender": sender, "tap": tap, "receiver": counting, "monitor": counting}
