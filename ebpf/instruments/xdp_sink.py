"""XdpSink: count every frame at a device's XDP hook, then drop it, pass it on,
send it back (tx; swap: with its MAC addresses swapped) or redirect it to another
device (xdp_sink.bpf.c).

    >>> with XdpSink() as sink:                            # doctest: +SKIP
    ...     sink.attach("eth0", netns="vtl-...-monitor")
    ...     sink.counters()
    {'packets': ..., 'bytes': ...}
    >>> XdpSink("redirect", redirect_ifindex=3)            # doctest: +SKIP

On veth a native XDP program also turns on the device's NAPI, which is what
lets it receive XDP_TX frames from its peer at all.
"""

import ipaddress

from ebpf.errors import InputError
from ebpf.program import BpfProgram

VERDICTS = ("drop", "pass", "tx", "redirect", "swap")  # swap: the MACs swapped, then XDP_TX (a floor)


class XdpSink(BpfProgram):
    SOURCE = "xdp_sink.bpf.c"
    FUNCTION = "xdp_sink"

    def __init__(self, verdict="drop", source=None, redirect_ifindex=None, match=None, window=False):
        """match: (IPv4 source, UDP destination port): count (and give the verdict to)
        only those frames, and pass every other on uncounted (a real NIC's LLDP and
        neighbour discovery). window: keep the first and last counted frame's times
        (window_seconds()), where nothing may poll during a run."""
        if verdict not in VERDICTS:
            raise InputError(f"unknown sink verdict {verdict!r} ({', '.join(VERDICTS)})")
        if (verdict == "redirect") != (redirect_ifindex is not None):
            raise InputError("a redirecting sink needs redirect_ifindex, and only it")
        flags = [f"-DSINK_VERDICT=XDP_{'TX' if verdict == 'swap' else verdict.upper()}"]
        if verdict == "swap":
            flags.append("-DSINK_SWAP_MACS")
        if redirect_ifindex is not None:
            flags.append(f"-DSINK_REDIRECT_IFINDEX={int(redirect_ifindex)}")
        if window:
            flags.append("-DSINK_WINDOW")
        self.window = window
        if match is not None:
            src, dport = match
            # the address as the packet holds it (network order), read as a host-order u32
            flags += [
                f"-DSINK_MATCH_SRC4={int.from_bytes(ipaddress.IPv4Address(src).packed, 'little')}U",
                f"-DSINK_MATCH_DPORT={int(dport)}",
            ]
        super().__init__(flags, source)
        self.verdict = verdict

    def attach(self, ifname, netns=None, mode="native"):
        return self.attach_xdp(self.FUNCTION, ifname, netns, mode)

    def counters(self) -> dict:
        if not self.window:
            return self.percpu_totals("stats")
        table = self.table("stats")
        per_cpu = [v for v in table.getvalue(table.Key(0))]
        seen = [v for v in per_cpu if v.packets]
        first = min(v.first_ns for v in seen) / 1e9 if seen else None  # CLOCK_MONOTONIC seconds
        last = max(v.last_ns for v in seen) / 1e9 if seen else None  # (see xdp_sink.bpf.c)
        return {
            "packets": sum(v.packets for v in per_cpu),
            "bytes": sum(v.bytes for v in per_cpu),
            "window_s": last - first if seen else 0.0,
            "first_s": first,
            "last_s": last,
        }

    def reset_counters(self):
        self.zero_percpu("stats")
