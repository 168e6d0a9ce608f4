"""python -m lab pods: connect this node's pods as Cilium does (ebpf.TcPods), on a node
built as a CNI builds one. What is its own is below; the lifecycle every tool shares
(lab.lifecycle) does the rest: it works in the namespace it starts in, every exit
detaches what it attached, and the same exit statuses.

It finds what a CNI leaves on a node:
- pods: the routes to single addresses (/32, /128) through veths, as Cilium and Calico
  route to their pods; the pod's MAC is its end of the veth;
- other nodes' pods (native routing): the routes via the uplink, the default excepted;
  with --tunnel vxlan, --peer NODE_ADDR=POD_PREFIX names them and the node that holds
  each, and the command makes the collect-metadata VXLAN device (pods_vxlan) itself.
Pods that come and go (a veth and its route added or removed) are attached or dropped
within a second (a watch every 0.25 s): once dropped, no frame goes to the veth (until
then, the kernel drops what is sent to a veth that is gone).

Services (--services FILE, TOML; read again within a second of each change, once it
has stood still for a quarter of a second):

    [[service]]
    address = "198.18.200.10"        # the service's address (either family)
    port = 80
    protocol = "tcp"                 # tcp (default) or udp
    backends = ["198.18.100.1:8080", "198.18.101.1:8080"]   # [V6]:PORT for IPv6

With --cgroup DIR (a cgroup v2 directory, as Cilium attaches to its root), a socket of
a process in it gets a backend at connect() or sendmsg(), once; every other pod's
packets to a service are translated on their way out of its veth.
"""

import contextlib
import ipaddress
import os
import socket
import threading
import tomllib

from pyroute2.netlink.exceptions import NetlinkError

from ebpf import BpfError, InputError, NoSuchInterface, cgroup, netdev, tc
from ebpf.pods.tc_pods import BACKENDS_MAX, ENTRIES_MAX, PROTOS, SVC_MAX, TcPods, check_services, parse_endpoint
from lab import hostcheck, runs
from lab.console import CounterTable, UsageError, require, warn
from lab.lifecycle import Command

OWNER = "pods"  # its TC filters are named pods:<function>
TUNNEL_DEV = "pods_vxlan"
VXLAN_PORT = 4789
WATCH_SECONDS = 0.25
EXAMPLES = """\
examples:
  python -m lab pods --uplink eth0                  # native routing: other nodes' pods by their routes
  python -m lab pods --uplink eth0 --tunnel vxlan --peer 198.18.99.2=198.18.101.0/24 \\
                     --peer 198.18.99.2=2001:2:101::/64
  ip netns exec node0 python -m lab pods --uplink eth0 --json --duration 10
  python -m lab pods --uplink eth0 --services services.toml --cgroup /sys/fs/cgroup/pods
  python -m lab pods --cleanup                      # what a killed run left

exit status: 0 stopped (--duration, Ctrl-C, SIGTERM, SIGHUP, output closed);
  1 failed (BCC missing, compiler, verifier or hook refused, a filter removed from outside);
  2 cannot run as given (bad option, unknown interface, not root, a host that cannot carry it)
"""
RATES = ("seen", "redirect")
TOTALS = ("seen", "local_pod", "remote_pod", "tunneled", "unmatched", "pass", "drop")
SERVICE_TOTALS = ("to_backend", "to_client", "connect", "sendmsg", "recvmsg", "refused")
SERVICE_KEYS = {"address", "port", "protocol", "backends", "name"}


def read_services(path) -> list[tuple]:
    """[(address, port, protocol, [backend, ...])] from a services file; any fault is
    one line that names the file (and the service)."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise InputError(f"services file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"services file {path}: {e}") from None
    unknown = set(doc) - {"service"}
    if unknown:
        raise InputError(f"services file {path}: unknown table {sorted(unknown)[0]!r} (want [[service]] entries)")
    out, seen = [], set()
    for i, s in enumerate(doc.get("service", []), 1):
        where = f"services file {path}, service {i}"
        if not isinstance(s, dict):
            raise InputError(f"{where}: want a [[service]] table")
        if set(s) - SERVICE_KEYS:
            raise InputError(
                f"{where}: unknown key {sorted(set(s) - SERVICE_KEYS)[0]!r} (known: {', '.join(sorted(SERVICE_KEYS))})"
            )
        if "address" not in s or "port" not in s:
            raise InputError(f"{where}: needs address and port")
        proto = s.get("protocol", "tcp")
        if proto not in PROTOS:
            raise InputError(f"{where}: protocol {proto!r} (tcp or udp)")
        backends = s.get("backends", [])
        if not isinstance(backends, list):
            raise InputError(f'{where}: backends is a list of "ADDR:PORT"')
        try:
            addr, port = parse_endpoint((s["address"], s["port"]), "service")
            for b in backends:
                parse_endpoint(b)
        except InputError as e:
            raise InputError(f"{where}: {e}") from None
        if (addr, port, proto) in seen:
            raise InputError(f"{where}: {addr} port {port}/{proto} is given twice")
        seen.add((addr, port, proto))
        out.append((str(addr), port, proto, [str(b) for b in backends]))
    return out


def parse_peer(text):
    """NODE_ADDR=POD_PREFIX: (node address, prefix)."""
    node, sep, prefix = text.partition("=")
    try:
        if not sep:
            raise ValueError("no =")
        return ipaddress.ip_address(node.strip()), ipaddress.ip_network(prefix.strip(), strict=True)
    except ValueError as e:
        raise UsageError(f"bad --peer {text!r}: want NODE_ADDR=POD_PREFIX ({e})") from None


def _sysctl(path):
    try:
        with open(f"/proc/sys/{path}") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def bare_veths(uplink, pods) -> list[str]:
    """Veths whose peer is in another namespace but that no single-address route goes
    through: a pod the node does not route to (so not taken as one)."""
    out = []
    with netdev.ipr() as ip:
        for d in netdev.devices(ip).values():
            if d.kind == "veth" and d.name != uplink and d.name not in pods:
                link = ip.get_links(d.index)[0]
                if link.get_attr("IFLA_LINK_NETNSID") is not None:
                    out.append(d.name)
    return sorted(out)


def gateway_problem(lxc) -> str | None:
    """A pod whose default route goes via an address its host-side veth neither has
    nor answers for (proxy ARP) cannot reach its gateway: nothing it sends leaves it."""
    peer = hostcheck.veth_peer(lxc)
    if peer is None or peer.netns is None:
        return None
    with netdev.ipr() as ip:
        mine = {ipaddress.ip_address(a.get_attr("IFA_ADDRESS")) for a in ip.get_addr(index=netdev.ifindex_of(ip, lxc))}
    proxy = _sysctl(f"net/ipv4/conf/{lxc}/proxy_arp") == "1"
    with netdev.ipr(peer.netns) as ip:
        for family in (socket.AF_INET, socket.AF_INET6):
            for r in ip.get_routes(family=family, table=254):
                gw = r.get_attr("RTA_GATEWAY")
                if r.get_attr("RTA_DST") is not None or gw is None:
                    continue
                g = ipaddress.ip_address(gw)
                if g in mine or (g.version == 4 and proxy):
                    continue
                return (
                    f"pod behind {lxc}: its default route goes via {g}, which {lxc} neither has nor answers "
                    f"for, so the pod cannot reach its gateway; fix: ip addr add {g}/{g.max_prefixlen} dev {lxc}"
                    + (" nodad" if g.version == 6 else "")
                    + " (Cilium gives every pod's veth the node's router address)"
                )
    return None


def find_pods(uplink) -> tuple[dict, list]:
    """({host-side veth: (its ifindex, [pod addresses])}, [other nodes' pod prefixes via
    the uplink]). The ifindex tells a veth made again under the same name (a pod
    restarted) from the one before it."""
    pods, remote = {}, []
    with netdev.ipr() as ip:
        names = {d.index: d for d in netdev.devices(ip).values()}
        up = netdev.ifindex_of(ip, uplink)
        for family, full in ((socket.AF_INET, 32), (socket.AF_INET6, 128)):
            for r in ip.get_routes(family=family, table=254):
                dst, oif = r.get_attr("RTA_DST"), r.get_attr("RTA_OIF")
                if dst is None:  # a default route: outside the cluster
                    continue
                dev = names.get(oif)
                # the uplink may be a veth too (nodes joined by one): a host route through it is no pod
                pod_route = r["dst_len"] == full and r.get_attr("RTA_GATEWAY") is None and oif != up
                if pod_route and dev and dev.kind == "veth":
                    pods.setdefault(dev.name, (oif, []))[1].append(ipaddress.ip_address(dst))
                elif oif == up and r.get_attr("RTA_GATEWAY") is not None:
                    remote.append(ipaddress.ip_network(f"{dst}/{r['dst_len']}"))
    return pods, remote


def pod_mac(ifname) -> str:
    """The MAC of the pod's end of its veth."""
    peer = hostcheck.veth_peer(ifname)
    if peer is None or peer.netns is None:
        raise InputError(f"{ifname}: its peer's namespace cannot be entered from here, so its pod's MAC is not known")
    with netdev.ipr(peer.netns) as ip:
        return ip.get_links(peer.ifindex)[0].get_attr("IFLA_ADDRESS")


def mtu_of(ifname) -> int:
    with netdev.ipr() as ip:
        return ip.get_links(netdev.ifindex_of(ip, ifname))[0].get_attr("IFLA_MTU")


def tunnel_mtu_problem(uplink, pods, v6_underlay=False) -> str | None:
    """A pod whose MTU leaves no room for VXLAN's headers on the uplink (50 bytes over
    IPv4, 70 over IPv6) sends frames the tunnel cannot carry whole (a CNI in tunnel mode
    gives its pods that much less). The program does not check it per frame."""
    overhead = 70 if v6_underlay else 50
    room = mtu_of(uplink) - overhead
    big = [p for p in pods if mtu_of(p) > room]
    if not big:
        return None
    return (
        f"the pods behind {', '.join(big)} have an MTU above {room}, what {uplink} carries inside VXLAN: "
        f"set it in each pod (ip link set dev eth0 mtu {room}) or raise {uplink}'s by {overhead}"
    )


def host_problems(uplink, pods) -> list[str]:
    """What this node lacks to carry its pods this way, each with the line that fixes it."""
    out = []
    off = [
        f"net.ipv{v}.conf.{i}.forwarding"
        for i in [uplink, *pods]
        for v in (4, 6)
        if _sysctl(f"net/ipv{v}/conf/{i}/forwarding") == "0"
    ]
    if off:
        out.append(
            f"forwarding is off ({', '.join(off[:4])}{' ...' if len(off) > 4 else ''}): the program finds other "
            "nodes' pods with bpf_fib_lookup(), which needs it on; fix: sysctl -w "
            "net.ipv4.conf.all.forwarding=1 net.ipv6.conf.all.forwarding=1"
        )
    strict = [i for i in pods if _sysctl(f"net/ipv4/conf/{i}/rp_filter") == "1"]
    if strict and _sysctl("net/ipv4/conf/all/rp_filter") != "2":
        out.append(
            f"strict reverse-path filtering on {', '.join(strict)}: what a pod sends to the node itself "
            "is checked against routes the datapath does not use; fix: sysctl -w net.ipv4.conf.all.rp_filter=2"
        )
    return out


class PodsCommand(Command):
    name, short = "python -m lab pods", "pods"
    description = (
        "Connect this node's pods as Cilium does: into a pod here through its veth's peer "
        "(bpf_redirect_peer), to another node's pods by the FIB or a VXLAN tunnel, the rest to the kernel."
    )
    examples = EXAMPLES
    cleans = "pod datapath filters, its cgroup programs, and the VXLAN device a tunnel run made"

    def options(self, p):
        p.add_argument("--uplink", metavar="IF", help="the node's interface towards the other nodes")
        p.add_argument("--tunnel", choices=("vxlan",), help="reach other nodes' pods through a VXLAN tunnel")
        p.add_argument(
            "--peer",
            metavar="NODE=PREFIX",
            action="append",
            default=[],
            help="tunnel mode: another node's address and its pods' prefix (repeatable)",
        )
        p.add_argument("--vni", type=int, default=1, help="the tunnel's VXLAN network identifier (default %(default)s)")
        p.add_argument(
            "--services",
            metavar="FILE",
            help="services and their backends (TOML, [[service]] entries; read again when it changes)",
        )
        p.add_argument(
            "--cgroup",
            metavar="DIR",
            help="a cgroup v2 directory whose processes' sockets get a service's backend at connect()/sendmsg() "
            "(others are translated per packet)",
        )

        sizes = p.add_argument_group(
            "service map sizes",
            "fixed when the program is made; a services file that would pass one is refused whole, "
            "the services staying as they were",
        )
        sizes.add_argument(
            "--max-services",
            type=int,
            default=SVC_MAX,
            metavar="N",
            help="services (default %(default)s: 1.5 MiB of the kernel's memory)",
        )
        sizes.add_argument(
            "--max-entries",
            type=int,
            default=ENTRIES_MAX,
            metavar="N",
            help="service-backend entries, a service with 3 backends taking 3: Cilium's default "
            "(default %(default)s: 5 MiB)",
        )
        sizes.add_argument(
            "--max-backends",
            type=int,
            default=BACKENDS_MAX,
            metavar="N",
            help="distinct backends of all services (default %(default)s: 1.5 MiB)",
        )

    def parse(self, args):
        require(args, uplink="--uplink is required (the interface towards the other nodes)")
        for opt, n in (("--max-services", args.max_services), ("--max-entries", args.max_entries)):
            if not 1 <= n <= 1 << 24:
                raise UsageError(f"{opt} must be 1 to {1 << 24}")
        if not 1 <= args.max_backends <= 1 << 24:
            raise UsageError(f"--max-backends must be 1 to {1 << 24}")
        self.peers = [parse_peer(t) for t in args.peer]
        if args.tunnel and not self.peers:
            raise UsageError("--tunnel vxlan needs at least one --peer NODE_ADDR=POD_PREFIX")
        if self.peers and not args.tunnel:
            raise UsageError("--peer is for tunnel mode (--tunnel vxlan); native routing reads the routes")
        if not 0 < args.vni < 2**24:
            raise UsageError(f"--vni {args.vni} is outside 1..16777215")
        if args.cgroup and not args.services:
            raise UsageError("--cgroup is where services are translated at connect(): it needs --services FILE")
        self.services = read_services(args.services) if args.services else []
        try:
            check_services(self.services, args.max_services, args.max_entries, args.max_backends)
        except InputError as e:
            raise UsageError(f"services file {args.services}: {e}") from None

    def cleanup(self, all_runs=False):
        removed, spared = tc.cleanup(OWNER, spare_live=not all_runs)
        notes = runs.noted_cgroups()  # this instance's cgroups, never another's
        gone, live = cgroup.cleanup("pods_", spare_live=not all_runs, within=list(notes))
        removed += gone
        for path, note in notes.items():  # nothing of ours left there: forgotten
            if not cgroup.find("pods_", within=[path]):
                note.unlink(missing_ok=True)
        if not spared:  # no live run here: a VXLAN device of ours that one left (external, by name)
            with netdev.ipr() as ip, contextlib.suppress(InputError):
                idx = netdev.ifindex_of(ip, TUNNEL_DEV)
                dev = netdev.device(ip, idx)
                if dev.kind == "vxlan" and dev.data is not None and dev.data.get_attr("IFLA_VXLAN_COLLECT_METADATA"):
                    ip.link("del", index=idx)
                    removed.append(f"the VXLAN device {TUNNEL_DEV}")
        return removed, [
            f"filter {f.entry.name} on {f.where} (pid {', '.join(map(str, f.pids))})" for f in spared
        ] + live

    def build(self):
        a = self.args
        with netdev.ipr() as ip:
            netdev.ifindex_of(ip, a.uplink)  # an unknown interface first, in one line
        # one datapath per node, as one CNI: a second would sit behind the first's filters
        # and see nothing, or take over pods the first carries
        live = [f for f in tc.filters_of(OWNER) if f.live and f.entry.name.endswith("pods_from_node")]
        if live and not a.ebpf:
            pids = sorted({p for f in live for p in f.pids})
            raise InputError(
                f"this node's pods are carried already (python -m lab pods, pid {', '.join(map(str, pids))}, "
                f"on {', '.join(sorted({f.ifname for f in live}))}): one datapath per node; stop that one first"
            )
        pods, remote = find_pods(a.uplink)
        self.remote = remote
        if not a.ebpf:
            problems = host_problems(a.uplink, pods)
            if not pods:
                warn("no pods on this node yet (no /32 or /128 route through a veth): they are taken as they come")
            if not a.tunnel and not remote:
                warn(f"no route via {a.uplink} to other nodes' pods: only pods on this node are connected")
            v6 = any(node.version == 6 for node, _ in self.peers)
            if a.tunnel and (mtu := tunnel_mtu_problem(a.uplink, pods, v6)):
                warn(mtu)
            for v in bare_veths(a.uplink, pods):
                warn(
                    f"{v} leads to another namespace but no /32 or /128 route goes through it: not taken as a pod; "
                    f"fix: ip route add POD_ADDRESS/32 dev {v}"
                )
            if a.cgroup:
                cgroup.check_dir(a.cgroup)
            if problems:
                raise InputError("\n".join(problems))
        # built here, the tunnel device made in start(): --ebpf prints the C text without it
        self.prog = TcPods(netns=None, **self.sizes())
        self.prog.compile_in = "child"  # it runs for as long as the node: no compiler kept
        self.found = pods
        return self.prog

    def start(self, stack):
        a = self.args
        if a.tunnel:
            self._make_tunnel(stack)
            self.prog = TcPods(mode="tunnel", tunnel=TUNNEL_DEV, vni=a.vni, **self.sizes())
            self.prog.compile_in = "child"
            stack.callback(self.prog.close)
            for node, prefix in self.peers:
                self.prog.add_remote(prefix, node)
        else:
            for prefix in self.remote:
                self.prog.add_remote(prefix)
        for svc in self.services:
            self.prog.add_service(*svc)
        self.prog.load_program()
        if a.cgroup:
            runs.note_cgroup(a.cgroup)  # (cgroups are the machine's: where this instance's cleanup looks)
            self.prog.attach_services(a.cgroup)
        self.services_stamp = self.services_pending = self._services_stamp()
        self.lock = threading.Lock()
        self.attached = {}  # host-side veth -> its TC filter
        self.started = False  # the pods found at start are in the header, not said one by one
        self.refresh(self.found)
        self.started = True
        self.prog.attach_node(a.uplink)
        if a.tunnel:
            self.prog.attach_node(TUNNEL_DEV)
        self.stop = threading.Event()
        self.watcher = threading.Thread(target=self._watch, name="pods-watch", daemon=True)
        self.watcher.start()
        stack.callback(self._stop_watch)

    def _make_tunnel(self, stack):
        with netdev.ipr() as ip:
            try:
                netdev.ifindex_of(ip, TUNNEL_DEV)
            except InputError:
                pass
            else:
                raise InputError(
                    f"{TUNNEL_DEV} exists already: another run's (python -m lab pods --cleanup removes a killed one's)"
                )
            try:
                ip.link("add", ifname=TUNNEL_DEV, kind="vxlan", vxlan_collect_metadata=1, vxlan_port=VXLAN_PORT)
            except NetlinkError as e:
                raise BpfError(f"making the VXLAN device {TUNNEL_DEV}: {netdev.netlink_reason(e)}") from None
            stack.callback(self._remove_tunnel)
            ip.link("set", index=netdev.ifindex_of(ip, TUNNEL_DEV), state="up")

    def _remove_tunnel(self):
        with netdev.ipr() as ip, contextlib.suppress(Exception):
            ip.link("del", index=netdev.ifindex_of(ip, TUNNEL_DEV))

    def _stop_watch(self):
        self.stop.set()
        self.watcher.join()

    def _watch(self):
        while not self.stop.wait(WATCH_SECONDS):
            try:
                self.refresh(find_pods(self.args.uplink)[0])
                self._reload_services()
            except Exception as e:  # noqa: BLE001 -- a watch that fails says so and tries again
                warn(f"watching for pods: {e}")

    def sizes(self) -> dict:
        a = self.args
        return {"max_services": a.max_services, "max_entries": a.max_entries, "max_backends": a.max_backends}

    def _services_stamp(self):
        try:
            st = os.stat(self.args.services) if self.args.services else None
        except OSError:
            return None
        return st and (st.st_mtime_ns, st.st_size, st.st_ino)

    def _reload_services(self):
        """The services file again when it changed: the new set replaces the old at once
        (flows already translated keep their backend); a file that does not read is said
        once and the services stay as they were."""
        stamp = self._services_stamp()
        if stamp == self.services_stamp:
            return
        # read once it has stood still for a tick: a file written in place is empty
        # between its truncation and its write (`echo ... > FILE`), and an empty file
        # is a valid one with no services
        if stamp != self.services_pending:
            self.services_pending = stamp
            return
        self.services_stamp = stamp
        try:
            new = read_services(self.args.services)
            self.prog.check_services(new)  # whole, before any service changes
        except InputError as e:
            warn(f"{e}: the services stay as they were")
            return
        with self.lock:
            want = {(addr, port, proto) for addr, port, proto, _ in new}
            for addr, port, proto in list(self.prog.services):
                if (addr, port, proto) not in want:
                    self.prog.remove_service(addr, port, proto)
            # the ones that shrink first: every step then fits, as the whole did
            have = self.prog.services
            for svc in sorted(new, key=lambda s: len(s[3]) - len(have.get((str(s[0]), s[1], s[2]), []))):
                self.prog.add_service(*svc)
        warn(f"services file {self.args.services}: {len(new)} services")

    def _drop(self, lxc, said=True):
        f = self.attached.pop(lxc, None)
        self.prog.remove_pod(lxc)  # first: no frame goes its way any more
        if f is not None:
            self.prog.forget_tc(f)  # a veth that is gone took its filter with it
        if said:
            warn(f"pod behind {lxc} gone: dropped")

    def refresh(self, found):
        """Attach what is new, drop what is gone (its veth with it, or its route), and
        take a veth made again under a known name (a pod restarted) as a new pod."""
        with self.lock:
            for lxc in [x for x in self.prog.pods if x not in found]:
                self._drop(lxc)
            for lxc, (ifindex, addrs) in found.items():
                known = self.prog.pod_ifindex(lxc)
                if known is not None and known != ifindex:
                    self._drop(lxc, said=False)
                    known = None
                if known is not None and lxc in self.attached and self.prog.pods.get(lxc) == addrs:
                    continue
                was_attached = lxc in self.attached
                if known is not None and was_attached:  # a route added or removed since
                    warn(f"pod behind {lxc}: addresses now {', '.join(map(str, addrs))}")
                try:
                    if known is None and (problem := gateway_problem(lxc)):
                        warn(problem)
                    self.prog.add_pod(lxc, addrs, pod_mac(lxc))
                    if lxc not in self.attached:
                        self.attached[lxc] = self.prog.attach_pod(lxc)
                        if self.started:
                            warn(f"pod behind {lxc} ({', '.join(map(str, addrs))}): attached")
                except NoSuchInterface as e:
                    # its veth went while the scan that found it was being taken (a pod
                    # deleted: its IPv6 route first, then the veth): an attached pod is gone
                    self._drop(lxc, said=was_attached)
                    if not was_attached:
                        warn(f"pod behind {lxc}: not attached: {e}")
                except (InputError, BpfError) as e:
                    self._drop(lxc, said=False)  # nothing of it left half-known
                    warn(f"pod behind {lxc}: not attached: {e}")

    def table(self):
        totals = TOTALS + (SERVICE_TOTALS if self.args.services else ())
        self.live = CounterTable(self.args.json, RATES, totals, key="POD", rows_name="pods")
        return self.live

    def header(self):
        a = self.args
        mode = f"tunnel (VXLAN {TUNNEL_DEV}, VNI {a.vni})" if a.tunnel else "native routing"
        with self.lock:
            pods = self.prog.pods
            nsvc = len(self.prog.services)
        svc = ""
        if a.services:
            svc = f"; {nsvc} services, " + (f"at connect() in {a.cgroup} and " if a.cgroup else "") + "per packet"
        self.live.attached(
            dict(
                uplink=a.uplink,
                mode="tunnel" if a.tunnel else "native",
                pods={k: list(map(str, v)) for k, v in pods.items()},
                services=nsvc,
                cgroup=a.cgroup,
            ),
            f"pods: {len(pods)} pods on this node, other nodes' by {mode} via {a.uplink}{svc}; Ctrl-C to stop",
            names=list(pods) + ["node"],
        )

    def sample(self, final=False):
        with self.lock:  # the totals keep the rows of pods gone: they never go back
            rows, total = self.prog.counter_rows(), self.prog.counters()
            if self.args.services:  # the cgroup programs' counts, in the totals (no pod row)
                total.update({k: v for k, v in self.prog.service_counters().items() if k not in total})
        self.live.sample(total, rows, final)

    def tick(self):
        with self.lock:
            nodes = [f for f in self.prog.tc_filters if f.name.endswith("pods_from_node")]
            gone = [f.ifname for f in nodes if tc.find(f) is None]
        if gone:
            raise BpfError(f"stopped: the program was removed from {', '.join(gone)} from outside")


COMMAND = PodsCommand()
