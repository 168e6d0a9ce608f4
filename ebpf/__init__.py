"""Kernel programs as Python classes: one package per program family, its C beside its class.

The top of the package is what every program shares: the loader (program.py),
TC and XDP attachment (tc.py, xdp.py), netdev and netlink, test runs, tracepoints,
who holds a hook (holders.py), the ABI reader (abi.py), errors, privileges and
include/ (the parsing, checksum, rewriting headers and the one exit, verdict.h).

    vtap/          TcMirror (tc_mirror.bpf.c): clone watched traffic to a monitor (TC clsact);
                   XdpMirror (xdp_mirror.bpf.c): on a router, watched frames to their egress and a monitor
    vtap/sessions/ SessionMirror (tc_sessions.bpf.c): ordered L4 rules, truncation, sampling, copies to
                   an interface or tunnelled to a collector (Session, Rule: config.py)
    redirect/      XdpRedirect (xdp_redirect.bpf.c), TcRedirect (tc_redirect.bpf.c): rewrite a
                   service's datagrams to a backend, and back, at XDP or at TC
    lb/            XdpLoadBalancer (xdp_lb.bpf.c), TcLoadBalancer (tc_lb.bpf.c): a layer-4 load
                   balancer at XDP or at TC: Maglev, connection tracking, NAT or DSR
    port_filter/   XdpPortFilter (xdp_port_filter.bpf.c): drop TCP/UDP frames to listed ports
    pods/          TcPods (tc_pods.bpf.c): pods on a node as Cilium connects them: into a pod by
                   its veth's peer, to other nodes' pods by the FIB or a VXLAN tunnel (TC)
    instruments/   the lab's own: XdpSink (count, then drop/pass/tx/redirect), XdpGen (the
                   generator), XdpPeerPass (pass everything on a veth peer, so XDP frames arrive),
                   TcSwap (the TC floor: swap the MACs, send the frame back)

The names are imported on first use, so that a light module of this package
(errors, privileges) can be imported without pyroute2 or BCC.
"""

from .errors import (
    AttachError,
    BpfError,
    CompileError,
    InputError,
    NoSuchInterface,
    NoSuchNamespace,
    PrivilegeError,
    VerifierError,
)
from .lazy import lazy

_LAZY = {
    "BpfProgram": ".program",
    "TcMirror": ".vtap.tc_mirror",
    "XdpMirror": ".vtap.xdp_mirror",
    "SessionMirror": ".vtap.sessions.tc_sessions",
    "Session": ".vtap.sessions.config",
    "Rule": ".vtap.sessions.config",
    "load_sessions": ".vtap.sessions.config",
    "XdpRedirect": ".redirect.xdp_redirect",
    "TcRedirect": ".redirect.tc_redirect",
    "XdpLoadBalancer": ".lb.xdp_lb",
    "TcLoadBalancer": ".lb.tc_lb",
    "XdpPortFilter": ".port_filter.xdp_port_filter",
    "TcPods": ".pods.tc_pods",
    "XdpSink": ".instruments.xdp_sink",
    "XdpGen": ".instruments.xdp_gen",
    "XdpPeerPass": ".instruments.xdp_peer_pass",
    "TcSwap": ".instruments.tc_swap",
}

__all__ = [
    "AttachError",
    "BpfError",
    "BpfProgram",
    "CompileError",
    "InputError",
    "NoSuchInterface",
    "NoSuchNamespace",
    "PrivilegeError",
    "Rule",
    "Session",
    "SessionMirror",
    "TcLoadBalancer",
    "TcMirror",
    "TcPods",
    "TcRedirect",
    "TcSwap",
    "VerifierError",
    "XdpGen",
    "XdpLoadBalancer",
    "XdpMirror",
    "XdpPeerPass",
    "XdpPortFilter",
    "XdpRedirect",
    "XdpSink",
    "load_sessions",
]


__getattr__, __dir__ = lazy(__name__, _LAZY)
