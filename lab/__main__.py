"""python -m lab: the lab's command line. Its commands: one per fast path (from
the registry, lab.fastpath), and demo, bench, jupyter, mutants, cleanup.

    python -m lab demo
    python -m lab jupyter --port 8888
    python -m lab bench vtap-throughput --testbed 1,2 --trials 5
    python -m lab bench generators --sizes 64,1518
    python -m lab lb --iface eth0 --service tcp:198.18.5.100:80 --backend 198.18.5.11:8080
    python -m lab cleanup
"""

import argparse
import os
import signal
import sys

from ebpf.errors import BpfError
from lab.console import ArgumentParser

from .netns import LabError


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
        from lab.console import quiet_stdout
        quiet_stdout()
        return 0
    except KeyboardInterrupt:  # Ctrl-C: every `with` block has torn its part down on the way here
        print("\nlab: interrupted; everything this run started has been removed", file=sys.stderr)
        return 130


def _main(argv=None):
    from .bench import benches as find_benches
    from .fastpath import fastpaths
    benches, fps = find_benches(), fastpaths()
    # error_name: argparse's errors (one line, exit 2) name each command as its other errors do
    p = ArgumentParser(prog="python -m lab", error_name="lab",
                       description="eBPF vTAP Lab: namespace testbeds and experiments",
                       epilog=_fastpaths_help(fps) + "\n" + _benches_help(benches) + "\n" + EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, title="commands")
    commands, parsers = {}, {}  # parsers: each command's own, which names it in its errors
    for fp in fps:  # a tool in the conventions of lab.console: its own checks, signals and exit statuses
        commands[fp.name] = fp.command_module()
        parsers[fp.name] = sub.add_parser(fp.name, help=fp.title, error_name=f"python -m lab {fp.name}")
        commands[fp.name].add_arguments(parsers[fp.name])
    d = sub.add_parser("demo", help="Testbed 1 with the vTAP and a bounded mix of watched and unwatched flows",
                       error_name="lab")
    d.add_argument("--count", type=int, default=1000, help="packets per flow (default %(default)s)")
    d.add_argument("--rate", type=int, default=20000,
                   help="packets per second, all flows together (default %(default)s)")
    b = sub.add_parser("bench", help="benchmarks that write CSV + sidecar to datasets/results",
                       description="Benchmarks: each writes a CSV (one row per run) and a JSON sidecar to "
                                   "datasets/results or --out, and prints a table of medians.",
                       epilog="run python -m lab bench NAME --help for a bench's options and examples",
                       error_name="lab bench")
    bsub = b.add_subparsers(dest="bench", required=True, title="benches")
    for bench in benches:  # each bench module registers itself: NAME, SUMMARY, add_arguments, main
        parsers["bench", bench.NAME] = bsub.add_parser(bench.NAME, help=bench.SUMMARY, error_name="lab bench")
        bench.add_arguments(parsers["bench", bench.NAME])
    from . import jupyter, mutants
    jupyter.add_arguments(sub.add_parser("jupyter", help="JupyterLab with the notebooks and the project's kernel, "
                                         "on 127.0.0.1 only", error_name="lab jupyter"))
    mutants.add_arguments(sub.add_parser("mutants", help="one-line mutants of the programs: which test kills "
                                         "each (not part of make test)", error_name="lab mutants"))
    c = sub.add_parser("cleanup", help="remove what crashed runs left: lab namespaces, daemons' files, and each "
                       "fast path's programs in this namespace", error_name="lab")
    c.add_argument("--all", action="store_true", help="also remove runs whose owner process is still alive")
    a, extra = p.parse_known_args(argv)
    if extra:  # said by the command they were given to, as its other errors are
        parsers.get(a.cmd if a.cmd != "bench" else ("bench", a.bench), p).error(
            f"unrecognized arguments: {' '.join(extra)}")
    if a.cmd in commands:
        return commands[a.cmd].main(a)
    if a.cmd == "jupyter":  # needs no root: the notebooks' code does, and says so
        return jupyter.main(a)
    if a.cmd == "mutants":
        return mutants.main(a)

    if os.geteuid() != 0:
        print("lab: error: must run as root (network namespaces and BPF need CAP_SYS_ADMIN)", file=sys.stderr)
        return 2
    # SIGTERM unwinds like Ctrl-C, so every `with` block tears its testbed down.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)

    if a.cmd == "cleanup":
        from .cleanup import cleanup, live_runs
        spared = []
        removed = cleanup(all_runs=a.all, spared=spared)
        for what in removed:
            print(f"lab: removed {what}")
        for rid in live_runs():
            print(f"lab: left run {rid} alone: its owner is still running (use --all to remove it)")
        for what in spared:
            print(f"lab: left {what} (use --all to remove it)")
        if not removed:
            print("lab: nothing to clean up")
        return 0
    if a.cmd == "bench":
        from .cleanup import live_runs
        others = live_runs()
        if others:  # two benches at once ran, and each measured the other's load (40 us/pkt instead of 0.5)
            print(f"lab bench: warning: another lab run is live ({', '.join(others)}): it shares these CPUs, "
                  "so the measurements will include its load", file=sys.stderr)
        try:
            return next(m for m in benches if m.NAME == a.bench).main(a)
        except (ValueError, LabError, BpfError) as e:
            print(f"lab bench: error: {e}", file=sys.stderr)
            return 1
    if a.cmd == "demo":
        from .fastpaths.vtap.demo import run
        if not 1 <= a.count <= 100_000:
            p.error("--count must be between 1 and 100000")
        return run(count=a.count, rate_pps=a.rate)
    return 2


if __name__ == "__main__":
    sys.exit(main())
