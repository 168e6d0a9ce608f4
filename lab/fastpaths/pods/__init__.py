"""Pods the way Cilium connects them (the Cilium/SmartNIC note's first experiment):
ebpf.TcPods on a node built as a CNI builds one, against the kernel's ways. This
folder: the command line, the two-node testbed, the peers, the bench."""

from lab.fastpath import FastPath

FASTPATH = FastPath(
    name="pods",
    title="connect pods as Cilium does: peer redirect, FIB, VXLAN",
    hook="TC",
    program="ebpf.pods.tc_pods:TcPods",
    command="lab.fastpaths.pods.command",
    example="python -m lab pods --uplink eth0",
    compared_with="the kernel's routing of pod traffic (Cilium's legacy host routing)",
    peers="lab.fastpaths.pods.peers",
    benches=("lab.fastpaths.pods.bench", "lab.fastpaths.pods.bench_tables"),
    plots=("lab.fastpaths.pods.plots",),
    checks="lab.fastpaths.pods.checks",
    doc="docs/pods.md",
    order=5,
)
