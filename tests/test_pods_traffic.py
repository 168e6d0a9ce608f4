"""The pod datapath (ebpf.TcPods) on real traffic: two nodes of pods built as a CNI
builds them (lab.fastpaths.pods.testbed), TCP and UDP through real sockets
(tests/echo.py: every datagram and every byte echoed), IPv4 and IPv6, same node and
across nodes, native routing and the VXLAN tunnel. The proof that the fast path
carried it is the kernel's own: the nodes' forwarding counters do not move, while
each pod's row of the program's counters does."""

import json
import sys

import pytest
from helpers import PORT, echo_servers, exchange, stop_all

from ebpf.pods.tc_pods import TcPods
from lab.fastpaths.pods.testbed import pods_testbed

N = 20
VIP, VIP6 = "198.18.200.10", "2001:2:200::10"
# a reply's source through an unconnected UDP socket: what recvfrom() says sent it
RECVFROM = """
import socket, sys
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(family, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(b"hello", (sys.argv[1], int(sys.argv[2])))
data, addr = s.recvfrom(100)
print(addr[0], addr[1], data.decode())
"""


def kernel_forwards(tb, node) -> int:
    """IPv4 ForwDatagrams + IPv6 OutForwDatagrams of a node's namespace."""
    snmp = tb.topo.run(node, ["cat", "/proc/net/snmp"], capture_output=True, text=True).stdout.splitlines()
    ip = [ln.split()[1:] for ln in snmp if ln.startswith("Ip:")]
    v4 = int(dict(zip(ip[0], ip[1], strict=True))["ForwDatagrams"])
    snmp6 = tb.topo.run(node, ["cat", "/proc/net/snmp6"], capture_output=True, text=True).stdout.split()
    v6 = int(snmp6[snmp6.index("Ip6OutForwDatagrams") + 1])
    return v4 + v6


def tx_packets(tb, node, ifname) -> int:
    link = json.loads(
        tb.topo.run(node, ["ip", "-s", "-j", "link", "show", ifname], capture_output=True, text=True).stdout
    )
    return link[0]["stats64"]["tx"]["packets"]


def datapath(tb, node) -> TcPods:
    kw = dict(mode="tunnel", tunnel="vxlan0", vni=7) if tb.tunnel else {}
    p = TcPods(netns=tb.ns(node), **kw)
    for pod in tb.pods[node]:
        p.add_pod(tb.lxc[pod], [tb.pod4(pod), tb.pod6(pod)], mac=tb.topo.mac(pod, "eth0"))
    for other in tb.nodes:
        if other != node:
            p.add_remote(tb.prefix4(other), node=tb.underlay4(other) if tb.tunnel else None)
            p.add_remote(tb.prefix6(other), node=tb.underlay4(other) if tb.tunnel else None)
    for proto in ("tcp", "udp"):  # a backend on each node
        p.add_service(VIP, 80, proto, [f"{tb.pod4(b)}:{PORT}" for b in ("p01", "p10")])
        p.add_service(VIP6, 80, proto, [f"[{tb.pod6(b)}]:{PORT}" for b in ("p01", "p10")])
    p.load_program()
    for pod in tb.pods[node]:
        p.attach_pod(tb.lxc[pod])
    p.attach_node("eth0")
    if tb.tunnel:
        p.attach_node("vxlan0")
    p.attach_services(tb.cgroup.path)
    return p


@pytest.fixture(scope="module", params=["native", "tunnel"])
def bed(request):
    tb = pods_testbed(tunnel=request.param == "tunnel")
    with tb:
        servers = echo_servers(tb.topo, [p for ps in tb.pods.values() for p in ps])
        progs = {node: datapath(tb, node) for node in tb.nodes}
        try:
            yield tb, progs
        finally:
            for p in progs.values():
                p.close()
            stop_all(servers)


def test_a_ping_across_nodes_is_answered_at_once(bed):
    """First of the file, and quick to fail: a datapath that loses what crosses nodes
    (a tunnel key to no node) shows here in two seconds, not in the exchanges' retries."""
    tb, _ = bed
    assert tb.topo.run("p00", ["ping", "-c", "1", "-W", "2", tb.pod4("p10")], check=False).returncode == 0


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize(
    "src, dst", [("p00", "p01"), ("p00", "p10"), ("p11", "p01")], ids=["same-node", "across", "back"]
)
def test_pod_traffic_is_carried_whole_by_the_datapath_not_by_the_kernels_forwarding(bed, src, dst, v6):
    tb, progs = bed
    forwards = {n: kernel_forwards(tb, n) for n in tb.nodes}
    sender, receiver = tb.node_of(src), tb.node_of(dst)
    way = "local_pod" if sender == receiver else ("tunneled" if tb.tunnel else "remote_pod")
    before = progs[sender].counter_rows()[tb.lxc[src]][way]
    delivered = progs[receiver].counter_rows()[tb.lxc[dst]]["local_pod"]
    sent_by_veth = tx_packets(tb, receiver, tb.lxc[dst])
    got = exchange(tb.topo, src, tb.pod6(dst) if v6 else tb.pod4(dst), PORT, N)
    assert got == {"udp": N, "tcp": N, "n": N}
    assert {n: kernel_forwards(tb, n) for n in tb.nodes} == forwards  # nothing went the kernel's way
    # into the pod from its veth's ingress to the peer's (bpf_redirect_peer): not out of the
    # veth, whose TX counts only what the node itself sends the pod (a neighbour reply or two)
    assert tx_packets(tb, receiver, tb.lxc[dst]) - sent_by_veth <= 2
    # the sending pod's row counts its frames out on their way; across nodes, the
    # receiving node counts them into the pod (its uplink's or tunnel's program)
    assert progs[sender].counter_rows()[tb.lxc[src]][way] > before
    if sender != receiver:
        assert progs[receiver].counter_rows()[tb.lxc[dst]]["local_pod"] > delivered


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("way", ["connect", "per-packet"])
def test_a_service_is_reached_at_connect_or_per_packet_tcp_and_udp(bed, way, v6):
    """A pod in the cgroup gets its backend at connect(), once per socket, and none
    of its packets is translated; a pod outside it is translated per packet both ways
    (the backends are a pod on each node: same node and across)."""
    tb, progs = bed
    before = {n: p.service_counters() for n, p in progs.items()}
    kw = tb.in_cgroup() if way == "connect" else {}
    got = exchange(tb.topo, "p00", VIP6 if v6 else VIP, 80, N, **kw)
    assert got == {"udp": N, "tcp": N, "n": N}
    after = {n: p.service_counters() for n, p in progs.items()}
    moved = {n: {k: after[n][k] - before[n][k] for k in after[n] if after[n][k] != before[n][k]} for n in progs}
    assert moved["n1"] == {}  # the client's node does all of it
    if way == "connect":  # one per UDP socket and per TCP connection, and nothing per packet
        assert moved["n0"] == {"connect": 2 * N}
    else:  # every packet out and every reply in
        assert set(moved["n0"]) == {"to_backend", "to_client"} and moved["n0"]["to_backend"] >= 4 * N


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("way", ["connect", "per-packet"])
def test_an_unconnected_udp_socket_hears_the_reply_from_the_service(bed, way, v6):
    """sendto() a service, recvfrom(): the reply's source is the service's address and
    port, given back by recvmsg()'s program (in the cgroup) or per packet (outside)."""
    tb, progs = bed
    before = progs["n0"].service_counters()
    vip = VIP6 if v6 else VIP
    kw = tb.in_cgroup() if way == "connect" else {}
    out = tb.topo.run("p00", [sys.executable, "-c", RECVFROM, vip, "80"], capture_output=True, text=True, **kw)
    assert out.stdout.split() == [vip, "80", "hello"]
    after = progs["n0"].service_counters()
    if way == "connect":
        assert (after["sendmsg"] - before["sendmsg"], after["recvmsg"] - before["recvmsg"]) == (1, 1)
    else:
        assert (after["to_backend"] - before["to_backend"], after["to_client"] - before["to_client"]) == (1, 1)
