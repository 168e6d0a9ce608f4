"""Kernel programs as Python classes: one class per program, its C beside it.

    TcMirror      tc_mirror.bpf.c   the vTAP: clone watched traffic to a monitor (TC clsact)
    XdpMirror     xdp_mirror.bpf.c  the XDP vTAP: on a router, watched frames out of their egress and a monitor
    XdpSink       xdp_sink.bpf.c    count every frame at XDP, then drop, pass, tx or redirect it
    XdpGen        xdp_gen.bpf.c     the lab's generator program (XDP_TX via BPF_PROG_TEST_RUN)
    XdpRedirect   xdp_redirect.bpf.c  rewrite datagrams to a service so they reach a backend, and back
    TcRedirect    tc_redirect.bpf.c   the same rules at the TC (clsact) ingress hook, for comparison
    XdpLoadBalancer xdp_lb.bpf.c      a layer-4 load balancer: Maglev, connection tracking, NAT or DSR
    XdpPeerPass   xdp_peer_pass.bpf.c pass everything: on a veth peer, so that XDP frames sent into it arrive
    SessionMirror tc_sessions.bpf.c   vTAP sessions: ordered L4 rules, truncation, sampling, copies to an
                                      interface or tunnelled to a collector (Session, Rule: sessions.py)

The names are imported on first use, so that a light module of this package
(errors, privileges) can be imported without pyroute2 or BCC.
"""
from importlib import import_module

from .errors import (AttachError, BpfError, CompileError, InputError, NoSuchInterface, NoSuchNamespace,
                     PrivilegeError, VerifierError)

_LAZY = {"BpfProgram": ".program", "TcMirror": ".tc_mirror", "XdpSink": ".xdp_sink", "XdpGen": ".xdp_gen",
         "XdpRedirect": ".xdp_redirect", "TcRedirect": ".tc_redirect", "XdpLoadBalancer": ".xdp_lb",
         "XdpPeerPass": ".xdp_peer_pass", "XdpMirror": ".xdp_mirror", "SessionMirror": ".tc_sessions",
         "Session": ".sessions", "Rule": ".sessions", "load_sessions": ".sessions"}

__all__ = ["AttachError", "BpfError", "BpfProgram", "CompileError", "InputError", "NoSuchInterface",
           "NoSuchNamespace", "PrivilegeError", "Rule", "Session", "SessionMirror", "TcMirror", "TcRedirect", "VerifierError", "XdpGen", "XdpLoadBalancer",
           "XdpMirror", "XdpPeerPass", "load_sessions", "XdpRedirect", "XdpSink"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
