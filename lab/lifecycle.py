"""The one lifecycle of every command that runs a kernel program until it is
stopped (vtap at either hook and with sessions, python -m lab redirect, lb,
port-filter), written once, as xdp-bench writes its loop once and each of its
commands is a row of options and callbacks.

A command declares what is its own, as a subclass of Command:

    options(p)            its options (the shared ones are added here)
    parse(args)           its input checked and parsed, once, into the objects
                          the run uses (kept on the command); UsageError: exit 2
    cleanup(all_runs)     what its killed runs left here: (removed, spared)
    build()               its program object, every interface name checked:
                          nothing attached yet (--ebpf prints this object's C)
    start(stack)          load and attach it, and whatever else runs beside it,
                          each entered into `stack` (an ExitStack) so that every
                          exit undoes it; say what the host lacks, with fixes
    table()               its live table (a lab.console.LiveTable)
    header(), sample(final=False)
                          the "attached" line, and one sample of the table
    tick()                what changed outside since the last sample: said
                          with warn(), or BpfError to stop the run

and the lifecycle does the rest, the same for every tool: --cleanup [--all],
the hidden --ebpf, --metrics, --json, --interval and --duration, signals and a
closed pipe, privileges, exit statuses (lab.console), and the loop.
"""

import argparse
import contextlib

from lab.console import (
    SIGNALS,
    ArgumentParser,
    add_run_options,
    add_xdp_mode,
    check_run_options,
    report_cleanup,
    run_command,
    run_until_stopped,
    show_program,
)
from lab.exporter import serving


class Command:
    """One command line: its name and its own parts (see the module docstring)."""

    name = ""  # how it calls itself in errors: "vtap", "python -m lab lb"
    short = ""  # in its lines and --metrics' names: "vtap", "lb"
    description = ""
    examples = ""  # --help's epilog
    cleans = ""  # what --cleanup removes, in words
    xdp_mode = False  # it takes --xdp-mode
    metrics_rows: dict = {}  # --metrics: {the JSON key of its rows: a row's label name}
    metrics_gauges: frozenset = frozenset()  # --metrics: which of its values are gauges, not counters

    def __init__(self):
        self.args = None

    # --- what every command declares -------------------------------------------------
    def options(self, p):
        """Its own options."""

    def parse(self, args):
        """Check and parse its input, once, into what the run uses."""

    def cleanup(self, all_runs=False) -> tuple[list[str], list[str]]:
        return [], []

    def build(self):
        raise NotImplementedError

    def start(self, stack):
        raise NotImplementedError

    def table(self):
        raise NotImplementedError

    def header(self):
        raise NotImplementedError

    def sample(self, final=False):
        raise NotImplementedError

    def tick(self):
        """What changed outside since the last sample (nothing, by default)."""

    def variant(self, args) -> "Command":
        """The command that runs these arguments: itself, or one of its kind
        (the vTAP at the XDP hook, or with sessions)."""
        return self

    # --- what the lifecycle does ------------------------------------------------------
    def add_arguments(self, p):
        """Its options and the shared ones, on `p` (an ArgumentParser of lab.console)."""
        if self.description:
            p.description = self.description
        if self.examples:
            p.epilog, p.formatter_class = self.examples, argparse.RawDescriptionHelpFormatter
        self.options(p)
        if self.xdp_mode:
            add_xdp_mode(p)
        add_run_options(p, self.cleans)

    def main(self, args) -> int:
        """Run with `args` parsed (by cli(), or by python -m lab): the exit status."""
        SIGNALS.install()  # first, so that a signal during compile or attach detaches too
        chosen = []
        # variant() inside run_command: a variant's module may import what is missing here
        # (pyroute2, for vtap --hook xdp), and that is said in one line, as every other error

        def check():
            chosen.append(type(self)().variant(args))  # a run's state is its own: a second run starts clean
            chosen[0]._check(args)

        return run_command(self.name, check, lambda: chosen[0]._run(args))

    def cli(self, argv=None) -> int:
        """The command on its own (`vtap`): parse argv, then main()."""
        SIGNALS.install()  # before parsing: a signal at any moment is a clean stop
        p = ArgumentParser(prog=self.name)
        self.add_arguments(p)
        return self.main(p.parse_args(argv))

    def _check(self, args):
        check_run_options(args)
        if not args.cleanup:
            self.args = args
            self.parse(args)

    def _run(self, args):
        if args.cleanup:
            return report_cleanup(self.short, *self.cleanup(args.all))
        prog = self.build()
        if args.ebpf:
            return show_program(prog)
        table = self.table()
        metrics = serving(table, args, self.short, rows=self.metrics_rows, gauges=set(self.metrics_gauges))
        SIGNALS.check()
        with metrics, contextlib.ExitStack() as stack:
            stack.enter_context(prog)
            self.start(stack)
            SIGNALS.check()
            with table.holding():  # the baseline is read before "attached", and shown after it
                self.sample()
            self.header()  # after the start's warnings: "attached" means ready
            table.release()

            def tick():
                self.tick()
                self.sample()

            run_until_stopped(args.interval, args.duration, tick, lambda: self.sample(final=True))
        return 0
