"""XdpSink: count and drop (or pass) every frame at a device's XDP hook (xdp_sink.bpf.c).

    >>> with XdpSink() as sink:                            # doctest: +SKIP
    ...     sink.attach("eth0", netns="vtl-...-monitor")
    ...     sink.counters()
    {'packets': ..., 'bytes': ...}

On veth a native XDP program also turns on the device's NAPI, which is what
lets it receive XDP_TX frames from its peer at all.
"""

from .errors import BpfError
from .program import BpfProgram

VERDICTS = ("drop", "pass")


class XdpSink(BpfProgram):
    SOURCE = "xdp_sink.bpf.c"
    FUNCTION = "xdp_sink"

    def __init__(self, verdict="drop", source=None):
        if verdict not in VERDICTS:
            raise BpfError(f"unknown sink verdict {verdict!r} (drop or pass)")
        super().__init__([f"-DSINK_VERDICT=XDP_{verdict.upper()}"], source)
        self.verdict = verdict

    def attach(self, ifname, netns=None, mode="native"):
        return self.attach_xdp(self.FUNCTION, ifname, netns, mode)

    def counters(self) -> dict:
        return self.percpu_totals("stats")

    def reset_counters(self):
        self.zero_percpu("stats")
