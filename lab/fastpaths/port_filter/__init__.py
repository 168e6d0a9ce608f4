"""The XDP port filter: drop TCP/UDP frames to listed ports before the kernel
builds an skb (ebpf.XdpPortFilter), against the nftables rule a user would
write instead. The worked example of docs/adding-a-fast-path.md: this folder,
the program's class and C, and its tests are all it took."""

from lab.fastpath import FastPath

FASTPATH = FastPath(
    name="port-filter",
    title="drop TCP/UDP frames to listed ports",
    hook="XDP",
    program="ebpf.port_filter.xdp_port_filter:XdpPortFilter",
    command="lab.fastpaths.port_filter.command",
    example="python -m lab port-filter --iface eth0 --drop udp:9 --drop tcp:23",
    compared_with="an nftables drop rule (netdev ingress)",
    peers="lab.fastpaths.port_filter.peers",
    benches=("lab.fastpaths.port_filter.bench",),
    plots=("lab.fastpaths.port_filter.plots",),
    checks="lab.fastpaths.port_filter.checks",
    doc="docs/adding-a-fast-path.md",
    order=4,
)
