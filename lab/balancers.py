"""Load balancers on the LB testbed (lab.testbeds.lb_testbed), all driven the
same way (lab.peers.Peer), so that `python -m lab bench lb` swaps them by name:

    >>> with BALANCERS["nginx-l4"](tb) as lb:          # doctest: +SKIP
    ...     addr, port = lb.target()                  # where clients connect
    ...     lb.pids(), lb.maps_bytes()                # what its CPU and memory are read from

    direct      no balancer: the clients talk to the backends themselves, the load split
                evenly between them (the ceiling: the same backends with no LB)
    xdp         ebpf.XdpLoadBalancer through its command line (python -m lab lb), NAT mode
    nginx-l4    nginx stream proxy (one worker), as in the seeds
    nginx-l7    nginx http proxy (one worker) with upstream keepalive, as in the seeds
    haproxy-l4  HAProxy mode tcp (one thread)
    haproxy-l7  HAProxy mode http (one thread), connections to backends reused
    nft-lb      nftables DNAT to a backend picked by `numgen random`, the shape of
                kube-proxy's nftables mode, with masquerade so replies come back

Every one of them runs in the LB's namespace, listens on (or intercepts) the
VIP and port, and spreads connections over the same backends with equal
weights. One worker or thread each: the XDP program runs on one receive queue
(one NAPI thread), and the seeds' nginx is measured the same way.
"""

import os
import sys

from . import netns, nft
from .daemons import Daemon, listen_text, nofile, require
from .peers import Peer
from .webservers import temp_paths


class Balancer(Peer):
    name = "direct"

    def __init__(self, tb, backends=None):
        super().__init__()
        self.tb = tb
        self.ns = tb.ns(tb.lb)
        self.backends = backends or [(tb.backend4(i), tb.backend_port) for i in range(len(tb.backends))]

    def target(self):
        """(address, port) the clients connect to."""
        return self.tb.vip4, self.tb.service_port

    def targets(self) -> list:
        """Every (address, port) the load goes to at once: the VIP, or for
        `direct` each backend (the ceiling is every backend without an LB)."""
        return [self.target()]

    def pids(self) -> list[int]:
        """Its user-space processes (CPU and memory are read from them)."""
        return []

    def maps_bytes(self) -> int:
        """Kernel memory it holds on its own (BPF maps); 0 when it holds none we can read."""
        return 0


class Direct(Balancer):
    """No balancer: the clients address the backends themselves."""
    name = "direct"

    def target(self):
        return self.backends[0]

    def targets(self):
        return list(self.backends)


class Proxy(Daemon):
    """A proxy daemon in the LB namespace (run directory <ns>.<name>.proxy)."""
    suffix = ".proxy"
    what = "proxy"

    def __init__(self, ns, name, vip, port, backends):
        super().__init__(ns, name, port)
        self.vip, self.backends = vip, backends


class NginxProxy(Proxy):
    def __init__(self, ns, name, vip, port, backends, layer):
        self.binary = require("nginx", "nginx")
        super().__init__(ns, name, vip, port, backends)
        self.layer = layer

    def files(self):
        return {"nginx.conf": self.config(), "tmp/.keep": ""}

    def argv(self):
        return [self.binary, "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir), "-e", str(self.dir / "error.log")]

    def config(self):
        d = self.dir
        servers = "".join(f"        server {listen_text(a, p)};\n" for a, p in self.backends)
        listen = f"listen {listen_text(self.vip, self.port)} reuseport backlog=16384;"
        if self.layer == 4:
            head = "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n"
            block = f"""stream {{
    upstream backends {{
{servers}    }}
    server {{
        {listen}
        proxy_pass backends;
    }}
}}
"""
        else:
            head = ""
            # HTTP/1.1 and an empty Connection header keep the upstream connections open
            block = f"""http {{
    access_log off;
{temp_paths(d)}
    keepalive_requests 1000000;
    upstream backends {{
{servers}        keepalive 256;
        keepalive_requests 1000000;
    }}
    server {{
        {listen}
        location / {{
            proxy_pass http://backends;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""
        return f"""# written by lab.balancers for one lab run
{head}worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 65536; }}
worker_rlimit_nofile {nofile()};
{block}"""


class HaproxyProxy(Proxy):
    def __init__(self, ns, name, vip, port, backends, layer):
        self.binary = require("haproxy", "haproxy")
        super().__init__(ns, name, vip, port, backends)
        self.layer = layer

    def files(self):
        return {"haproxy.cfg": self.config()}

    def argv(self):
        # -db: foreground, no daemon; -W would add a master process we do not need
        return [self.binary, "-db", "-f", str(self.dir / "haproxy.cfg")]

    def config(self):
        servers = "".join(f"    server be{i + 1} {listen_text(a, p)}\n" for i, (a, p) in enumerate(self.backends))
        http = "    option http-keep-alive\n    http-reuse always\n" if self.layer == 7 else ""
        return f"""# written by lab.balancers for one lab run
global
    nbthread 1
    maxconn {(nofile() - 100) // 2}
    pidfile {self.dir}/haproxy.pid
defaults
    mode {"tcp" if self.layer == 4 else "http"}
    timeout connect 5s
    timeout client 60s
    timeout server 60s
{http}frontend vip
    bind {listen_text(self.vip, self.port)}
    default_backend backends
backend backends
    balance roundrobin
{servers}"""


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


class NginxL7(ProxyBalancer):
    name, proxy, layer = "nginx-l7", NginxProxy, 7


class HaproxyL4(ProxyBalancer):
    name, proxy, layer = "haproxy-l4", HaproxyProxy, 4


class HaproxyL7(ProxyBalancer):
    name, proxy, layer = "haproxy-l7", HaproxyProxy, 7


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
    TABLE = "vtl_lb"
    SYSCTLS = ("net.ipv4.conf.all.send_redirects", "net.ipv4.conf.eth0.send_redirects")

    def attach(self):
        from .redirects import _flush_conntrack
        vip, port = self.target()
        t = {"family": "ip", "table": self.TABLE}
        n = len(self.backends)
        cmds = [{"add": {"table": {"family": "ip", "name": self.TABLE}}}]
        for i, (addr, bport) in enumerate(self.backends):
            cmds += [{"add": {"chain": {**t, "name": f"be{i}"}}},
                     {"add": {"rule": {**t, "chain": f"be{i}", "expr": [
                         # (a port mapping needs a transport-protocol match in its own chain)
                         {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}},
                         {"counter": None}, {"dnat": {"family": "ip", "addr": addr, "port": bport}}]}}}]
        pick = {"vmap": {"key": {"numgen": {"mode": "random", "mod": n}},
                         "data": {"set": [[i, {"goto": {"target": f"be{i}"}}] for i in range(n)]}}}
        cmds += [{"add": {"chain": {**t, "name": "pre", "type": "nat", "hook": "prerouting", "prio": -100,
                                    "policy": "accept"}}},
                 {"add": {"rule": {**t, "chain": "pre", "expr": [
                     {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": vip}},
                     {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": port}},
                     pick]}}},
                 {"add": {"chain": {**t, "name": "post", "type": "nat", "hook": "postrouting", "prio": 100,
                                    "policy": "accept"}}},
                 {"add": {"rule": {**t, "chain": "post", "expr": [
                     {"match": {"op": "in", "left": {"ct": {"key": "status"}}, "right": "dnat"}},
                     {"counter": None}, {"masquerade": None}]}}}]
        self.saved = {k: netns.read_sysctl(self.ns, k) for k in self.SYSCTLS}
        try:
            for k in self.SYSCTLS:
                netns.sysctl(self.ns, k, 0)
            _flush_conntrack(self.ns)
            nft.run(self.ns, cmds)
        except BaseException:
            self.detach()   # restores the sysctls read above
            raise
        self.attached = True

    def counters(self):
        """new connections sent to each backend (the DNAT chains' counters)."""
        counts = nft.counters(self.ns, "ip", self.TABLE)
        return {f"be{i}": counts[i][0] for i in range(len(self.backends))}

    def detach(self):
        from .redirects import _flush_conntrack
        nft.delete_table(self.ns, "ip", self.TABLE)
        if netns.exists(self.ns):
            _flush_conntrack(self.ns)
            for k, v in getattr(self, "saved", {}).items():
                netns.sysctl(self.ns, k, v)
        self.attached = False


class XdpCli(Daemon):
    """`python -m lab lb` in the LB namespace, its --json lines in the run
    directory; ready once it says it attached."""
    suffix = ".xdp-lb"
    what = "python -m lab lb"

    def __init__(self, ns, iface, service, backends, extra=()):
        super().__init__(ns, iface, 0)
        self.output = "events.jsonl"
        self.args = ["--iface", iface, "--service", service, "--json", "--interval", "1", *extra]
        for a, p in backends:
            self.args += ["--backend", listen_text(a, p)]

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


class XdpLb(Balancer):
    """The XDP load balancer as its users run it: its command line, NAT mode,
    native XDP on the LB's interface, TCP health checks every second."""
    name = "xdp"

    def attach(self):
        vip, port = self.target()
        self.cli = XdpCli(self.ns, "eth0", f"tcp:{vip}:{port}", self.backends).start(timeout=60)
        self.attached = True

    def pids(self):
        return self.cli.pids() if self.attached else []

    def maps_bytes(self):
        """The locked memory of the BPF maps its process holds (fdinfo's memlock)."""
        maps = {}  # map id -> bytes: a map may be open on several fds
        for pid in self.pids():
            fds = f"/proc/{pid}/fdinfo"
            try:
                entries = os.listdir(fds)
            except FileNotFoundError:
                continue
            for fd in entries:
                try:
                    info = open(f"{fds}/{fd}").read()
                except OSError:
                    continue
                if "map_type:" in info:
                    fields = dict(ln.split(":", 1) for ln in info.splitlines() if ":" in ln)
                    maps[int(fields["map_id"])] = int(fields["memlock"])
        return sum(maps.values())

    def counters(self):
        import json
        lines = [ln for ln in self.cli.events() if ln.startswith("{")] if self.attached else []
        last = json.loads(lines[-1]) if lines else {}
        return {k: v for k, v in last.items() if isinstance(v, int)}

    def detach(self):
        self.cli.close()
        self.attached = False


BALANCERS = {cls.name: cls for cls in (Direct, XdpLb, NginxL4, NginxL7, HaproxyL4, HaproxyL7, NftLb)}
