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
from ebpf.vtap.steer import HOLD_DEFAULT, MAX_HOSTS_DEFAULT
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
    # what goes up and down: the cutoff's table now, the hosts alerts hold, their waits
    metrics_gauges = frozenset({"flows", "alert_hosts", "alert_first_copy_median_s", "alert_first_copy_max_s"})


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
    """--watch and --watch-file together, or None (mirror everything); with --alerts
    and no list, an empty one (nothing watched until the first alert)."""
    if not args.watch and not args.watch_file:
        return [] if getattr(args, "alerts", None) else None
    nets = parse_watch_list(args.watch)
    for path in args.watch_file:
        nets += read_watch_file(path)
    return nets  # parsed: TcMirror and XdpMirror take them as they are


def add_alert_options(p):
    """--alerts and its options: an IDS's alerts steer the watch-list (ebpf/vtap/steer.py)."""
    p.add_argument(
        "--alerts",
        metavar="FILE",
        help="follow a Suricata EVE JSON file as it is written: each alert puts the hosts it names on the "
        "watch-list for --alert-hold seconds (renewed by later alerts); may be the only source of watched hosts",
    )
    p.add_argument(
        "--alert-watch",
        default="both",
        choices=("src", "dst", "both"),
        help="--alerts: which of an alert's addresses to watch (default %(default)s)",
    )
    p.add_argument(
        "--alert-hold",
        type=float,
        metavar="SECONDS",
        help=f"--alerts: how long a host stays watched after its latest alert (default {HOLD_DEFAULT:g})",
    )
    p.add_argument(
        "--alert-max",
        type=int,
        metavar="N",
        help=f"--alerts: at most N hosts held at once; alerts for more are counted (default {MAX_HOSTS_DEFAULT})",
    )
    p.add_argument(
        "--alert-session",
        metavar="NAME|NUMBER",
        help="--alerts with --sessions: the file's session the held hosts go into (all of a held host's "
        "frames, both ways, past that session's cutoff)",
    )


def alert_options(args, sessions=False) -> dict | None:
    """follow_alerts()'s keywords from the options, or None without --alerts (UsageError: exit 2).
    sessions: for `--sessions`, where --alert-session names the session the hosts go into."""
    if not sessions and getattr(args, "alert_session", None) is not None:
        raise UsageError("--alert-session goes with --sessions: it names the file's session the held hosts go into")
    if not args.alerts:
        opts = ("--alert-hold", "--alert-max", "--alert-session")
        given = [o for o in opts if getattr(args, o[2:].replace("-", "_"), None) is not None]
        if args.alert_watch != "both":
            given.append("--alert-watch")
        if given:
            raise UsageError(f"{' and '.join(given)} {'go' if len(given) > 1 else 'goes'} with --alerts FILE")
        return None
    hold = HOLD_DEFAULT if args.alert_hold is None else args.alert_hold
    if not hold > 0 or hold != hold or hold == float("inf"):
        raise UsageError(f"--alert-hold must be a positive number of seconds, not {args.alert_hold:g}")
    most = MAX_HOSTS_DEFAULT if args.alert_max is None else args.alert_max
    if most < 1:
        raise UsageError(f"--alert-max must be at least 1, not {most}")
    out = {"path": args.alerts, "watch": args.alert_watch, "hold": hold, "max_hosts": most}
    if sessions:
        if args.alert_session is None:
            raise UsageError("--alerts with --sessions needs --alert-session NAME: the session the held hosts go into")
        out["session"] = args.alert_session
    return out


def alerts_said(opts) -> str:
    if not opts:
        return ""
    into = f", into session {opts['session']}" if opts.get("session") is not None else ""
    return f"; alerts from {opts['path']} ({opts['watch']}, held {opts['hold']:g} s, at most {opts['max_hosts']}{into})"


def alerts_summary(c) -> str:
    waits = (
        f"alert to first copy: median {c['alert_first_copy_median_s']} s, max {c['alert_first_copy_max_s']} s "
        f"over {c['alert_first_copies']} hosts"
        if c["alert_first_copies"]
        else "no host's first copy yet"
    )
    return (
        f"alerts: {c['alerts']} read, {c['alert_hosts']} hosts held now; {c['alert_added']} added, "
        f"{c['alert_renewed']} renewed, {c['alert_expired']} expired, {c['alert_capped']} over the cap, "
        f"{c['alert_malformed']} malformed lines; {waits}"
    )


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
