"""python -m lab lb: a layer-4 load balancer at the TC or the XDP hook
(ebpf.TcLoadBalancer, ebpf.XdpLoadBalancer), with health checks and a live table
per backend. --hook auto (the default) picks XDP where the interface's driver runs
it natively and it is not a veth, TC otherwise; the start line says which and why. What is its own is below; the
lifecycle every tool shares (lab.lifecycle) does the rest: it works in the
namespace it starts in, every exit detaches what it attached, and the same exit
statuses.

Backends serve every service of their address family. Their weights can change
while it runs: with --backends-file, the file (one ADDR:PORT[@WEIGHT] per line)
is read again whenever it changes; a weight of 0 drains a backend (no new
sessions, its sessions go on). A backend that fails its health check (a TCP
connect, --fall times in a row) leaves the Maglev table until it passes --rise
times; only its own sessions are affected.
"""

import contextlib
import ipaddress
from pathlib import Path

from ebpf import BpfError, InputError, netdev, tc, xdp
from ebpf.errors import KeptDatapathMismatch
from ebpf.lb.tc_lb import OWNER as TC_OWNER
from ebpf.lb.tc_lb import TcLoadBalancer, hook_for
from ebpf.lb.xdp_lb import (
    HALF_OPEN,
    MAX_BACKENDS,
    MAX_SERVICES,
    SESSIONS,
    TIMEOUTS,
    Service,
    WeightedBackend,
    XdpLoadBalancer,
    forwarding_problem,
)
from lab import hostcheck
from lab.console import SIGNALS, LiveTable, UsageError, add_xdp_mode, require, warn
from lab.hostcheck import PreparedPeers
from lab.lifecycle import Command

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
  python -m lab lb ... --hook xdp       # at the XDP hook (auto: XDP on a NIC that runs it natively, else TC)
  python -m lab lb ... --timeout udp=5  # idle UDP flows leave the table after 5 s
  ip netns exec lb python -m lab lb ...     # inside a network namespace
  python -m lab lb ... --keep           # on exit, leave it serving: the next run takes it over
  python -m lab lb --cleanup            # remove what a killed or --keep run left attached

exit status: 0 stopped (--duration, Ctrl-C, SIGTERM, SIGHUP, output closed);
  1 failed (BCC missing, compiler, verifier or hook refused, program removed while running);
  2 cannot run as given (bad option, service or backend, unknown interface, not root)
"""


NEEDS = """\
what the hosts around it need (checked at start; each missing piece is one line with its fix):
  - at XDP only: forwarding on --iface (bpf_fib_lookup() finds the backends' MACs only there):
      sysctl -w net.ipv4.conf.IF.forwarding=1 net.ipv6.conf.IF.forwarding=1
  - at XDP only, if --iface is a veth: a native XDP program on its peer, or the frames
    the LB sends back out (XDP_TX) are lost; --prepare-peer attaches one while it runs.
    At TC neither: the kernel's neighbour table finds the next hop as a frame leaves
  - NAT: clients reach the VIP through this host (the VIP an address of --iface,
    or routed to it); backends answer to this host's own address (--self; by
    default --iface's first address that is not a VIP, else the VIP itself)
  - DSR: each backend holds the VIP on its loopback and does not answer ARP/ND for it
    (sysctl -w net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2);
    health checks come from an address of this host that is not a VIP (--self)
TX checksum offload may stay on everywhere: at XDP the program finishes checksums
the senders left partial; at TC the kernel's skb helpers keep them right.
"""


def backend_lines(path):
    """(text, where) of each backend line of a --backends-file (UsageError if it cannot be read)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise UsageError(f"cannot read --backends-file {path}: {e.strerror}") from None
    return [
        (ln.split("#", 1)[0].strip(), f"{path} line {i}")
        for i, ln in enumerate(lines, 1)
        if ln.split("#", 1)[0].strip()
    ]


def parse_backends(entries) -> list[tuple]:
    """Each (text, where) parsed into (service or None, WeightedBackend): SERVICE=ADDR:PORT[@WEIGHT]
    names a backend of that service only, ADDR:PORT[@WEIGHT] one of every service of its family
    that has none named for it (UsageError saying where a bad one is)."""
    out = []
    for text, where in entries:
        svc_text, _, be_text = text.rpartition("=")
        try:
            svc = Service.parse(svc_text.strip()) if svc_text else None
            wb = WeightedBackend.parse(be_text)
            if svc is not None and svc.vip.version != wb.backend.addr.version:
                raise UsageError(f"backend {wb.backend} of {svc}: families differ")
        except Exception as e:
            raise UsageError(f"{where}: {e}") from None
        out.append((svc, wb))
    return out


def weights_of(*backends) -> dict:
    """{(service or None, Backend): weight} of lists from parse_backends(): a backend given
    twice for the same service (or for every one) takes its last weight."""
    return {(svc, wb.backend): wb.weight for given in backends for svc, wb in given}


def service_weights(assigned: dict, svc) -> dict:
    """{Backend: weight} of one service: the backends named for it, else every one of its
    family named for no service."""
    own = {b: w for (s, b), w in assigned.items() if s == svc}
    return own or {b: w for (s, b), w in assigned.items() if s is None and b.addr.version == svc.vip.version}


def backend_weights(assigned: dict) -> dict:
    """{Backend: weight} of every backend of any service (the last weight given to it)."""
    return {b: w for (_, b), w in assigned.items()}


def read_timeouts(given):
    """{state: seconds} from --timeout STATE=S (UsageError on a bad one)."""
    out = {}
    for text in given:
        state, _, value = text.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1
        if state not in TIMEOUTS or not 0 < seconds <= 86400:
            raise UsageError(
                f"bad --timeout {text!r}: want STATE=SECONDS, STATE one of {', '.join(TIMEOUTS)}, 0 < SECONDS <= 86400"
            )
        out[state] = seconds
    return out


def own_text(used, vip_as_own, iface):
    return ", ".join(
        f"{a} (the VIP: {iface}'s only IPv{v} address)" if v in vip_as_own else str(a) for v, a in used.items()
    )


class Printer(LiveTable):
    """The LB's live table: a row per backend (weight, health, sessions, packets
    and replies) and the drops by reason."""

    def __init__(self, as_json, mode="nat"):
        super().__init__(as_json)
        self.nat = mode == "nat"  # NAT: replies come back through the LB, so their absence is news (DSR: never seen)

    def header(self, lb, iface, args, own=(), vip_as_own=(), taken_over=None):
        """own: {IP version: the LB's own address}; vip_as_own: the versions whose own address is a VIP;
        taken_over: the sessions of a kept load balancer this run took over (None: it loaded its own)."""
        ports = f"{lb.port_min}-{lb.port_min + lb.port_count - 1}"
        used = {v: a for v, a in dict(own).items() if a and any(s.vip.version == v for s in lb.services)}
        msg = dict(
            event="attached",
            iface=iface,
            mode=args.mode,
            hook=args.hook,
            hook_reason=args.hook_why,
            xdp_mode=args.xdp_mode if args.hook == "xdp" else None,
            services=[str(s) for s in lb.services],
            backends=[str(b) for b in lb.backends],
            lb_ports=ports if args.mode == "nat" else None,
            own_addresses=[str(a) for a in used.values()],
            taken_over=taken_over is not None,
            sessions_taken_over=taken_over or 0,
        )
        if self.json:
            self.emit(msg)
        else:
            if taken_over is not None:
                self.emit(f"lb: took over the load balancer left serving on {iface}: its {taken_over} sessions go on")
            self.emit(
                f"lb: {args.mode} on {iface} at {hook_text(args)}; {len(lb.services)} service(s), "
                f"{len(lb.backends)} backend(s)"
                + (f"; backends answer to {own_text(used, vip_as_own, iface)}" if args.mode == "nat" else "")
                + (f"; LB ports {ports}" if args.mode == "nat" else "")
                + "; Ctrl-C to stop"
            )

    def sample(self, lb, weights, health, active, final=False):
        """active: live sessions per backend, as the sweep's last whole pass counted them."""
        weights = {str(b): w for b, w in weights.items()}
        health = {str(b): ok for b, ok in health.items()}
        per = lb.backend_counters()
        dt, before = self.interval(per, final)
        stats = lb.counters()
        rows = {}
        for b, c in per.items():
            pps = self.rates(c, before.get(b, {}), ("packets",), dt)["packets"]
            rows[b] = {
                **c,
                "active_sessions": active.get(b, 0),
                "packets_pps": round(pps, 1),
                "weight": weights.get(b, 0),
                "healthy": health.get(b, True),
            }
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
            self.emit(
                f"{'SUMMARY' if final else 'TIME':8} {'BACKEND':24} {'W':>3} {'UP':>3} {'ACTIVE':>7} "
                f"{'NEW':>8} {'PKTS/s':>9} {'PACKETS':>10} {'REPLIES':>10}"
            )
        for b, r in rows.items():
            self.emit(
                f"{label:8} {b:24} {r['weight']:>3} {'yes' if r['healthy'] else 'no':>3} "
                f"{r['active_sessions']:>7} {r['new_sessions']:>8} {r['packets_pps']:>9.0f} {r['packets']:>10} "
                f"{r['reply_packets']:>10}"
            )
        drops = {k: v for k, v in stats.items() if k.startswith("dropped_") and v}
        if drops:
            self.emit(f"{'':8} dropped: " + ", ".join(f"{k[8:].replace('_', '-')} {v}" for k, v in drops.items()))


def hook_text(args) -> str:
    """Where it runs, and why there: "TC (eth0 is a veth: ...)", "XDP native (--hook xdp)"."""
    where = f"XDP {args.xdp_mode}" if args.hook == "xdp" else "TC ingress"
    return f"{where} ({args.hook_why})"


def own_addresses(iface, vips=()):
    """Per IP version, the LB's own address on the interface: what NAT's backends
    answer to, and where health checks come from. The first global address that is
    not a VIP (the kernel lists a family's addresses newest first: the VIP is often
    first), else the first VIP, as the XDP load-balancer articles set an LB up (the
    VIP its only address: its LB ports stay clear of the host's own connections).
    Returns ({4: addr or None, 6: ...}, {the versions whose address is a VIP})."""
    found, vip_found = {}, {}
    skip = {ipaddress.ip_address(v) for v in vips}
    with netdev.ipr(None) as ip:
        index = netdev.ifindex_of(ip, iface)
        for m in ip.get_addr(index=index):
            addr = m.get_attr("IFA_ADDRESS")
            if m.get("scope", 0) == 0:
                version = ipaddress.ip_address(addr).version
                (vip_found if ipaddress.ip_address(addr) in skip else found).setdefault(version, addr)
    own = {v: found.get(v, vip_found.get(v)) for v in (4, 6)}
    return own, {v for v in (4, 6) if v not in found and v in vip_found}


def address_problems(args, families, own, vip_as_own) -> list[str]:
    """What keeps the LB from having an address of its own where it needs one, each with its fix."""
    iface, out = args.iface, []
    for v in sorted(families):
        if args.mode == "nat" and own[v] is None:
            out.append(
                f"NAT mode needs an IPv{v} address of this host for the backends to answer to, and {iface} "
                f"has none: give one with --self ADDR, or add one: ip addr add ADDR/PREFIX dev {iface}"
            )
        elif args.mode == "dsr" and v == 4 and (own[v] is None or v in vip_as_own):
            # ARP, unlike IPv6's neighbour discovery, refuses a request whose sender is an
            # address of the receiver's own (the backend's VIP): no backend's MAC is ever found
            out.append(
                f"DSR needs an IPv4 address of this host that is not a VIP, and {iface} has none: the backends "
                "hold the VIP and drop what comes from it (the ARP requests that find their MACs, health "
                f"checks); give one with --self ADDR, or add one: ip addr add ADDR/PREFIX dev {iface}"
            )
        elif args.mode == "dsr" and args.health_check == "tcp" and (own[v] is None or v in vip_as_own):
            out.append(
                f"DSR health checks need an IPv{v} address of this host that is not a VIP (the backends hold "
                f"the VIP and drop what comes from it), and {iface} has none: give one with --self ADDR "
                f"(ip addr add ADDR/PREFIX dev {iface}), or --health-check none"
            )
    return out


def arp_source_problem(iface, vips, backends, own=None) -> str | None:
    """DSR at TC: why the kernel cannot resolve the IPv4 backends' MACs, with the fix, or None.
    bpf_redirect_neigh() resolves a next hop as the kernel does for a frame it forwards: its
    ARP request comes from the interface's first primary address in the backend's subnet
    (inet_select_addr(): the frame's own source, the client, is no address of this host).
    When that is a VIP, the backends, which hold the VIP themselves, never answer. own: the
    LB's own IPv4 address, put back by the fix (deleting a primary address deletes the
    secondaries of its subnet with it)."""
    vips = {ipaddress.ip_address(v) for v in vips if ipaddress.ip_address(v).version == 4}
    with netdev.ipr(None) as ip:
        index = netdev.ifindex_of(ip, iface)
        addrs = [
            (
                ipaddress.ip_interface(f"{m.get_attr('IFA_ADDRESS')}/{m['prefixlen']}"),
                bool((m.get_attr("IFA_FLAGS") or m["flags"]) & 0x01),  # IFA_F_SECONDARY
            )
            for m in ip.get_addr(index=index, family=2)
        ]
    primaries = [a for a, secondary in addrs if not secondary]
    for be in backends:
        if be.version != 4:
            continue
        chosen = next((a for a in primaries if be in a.network), None)
        if chosen is not None and chosen.ip in vips:
            fix = f"ip addr del {chosen} dev {iface} && ip addr add {chosen.ip}/32 dev {iface}"
            mine = next((a for a, _ in addrs if own is not None and a.ip == ipaddress.ip_address(own)), None)
            if mine is not None:
                fix += f" && ip addr replace {mine} dev {iface}"
            return (
                f"DSR at TC: the kernel's ARP requests for backend {be} would come from the VIP {chosen.ip} "
                f"({iface}'s first address in {chosen.network}), which the backends hold and never answer; "
                f"make the VIP a /32 so that this host's own address is used: {fix}; or run at XDP (--hook xdp)"
            )
    return None


def host_findings(args):
    """What the hosts around the LB lack, as far as this namespace can see."""
    if args.hook != "xdp":  # at TC the kernel sends an skb on: nothing is needed of the peer, nor of GRO
        return []
    # generic mode sends XDP_TX frames as skbs, through the veth's own xmit: no NAPI needed
    found = (
        hostcheck.check_veth_peer(args.iface, sends="XDP_TX")
        if args.xdp_mode == "native" and not args.prepare_peer
        else []
    )
    found += hostcheck.check_gro(args.iface, args.xdp_mode)
    return found


class LbCommand(Command):
    name, short = "python -m lab lb", "lb"
    description = (
        "Spread connections to services (protocol, VIP, port) over backends at the TC or XDP hook: "
        "Maglev consistent hashing, connection tracking, NAT or DSR.\n\n" + NEEDS
    )
    examples = EXAMPLES
    cleans = "load balancer programs"
    metrics_rows = {"backends": "backend"}
    metrics_gauges = frozenset({"active_sessions", "weight", "healthy", "unanswered"})

    def options(self, p):
        p.add_argument("--iface", metavar="IF", help="where clients and backends are reached (one-armed)")
        p.add_argument(
            "--service",
            metavar="PROTO:VIP:PORT",
            action="append",
            default=[],
            help="tcp or udp; IPv6 in brackets (repeatable)",
        )
        p.add_argument(
            "--backend",
            metavar="ADDR:PORT[@WEIGHT]",
            action="append",
            default=[],
            help="a backend, weight 1 unless given (repeatable): of every service of its family that has "
            "none named for it, or, as SERVICE=ADDR:PORT[@WEIGHT], of that service only",
        )
        p.add_argument(
            "--backends-file",
            metavar="FILE",
            help="backends, one [SERVICE=]ADDR:PORT[@WEIGHT] per line (as --backend), read again whenever "
            "the file changes",
        )
        p.add_argument("--mode", default="nat", choices=("nat", "dsr"), help="default %(default)s")
        p.add_argument(
            "--self",
            dest="self_addrs",
            metavar="ADDR",
            action="append",
            default=[],
            help="the LB's own address: what the backends answer to in NAT mode, where health checks come from "
            "(default: the interface's first address of each family that is not a VIP, else the VIP)",
        )
        p.add_argument(
            "--hook",
            default="auto",
            choices=("auto", "tc", "xdp"),
            help="where the program runs: tc (ingress, after the filters there), xdp, or auto: XDP where "
            "--iface's driver runs it natively and it is not a veth, else TC; --xdp-mode or --prepare-peer "
            "given choose XDP (default %(default)s)",
        )
        add_xdp_mode(p, default=None)  # here, not the lifecycle's: --help has always listed it before --prepare-peer
        p.add_argument(
            "--prepare-peer",
            action="store_true",
            help="--hook xdp: if --iface is a veth whose peer runs no native XDP program, attach a pass program "
            "there while this runs (so the frames it sends back out arrive)",
        )
        p.add_argument(
            "--health-check",
            default="tcp",
            choices=("tcp", "none"),
            help="tcp: connect to each backend every --check-interval (default %(default)s)",
        )
        p.add_argument("--check-interval", type=float, default=1.0, metavar="S", help="default %(default)s")
        p.add_argument(
            "--timeout",
            metavar="STATE=S",
            action="append",
            default=[],
            help="how long an idle session of a state lives: syn, established, fin, udp (default "
            "syn=10 established=300 fin=10 udp=30; repeatable)",
        )
        p.add_argument(
            "--keep",
            action="store_true",
            help="on exit, leave the datapath attached and serving (sessions, LB ports, Maglev tables, "
            "counters): the next run on this interface takes it over, --cleanup removes it",
        )
        p.add_argument(
            "--replace",
            action="store_true",
            help="put this program in place of a load balancer left serving on --iface that it cannot "
            "take over (another mode, table size or version): the old one's sessions are lost",
        )
        sizes = p.add_argument_group(
            "table sizes",
            "fixed when the program is made (a kept LB is taken over only by one of the same sizes); "
            "the kernel's memory for them is what `--json`'s start line calls maps_bytes",
        )
        sizes.add_argument(
            "--max-services",
            type=int,
            default=MAX_SERVICES,
            metavar="N",
            help="services it can hold, each with a Maglev table of 65537 slots, which the kernel keeps in "
            "8 bytes each: 512 KiB a service (default %(default)s: 32 MiB; 512: 256 MiB)",
        )
        sizes.add_argument(
            "--max-backends",
            type=int,
            default=MAX_BACKENDS,
            metavar="N",
            help="backends of all services together, 24 bytes each and 40 a CPU for their counters "
            "(default %(default)s)",
        )
        sizes.add_argument(
            "--max-sessions",
            type=int,
            default=SESSIONS,
            metavar="N",
            help="established sessions (an LRU table: the least recently used is evicted when it is full, "
            "counted in no_session when its flow sends again), 128 bytes each, about twice that in NAT "
            "(its table of LB ports): default %(default)s, 32 MiB in NAT; 1000000: 123 MiB in DSR, 240 MiB "
            "in NAT. In NAT each backend ADDR:PORT holds at most as many sessions as there are LB ports "
            "(31744 with the kernel's default ephemeral ports: the start line says), so 1M sessions need "
            "at least 32 backends",
        )
        sizes.add_argument(
            "--fill-sessions",
            type=int,
            default=0,
            metavar="N",
            help="for benchmarks: N established sessions of the first service, of made-up clients spread "
            "over the hash and its backends, written before the program attaches: the tables at the size "
            "a busy LB holds (bench lb --sessions). DSR only; at most --max-sessions",
        )
        sizes.add_argument(
            "--max-half-open",
            type=int,
            default=HALF_OPEN,
            metavar="N",
            help="sessions whose handshake is not complete, apart, so that a SYN flood evicts only these "
            "(default %(default)s)",
        )
        p.add_argument("--rise", type=int, default=2, help="passes in a row before a backend is used (default 2)")
        p.add_argument("--fall", type=int, default=3, help="failures in a row before it is not (default 3)")

    def parse(self, args):
        """The timeouts, services and backends, parsed once: what the run uses (and `given`, the --backend
        ones, which a changed --backends-file is added to again)."""
        self.timeouts = read_timeouts(args.timeout)
        require(
            args,
            iface="--iface is required (where clients and backends are reached)",
            service="--service is required (PROTO:VIP:PORT)",
        )
        try:
            self.services = [Service.parse(s) for s in args.service]
        except Exception as e:
            raise UsageError(str(e)) from None
        from_file = backend_lines(args.backends_file) if args.backends_file else []
        self.mtime = Path(args.backends_file).stat().st_mtime_ns if args.backends_file else None
        self.given = parse_backends((b, "--backend") for b in args.backend)
        self.assign(weights_of(self.given, parse_backends(from_file)))
        if not self.weights:
            raise UsageError("no backends: give --backend or --backends-file")

        for addr in args.self_addrs:
            try:
                ipaddress.ip_address(addr)
            except ValueError:
                raise UsageError(f"bad --self {addr!r}: want an IPv4 or IPv6 address of this host") from None
        if args.check_interval <= 0 or args.rise < 1 or args.fall < 1:
            raise UsageError("--check-interval must be > 0, --rise and --fall at least 1")
        for opt, n, top in (
            ("--max-services", args.max_services, 65536),
            ("--max-backends", args.max_backends, 65535),
            ("--max-sessions", args.max_sessions, 1 << 26),
            ("--max-half-open", args.max_half_open, 1 << 26),
        ):
            if not 1 <= n <= top:
                raise UsageError(f"{opt} must be 1 to {top}")
        if args.fill_sessions and args.mode != "dsr":
            raise UsageError("--fill-sessions: DSR only (a NAT session holds an LB port)")
        if args.fill_sessions < 0:
            raise UsageError("--fill-sessions must be 0 or more")
        if args.fill_sessions > args.max_sessions:
            raise UsageError(
                f"--fill-sessions {args.fill_sessions}: more than the table holds (--max-sessions "
                f"{args.max_sessions}); fix: --max-sessions {args.fill_sessions + args.fill_sessions // 4} "
                "(room for the run's own: the table evicts before it is full)"
            )
        if len(self.services) > args.max_services:
            raise UsageError(f"{len(self.services)} services, more than --max-services {args.max_services}")
        if len(self.weights) > args.max_backends:
            raise UsageError(f"{len(self.weights)} backends, more than --max-backends {args.max_backends}")
        xdp_given = [o for o, v in (("--xdp-mode", args.xdp_mode), ("--prepare-peer", args.prepare_peer)) if v]
        if args.hook == "tc" and xdp_given:
            verb = "go" if len(xdp_given) > 1 else "goes"
            raise UsageError(f"{' and '.join(xdp_given)} {verb} with --hook xdp (at TC no peer program is needed)")

    def assign(self, assigned):
        """The backends of each service (`assigned`, weights_of()'s), checked: every service has one,
        every one named for a service names one that is run (UsageError, nothing applied)."""
        unknown = sorted({str(s) for s, _ in assigned if s is not None and s not in self.services})
        if unknown:
            raise UsageError(f"backends named for {', '.join(unknown)}, which no --service gives")
        for svc in self.services:
            if not service_weights(assigned, svc):
                raise UsageError(f"service {svc} has no IPv{svc.vip.version} backend")
        lb = getattr(self, "lb", None)  # running: a backend keeps its slot while its sessions last
        if lb is not None and len(set(lb.backends) | set(backend_weights(assigned))) > lb.max_backends:
            raise UsageError(
                f"{len(set(lb.backends) | set(backend_weights(assigned)))} backends with those given before, "
                f"more than --max-backends {lb.max_backends}"
            )
        self.assigned = assigned  # {(Service or None, Backend): weight}
        self.weights = backend_weights(assigned)  # {Backend: weight}: every backend of any service

    def cleanup(self, all_runs=False):
        """What killed load balancers left in this namespace: (removed, spared), as lines."""
        removed, spared = xdp.cleanup("xdp_lb", spare_live=not all_runs)
        tc_removed, tc_spared = tc.cleanup(TC_OWNER, spare_live=not all_runs)
        removed += [r for r in tc_removed if r.startswith("filter ")]
        spared += [f"tc_lb on {f.where} (tc): pid {', '.join(map(str, f.pids))} holds it" for f in tc_spared]
        removed = [f"{what}: a load balancer left serving (--keep, or killed), its sessions ended" for what in removed]
        removed += [r for r in tc_removed if not r.startswith("filter ")]  # the clsact qdiscs it made
        removed += hostcheck.cleanup_peer_programs()  # what --prepare-peer left on veth peers
        return removed, spared

    def build(self):
        """The LB with its services and backends, nothing attached. Before it, every start-up check
        (not for --ebpf): what the hosts lack is said, each with its fix, and then every refusal at
        once (InputError, exit 2); an unknown interface alone, as the others depend on it."""
        args = self.args
        own, vip_as_own = own_addresses(args.iface, [s.vip for s in self.services])
        for addr in args.self_addrs:
            version = ipaddress.ip_address(addr).version
            own[version] = addr
            vip_as_own.discard(version)
        self.sources, self.vip_as_own = own, vip_as_own
        self.choose_hook()
        if not args.ebpf:
            families = {s.vip.version for s in self.services}
            refusals = address_problems(args, families, own, vip_as_own)
            if args.hook == "xdp":
                refusals += filter(None, [forwarding_problem(args.iface, families)])
            elif args.mode == "dsr" and not refusals:  # an own IPv4 address first (address_problems)
                vips = [s.vip for s in self.services]
                backends = [b.addr for b in self.weights]
                refusals += filter(None, [arp_source_problem(args.iface, vips, backends, own[4])])
            for finding in host_findings(args):
                warn(str(finding))
            if refusals:
                raise InputError("\n".join(refusals))
        kind = XdpLoadBalancer if args.hook == "xdp" else TcLoadBalancer
        self.lb = kind(
            self4=own[4],
            self6=own[6],
            mode=args.mode,
            timeouts=self.timeouts,
            max_services=args.max_services,
            max_backends=args.max_backends,
            max_sessions=args.max_sessions,
            max_half_open=args.max_half_open,
        )
        # it runs for days: BCC and its compiler (60-160 MB resident) only in a child that loads it
        self.lb.compile_in = "child"
        for svc in self.services:
            self.lb.add_service(svc)
        self.health = None  # the health checks run from start() on; until then every backend is up
        self.apply()
        return self.lb

    def choose_hook(self):
        """args.hook made tc or xdp, args.hook_why why (the start line says both)."""
        args = self.args
        if args.hook != "auto":
            args.hook_why = f"--hook {args.hook}"
        elif given := [o for o, v in (("--xdp-mode", args.xdp_mode), ("--prepare-peer", args.prepare_peer)) if v]:
            args.hook, args.hook_why = "xdp", f"auto: {' and '.join(given)} given"
        else:
            args.hook, why = hook_for(args.iface)
            args.hook_why = f"auto: {why}"
        if args.hook == "xdp" and args.xdp_mode is None:
            args.xdp_mode = "native"

    def apply(self):
        """Each service's backends and weights (service_weights()), a backend its health check holds
        down at 0."""
        up = self.health.healthy if self.health else {}
        for svc in self.services:
            self.lb.set_backends(
                svc, {b: (w if up.get(b, True) else 0) for b, w in service_weights(self.assigned, svc).items()}
            )

    def start(self, stack):
        args, lb = self.args, self.lb
        peers = stack.enter_context(contextlib.closing(PreparedPeers(compile_in="child")))
        lb.load_program()
        if args.fill_sessions:
            lb.fill_sessions(args.fill_sessions)
        SIGNALS.check()
        # Everything the program needs from the hosts around it is ready before it attaches, for
        # clients already sending: the peer's program (or what it sends back out is lost) and the
        # backends' MACs (or it drops a new session's packet, no-neigh: a TCP client then waits a
        # second for its SYN's retransmission, a UDP client loses its datagram).
        if args.prepare_peer and args.xdp_mode == "native" and (peer := peers.prepare(args.iface)):
            warn(f"attached a pass program to {args.iface}'s veth peer {peer.ifname} ({peer.label}) while this runs")
        for addr in hostcheck.resolve_neighbours(self.to_resolve(), self.sources):
            warn(
                f"no neighbour entry for backend {addr} yet: its first packets are dropped (no-neigh) "
                "until the kernel resolves it"
            )
        self.no_neigh, self.active = 0, None  # active: live sessions per backend (sweep_step)
        try:
            lb.attach(args.iface, args.xdp_mode, kept="replace" if args.replace else "adopt")
        except KeptDatapathMismatch as e:
            raise KeptDatapathMismatch(
                f"{e}; --replace puts this one in its place (its established sessions are lost), "
                f"{self.name} --cleanup removes it; nothing changed"
            ) from None
        if lb.replaced:
            warn(
                f"replaced the load balancer left serving at {args.iface}'s {lb.replaced.upper()} hook "
                "(--replace): its sessions are lost"
            )
        if args.keep:  # from here on: whatever ends the run, the datapath stays
            lb.keep_attached = True
            peers.keep = True
            stack.callback(self.say_kept)
        else:
            peers.take_over_kept(args.iface)  # a kept run's peer program is this run's to remove
        if args.health_check == "tcp":
            self.health = HealthChecker(self.weights, args.check_interval, args.rise, args.fall, sources=self.sources)
            stack.callback(self.health.stop)
            self.health.start()

    @property
    def at_xdp(self):
        return self.args.hook == "xdp"

    def to_resolve(self) -> list:
        """The backends whose MACs this process has the kernel resolve before it attaches: at
        XDP every one (bpf_fib_lookup() only reads the neighbour table); at TC none, as
        bpf_redirect_neigh() resolves a next hop itself (see arp_source_problem())."""
        return [b.addr for b in self.weights] if self.at_xdp else []

    def say_kept(self):
        n = self.lb.session_count()
        iface = self.args.iface
        if self.args.json:
            self.live.emit({"event": "kept", "iface": iface, "sessions": n})
        else:
            self.live.emit(
                f"lb: left the load balancer serving on {iface} ({n} sessions): the next "
                f"{self.name} on {iface} takes it over, {self.name} --cleanup removes it"
            )

    def table(self):
        self.live = Printer(self.args.json, self.args.mode)
        return self.live

    def header(self):
        taken_over = self.lb.session_count() if self.lb.adopted else None
        self.live.header(self.lb, self.args.iface, self.args, self.sources, self.vip_as_own, taken_over)

    def sample(self, final=False):
        if final or self.active is None:  # the summary's, and the first line's: a whole pass now
            self.active = self.lb.sweep_pass()
        self.live.sample(self.lb, self.weights, self.health.healthy if self.health else {}, self.active, final=final)

    def tick(self):
        args, lb, health = self.args, self.lb, self.health
        if self.at_xdp and (not lb.xdp_attachments or xdp.removed_from_outside(lb.xdp_attachments)):
            raise BpfError(
                f"stopped: the program was removed from {args.iface} from outside "
                "(python -m lab lb --cleanup --all, ip link set ... xdp off)"
            )
        if not self.at_xdp and (not lb.tc_filters or any(tc.find(f) is None for f in lb.tc_filters)):
            raise BpfError(
                f"stopped: the program was removed from {args.iface} from outside "
                "(python -m lab lb --cleanup --all, tc filter del ...)"
            )
        if args.backends_file:
            m = Path(args.backends_file).stat().st_mtime_ns
            if m != self.mtime:  # read again only when it changed; the --backend ones as parsed
                self.mtime = m
                try:
                    self.assign(weights_of(self.given, parse_backends(backend_lines(args.backends_file))))
                except UsageError as e:
                    warn(f"kept the backends as they were: {e}")
                else:
                    if health:
                        health.set_backends(self.weights)
                    self.apply()
                    warn(f"backends now: {', '.join(f'{b}@{w}' for b, w in self.weights.items())}")
        if health and health.changed.is_set():
            health.changed.clear()
            self.apply()
            down = [str(b) for b, ok in health.healthy.items() if not ok]
            warn(f"unhealthy: {', '.join(down)}" if down else "every backend is healthy")
        # a part of the session tables a tick (at most SWEEP_BUDGET entries): the idle ones
        # expired, the live ones counted, whatever the table holds
        active = lb.sweep_step()
        if active is not None:
            self.active = active
        dropped = lb.counters().get("dropped_no_neigh", 0)
        if dropped > self.no_neigh:  # an entry expired or was flushed: ask again, without waiting
            self.no_neigh = dropped
            hostcheck.resolve_neighbours([b.addr for b in self.weights], self.sources, seconds=0)


COMMAND = LbCommand()
