"""Rig: a bench's testbed made ready for load runs, the one protocol every
bench's rig follows (ThroughputRig for the vTAP, RouterRig for the redirect,
the port filter's PairRig):

    with SomeRig(testbed, gen_cpu=0, dut_cpu=1) as rig:   # builds the testbed, then set_up()
        rig.run(...)                                       # one bounded run -> a dict of measurements
    # tear_down(), then the testbed is removed, whatever failed

The device under test (DUT) gets a core of its own: its receive work runs in a
NAPI thread (the kernel's polled receive path, threaded and pinned: see
lab.metrics.threaded_napi), and everything else (the generator, the far ends)
on the other one, so the DUT core's busy time per packet is the cost compared.
A rig's set_up() says what it needs for that and why. Closing runs every step
even when one fails, and a failure to close is added to the error that was
already on its way out rather than replacing it.
"""

import os
import socket

from . import netns


def checked_cpus(gen_cpu, dut_cpu):
    if gen_cpu is None and dut_cpu is None:  # a rig that pins nothing (the LB's: it reads its processes' CPU)
        return None, None
    ncpu = os.cpu_count()
    if gen_cpu == dut_cpu or max(gen_cpu, dut_cpu) >= ncpu or min(gen_cpu, dut_cpu) < 0:
        raise ValueError(f"generator and DUT need two different CPUs of 0..{ncpu - 1}")
    return gen_cpu, dut_cpu


class Rig:
    def __init__(self, testbed, gen_cpu=0, dut_cpu=1):
        self.gen_cpu, self.dut_cpu = checked_cpus(gen_cpu, dut_cpu)
        self.tb = testbed
        self.sockets = []

    def set_up(self):
        """What the runs need, once the testbed is built."""

    def tear_down(self) -> list[str]:
        """Undo set_up(); return what failed, one line each (every step is tried)."""
        return []

    def __enter__(self):
        self.tb.__enter__()
        try:
            self.set_up()
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

    def close(self):
        failed = self.tear_down()
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

    def _close_after(self, exc):
        try:
            self.close()
        except Exception as e:
            exc.add_note(str(e))

    def udp_sink(self, ns, port):
        """A UDP socket on `port` (both families) that never reads: a receiving
        application that cannot keep up, so its queue fills and the kernel drops
        there. Without one every frame costs the DUT an ICMP port-unreachable
        attempt (two route lookups and an xfrm lookup before the rate limit
        says no): about 800 ns/pkt at 64 B by perf, the same for every peer,
        which hides the differences between them."""
        with netns.entered(ns):
            for family, any_addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
                s = socket.socket(family, socket.SOCK_DGRAM)
                self.sockets.append(s)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's minimum
                s.bind((any_addr, port))
