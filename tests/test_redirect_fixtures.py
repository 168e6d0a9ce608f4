"""xdp_redirect.bpf.c on the golden fixtures (tests/fixtures/redirect.py), through
BPF_PROG_TEST_RUN: verdict and output bytes, and the counters they land in."""

from collections import Counter

import pytest
from fixtures import redirect as fx
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from ebpf import XdpRedirect, testrun

PASS = fx.pass_fixtures()
FORWARD = fx.forward_fixtures_without_route()


@pytest.fixture(scope="module")
def redirect_pass():
    with XdpRedirect(fx.RULES, action="pass") as r:
        yield r


@pytest.fixture(scope="module")
def redirect_forward():
    with XdpRedirect(fx.RULES, action="forward") as r:
        yield r


def check(prog, f):
    fd = prog.load_program().fd
    data = bytes(f.frame)
    r = testrun.run(fd, data)
    want = data if f.expected is None else f.expected
    assert r.verdict == f.verdict, f.description
    assert r.data == want, (f.description, Ether(r.data).show2(dump=True), Ether(want).show2(dump=True))


@pytest.mark.parametrize("f", PASS, ids=[f.description for f in PASS])
def test_pass(redirect_pass, f):
    check(redirect_pass, f)


@pytest.mark.parametrize("f", FORWARD, ids=[f.description for f in FORWARD])
def test_forward_without_route(redirect_forward, f):
    check(redirect_forward, f)


def test_counters_are_exact():
    """Each fixture once: every frame in `seen`, in one verdict, and in the one
    counter its row names; per rule, packets and replies."""
    with XdpRedirect(fx.RULES, action="pass") as prog:
        fd = prog.load_program().fd
        for f in PASS:
            testrun.run(fd, bytes(f.frame))
        c = prog.counters()
        per_rule = prog.rule_counters()
    want = Counter(f.counted for f in PASS)
    assert c["seen"] == len(PASS) == c["pass"]
    for name in ("to_backend", "to_client", "not_ip", "unmatched", "fragment", "malformed"):
        assert c[name] == want[name], name
    assert sum(v["packets"] for v in per_rule.values()) == want["to_backend"]
    assert sum(v["reply_packets"] for v in per_rule.values()) == want["to_client"]

    def udp4(f, counted):
        return f.counted == counted and UDP in f.frame and IP in f.frame

    rule = per_rule[fx.RULES[0]]  # udp:VIP4:8080=BACKEND4:8083
    assert rule["packets"] == sum(udp4(f, "to_backend") for f in PASS) > 0
    assert rule["reply_packets"] == sum(udp4(f, "to_client") for f in PASS) > 0


def test_rules_change_live(redirect_pass):
    """Removing a rule stops its rewrite; adding it back restores it (same
    program: no reload)."""
    fd = redirect_pass.load_program().fd
    data = bytes(fx.U4)
    redirect_pass.remove_rule(fx.RULES[0])
    assert testrun.run(fd, data).data == data
    redirect_pass.add_rule(fx.RULES[0])
    assert testrun.run(fd, data).data == fx.to_backend(fx.U4)
    assert redirect_pass.load_program().fd == fd
