"""python -m lab: the lab's command line. Its commands: one per fast path (from
the registry, lab.fastpath), and demo, bench, jupyter, mutants, cleanup.

    python -m lab demo
    python -m lab jupyter --port 8888
    python -m lab bench vtap-throughput --testbed 1,2 --trials 5
    python -m lab bench generators --sizes 64,1518
    python -m lab lb --iface eth0 --service tcp:198.18.5.100:80 --backend 198.18.5.11:8080
    python -m lab hosts check -i hosts.yml --bench vtap-throughput
    python -m lab cleanup
"""

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

from ebpf.errors import BpfError
from lab.console import ArgumentParser, quiet_stdout

from .fastpath import fastpaths
from .netns import LabError
from .runs import live_runs

_MAIN_PID = os.getpid()


def _exit_on_sigterm(signum, frame):
    # pyroute2 forks short-lived helpers (sockets in other namespaces) and stops
    # them with SIGTERM; in such a child this handler must not unwind a copy of
    # our stack, whose `with` blocks would tear the whole lab down.
    if os.getpid() != _MAIN_PID:
        os._exit(143)
    sys.exit(143)


EXAMPLES = """\
examples:
  python -m lab demo                        # watch the vTAP mirror a mix of flows (< 60 s)
  python -m lab jupyter                     # JupyterLab with the notebooks, on 127.0.0.1 only
  python -m lab bench vtap-throughput --testbed 1,2 --trials 5
  python -m lab bench generators --sizes 64,1518
  python -m lab bench NAME --help           # a bench's options, defaults and examples
  python -m lab hosts check -i hosts.yml    # your own machines, named in an Ansible inventory
  python -m lab cleanup                     # remove what a crashed run left behind
"""


def _benches_help(benches):
    return "benches (python -m lab bench NAME):\n" + "".join(f"  {m.NAME:<18}{m.SUMMARY}\n" for m in benches)


def _fastpaths_help(fps):
    return "fast paths (python -m lab NAME --help):\n" + "".join(f"  {fp.name:<18}{fp.title}\n" for fp in fps)


def main(argv=None):
    """`python -m lab ...`; a reader that goes away (`| head`) ends it quietly."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, not in the interpreter's exit, where EPIPE is a traceback
        return status
    except BrokenPipeError:
        quiet_stdout()
        return 0
    except KeyboardInterrupt:  # Ctrl-C: every `with` block has torn its part down on the way here
        print("\nlab: interrupted; everything this run started has been removed", file=sys.stderr)
        return 130


@dataclass(frozen=True)
class Command:
    """One subcommand of `python -m lab`: its name, its one-line help, how its
    parser names it in errors, its options and its main(args) -> exit status.
    `as_root`: the lab checks for root and makes SIGTERM unwind like Ctrl-C
    before main() (a fast path's command does both itself, in lab.console)."""

    name: str
    help: str
    add_arguments: Callable
    main: Callable
    error_name: str = "lab"
    as_root: bool = True
    description: str = ""
    epilog: str = ""
    parser_of: Callable = None  # args -> the parser that says an error of theirs (a subcommand's own)


def _late(spec):
    """ "module:function" as a function that imports its module on its first call.
    Only the command that runs loads its modules: `python -m lab redirect`, which
    tests and benches start hundreds of times, starts in a third of a second, not
    after the benches, pandas, scapy and matplotlib (1.4 s of CPU each time)."""
    module, name = spec.split(":")

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    return call


def _demo_arguments(p):
    p.add_argument("--count", type=int, default=1000, help="packets per flow (default %(default)s)")
    p.add_argument(
        "--rate", type=int, default=20000, help="packets per second, all flows together (default %(default)s)"
    )


def _demo(args):
    if not 1 <= args.count <= 100_000:
        print("lab: error: --count must be between 1 and 100000", file=sys.stderr)
        return 2
    return _late("lab.fastpaths.vtap.demo:run")(count=args.count, rate_pps=args.rate)


def _cleanup_arguments(p):
    p.add_argument("--all", action="store_true", help="also remove runs whose owner process is still alive")


def _cleanup(args):
    spared = []
    removed = _late("lab.cleanup:cleanup")(all_runs=args.all, spared=spared)
    for what in removed:
        print(f"lab: removed {what}")
    for rid in live_runs():
        print(f"lab: left run {rid} alone: its owner is still running (use --all to remove it)")
    for what in spared:
        print(f"lab: left {what} (use --all to remove it)")
    if not removed:
        print("lab: nothing to clean up")
    return 0


def _bench_command(find_benches):
    """`find_benches()`: the bench modules, imported only when a bench runs."""
    parsers = {}
    found = []

    def add_arguments(p):
        found[:] = find_benches()
        sub = p.add_subparsers(dest="bench", required=True, title="benches")
        for bench in found:  # each bench module registers itself: NAME, SUMMARY, add_arguments, main
            parsers[bench.NAME] = sub.add_parser(bench.NAME, help=bench.SUMMARY, error_name="lab bench")
            bench.add_arguments(parsers[bench.NAME])

    def main(args):
        # (a bench on hosts measures their CPUs, not this machine's)
        others = [] if getattr(args, "inventory", None) else live_runs()
        if others:  # two benches at once ran, and each measured the other's load (40 us/pkt instead of 0.5)
            print(
                f"lab bench: warning: another lab run is live ({', '.join(others)}): it shares these CPUs, "
                "so the measurements will include its load",
                file=sys.stderr,
            )
        try:
            return next(m for m in found if m.NAME == args.bench).main(args)
        except (ValueError, LabError, BpfError) as e:
            print(f"lab bench: error: {e}", file=sys.stderr)
            return 1

    return Command(
        "bench",
        "benchmarks that write CSV + sidecar to datasets/results",
        add_arguments,
        main,
        error_name="lab bench",
        description="Benchmarks: each writes a CSV (one row per run) and a JSON sidecar to "
        "datasets/results or --out, and prints a table of medians.",
        epilog="run python -m lab bench NAME --help for a bench's options and examples",
        parser_of=lambda args: parsers[args.bench],
    )


def _fastpath_command(fp) -> Command:
    # the command's module is imported when its parser is built: only for the command that runs
    return Command(
        fp.name,
        fp.title,
        lambda p: fp.command_object().add_arguments(p),
        lambda args: fp.command_object().main(args),
        error_name=f"python -m lab {fp.name}",
        as_root=False,
    )


def commands(fps, find_benches) -> list[Command]:
    """Every subcommand: each fast path's (from the registry), then the lab's own."""
    return [
        *(_fastpath_command(fp) for fp in fps),
        Command(
            "demo", "Testbed 1 with the vTAP and a bounded mix of watched and unwatched flows", _demo_arguments, _demo
        ),
        _bench_command(find_benches),
        # the notebooks' code needs root, and says so; JupyterLab itself does not
        Command(
            "jupyter",
            "JupyterLab with the notebooks and the project's kernel, on 127.0.0.1 only",
            _late("lab.jupyter:add_arguments"),
            _late("lab.jupyter:main"),
            error_name="lab jupyter",
            as_root=False,
        ),
        # local root is not needed: the hosts are reached by ssh, as their inventory says
        Command(
            "hosts",
            "the lab on your own machines, named in an Ansible inventory: check, setup, facts, cleanup",
            _late("lab.hosts.command:add_arguments"),
            _late("lab.hosts.command:main"),
            error_name="lab hosts",
            as_root=False,
        ),
        Command(
            "mutants",
            "one-line mutants of the programs: which test kills each (not part of make test)",
            _late("lab.mutants:add_arguments"),
            _late("lab.mutants:main"),
            error_name="lab mutants",
            as_root=False,
        ),
        Command(
            "cleanup",
            "remove what crashed runs left: lab namespaces, daemons' files, and each fast "
            "path's programs in this namespace",
            _cleanup_arguments,
            _cleanup,
        ),
    ]


def _main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    fps = fastpaths()
    find_benches = _late("lab.bench:benches")
    known = {c.name: c for c in commands(fps, find_benches)}
    # Only the command named is built (its options, its modules); without one, the
    # top-level help lists every fast path and bench.
    chosen = argv[0] if argv and argv[0] in known else None
    epilog = EXAMPLES if chosen else _fastpaths_help(fps) + "\n" + _benches_help(find_benches()) + "\n" + EXAMPLES
    # error_name: argparse's errors (one line, exit 2) name each command as its other errors do
    p = ArgumentParser(
        prog="python -m lab",
        error_name="lab",
        description="eBPF vTAP Lab: namespace testbeds and experiments",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True, title="commands")
    parsers = {}  # each command's own, which names it in its errors
    for c in known.values():
        parsers[c.name] = sub.add_parser(
            c.name,
            help=c.help,
            error_name=c.error_name,
            **({"description": c.description} if c.description else {}),
            **({"epilog": c.epilog} if c.epilog else {}),
        )
        if c.name == chosen:
            c.add_arguments(parsers[c.name])
    args, extra = p.parse_known_args(argv)
    if extra:  # said by the command they were given to, as its other errors are
        command = known[args.cmd]
        named = command.parser_of(args) if command.parser_of else parsers[args.cmd]
        named.error(f"unrecognized arguments: {' '.join(extra)}")
    command = known[args.cmd]
    if command.as_root:
        if os.geteuid() != 0:
            print("lab: error: must run as root (network namespaces and BPF need CAP_SYS_ADMIN)", file=sys.stderr)
            return 2
        # SIGTERM unwinds like Ctrl-C, so every `with` block tears its testbed down.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return command.main(args)


if __name__ == "__main__":
    sys.exit(main())
