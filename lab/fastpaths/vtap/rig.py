"""ThroughputRig: the vTAP's testbeds made ready for load runs (a lab.rig.Rig).

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
  destination port that never reads (Rig.udp_sink): without it, ICMP errors
  were over a quarter of the DUT's time, the same for every mirror, which hid
  the differences between them (no mirror: 1773 ns/pkt before, 936 after).
"""

import os
import time

from ebpf.instruments.xdp_sink import XdpSink
from lab import netns
from lab.metrics import CpuSampler, threaded_napi
from lab.rig import Rig


class ThroughputRig(Rig):
    def __init__(self, testbed, gen_cpu=0, dut_cpu=1, udp_port=5001, dut_sink=True):
        super().__init__(testbed, gen_cpu, dut_cpu)
        self.sinks = {}
        self.napi_pids = []
        self.dut_ns = testbed.ns(testbed.tap_host)
        self.dut_iface = testbed.tap_iface
        self.udp_port = udp_port
        self.dut_sink = dut_sink  # count arrivals at the DUT with an XDP pass sink (see Peer.owns_dut_xdp)

    # --- set-up ------------------------------------------------------------
    def set_up(self):
        tb = self.tb
        # arrivals at the DUT: counted, then on to tc and the stack
        if self.dut_sink:
            self._sink("dut", "pass", self.dut_ns, self.dut_iface)
        if tb.receiver != tb.tap_host:
            self._sink("receiver", "drop", tb.ns(tb.receiver), tb.receiver_iface)
        self._sink("monitor", "drop", tb.ns(tb.monitor), tb.monitor_capture_iface)
        if "collector" in tb.topo.hosts:
            # vTAP sessions' tunnels, counted where they leave the tap node (at the
            # next hop, which the sink makes the last): the router's forwarding
            # is not the DUT's work
            self._sink("collector", "drop", tb.ns("router"), "eth0")
        if tb.receiver == tb.tap_host:
            self.udp_sink(self.dut_ns, self.udp_port)
        for link in tb.topo.links:
            for end in (link.a, link.b):
                if end.host == tb.tap_host and end.name != self.dut_iface:
                    netns.run(self.dut_ns, ["ethtool", "-K", end.name, "tso", "off"], capture_output=True)
        self.napi_pids = threaded_napi(self.dut_ns, self.dut_iface, self.dut_cpu)

    def _sink(self, label, verdict, ns, ifname):
        s = XdpSink(verdict)
        self.sinks[label] = s  # registered first, so close() frees it even if attach fails
        s.attach(ifname, netns=ns)

    def pin_napi(self, cpu):
        for pid in self.napi_pids:
            os.sched_setaffinity(pid, {cpu})

    def tear_down(self):
        """Free the sinks (the sockets and the testbed go after, in Rig.close)."""
        failed = []
        for label, s in self.sinks.items():
            try:
                s.close()
            except Exception as e:
                failed.append(f"{label} sink: {e}")
        self.sinks.clear()
        return failed

    # --- one run -------------------------------------------------------------
    def run(self, generator, peer, seconds, count=None, rate_pps=None, settle=0.3):
        """One bounded load run with `peer` (lab.peer.Peer) doing the DUT's job.
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
        return {
            "report": report,
            "counts": counts,
            "cpu": cpu,
            "mirrored": {k: v - base.get(k, 0) for k, v in grown.items() if isinstance(v, int)},
        }

    def _lift_dut_sink(self):
        """Take the counting sink off the DUT's interface, for a peer that puts its
        own XDP program there (it counts with its verdicts instead)."""
        sink = self.sinks.pop("dut", None)
        if sink is not None:
            sink.close()
        return sink is not None
