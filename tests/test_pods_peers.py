"""Every way the pods bench compares carries pod traffic, TCP and UDP, IPv4 and IPv6,
same node and across, one after another on one testbed (as the bench runs them), and
the services of those that have them answer: kube-proxy's nftables rules (legacy) and
the eBPF datapath's, at connect() (a client in the testbed's cgroup) and per packet.
Found by running them in turn: a peer that rebuilds the nodes (bridge-vxlan) must give
the next one the testbed back as it found it, or pods keep what the bridge taught them
(their node's ICMP redirects: a pod then asks for its neighbour pod's MAC directly, and
nobody answers once the bridge is gone)."""

import pytest
from helpers import PORT, echo_servers, exchange, stop_all

from lab.fastpaths.pods.peers import PEERS
from lab.fastpaths.pods.testbed import pods_testbed

N = 4
VIP, VIP6 = "198.18.200.10", "2001:2:200::10"
ORDER = ["legacy", "bridge-vxlan", "ebpf", "ebpf-redirect", "ebpf-vxlan", "iptables-legacy", "iptables-nft", "legacy"]


@pytest.fixture(scope="module")
def bed():
    tb = pods_testbed(tunnel=True)  # room for VXLAN's headers: every peer runs on it
    with tb:
        servers = echo_servers(tb.topo, ["p01", "p10", "p11"])
        try:
            yield tb
        finally:
            stop_all(servers)


def services(tb):
    out = []
    for proto in ("tcp", "udp"):
        out.append((VIP, 80, proto, [f"{tb.pod4(b)}:{PORT}" for b in ("p01", "p10")]))
        out.append((VIP6, 80, proto, [f"[{tb.pod6(b)}]:{PORT}" for b in ("p01", "p10")]))
    return out


@pytest.mark.parametrize("i", range(len(ORDER)), ids=[f"{i}-{n}" for i, n in enumerate(ORDER)])
def test_each_way_carries_the_pods_and_their_services_in_turn(bed, i):
    tb, peer = bed, PEERS[ORDER[i]](bed)
    whole = {"udp": N, "tcp": N, "n": N}
    peer.attach()
    try:
        assert exchange(tb.topo, "p00", tb.pod4("p01"), PORT, N) == whole  # same node
        assert exchange(tb.topo, "p00", tb.pod4("p10"), PORT, N) == whole  # across
        assert exchange(tb.topo, "p00", tb.pod6("p11"), PORT, N) == whole
        if peer.serves:
            peer.set_services(services(tb))
            kernel = peer.name == "legacy" or peer.name.startswith("iptables")  # the kernel's NAT: per packet
            for way in ("per-packet",) if kernel else ("connect", "per-packet"):
                assert exchange(tb.topo, "p00", VIP, 80, N, **peer.client_kw(way)) == whole, way
                if not peer.name.startswith("iptables"):  # kube-proxy's iptables rules: IPv4 here
                    assert exchange(tb.topo, "p11", VIP6, 80, N, **peer.client_kw(way)) == whole, way
            # one service more, the way this one adds it (map entries; nft's transaction;
            # kube-proxy's partial restore): served at once, and the others still are
            more = "198.18.200.20"
            added = [(more, 80, proto, [f"{tb.pod4(b)}:{PORT}" for b in ("p01", "p10")]) for proto in ("tcp", "udp")]
            for service in added:
                peer.add_service(service)
            way = "per-packet"
            assert exchange(tb.topo, "p00", more, 80, N, **peer.client_kw(way)) == whole
            assert exchange(tb.topo, "p00", VIP, 80, N, **peer.client_kw(way)) == whole
            # and its TCP one removed, the way this one removes it: gone, nothing else
            peer.remove_service(added[0])
            got = exchange(tb.topo, "p00", more, 80, 1, expect_none=True, **peer.client_kw(way))
            assert got == {"udp": 1, "tcp": 0, "n": 1}
            assert exchange(tb.topo, "p00", VIP, 80, N, **peer.client_kw(way)) == whole
    finally:
        peer.detach()


def test_kube_proxys_rules_are_its_nftables_modes_shape(bed):
    from lab.fastpaths.pods.peers import ruleset  # noqa: PLC0415

    text = ruleset("ip", [(VIP, 80, "tcp", ["198.18.100.2:80", "198.18.101.1:80"]), ("198.18.200.11", 53, "udp", [])])
    assert "ip daddr . meta l4proto . th dport vmap @service-ips" in text
    assert "numgen random mod 2 vmap { 0 : goto endpoint-0-0, 1 : goto endpoint-0-1 }" in text
    assert "198.18.200.11 . udp . 53 : goto service-1" in text and "chain service-1 { reject ; }" in text
