# ruff: noqa: E501 -- kube-proxy's expected rules, verbatim, one per line
"""kube-proxy's iptables mode as bench pods writes it (lab.fastpaths.pods.kubeproxy):
the text against kube-proxy's own expectations (pkg/proxy/iptables/proxier_test.go,
TestOverallIPTablesRules: its ClusterIP service ns1/svc1 and ns4/svc4's two endpoints,
the cluster CIDR 10.0.0.0/8), and the rules loaded by Debian's iptables-restore on both
backends in a namespace, where a connection to the cluster IP reaches an endpoint."""

import shutil
import socket
import threading

import pytest
from conftest import require_tool

from lab import netns
from lab.fastpaths.pods import kubeproxy
from lab.topology import Topology

# kube-proxy's expected nat-table lines for these services, as its test writes them
KUBE_PROXY_EXPECTS = """\
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -s 10.180.0.5 -j KUBE-MARK-MASQ
-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.5:80
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -s 10.180.0.4 -j KUBE-MARK-MASQ
-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.4:80
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.5:80" -j KUBE-SEP-C6EBXVWJJZMIWKLZ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ
"""
SERVICES = [
    ("ns1/svc1:p80", "172.30.0.41", 80, "tcp", ["10.180.0.1:80"]),
    ("ns4/svc4:p80", "172.30.0.44", 80, "tcp", ["10.180.0.4:80", "10.180.0.5:80"]),
]


def test_the_rules_are_kube_proxys_line_for_line():
    text = kubeproxy.restore_text(SERVICES, "10.0.0.0/8")
    lines = text.splitlines()
    assert lines[0] == "*nat" and lines[-1] == "COMMIT"
    rules = [ln for ln in lines if ln.startswith("-A ")]
    assert sorted(rules) == sorted(KUBE_PROXY_EXPECTS.splitlines())
    # every chain a rule is in, or jumps to, is declared (so created, and flushed, by the restore)
    declared = {ln[1:].split()[0] for ln in lines if ln.startswith(":")}
    used = {ln.split()[1] for ln in rules} | {ln.split(" -j ")[1].split()[0] for ln in rules}
    assert used - {"RETURN", "MARK", "MASQUERADE", "DNAT"} == declared
    # KUBE-SERVICES in kube-proxy's order: a service's rule where the service is, the
    # nodeports rule last
    svc_rules = [ln for ln in rules if ln.startswith("-A KUBE-SERVICES")]
    assert "172.30.0.41" in svc_rules[0] and "172.30.0.44" in svc_rules[1] and "KUBE-NODEPORTS" in svc_rules[-1]


@pytest.mark.parametrize("n, want", [(1, None), (2, ["0.5000000000"]), (3, ["0.3333333333", "0.5000000000"])])
def test_endpoints_are_chosen_by_kube_proxys_probabilities(n, want):
    _, rules = kubeproxy.service_rules("ns/s:p", "198.18.41.1", 80, "tcp", [f"198.18.40.{i}:80" for i in range(n)], "x")
    got = [r.split("--probability ")[1].split()[0] for r in rules if "--probability" in r]
    assert got == (want or [])


@pytest.mark.parametrize("backend", ["legacy", "nft"])
def test_debians_iptables_restore_loads_them_and_a_connection_reaches_an_endpoint(backend):
    """The rules for three services (the last the one used) loaded with iptables-<backend>-restore
    --noflush in a client namespace, with kube-proxy's jumps from the built-in chains; a
    connection to the cluster IP is DNATed to the endpoint's listener in the server's."""
    restore = f"iptables-{backend}-restore"
    require_tool(restore)
    t = Topology("kp")
    t.add_host("client")
    t.add_host("server")
    t.add_link("client", "server", a_addrs=["198.18.40.1/24"], b_addrs=["198.18.40.2/24"])
    with t:
        t.run("client", ["ip", "route", "add", "198.18.41.0/24", "via", "198.18.40.2"])
        services = [(f"ns{i}/svc{i}:p80", f"198.18.41.{i + 1}", 80, "tcp", ["198.18.40.2:8080"]) for i in range(3)]
        text = kubeproxy.restore_text(services, "198.18.40.0/24")
        r = netns.run(t.ns("client"), [restore, "--noflush"], input=text, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        ipt = shutil.which(f"iptables-{backend}")
        for chain, rule in kubeproxy.JUMPS:
            netns.run(t.ns("client"), [ipt, "-t", "nat", "-I", chain, *rule], check=True)
        saved = netns.run(t.ns("client"), [f"{ipt}-save", "-t", "nat"], capture_output=True, text=True).stdout
        assert saved.count("-j KUBE-SEP-") == 3 and "KUBE-SVC-" in saved
        got = []
        with netns.entered(t.ns("server")):
            srv = socket.create_server(("198.18.40.2", 8080))

        def accept():
            c, peer = srv.accept()
            got.append(peer[0])
            c.close()

        th = threading.Thread(target=accept)
        th.start()
        with netns.entered(t.ns("client")):
            with socket.create_connection(("198.18.41.3", 80), timeout=5):
                pass
        th.join(timeout=5)
        srv.close()
        assert got == ["198.18.40.1"]  # from inside the cluster CIDR: not masqueraded
        # the service used, removed as kube-proxy's partial sync removes one: its chains
        # gone, the others' kept; then everything of ours emptied and deleted in one restore
        r = netns.run(
            t.ns("client"),
            [restore, "--noflush"],
            input=kubeproxy.remove_text(services[:2], services[2], "198.18.40.0/24"),
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        saved = netns.run(t.ns("client"), [f"{ipt}-save", "-t", "nat"], capture_output=True, text=True).stdout
        kept = [kubeproxy.svc_chain(s[0], "tcp") for s in services[:2]]
        assert saved.count("-j KUBE-SEP-") == 2 and all(f":{c} " in saved for c in kept), saved
        assert kubeproxy.svc_chain(services[2][0], "tcp") not in saved and "198.18.41.3" not in saved
        for chain, rule in kubeproxy.JUMPS:
            netns.run(t.ns("client"), [ipt, "-t", "nat", "-D", chain, *rule], check=True)
        ours = [ln[1:].split()[0] for ln in saved.splitlines() if ln.startswith(":KUBE-")]
        r = netns.run(
            t.ns("client"), [restore, "--noflush"], input=kubeproxy.teardown_text(ours), capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        saved = netns.run(t.ns("client"), [f"{ipt}-save", "-t", "nat"], capture_output=True, text=True).stdout
        assert "KUBE-" not in saved, saved
