"""Ways to get a client's datagrams for a service to its backend, and the
backend's replies back, on the router testbed (lab.fastpaths.redirect.testbed.router_testbed),
all driven the same way (lab.peer.Peer), so experiments can swap them:

    >>> m = METHODS["nft-dnat"](tb)                     # doctest: +SKIP
    >>> m.attach(); m.target(4); ...; m.counters(); m.detach()

    route          no translation: the client sends to the backend itself (the ceiling)
    nft-dnat       nftables `dnat` in the nat prerouting hook; conntrack translates the replies
    nft-stateless  nftables payload rewrites in the raw prerouting hook with `notrack`, both
                   ways: the closest this kernel has to the report's netfilter module (it loads
                   no modules)
    xdp-pass       ebpf.XdpRedirect, action pass (the report's design), mode native or generic
    xdp-forward    ebpf.XdpRedirect, action forward, mode native or generic
    tc-bpf         ebpf.TcRedirect (forward) at the TC ingress hook: what XDP buys over TC

target(family) is the (address, port) the client sends to: the service's, or for
route the backend's. counters()["translated"] is what the method itself counts
as rewritten toward the backend (program or rule counters); route translates
nothing. Everything goes through netlink or the nftables JSON API, and detach()
leaves nothing behind.
"""

from ebpf.redirect.tc_redirect import TcRedirect
from ebpf.redirect.xdp_redirect import XdpRedirect
from lab import nft
from lab.peer import Peer


class RedirectMethod(Peer):
    name = "route"
    kind = "redirect"

    def __init__(self, tb, mode=None, proto="udp"):
        super().__init__(mode)
        self.tb, self.proto = tb, proto
        self.ns = tb.ns(tb.dut)

    def target(self, family=4):
        tb = self.tb
        return (tb.vip4 if family == 4 else tb.vip6), tb.service_port

    def counters(self):
        return {"translated": 0}


class Route(RedirectMethod):
    """No translation at all: what forwarding alone costs."""

    name = "route"
    colour = "#555555"

    def target(self, family=4):
        tb = self.tb
        return (tb.server4 if family == 4 else tb.server6), tb.backend_port


def _port(proto, field, value):
    """nftables JSON for `proto field == value` (proto: ip, ip6, udp, tcp)."""
    return {"match": {"op": "==", "left": {"payload": {"protocol": proto, "field": field}}, "right": value}}


def _match(family, field, value):
    return _port("ip" if family == 4 else "ip6", field, value)


def _set(proto, field, value):
    return {"mangle": {"key": {"payload": {"protocol": proto, "field": field}}, "value": value}}


class NftDnat(RedirectMethod):
    """table inet vtl_dnat { chain pre { type nat hook prerouting priority dstnat;
    ip daddr VIP udp dport 8080 counter dnat ip to BACKEND:8083 (and ip6) } }"""

    name = "nft-dnat"
    colour = "#E69F00"
    TABLE = "vtl_dnat"

    def attach(self):
        tb, p = self.tb, self.proto
        t = {"family": "inet", "table": self.TABLE}
        rules = [
            {
                "add": {
                    "rule": {
                        **t,
                        "chain": "pre",
                        "expr": [
                            _match(fam, "daddr", vip),
                            _port(p, "dport", tb.service_port),
                            {"counter": None},
                            {"dnat": {"family": "ip" if fam == 4 else "ip6", "addr": backend, "port": tb.backend_port}},
                        ],
                    }
                }
            }
            for fam, vip, backend in ((4, tb.vip4, tb.server4), (6, tb.vip6, tb.server6))
        ]
        nft.flush_conntrack(self.ns)  # so that every flow starts a connection, as in a fresh router
        nft.run(
            self.ns,
            [
                {"add": {"table": {"family": "inet", "name": self.TABLE}}},
                {
                    "add": {
                        "chain": {
                            **t,
                            "name": "pre",
                            "type": "nat",
                            "hook": "prerouting",
                            "prio": -100,
                            "policy": "accept",
                        }
                    }
                },
                *rules,
            ],
        )
        self.attached = True

    def counters(self):
        """translated: what the nat chain saw, a connection's first packets only:
        one, or up to a receive batch of them (8 here) that reached the hook
        before conntrack confirmed the connection."""
        return {"translated": sum(p for p, _ in nft.counters(self.ns, "inet", self.TABLE))}

    def detach(self):
        nft.delete_table(self.ns, "inet", self.TABLE)
        nft.flush_conntrack(self.ns)  # its connections would go on translating for 30 s
        self.attached = False


class NftStateless(RedirectMethod):
    """table inet vtl_stateless { chain pre { type filter hook prerouting priority raw;
        ip daddr VIP udp dport 8080 notrack counter ip daddr set BACKEND udp dport set 8083
        ip saddr BACKEND udp sport 8083 notrack counter ip saddr set VIP udp sport set 8080 } }
    (and ip6): nftables updates the checksums a payload change touches."""

    name = "nft-stateless"
    colour = "#D55E00"
    TABLE = "vtl_stateless"

    def attach(self):
        tb, p = self.tb, self.proto
        t = {"family": "inet", "table": self.TABLE}
        # with the service address the router's own, a reply given it before
        # routing would be a martian: its rewrite goes after routing instead
        reply_chain = "post" if getattr(tb, "vip_on_router", False) else "pre"
        rules = []
        for fam, vip, backend in ((4, tb.vip4, tb.server4), (6, tb.vip6, tb.server6)):
            ip = "ip" if fam == 4 else "ip6"
            rules.append(
                {
                    "add": {
                        "rule": {
                            **t,
                            "chain": "pre",
                            "expr": [
                                _match(fam, "daddr", vip),
                                _port(p, "dport", tb.service_port),
                                {"notrack": None},
                                {"counter": None},
                                _set(ip, "daddr", backend),
                                _set(p, "dport", tb.backend_port),
                            ],
                        }
                    }
                }
            )
            rules.append(
                {
                    "add": {
                        "rule": {
                            **t,
                            "chain": reply_chain,
                            "expr": [
                                _match(fam, "saddr", backend),
                                _port(p, "sport", tb.backend_port),
                                *([{"notrack": None}] if reply_chain == "pre" else []),
                                {"counter": None},
                                _set(ip, "saddr", vip),
                                _set(p, "sport", tb.service_port),
                            ],
                        }
                    }
                }
            )
        chains = [
            {
                "add": {
                    "chain": {
                        **t,
                        "name": "pre",
                        "type": "filter",
                        "hook": "prerouting",
                        "prio": -300,
                        "policy": "accept",
                    }
                }
            }
        ]
        if reply_chain == "post":
            chains.append(
                {
                    "add": {
                        "chain": {
                            **t,
                            "name": "post",
                            "type": "filter",
                            "hook": "postrouting",
                            "prio": 0,
                            "policy": "accept",
                        }
                    }
                }
            )
        nft.run(self.ns, [{"add": {"table": {"family": "inet", "name": self.TABLE}}}, *chains, *rules])
        self.attached = True

    def counters(self):
        counts = nft.counters(self.ns, "inet", self.TABLE)
        if getattr(self.tb, "vip_on_router", False):  # chain pre's two rules, then post's
            half = len(counts) // 2
            return {"translated": sum(p for p, _ in counts[:half]), "replies": sum(p for p, _ in counts[half:])}
        return {"translated": sum(p for p, _ in counts[0::2]), "replies": sum(p for p, _ in counts[1::2])}

    def detach(self):
        nft.delete_table(self.ns, "inet", self.TABLE)
        self.attached = False


class XdpMethod(RedirectMethod):
    """ebpf.XdpRedirect on the router's two interfaces (clients' side and
    backend's side). Compiled once; attach/detach only move the hooks."""

    name = "xdp-pass"
    colour, colours = "#0072B2", {"generic": "#56B4E9"}  # a generic mode is its native one, pale
    action = "pass"
    modes = ("native", "generic")
    owns_dut_xdp = True

    def __init__(self, tb, mode=None, proto="udp"):
        super().__init__(tb, mode, proto)
        self.prog = self._program()
        # pass, with the service address the router's own: replies are translated
        # after routing, at TC egress towards the client, as `python -m lab
        # redirect` does (given at XDP, the kernel would drop them as martians)
        self.egress = None
        if self.action == "pass" and getattr(tb, "vip_on_router", False):
            self.egress = TcRedirect(self.tb.rules(self.proto), action="pass", netns=self.ns)
            for r in self.prog.rules:
                self.prog.leave_replies(r)

    def _program(self):
        return XdpRedirect(self.tb.rules(self.proto), action=self.action, netns=self.ns)

    def _attach_to(self, ifname):
        return self.prog.attach(ifname, self.mode)

    def attach(self):
        self.prog.load_program()
        try:
            for ifname in (self.tb.dut_in, self.tb.dut_out):
                self._attach_to(ifname)
            if self.egress:
                self.egress.attach(self.tb.dut_in, "egress")
                self.egress.reset_counters()
        except BaseException:
            self.detach()
            raise
        self.prog.reset_counters()
        self.attached = True

    def detach(self):
        for p in (self.prog, self.egress) if self.egress else (self.prog,):
            p.detach()
        self.attached = False

    def counters(self):
        c = self.prog.counters()
        replies = c["to_client"] + (self.egress.counters()["to_client"] if self.egress else 0)
        return {"translated": c["to_backend"], "replies": replies, **c}

    def close(self):
        super().close()
        self.prog.close()
        if self.egress:
            self.egress.close()


class XdpForward(XdpMethod):
    name = "xdp-forward"
    colour, colours = "#009E73", {"generic": "#7FD4B5"}
    action = "forward"


class TcBpf(XdpMethod):
    """The same rules at the TC ingress hook (ebpf.TcRedirect, forward): the skb
    exists already, and bpf_redirect_neigh() sends it on."""

    name = "tc-bpf"
    colour = "#CC79A7"
    action = "forward"
    modes = (None,)
    owns_dut_xdp = False

    def _program(self):
        return TcRedirect(self.tb.rules(self.proto), action=self.action, netns=self.ns)

    def _attach_to(self, ifname):
        return self.prog.attach(ifname)


PEERS = {m.name: m for m in (Route, NftDnat, NftStateless, XdpMethod, XdpForward, TcBpf)}
METHODS = PEERS


def method(spec, tb, proto="udp"):
    """A method from its label: "nft-dnat", "xdp-forward:generic" (native by default)."""
    name, _, mode = spec.partition(":")
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r} (choose from {', '.join(METHODS)})")
    return METHODS[name](tb, mode or None, proto)
