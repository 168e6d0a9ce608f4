"""vtap: mirror watched traffic to a monitor interface with an eBPF TC program,
or (--hook xdp, on a node that routes) an XDP program (xdp_hook.py).

Runs in whatever network namespace it is started in; every exit detaches what
it attached, and only that. See `python -m vtap --help` for examples.

Exit status: 0 when it ran and was stopped (--duration, Ctrl-C, SIGTERM, SIGHUP,
or its output closed, as by `| head`); 2 when the command as given cannot run
(bad options or values, an unknown interface, a monitor whose copies would loop,
a bad watch-list file, not root); 1 when it was tried and failed (BCC missing,
the compiler or the verifier refused, a hook refused, or its filter vanished
while it ran).
"""

import argparse
import sys

from ebpf.abi import defines
from ebpf.errors import BpfError
from ebpf.vtap.watchlist import parse_watch_list, read_watch_file
from lab.console import (
    SIGNALS,
    ArgumentParser,
    CounterTable,
    UsageError,
    add_run_options,
    add_xdp_mode,
    check_run_options,
    report_cleanup,
    require,
    run_command,
    run_until_stopped,
    show_program,
    warn,
)
from lab.exporter import serving

# The kernel program, the other hooks' modules (sessions_cmd.py, xdp_hook.py) and ebpf's netdev and tc
# are imported where they are used: they pull pyroute2 (a quarter of a second), which `vtap --help`
# need not load, and inside run_command a missing package is said in one line.

EXAMPLES = """\
examples:
  vtap --monitor mon0                          # mirror everything on every UP interface
  vtap --monitor mon0 --iface eth0 --watch 198.18.1.10/32
                                               # eth0 traffic from or to one host
  vtap --monitor mon0 --watch 198.18.0.0/15 --watch 2001:2::/48 --match dst
  vtap --monitor mon0 --watch-file hosts.txt   # one CIDR per line, '#' comments
  vtap --monitor mon0 --iface eth0 --direction both --sample 100
                                               # 1 in 100 frames, both directions
  vtap --monitor mon0 --duration 10 --json     # one JSON object per interval, then exit
  ip netns exec ns1 vtap --monitor mon0        # inside a network namespace
  vtap --hook xdp --monitor mon0 --iface eth0 --watch 198.18.2.0/24
                                               # on a router: watched frames out of their egress
                                               # and to mon0 from the XDP hook, before an skb exists
  vtap --sessions sessions.toml --iface eth0   # sessions: rules choose the frames, each session's
                                               # target gets its copies (an interface or a tunnel
                                               # to a collector: vxlan, geneve, gre, erspan, erspan3)
  vtap --cleanup                               # remove what a killed vtap left behind
  vtap --cleanup --all                         # ... and the programs of running vtaps too

exit status: 0 stopped (--duration, Ctrl-C, SIGTERM, SIGHUP, output closed);
  1 failed (BCC missing, compiler, verifier or hook refused, filter removed while running);
  2 cannot run as given (bad option or value, unknown interface, a loop, not root)
"""

RATES = ("seen", "matched", "cloned", "failed")
TOTALS = ("seen", "matched", "cloned", "sampled_out", "failed", "not_ip", "malformed", "oversize")
HEADS = {"sampled_out": "SAMPLED", "not_ip": "NOT-IP"}
SAMPLE_MAX = defines("vtap/vtap.h")["VTAP_SAMPLE_MAX"]
WATCH_SHOWN = 64  # entries of a watch-list the "attached" line shows


def add_arguments(p):
    p.description = ("Clone packets whose source or destination is on a watch-list to a monitor interface "
                     "(eBPF at the TC clsact hook; with --hook xdp, on a node that routes, at the XDP hook).")
    p.epilog, p.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("--monitor", metavar="MON", help="interface the copies leave through")
    p.add_argument("--sessions", metavar="FILE",
                   help="sessions from a TOML file, re-read when it changes: each with a target (an interface "
                        "or vxlan://, geneve://, gre://, erspan://, erspan3:// a collector), ordered accept/"
                        "reject rules (protocol, addresses, ports, direction), truncate, sample "
                        "(docs/vtap.md; instead of --monitor and --watch)")
    p.add_argument("--iface", metavar="IF", action="append", default=[],
                   help="interface to tap (repeatable; default: every UP interface but lo and those that "
                        "carry the copies: the monitor, its veth peer, a tunnel monitor's underlay)")
    p.add_argument("--watch", metavar="CIDR", action="append", default=[],
                   help="IPv4/IPv6 address or network to watch (repeatable; default: mirror everything)")
    p.add_argument("--watch-file", metavar="FILE", action="append", default=[],
                   help="read more CIDRs from FILE, one per line, '#' starts a comment; - is stdin (repeatable)")
    p.add_argument("--watch-max", type=int, metavar="N",
                   help="watch-list room per address family (default: 1024, or the list's size if larger)")
    p.add_argument("--match", default="any", choices=("src", "dst", "any"),
                   help="which address must be watched (default any)")
    p.add_argument("--direction", default="ingress", choices=("ingress", "egress", "both"),
                   help="which hook of each interface (default ingress)")
    p.add_argument("--sample", type=int, default=1, metavar="N",
                   help=f"mirror 1 in N matched packets, N from 1 to {SAMPLE_MAX} (default 1: all)")
    p.add_argument("--clone", default="action", choices=("action", "helper"),
                   help="who copies a matched frame: the filter's tc mirred action (default, cheapest) "
                        "or the program itself with bpf_clone_redirect()")
    p.add_argument("--hook", default="tc", choices=("tc", "xdp"),
                   help="tc (default): copy at the TC clsact hook, on any node; xdp: on a node that routes, send "
                        "each watched frame out of its egress and to the monitor from the XDP hook, before the "
                        "kernel builds an skb (the interfaces it taps are where traffic comes in)")
    add_xdp_mode(p)
    p.add_argument("--forward", default="watched", choices=("watched", "all"),
                   help="--hook xdp: what the fast path sends out: the watched frames (default; the rest go "
                        "the kernel's way, its netfilter and counters) or every frame it can")
    p.add_argument("--prepare-peer", action="store_true",
                   help="--hook xdp: where the monitor or an egress is a veth whose peer runs no native XDP "
                        "program (it then takes no XDP frames), attach a pass program there while this runs")
    add_run_options(p, "vtap filters (and the clsact qdiscs vtap created) and XDP programs")
    # For developers: load a modified copy of the C text.
    p.add_argument("--program", metavar="FILE", help=argparse.SUPPRESS)


def check_args(a):
    check_run_options(a)
    if a.cleanup:
        return
    if a.sessions:
        from .sessions_cmd import check_args as check_sessions  # noqa: PLC0415 -- pulls pyroute2 (see the top)
        return check_sessions(a)
    if not a.monitor:
        raise UsageError("--monitor is required (the interface the copies leave through), or --sessions FILE")
    if not 1 <= a.sample <= SAMPLE_MAX:
        raise UsageError(f"--sample must be from 1 (every matched packet) to {SAMPLE_MAX}, not {a.sample}")
    if a.watch_max is not None and a.watch_max < 1:
        raise UsageError(f"--watch-max must be at least 1, not {a.watch_max}")
    if a.monitor in a.iface:
        raise UsageError(f"monitor {a.monitor} is also a tapped interface (its own clones would loop)")
    require(a)  # an interface given twice
    if a.hook == "xdp":
        from .xdp_hook import check_args as check_xdp  # noqa: PLC0415 -- pulls pyroute2 (see the top)
        check_xdp(a)
    else:
        xdp_only = [o for o in ("--xdp-mode", "--forward", "--prepare-peer") if o in a.options_given(a)]
        if xdp_only:
            raise UsageError(f"{', '.join(xdp_only)} go(es) with --hook xdp")


def watch_list(a):
    """--watch and --watch-file together, or None (mirror everything)."""
    if not a.watch and not a.watch_file:
        return None
    nets = parse_watch_list(a.watch)
    for path in a.watch_file:
        nets += read_watch_file(path)
    return nets  # parsed: TcMirror takes them as they are


class Printer(CounterTable):
    """Live counters per tapped interface (lab.console.CounterTable), and the
    line that says what is tapped."""

    def __init__(self, as_json, out=sys.stdout):
        super().__init__(as_json, RATES, TOTALS, HEADS, key="IFACE", rows_name="ifaces", out=out)

    def header(self, tap, ifaces, direction):
        watch = ", ".join(tap.watch[:5]) + (f" and {len(tap.watch) - 5} more" if len(tap.watch) > 5 else "") \
            if tap.watch is not None else "everything"
        msg = dict(monitor=tap.monitor, ifaces=ifaces, direction=direction,
                   watch=None if tap.watch is None else tap.watch[:WATCH_SHOWN],
                   watch_count=None if tap.watch is None else len(tap.watch),
                   match=tap.match, sample=tap.sample, clone=tap.clone)
        self.attached(msg, f"vtap: tapping {', '.join(ifaces)} ({direction}) -> {tap.monitor}; "
                           f"watching {watch} (match {tap.match}), sample 1/{tap.sample}; Ctrl-C to stop",
                      names=ifaces)  # interface names are up to 15 characters


def cleanup(all_runs=False):
    """What killed vtaps left in this namespace, at either hook: (removed, spared), as lines."""
    from ebpf import tc  # noqa: PLC0415 -- pulls pyroute2 (see the top)

    from .xdp_hook import cleanup as xdp_cleanup  # noqa: PLC0415 -- pulls pyroute2 (see the top)
    removed, spared = tc.cleanup("vtap", spare_live=not all_runs)
    spared = [f"filter {f.entry.name} on {f.where} alone: a running vtap holds it "
              f"(pid {', '.join(map(str, f.pids))})" for f in spared]
    xdp_removed, xdp_spared = xdp_cleanup(all_runs)
    from .sessions_cmd import cleanup as sessions_cleanup  # noqa: PLC0415 -- pulls pyroute2 (see the top)
    s_removed, s_spared = sessions_cleanup(all_runs)
    return removed + xdp_removed + s_removed, spared + xdp_spared + s_spared


def warn_at_start(tap):
    from ebpf import netdev  # noqa: PLC0415 -- pulls pyroute2 (see the top)
    with netdev.ipr(tap.netns) as ip:
        kind = netdev.opaque(ip, netdev.ifindex_of(ip, tap.monitor, tap.netns))
    if kind:
        warn(f"monitor {tap.monitor} is a {kind} device: vtap cannot tell which interfaces its copies leave "
             "through, so it cannot refuse a tap that would copy them again; do not tap those at egress")
    for f in tap.tc_filters:
        if f.runs_after:
            warn(f"{f.runs_after} existing filter(s) on {f.ifname} {f.direction} run before the vTAP; "
                 "frames they stop are not mirrored")


def monitor_news(state, tap, note=""):
    """What to say when the monitor enters `state` (TcMirror.health())."""
    m = tap.monitor
    refused = ("its copies are refused and counted as failed" if tap.clone == "action" else
               "the kernel drops the copies without an error (not counted as failed)")
    return {
        "up": f"monitor {m} is up again",
        "down": f"monitor {m} is down: {refused}",
        "no-carrier": f"monitor {m} has no carrier (its link is down): {refused}",
        "gone": f"monitor {m} was deleted: copies fail (counted as failed) until an interface named {m} "
                "appears again" + (f" ({note})" if note else ""),
        "renewed": f"monitor {m} was made again: copies go to the new {m}",
    }[state]


class Watcher:
    """What changes outside while we run, each said once, when it happens."""

    def __init__(self, tap):
        self.tap = tap
        self.monitor_state = "up"  # what the start assumes: anything else is said at the first check
        self.oversize = 0

    def check(self, totals=None):
        h = self.tap.health()
        if h.missing:
            f, why = h.missing[0]
            raise BpfError(f"stopped: the vTAP filter on {f.ifname} {f.direction} is gone: {why}")
        if h.monitor_state == "renewed" or h.monitor_state != self.monitor_state:
            warn(monitor_news(h.monitor_state, self.tap, h.note))
        self.monitor_state = "up" if h.monitor_state == "renewed" else h.monitor_state
        if totals is not None:
            if totals["oversize"] > self.oversize == 0:
                warn(f"{totals['oversize']} copies were longer than monitor {self.tap.monitor}'s MTU "
                     f"({h.monitor_mtu}) allows: the kernel fragments or drops them (counted as oversize)")
            self.oversize = totals["oversize"]


def run(a):
    from ebpf import TcMirror  # noqa: PLC0415 -- pulls pyroute2 (see the top)

    if a.cleanup:
        return report_cleanup("vtap", *cleanup(a.all))
    if a.sessions:
        from .sessions_cmd import run as run_sessions  # noqa: PLC0415 -- pulls pyroute2 (see the top)
        return run_sessions(a)
    if a.hook == "xdp":
        from .xdp_hook import run as run_xdp  # noqa: PLC0415 -- pulls pyroute2 (see the top)
        return run_xdp(a, watch_list(a))
    tap = TcMirror(monitor=a.monitor, watch=watch_list(a), match=a.match, sample=a.sample, clone=a.clone,
                   watch_max=a.watch_max, source=a.program)
    tap.warn = warn  # its notes (another vTAP on a hook it taps) as this command's warnings
    if a.iface:
        ifaces = a.iface
        for ifname in ifaces:  # all names checked before anything is attached
            tap.check_iface(ifname, a.direction)
    else:
        ifaces, skipped = tap.default_interfaces(a.direction)
        for name, why in skipped.items():
            safe = [d for d in ("ingress", "egress") if d != a.direction and tap.loop_reason(name, d) is None]
            hint = f"; --iface {name} --direction {safe[0]} taps it safely" if safe else ""
            warn(f"not tapping {name}: {why}{hint}")
    if not ifaces:
        raise UsageError("no interface to tap: none is UP besides lo and the interfaces that carry the copies "
                         "(use --iface)")
    if a.ebpf:
        return show_program(tap)

    printer = Printer(a.json)
    metrics = serving(printer, a, "vtap", rows={"ifaces": "interface"})
    SIGNALS.check()
    with metrics, tap:
        tap.load_program()
        SIGNALS.check()
        tap.attach_many(ifaces, a.direction)
        SIGNALS.check()
        warn_at_start(tap)
        watcher = Watcher(tap)
        watcher.check()
        printer.header(tap, ifaces, a.direction)  # after the warnings: "attached" means ready
        printer.sample(*tap.snapshot())

        def tick():
            totals, per_iface = tap.snapshot()
            watcher.check(totals)
            printer.sample(totals, per_iface)
        run_until_stopped(a.interval, a.duration, tick, lambda: printer.sample(*tap.snapshot(), final=True))
    return 0


def main(a):
    """The vTAP's command, its arguments parsed (by cli(), or by python -m lab vtap)."""
    SIGNALS.install()  # first, so that a signal during compile or attach detaches too
    return run_command("vtap", lambda: check_args(a), lambda: run(a))


def cli(argv=None):
    """`vtap` and `python -m vtap`."""
    SIGNALS.install()  # before parsing: a signal at any moment is a clean stop
    p = ArgumentParser(prog="vtap")
    add_arguments(p)
    return main(p.parse_args(sys.argv[1:] if argv is None else argv))
