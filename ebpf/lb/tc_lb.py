"""TcLoadBalancer: the load balancer of XdpLoadBalancer at the TC ingress hook (tc_lb.bpf.c).

    >>> lb = TcLoadBalancer(self4="198.18.5.2", netns=ns)                         # doctest: +SKIP
    >>> svc = lb.add_service("tcp:198.18.5.100:80")
    >>> lb.set_backends(svc, {"198.18.5.11:8080": 1, "198.18.5.12:8080": 2})
    >>> lb.attach("eth0")

Everything but the hook is XdpLoadBalancer's: services, Maglev tables, backends,
sessions and their timeouts, LB ports, NAT and DSR, counters, sweep(), sessions().
At TC the frame is an skb already: the kernel's neighbour table finds the next
hop (no forwarding sysctl, nothing on the peer), and checksum offloads need no
care. It runs as a classic clsact filter after the filters already there
(observers such as the vTAP see its frames first), so that `keep_attached`
leaves it serving after the process ends, for a later object to take over.

hook_for(ifname) says which hook `--hook auto` picks for an interface, and why.
"""

from ebpf import netdev, tc, xdp
from ebpf.errors import InputError
from ebpf.lb.xdp_lb import TC_OWNER as OWNER
from ebpf.lb.xdp_lb import XdpLoadBalancer
from ebpf.program import refuse_live


def hook_for(ifname, netns=None) -> tuple[str, str]:
    """("xdp" or "tc", why) for the load balancer on ifname: XDP where its driver runs
    XDP natively and it is not a veth, TC otherwise (on a veth, a bridge, a tap or a
    tunnel, what XDP saves at the LB the far end pays back, or XDP runs only generic)."""
    with netdev.ipr(netns) as ip:
        idx = netdev.ifindex_of(ip, ifname, netns)
        dev = netdev.device(ip, idx)
    if dev is not None and dev.kind == "veth":
        return "tc", f"{ifname} is a veth: its peer would have to turn XDP frames into skbs again"
    native = xdp.runs_native(netns, idx)
    if native:
        return "xdp", f"{ifname}'s driver runs XDP natively"
    if native is None:
        return "tc", f"the kernel does not say whether {ifname}'s driver runs XDP natively (before 6.3)"
    if dev is not None and dev.kind:
        return "tc", f"{ifname} is a {dev.kind} device: no native XDP"
    return "tc", f"{ifname}'s driver has no native XDP"


class TcLoadBalancer(XdpLoadBalancer):
    SOURCE = "tc_lb.bpf.c"
    FUNCTION = "tc_lb"
    MAIN_COUNTERS = ("seen", "to_backend", "to_client", "new_sessions", "redirect", "pass", "drop")
    VERDICTS = ("redirect", "pass", "drop")
    # XDP's, but no_neigh (bpf_redirect_neigh() resolves a next hop itself), and too_big
    REASONS = (*(r for r in XdpLoadBalancer.REASONS if r != "no_neigh"), "too_big")
    DROPS = (*(r for r in XdpLoadBalancer.DROPS if r != "no_neigh"), "too_big")

    def load_program(self):
        return self.load(self.FUNCTION, "SCHED_CLS")

    def attach(self, ifname, mode=None, kept="adopt"):
        """Attach at ifname's TC ingress, after the filters there. A load balancer left
        serving on ifname (kept or killed) is taken over as XdpLoadBalancer.attach()
        says (kept="adopt", "replace", "refuse"); one left at the XDP hook is another
        hook's: refused with the reason, unless kept="replace" (its sessions are lost)."""
        self.adopted, self.replaced = False, None
        at_xdp = self.kept_xdp(XdpLoadBalancer.FUNCTION, ifname, self.netns)
        if at_xdp is not None:
            if kept != "replace":
                raise InputError(
                    f"{ifname} runs a load balancer at the XDP hook left serving (kept, or its process "
                    "killed); this one would run at TC and cannot take its sessions over: replace it "
                    "(--replace: its sessions are lost), run this one with --hook xdp, or remove it "
                    "(python -m lab lb --cleanup)"
                )
            ifindex, their_mode, pid, live = at_xdp
            refuse_live(ifname, XdpLoadBalancer.FUNCTION, live)
            self.load_program()
            f = self.attach_tc(self.FUNCTION, ifname, "ingress", self.netns, owner=OWNER, first=False)
            xdp.remove(self.netns, ifindex, their_mode, pid)
            self.replaced = "xdp"
            return f
        found = self.kept_tc(self.FUNCTION, ifname, OWNER, self.netns)
        if found is None:
            return self.attach_tc(self.FUNCTION, ifname, "ingress", self.netns, owner=OWNER, first=False)
        if kept not in ("adopt", "replace"):
            raise InputError(
                f"{ifname} runs a load balancer left serving (kept, or its process killed): "
                "adopt it, replace it, or remove it (python -m lab lb --cleanup)"
            )
        if kept == "adopt":
            f = self.take_over_tc(self.FUNCTION, found, self.netns, check=self._can_serve_on)
            self._take_over_state()
            self.adopted = True
            return f
        refuse_live(ifname, self.FUNCTION, found.pids)
        fn = self.load_program()
        f = tc.replace(self.netns, found, fn.fd, self.FUNCTION, OWNER)
        self._tc_filters.append(f)
        self.replaced = "tc"
        return f
