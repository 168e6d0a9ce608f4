"""The vTAP: a TC clsact program clones packets whose source or destination is
on a watch-list to a monitor interface (ebpf.TcMirror), after the vTAP paper;
on a node that routes, its XDP twin (ebpf.XdpMirror, `vtap --hook xdp`) sends
each watched frame to its egress and to the monitor before an skb exists."""

from lab.fastpath import FastPath

FASTPATH = FastPath(
    name="vtap",
    title="clone watched traffic to a monitor",
    hook="TC clsact, or XDP on a router",
    program="ebpf.vtap.tc_mirror:TcMirror",
    variants=("ebpf.vtap.xdp_mirror:XdpMirror", "ebpf.vtap.sessions.tc_sessions:SessionMirror"),
    command="lab.fastpaths.vtap.command",
    example="python -m vtap --monitor mon0 --watch 198.18.1.10/32",
    compared_with="OVS port mirroring, `tc mirred`, nftables `dup`",
    peers="lab.fastpaths.vtap.peers",
    benches=("lab.fastpaths.vtap.bench", "lab.fastpaths.vtap.ids_bench", "lab.fastpaths.vtap.loop_bench"),
    plots=("lab.fastpaths.vtap.plots", "lab.fastpaths.vtap.ids_plots"),
    checks="lab.fastpaths.vtap.checks",
    doc="docs/vtap.md",
    order=1,
)
