"""What the suite and `make mutants` check of the port filter, found through
its FastPath (lab.fastpath): how the one-exit check runs its program, and its
mutants with the tests that must catch each."""

from lab.fastpath import ExitCheck
from lab.mutants import M

EXITS = [ExitCheck("ebpf.port_filter.xdp_port_filter:XdpPortFilter", {"ports": ["udp:9", "tcp:23"]})]

TESTS = (["tests/test_port_filter.py", "-k", "fixture or exit"], ["tests/test_port_filter.py"])
MUTANTS = [
    M(
        "port-filter-source-port",
        "ebpf/port_filter/xdp_port_filter.bpf.c",
        "key.port = bpf_ntohs(*p.dport);",
        "key.port = bpf_ntohs(*p.sport);",
        "frames dropped by their source port, not their destination",
        TESTS,
    ),
    M(
        "port-filter-passes",
        "ebpf/port_filter/xdp_port_filter.bpf.c",
        "return xdp_exit(&st->exits, XDP_DROP, R_FILTERED);",
        "return xdp_exit(&st->exits, XDP_PASS, R_FILTERED);",
        "a listed port counted as filtered but passed",
        TESTS,
    ),
]
