"""Generator: what every packet source shares. Subclasses implement _open(),
_close() and _send(limit, seconds, rate_pps) -> (packets, bytes, seconds) or
(packets, bytes, seconds, extra); the base checks the bounds, opens lazily, and
measures what the sending device itself dropped around each send.

run_bounded() runs an external sender for at most its seconds, then stops it
with SIGINT (the signal after which trafgen and iperf3 print their totals)."""

import os
import signal
import subprocess
import time

from ebpf.netdev import ifindex_of

from .. import netns
from ..counters import iface_counters
from .report import SendReport, check_bounds


def run_bounded(ns, argv, seconds, grace=10.0, **kw):
    """Run argv in namespace ns in a process group of its own, SIGINT the group
    after `seconds` (a sender that forks, like trafgen, must be stopped whole),
    SIGKILL it `grace` seconds later. Returns (returncode, stdout+stderr, wall seconds)."""
    start = time.monotonic()
    proc = netns.popen(
        ns, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw
    )
    try:
        out, _ = proc.communicate(timeout=seconds)
    except BaseException as e:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
    return proc.returncode, out, time.monotonic() - start


class Generator:
    name = ""
    needs_frames = True  # False for sources that make their own traffic (iperf3, file transfer)

    def __init__(self, ns, ifname, frames=None, cpu=None):
        if self.needs_frames and not frames:
            raise ValueError(f"{type(self).__name__} needs at least one frame")
        self.ns, self.ifname, self.cpu = ns, ifname, cpu
        self.frames = [bytes(f) for f in frames or []]
        self.is_open = False

    def open(self):
        with netns.ipr(self.ns) as ip:
            ifindex_of(ip, self.ifname, self.ns)  # fails now, in one line, for a wrong name
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        self.is_open = True
        return self

    def close(self):
        self.is_open = False
        self._close()

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
        return False

    def send(self, count=None, seconds=10.0, rate_pps=None) -> SendReport:
        """Send until `count` packets or `seconds` have gone, at `rate_pps` or as
        fast as the machine allows. Reports what was handed to the device."""
        limit = check_bounds(count, seconds)
        if not self.is_open:
            self.open()
        before = iface_counters(self.ns, self.ifname)
        packets, nbytes, secs, *extra = self._send(limit, seconds, rate_pps)
        after = iface_counters(self.ns, self.ifname)
        return SendReport(
            packets,
            nbytes,
            secs,
            self.name,
            dropped=after["tx_dropped"] - before["tx_dropped"],
            extra=extra[0] if extra else {},
        )

    def _open(self):
        raise NotImplementedError

    def _close(self):
        raise NotImplementedError

    def _send(self, limit, seconds, rate_pps):
        raise NotImplementedError
