"""python -m lab redirect: rewrite datagrams to a service so that they reach a
backend, with ebpf.XdpRedirect at the XDP hook, and give the replies the
service's address back. What is its own is below; the lifecycle every tool
shares (lab.lifecycle) does the rest: it works in the namespace it starts in,
every exit detaches what it attached, and the same exit statuses.
"""

import contextlib
import ipaddress

from ebpf import BpfError, netdev, tc, xdp
from ebpf.redirect.tc_redirect import TcRedirect
from ebpf.redirect.xdp_redirect import XdpRedirect
from lab import hostcheck
from lab.console import SIGNALS, LiveTable, add_xdp_mode, renamed, require, warn
from lab.hostcheck import PreparedPeers
from lab.lifecycle import Command

EXAMPLES = """\
examples:
  python -m lab redirect --iface eth0 --rule udp:198.18.0.17:8080=198.18.2.2:8083
                        # the report's rewrite; replies are given the service's address back
                        # on the interface the backend is reached through (a route lookup)
  python -m lab redirect --iface eth0 --rule 'udp:[2001:2::17]:8080=[2001:2:0:2::2]:8083' \\
                         --rule tcp:198.18.0.17:80=198.18.2.2:8080 --action forward
                        # IPv6 in brackets; forward: the program routes, the stack never sees them
  python -m lab redirect --iface eth0 --rule ... --xdp-mode generic --duration 10 --json
  ip netns exec dut python -m lab redirect ...   # inside a network namespace
  python -m lab redirect --cleanup       # remove what a killed run left attached

exit status: 0 stopped (--duration, Ctrl-C, SIGTERM, SIGHUP, output closed);
  1 failed (BCC missing, compiler, verifier or hook refused, program removed while running);
  2 cannot run as given (bad option or rule, unknown interface, not root)
"""

REASONS = ("not_ip", "unmatched", "fragment", "malformed")
SLOW = ("slow_no_neigh", "slow_ttl", "slow_too_big", "slow_no_route")


NEEDS = """\
what the hosts around it need (checked at start; each missing piece is one line with its fix):
  - forwarding on, where clients' datagrams and backends' replies arrive (the
    kernel routes what `pass` rewrites; `forward`'s route lookup answers only there):
      sysctl -w net.ipv4.conf.IF.forwarding=1 net.ipv6.conf.IF.forwarding=1
  - clients reach the service address through this host: routed to it, or an
    address of its own (then, with pass, replies are translated after routing,
    at TC egress towards the clients: see below)
  - forward: a native XDP program on the veth peer of each interface it sends
    out of, or the frames it redirects there are lost; --prepare-peer attaches one
TX checksum offload may stay on everywhere: the program finishes or keeps the
checksums the senders left partial.

where each direction is translated:
  to the backend     at XDP, where the client's datagram arrives
  back to the client at XDP, where the backend's reply arrives; except, with pass,
                     for a service address this host holds: the kernel would drop
                     a reply arriving with a source of its own (a martian), so it
                     is translated after routing, at TC egress towards the clients
"""


def counters(prog, egress=None):
    """The XDP program's counters and rule counters, with the replies that the
    TC egress program translated (for a service address this host holds) added
    where they belong: one view of each rule, both ways."""
    stats, rules = prog.counters(), prog.rule_counters()
    if egress is not None:
        for r, c in egress.rule_counters().items():
            rules[r]["reply_packets"] += c["reply_packets"]
            rules[r]["reply_bytes"] += c["reply_bytes"]
        stats["to_client"] += egress.counters()["to_client"]
    return stats, rules


def local_services(prog):
    """Rules whose service address is an address of this namespace (the
    netfilter-vs-XDP report's design): given that source at XDP ingress, a
    reply reaches the kernel as a martian (IPv4 drops it), so with `pass` these
    rules' replies are translated after routing instead."""
    with netdev.ipr(prog.netns) as ip:
        mine = {str(ipaddress.ip_address(a.get_attr("IFA_ADDRESS"))) for a in ip.get_addr()}
    return [r for r in prog.rules if str(r.vip) in mine]


def host_findings(args, prog, ifaces):
    """What the hosts around the redirect lack, as far as this namespace sees."""
    found = []
    families = {r.family for r in prog.rules}
    for name in ifaces:
        found += hostcheck.check_forwarding(name, families, why=": the kernel does not route what arrives there")
        # generic: skbs, no NAPI needed
        if args.action == "forward" and args.xdp_mode == "native" and not args.prepare_peer:
            found += hostcheck.check_veth_peer(name, sends="XDP_REDIRECT")
        found += hostcheck.check_gro(name, args.xdp_mode)
    return found


class Printer(LiveTable):
    """The redirect's live table: a row per rule, packets towards the backend
    and replies back, and what it left untouched by reason."""

    def __init__(self, as_json):
        super().__init__(as_json)
        self.egress = None  # the TC egress program that translates some rules' replies, if any

    def header(self, prog, ifaces, mode, egress=((), ())):
        """Where each direction is translated, and why there."""
        at, local = egress
        msg = dict(
            event="attached",
            ifaces=ifaces,
            rules=[str(r) for r in prog.rules],
            action=prog.action,
            xdp_mode=mode,
            replies_at_tc_egress={"ifaces": list(at), "rules": [str(r) for r in local]},
        )
        if self.json:
            self.emit(msg)
            return
        self.emit(f"redirect: {prog.action} on {', '.join(ifaces)} ({mode}); {len(prog.rules)} rule(s); Ctrl-C to stop")
        if local:
            vips = ", ".join(sorted({str(r.vip) for r in local}))
            self.emit(
                f"redirect: replies from the backends of {vips} are given the service's address at TC "
                f"egress of {', '.join(at)}, after routing: {vips} is this host's own address, and the "
                "kernel drops a reply arriving with a source of its own (a martian); every other "
                "translation is at XDP"
            )

    def sample(self, prog, final=False):
        stats, rules = counters(prog, self.egress)
        dt, before = self.interval(rules, final)
        rates = {r: self.rates(c, before.get(r, {}), ("packets", "reply_packets"), dt) for r, c in rules.items()}
        watched = {
            r: self.replies(r, c["packets"], c["reply_packets"], "packets rewritten towards the backend")
            for r, c in rules.items()
        }

        def row(r, c):
            unanswered, silent = watched[r]
            extra = {"hint": hostcheck.ReplyWatch.HINT} if silent else {}
            return {
                **c,
                "packets_pps": round(rates[r]["packets"], 1),
                "reply_packets_pps": round(rates[r]["reply_packets"], 1),
                "unanswered": unanswered,
                **extra,
            }

        body = {**stats, "rules": {r: row(r, c) for r, c in rules.items()}}
        self.publish(body)
        if self.json:
            self.event(final, body)
            return
        width = max(10, *(len(r) for r in rules))
        label, header = self.block(final)
        if header:
            self.emit(
                f"{'SUMMARY' if final else 'TIME':8} {'RULE':{width}} {'TO-BACKEND/s':>12} {'REPLIES/s':>10} | "
                f"{'TO-BACKEND':>11} {'REPLIES':>10} {'BYTES':>13}"
            )
        for r, c in rules.items():
            self.emit(
                f"{label:8} {r:{width}} {rates[r]['packets']:>12.0f} {rates[r]['reply_packets']:>10.0f} | "
                f"{c['packets']:>11} {c['reply_packets']:>10} {c['bytes'] + c['reply_bytes']:>13}"
            )
        untouched = ", ".join(f"{k.replace('_', '-')} {stats[k]}" for k in REASONS)
        slow = ", ".join(f"{k[5:].replace('_', '-')} {stats[k]}" for k in SLOW)
        self.emit(
            f"{'':8} untouched: {untouched}"
            + (f"; to the kernel (forward): {slow}" if prog.action == "forward" else "")
        )


class RedirectCommand(Command):
    name, short = "python -m lab redirect", "redirect"
    description = (
        "Rewrite the destination of datagrams sent to a service (protocol, address, port) to a "
        "backend at the XDP hook, and the source of the backend's replies back to the service."
        "\n\n" + NEEDS
    )
    examples = EXAMPLES
    cleans = "the redirect programs"
    metrics_rows = {"rules": "rule"}
    metrics_gauges = frozenset({"unanswered"})

    def options(self, p):
        p.add_argument(
            "--iface",
            metavar="IF",
            action="append",
            default=[],
            help="where the clients' datagrams arrive (repeatable); the program is also attached where "
            "each backend is reached, for its replies",
        )
        p.add_argument(
            "--rule",
            metavar="PROTO:VIP:PORT=BACKEND:PORT",
            action="append",
            default=[],
            help="udp or tcp; IPv6 addresses in brackets (repeatable)",
        )
        p.add_argument(
            "--action",
            default="pass",
            choices=("pass", "forward"),
            help="pass: the kernel routes the rewritten packet (the report's design); forward: the "
            "program looks the route up and sends it out itself (default %(default)s)",
        )
        add_xdp_mode(p)  # here, not the lifecycle's (xdp_mode): --help has always listed it before --prepare-peer
        renamed(p, "--mode", "--xdp-mode")
        p.add_argument(
            "--prepare-peer",
            action="store_true",
            help="forward: where an interface it sends out of is a veth whose peer runs no native XDP "
            "program, attach a pass program there while this runs",
        )

    def parse(self, args):
        require(
            args,
            iface="--iface is required (where the clients' datagrams arrive)",
            rule="--rule is required (PROTO:VIP:PORT=BACKEND:PORT)",
        )

    def cleanup(self, all_runs=False):
        """What killed redirects left in this namespace: (removed, spared), as lines."""
        removed, spared = xdp.cleanup("xdp_redirect", spare_live=not all_runs)
        # the TC egress filters that translate replies for a service address this host holds
        tc_removed, tc_spared = tc.cleanup(TcRedirect.OWNER, spare_live=not all_runs)
        removed += tc_removed
        spared += [f"filter {f.entry.name} on {f.where}: pid {', '.join(map(str, f.pids))} holds it" for f in tc_spared]
        removed += hostcheck.cleanup_peer_programs()  # what --prepare-peer left on veth peers
        return removed, spared

    def build(self):
        """The XDP program (a bad rule: InputError, exit 2), where it is attached (--iface, and where each
        backend's replies arrive) and, with pass, the TC egress program for a service address this host
        holds: every interface checked, nothing attached."""
        args = self.args
        self.prog = prog = XdpRedirect(args.rule, action=args.action)
        with netdev.ipr(None) as ip:
            for name in args.iface:
                netdev.ifindex_of(ip, name)
        self.ifaces = list(args.iface)
        for name, backends in prog.reply_interfaces().items():
            if name not in self.ifaces:
                self.ifaces.append(name)
                warn(f"also attaching to {name}: replies from {', '.join(dict.fromkeys(backends))} arrive there")
        self.local = local_services(prog) if args.action == "pass" else []
        self.egress = TcRedirect([str(r) for r in self.local], action="pass") if self.local else None
        for r in self.local:
            prog.leave_replies(r)
        return prog

    def start(self, stack):
        args, prog, egress = self.args, self.prog, self.egress
        peers = stack.enter_context(contextlib.closing(PreparedPeers()))
        if egress:
            stack.enter_context(egress)
        prog.load_program()
        if egress:
            egress.load_program()
        SIGNALS.check()
        for name in self.ifaces:  # all or nothing: the lifecycle's stack detaches what was attached
            prog.attach(name, args.xdp_mode)
        for name in args.iface if egress else ():
            egress.attach(name, "egress")
        if args.action == "forward" and args.xdp_mode == "native" and args.prepare_peer:
            for name in self.ifaces:
                if peer := peers.prepare(name):
                    warn(f"attached a pass program to {name}'s veth peer {peer.ifname} ({peer.label}) while this runs")
        for finding in host_findings(args, prog, self.ifaces):
            warn(str(finding))

    def table(self):
        self.live = Printer(self.args.json)
        self.live.egress = self.egress
        return self.live

    def header(self):
        self.live.header(self.prog, self.ifaces, self.args.xdp_mode, egress=[self.args.iface, self.local])

    def sample(self, final=False):
        self.live.sample(self.prog, final=final)

    def tick(self):
        gone = xdp.removed_from_outside(self.prog.xdp_attachments)
        if gone:
            raise BpfError(
                f"stopped: the program was removed from {', '.join(gone)} from outside "
                "(python -m lab redirect --cleanup --all, ip link set ... xdp off)"
            )


COMMAND = RedirectCommand()
