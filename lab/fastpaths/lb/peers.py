"""Load balancers on the LB testbed (lab.fastpaths.lb.testbed.lb_testbed), all driven the
same way (lab.peer.Peer), so that `python -m lab bench lb` swaps them by name:

    >>> with BALANCERS["nginx-l4"](tb) as lb:          # doctest: +SKIP
    ...     addr, port = lb.target()                  # where clients connect
    ...     lb.pids(), lb.maps_bytes()                # what its CPU and memory are read from

    direct      no balancer: the clients talk to the backends themselves, the load split
                evenly between them (the ceiling: the same backends with no LB)
    xdp         ebpf.XdpLoadBalancer through its command line (python -m lab lb --prepare-peer),
                NAT mode, native XDP
    xdp-generic the same in XDP's generic mode: after the skb is built, so beside `xdp` it
                separates what an skb costs from where the hook is
    tc          ebpf.TcLoadBalancer through its command line (python -m lab lb --hook tc):
                the same sessions at TC ingress, nothing on the veth peer
    tc-dsr      the same in DSR mode: the backends hold the VIP and answer the clients
                themselves, so replies skip the LB (nftables has no such mode)
    nginx-l4    nginx stream proxy (one worker), as in the articles
    nginx-l7    nginx http proxy (one worker) with upstream keepalive, as in the articles
    haproxy-l4  HAProxy mode tcp (one thread)
    haproxy-l7  HAProxy mode http (one thread), connections to backends reused
    nft-lb      nftables DNAT to a backend picked by `numgen random`, the shape of
                kube-proxy's nftables mode, with masquerade so replies come back

Every one of them runs in the LB's namespace, listens on (or intercepts) the
VIP and port, and spreads connections over the same backends with equal
weights. One worker or thread each: the XDP program runs on one receive queue
(one NAPI thread), and the articles' nginx is measured the same way.
"""

import json
import sys

from ebpf import endpoints
from ebpf.holders import maps_memlock
from lab import netns, nft
from lab.daemons import Daemon
from lab.daemons.haproxy import HaproxyProxy
from lab.daemons.nginx import NginxProxy
from lab.peer import Peer


class Balancer(Peer):
    name = "direct"
    kind = "lb"

    def __init__(self, tb, backends=None, services=1):
        super().__init__(None)
        self.tb = tb
        self.ns = tb.ns(tb.lb)
        self.backends = backends or [(tb.backend4(i), tb.backend_port) for i in range(len(tb.backends))]
        # bench lb --services: the service measured and services-1 more on the VIP's other ports,
        # each with the same backends, that no client addresses (for the LBs that hold services)
        self.services = services

    def decoy_ports(self) -> list:
        return [DECOY_PORT + k for k in range(1, self.services)]

    def target(self):
        """(address, port) the clients connect to."""
        return self.tb.vip4, self.tb.service_port

    def targets(self) -> list:
        """Every (address, port) the load goes to at once: the VIP, or for
        `direct` each backend (the ceiling is every backend without an LB)."""
        return [self.target()]


class Direct(Balancer):
    """No balancer: the clients address the backends themselves."""

    name = "direct"
    colour = "#555555"

    def target(self):
        return self.backends[0]

    def targets(self):
        return list(self.backends)


class ProxyBalancer(Balancer):
    """A proxy daemon on the VIP: started by attach(), stopped by detach()."""

    proxy, layer = NginxProxy, 4

    def attach(self):
        vip, port = self.target()
        self.daemon = self.proxy(self.ns, self.name, vip, port, self.backends, self.layer).start()
        self.attached = True

    def pids(self):
        return self.daemon.pids() if self.attached else []

    def detach(self):
        self.daemon.close()
        self.attached = False


class NginxL4(ProxyBalancer):
    name, proxy, layer = "nginx-l4", NginxProxy, 4
    colour = "#009E73"


class NginxL7(ProxyBalancer):
    name, proxy, layer = "nginx-l7", NginxProxy, 7
    colour = "#D55E00"


class HaproxyL4(ProxyBalancer):
    name, proxy, layer = "haproxy-l4", HaproxyProxy, 4
    colour = "#E69F00"


class HaproxyL7(ProxyBalancer):
    name, proxy, layer = "haproxy-l7", HaproxyProxy, 7
    colour = "#CC79A7"


DECOY_PORT = 20000  # + k: the VIP's port of the k-th service no client addresses (bench lb --services)
SERVES_SERVICES = ("xdp", "xdp-generic", "tc", "tc-dsr", "nft-lb")  # the peers that take --services


class NftLb(Balancer):
    """table ip vtl_lb {
        chain pre  { type nat hook prerouting priority dstnat;
                     ip daddr VIP tcp dport 80 counter numgen random mod N vmap { 0 : goto be0, ... } }
        chain be0  { meta l4proto tcp counter dnat to BACKEND0:8080 } ...
        chain post { type nat hook postrouting priority srcnat; ct status dnat counter masquerade } }
    conntrack keeps each connection on its backend and translates the replies.
    The LB forwards out of the interface the packet came in on, so it would
    send the clients ICMP redirects: they are turned off while it runs."""

    name = "nft-lb"
    colour = "#56B4E9"
    TABLE = "vtl_lb"
    SYSCTLS = ("net.ipv4.conf.all.send_redirects", "net.ipv4.conf.eth0.send_redirects")

    def attach(self):
        vip, port = self.target()
        t = {"family": "ip", "table": self.TABLE}
        n = len(self.backends)
        cmds = [{"add": {"table": {"family": "ip", "name": self.TABLE}}}]
        for i, (addr, bport) in enumerate(self.backends):
            cmds += [
                {"add": {"chain": {**t, "name": f"be{i}"}}},
                {
                    "add": {
                        "rule": {
                            **t,
                            "chain": f"be{i}",
                            "expr": [
                                # (a port mapping needs a transport-protocol match in its own chain)
                                {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}},
                                {"counter": None},
                                {"dnat": {"family": "ip", "addr": addr, "port": bport}},
                            ],
                        }
                    }
                },
            ]
        pick = {
            "vmap": {
                "key": {"numgen": {"mode": "random", "mod": n}},
                "data": {"set": [[i, {"goto": {"target": f"be{i}"}}] for i in range(n)]},
            }
        }
        cmds += [
            {
                "add": {
                    "chain": {**t, "name": "pre", "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}
                }
            },
            {
                "add": {
                    "rule": {
                        **t,
                        "chain": "pre",
                        "expr": [
                            {
                                "match": {
                                    "op": "==",
                                    "left": {"payload": {"protocol": "ip", "field": "daddr"}},
                                    "right": vip,
                                }
                            },
                            {
                                "match": {
                                    "op": "==",
                                    "left": {"payload": {"protocol": "tcp", "field": "dport"}},
                                    "right": port,
                                }
                            },
                            pick,
                        ],
                    }
                }
            },
            {
                "add": {
                    "chain": {
                        **t,
                        "name": "post",
                        "type": "nat",
                        "hook": "postrouting",
                        "prio": 100,
                        "policy": "accept",
                    }
                }
            },
            {
                "add": {
                    "rule": {
                        **t,
                        "chain": "post",
                        "expr": [
                            {"match": {"op": "in", "left": {"ct": {"key": "status"}}, "right": "dnat"}},
                            {"counter": None},
                            {"masquerade": None},
                        ],
                    }
                }
            },
        ]
        if self.services > 1:  # every service in one map, as a user would write many (services_text)
            cmds = [c for c in cmds if c["add"].get("rule", {}).get("chain") != "pre"]
        self.saved = {k: netns.read_sysctl(self.ns, k) for k in self.SYSCTLS}
        try:
            for k in self.SYSCTLS:
                netns.sysctl(self.ns, k, 0)
            nft.flush_conntrack(self.ns)
            nft.run(self.ns, cmds)
            if self.services > 1:
                nft.run_text(self.ns, self.services_text(vip, port, n))
        except BaseException:
            self.detach()  # restores the sysctls read above
            raise
        self.attached = True

    def services_text(self, vip, port, n) -> str:
        """The services in one verdict map: VIP . port -> a chain that picks a backend."""
        picks = ", ".join(f"{i} : goto be{i}" for i in range(n))
        ports = [port, *self.decoy_ports()]
        lines = [f"table ip {self.TABLE} {{"]
        lines += [f"  chain svc{k} {{ numgen random mod {n} vmap {{ {picks} }} ; }}" for k in range(len(ports))]
        lines.append("  map services { type ipv4_addr . inet_service : verdict ; }")
        lines.append("}")
        elements = ", ".join(f"{vip} . {p} : goto svc{k}" for k, p in enumerate(ports))
        lines.append(f"add element ip {self.TABLE} services {{ {elements} }}")
        lines.append(f"add rule ip {self.TABLE} pre counter ip daddr . tcp dport vmap @services")
        return "\n".join(lines) + "\n"

    def counters(self):
        """new connections sent to each backend (the DNAT chains' counters)."""
        counts = nft.counters(self.ns, "ip", self.TABLE)
        return {f"be{i}": counts[i][0] for i in range(len(self.backends))}

    def detach(self):
        nft.delete_table(self.ns, "ip", self.TABLE)
        if netns.exists(self.ns):
            nft.flush_conntrack(self.ns)
            for k, v in getattr(self, "saved", {}).items():
                netns.sysctl(self.ns, k, v)
        self.attached = False


class LbCommand(Daemon):
    """`python -m lab lb` in the LB namespace, its --json lines in the run
    directory; ready once it says it attached."""

    suffix = ".xdp-lb"
    what = "python -m lab lb"

    def __init__(self, ns, iface, service, backends, extra=()):
        super().__init__(ns, iface, 0)
        self.output = "events.jsonl"
        self.args = ["--iface", iface, "--service", service, "--json", "--interval", "1", *extra]
        for a, p in backends:
            self.args += ["--backend", endpoints.text(a, p)]

    def argv(self):
        return [sys.executable, "-m", "lab", "lb", *self.args]

    def where(self):
        return f"in {self.ns}"

    def ready(self):
        try:
            return '"event": "attached"' in (self.dir / self.output).read_text()
        except FileNotFoundError:
            return False

    def events(self) -> list[str]:
        try:
            return (self.dir / self.output).read_text().splitlines()
        except FileNotFoundError:
            return []


class XdpBalancer(Balancer):
    """The XDP load balancer as its users run it: its command line, NAT mode,
    native XDP on the LB's interface, TCP health checks every second, and
    --prepare-peer (the pass program XDP_TX needs on the veth peer)."""

    name = "xdp"
    colour = "#0072B2"
    # --prepare-peer: the pass program on the switch's port that XDP_TX needs, while it runs
    options = ("--prepare-peer",)

    def attach(self):
        vip, port = self.target()
        more = []
        if self.services > 1:  # the unnamed backends go to every service: each decoy has them too
            more = ["--max-services", str(max(64, self.services))]
            more += [a for p in self.decoy_ports() for a in ("--service", f"tcp:{vip}:{p}")]
        self.cli = LbCommand(self.ns, "eth0", f"tcp:{vip}:{port}", self.backends, (*self.options, *more))
        self.cli.start(timeout=120)
        self.attached = True

    def pids(self):
        return self.cli.pids() if self.attached else []

    def maps_bytes(self):
        """The locked memory of the BPF maps its process holds."""
        return maps_memlock(self.pids())

    def counters(self):
        lines = [ln for ln in self.cli.events() if ln.startswith("{")] if self.attached else []
        last = json.loads(lines[-1]) if lines else {}
        return {k: v for k, v in last.items() if isinstance(v, int)}

    def detach(self):
        self.cli.close()
        self.attached = False


class XdpGenericBalancer(XdpBalancer):
    """The XDP load balancer in generic mode: the program runs on the skb the kernel has
    built, and XDP_TX sends that skb out (no peer program needed)."""

    name = "xdp-generic"
    colour = "#7FB2D8"
    options = ("--hook", "xdp", "--xdp-mode", "generic")


class TcBalancer(XdpBalancer):
    """The load balancer at TC ingress, as its users run it on a veth (--hook auto picks TC
    there; given here so that the peer says what it is): no program on the veth peer. Its
    packet work runs in the LB interface's receive softirq (or NAPI thread), where nft-lb's
    does too; its process only reads counters, sweeps and checks health."""

    name = "tc"
    colour = "#332288"
    options = ("--hook", "tc")


class TcDsrBalancer(TcBalancer):
    """The load balancer at TC in DSR mode: requests pass the LB, replies go from the
    backend (which holds the VIP on its loopback) straight to the client."""

    name = "tc-dsr"
    colour = "#88CCEE"
    options = ("--hook", "tc", "--mode", "dsr")


# in the order figures show them
PEERS = {
    cls.name: cls
    for cls in (
        Direct,
        XdpBalancer,
        XdpGenericBalancer,
        TcBalancer,
        TcDsrBalancer,
        NftLb,
        NginxL4,
        HaproxyL4,
        NginxL7,
        HaproxyL7,
    )
}
BALANCERS = PEERS
