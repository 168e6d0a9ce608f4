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

The steps are per role, so that a run is the same steps whether its roles are
namespaces on this machine (ThroughputRig, all of them in this process) or hosts
the user named (lab.hosts: one runner per role, each on its own host, running
these same classes there): CountingSide for a receiver or a monitor, DutSide for
the tap, and the bench's generator for the sender.
"""

import os
import time

from ebpf.instruments.xdp_sink import XdpSink
from lab import netns
from lab.metrics import CpuSampler, threaded_napi
from lab.rig import Rig


class CountingSide:
    """Where frames are counted: an XDP sink on (ns, ifname). verdict drop for a
    receiver or monitor, pass for the DUT (frames go on to tc and the stack).
    match (IPv4 source, UDP port): only the lab's frames (on hosts, whose NICs
    also get LLDP and neighbour discovery). mode: native, or generic on a device whose
    driver has no native XDP (a tunnel: lab.hosts.check.sink_mode)."""

    def __init__(self, verdict, ns, ifname, match=None, window=False, mode="native"):
        self.verdict, self.ns, self.ifname, self.match, self.window = verdict, ns, ifname, match, window
        self.mode = mode
        self.sink = None

    def open(self):
        # window: the sink keeps its first and last frame's times (a host's own window)
        self.sink = XdpSink(self.verdict, match=self.match, window=self.window)
        try:
            self.sink.attach(self.ifname, netns=self.ns, mode=self.mode)
        except BaseException:
            self.close()
            raise
        return self

    def reset(self):
        self.sink.reset_counters()

    def counters(self) -> dict:
        return self.sink.counters()

    def close(self):
        if self.sink is not None:
            sink, self.sink = self.sink, None
            sink.close()


class DutSide:
    """The tap node: its receiving interface counted (a pass sink), its receive work
    in a NAPI thread pinned to dut_cpu, TSO off where it forwards into a sink, a
    UDP sink where it is the receiver; and per run the peer attached, measured
    (CPU, the peer's counters) and detached."""

    def __init__(
        self,
        ns,
        ifname,
        dut_cpu,
        gen_cpu,
        forwarding_ifaces=(),
        udp_port=None,
        sink=True,
        match=None,
        window=False,
        cpu_interval=1.0,
    ):
        self.ns, self.ifname, self.dut_cpu, self.gen_cpu = ns, ifname, dut_cpu, gen_cpu
        self.forwarding_ifaces, self.udp_port, self.match = list(forwarding_ifaces), udp_port, match
        self.counting = CountingSide("pass", ns, ifname, match, window) if sink else None
        self.cpu_interval = cpu_interval
        self.napi_pids = []
        self._threaded = None
        self._run = None

    def set_up(self, rig):
        if self.counting:
            self.counting.open()
        if self.udp_port is not None:
            rig.udp_sink(self.ns, self.udp_port)
        for name in self.forwarding_ifaces:
            netns.run(self.ns, ["ethtool", "-K", name, "tso", "off"], capture_output=True)
        # read as the namespace sees it (ip netns exec mounts its /sys; setns() would not)
        self._threaded = netns.run(
            self.ns, ["cat", f"/sys/class/net/{self.ifname}/threaded"], capture_output=True, text=True
        ).stdout.strip()
        self.napi_pids = threaded_napi(self.ns, self.ifname, self.dut_cpu)

    def pin_napi(self, cpu):
        for pid in self.napi_pids:
            os.sched_setaffinity(pid, {cpu})

    def begin(self, peer):
        """The peer attached and ready, the count and the CPU sampling started."""
        lifted = False
        if peer.owns_dut_xdp and self.counting and self.counting.sink is not None:
            self.counting.close()  # the peer's own XDP program counts arrivals with its verdicts
            lifted = True
        try:
            peer.attach()
            if peer.takes_dut_core:
                # the peer's process gets the DUT core to itself; the kernel's
                # receive work moves to the generator's core for this run
                self.pin_napi(self.gen_cpu)
            peer.ready()
            if self.counting and self.counting.sink is not None:
                self.counting.reset()
            base = peer.counters()
            cpu = CpuSampler(interval=self.cpu_interval).start()
        except BaseException:
            self._undo(peer, lifted)
            raise
        self._run = (peer, lifted, base, cpu)

    def end(self) -> dict:
        """CPU sampling stopped, the counts and the peer's growth read, the peer detached."""
        peer, lifted, base, cpu = self._run
        self._run = None
        try:
            cpu.stop()
            counts = {"dut": self.counting.counters()} if self.counting and self.counting.sink is not None else {}
            grown = peer.counters()
        finally:
            self._undo(peer, lifted)
        return {
            "counts": counts,
            "cpu": cpu,
            "mirrored": {k: v - base.get(k, 0) for k, v in grown.items() if isinstance(v, int)},
        }

    def _undo(self, peer, lifted):
        try:
            if peer.takes_dut_core:
                self.pin_napi(self.dut_cpu)
            peer.detach()
        finally:
            if lifted:
                self.counting.open()

    def close(self) -> list[str]:
        failed = []
        if self.napi_pids and self._threaded is not None:
            # as it was, while the sink still gives the device its NAPI (without one the
            # kernel refuses the write): on a host, the next run's runner makes its own
            try:
                netns.run(self.ns, ["sh", "-c", f"echo {self._threaded} > /sys/class/net/{self.ifname}/threaded"])
            except Exception as e:
                failed.append(f"threaded NAPI: {e}")
            self.napi_pids = []
        if self.counting:
            try:
                self.counting.close()
            except Exception as e:
                failed.append(f"dut sink: {e}")
        return failed


class ThroughputRig(Rig):
    def __init__(self, testbed, gen_cpu=0, dut_cpu=1, udp_port=5001, dut_sink=True):
        super().__init__(testbed, gen_cpu, dut_cpu)
        self.sides = {}  # label -> CountingSide (receiver, monitor, collector)
        self.dut_ns = testbed.ns(testbed.tap_host)
        self.dut_iface = testbed.tap_iface
        self.udp_port = udp_port
        tb = testbed
        forwarding = [
            end.name
            for link in tb.topo.links
            for end in (link.a, link.b)
            if end.host == tb.tap_host and end.name != self.dut_iface
        ]
        self.dut = DutSide(
            self.dut_ns,
            self.dut_iface,
            self.dut_cpu,
            self.gen_cpu,
            forwarding,
            udp_port if tb.receiver == tb.tap_host else None,
            sink=dut_sink,  # count arrivals at the DUT with an XDP pass sink (see Peer.owns_dut_xdp)
        )

    @property
    def sinks(self) -> dict:
        """{label: XdpSink} of every counting sink attached now."""
        out = {k: s.sink for k, s in self.sides.items() if s.sink is not None}
        if self.dut.counting and self.dut.counting.sink is not None:
            out["dut"] = self.dut.counting.sink
        return out

    @property
    def napi_pids(self):
        return self.dut.napi_pids

    # --- set-up ------------------------------------------------------------
    def set_up(self):
        tb = self.tb
        self.dut.set_up(self)  # arrivals at the DUT: counted, then on to tc and the stack
        if tb.receiver != tb.tap_host:
            self._side("receiver", tb.ns(tb.receiver), tb.receiver_iface)
        self._side("monitor", tb.ns(tb.monitor), tb.monitor_capture_iface)
        if "collector" in tb.topo.hosts:
            # vTAP sessions' tunnels, counted where they leave the tap node (at the
            # next hop, which the sink makes the last): the router's forwarding
            # is not the DUT's work
            self._side("collector", tb.ns("router"), "eth0")

    def _side(self, label, ns, ifname):
        side = CountingSide("drop", ns, ifname)
        self.sides[label] = side  # registered first, so close() frees it even if attach fails
        side.open()

    def pin_napi(self, cpu):
        self.dut.pin_napi(cpu)

    def tear_down(self):
        """Free the sinks (the sockets and the testbed go after, in Rig.close)."""
        failed = self.dut.close()
        for label, side in self.sides.items():
            try:
                side.close()
            except Exception as e:
                failed.append(f"{label} sink: {e}")
        self.sides.clear()
        return failed

    # --- one run -------------------------------------------------------------
    def run(self, generator, peer, seconds, count=None, rate_pps=None, settle=0.3):
        """One bounded load run with `peer` (lab.peer.Peer) doing the DUT's job.
        Returns raw measurements: the send report, each sink's counts, the CPU
        sampler, and how much each of the peer's counters grew."""
        self.dut.begin(peer)
        try:
            for side in self.sides.values():
                side.reset()
            report = generator.send(count=count, seconds=seconds, rate_pps=rate_pps)
            time.sleep(settle)  # let queues drain into the sinks
            counts = {k: s.counters() for k, s in self.sides.items()}
        finally:
            measured = self.dut.end()
        return {**measured, "report": report, "counts": {**measured["counts"], **counts}}
