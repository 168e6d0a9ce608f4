"""python -m lab port-filter: drop TCP/UDP frames to listed ports at the XDP
hook of one or more interfaces (ebpf.XdpPortFilter), with a live table. In the
conventions of every tool of the lab (lab.console): it works in the namespace
it starts in, every exit detaches what it attached, and the same exit statuses.
"""

import argparse

from ebpf import BpfError, xdp
from ebpf.port_filter.xdp_port_filter import XdpPortFilter
from lab.console import (
    SIGNALS,
    CounterTable,
    add_run_options,
    add_xdp_mode,
    check_run_options,
    report_cleanup,
    require,
    run_command,
    run_until_stopped,
    show_program,
)

EXAMPLES = """\
examples:
  python -m lab port-filter --iface eth0 --drop udp:9 --drop tcp:23
  python -m lab port-filter --iface eth0 --iface eth1 --drop udp:53 --xdp-mode generic --duration 10 --json
  python -m lab port-filter --cleanup       # remove what a killed run left attached

exit status: 0 stopped (--duration, Ctrl-C, SIGTERM, SIGHUP, output closed);
  1 failed (BCC missing, compiler, verifier or hook refused, program removed while running);
  2 cannot run as given (bad option or port, unknown interface, not root)
"""
RATES = ("seen", "drop")
TOTALS = ("seen", "drop", "pass", "not_ip", "malformed", "fragment")


def add_arguments(p):
    p.description = "Drop TCP and UDP frames to the listed destination ports at the XDP hook; pass the rest."
    p.epilog, p.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("--iface", metavar="IF", action="append", default=[], help="where to filter (repeatable)")
    p.add_argument("--drop", metavar="PROTO:PORT", action="append", default=[],
                   help="tcp or udp, and a destination port (repeatable)")
    add_xdp_mode(p)
    add_run_options(p, "port filter programs")


def check_args(args):
    check_run_options(args)
    if args.cleanup:
        return
    require(args, iface="--iface is required (where to filter)", drop="--drop is required (PROTO:PORT)")


def cleanup(all_runs=False):
    """What killed port filters left in this namespace: (removed, spared), as lines."""
    return xdp.cleanup("xdp_port_filter", spare_live=not all_runs)


def run(args):
    if args.cleanup:
        return report_cleanup("port-filter", *cleanup(args.all))
    prog = XdpPortFilter(args.drop)
    for name in args.iface:  # an unknown interface said before anything, --ebpf's text included
        prog.check_iface(name)
    if args.ebpf:
        return show_program(prog)
    table = CounterTable(args.json, RATES, TOTALS, key="PROGRAM", rows_name="programs")
    SIGNALS.check()
    with prog:
        prog.load_program()
        prog.attach_many(args.iface, args.xdp_mode)
        SIGNALS.check()
        table.attached(dict(ifaces=args.iface, drop=prog.ports, xdp_mode=args.xdp_mode),
                       f"port-filter: dropping {', '.join(prog.ports)} on {', '.join(args.iface)} ({args.xdp_mode}); "
                       "Ctrl-C to stop")

        def sample(final=False):
            c = prog.counters()
            table.sample(c, {"xdp": c}, final)

        def tick():
            gone = xdp.removed_from_outside(prog.xdp_attachments)
            if gone:
                raise BpfError(f"stopped: the program was removed from {', '.join(gone)} from outside")
            sample()
        sample()
        run_until_stopped(args.interval, args.duration, tick, lambda: sample(final=True))
    return 0


def main(args):
    """python -m lab port-filter (python -m lab parses the arguments)."""
    SIGNALS.install()
    return run_command("python -m lab port-filter", lambda: check_args(args), lambda: run(args))



