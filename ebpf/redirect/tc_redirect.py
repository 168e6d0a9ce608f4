"""TcRedirect: XdpRedirect's rules at the TC (clsact) hook (tc_redirect.bpf.c).

    >>> with TcRedirect(["udp:198.18.1.17:8080=198.18.2.2:8083"], action="forward") as r:  # doctest: +SKIP
    ...     r.attach("eth0")                   # where the clients' datagrams arrive
    ...     r.attach("eth1")                   # where the backend's replies arrive
    ...     r.add_rule("tcp:[2001:2::17]:80=[2001:2:0:2::2]:8080")   # live: no reload
    ...     r.counters(), r.rule_counters()

The same rules, maps, actions and counters as XdpRedirect, so the two can be
compared: what the XDP hook buys over TC is the difference. The rewrite goes
through the skb helpers (bpf_skb_store_bytes, bpf_l3/l4_csum_replace), and
`forward` sends with bpf_redirect_neigh, which resolves the next hop's MAC
itself: no devmap, no neighbour fallback (slow_no_neigh stays 0).

The counters are XdpRedirect's, under the names every program uses
(include/verdict.h): pass counts TC_ACT_OK, redirect TC_ACT_REDIRECT, drop
TC_ACT_SHOT (a rewrite that failed half-way: no memory to un-clone the skb),
aborted anything else.
"""

from ebpf.redirect.xdp_redirect import XdpRedirect


class TcRedirect(XdpRedirect):
    """Rewrite datagrams to a service so that they reach its backend, and back,
    at TC ingress. Rules, rule changes, counters and reply_interfaces() are
    XdpRedirect's: only the program and the hook differ."""

    SOURCE = "tc_redirect.bpf.c"
    FUNCTION = "tc_redirect"
    OWNER = "redirect"  # the filters' names: "redirect:tc_redirect" (ebpf/tc.py cleanup finds them by it)

    def load_program(self):
        """Compile, fill the maps and pass the verifier, before touching any hook."""
        return self.load(self.FUNCTION, "SCHED_CLS")

    def attach(self, ifname, direction="ingress"):
        """A direct-action filter on ifname's clsact ingress hook, placed before
        the filters already there (ebpf/tc.py): where clients' datagrams or
        backends' replies arrive. `forward` needs nothing else: the helper it
        sends with finds the egress device in the packet's own namespace.
        direction="egress" (with `pass`): where routed replies leave towards the
        clients, after the kernel's routing and its source checks."""
        return self.attach_tc(self.FUNCTION, ifname, direction, self.netns, owner=self.OWNER)
