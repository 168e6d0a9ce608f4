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

import contextlib
import os
import socket
import time
from pathlib import Path

from ebpf.xdp_sink import XdpSink

from . import netns
from .metrics import CpuSampler, iface_counters


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


def threaded_napi(ns, ifname, cpu) -> list[int]:
    """Switch the interface's NAPI to a kthread of its own and pin that to `cpu`,
    so that its receive work runs there and is counted there. The interface
    must have NAPI (on veth: an XDP program, or GRO). Returns the kthreads' pids."""
    before = set(napi_threads())
    netns.run(ns, ["sh", "-c", f"echo 1 > /sys/class/net/{ifname}/threaded"])
    deadline = time.monotonic() + 5
    pids = []
    while not pids and time.monotonic() < deadline:
        pids = sorted(set(napi_threads()) - before)
        time.sleep(0.02)
    if not pids:
        raise netns.LabError(f"threaded NAPI on {ifname} in {ns}: no napi kthread appeared")
    for pid in pids:
        os.sched_setaffinity(pid, {cpu})
    return pids


def steer_receive(ns, ifname, cpu):
    """RPS: the receive work of every packet arriving on the interface (from the
    backlog on: taps, tc, the stack) runs on `cpu`, whichever core the sender
    used. On veth without NAPI, the sender's core would otherwise do it."""
    mask = format(1 << cpu, "x")
    netns.run(ns, ["sh", "-c", f"for q in /sys/class/net/{ifname}/queues/rx-*; do echo {mask} > $q/rps_cpus; done"])


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
        self.napi_pids = threaded_napi(self.dut_ns, self.dut_iface, self.dut_cpu)

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
                failed.append(f"UDP socket: {e.strerror}")
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


@contextlib.contextmanager
def _attached(peer):
    """attach() and detach() around a run, not close(): a peer stays loaded
    between runs (the caller closes it), so no run pays for compiling it, and
    none has the kernel freeing the previous run's programs and maps on the
    router's core."""
    peer.attach()
    try:
        yield peer
    finally:
        peer.detach()


class RouterRig:
    """The router testbed (lab.testbeds.router_testbed) made ready for load runs:
    the device under test is the router, and its core does the router's work alone.

    - The router's receiving interface has GRO on, which gives a veth its NAPI
      for good, whichever method's XDP program comes and goes (an XDP program
      would too, but it is the methods' to put there); that NAPI runs threaded,
      pinned to `dut_cpu`. UDP is not merged by GRO on a forwarding path.
    - The server's and the client's receive work runs threaded on `gen_cpu`,
      with the client, the server and the generator: none of it is the router's.
      Their TSO is off, so that what they send reaches the router's NAPI.
    - For rate runs, the server's XDP sink counts and drops (it passes them on
      otherwise, for the file transfers). When the server's stack took them
      (into a socket that never read), its receive work on the generator's core
      took that core from the generator: at the ceiling every method forwarded
      what the generator could still offer, 250-400 kpps, with the router's
      core 20-57 % idle, and xdp-forward's lead over nft-dnat shrank from 2.2x
      to 1.4x between two runs.
    Counted: frames sent (the generator), forwarded (the router's egress
    interface), delivered (the server's sink) and the router's CPU
    (lab.metrics.CpuSampler, wall minus idle).
    """

    def __init__(self, testbed, gen_cpu=0, dut_cpu=1):
        ncpu = os.cpu_count()
        if gen_cpu == dut_cpu or max(gen_cpu, dut_cpu) >= ncpu:
            raise ValueError(f"generator and DUT need two different CPUs of 0..{ncpu - 1}")
        self.tb, self.gen_cpu, self.dut_cpu = testbed, gen_cpu, dut_cpu
        self._drop = None  # the server's counting and dropping sink, for rate runs

    def __enter__(self):
        self.tb.__enter__()
        try:
            tb = self.tb
            netns.run(tb.ns(tb.dut), ["ethtool", "-K", tb.dut_in, "gro", "on"], capture_output=True)
            threaded_napi(tb.ns(tb.dut), tb.dut_in, self.dut_cpu)
            # GRO keeps the server's NAPI, and its kthread's pinning, while the
            # rate runs swap its sink: a veth without GRO loses its NAPI with its
            # last XDP program, and a new one got a kthread free to run on the
            # router's core (perf found it there, taking a fifth of that core).
            netns.run(tb.ns(tb.server), ["ethtool", "-K", "eth0", "gro", "on"], capture_output=True)
            for host in (tb.server, tb.client):  # what arrives there (forwarded, or sent back) is not the router's
                threaded_napi(tb.ns(host), "eth0", self.gen_cpu)
                # A veth hands an skb to its peer's NAPI (the router's core) only
                # when TSO is off on the sending side; else the router's receive
                # and forwarding work runs in the sender's softirq, on the sender's
                # core, and is not counted. An XDP program on the router's side
                # turns the sender's TSO off by itself; the other methods need it
                # done here (seen: route's router busy 137 ms against XDP's 3.4 s
                # for the same transfer, once the senders kept their offloads).
                # TX checksum offload stays on: what the senders' checksums are
                # is the testbed's choice.
                netns.run(tb.ns(host), ["ethtool", "-K", "eth0", "tso", "off"], capture_output=True)
        except BaseException:
            self.tb.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        try:
            if self._drop:
                self._drop.close()
        finally:
            self.tb.__exit__()
        return False

    @contextlib.contextmanager
    def _server_drops(self):
        """The server's pass sink swapped for a dropping one for the run (and
        back), both counting every frame that arrives; tb.sinks names the one
        counting now."""
        tb = self.tb
        passing, ns = tb.sinks[tb.server], tb.ns(tb.server)
        if self._drop is None:
            self._drop = XdpSink("drop")
        passing.detach()
        try:
            self._drop.attach("eth0", netns=ns)
            tb.sinks[tb.server] = self._drop
            try:
                yield self._drop
            finally:
                tb.sinks[tb.server] = passing
                self._drop.detach()
        finally:
            passing.attach("eth0", netns=ns)

    @staticmethod
    def _quiet(read, still=0.1, bound=2.0):
        """Wait until `read()` (what the run counts, everywhere it counts) has not
        changed for `still` seconds (bounded): attaching an XDP program to a veth
        makes the kernel send MLD reports out of it (seen: two, 12 ms apart),
        which a sink or the program would count as the run's."""
        deadline = time.monotonic() + bound
        last = read()
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.02)
            now = read()
            if now != last:
                last, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= still:
                return

    def run_rate(self, generator, method, seconds, rate_pps=None, settle=0.3):
        """One bounded load run of frames through `method`. Returns the send
        report, what the router forwarded and what of it the server received,
        the CPU sampler and how much the method's counters grew.

        Forwarded is what the router sent out of its egress interface, counted
        by that interface: transmitted, or refused by the far end's full ring
        (tx_dropped). That ring is drained on the generator's core, so at the
        ceiling the server received about half of what any method forwarded;
        counting only what arrived made every method look twice as dear."""
        ns, out = self.tb.ns(self.tb.dut), self.tb.dut_out

        def egress():
            c = iface_counters(ns, out)
            return c["tx_packets"] + c["tx_dropped"]
        with self._server_drops() as sink, _attached(method):
            method.ready()
            client_sink = self.tb.sinks[self.tb.client]
            self._quiet(lambda: (sink.counters()["packets"], client_sink.counters()["packets"],
                                 method.counters(), egress()))
            sink.reset_counters()
            base, sent_before = method.counters(), egress()
            with CpuSampler(interval=1.0) as cpu:
                report = generator.send(seconds=seconds, rate_pps=rate_pps)
                time.sleep(settle)  # let queues drain into the sink
            forwarded = egress() - sent_before
            delivered = sink.counters()["packets"]
            grown = {k: v - base.get(k, 0) for k, v in method.counters().items()}
        return {"report": report, "forwarded": forwarded, "delivered": delivered, "cpu": cpu, "method": grown}

    def run_transfer(self, method, size, seconds, family=4):
        """One file transfer of `size` bytes through `method`, the client and the
        server on the generator's core. Returns the transfer's report, the
        server's own account, and the CPU sampler (one sample a second)."""
        from .traffic import FileTransfer, FileTransferServer
        tb = self.tb
        server = tb.server4 if family == 4 else tb.server6
        with _attached(method):
            method.ready()
            to, port = method.target(family)
            with FileTransferServer(tb.ns(tb.server), server, tb.backend_port, cpu=self.gen_cpu) as srv:
                client = FileTransfer(tb.ns(tb.client), "eth0", to, port, size=size, cpu=self.gen_cpu)
                with CpuSampler(interval=1.0) as cpu:
                    report = client.send(seconds=seconds)
                done = srv.wait_result(timeout=10)
            grown = method.counters()
        return {"report": report, "server": done, "cpu": cpu, "method": grown}
