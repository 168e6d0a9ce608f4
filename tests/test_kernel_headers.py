"""The shared C headers (ebpf/include): parsing, checksums and rewriting, through
a small XDP program run on frames built with scapy (BPF_PROG_TEST_RUN). Every
rewritten frame must carry the checksums scapy computes from scratch."""

import ipaddress
import struct

import pytest
from bcc import BPF
from scapy.layers.inet import IP, TCP, UDP, IPOption_RR
from scapy.layers.inet6 import IPv6, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop
from scapy.layers.l2 import Dot1AD, Dot1Q, Ether
from scapy.packet import Raw

import ebpf
from ebpf import BpfProgram, testrun

NEW4, NEW6, NEW_PORT = "198.18.7.7", "2001:2:0:7::7", 8083

# Rewrites the destination of every TCP/UDP packet to NEW:NEW_PORT and
# decrements the TTL / hop limit, then returns XDP_TX; passes what it must not
# touch (not IP, fragments, other protocols); drops what it cannot parse.
PROGRAM = r"""
#include <uapi/linux/bpf.h>
#include "parsing_helpers.h"
#include "rewrite_helpers.h"

int rewrite(struct xdp_md *ctx)
{
	void *data_end = (void *)(long)ctx->data_end;
	struct hdr_cursor nh = {.pos = (void *)(long)ctx->data};
	struct ethhdr *eth;
	struct iphdr *iph;
	struct ipv6hdr *ip6h;
	struct udphdr *udph;
	struct tcphdr *tcph;
	__sum16 *l4csum;
	__be16 *dport;
	int l4, proto = parse_ethhdr(&nh, data_end, &eth);

	if (proto == bpf_htons(ETH_P_IP)) {
		l4 = parse_iphdr(&nh, data_end, &iph);
		if (l4 < 0)
			return XDP_DROP;
		if (ip_is_fragment(iph))
			return XDP_PASS;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		l4 = parse_ip6hdr(&nh, data_end, &ip6h);
		if (l4 < 0)
			return XDP_DROP;
		l4 = skip_ip6hdrext(&nh, data_end, l4);
		if (l4 < 0)
			return XDP_DROP;
	} else {
		return proto < 0 ? XDP_DROP : XDP_PASS;
	}
	if (l4 == IPPROTO_UDP) {
		if (parse_udphdr(&nh, data_end, &udph) < 0)
			return XDP_DROP;
		l4csum = &udph->check;
		dport = &udph->dest;
	} else if (l4 == IPPROTO_TCP) {
		if (parse_tcphdr(&nh, data_end, &tcph) < 0)
			return XDP_DROP;
		l4csum = &tcph->check;
		dport = &tcph->dest;
	} else {
		return XDP_PASS;
	}
	/* whole checksums here (tests/test_partial_csum.py has the partial ones) */
	struct l4csum c = {.field = l4csum, .udp = l4 == IPPROTO_UDP};

	if (proto == bpf_htons(ETH_P_IP)) {
		rewrite_ipv4_addr(iph, &iph->daddr, NEW4, &c);
		ip_decrease_ttl(iph);
	} else {
		struct in6_addr to = {.in6_u.u6_addr32 = {NEW6_0, NEW6_1, NEW6_2, NEW6_3}};
		rewrite_ipv6_addr(&ip6h->daddr, &to, &c);
		ip6h->hop_limit--;
	}
	rewrite_port(dport, bpf_htons(NEW_PORT), &c);
	return XDP_TX;
}
"""


class Rewrite(BpfProgram):
    def __init__(self, source):
        v6 = struct.unpack("<4I", ipaddress.ip_address(NEW6).packed)  # network order, as the C reads it
        v4 = struct.unpack("<I", ipaddress.ip_address(NEW4).packed)[0]
        super().__init__(
            [f"-DNEW4={v4}", f"-DNEW_PORT={NEW_PORT}"] + [f"-DNEW6_{i}={w}" for i, w in enumerate(v6)], source
        )


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    src = tmp_path_factory.mktemp("headers") / "rewrite.bpf.c"
    src.write_text(PROGRAM)
    with Rewrite(src) as p:
        yield p.load("rewrite", "XDP").fd


def eth():
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def expected(frame, ip_version):
    """What the program must make of `frame`: scapy's own rewrite, with every
    length and checksum recomputed from scratch (a UDP checksum of 0 kept)."""
    p = frame.copy()
    l3 = p[IP] if ip_version == 4 else p[IPv6]
    l4 = p[UDP] if UDP in p else p[TCP]
    if ip_version == 4:
        l3.dst, l3.ttl = NEW4, l3.ttl - 1
        del l3.chksum
    else:
        l3.dst, l3.hlim = NEW6, l3.hlim - 1
    zero = UDP in p and p[UDP].chksum == 0
    l4.dport = NEW_PORT
    if not zero:
        del l4.chksum
    return bytes(p.__class__(bytes(p)))  # built twice: checksums filled in


PAYLOAD = Raw(b"x" * 32)

REWRITTEN = [
    ("udp4", eth() / IP(src="198.18.1.10", dst="198.18.0.17") / UDP(sport=40000, dport=8080) / PAYLOAD, 4),
    (
        "udp4 checksum 0 stays 0",
        eth() / IP(src="198.18.1.10", dst="198.18.0.17") / UDP(sport=40000, dport=8080, chksum=0) / PAYLOAD,
        4,
    ),
    (
        "tcp4 with options",
        eth()
        / IP(src="198.18.1.10", dst="198.18.0.17")
        / TCP(sport=40000, dport=8080, flags="S", options=[("MSS", 1460), ("SAckOK", b""), ("WScale", 7)]),
        4,
    ),
    (
        "ipv4 options",
        eth()
        / IP(src="198.18.1.10", dst="198.18.0.17", options=[IPOption_RR(routers=["0.0.0.0"] * 3)])
        / UDP(sport=1, dport=8080)
        / PAYLOAD,
        4,
    ),
    ("802.1Q", eth() / Dot1Q(vlan=100) / IP(src="198.18.1.10", dst="198.18.0.17") / UDP(dport=8080) / PAYLOAD, 4),
    (
        "QinQ",
        eth() / Dot1AD(vlan=10) / Dot1Q(vlan=20) / IP(src="198.18.1.10", dst="198.18.0.17") / TCP(dport=8080) / PAYLOAD,
        4,
    ),
    ("udp6", eth() / IPv6(src="2001:2:0:1::10", dst="2001:2::17") / UDP(sport=40000, dport=8080) / PAYLOAD, 6),
    ("tcp6", eth() / IPv6(src="2001:2:0:1::10", dst="2001:2::17") / TCP(sport=40000, dport=8080) / PAYLOAD, 6),
    (
        "ipv6 hop-by-hop",
        eth() / IPv6(src="2001:2:0:1::10", dst="2001:2::17") / IPv6ExtHdrHopByHop() / UDP(dport=8080) / PAYLOAD,
        6,
    ),
]


@pytest.mark.parametrize("name, frame, version", REWRITTEN, ids=[r[0] for r in REWRITTEN])
def test_rewrite_keeps_every_checksum(prog, name, frame, version):
    r = testrun.run(prog, bytes(frame))
    assert r.verdict == "XDP_TX"
    assert r.data == expected(frame, version), (
        Ether(r.data).show2(dump=True),
        Ether(expected(frame, version)).show2(dump=True),
    )


def test_udp_checksum_that_comes_out_zero_is_sent_as_ffff(prog):
    """RFC 768: a computed UDP checksum of 0 is sent as 0xFFFF (0 means 'none').
    The payload word is chosen to make the rewritten datagram's sum come out so:
    the checksum is ~(S + w), so w = 0xFFFF - S, S being the sum without it."""

    def frame_with(word):
        return (
            eth()
            / IP(src="198.18.1.10", dst="198.18.0.17")
            / UDP(sport=40000, dport=8080)
            / Raw(word.to_bytes(2, "big"))
        )

    s = ~Ether(expected(frame_with(0), 4))[UDP].chksum & 0xFFFF
    frame = frame_with((0xFFFF - s) % 0xFFFF)
    want = expected(frame, 4)
    assert Ether(want)[UDP].chksum == 0xFFFF, "the payload did not make the case"
    r = testrun.run(prog, bytes(frame))
    assert Ether(r.data)[UDP].chksum == 0xFFFF and r.data == want


# --- the incremental update's arithmetic, where it is easy to get wrong ---------------
# A second implementation of csum_replace4 (RFC 1624, eqn. 3) as the program computes
# it: 16-bit words as a little-endian CPU loads them from network order, the sum folded
# until no carry is left. It is used only to choose payloads that make the rare cases;
# the verdict is still scapy's checksum from scratch.


def _swap(w):
    return ((w & 0xFF) << 8) | (w >> 8)


def _replace4_sum(check_be, old_addr, new_addr):
    """The unfolded sum csum_replace4() makes for a UDP checksum `check_be`
    (as on the wire) when an IPv4 address changes."""
    old = int.from_bytes(ipaddress.ip_address(old_addr).packed, "little")
    new = int.from_bytes(ipaddress.ip_address(new_addr).packed, "little")
    return (
        ((~_swap(check_be)) & 0xFFFF)
        + ((~(old >> 16)) & 0xFFFF)
        + ((~(old & 0xFFFF)) & 0xFFFF)
        + (new >> 16)
        + (new & 0xFFFF)
    )


def _fold(s):
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def _udp4_with_word(word):
    return (
        eth()
        / IP(src="198.18.1.10", dst="198.18.0.17")
        / UDP(sport=40000, dport=8080)
        / Raw(word.to_bytes(2, "big") + b"x" * 6)
    )


def _payload_where(condition):
    """The first payload word for which condition(sum csum_replace4 makes) holds,
    for the destination address rewrite of _udp4_with_word(); the frame."""
    base = Ether(bytes(_udp4_with_word(0)))[UDP].chksum
    rest = (~base) & 0xFFFF  # the datagram's sum without the word
    for word in range(0x10000):
        check = (~_fold(rest + word)) & 0xFFFF or 0xFFFF
        if condition(_replace4_sum(check, "198.18.0.17", NEW4)):
            frame = _udp4_with_word(word)
            assert Ether(bytes(frame))[UDP].chksum == check, "the model disagrees with scapy"
            return frame
    raise AssertionError("no payload makes the case")


def test_an_update_whose_sum_carries_twice_is_folded_to_the_end(prog):
    """A sum whose first fold carries again: folded once, the carry is lost."""
    frame = _payload_where(lambda s: (s & 0xFFFF) + (s >> 16) > 0xFFFF)
    r = testrun.run(prog, bytes(frame))
    assert r.verdict == "XDP_TX" and r.data == expected(frame, 4)


def test_a_udp_checksum_that_is_zero_between_two_rewrites_is_not_taken_for_none(prog):
    """The address rewrite makes the UDP checksum 0: it must become 0xFFFF, or the
    port rewrite that follows takes the datagram for one without a checksum and
    leaves it 0 (the receiver then checks nothing)."""
    frame = _payload_where(lambda s: (~_fold(s)) & 0xFFFF == 0)
    r = testrun.run(prog, bytes(frame))
    assert r.verdict == "XDP_TX" and r.data == expected(frame, 4)
    assert Ether(r.data)[UDP].chksum != 0


UNTOUCHED = [
    ("arp", Ether(src="02:00:00:00:00:01", dst="ff:ff:ff:ff:ff:ff", type=0x0806) / Raw(b"\x00" * 28), "XDP_PASS"),
    (
        "ipv4 fragment (not the first)",
        eth() / IP(src="198.18.1.10", dst="198.18.0.17", frag=10, proto=17) / Raw(b"y" * 40),
        "XDP_PASS",
    ),
    (
        "ipv4 first fragment (MF)",
        eth() / IP(src="198.18.1.10", dst="198.18.0.17", flags="MF") / UDP(dport=8080) / Raw(b"y" * 40),
        "XDP_PASS",
    ),
    (
        "ipv6 fragment",
        eth() / IPv6(src="2001:2:0:1::10", dst="2001:2::17") / IPv6ExtHdrFragment(m=1) / UDP(dport=8080) / PAYLOAD,
        "XDP_PASS",
    ),
    ("icmp", eth() / IP(src="198.18.1.10", dst="198.18.0.17", proto=1) / Raw(b"\x08\x00" + b"\x00" * 30), "XDP_PASS"),
    # (a frame shorter than an Ethernet header: BPF_PROG_TEST_RUN refuses it, as a NIC would)
    (
        "truncated vlan tag",
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02", type=0x8100) / Raw(b"\x00\x64\x08"),
        "XDP_DROP",
    ),
    (
        "truncated ipv4",
        bytes(eth() / IP(src="198.18.1.10", dst="198.18.0.17") / UDP(dport=8080))[: 14 + 12],
        "XDP_DROP",
    ),
    (
        "ipv4 options cut short",
        bytes(eth() / IP(src="198.18.1.10", dst="198.18.0.17", options=[IPOption_RR(routers=["0.0.0.0"] * 8)]))[
            : 14 + 30
        ],
        "XDP_DROP",
    ),
    ("ihl below 5", bytes(eth() / IP(src="198.18.1.10", dst="198.18.0.17", ihl=4) / UDP(dport=8080)), "XDP_DROP"),
    (
        "truncated udp",
        bytes(eth() / IP(src="198.18.1.10", dst="198.18.0.17") / UDP(dport=8080))[: 14 + 20 + 6],
        "XDP_DROP",
    ),
    (
        "udp length below its own header",
        eth() / IP(src="198.18.1.10", dst="198.18.0.17") / UDP(dport=8080, len=7) / PAYLOAD,
        "XDP_DROP",
    ),
    (
        "tcp doff beyond the frame",
        bytes(eth() / IP(src="198.18.1.10", dst="198.18.0.17") / TCP(dport=8080, dataofs=15)),
        "XDP_DROP",
    ),
]


@pytest.mark.parametrize("name, frame, verdict", UNTOUCHED, ids=[r[0] for r in UNTOUCHED])
def test_what_must_not_be_touched_is_not(prog, name, frame, verdict):
    data = bytes(frame)
    r = testrun.run(prog, data)
    assert r.verdict == verdict and r.data == data


# Each program class, built as its smallest user would (the arguments it cannot do without).
PROGRAMS = {
    "TcMirror": lambda: ebpf.TcMirror(monitor="lo"),
    "XdpMirror": lambda: ebpf.XdpMirror(monitor="lo"),
    "SessionMirror": lambda: ebpf.SessionMirror([ebpf.Session(target="lo")]),
    "XdpRedirect": lambda: ebpf.XdpRedirect(),
    "TcRedirect": lambda: ebpf.TcRedirect(),
    "XdpLoadBalancer": lambda: ebpf.XdpLoadBalancer(),
    "TcLoadBalancer": lambda: ebpf.TcLoadBalancer(),
    "XdpPortFilter": lambda: ebpf.XdpPortFilter(["udp:9"]),
    "TcPods": lambda: ebpf.TcPods(),
    "XdpSink": lambda: ebpf.XdpSink(),
    "XdpGen": lambda: ebpf.XdpGen(),
    "XdpPeerPass": lambda: ebpf.XdpPeerPass(),
    "TcSwap": lambda: ebpf.TcSwap(),
}
# Kernel headers (not uapi) a program may name: linux/socket.h is entered and
# skipped by its guard (parsing_helpers.h), linux/in6.h is a few lines.
KERNEL_OWN_ALLOWED = {"include/linux/socket.h", "include/linux/in6.h"}


def test_every_program_class_is_in_the_header_check():
    classes = {
        n
        for n in ebpf.__all__
        if isinstance(getattr(ebpf, n), type) and issubclass(getattr(ebpf, n), BpfProgram) and n != "BpfProgram"
    }
    assert classes == set(PROGRAMS), "add the new program class to PROGRAMS"


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_compile_reads_uapi_headers_not_the_kernels_own(name, capfd):
    """BCC puts the kernel's include/ before include/uapi, so a uapi header that
    includes <linux/socket.h> (in.h, tcp.h) got the kernel's own, and through it
    199 headers of the kernel into every compile, two thirds of its time. clang's
    -H lists every header a compile opens."""
    prog = PROGRAMS[name]()
    capfd.readouterr()
    bpf = BPF(text=prog.c_text().encode(), cflags=[*prog.cflags, "-H"])
    bpf.cleanup()
    listed = [
        ln.split(" ", 1)[1].strip()
        for ln in capfd.readouterr().err.splitlines()
        if ln.startswith(".") and " " in ln and set(ln.split(" ", 1)[0]) == {"."}
    ]
    assert listed, "clang -H listed no header: the check would pass on anything"
    kernel_own = {
        h
        for h in listed
        if "/uapi/" not in h and not h.startswith(("include/uapi/", "/virtual/")) and "/ebpf/" not in h
    }
    assert kernel_own <= KERNEL_OWN_ALLOWED, sorted(kernel_own)[:10]
