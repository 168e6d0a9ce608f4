"""The kernel programs share their skeleton: one parse (parse_l4() of
include/parsing_helpers.h) and one exit (fp_exit() of include/verdict.h). So
the same frame is counted under the same reason in every program, whatever
each then does with it, and every program's own tally adds up: every frame in
`seen`, in one verdict and in one reason, on every path the fixtures take.

Frames run through BPF_PROG_TEST_RUN; the expected reasons come from what the
frames are (scapy builds them), not from the programs."""

import pytest
from fixtures.lb import Rig, lb_fixture_net
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from ebpf import testrun
from ebpf.program import REASONS, VERDICTS
from lab.fastpath import fastpaths

ETH = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
OTHER4, OTHER6 = "198.18.9.9", "2001:2:0:9::9"  # no rule, service or watch-list entry has these

# (what, frame, the reason every program must give it, does a TC test run take it)
FRAMES = [
    ("arp", Ether(src="02:00:00:00:00:01", dst="ff:ff:ff:ff:ff:ff") / ARP(pdst=OTHER4), "not_ip", True),
    ("an IPv4 header cut short", Raw(bytes(ETH / IP(src=OTHER4, dst=OTHER4) / UDP())[: 14 + 12]), "malformed", False),
    (
        "IPv4 with a header length below 5",
        Raw(bytes(ETH / IP(src=OTHER4, dst=OTHER4, ihl=4) / UDP(dport=7))),
        "malformed",
        False,
    ),
    (
        "IPv6 with more extension headers than are walked",
        ETH
        / IPv6(src=OTHER6, dst=OTHER6)
        / IPv6ExtHdrHopByHop()
        / IPv6ExtHdrHopByHop(nh=0)
        / IPv6ExtHdrHopByHop(nh=0)
        / IPv6ExtHdrHopByHop(nh=17)
        / UDP(dport=7),
        "malformed",
        True,
    ),
    (
        "a TCP header cut short",
        Raw(bytes(ETH / IP(src=OTHER4, dst=OTHER4) / TCP(dport=7))[: 14 + 20 + 10]),
        "malformed",
        True,
    ),
    ("a UDP fragment", ETH / IP(src=OTHER4, dst=OTHER4, flags="MF") / UDP(dport=7) / (b"f" * 24), "fragment", True),
    (
        "an IPv6 fragment",
        ETH / IPv6(src=OTHER6, dst=OTHER6) / IPv6ExtHdrFragment(m=1, nh=17) / UDP(dport=7),
        "fragment",
        True,
    ),
    ("icmp to nobody of ours", ETH / IP(src=OTHER4, dst=OTHER4) / ICMP(), "unmatched", True),
    ("udp to nobody of ours", ETH / IP(src=OTHER4, dst=OTHER4) / UDP(sport=1, dport=7) / b"x", "unmatched", True),
    ("tcp6 to nobody of ours", ETH / IPv6(src=OTHER6, dst=OTHER6) / TCP(dport=7), "unmatched", True),
]


def tally(prog, **kw):
    """The program's own tally, from its arrays (every name of verdict.h)."""
    e = prog.exits(**kw)
    assert e["seen"] == sum(e["verdict"].values()) == sum(e["reason"].values()), e
    assert all(e["dropped"][r] <= e["reason"][r] for r in REASONS), e
    undeclared = (
        {v for v, n in e["verdict"].items() if n and v not in prog.VERDICTS}
        | {r for r, n in e["reason"].items() if n and r not in prog.REASONS}
        | {r for r, n in e["dropped"].items() if n and r not in prog.DROPS}
    )
    assert not undeclared, f"{type(prog).__name__} counted {undeclared}, which its counters do not show"
    return e


def one_by_one(run, exits, frames):
    """Run each frame alone and return the reason and verdict it was counted under."""
    out = {}
    for what, frame, _, _ in frames:
        before = exits()
        run(bytes(frame))
        after = exits()
        reasons = [r for r in REASONS if after["reason"][r] != before["reason"][r]]
        verdicts = [v for v in VERDICTS if after["verdict"][v] != before["verdict"][v]]
        assert after["seen"] == before["seen"] + 1 and len(reasons) == len(verdicts) == 1, (what, reasons, verdicts)
        out[what] = (reasons[0], verdicts[0])
    return out


EXIT_CHECKS = [(fp.name, check) for fp in fastpaths() for check in fp.exit_checks()]


def expected(sees, reason):
    """The reason a program gives a frame, from the reason parse_l4() gives it
    and how far the program looks (ExitCheck.sees)."""
    if sees == "l4" or reason == "not_ip" or (sees == "ip" and reason == "malformed"):
        return reason
    return "unmatched"


@pytest.mark.parametrize(
    "check", [c for _, c in EXIT_CHECKS], ids=[f"{name}:{c.program.rpartition(':')[2]}" for name, c in EXIT_CHECKS]
)
def test_every_program_gives_a_frame_the_same_reason(check):
    """Every kernel program a bundle declares (FastPath.checks' EXITS) counts
    each odd frame under the reason every program gives it, as far as it looks
    (an IPv4 header cut short is `malformed` in the redirect and the load
    balancer alike; the LB once called it pass_not_ip), and passes it on
    untouched: none of it is any program's."""
    frames = FRAMES if check.hook == "xdp" else [f for f in FRAMES if f[3]]  # a TC test run refuses some
    with check.build() as prog:
        fd = (
            prog.load(check.function, "SCHED_CLS" if check.hook == "tc" else "XDP")
            if check.function
            else prog.load_program()
        ).fd
        got = one_by_one(
            lambda b: testrun.run(fd, b, xdp=check.hook == "xdp"), lambda: prog.exits(index=check.slot), frames
        )
        tally(prog, index=check.slot)
    assert {w: r for w, (r, _) in got.items()} == {w: expected(check.sees, r) for w, _, r, _ in frames}
    assert {v for _, v in got.values()} == {"pass"}


def test_every_program_of_every_bundle_is_checked():
    """A bundle's kernel programs (its program and variants) each have their
    one-exit run: a new fast path that declares none fails here, by name."""
    for fp in fastpaths():
        missing = {fp.program, *fp.variants} - {c.program for c in fp.exit_checks()}
        assert not missing, f"{fp.name}: no ExitCheck for {', '.join(sorted(missing))} (its checks module's EXITS)"


@pytest.fixture(scope="module")
def lb_net():
    with lb_fixture_net() as net:
        yield net


def test_a_service_frame_the_lb_cannot_forward_is_dropped_under_the_same_reason(lb_net):
    """What the LB drops to a VIP carries the reason any program gives that
    frame, and is counted once more in dropped_<reason>."""
    rig = Rig(lb_net)
    try:
        short = Raw(bytes(rig.from_client(TCP(sport=1, dport=80)))[: 14 + 20 + 10])
        frag = rig.from_client(UDP(sport=1, dport=80) / (b"f" * 24))
        frag[IP].flags = "MF"
        for frame, _reason in ((short, "malformed"), (frag, "fragment")):
            assert rig.run(frame).verdict == "XDP_DROP"
        c = rig.lb.counters()
        assert (c["malformed"], c["dropped_malformed"], c["fragment"], c["dropped_fragment"]) == (1, 1, 1, 1)
        assert c["drop"] == 2 == c["seen"]
        tally(rig.lb)
    finally:
        rig.close()
