"""vtap --sessions FILE: vTAP sessions (ebpf.SessionMirror) from a sessions
file, re-read whenever it changes.

The command's options and cleanup are the TC vTAP's (command.py), its exit
statuses, signals and loop the lifecycle's (lab.lifecycle); what differs is
said here: the sessions file (ebpf/vtap/sessions/config.py for its format), the
live table (one row per session) and the sender devices a killed run leaves.

A changed file is read whole and checked before anything changes: a bad one
is said in one line (file and line) and the sessions in force stay.
"""

import hashlib
import os

from ebpf import netdev
from ebpf.errors import BpfError, InputError
from ebpf.vtap.cutoff import FLOWS_MAX
from ebpf.vtap.sessions.config import parse_sessions
from ebpf.vtap.sessions.tc_sessions import SESSION_COUNTERS, SessionMirror, sender_pid
from lab.console import SIGNALS, CounterTable, UsageError, warn
from lab.exporter import Rows
from lab.netns import alive

from .command_base import TapCommand, alert_options, alerts_said, alerts_summary

RATES = ("accepted", "sent")
TOTALS = ("accepted", "rejected", "sent", "truncated", "sampled_out", "shadowed", "oversize", "failed")
HEADS = {"sampled_out": "SAMPLED"}
SIMPLE_ONLY = (
    "--monitor",
    "--watch",
    "--watch-file",
    "--watch-max",
    "--match",
    "--sample",
    "--clone",
    "--xdp-mode",
    "--forward",
    "--prepare-peer",
)


class SessionsFile:
    """The file and what was last applied from it, by content."""

    def __init__(self, path):
        self.path = path
        self.digest = None
        self.bad = None  # the digest of a bad version already said

    def read(self):
        """(sessions, digest) of the file now; InputError 'FILE:LINE: what'."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise InputError(f"{self.path}: cannot read: {e.strerror}") from None
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise InputError(f"{self.path}:1: not UTF-8 text") from None
        return parse_sessions(text, self.path), hashlib.sha256(data).hexdigest()

    def changed(self, tap):
        """Apply the file if its content changed; say a bad version once."""
        try:
            with open(self.path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except OSError as e:
            digest = f"unreadable: {e.strerror}"
        if digest in (self.digest, self.bad):
            return False
        try:
            sessions, digest = self.read()
            tap.set_sessions(sessions)
        except InputError as e:
            self.bad = digest
            warn(f"{e}; the sessions in force stay")
            return False
        self.digest, self.bad = digest, None
        warn(f"{self.path}: applied ({describe(sessions)})")
        return True


def describe(sessions):
    return (
        "; ".join(
            f"{s.label} -> {s.target}, {len(s.rules)} rule{'s' if len(s.rules) != 1 else ''}"
            + (f", truncate {s.truncate}" if s.truncate else "")
            + (f", sample 1/{s.sample}" if s.sample > 1 else "")
            + (f", cutoff {s.cutoff}" if s.cutoff else "")
            for s in sessions
        )
        or "no sessions"
    )


class Printer(CounterTable):
    def __init__(self, as_json, cutoff=False):
        totals = (*TOTALS, "cut") if cutoff else TOTALS
        super().__init__(as_json, RATES, totals, HEADS, key="SESSION", rows_name="sessions")
        self.extra = {}

    def header(self, tap, ifaces, direction, path, alerts=None):
        msg = dict(
            sessions_file=path,
            ifaces=ifaces,
            direction=direction,
            sender=tap.sender,
            sessions=[
                dict(
                    name=s.label,
                    number=s.number,
                    target=str(s.target),
                    rules=len(s.rules),
                    truncate=s.truncate,
                    sample=s.sample,
                    cutoff=s.cutoff,
                )
                for s in tap.sessions
            ],
            alerts=alerts,
        )
        self.attached(
            msg,
            f"vtap: tapping {', '.join(ifaces)} ({direction}); sessions from {path}: "
            f"{describe(tap.sessions)}{alerts_said(alerts)}; Ctrl-C to stop",
            names=[s.label for s in tap.sessions],
        )

    def rows(self, tap):
        """(totals, {session: counters}); the taps' counters per interface and
        the rules' go beside them in --json and --metrics (self.extra)."""
        rows = tap.session_counters()
        totals = {k: sum(r[k] for r in rows.values()) for k in SESSION_COUNTERS}
        taps, per_iface = tap.snapshot()
        if tap.flows:  # the cutoff's table, one for every session
            totals.update({k: taps[k] for k in ("flows", "evicted")})
        rules = {f"{label}\x1f{n}": {"matches": hits} for (label, n, _), hits in tap.rule_counters().items()}
        self.extra = {"ifaces": per_iface, "rules": rules}
        return totals, rows

    def publish(self, body):
        body.update(self.extra)  # the JSON line shows them too
        if self.json:  # rows keyed "session\x1frule" for --metrics, "session #rule" in JSON
            body["rules"] = {k.replace("\x1f", " #"): v for k, v in self.extra["rules"].items()}
            if self.exporter is not None:
                self.exporter.publish({**body, "rules": self.extra["rules"]})
            return
        super().publish(body)


class SessionsCommand(TapCommand):
    """`vtap --sessions FILE` (VtapCommand.variant() picks it)."""

    metrics_rows = {
        "sessions": Rows("session", "session_"),
        "ifaces": "interface",
        "rules": Rows(("session", "rule"), "rule_"),
    }

    def __init__(self):
        super().__init__()
        self.path_said = None  # the last path problem said (said once, until it changes or mends)

    def parse(self, args):
        given = [o for o in SIMPLE_ONLY if o in args.options_given(args)]
        if given:
            raise UsageError(
                f"{', '.join(given)} cannot go with --sessions: a session in the file says where "
                "copies go, what they are and how many (target, rules, truncate, sample)"
            )
        if args.hook != "tc":
            raise UsageError("--sessions runs at the TC hook (--hook tc)")
        self.alerts = alert_options(args, sessions=True)
        if args.cutoff is not None:
            raise UsageError(
                '--cutoff cannot go with --sessions: give the sessions to cut a cutoff in the file (cutoff = "1MiB"); '
                "--flows N keeps a table for cutoffs the file may gain later"
            )
        if args.flows is not None and not 1 <= args.flows <= FLOWS_MAX:
            raise UsageError(f"--flows must be from 1 to {FLOWS_MAX}, not {args.flows}")
        if args.flow_timeout is not None and not args.flow_timeout > 0:
            raise UsageError(f"--flow-timeout must be a positive number of seconds, not {args.flow_timeout:g}")
        self.source = SessionsFile(args.sessions)
        self.sessions, self.source.digest = self.source.read()

    def cleanup(self, all_runs=False):
        """Sender devices of killed runs in this namespace (all of them with all_runs)."""
        removed, spared = [], []
        with netdev.ipr() as ip:
            for dev in netdev.devices(ip).values():
                pid = sender_pid(dev.name or "")
                if pid is None or dev.kind != "ifb":
                    continue
                if alive(pid) and pid != os.getpid() and not all_runs:
                    spared.append(f"sender device {dev.name}: a running vtap holds it (pid {pid})")
                    continue
                ip.link("del", index=dev.index)
                removed.append(f"sender device {dev.name} (of pid {pid})")
        return removed, spared

    def build(self):
        args = self.args
        kw = {"flows": args.flows} if args.flows is not None else {}
        if args.flow_timeout is not None:
            kw["flow_timeout"] = args.flow_timeout
        self.tap = tap = SessionMirror(self.sessions, source=args.program, **kw)
        tap.warn = warn
        if args.iface:
            self.ifaces = args.iface
            for ifname in self.ifaces:
                tap.check_iface(ifname, args.direction)
        else:
            self.ifaces, skipped = tap.default_interfaces(args.direction)
            for name, why in skipped.items():
                warn(f"not tapping {name}: {why}")
        if not self.ifaces:
            raise UsageError("no interface to tap: none is UP besides lo and the sessions' local targets (use --iface)")
        if self.alerts:  # a session the file does not have: said before anything is attached
            tap.set_alert_session(self.alerts["session"])
        return tap

    def start(self, stack):
        self.tap.load_program()
        SIGNALS.check()
        self.tap.attach_many(self.ifaces, self.args.direction)
        if self.alerts:  # after the hooks: a host an alert names is copied from then on
            SIGNALS.check()
            self.tap.follow_alerts(**self.alerts)

    def table(self):
        self.live = Printer(self.args.json, cutoff=bool(self.tap.flows))
        return self.live

    def header(self):
        self.live.header(self.tap, self.ifaces, self.args.direction, self.args.sessions, self.alerts)

    def tick(self):
        """Its filters, the file (applied when it changed) and the targets' paths."""
        gone = self.tap.missing()
        if gone:
            raise BpfError(f"stopped: {gone}")
        self.source.changed(self.tap)
        try:
            if self.tap.refresh():
                warn("a target's route or MTU changed: the sessions follow it")
            self.path_said = None
        except InputError as e:
            if str(e) != self.path_said:  # said once, until it changes or mends
                warn(f"{e}; the sessions keep their last path")
                self.path_said = str(e)

    def sample(self, final=False):
        totals, rows = self.live.rows(self.tap)
        totals = {**totals, **self.tap.alert_counters()}  # the JSON's and the metrics' too
        self.live.sample(totals, rows, final=final)
        if final and self.alerts and not self.args.json:
            self.live.emit(f"{'':8} {alerts_summary(totals)}")
