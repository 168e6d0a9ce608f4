"""What the vTAP's three commands share: the TC vTAP (command.py), the XDP one
(xdp_command.py, `vtap --hook xdp`) and sessions (sessions_command.py, `vtap
--sessions FILE`). How they call themselves; for the two that copy to one
monitor what a watch-list matches, --monitor and the watch-list checked and
read, the "attached" line's watch-list, and the watch on their health.

A module of its own, below the three: command.py picks one of the other two
(VtapCommand.variant()), so they cannot build on it without an import cycle.
Light, as command.py is (`vtap --help` loads no pyroute2).
"""

from ebpf.abi import defines
from ebpf.errors import BpfError, InputError
from ebpf.vtap.cutoff import FLOW_TIMEOUT_DEFAULT, FLOWS_DEFAULT, FLOWS_MAX, parse_size
from ebpf.vtap.watchlist import parse_watch_list, read_watch_file
from lab.console import UsageError, require, warn
from lab.lifecycle import Command

SAMPLE_MAX = defines("vtap/vtap.h")["VTAP_SAMPLE_MAX"]
WATCH_SHOWN = 64  # entries of a watch-list the "attached" line shows
NO_INTERFACE = "no interface to tap: none is UP besides lo and the interfaces that carry the copies (use --iface)"


class TapCommand(Command):
    """A vTAP command: it calls itself `vtap` at either hook, in errors and in
    --metrics' names; its rows are the interfaces it taps."""

    name, short = "vtap", "vtap"
    metrics_rows = {"ifaces": "interface"}
    metrics_gauges = frozenset({"flows"})  # the cutoff's table now: it goes up and down


def check_watch_options(args):
    """--monitor, --sample, --watch-max and --iface, as both hooks take them (UsageError: exit 2)."""
    if not args.monitor:
        raise UsageError("--monitor is required (the interface the copies leave through), or --sessions FILE")
    if not 1 <= args.sample <= SAMPLE_MAX:
        raise UsageError(f"--sample must be from 1 (every matched packet) to {SAMPLE_MAX}, not {args.sample}")
    if args.watch_max is not None and args.watch_max < 1:
        raise UsageError(f"--watch-max must be at least 1, not {args.watch_max}")
    if args.monitor in args.iface:
        raise UsageError(f"monitor {args.monitor} is also a tapped interface (its own clones would loop)")
    require(args)  # an interface given twice


def watch_list(args):
    """--watch and --watch-file together, or None (mirror everything)."""
    if not args.watch and not args.watch_file:
        return None
    nets = parse_watch_list(args.watch)
    for path in args.watch_file:
        nets += read_watch_file(path)
    return nets  # parsed: TcMirror and XdpMirror take them as they are


def add_cutoff_options(p):
    """--cutoff, --flows, --flow-timeout: the per-flow cutoff (ebpf/vtap/cutoff.h), at either hook."""
    p.add_argument(
        "--cutoff",
        metavar="BYTES",
        help="copy each flow until BYTES of its TCP/UDP payload were copied in a direction (64K, 1MiB; "
        "the segment that crosses the line goes whole), then only its SYN, FIN and RST segments; "
        "0 or not given: no cutoff",
    )
    p.add_argument(
        "--flows",
        type=int,
        metavar="N",
        help=f"the cutoff's flow table: N flows, least recently seen evicted (default {FLOWS_DEFAULT}, "
        "136 bytes of kernel memory each: 8.9 MB by default)",
    )
    p.add_argument(
        "--flow-timeout",
        type=float,
        metavar="SECONDS",
        help=f"a flow idle this long starts again from zero (default {FLOW_TIMEOUT_DEFAULT:g})",
    )


def cutoff_options(args) -> dict:
    """The tap's cutoff=, flows=, flow_timeout= from the options (UsageError: exit 2).
    No --cutoff (or 0): no flow table at all."""
    try:
        cutoff = parse_size(args.cutoff) if args.cutoff is not None else 0
    except InputError as e:
        raise UsageError(f"--{e}") from None
    if not cutoff:
        given = [o for o in ("--flows", "--flow-timeout") if getattr(args, o[2:].replace("-", "_")) is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} {'go' if len(given) > 1 else 'goes'} with --cutoff BYTES")
        return {}
    if args.flows is not None and not 1 <= args.flows <= FLOWS_MAX:
        raise UsageError(f"--flows must be from 1 to {FLOWS_MAX}, not {args.flows}")
    if args.flow_timeout is not None and not args.flow_timeout > 0:
        raise UsageError(f"--flow-timeout must be a positive number of seconds, not {args.flow_timeout:g}")
    kw = {"cutoff": cutoff, "flows": args.flows or FLOWS_DEFAULT}
    if args.flow_timeout is not None:
        kw["flow_timeout"] = args.flow_timeout
    return kw


def cutoff_said(tap) -> str:
    """The cutoff of `tap`, as the "attached" line says it ("" without one)."""
    if not tap.flows or not tap.cutoff:
        return ""
    return f"; cutoff {tap.cutoff} bytes per flow and direction ({tap.flows} flows, idle {tap.flow_timeout:g} s)"


def cutoff_fields(tap) -> dict:
    """The cutoff of `tap`, as the "attached" JSON object gives it."""
    if not tap.flows:
        return {"cutoff": 0}
    return {"cutoff": tap.cutoff, "flows_max": tap.flows, "flow_timeout": tap.flow_timeout}


def cutoff_summary(totals) -> str:
    """The final block's line on the cutoff: what it cut and what its table held."""
    return (
        f"cutoff: {totals['cut']} frames ({totals['cut_bytes']} bytes) cut, {totals['ends_copied']} "
        f"SYN/FIN/RST copied past a cut; flows: {totals['flows_new']} made, {totals['flows']} held, "
        f"{totals['flows_ended']} ended, {totals['flows_restarted']} started over, {totals['evicted']} evicted; "
        f"copied without a flow: {totals['uncut_fragment']} fragments, {totals['uncut_no_ports']} without ports, "
        f"{totals['uncut_malformed']} cut short"
    )


def watch_said(tap) -> str:
    """The watch-list of `tap`, as the "attached" line says it."""
    if tap.watch is None:
        return "everything"
    return ", ".join(tap.watch[:5]) + (f" and {len(tap.watch) - 5} more" if len(tap.watch) > 5 else "")


def watch_fields(tap) -> dict:
    """The watch-list of `tap`, as the "attached" JSON object gives it."""
    return dict(
        watch=None if tap.watch is None else tap.watch[:WATCH_SHOWN],
        watch_count=None if tap.watch is None else len(tap.watch),
    )


class Watcher:
    """What changes outside while a vTAP runs, each said once, when it happens:
    from its health() (ebpf.vtap.mirror_health.Health, one shape at either hook),
    a hook it lost stops the run; the monitor's changes are said. A hook's
    watcher says them in its words (stopped(), news())."""

    def __init__(self, tap):
        self.tap = tap
        self.monitor_state = "up"  # what the start assumes: anything else is said at the first check

    def stopped(self, missing) -> str:
        raise NotImplementedError

    def news(self, state, note="") -> str:
        raise NotImplementedError

    def check(self):
        """The health of the vTAP now (Health), its changes said; BpfError: a hook is lost."""
        h = self.tap.health()
        if h.missing:
            raise BpfError(self.stopped(h.missing))
        if h.monitor_state == "renewed" or h.monitor_state != self.monitor_state:
            warn(self.news(h.monitor_state, h.note))
        self.monitor_state = "up" if h.monitor_state == "renewed" else h.monitor_state
        return h
