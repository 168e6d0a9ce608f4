"""What every command line of the project shares: one-line errors and their exit
statuses, output that ends quietly when its reader goes away, and signals taken
as a request to stop.

Exit statuses (vtap, python -m lab redirect): 0 when the run was stopped (its
duration, Ctrl-C, SIGTERM, SIGHUP, its output closed); 2 when the command as
given cannot run (UsageError, ebpf.InputError, argparse's errors); 1 when it was
tried and failed.
"""

import argparse
import contextlib
import json
import math
import os
import select
import signal
import sys
import time

from ebpf import privileges
from ebpf.errors import BpfError, InputError

from .exporter import parse_listen


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with its errors said as the tools say theirs: one line,
    `NAME: error: MESSAGE`, exit status 2. (argparse's own print the usage first,
    six lines and more, and the error itself last.) `error_name` is how the tool
    calls itself in its other errors; the parsers of subcommands (add_parser)
    are of this class too, and take it as a keyword."""

    def __init__(self, *args, error_name=None, **kw):
        super().__init__(*args, **kw)
        self.error_name = error_name

    def error(self, message):
        self.exit(2, f"{self.error_name or self.prog}: error: {message}\n")

    def options_given(self, a) -> list[str]:
        """The options of namespace `a` whose value is not their default: those
        given on the command line, but for one given its default value."""
        return [
            act.option_strings[-1]
            for act in self._actions
            if act.option_strings
            and not isinstance(act, _Renamed)  # said once, by its new name
            and getattr(a, act.dest, act.default) != act.default
        ]


class _Renamed(argparse.Action):
    """An option's old spelling: taken as the new one, with a warning."""

    def __init__(self, option_strings, dest, new=None, **kw):
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        name = getattr(parser, "error_name", None) or parser.prog
        try:
            print(
                f"{name}: warning: {option_string} is now {self.new}; the old spelling goes in the next release",
                file=sys.stderr,
                flush=True,
            )
        except (BrokenPipeError, ValueError):
            pass
        setattr(namespace, self.dest, values)


def renamed(p, old, new):
    """Take `old`, an option's former spelling, for one release: it sets what
    `new` (added to `p` before) sets, and says so on stderr."""
    action = p._option_string_actions[new]
    p.add_argument(
        old,
        dest=action.dest,
        action=_Renamed,
        new=new,
        choices=action.choices,
        default=action.default,
        type=action.type,
        metavar=action.metavar,
        help=argparse.SUPPRESS,
    )


XDP_MODES = ("native", "generic", "offload")


def add_xdp_mode(p, default="native"):
    """--xdp-mode, as every tool spells it. XDP modes: native runs the program in
    the driver, before the kernel builds an skb (veth has it); generic runs it
    after, on any interface, slower; offload runs it on a NIC that runs BPF."""
    p.add_argument(
        "--xdp-mode",
        default=default,
        choices=XDP_MODES,
        help="native (in the driver), generic (any interface, after the skb is built) or offload "
        "(on a NIC that runs BPF) (default %(default)s)",
    )


class Stop(Exception):
    """Ctrl-C, SIGTERM or SIGHUP: leave the run and detach."""


class OutputClosed(Exception):
    """Whoever reads our output went away (`| head`): detach and exit quietly."""


def say(line, out=None):
    """One line to standard output; the reader going away (`| head`) ends the run."""
    try:
        print(line, file=out or sys.stdout, flush=True)
    except BrokenPipeError:
        raise OutputClosed() from None


class RunningCommand:
    """How the running command calls itself in errors and warnings: `name`,
    which run_command sets when it starts a command."""

    def __init__(self, name):
        self.name = name


RUNNING = RunningCommand("vtap")


def warn(msg):
    try:
        print(f"{RUNNING.name}: warning: {msg}", file=sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass


class Signals:
    """Ctrl-C, SIGTERM and SIGHUP as a request to stop, never as an exception.

    An exception raised from a handler lands wherever the program is, e.g.
    half-way through pyroute2 building an event loop, which then fails noisily
    when collected. So the handler only sets a flag; the run checks it between
    steps and waits for it on a pipe that the kernel-side handler writes to
    (signal.set_wakeup_fd), so nothing in a handler takes a lock."""

    def __init__(self):
        self.requested = False
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def install(self):
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._note)

    def _note(self, signum, frame):
        self.requested = True

    def check(self):
        if self.requested:
            raise Stop()

    def wait(self, seconds) -> bool:
        """Sleep up to `seconds`; True as soon as a stop was requested."""
        if not self.requested and seconds > 0:
            select.select([self._read], [], [], seconds)
            try:
                while os.read(self._read, 512):
                    pass
            except BlockingIOError:
                pass
        return self.requested


SIGNALS = Signals()


def quiet_stdout():
    """After the reader went away: point fd 1 at /dev/null, so that the
    interpreter's last flush does not raise BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def add_run_options(p, cleans):
    """The options every command line that runs a program shares, in its words:
    `cleans` says what --cleanup removes. `p` is an ArgumentParser of this module."""
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between counter lines (default 1)")
    p.add_argument("--duration", type=float, metavar="S", help="detach and exit after S seconds")
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    p.add_argument(
        "--metrics",
        metavar="ADDR:PORT",
        help="serve the live table's counters as Prometheus metrics on ADDR:PORT (/metrics; "
        "127.0.0.1:9464, [::1]:9464, or :9464 for every address of the namespace)",
    )
    p.add_argument(
        "--cleanup",
        action="store_true",
        help=f"remove {cleans} that a killed run left in this namespace; those of running ones are spared",
    )
    p.add_argument("--all", action="store_true", help="with --cleanup: remove those of running ones too")
    # For developers: print the C text as it will be compiled.
    p.add_argument("--ebpf", action="store_true", help=argparse.SUPPRESS)
    # --cleanup refuses the options it would ignore, so it must see what was given
    p.set_defaults(options_given=p.options_given)


def require(a, **needed):
    """UsageError for the first option of `needed` ({dest: "--opt is required (why)"}
    with no value, and for an interface given twice with --iface."""
    for dest, message in needed.items():
        if not getattr(a, dest):
            raise UsageError(message)
    ifaces = getattr(a, "iface", None)
    if isinstance(ifaces, list) and len(set(ifaces)) != len(ifaces):
        raise UsageError("an interface is given twice with --iface")


def check_run_options(a):
    """Checks of add_run_options' values (UsageError: exit 2)."""
    if a.all and not a.cleanup:
        raise UsageError("--all goes with --cleanup")
    if a.cleanup:  # it removes leftovers and reads no other option: one given was meant for a run
        ignored = [o for o in a.options_given(a) if o not in ("--cleanup", "--all")]
        if ignored:
            raise UsageError(f"--cleanup takes no option but --all; it would ignore {', '.join(ignored)}")
        return
    if not (math.isfinite(a.interval) and a.interval > 0):
        raise UsageError(f"--interval must be a number of seconds > 0, not {a.interval}")
    if a.duration is not None and not (math.isfinite(a.duration) and a.duration > 0):
        raise UsageError(f"--duration must be a number of seconds > 0, not {a.duration}")
    if getattr(a, "metrics", None):
        parse_listen(a.metrics)  # InputError: exit 2


class LiveTable:
    """What every command's live table shares, whatever its columns: each sample's
    rates against the one before (the final block's against the first, so they
    are averages over the whole run), a header every 20 samples and above the
    final block, the rows' label (the time, or `total`), the --json twin's
    events, and a warning once when a rule or backend keeps being sent packets
    and nothing comes back (lab.hostcheck.ReplyWatch), and once when it answers
    again."""

    HEADER_EVERY = 20

    def __init__(self, as_json, out=None):
        self.json, self.out = as_json, out
        self.start = self.last = None
        self.seconds = 0.0  # the latest sample's interval (the final one's: the whole run)
        self.samples = 0
        self._replies = None
        self.silent = set()
        self.exporter = None  # --metrics (lab.exporter): gets every sample
        self._held = None  # lines kept by holding()
        self._after_header = []

    def publish(self, body: dict):
        """A sample as --metrics serves it (the same counters as the table)."""
        if self.exporter is not None:
            self.exporter.publish(body)

    def interval(self, snapshot, final=False):
        """This sample's (seconds, the snapshot its rates are taken against)."""
        now = time.monotonic()
        if self.start is None:
            self.start = (now, snapshot)
        t0, base = self.start if final else (self.last or self.start)
        self.last = (now, snapshot)
        self.seconds = now - t0
        return self.seconds, base

    @staticmethod
    def rates(now, base, keys, seconds) -> dict:
        """{key: per second} between two readings of the same counters."""
        return {k: (now[k] - base.get(k, 0)) / seconds if seconds > 0 and base else 0.0 for k in keys}

    def block(self, final=False):
        """(the rows' label, whether a header goes above them) for the next block of rows."""
        header = self.samples % self.HEADER_EVERY == 0 or final
        self.samples += 1
        return ("total" if final else time.strftime("%H:%M:%S")), header

    def event(self, final, body: dict):
        """One JSON object: a sample's counters, or the final one's with the
        run's `seconds` (its rates are averages over them)."""
        self.emit(
            {
                "event": "final" if final else "counters",
                "time": round(time.time(), 3),
                **body,
                **({"seconds": round(self.seconds, 3)} if final else {}),
            }
        )

    def replies(self, name, sent, answered, what="packets sent"):
        """(packets sent since the last reply, whether that has gone on long enough
        to say so); warns once when `name` turns silent and once when it answers again."""
        from lab.hostcheck import ReplyWatch  # noqa: PLC0415 -- hostcheck pulls pyroute2; --help imports console

        if self._replies is None:
            self._replies = ReplyWatch()
        unanswered, silent = self._replies.update(name, sent, answered, time.monotonic())
        if silent and name not in self.silent:
            self.silent.add(name)
            warn(f"{name}: {unanswered} {what}, {ReplyWatch.HINT}")
        elif not unanswered and name in self.silent:
            self.silent.discard(name)
            warn(f"{name}: replies again")
        return unanswered, silent

    def emit(self, obj):
        line = json.dumps(obj) if isinstance(obj, dict) else obj
        if self._held is not None:
            self._held.append(line)
            return
        say(line, self.out)

    @contextlib.contextmanager
    def holding(self):
        """Hold what is emitted inside, and emit it when the block ends: the first
        sample's counters are read before "attached" is said (traffic a user starts
        on that line is then all in the run's totals and averages), and shown after it."""
        self._held = held = []
        try:
            yield
        finally:
            self._held = None
        self._after_header = held

    def release(self):
        """Emit what holding() kept."""
        held, self._after_header = self._after_header, []
        for line in held:
            say(line, self.out)


class CounterTable(LiveTable):
    """The live table of a running command whose rows are counters alone: every
    interval, the rates of `rates` and the totals of `totals`, one row per
    interface (or program: `key` names the column), and an `all` row when there
    are several. JSON: one object per interval, the totals and their rates
    (`<name>_pps`) at the top level and the rows under `rows_name`."""

    def __init__(self, as_json, rates, totals, heads=None, key="IFACE", rows_name="ifaces", out=None):
        super().__init__(as_json, out)
        self.rate_keys, self.totals = rates, totals
        self.heads, self.key, self.rows_name = heads or {}, key, rows_name
        self.width = 10

    def attached(self, msg: dict, line: str, names=()):
        """Say the command is running: `msg` (JSON, event "attached") or `line`.
        `names`: the rows to come, whose longest sets the first column's width."""
        self.width = max(10, *(len(n) for n in names)) if names else 10
        self.emit(dict(event="attached", **msg) if self.json else line)

    def sample(self, totals, rows, final=False):
        dt, (base, base_rows) = self.interval((totals, rows), final)
        body = {
            **totals,
            **{f"{k}_pps": round(v, 1) for k, v in self.rates(totals, base, self.rate_keys, dt).items()},
            self.rows_name: rows,
        }
        self.publish(body)
        if self.json:
            self.event(final, body)
            return
        shown = list(rows.items())
        if len(shown) != 1:
            shown.append(("all", totals))
        w = self.width
        label, header = self.block(final)
        if header:
            self.emit(
                f"{'SUMMARY' if final else 'TIME':8} {self.key:{w}} "
                + " ".join(f"{k.upper() + '/s':>10}" for k in self.rate_keys)
                + " | "
                + " ".join(f"{self.heads.get(k, k.upper()):>10}" for k in self.totals)
            )
        for name, c in shown:
            r = self.rates(c, base_rows.get(name, {}) if name != "all" else base, self.rate_keys, dt)
            self.emit(
                f"{label:8} {name:{w}} "
                + " ".join(f"{r[k]:>10.0f}" for k in self.rate_keys)
                + " | "
                # "-": a counter no row of this kind has (a pod's row, for what the cgroup
                # programs count: a socket belongs to no pod)
                + " ".join(f"{c.get(k, '-'):>10}" for k in self.totals)
            )


def report_cleanup(name, removed, spared):
    """A command's --cleanup, said: what it removed, and what it left because
    a running instance holds it (`spared`, lines from the command's cleanup())."""
    for what in removed:
        say(f"{name}: removed {what}")
    for what in spared:
        say(f"{name}: left {what}; --cleanup --all removes it too")
    if not removed and not spared:
        say(f"{name}: nothing to clean up in this namespace")
    return 0


def show_program(prog):
    """The hidden --ebpf: the C text as it will be compiled, and its flags."""
    say(prog.c_text())
    say("// cflags: " + " ".join(prog.cflags))
    return 0


def run_until_stopped(interval, duration, tick, finish):
    """The body of a running command: tick() every `interval` seconds until
    `duration` has passed or a stop was requested, then finish() (the summary),
    whatever ended it. A BpfError from tick() (the program removed from outside)
    ends the run too, after finish()."""
    deadline = time.monotonic() + duration if duration else None
    try:
        while True:
            wait = interval if deadline is None else min(interval, deadline - time.monotonic())
            if SIGNALS.wait(wait) or (deadline is not None and time.monotonic() >= deadline):
                break
            tick()
    finally:
        finish()


def run_command(name, check, body):
    """Check a command line's input, then that it may run (privileges, BCC), then
    run its body, and turn how that ended into one line on stderr (a line per
    problem when an error holds several) and an exit status (see the module
    docstring). Input first: a bad option is said even to a user who may not run
    the command."""
    RUNNING.name = name
    try:
        check()
        lacking = privileges.message()
        if lacking:
            raise UsageError(lacking)
        from ebpf.compiler import check_bcc  # noqa: PLC0415 -- deferred: a command's input is checked first

        check_bcc()  # there, not imported: a command may compile in a child (lab lb), keeping no compiler
        from lab import runs  # noqa: PLC0415 -- pulls pyroute2 (lab.netns); its ImportError is said below

        runs.notice()  # what dead runs left, said once, before this run adds its own
        return body()
    except (UsageError, InputError) as e:
        for line in str(e).splitlines():  # several lines: each a problem of its own, all said at once
            print(f"{name}: error: {line}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Stop):  # KeyboardInterrupt: Ctrl-C before SIGNALS.install()
        return 0
    except OutputClosed:
        quiet_stdout()
        return 0
    except ImportError as e:
        print(
            f"{name}: error: Python package {e.name!r} is missing; run `make setup` as root and use .venv/bin/python",
            file=sys.stderr,
        )
        return 1
    except BpfError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        return 1
