"""python -m lab port-filter: drop TCP/UDP frames to listed ports at the XDP
hook of one or more interfaces (ebpf.XdpPortFilter), with a live table. What is
its own is below; the lifecycle every tool shares (lab.lifecycle) does the rest:
it works in the namespace it starts in, every exit detaches what it attached,
and the same exit statuses.
"""

from ebpf import BpfError, xdp
from ebpf.port_filter.xdp_port_filter import XdpPortFilter
from lab.console import CounterTable, require
from lab.lifecycle import Command

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


class PortFilterCommand(Command):
    name, short = "python -m lab port-filter", "port-filter"
    description = "Drop TCP and UDP frames to the listed destination ports at the XDP hook; pass the rest."
    examples = EXAMPLES
    cleans = "port filter programs"
    xdp_mode = True

    def options(self, p):
        p.add_argument("--iface", metavar="IF", action="append", default=[], help="where to filter (repeatable)")
        p.add_argument(
            "--drop",
            metavar="PROTO:PORT",
            action="append",
            default=[],
            help="tcp or udp, and a destination port (repeatable)",
        )

    def parse(self, args):
        require(args, iface="--iface is required (where to filter)", drop="--drop is required (PROTO:PORT)")

    def cleanup(self, all_runs=False):
        """What killed port filters left in this namespace: (removed, spared), as lines."""
        return xdp.cleanup("xdp_port_filter", spare_live=not all_runs)

    def build(self):
        self.prog = XdpPortFilter(self.args.drop)  # a bad port: InputError, exit 2
        for name in self.args.iface:  # an unknown interface said before anything, --ebpf's text included
            self.prog.check_iface(name)
        return self.prog

    def start(self, stack):
        self.prog.load_program()
        self.prog.attach_many(self.args.iface, self.args.xdp_mode)

    def table(self):
        self.live = CounterTable(self.args.json, RATES, TOTALS, key="PROGRAM", rows_name="programs")
        return self.live

    def header(self):
        a = self.args
        self.live.attached(
            dict(ifaces=a.iface, drop=self.prog.ports, xdp_mode=a.xdp_mode),
            f"port-filter: dropping {', '.join(self.prog.ports)} on {', '.join(a.iface)} "
            f"({a.xdp_mode}); Ctrl-C to stop",
        )

    def sample(self, final=False):
        c = self.prog.counters()
        self.live.sample(c, {"xdp": c}, final)

    def tick(self):
        gone = xdp.removed_from_outside(self.prog.xdp_attachments)
        if gone:
            raise BpfError(f"stopped: the program was removed from {', '.join(gone)} from outside")


COMMAND = PortFilterCommand()
