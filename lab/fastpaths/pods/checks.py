"""What the suite and `make mutants` check of the pod datapath, found through its
FastPath (lab.fastpath): how the one-exit check runs its two programs, and its
mutants with the tests that must catch each."""

from lab.fastpath import ExitCheck
from lab.mutants import M

PROGRAM = "ebpf.pods.tc_pods:TcPods"
# no pod and no remote prefix: every frame is for no pod of the node (unmatched), as far
# as the programs look (the IP header's addresses)
EXITS = [
    ExitCheck(PROGRAM, hook="tc", function="pods_from_pod", sees="l3"),
    ExitCheck(PROGRAM, hook="tc", function="pods_from_node", sees="l3"),
]

FIXTURES = (["tests/test_pods_fixtures.py"], [])
TRAFFIC = (["tests/test_pods_traffic.py"], [])
MUTANTS = [
    M(
        "pods-redirect-not-peer",
        "ebpf/pods/tc_pods.bpf.c",
        "return tc_exit(&st->exits, redirect_peer(to.ifindex, 0), R_LOCAL_POD);",
        "return tc_exit(&st->exits, bpf_redirect(to.ifindex, 0), R_LOCAL_POD);",
        "into a pod out of its veth (bpf_redirect), not from the veth's ingress to its peer's",
        TRAFFIC,
    ),
    M(
        "pods-tunnel-key-byte-order",
        "ebpf/pods/tc_pods.bpf.c",
        "key.remote_ipv4 = bpf_ntohl(node->a[0]);",
        "key.remote_ipv4 = node->a[0];",
        "the tunnel's remote node in the wrong byte order: the frames go to no node",
        TRAFFIC,
    ),
    M(
        "pods-macs-swapped",
        "ebpf/pods/tc_pods.bpf.c",
        "set_macs_skb(skb, to.node_mac, to.mac)",
        "set_macs_skb(skb, to.mac, to.node_mac)",
        "a frame into a pod addressed to its gateway's MAC",
        FIXTURES,
    ),
    M(
        "pods-no-hop",
        "ebpf/pods/tc_pods.bpf.c",
        "if (ttl_down(skb, r) < 0 || set_macs_skb(skb, to.node_mac, to.mac) < 0)",
        "if (set_macs_skb(skb, to.node_mac, to.mac) < 0)",
        "delivery into a pod that does not take a hop off the TTL",
        FIXTURES,
    ),
    M(
        "pods-stale-pod",
        "ebpf/pods/tc_pods.py",
        '            self._forget_addresses(ifname)\n            self.table("lxc")',
        '            self.table("lxc")',
        "a removed pod's addresses still lead to its (gone) veth",
        FIXTURES,
    ),
]
