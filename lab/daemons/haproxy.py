"""HAProxy in a lab namespace: the load balancer's L4 (mode tcp) and L7 (mode
http) proxy peers, one thread each, as the XDP LB runs on one receive queue."""

from ebpf import endpoints
from lab.daemons import Proxy, nofile, require


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
        servers = "".join(f"    server be{i + 1} {endpoints.text(a, p)}\n" for i, (a, p) in enumerate(self.backends))
        http = "    option http-keep-alive\n    http-reuse always\n" if self.layer == 7 else ""
        return f"""# written by lab.daemons.haproxy for one lab run
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
    bind {endpoints.text(self.vip, self.port)}
    default_backend backends
backend backends
    balance roundrobin
{servers}"""
