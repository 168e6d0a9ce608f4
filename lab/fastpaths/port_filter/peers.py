"""What the port filter is measured against, behind lab.peer.Peer: each drops
TCP/UDP to the same ports at the DUT's receiving interface, and counts what it
dropped in counters()["dropped"].

    none   nothing is dropped: what the frames cost the DUT when nobody filters them
    xdp    ebpf.XdpPortFilter, native XDP: before the kernel builds an skb
    nft    nftables, a netdev-family ingress chain with `th dport ... drop`: the
           rule a user would write, after the skb exists but before the stack
"""

from ebpf.port_filter.xdp_port_filter import XdpPortFilter, parse_port
from lab import nft
from lab.peer import Peer


class Filter(Peer):
    name = "none"
    kind = "port-filter"
    colour = "#555555"  # the baseline

    def __init__(self, ns, ifname, ports, mode=None):
        super().__init__(mode)
        self.ns, self.ifname, self.ports = ns, ifname, list(ports)

    def counters(self):
        return {"dropped": 0}


class XdpFilter(Filter):
    name = "xdp"
    modes = ("native", "generic")
    colour, colours = "#0072B2", {"generic": "#56B4E9"}
    owns_dut_xdp = True

    def __init__(self, ns, ifname, ports, mode=None):
        super().__init__(ns, ifname, ports, mode)
        self.prog = XdpPortFilter(ports, netns=ns)

    def attach(self):
        self.prog.attach(self.ifname, self.mode)
        self.attached = True

    def detach(self):
        self.prog.detach()
        self.attached = False

    def counters(self):
        return {"dropped": self.prog.counters()["drop"]}

    def close(self):
        super().close()
        self.prog.close()


class NftFilter(Filter):
    """table netdev vtl_portfilter { chain in { type filter hook ingress device IF priority 0;
    meta l4proto udp udp dport 9 counter drop; ... } }"""

    name = "nft"
    colour = "#E69F00"
    TABLE = "vtl_portfilter"

    def attach(self):
        t = {"family": "netdev", "table": self.TABLE}
        cmds = [
            {"add": {"table": {"family": "netdev", "name": self.TABLE}}},
            {
                "add": {
                    "chain": {
                        **t,
                        "name": "in",
                        "type": "filter",
                        "hook": "ingress",
                        "dev": self.ifname,
                        "prio": 0,
                        "policy": "accept",
                    }
                }
            },
        ]
        for proto, port in (parse_port(p) for p in self.ports):
            cmds.append(
                {
                    "add": {
                        "rule": {
                            **t,
                            "chain": "in",
                            "expr": [
                                {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": proto}},
                                {
                                    "match": {
                                        "op": "==",
                                        "left": {"payload": {"protocol": proto, "field": "dport"}},
                                        "right": port,
                                    }
                                },
                                {"counter": None},
                                {"drop": None},
                            ],
                        }
                    }
                }
            )
        nft.run(self.ns, cmds)
        self.attached = True

    def detach(self):
        nft.delete_table(self.ns, "netdev", self.TABLE)
        self.attached = False

    def counters(self):
        return {"dropped": sum(p for p, _ in nft.counters(self.ns, "netdev", self.TABLE))}


PEERS = {cls.name: cls for cls in (Filter, XdpFilter, NftFilter)}
