"""python -m lab lb: a layer-4 load balancer at the XDP hook (ebpf.XdpLoadBalancer),
with health checks and a live table per backend. In the conventions of `python
-m vtap`: it works in the namespace it starts in, every exit detaches what it
attached, and the same exit statuses (lab/console.py).

Backends serve every service of their address family. Their weights can change
while it runs: with --backends-file, the file (one ADDR:PORT[@WEIGHT] per line)
is read again whenever it changes; a weight of 0 drains a backend (no new
sessions, its sessions go on). A backend that fails its health check (a TCP
connect, --fall times in a row) leaves the Maglev table until it passes --rise
times; only its own sessions are affected.
"""

import argparse
import contextlib
import ipaddress
import socket
from pathlib import Path

from ebpf import BpfError, netdev, xdp
from ebpf.lb.xdp_lb import TIMEOUTS, Backend, Service, XdpLoadBalancer
from lab import hostcheck
from lab.console import (
    SIGNALS,
    LiveTable,
    UsageError,
    add_run_options,
    add_xdp_mode,
    check_run_options,
    report_cleanup,
    require,
    run_command,
    run_until_stopped,
    show_program,
    warn,
)
from lab.exporter import serving
from lab.hostcheck import PreparedPeers

from .health import HealthChecker

EXAMPLES = """\
examples:
  python -m lab lb --iface eth0 --service tcp:198.18.5.100:80 \\
                   --backend 198.18.5.11:8080 --backend 198.18.5.12:8080@2
                        # NAT: backends see this host's address; replies come back through it
  python -m lab lb --iface eth0 --service 'tcp:[2001:2:0:5::100]:80' --backend '[2001:2:0:5::11]:8080'
  python -m lab lb --iface eth0 --service tcp:198.18.5.100:80 --backends-file backends.txt
                        # edit the file while it runs: weights change, 0 drains
  python -m lab lb ... --mode dsr       # backends hold the VIP and answer clients directly
  python -m lab lb ... --timeout udp=5  # idle UDP flows leave the table after 5 s
  ip netns exec lb python -m lab lb ...     # inside a network namespace
  python -m lab lb --cleanup            # remove what a killed run left attached

exit status: 0 stopped (--duration, Ctrl-C, SIGTERM, SIGHUP, output closed);
  1 failed (BCC missing, compiler, verifier or hook refused, program removed while running);
  2 cannot run as given (bad option, service or backend, unknown interface, not root)
"""


NEEDS = """\
what the hosts around it need (checked at start; each missing piece is one line with its fix):
  - forwarding on --iface (bpf_fib_lookup() finds the backends' MACs only there):
      sysctl -w net.ipv4.conf.IF.forwarding=1 net.ipv6.conf.IF.forwarding=1
  - if --iface is a veth: a native XDP program on its peer, or the frames the LB
    sends back out (XDP_TX) are lost; --prepare-peer attaches one while it runs
  - NAT: clients reach the VIP through this host (the VIP an address of --iface,
    or routed to it); backends answer to this host's own address (--self)
  - DSR: each backend holds the VIP on its loopback and does not answer ARP/ND for it
    (sysctl -w net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2)
TX checksum offload may stay on everywhere: the program finishes checksums the
senders left partial.
"""


def add_arguments(p):
    p.description = ("Spread connections to services (protocol, VIP, port) over backends at the XDP hook: "
                     "Maglev consistent hashing, connection tracking, NAT or DSR.\n\n" + NEEDS)
    p.epilog, p.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("--iface", metavar="IF", help="where clients and backends are reached (one-armed)")
    p.add_argument("--service", metavar="PROTO:VIP:PORT", action="append", default=[],
                   help="tcp or udp; IPv6 in brackets (repeatable)")
    p.add_argument("--backend", metavar="ADDR:PORT[@WEIGHT]", action="append", default=[],
                   help="a backend of every service of its family, weight 1 unless given (repeatable)")
    p.add_argument("--backends-file", metavar="FILE", help="backends, one ADDR:PORT[@WEIGHT] per line, read "
                   "again whenever the file changes")
    p.add_argument("--mode", default="nat", choices=("nat", "dsr"), help="default %(default)s")
    p.add_argument("--self", dest="self_addrs", metavar="ADDR", action="append", default=[],
                   help="the LB's own address the backends see in NAT mode (default: the interface's first "
                        "address of each family)")
    add_xdp_mode(p)
    p.add_argument("--prepare-peer", action="store_true",
                   help="if --iface is a veth whose peer runs no native XDP program, attach a pass program "
                        "there while this runs (so the frames it sends back out arrive)")
    p.add_argument("--health-check", default="tcp", choices=("tcp", "none"),
                   help="tcp: connect to each backend every --check-interval (default %(default)s)")
    p.add_argument("--check-interval", type=float, default=1.0, metavar="S", help="default %(default)s")
    p.add_argument("--timeout", metavar="STATE=S", action="append", default=[],
                   help="how long an idle session of a state lives: syn, established, fin, udp (default "
                        "syn=10 established=300 fin=10 udp=30; repeatable)")
    p.add_argument("--rise", type=int, default=2, help="passes in a row before a backend is used (default 2)")
    p.add_argument("--fall", type=int, default=3, help="failures in a row before it is not (default 3)")
    add_run_options(p, "load balancer programs")


def read_backends(args):
    """{Backend: weight} from --backend and --backends-file (UsageError on bad lines)."""
    entries = [(b, "--backend") for b in args.backend]
    if args.backends_file:
        try:
            lines = Path(args.backends_file).read_text().splitlines()
        except OSError as e:
            raise UsageError(f"cannot read --backends-file {args.backends_file}: {e.strerror}") from None
        entries += [(ln.split("#", 1)[0].strip(), f"{args.backends_file} line {i}") for i, ln in enumerate(lines, 1)
                    if ln.split("#", 1)[0].strip()]
    out = {}
    for text, where in entries:
        try:
            be, w = Backend.parse(text)
        except Exception as e:
            raise UsageError(f"{where}: {e}") from None
        out[be] = w
    return out


def read_timeouts(args):
    """{state: seconds} from --timeout STATE=S (UsageError on a bad one)."""
    out = {}
    for text in args.timeout:
        state, _, value = text.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1
        if state not in TIMEOUTS or not 0 < seconds <= 86400:
            raise UsageError(f"bad --timeout {text!r}: want STATE=SECONDS, STATE one of {', '.join(TIMEOUTS)}, "
                             "0 < SECONDS <= 86400")
        out[state] = seconds
    return out


def check_args(args):
    check_run_options(args)
    if args.cleanup:
        return
    read_timeouts(args)
    require(args, iface="--iface is required (where clients and backends are reached)",
            service="--service is required (PROTO:VIP:PORT)")
    try:
        services = [Service.parse(s) for s in args.service]
    except Exception as e:
        raise UsageError(str(e)) from None
    backends = read_backends(args)
    if not backends:
        raise UsageError("no backends: give --backend or --backends-file")
    for svc in services:
        if not any(b.addr.version == svc.vip.version for b in backends):
            raise UsageError(f"service {svc} has no IPv{svc.vip.version} backend")
    if args.check_interval <= 0 or args.rise < 1 or args.fall < 1:
        raise UsageError("--check-interval must be > 0, --rise and --fall at least 1")


class Printer(LiveTable):
    """The LB's live table: a row per backend (weight, health, sessions, packets
    and replies) and the drops by reason."""

    def __init__(self, as_json, mode="nat"):
        super().__init__(as_json)
        self.nat = mode == "nat"  # NAT: replies come back through the LB, so their absence is news (DSR: never seen)

    def header(self, lb, iface, args):
        ports = f"{lb.port_min}-{lb.port_min + lb.port_count - 1}"
        msg = dict(event="attached", iface=iface, mode=args.mode, xdp_mode=args.xdp_mode,
                   services=[str(s) for s in lb._services], backends=[str(b) for b in lb._backends],
                   lb_ports=ports if args.mode == "nat" else None)
        if self.json:
            self.emit(msg)
        else:
            self.emit(f"lb: {args.mode} on {iface} ({args.xdp_mode}); {len(lb._services)} service(s), "
                      f"{len(lb._backends)} backend(s)" + (f"; LB ports {ports}" if args.mode == "nat" else "") +
                      "; Ctrl-C to stop")

    def sample(self, lb, weights, health, final=False):
        weights = {str(b): w for b, w in weights.items()}
        health = {str(b): ok for b, ok in health.items()}
        per = lb.backend_counters()
        active = {}
        for s in lb.sessions():
            active[s["backend"]] = active.get(s["backend"], 0) + 1
        dt, before = self.interval(per, final)
        stats = lb.counters()
        rows = {}
        for b, c in per.items():
            pps = self.rates(c, before.get(b, {}), ("packets",), dt)["packets"]
            rows[b] = {**c, "active_sessions": active.get(b, 0), "packets_pps": round(pps, 1),
                       "weight": weights.get(b, 0), "healthy": health.get(b, True)}
            if self.nat:
                rows[b]["unanswered"], silent = self.replies(b, c["packets"], c["reply_packets"])
                if silent:
                    rows[b]["hint"] = hostcheck.ReplyWatch.HINT
        body = {**stats, "backends": rows}
        self.publish(body)
        if self.json:
            self.event(final, body)
            return
        label, header = self.block(final)
        if header:
            self.emit(f"{'SUMMARY' if final else 'TIME':8} {'BACKEND':24} {'W':>3} {'UP':>3} {'ACTIVE':>7} "
                      f"{'NEW':>8} {'PKTS/s':>9} {'PACKETS':>10} {'REPLIES':>10}")
        for b, r in rows.items():
            self.emit(f"{label:8} {b:24} {r['weight']:>3} {'yes' if r['healthy'] else 'no':>3} "
                      f"{r['active_sessions']:>7} {r['new_sessions']:>8} {r['packets_pps']:>9.0f} {r['packets']:>10} "
                      f"{r['reply_packets']:>10}")
        drops = {k: v for k, v in stats.items() if k.startswith("dropped_") and v}
        if drops:
            self.emit(f"{'':8} dropped: " + ", ".join(f"{k[8:].replace('_', '-')} {v}" for k, v in drops.items()))


def cleanup(all_runs=False):
    """What killed load balancers left in this namespace: (removed, spared), as lines."""
    removed, spared = xdp.cleanup("xdp_lb", spare_live=not all_runs)
    removed += hostcheck.cleanup_peer_programs()  # what --prepare-peer left on veth peers
    return removed, spared


def own_addresses(iface, vips=()):
    """The interface's first global address of each family that is not a VIP:
    the NAT source, and where health checks come from. (The kernel lists a
    family's addresses newest first: the VIP is often first.)"""
    found = {}
    skip = {ipaddress.ip_address(v) for v in vips}
    with netdev.ipr(None) as ip:
        index = netdev.ifindex_of(ip, iface)
        for m in ip.get_addr(index=index):
            addr = m.get_attr("IFA_ADDRESS")
            if m.get("scope", 0) == 0 and ipaddress.ip_address(addr) not in skip:
                found.setdefault(m["family"], addr)
    return found.get(socket.AF_INET), found.get(socket.AF_INET6)


def host_findings(args):
    """What the hosts around the LB lack, as far as this namespace can see."""
    # generic mode sends XDP_TX frames as skbs, through the veth's own xmit: no NAPI needed
    found = (hostcheck.check_veth_peer(args.iface, sends="XDP_TX")
             if args.xdp_mode == "native" and not args.prepare_peer else [])
    found += hostcheck.check_gro(args.iface, args.xdp_mode)
    return found


def run(args):
    if args.cleanup:
        return report_cleanup("lb", *cleanup(args.all))
    self4, self6 = own_addresses(args.iface, [Service.parse(s).vip for s in args.service])
    for addr in args.self_addrs:
        if ":" in addr:
            self6 = addr
        else:
            self4 = addr
    lb = XdpLoadBalancer(self4=self4, self6=self6, mode=args.mode, timeouts=read_timeouts(args))
    services = [lb.add_service(s) for s in args.service]
    weights = read_backends(args)
    health = HealthChecker(weights, args.check_interval, args.rise, args.fall,
                           sources={4: self4, 6: self6}) if args.health_check == "tcp" else None

    def apply(weights):
        up = health.healthy if health else {}
        for svc in services:
            lb.set_backends(svc, {b: (w if up.get(b, True) else 0) for b, w in weights.items()
                                  if b.addr.version == svc.vip.version})

    apply(weights)
    if args.ebpf:
        return show_program(lb)
    printer = Printer(args.json, args.mode)
    metrics = serving(printer, args, "lb", rows={"backends": "backend"},
                      gauges={"active_sessions", "weight", "healthy", "unanswered"})
    mtime = Path(args.backends_file).stat().st_mtime_ns if args.backends_file else None
    SIGNALS.check()
    peers = PreparedPeers()
    with metrics, lb, contextlib.closing(peers):
        lb.load_program()
        SIGNALS.check()
        lb.attach(args.iface, args.xdp_mode)
        if args.prepare_peer and args.xdp_mode == "native" and (peer := peers.prepare(args.iface)):
            warn(f"attached a pass program to {args.iface}'s veth peer {peer.ifname} ({peer.label}) while this runs")
        for finding in host_findings(args):
            warn(str(finding))
        # the program drops a new session's packet while its backend's MAC is
        # unknown (no-neigh): ask the kernel to resolve them all now
        sources = {4: self4, 6: self6}
        for addr in hostcheck.resolve_neighbours([b.addr for b in weights], sources):
            warn(f"no neighbour entry for backend {addr} yet: its first packets are dropped (no-neigh) "
                 "until the kernel resolves it")
        no_neigh = 0
        if health:
            health.start()
        try:
            printer.header(lb, args.iface, args)
            printer.sample(lb, weights, health.healthy if health else {})

            def tick():
                nonlocal weights, mtime, no_neigh
                if not lb.xdp_attachments or xdp.removed_from_outside(lb.xdp_attachments):
                    raise BpfError(f"stopped: the program was removed from {args.iface} from outside "
                                   "(python -m lab lb --cleanup --all, ip link set ... xdp off)")
                if args.backends_file:
                    m = Path(args.backends_file).stat().st_mtime_ns
                    if m != mtime:
                        mtime = m
                        try:
                            new = read_backends(args)
                        except UsageError as e:
                            warn(f"kept the backends as they were: {e}")
                        else:
                            weights = new
                            if health:
                                health.set_backends(weights)
                            apply(weights)
                            warn(f"backends now: {', '.join(f'{b}@{w}' for b, w in weights.items())}")
                if health and health.changed.is_set():
                    health.changed.clear()
                    apply(weights)
                    down = [str(b) for b, ok in health.healthy.items() if not ok]
                    warn(f"unhealthy: {', '.join(down)}" if down else "every backend is healthy")
                lb.sweep()
                dropped = lb.counters()["dropped_no_neigh"]
                if dropped > no_neigh:  # an entry expired or was flushed: ask again, without waiting
                    no_neigh = dropped
                    hostcheck.resolve_neighbours([b.addr for b in weights], sources, seconds=0)
                printer.sample(lb, weights, health.healthy if health else {})
            run_until_stopped(args.interval, args.duration, tick,
                              lambda: printer.sample(lb, weights, health.healthy if health else {}, final=True))
        finally:
            if health:
                health.stop()
    return 0


def main(args):
    """python -m lab lb (lab/__main__.py parses the arguments)."""
    SIGNALS.install()
    return run_command("python -m lab lb", lambda: check_args(args), lambda: run(args))
