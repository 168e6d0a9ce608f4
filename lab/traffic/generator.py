"""Generator: what every packet source shares. Subclasses implement _open(),
_close() and _send(limit, seconds, rate_pps) -> (packets, bytes, seconds); the
base checks the bounds, opens lazily, and measures what the sending device
itself dropped around each send."""

from .. import netns
from ..metrics import iface_counters
from .report import SendReport, check_bounds


class Generator:
    name = ""

    def __init__(self, ns, ifname, frames, cpu=None):
        if not frames:
            raise ValueError(f"{type(self).__name__} needs at least one frame")
        self.ns, self.ifname, self.cpu = ns, ifname, cpu
        self.frames = [bytes(f) for f in frames]
        self.is_open = False

    def open(self):
        with netns.ipr(self.ns) as ip:
            if not ip.link_lookup(ifname=self.ifname):
                raise netns.LabError(f"no interface {self.ifname} in {self.ns}")
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
        packets, nbytes, secs = self._send(limit, seconds, rate_pps)
        after = iface_counters(self.ns, self.ifname)
        return SendReport(packets, nbytes, secs, self.name, dropped=after["tx_dropped"] - before["tx_dropped"])

    def _open(self):
        raise NotImplementedError

    def _close(self):
        raise NotImplementedError

    def _send(self, limit, seconds, rate_pps):
        raise NotImplementedError
