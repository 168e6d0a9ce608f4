"""vtap --hook xdp: the XDP vTAP (ebpf.XdpMirror) on a node that routes.

The command's options and cleanup are the TC vTAP's (command.py), its exit
statuses, signals and loop the lifecycle's (lab.lifecycle); what differs is
said here: what the node must have (checked at start, each lack said with the
command that fixes it), which interfaces it taps by default, its live table,
and what it watches while it runs.
"""

import contextlib

from ebpf import netdev, xdp
from ebpf.vtap.xdp_mirror import SLOW_REASONS, XdpMirror, can_transmit_xdp
from lab import hostcheck
from lab.console import SIGNALS, CounterTable, UsageError, warn

from .command_base import (
    NO_INTERFACE,
    TapCommand,
    Watcher,
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

RATES = ("seen", "matched", "cloned", "failed")
TOTALS = ("seen", "matched", "cloned", "sampled_out", "failed", "to_kernel", "forwarded", "not_ip", "malformed")
HEADS = {"sampled_out": "SAMPLED", "to_kernel": "TO-KERNEL", "not_ip": "NOT-IP"}
PROGRAM = "xdp_mirror"  # the program's name on a hook: what --cleanup looks for


def families(tap):
    """The IP versions the watch-list can match (both when it watches everything)."""
    if tap.watch is None:
        return {4, 6}
    return {6 if ":" in w else 4 for w in tap.watch} or {4, 6}


def blocking(args, tap, ifaces) -> list:
    """What would leave the vTAP copying nothing: refused at start (exit 2)."""
    found = []
    for name in ifaces:
        found += hostcheck.check_forwarding(
            name, families(tap), tap.netns, why=": the fast path sends out only what the node would forward"
        )
    if args.xdp_mode == "native":
        veth = hostcheck.veth_peer(tap.monitor, tap.netns) is not None
        if veth and not args.prepare_peer:
            found += [
                hostcheck.Finding(f"no copy would reach the monitor: {f.what}", f.fix)
                for f in hostcheck.check_veth_peer(tap.monitor, tap.netns, sends="XDP_REDIRECT")
            ]
        elif not veth and can_transmit_xdp(tap.netns, tap.monitor_ifindex) is False:
            found.append(
                hostcheck.Finding(
                    f"no copy would reach the monitor: {tap.monitor}'s driver does not "
                    "transmit XDP frames (a tunnel, a bridge, a VLAN device)",
                    "--xdp-mode generic (copies as skbs, which any device takes), or a "
                    "monitor whose driver does (veth, tun, most NICs)",
                )
            )
    return found


def egress_findings(tap) -> list:
    """Interfaces the fast path cannot send out of: watched frames routed there go
    the kernel's way, not copied (counted as no_xdp_egress)."""
    found = []
    for name, why in tap.not_egresses.items():
        fix = "--prepare-peer" if "veth peer" in why else ""
        found.append(
            hostcheck.Finding(
                f"watched frames routed out of {name} go to the kernel, not copied (no_xdp_egress): {why}", fix
            )
        )
    return found


class Printer(CounterTable):
    def __init__(self, as_json, cutoff=False):
        totals = (*TOTALS, "cut") if cutoff else TOTALS
        super().__init__(as_json, RATES, totals, HEADS, key="IFACE", rows_name="ifaces")

    def header(self, tap, ifaces, mode, alerts=None):
        msg = dict(
            hook="xdp",
            xdp_mode=mode,
            monitor=tap.monitor,
            ifaces=ifaces,
            egresses=tap.egresses,
            **watch_fields(tap),
            match=tap.match,
            sample=tap.sample,
            forward=tap.forward,
            **cutoff_fields(tap),
            alerts=alerts,
        )
        self.attached(
            msg,
            f"vtap: tapping {', '.join(ifaces)} (XDP, {mode}) -> {tap.monitor}, sending out of "
            f"{', '.join(tap.egresses) or 'no interface yet'}; watching {watch_said(tap)} "
            f"(match {tap.match}), sample 1/{tap.sample}{cutoff_said(tap)}{alerts_said(alerts)}; Ctrl-C to stop",
            names=ifaces,
        )

    def reasons(self, totals):
        """The final block's last line: why watched frames went to the kernel."""
        shown = ", ".join(f"{k.replace('_', '-')} {totals[k]}" for k in SLOW_REASONS if totals[k])
        if shown and not self.json:
            self.emit(f"{'':8} to the kernel, by reason: {shown}")


class XdpWatcher(Watcher):
    """The XDP vTAP's: its programs, its monitor, and the interfaces the fast
    path can send out of (its health() rereads them)."""

    def __init__(self, tap):
        super().__init__(tap)
        self.not_egresses = dict(tap.not_egresses)

    def stopped(self, missing):
        return (
            f"stopped: the XDP vTAP was removed from {', '.join(a.ifname for a, _ in missing)} "
            "from outside (vtap --hook xdp --cleanup --all, ip link set ... xdp off)"
        )

    def news(self, state, note=""):
        m = self.tap.monitor
        return {
            "up": f"monitor {m} takes copies again",
            "down": f"monitor {m} is down: its copies are lost (counted as failed)",
            "no-carrier": f"monitor {m} has no carrier: its copies are lost (counted as failed)",
            "gone": f"monitor {m} was deleted: its copies are lost (counted as failed)",
            "no-xdp": f"monitor {m} takes no XDP frames now (a veth whose peer runs no XDP program): "
            "frames go to their egress alone, each copy counted as failed",
        }[state]

    def check(self):
        h = super().check()  # also rereads the egresses
        now = self.tap.not_egresses
        for name, why in now.items():
            if name not in self.not_egresses:
                warn(f"watched frames routed out of {name} now go to the kernel, not copied: {why}")
        for name in self.not_egresses:
            if name not in now:
                warn(f"the fast path sends out of {name} again")
        self.not_egresses = dict(now)
        return h


class XdpCommand(TapCommand):
    """`vtap --hook xdp` (VtapCommand.variant() picks it)."""

    def parse(self, args):
        """What cannot apply at XDP, refused in one line (UsageError: exit 2)."""
        check_watch_options(args)
        if args.direction != "ingress":
            raise UsageError(
                f"--direction {args.direction} cannot apply with --hook xdp: XDP sees frames as they "
                "arrive, on the interface they come in on (tap the interfaces traffic comes in on)"
            )
        if args.clone != "action":
            raise UsageError(
                "--clone cannot apply with --hook xdp: at XDP the kernel's devmap broadcast makes the copy"
            )
        if args.xdp_mode == "offload":
            raise UsageError(
                "--xdp-mode offload cannot apply to the XDP vTAP (its redirects need the host): native or generic"
            )
        self.watch = watch_list(args)
        self.cutoff = cutoff_options(args)
        self.alerts = alert_options(args)

    def cleanup(self, all_runs=False):
        """What killed XDP vTAPs left in this namespace: their programs, and the pass
        programs --prepare-peer put on veth peers."""
        removed, spared = xdp.cleanup(PROGRAM, spare_live=not all_runs)
        removed += hostcheck.cleanup_peer_programs()
        return removed, spared

    def build(self):
        args = self.args
        self.tap = tap = XdpMirror(
            monitor=args.monitor,
            watch=self.watch,
            match=args.match,
            sample=args.sample,
            watch_max=args.watch_max,
            forward=args.forward,
            source=args.program,
            **self.cutoff,
        )
        tap.warn = warn
        if args.iface:
            self.ifaces = args.iface
        else:
            self.ifaces, skipped = tap.default_interfaces()
            for name, why in skipped.items():
                warn(f"not tapping {name}: {why}")
        if not self.ifaces:
            raise UsageError(NO_INTERFACE)
        for name in self.ifaces:  # all names checked before anything is attached
            tap.check_iface(name, args.xdp_mode)
        return tap

    def start(self, stack):
        args, tap = self.args, self.tap
        found = blocking(args, tap, self.ifaces)  # after --ebpf, which shows the program on any node
        if found:
            raise UsageError("; ".join(map(str, found)))
        peers = stack.enter_context(contextlib.closing(hostcheck.PreparedPeers()))
        tap.load_program()
        SIGNALS.check()
        if args.prepare_peer and args.xdp_mode == "native":
            with netdev.ipr(None) as ip:
                names = [d.name for d in netdev.devices(ip).values() if d.up and d.name != "lo"]
            for name in names:
                if peer := peers.prepare(name):
                    warn(f"attached a pass program to {name}'s veth peer {peer.ifname} ({peer.label}) while this runs")
        tap.attach_many(self.ifaces, args.xdp_mode)
        SIGNALS.check()
        for finding in egress_findings(tap) + sum((hostcheck.check_gro(n, args.xdp_mode) for n in self.ifaces), []):
            warn(str(finding))
        self.watcher = XdpWatcher(tap)
        self.watcher.check()
        if self.alerts:  # after the hooks: a host an alert names is copied from then on
            tap.follow_alerts(**self.alerts)

    def table(self):
        self.live = Printer(self.args.json, cutoff=bool(self.tap.flows))
        return self.live

    def header(self):
        self.live.header(self.tap, self.ifaces, self.args.xdp_mode, self.alerts)

    def tick(self):
        self.watcher.check()

    def sample(self, final=False):
        totals, rows = self.tap.snapshot()
        totals = {**totals, **self.tap.alert_counters()}  # the JSON's and the metrics' too
        self.live.sample(totals, rows, final=final)
        if final:
            self.live.reasons(totals)
            if self.tap.flows and not self.args.json:
                self.live.emit(f"{'':8} {cutoff_summary(totals)}")
            if self.alerts and not self.args.json:
                self.live.emit(f"{'':8} {alerts_summary(totals)}")
