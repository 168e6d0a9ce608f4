"""RouterRig: the router testbed (lab.fastpaths.redirect.testbed.router_testbed) made ready for
the redirect's load runs and file transfers."""

import contextlib
import time

from ebpf.instruments.xdp_sink import XdpSink
from lab import netns
from lab.metrics import CpuSampler, iface_counters, threaded_napi
from lab.rig import Rig
from lab.traffic import FileTransfer, FileTransferServer


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


class RouterRig(Rig):
    """The router testbed (lab.fastpaths.redirect.testbed.router_testbed) made ready for load runs:
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
        super().__init__(testbed, gen_cpu, dut_cpu)
        self._drop = None  # the server's counting and dropping sink, for rate runs

    def set_up(self):
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

    def tear_down(self):
        failed = []
        if self._drop:
            try:
                self._drop.close()
            except Exception as e:
                failed.append(f"server sink: {e}")
        return failed

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
            self._quiet(
                lambda: (sink.counters()["packets"], client_sink.counters()["packets"], method.counters(), egress())
            )
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
