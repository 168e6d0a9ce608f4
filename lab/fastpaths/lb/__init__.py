"""The load balancer: Maglev, connection tracking, NAT or DSR, at TC or XDP
(ebpf.TcLoadBalancer, ebpf.XdpLoadBalancer), after the two XDP load-balancer articles."""

from lab.fastpath import FastPath

FASTPATH = FastPath(
    name="lb",
    title="a layer-4 load balancer: Maglev, connection tracking, NAT or DSR",
    hook="TC or XDP",
    program="ebpf.lb.xdp_lb:XdpLoadBalancer",
    command="lab.fastpaths.lb.command",
    example="python -m lab lb --iface eth0 --service tcp:198.18.5.100:80 --backend 198.18.5.11:8080",
    compared_with="nginx L4/L7, HAProxy L4/L7, nftables DNAT",
    peers="lab.fastpaths.lb.peers",
    benches=("lab.fastpaths.lb.bench", "lab.fastpaths.lb.bench_tables"),
    plots=("lab.fastpaths.lb.plots",),
    checks="lab.fastpaths.lb.checks",
    doc="docs/lb.md",
    order=3,
)
