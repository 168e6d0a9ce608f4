"""python -m lab {demo,cleanup}: the lab's command line."""

import argparse
import os
import signal
import sys


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m lab", description="eBPF vTAP Lab: namespace testbeds and experiments")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="Testbed 1 with the vTAP and a bounded mix of watched and unwatched flows")
    d.add_argument("--count", type=int, default=1000, help="packets per flow (default 1000)")
    d.add_argument("--rate", type=int, default=20000, help="packets per second, all flows together (default 20000)")
    c = sub.add_parser("cleanup", help="remove lab namespaces left by crashed runs")
    c.add_argument("--all", action="store_true", help="also remove runs whose owner process is still alive")
    a = p.parse_args(argv)

    if os.geteuid() != 0:
        print("lab: error: must run as root (network namespaces and BPF need CAP_SYS_ADMIN)", file=sys.stderr)
        return 2
    # SIGTERM unwinds like Ctrl-C, so every `with` block tears its testbed down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    if a.cmd == "cleanup":
        from .cleanup import cleanup, live_runs
        removed = cleanup(all_runs=a.all)
        for what in removed:
            print(f"lab: removed {what}")
        for rid in live_runs():
            print(f"lab: left run {rid} alone: its owner is still running (use --all to remove it)")
        if not removed:
            print("lab: nothing to clean up")
        return 0
    if a.cmd == "demo":
        from .demo import run
        if not 1 <= a.count <= 100_000:
            p.error("--count must be between 1 and 100000")
        return run(count=a.count, rate_pps=a.rate)
    return 2


if __name__ == "__main__":
    sys.exit(main())
