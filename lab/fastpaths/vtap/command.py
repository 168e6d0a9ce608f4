"""vtap: mirror watched traffic to a monitor interface with an eBPF TC program
(ebpf.TcMirror), or (--hook xdp, on a node that routes) an XDP program
(xdp_command.py), or sessions from a file (--sessions FILE: sessions_command.py).
`vtap`, `python -m vtap` (the entry, the package vtap/) and `python -m lab vtap`
run it.

Here: the options all three take, and what is the TC vTAP's own (VtapCommand,
whose variant() is the command of the other two when they are asked for); the
lifecycle every tool shares (lab.lifecycle) does the rest. It runs in whatever
network namespace it is started in; every exit detaches what it attached, and
only that. See `python -m vtap --help` for examples.

Exit status: 0 when it ran and was stopped (--duration, Ctrl-C, SIGTERM, SIGHUP,
or its output closed, as by `| head`); 2 when the command as given cannot run
(bad options or values, an unknown interface, a monitor whose copies would loop,
a bad watch-list file, not root); 1 when it was tried and failed (BCC missing,
the compiler or the verifier refused, a hook refused, or its filter vanished
while it ran).
"""

import argparse
import sys

from lab.console import SIGNALS, CounterTable, UsageError, add_xdp_mode, warn

from .command_base import (
    NO_INTERFACE,
    SAMPLE_MAX,
    TapCommand,
    Watcher,
    add_alert_options,
    add_cutoff_options,
    alert_options,
    alerts_said,
    alerts_summary,
    check_watch_options,
    cutoff_fields,
    cutoff_options,
    cutoff_said,
    cutoff_summary,
    watch_fields,
    watch_list,
    watch_said,
)

# The kernel program, the other hooks' commands (sessions_command.py, xdp_command.py) and ebpf's netdev
# and tc are imported where they are used: they pull pyroute2 (a quarter of a second), which `vtap --help`
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
  vtap --monitor mon0 --cutoff 1MiB            # each flow's first MiB per direction, then only
                                               # its SYN/FIN/RST: what an IDS needs of elephants
  vtap --monitor mon0 --alerts /var/log/suricata/eve.json --alert-hold 600
                                               # the hosts the IDS's alerts name, 10 minutes each
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
XDP_ONLY = ("--xdp-mode", "--forward", "--prepare-peer")


class Printer(CounterTable):
    """Live counters per tapped interface (lab.console.CounterTable), and the
    line that says what is tapped."""

    def __init__(self, as_json, out=sys.stdout, cutoff=False):
        totals = (*TOTALS, "cut") if cutoff else TOTALS
        super().__init__(as_json, RATES, totals, HEADS, key="IFACE", rows_name="ifaces", out=out)

    def header(self, tap, ifaces, direction, alerts=None):
        msg = dict(
            monitor=tap.monitor,
            ifaces=ifaces,
            direction=direction,
            **watch_fields(tap),
            match=tap.match,
            sample=tap.sample,
            clone=tap.clone,
            **cutoff_fields(tap),
            alerts=alerts,
        )
        self.attached(
            msg,
            f"vtap: tapping {', '.join(ifaces)} ({direction}) -> {tap.monitor}; "
            f"watching {watch_said(tap)} (match {tap.match}), sample 1/{tap.sample}{cutoff_said(tap)}"
            f"{alerts_said(alerts)}; Ctrl-C to stop",
            names=ifaces,
        )  # interface names are up to 15 characters


def warn_at_start(tap):
    from ebpf import netdev  # noqa: PLC0415 -- pulls pyroute2 (see the top)

    with netdev.ipr(tap.netns) as ip:
        kind = netdev.opaque(ip, netdev.ifindex_of(ip, tap.monitor, tap.netns))
    if kind:
        warn(
            f"monitor {tap.monitor} is a {kind} device: vtap cannot tell which interfaces its copies leave "
            "through, so it cannot refuse a tap that would copy them again; do not tap those at egress"
        )
    for f in tap.tc_filters:
        if f.runs_after:
            warn(
                f"{f.runs_after} existing filter(s) on {f.ifname} {f.direction} run before the vTAP; "
                "frames they stop are not mirrored"
            )


def monitor_news(state, tap, note=""):
    """What to say when the monitor enters `state` (TcMirror.health())."""
    m = tap.monitor
    refused = (
        "its copies are refused and counted as failed"
        if tap.clone == "action"
        else "the kernel drops the copies without an error (not counted as failed)"
    )
    return {
        "up": f"monitor {m} is up again",
        "down": f"monitor {m} is down: {refused}",
        "no-carrier": f"monitor {m} has no carrier (its link is down): {refused}",
        "gone": f"monitor {m} was deleted: copies fail (counted as failed) until an interface named {m} "
        "appears again" + (f" ({note})" if note else ""),
        "renewed": f"monitor {m} was made again: copies go to the new {m}",
    }[state]


class TcWatcher(Watcher):
    """The TC vTAP's: its filters, its monitor (monitor_news()), and copies
    longer than the monitor's MTU, said the first time there are any."""

    def __init__(self, tap):
        super().__init__(tap)
        self.oversize = 0

    def stopped(self, missing):
        f, why = missing[0]
        return f"stopped: the vTAP filter on {f.ifname} {f.direction} is gone: {why}"

    def news(self, state, note=""):
        return monitor_news(state, self.tap, note)

    def check(self, totals=None):
        h = super().check()
        if totals is not None:
            if totals["oversize"] > self.oversize == 0:
                warn(
                    f"{totals['oversize']} copies were longer than monitor {self.tap.monitor}'s MTU "
                    f"({h.monitor_mtu}) allows: the kernel fragments or drops them (counted as oversize)"
                )
            self.oversize = totals["oversize"]
        return h


class VtapCommand(TapCommand):
    """The vTAP at the TC clsact hook; with --hook xdp or --sessions FILE, its
    variant() is the command that runs them."""

    description = (
        "Clone packets whose source or destination is on a watch-list to a monitor interface "
        "(eBPF at the TC clsact hook; with --hook xdp, on a node that routes, at the XDP hook)."
    )
    examples = EXAMPLES
    cleans = "vtap filters (and the clsact qdiscs vtap created) and XDP programs"

    def __init__(self):
        super().__init__()
        self.taken = None  # the snapshot tick() took, for the sample after it

    def options(self, p):
        """The options of all three (one parser: the variant is chosen from them)."""
        p.add_argument("--monitor", metavar="MON", help="interface the copies leave through")
        p.add_argument(
            "--sessions",
            metavar="FILE",
            help="sessions from a TOML file, re-read when it changes: each with a target (an interface "
            "or vxlan://, geneve://, gre://, erspan://, erspan3:// a collector), ordered accept/"
            "reject rules (protocol, addresses, ports, direction), truncate, sample "
            "(docs/vtap.md; instead of --monitor and --watch)",
        )
        p.add_argument(
            "--iface",
            metavar="IF",
            action="append",
            default=[],
            help="interface to tap (repeatable; default: every UP interface but lo and those that "
            "carry the copies: the monitor, its veth peer, a tunnel monitor's underlay)",
        )
        p.add_argument(
            "--watch",
            metavar="CIDR",
            action="append",
            default=[],
            help="IPv4/IPv6 address or network to watch (repeatable; default: mirror everything)",
        )
        p.add_argument(
            "--watch-file",
            metavar="FILE",
            action="append",
            default=[],
            help="read more CIDRs from FILE, one per line, '#' starts a comment; - is stdin (repeatable)",
        )
        p.add_argument(
            "--watch-max",
            type=int,
            metavar="N",
            help="watch-list room per address family (default: 1024, or the list's size if larger)",
        )
        p.add_argument(
            "--match", default="any", choices=("src", "dst", "any"), help="which address must be watched (default any)"
        )
        p.add_argument(
            "--direction",
            default="ingress",
            choices=("ingress", "egress", "both"),
            help="which hook of each interface (default ingress)",
        )
        p.add_argument(
            "--sample",
            type=int,
            default=1,
            metavar="N",
            help=f"mirror 1 in N matched packets, N from 1 to {SAMPLE_MAX} (default 1: all)",
        )
        p.add_argument(
            "--clone",
            default="action",
            choices=("action", "helper"),
            help="who copies a matched frame: the filter's tc mirred action (default, cheapest) "
            "or the program itself with bpf_clone_redirect()",
        )
        p.add_argument(
            "--hook",
            default="tc",
            choices=("tc", "xdp"),
            help="tc (default): copy at the TC clsact hook, on any node; xdp: on a node that routes, "
            "send each watched frame out of its egress and to the monitor from the XDP hook, "
            "before the kernel builds an skb (the interfaces it taps are where traffic comes in)",
        )
        add_cutoff_options(p)
        add_alert_options(p)
        add_xdp_mode(p)  # here, not by xdp_mode = True: among the options of --hook xdp
        p.add_argument(
            "--forward",
            default="watched",
            choices=("watched", "all"),
            help="--hook xdp: what the fast path sends out: the watched frames (default; the rest go "
            "the kernel's way, its netfilter and counters) or every frame it can",
        )
        p.add_argument(
            "--prepare-peer",
            action="store_true",
            help="--hook xdp: where the monitor or an egress is a veth whose peer runs no native XDP "
            "program (it then takes no XDP frames), attach a pass program there while this runs",
        )

    def add_arguments(self, p):
        super().add_arguments(p)
        # For developers: load a modified copy of the C text.
        p.add_argument("--program", metavar="FILE", help=argparse.SUPPRESS)

    def variant(self, args):
        """The command of --sessions FILE or --hook xdp; this one at TC (and for
        --cleanup, which removes what any of the three left)."""
        if args.cleanup:
            return self
        if args.sessions:
            from .sessions_command import SessionsCommand  # noqa: PLC0415 -- pulls pyroute2 (see the top)

            return SessionsCommand()
        if args.hook == "xdp":
            from .xdp_command import XdpCommand  # noqa: PLC0415 -- pulls pyroute2 (see the top)

            return XdpCommand()
        return self

    def parse(self, args):
        check_watch_options(args)
        xdp_only = [o for o in XDP_ONLY if o in args.options_given(args)]
        if xdp_only:
            raise UsageError(f"{', '.join(xdp_only)} go(es) with --hook xdp")
        self.watch = watch_list(args)
        self.cutoff = cutoff_options(args)
        self.alerts = alert_options(args)

    def cleanup(self, all_runs=False):
        """What killed vtaps left in this namespace, at either hook and of sessions: (removed, spared), as lines."""
        from ebpf import tc  # noqa: PLC0415 -- pulls pyroute2 (see the top)

        from .sessions_command import SessionsCommand  # noqa: PLC0415 -- pulls pyroute2 (see the top)
        from .xdp_command import XdpCommand  # noqa: PLC0415 -- pulls pyroute2 (see the top)

        removed, spared = tc.cleanup("vtap", spare_live=not all_runs)
        spared = [
            f"filter {f.entry.name} on {f.where} alone: a running vtap holds it (pid {', '.join(map(str, f.pids))})"
            for f in spared
        ]
        xdp_removed, xdp_spared = XdpCommand().cleanup(all_runs)
        s_removed, s_spared = SessionsCommand().cleanup(all_runs)
        return removed + xdp_removed + s_removed, spared + xdp_spared + s_spared

    def build(self):
        from ebpf.vtap.tc_mirror import TcMirror  # noqa: PLC0415 -- pulls pyroute2 (see the top)

        args = self.args
        self.tap = tap = TcMirror(
            monitor=args.monitor,
            watch=self.watch,
            match=args.match,
            sample=args.sample,
            clone=args.clone,
            watch_max=args.watch_max,
            source=args.program,
            **self.cutoff,
        )
        tap.warn = warn  # its notes (another vTAP on a hook it taps) as this command's warnings
        if args.iface:
            self.ifaces = args.iface
            for ifname in self.ifaces:  # all names checked before anything is attached
                tap.check_iface(ifname, args.direction)
        else:
            self.ifaces, skipped = tap.default_interfaces(args.direction)
            for name, why in skipped.items():
                safe = [d for d in ("ingress", "egress") if d != args.direction and tap.loop_reason(name, d) is None]
                hint = f"; --iface {name} --direction {safe[0]} taps it safely" if safe else ""
                warn(f"not tapping {name}: {why}{hint}")
        if not self.ifaces:
            raise UsageError(NO_INTERFACE)
        return tap

    def start(self, stack):
        self.tap.load_program()
        SIGNALS.check()
        self.tap.attach_many(self.ifaces, self.args.direction)
        SIGNALS.check()
        warn_at_start(self.tap)
        self.watcher = TcWatcher(self.tap)
        self.watcher.check()
        if self.alerts:  # after the hooks: a host an alert names is copied from then on
            self.tap.follow_alerts(**self.alerts)

    def table(self):
        self.live = Printer(self.args.json, cutoff=bool(self.tap.flows))
        return self.live

    def header(self):
        self.live.header(self.tap, self.ifaces, self.args.direction, self.alerts)

    def tick(self):
        self.taken = self.tap.snapshot()  # what the watcher sees is what the sample shows
        self.watcher.check(self.taken[0])

    def sample(self, final=False):
        taken, self.taken = self.taken, None
        totals, per_iface = self.tap.snapshot() if final or taken is None else taken
        totals = {**totals, **self.tap.alert_counters()}  # the JSON's and the metrics' too
        self.live.sample(totals, per_iface, final=final)
        if final and self.tap.flows and not self.args.json:
            self.live.emit(f"{'':8} {cutoff_summary(totals)}")
        if final and self.alerts and not self.args.json:
            self.live.emit(f"{'':8} {alerts_summary(totals)}")


COMMAND = VtapCommand()
