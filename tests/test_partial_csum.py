"""Checksums a sender's TX offload left partial (every veth's default), through
the XDP redirect and the load balancer, on golden fixtures (BPF_PROG_TEST_RUN).

A partial field must leave finished when the frame leaves on XDP's own path
(native XDP_TX, XDP_REDIRECT: the receiver verifies it), and stay partial, for
the new addresses, when it leaves as an skb (XDP_PASS, generic mode: whoever
transmits it finishes it). The expected values come from tests/fixtures/partial.py,
which computes them from the RFCs with plain integers. Real traffic on default
offloads, judged by the receivers' kernels: tests/test_user_topologies.py.
"""

import pandas as pd
import pytest
from fixtures import redirect as rfx
from fixtures.lb import BE1, BE6, SELF4, SELF6, VIP, VIP6, Rig, lb_fixture_net
from fixtures.partial import as_partial, complete, field, is_partial, l4_valid, ones_sum, segment, with_field
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from ebpf import XdpRedirect, XdpSink, testrun
from ebpf.errors import InputError
from ebpf.lb.xdp_lb import XdpLoadBalancer
from lab import netns
from lab.bench import xdp_cost
from lab.topology import Topology
from lab.traffic.partial import partial

SIZES = [0, 1, 2, 3, 4, 5, 511, 512, 513, 1023, 1400]  # payload bytes: every tail a block can end in


@pytest.fixture(scope="module")
def lbnet():
    with lb_fixture_net() as t:
        yield t


def skb_mode(prog, on):
    t = prog.table("skb_mode")
    t[t.Key(0)] = t.Leaf(int(on))


# --- the benches' own partial frames ----------------------------------------------------


@pytest.mark.parametrize("name", ["udp4", "tcp4", "udp6", "tcp6"])
@pytest.mark.parametrize("size", [0, 1, 41, 1400])
def test_the_benches_make_partial_frames_as_the_rfcs_say(name, size):
    """lab.traffic.partial makes the frames the benches send as a sender with
    TX checksum offload (--sender-csum partial, xdp-cost): its field must be
    the pseudo-header's sum as computed here from the RFCs, with the carries
    folded back in (every one of these sums carries)."""
    l3 = (
        IP(src="198.18.255.254", dst="198.19.255.250")
        if name[-1] == "4"
        else IPv6(src="fdff:ffff:ffff::fffe", dst="fdff:ffff:ffff::fffa")
    )  # high words: the sums carry
    l4 = UDP(sport=40000, dport=8080) if name.startswith("udp") else TCP(sport=40000, dport=80, flags="PA")
    frame = bytes(rfx.eth() / l3 / l4 / Raw(b"q" * size))
    want = as_partial(frame)
    pseudo, _, _ = segment(frame)
    assert sum(pseudo[i] << 8 | pseudo[i + 1] for i in range(0, len(pseudo), 2)) > 0xFFFF  # it carries
    assert partial(frame) == want and is_partial(want)


# --- the redirect ------------------------------------------------------------------


def rfx_frames():
    pay = Raw(b"p" * 41)  # odd: the finish must handle a last lone byte
    return {
        "udp4": rfx.eth() / IP(src=rfx.CLIENT4, dst=rfx.VIP4) / UDP(sport=40000, dport=8080) / pay,
        "tcp4": rfx.eth() / IP(src=rfx.CLIENT4, dst=rfx.VIP4) / TCP(sport=40000, dport=80, flags="PA") / pay,
        "udp6": rfx.eth() / IPv6(src=rfx.CLIENT6, dst=rfx.VIP6) / UDP(sport=40000, dport=8080) / pay,
        "tcp6": rfx.eth() / IPv6(src=rfx.CLIENT6, dst=rfx.VIP6) / TCP(sport=40000, dport=80, flags="S") / pay,
    }


@pytest.mark.parametrize("name", ["udp4", "tcp4", "udp6", "tcp6"])
def test_redirect_pass_keeps_a_partial_checksum_partial_for_the_new_addresses(name):
    frame = rfx_frames()[name]
    with XdpRedirect(rfx.RULES, action="pass") as r:
        out = testrun.run(r.load_program().fd, as_partial(bytes(frame)))
        c = r.counters()
    want = as_partial(rfx.to_backend(frame))  # the rewrite, then the partial sum of its pseudo-header
    assert out.verdict == "XDP_PASS"
    assert out.data == want, name
    assert c["csum_partial"] == 1 and c["to_backend"] == 1


def test_redirect_reply_keeps_it_partial_too():
    reply = rfx.eth() / IP(src=rfx.BACKEND4, dst=rfx.CLIENT4) / UDP(sport=8083, dport=40000) / Raw(b"r" * 10)
    with XdpRedirect(rfx.RULES, action="pass") as r:
        out = testrun.run(r.load_program().fd, as_partial(bytes(reply)))
    assert out.data == as_partial(rfx.to_client(reply))


@pytest.fixture(scope="module")
def router():
    """A router namespace whose routes reach the fixtures' backend and client."""
    t = Topology("pcfx")
    t.add_host("dut", forwarding=True)
    t.add_host("be")
    t.add_host("cl")
    t.add_link(
        "dut", "cl", a_addrs=["198.18.1.2/24", "2001:2:0:1::2/64"], b_addrs=[f"{rfx.CLIENT4}/24", f"{rfx.CLIENT6}/64"]
    )
    t.add_link(
        "dut",
        "be",
        a_if="eth1",
        a_addrs=["198.18.2.1/24", "2001:2:0:2::1/64"],
        b_addrs=[f"{rfx.BACKEND4}/24", f"{rfx.BACKEND6}/64"],
    )
    with t:
        yield t


def run_forward(router, frame: bytes, generic=False):
    with XdpRedirect(rfx.RULES, action="forward", netns=router.ns("dut")) as r:
        fd = r.load_program().fd
        r._fill_egress()
        skb_mode(r, generic)
        with netns.entered(router.ns("dut")):
            out = testrun.run(fd, frame, ingress_ifindex=router.ifindex("dut", "eth0"))
        return out, r.counters()


@pytest.mark.parametrize("name", ["udp4", "tcp4", "udp6", "tcp6"])
def test_redirect_forward_finishes_a_partial_checksum(router, name):
    frame = rfx_frames()[name]
    out, c = run_forward(router, as_partial(bytes(frame)))
    assert out.verdict == "XDP_REDIRECT"
    got = Ether(out.data)
    assert (got.src, got.dst) == (router.mac("dut", "eth1"), router.mac("be", "eth0"))
    l3 = got[IP] if IP in got else got[IPv6]
    assert l3.dst in (rfx.BACKEND4, rfx.BACKEND6)
    assert l4_valid(out.data) and not is_partial(out.data)
    assert out.data == complete(out.data)
    assert c["csum_partial"] == 1 and c["redirect"] == 1


def test_redirect_forward_in_generic_mode_keeps_it_partial(router):
    """Generic mode: the skb goes on, flag and all: the field stays a partial sum."""
    frame = rfx_frames()["udp4"]
    out, _ = run_forward(router, as_partial(bytes(frame)), generic=True)
    assert out.verdict == "XDP_REDIRECT"
    assert is_partial(out.data)


def test_redirect_forward_leaves_a_whole_checksum_whole(router):
    frame = bytes(rfx_frames()["tcp4"])
    out, c = run_forward(router, frame)
    assert out.verdict == "XDP_REDIRECT" and l4_valid(out.data)
    assert c["csum_partial"] == 0


# --- the load balancer -------------------------------------------------------------


def test_lb_nat_finishes_partial_checksums_both_ways(lbnet):
    r = Rig(lbnet, services=("tcp", "udp"))
    try:
        for l4 in (TCP(sport=40000, dport=80, flags="S", seq=1), UDP(sport=40001, dport=80) / Raw(b"q" * 33)):
            syn = r.run(Ether(as_partial(bytes(r.from_client(l4)))))
            assert syn.verdict == "XDP_TX" and l4_valid(syn.data), l4
            out = Ether(syn.data)
            proto = TCP if TCP in out else UDP
            back = proto(sport=8080, dport=out[proto].sport) / Raw(b"a" * 7)
            if proto is TCP:
                back[TCP].flags, back[TCP].ack = "SA", 2
            reply = r.run(Ether(as_partial(bytes(r.from_backend(back, src=out[IP].dst)))))
            assert reply.verdict == "XDP_TX" and l4_valid(reply.data)
            assert Ether(reply.data)[IP].src == VIP
        assert r.lb.counters()["csum_partial"] == 4
    finally:
        r.close()


def test_lb_nat_ipv6_finishes_it(lbnet):
    r = Rig(lbnet)
    try:
        syn = r.run(Ether(as_partial(bytes(r.from_client(TCP(sport=40000, dport=80, flags="S"), v6=True)))))
        assert syn.verdict == "XDP_TX" and l4_valid(syn.data)
        assert Ether(syn.data)[IPv6].dst == BE6
    finally:
        r.close()


def test_lb_dsr_finishes_it_at_every_length(lbnet):
    """DSR changes no L4 field, yet XDP_TX drops the skb's flag: the finish is
    all that differs from the input, at payload lengths that end the sum in
    every kind of tail (blocks of 512, words of 4, 2 bytes, 1)."""
    r = Rig(lbnet, mode="dsr", services=("udp",))
    try:
        for size in SIZES:
            frame = bytes(r.from_client(UDP(sport=40000 + size, dport=80) / Raw((bytes(range(256)) * 6)[:size])))
            out = r.run(Ether(as_partial(frame)))
            assert out.verdict == "XDP_TX", size
            assert out.data[12:] == frame[12:], size  # whole again: the original's bytes, past the MACs
    finally:
        r.close()


def test_lb_a_udp_checksum_that_finishes_as_zero_is_sent_as_ffff(lbnet):
    """A computed UDP checksum of 0 goes out as 0xFFFF (RFC 768): 0 means none."""
    r = Rig(lbnet, mode="dsr", services=("udp",))
    try:
        base = bytes(r.from_client(UDP(sport=40000, dport=80) / Raw(b"\0\0" + b"z" * 8)))
        pseudo, seg, start = segment(with_field(base, 0))
        # payload's first word chosen so that the segment sums to all ones
        word = 0xFFFF - ones_sum(pseudo + seg)
        frame = base[: start + 8] + word.to_bytes(2, "big") + base[start + 10 :]
        assert complete(frame)[start + 6 : start + 8] == b"\xff\xff"
        out = r.run(Ether(as_partial(frame)))
        assert out.verdict == "XDP_TX" and field(out.data) == 0xFFFF
    finally:
        r.close()


def test_lb_generic_mode_keeps_it_partial(lbnet):
    r = Rig(lbnet)
    try:
        skb_mode(r.lb, True)
        syn = r.run(Ether(as_partial(bytes(r.from_client(TCP(sport=40000, dport=80, flags="S"))))))
        assert syn.verdict == "XDP_TX"
        out = Ether(syn.data)
        assert (out[IP].src, out[IP].dst) == (SELF4, BE1)
        assert is_partial(syn.data)  # for the new addresses: ports are not in it
    finally:
        r.close()


def test_lb_leaves_a_whole_checksum_whole(lbnet):
    r = Rig(lbnet)
    try:
        syn = r.run(r.from_client(TCP(sport=40000, dport=80, flags="S")))
        assert syn.verdict == "XDP_TX" and l4_valid(syn.data) and r.lb.counters()["csum_partial"] == 0
    finally:
        r.close()


def test_a_program_attached_in_one_mode_refuses_the_other(lbnet):
    lb = XdpLoadBalancer(self4=SELF4, self6=SELF6, netns=lbnet.ns("lb"))
    try:
        lb.add_service(f"tcp:{VIP}:80")
        lb.attach("eth0", "generic")
        assert lb.table("skb_mode")[0].value == 1
        with pytest.raises(InputError, match="one program runs in one XDP mode"):
            lb.attach("eth0", "native")
    finally:
        lb.close()
    _ = VIP6


def test_the_cost_bench_counts_every_frame_each_program_ran_on(tmp_path):
    """python -m lab bench xdp-cost: the kernel's run count of each program is
    exactly what the generator sent it, whole and partial alike."""
    df, path = xdp_cost.run(
        ["lb-nat", "xdp-forward", "floor", "nft-nat"],
        [64],
        ["whole", "partial"],
        trials=1,
        duration=0.5,
        rate=20000,
        out=tmp_path,
        progress=False,
    )
    assert len(df) == 7 and set(df["sender_csum"]) == {"whole", "partial"}  # nft-nat: whole only
    # Every frame sent is one the program ran on, or one the kernel counted lost on the
    # way to it: a veth ring full while the LB's NAPI thread waited for a CPU (a suite on
    # two cores lost 28 of 10000 there). Exact either way, and most frames ran.
    cols = ["program", "sender_csum", "sent_packets", "runs", "returned", "lost_before", "lost_after", "lost_at"]
    assert (df["runs"] + df["lost_before"] == df["sent_packets"]).all(), df[cols]
    assert (df["sent_packets"] > 0).all() and (df["runs"] > df["sent_packets"] / 2).all(), df[cols]
    # every program sends every frame back out of the LB's interface (the floor too: a
    # floor that passed frames up the stack would be no floor), but what the kernel
    # counted lost on the way back; the kernel's NAT (no program: its runs are the frames
    # it sent on) forwards them all
    assert (df["returned"] + df["lost_after"] == df["runs"]).all(), df[cols]
    assert ((df["lost_before"] + df["lost_after"] > 0) == (df["lost_at"] != "")).all(), df[cols]
    programs = df[df["program"] != "nft-nat"]
    assert (programs["ns_per_run"] > 0).all() and (programs["node_ns_per_packet"] > programs["ns_per_run"]).all()
    # the interface's NAPI thread did the kernel's forwarding too (else its time would be elsewhere)
    assert (df[df["program"] == "nft-nat"]["node_ns_per_packet"] > 0).all()
    assert pd.read_csv(path)["runs"].tolist() == df["runs"].tolist()


def test_the_floor_swaps_the_mac_addresses_and_sends_the_frame_back():
    """xdp-cost's floor (XdpSink("swap")): the two MACs swapped, nothing else, XDP_TX."""
    frame = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src=VIP, dst=BE1) / UDP() / Raw(b"x" * 18)
    with XdpSink("swap") as floor:
        r = testrun.run(floor.load(floor.FUNCTION, "XDP").fd, bytes(frame))
        assert floor.counters()["packets"] == 1
    assert r.verdict == "XDP_TX"
    back = frame.copy()
    back.src, back.dst = frame.dst, frame.src
    assert r.data == bytes(back)
