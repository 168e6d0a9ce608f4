"""Interface counters of lab namespaces, from netlink. Apart from lab.metrics (which
re-exports them) because traffic generators' own processes read them and must not
load pandas to do so."""

from ebpf.netdev import ifindex_of

from . import netns

IFACE_FIELDS = ["rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_dropped", "tx_dropped"]


def iface_counters(ns, ifname) -> dict:
    """rx/tx packets, bytes and drops of one interface in a lab namespace (netlink)."""
    with netns.ipr(ns) as ip:
        stats = ip.get_links(ifindex_of(ip, ifname, ns))[0].get_attr("IFLA_STATS64")
    return {k: stats[k] for k in IFACE_FIELDS}


class IfaceCounters:
    """Counters of several (namespace, interface) pairs, read together; delta()
    gives what happened since the last mark()."""

    def __init__(self, where: dict):
        self.where = where  # label -> (ns, ifname)
        self._base = {}

    def read(self) -> dict:
        return {label: iface_counters(ns, ifn) for label, (ns, ifn) in self.where.items()}

    def mark(self):
        self._base = self.read()

    def delta(self) -> dict:
        now = self.read()
        return {label: {k: now[label][k] - self._base[label][k] for k in IFACE_FIELDS} for label in now}
