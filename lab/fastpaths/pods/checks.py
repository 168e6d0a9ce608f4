"""What the suite and `make mutants` check of the pod datapath, found through its
FastPath (lab.fastpath): how the one-exit check runs its two programs, and its
mutants with the tests that must catch each."""

from lab.fastpath import ExitCheck
from lab.mutants import M

PROGRAM = "ebpf.pods.tc_pods:TcPods"
# no pod, remote prefix or service: every frame is for no pod of the node (unmatched), as
# far as the programs look: a whole IP header (what is cut short or invalid, to the TCP or
# UDP header, is the kernel's, as malformed)
EXITS = [
    ExitCheck(PROGRAM, hook="tc", function="pods_from_pod", sees="ip"),
    ExitCheck(PROGRAM, hook="tc", function="pods_from_node", sees="ip"),
]

# the condition on which a per-packet flow writes its reverse entry (two mutants change it)
REVERSE_WRITTEN = (
    "\tif (!kept || kept->port != back.port || kept->a[0] != back.a[0] || kept->a[1] != back.a[1] ||\n"
    "\t    kept->a[2] != back.a[2] || kept->a[3] != back.a[3])\n"
)

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
        (["tests/test_pods_traffic.py", "-k", "test_a_ping_across_nodes_is_answered_at_once"], []),
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
        "if (from_service(skb, st, r) < 0 || ttl_down(skb, r) < 0 || set_macs_skb(skb, to.node_mac, to.mac) < 0)",
        "if (from_service(skb, st, r) < 0 || set_macs_skb(skb, to.node_mac, to.mac) < 0)",
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
    M(
        "pods-service-reply-untranslated",
        "ebpf/pods/tc_pods.bpf.c",
        "if (from_service(skb, st, r) < 0 || ttl_down(skb, r) < 0",
        "if (ttl_down(skb, r) < 0",
        "a per-packet service's replies reach the client from the backend's address (its socket drops them)",
        FIXTURES,
    ),
    M(
        "pods-service-flow-not-kept",
        "ebpf/pods/tc_pods.bpf.c",
        "kept = nat.lookup(&fk);",
        "kept = NULL;",
        "a flow's backend chosen again per packet: a change of backends moves established flows",
        FIXTURES,
    ),
    M(
        "pods-connect-port-kept",
        "ebpf/pods/tc_pods.bpf.c",
        "	ctx->user_port = (__u32)to.port;\n	if (msg)",
        "	if (msg)",
        "connect() to a service goes to the backend's address but keeps the service's port",
        TRAFFIC,
    ),
    M(
        "pods-service-reverse-never-written",
        "ebpf/pods/tc_pods.bpf.c",
        REVERSE_WRITTEN,
        "\tif (0)\n",
        "a per-packet service's reverse entry never written",
        FIXTURES,
    ),
    M(
        "pods-service-reverse-of-another-service-kept",
        "ebpf/pods/tc_pods.bpf.c",
        REVERSE_WRITTEN,
        "\tif (!kept)\n",
        "a reverse entry naming another service (a client port used again) kept: the replies get its address",
        FIXTURES,
    ),
    M(
        "pods-udp-socket-reply-untranslated",
        "ebpf/pods/tc_pods.bpf.c",
        "		sock_rev.update(&rk, &back);",
        "",
        "an unconnected UDP socket's reply shows the backend, not the service it sent to",
        TRAFFIC,
    ),
    M(
        "skb-rewrite-udp-zero-checksum",
        "ebpf/include/skb_rewrite.h",
        "return p->udp ? BPF_F_MARK_MANGLED_0 : 0;",
        "return 0;",
        "a UDP datagram sent without a checksum (0) gets one computed from nothing",
        (["tests/test_pods_fixtures.py", "-k", "without_a_checksum"], []),
    ),
    M(
        "cgroup-cleanup-takes-live-programs",
        "ebpf/cgroup.py",
        "if held[i] and (spare_live or elsewhere):",
        "if False:",
        "a cleanup detaches a running datapath's socket programs",
        (["tests/test_pods_command.py", "-k", "services_at or one_datapath"], []),
    ),
    M(
        "cgroup-cleanup-takes-other-namespaces",
        "ebpf/cgroup.py",
        "if held[i] and (spare_live or elsewhere):",
        "if held[i] and spare_live:",
        "a cleanup of every run detaches a live datapath's socket programs from another network namespace",
        (["tests/test_pods_command.py", "-k", "services_at"], []),
    ),
    M(
        "cgroup-cleanup-every-cgroup",
        "lab/fastpaths/pods/command.py",
        'cgroup.cleanup("pods_", spare_live=not all_runs, within=list(notes))',
        'cgroup.cleanup("pods_", spare_live=not all_runs)',
        "a cleanup takes another instance's killed run's socket programs (on the rack: the machine's)",
        (["tests/test_hosts.py", "-k", "leaves_the_machines_own_runs"], []),
    ),
    M(
        "pods-entries-not-counted",
        "ebpf/pods/tc_pods.py",
        "        entries = self._entries - len(old) + len(backs)",
        "        entries = self._entries - len(old)",
        "one service-backend entry past --max-entries accepted, written past the map's end",
        (["tests/test_pods_fixtures.py", "-k", "clusters or reuse"], []),
    ),
    M(
        "pods-shrunk-slots-kept",
        "ebpf/pods/tc_pods.py",
        "        for i in range(len(backs), len(before)):",
        "        for i in range(len(backs) + 1, len(before)):",
        "a service that loses a backend keeps a slot naming it: the map fills with stale entries",
        (["tests/test_pods_fixtures.py", "-k", "reuse"], []),
    ),
    M(
        "pods-slot-by-wrong-count",
        "ebpf/pods/tc_pods.bpf.c",
        "struct svc_slot_key k = {.id = id, .slot = hash % count};",
        "struct svc_slot_key k = {.id = id, .slot = hash % (count + 1)};",
        "flows spread unevenly: slot 0 takes what falls past the service's backends",
        FIXTURES,
    ),
    M(
        "kube-proxy-probabilities",
        "lab/fastpaths/pods/kubeproxy.py",
        "        left = len(endpoints) - i  # 1/n",
        "        left = len(endpoints) - i + 1  # 1/n",
        "kube-proxy's iptables rules choose endpoints unevenly (1/(n+1) first): not what kube-proxy writes",
        (["tests/test_kubeproxy.py"], []),
    ),
    M(
        "kube-proxy-add-drops-services",
        "lab/fastpaths/pods/kubeproxy.py",
        "    keep = [service_rule(*s[:4]) for s in services if s[4]] + [NODEPORTS_RULE]",
        "    keep = [NODEPORTS_RULE]",
        "adding a service through kube-proxy's iptables rules cuts every other service off",
        (["tests/test_pods_peers.py"], []),
        nth=1,
    ),
    M(
        "kube-proxy-remove-leaves-its-chains",
        "lab/fastpaths/pods/kubeproxy.py",
        '*(f"-X {c}" for c in stale), "COMMIT"',
        '"COMMIT"',
        "a service removed through kube-proxy's partial sync leaves its chains (emptied) behind",
        (["tests/test_kubeproxy.py"], []),
    ),
]
