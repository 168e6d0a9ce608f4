"""ThroughputRig: a testbed made ready for load runs, the way this machine needs.

    >>> with ThroughputRig(testbeds.testbed2(), gen_cpu=0, dut_cpu=1) as rig:   # doctest: +SKIP
    ...     rig.run(generator, mirror, seconds=5)      # -> dict of measurements

What it sets up, and why (all inside lab namespaces):
- XDP sinks (ebpf.XdpSink) count frames where they arrive: a pass sink on the
  DUT's receiving veth (it still hands frames on to tc and the stack; a native
  XDP program is also what gives a veth the NAPI that the XDP generator's frames
  and threaded NAPI need), drop sinks on the monitor and, when the receiver is
  a separate host, on the receiver.
- Threaded NAPI on the DUT's receiving veth, its kthread pinned to `dut_cpu`,
  the generator pinned to `gen_cpu`: the device under test owns one core, and
  its busy time per packet is the cost we compare. Threaded NAPI is accounted
  as %sys, so compare busy time, not %soft.
- TSO off on every veth that forwards into a sink: veth hands an skb to the
  peer's NAPI only when TSO is off on the sending side; otherwise the receive
  work silently runs in the sender's context.
- When the DUT is the receiver (testbed 1), a UDP socket bound to the load's
  destination port that never reads: a receiving application that cannot keep
  up, so its queue fills and the kernel drops there. Without one, every frame
  costs the DUT an ICMP port-unreachable attempt (two route lookups and an xfrm
  lookup before the rate limit says no): about 800 ns/pkt at 64 B by perf, over
  a quarter of the DUT's time, the same for every mirror, which hid the
  differences between them (no mirror: 1773 ns/pkt before, 936 after).
"""

import os
import socket
import time
from pathlib import Path

from ebpf.xdp_sink import XdpSink

from . import netns
from .metrics import CpuSampler


def napi_threads():
    """{pid: comm} of every threaded-NAPI kthread ("napi/<dev>-<id>")."""
    found = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                comm = (p / "comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith("napi/"):
                found[int(p.name)] = comm
    return found


class ThroughputRig:
    def __init__(self, testbed, gen_cpu=0, dut_cpu=1, udp_port=5001, dut_sink=True):
        ncpu = os.cpu_count()
        if gen_cpu == dut_cpu or max(gen_cpu, dut_cpu) >= ncpu:
            raise ValueError(f"generator and DUT need two different CPUs of 0..{ncpu - 1}")
        self.tb, self.gen_cpu, self.dut_cpu = testbed, gen_cpu, dut_cpu
        self.sinks = {}
        self.napi_pids = []
        self.dut_ns = testbed.ns(testbed.tap_host)
        self.dut_iface = testbed.tap_iface
        self.udp_port = udp_port
        self.dut_sink = dut_sink  # count arrivals at the DUT with an XDP pass sink (see Peer.owns_dut_xdp)
        self.sockets = []

    # --- set-up ------------------------------------------------------------
    def __enter__(self):
        self.tb.__enter__()
        try:
            self._setup()
        except BaseException as e:
            self._close_after(e)
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            self.close()
        else:
            self._close_after(exc)
        return False

    def _close_after(self, exc):
        """close() while `exc` propagates: a failure to close is added to it as a
        note instead of replacing it."""
        try:
            self.close()
        except Exception as e:
            exc.add_note(str(e))

    def _setup(self):
        tb = self.tb
        # arrivals at the DUT: counted, then on to tc and the stack
        if self.dut_sink:
            self._sink("dut", "pass", self.dut_ns, self.dut_iface)
        if tb.receiver != tb.tap_host:
            self._sink("receiver", "drop", tb.ns(tb.receiver), tb.receiver_iface)
        self._sink("monitor", "drop", tb.ns(tb.monitor), tb.monitor_capture_iface)
        if tb.receiver == tb.tap_host:
            self._udp_sink(self.dut_ns)
        for link in tb.topo.links:
            for end in (link.a, link.b):
                if end.host == tb.tap_host and end.name != self.dut_iface:
                    netns.run(self.dut_ns, ["ethtool", "-K", end.name, "tso", "off"], capture_output=True)
        before = set(napi_threads())
        netns.run(self.dut_ns, ["sh", "-c", f"echo 1 > /sys/class/net/{self.dut_iface}/threaded"])
        deadline = time.monotonic() + 5
        while not self.napi_pids and time.monotonic() < deadline:
            self.napi_pids = sorted(set(napi_threads()) - before)
            time.sleep(0.02)
        if not self.napi_pids:
            raise netns.LabError(f"threaded NAPI on {self.dut_iface}: no napi kthread appeared")
        self.pin_napi(self.dut_cpu)

    def _sink(self, label, verdict, ns, ifname):
        s = XdpSink(verdict)
        self.sinks[label] = s  # registered first, so close() frees it even if attach fails
        s.attach(ifname, netns=ns)

    def _udp_sink(self, ns):
        with netns.entered(ns):
            for family, any_addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
                s = socket.socket(family, socket.SOCK_DGRAM)
                self.sockets.append(s)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's minimum
                s.bind((any_addr, self.udp_port))

    def pin_napi(self, cpu):
        for pid in self.napi_pids:
            os.sched_setaffinity(pid, {cpu})

    def close(self):
        """Free the sinks and the sockets, then tear the testbed down. Every step
        runs even when one before it fails (a sink left loaded, or a testbed left
        up, is worse than a late error); then one LabError lists what failed."""
        failed = []
        for label, s in self.sinks.items():
            try:
                s.close()
            except Exception as e:
                failed.append(f"{label} sink: {e}")
        self.sinks.clear()
        for s in self.sockets:
            try:
                s.close()
            except OSError as e:
                failed.append(f"UDP socket: {e}")
        self.sockets.clear()
        try:
            self.tb.__exit__(None, None, None)
        except Exception as e:
            failed.append(f"testbed: {e}")
        if failed:
            raise netns.LabError("closing the rig: " + "; ".join(failed))

    # --- one run -------------------------------------------------------------
    def run(self, generator, peer, seconds, count=None, rate_pps=None, settle=0.3):
        """One bounded load run with `peer` (lab.peers.Peer) doing the DUT's job.
        Returns raw measurements: the send report, each sink's counts, the CPU
        sampler, and how much each of the peer's counters grew."""
        lifted = self._lift_dut_sink() if peer.owns_dut_xdp else None
        try:
            peer.attach()
            try:
                if peer.takes_dut_core:
                    # the peer's process gets the DUT core to itself; the kernel's
                    # receive work moves to the generator's core for this run
                    self.pin_napi(self.gen_cpu)
                peer.ready()
                for s in self.sinks.values():
                    s.reset_counters()
                base = peer.counters()
                with CpuSampler(interval=1.0) as cpu:
                    report = generator.send(count=count, seconds=seconds, rate_pps=rate_pps)
                    time.sleep(settle)  # let queues drain into the sinks
                counts = {k: s.counters() for k, s in self.sinks.items()}
                grown = peer.counters()
            finally:
                if peer.takes_dut_core:
                    self.pin_napi(self.dut_cpu)
                peer.detach()
        finally:
            if lifted:
                self._sink("dut", "pass", self.dut_ns, self.dut_iface)
        return {"report": report, "counts": counts, "cpu": cpu,
                "mirrored": {k: v - base.get(k, 0) for k, v in grown.items() if isinstance(v, int)}}

    def _lift_dut_sink(self):
        """Take the counting sink off the DUT's interface, for a peer that puts its
        own XDP program there (it counts with its verdicts instead)."""
        sink = self.sinks.pop("dut", None)
        if sink is not None:
            sink.close()
        return sink is not None
