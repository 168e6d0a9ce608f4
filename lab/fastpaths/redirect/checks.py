"""What the suite and `make mutants` check of the XDP redirect, found through
its FastPath (lab.fastpath): how the one-exit check runs its programs, and
their mutants with the tests that must catch each."""

from lab.fastpath import ExitCheck
from lab.mutants import M

RULE = ["udp:198.18.0.17:8080=198.18.2.2:8083", "tcp:[2001:2::17]:80=[2001:2:0:2::2]:8080"]
EXITS = [
    ExitCheck("ebpf.redirect.xdp_redirect:XdpRedirect", {"rules": RULE, "action": "pass"}),
    ExitCheck("ebpf.redirect.tc_redirect:TcRedirect", {"rules": RULE, "action": "forward"}, hook="tc"),
]
REDIRECT = (
    ["tests/test_redirect_fixtures.py", "tests/test_partial_csum.py", "tests/test_one_exit.py"],
    ["tests/test_redirect.py", "tests/test_user_topologies.py", "tests/test_redirects.py"],
)

MUTANTS = [
    M(
        "redirect-v6-hop-limit-1",
        "ebpf/redirect/xdp_redirect.bpf.c",
        "if (ip6h->hop_limit <= 1) {",
        "if (ip6h->hop_limit < 1) {",
        "IPv6 with hop limit 1 forwarded instead of left to the kernel",
        REDIRECT,
    ),
    M(
        "redirect-v6-hop-limit-kept",
        "ebpf/redirect/xdp_redirect.bpf.c",
        "\t\tip6h->hop_limit--;",
        "\t\t;",
        "IPv6 forwarded without decrementing the hop limit",
        REDIRECT,
    ),
    M(
        "redirect-v4-ttl-1",
        "ebpf/redirect/xdp_redirect.bpf.c",
        "if (iph->ttl <= 1) {",
        "if (iph->ttl < 1) {",
        "IPv4 with TTL 1 forwarded instead of left to the kernel",
        REDIRECT,
    ),
    M(
        "redirect-reply-port",
        "ebpf/redirect/xdp_redirect.bpf.c",
        "rewrite_port(p.sport, to->port, &c);",
        "rewrite_port(p.dport, to->port, &c);",
        "replies keep the backend's port",
        REDIRECT,
    ),
    M(
        "redirect-v6-mtu",
        "ebpf/redirect/xdp_redirect.bpf.c",
        "fib.tot_len = bpf_ntohs(ip6h->payload_len) + sizeof(*ip6h);",
        "fib.tot_len = bpf_ntohs(ip6h->payload_len);",
        "IPv6 packets 40 bytes over the egress MTU forwarded",
        REDIRECT,
    ),
    M(
        "redirect-reply-key-port",
        "ebpf/redirect/redirect_match.h",
        "key->port = *p->sport;",
        "key->port = *p->dport;",
        "replies looked up by the wrong port",
        REDIRECT,
    ),
    M(
        "redirect-v6-rule-on-source",
        "ebpf/redirect/redirect_match.h",
        "__builtin_memcpy(key->addr, &p->ip6h->daddr, sizeof(key->addr));",
        "__builtin_memcpy(key->addr, &p->ip6h->saddr, sizeof(key->addr));",
        "IPv6 rules matched on the source",
        (["tests/test_redirect_fixtures.py", "tests/test_tc_redirect.py"], ["tests/test_redirect.py"]),
    ),
]
