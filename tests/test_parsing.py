"""Frames the parser must get right: malformed ones are neither dropped nor wrongly
mirrored; IPv4 options and fragments of a watched host are all mirrored."""

import struct

from helpers import RX4, UNWATCHED_SRC4, WATCHED_SRC4, frames_in, invariant
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6

from ebpf import TcMirror
from lab.traffic import Capture, ExactFrames, Flow, Marker, flow_frames, send_frames


def _eth(dst, src, ethertype):
    mac = lambda m: bytes.fromhex(m.replace(":", ""))  # noqa: E731
    return mac(dst) + mac(src) + struct.pack("!H", ethertype)


def malformed_frames(dst, src):
    """Each broken in one way; every address field that exists is a watched one."""
    good4 = bytes(IP(src=WATCHED_SRC4, dst=RX4) / UDP() / (b"m" * 30))
    good6 = bytes(IPv6(src="2001:2:0:1::10", dst="2001:2:0:1::2") / UDP() / (b"m" * 30))
    bad_ihl = bytearray(good4)
    bad_ihl[0] = 0x43  # version 4, IHL 3 (< 5 words)
    bad_version = bytearray(good4)
    bad_version[0] = 0x65  # IPv4 ethertype, version 6
    return {
        "ethernet only": [_eth(dst, src, 0x0800)],
        "truncated ipv4": [_eth(dst, src, 0x0800) + good4[:19]],
        "bad ihl": [_eth(dst, src, 0x0800) + bytes(bad_ihl)],
        "bad version": [_eth(dst, src, 0x0800) + bytes(bad_version)],
        "truncated ipv6": [_eth(dst, src, 0x86DD) + good6[:39]],
        "truncated vlan": [_eth(dst, src, 0x8100) + b"\x00\x64"],
        "vlan, truncated ipv4": [_eth(dst, src, 0x8100) + struct.pack("!HH", 100, 0x0800) + good4[:12]],
    }


def test_malformed_frames_pass_untouched_and_are_not_mirrored(tb1):
    """On the receiver's eth0 egress: a capture of outgoing frames on the same
    interface sees what left after the TC hook, so it proves nothing was dropped."""
    rx_mac, tx_mac = tb1.topo.mac("receiver", "eth0"), tb1.sender_mac
    frames = malformed_frames(tx_mac, rx_mac)
    reps = 20
    exact = ExactFrames(frames)
    with TcMirror(monitor="mon0", watch=["0.0.0.0/0", "::/0"], netns=tb1.ns("receiver")) as tap:
        tap.attach("eth0", "egress")
        at_monitor = frames_in(tb1.ns("monitor"), "eth0")
        with (
            Capture(tb1.ns("receiver"), "eth0", exact, direction="out") as left,
            Capture(tb1.ns("monitor"), "eth0", exact) as mon,
        ):
            send_frames(tb1.ns("receiver"), "eth0", [f for fs in frames.values() for f in fs] * reps)
        c = tap.counters()
    assert dict(left.counts) == {name: reps for name in frames}, "a malformed frame was dropped"
    assert sum(mon.counts.values()) == 0, f"malformed frames mirrored: {dict(mon.counts)}"
    assert c["malformed"] == reps * len(frames)
    assert c["matched"] == c["cloned"] == at_monitor() and invariant(c)  # no copy of any of them


def test_malformed_frames_mirrored_when_mirroring_everything(tb1):
    rx_mac, tx_mac = tb1.topo.mac("receiver", "eth0"), tb1.sender_mac
    frames = malformed_frames(tx_mac, rx_mac)
    exact = ExactFrames(frames)
    with TcMirror(monitor="mon0", watch=None, netns=tb1.ns("receiver")) as tap:
        tap.attach("eth0", "egress")
        at_monitor = frames_in(tb1.ns("monitor"), "eth0")
        arriving = {name: 1 for name in frames if name != "truncated vlan"}
        with Capture(tb1.ns("monitor"), "eth0", exact, expect=arriving, unseen=1) as mon:
            send_frames(tb1.ns("receiver"), "eth0", [f for fs in frames.values() for f in fs])
        c = tap.counters()
    # All are cloned, and every copy reaches the monitor's interface. The monitor host's own
    # receive path discards a frame whose VLAN tag is cut short before any capture sees it;
    # the rest arrive byte for byte.
    assert c["cloned"] == at_monitor() >= len(frames) and invariant(c)
    assert dict(mon.counts) == arriving


def test_ip_options_and_fragments(tb1):
    marker = Marker()
    opts = b"\x94\x04\x00\x00"  # Router Alert: IHL 6
    flows = {
        "options": Flow("options", WATCHED_SRC4, RX4, count=100, ip_options=opts),
        "frag watched": Flow("frag watched", WATCHED_SRC4, RX4, count=100, size=1000, fragment=256),
        "frag unwatched": Flow("frag unwatched", UNWATCHED_SRC4, RX4, count=100, size=1000, fragment=256),
    }
    frames = {name: flow_frames(f, marker, tb1.sender_mac, tb1.next_hop_mac) for name, f in flows.items()}
    assert frames["options"][0][14] == 0x46
    n_frags = len(frames["frag watched"])
    assert n_frags == 4 * 100  # 1000 B frames in 256 B fragments: every fragment must be mirrored
    exact = ExactFrames(frames)
    with TcMirror(monitor="mon0", watch=[f"{WATCHED_SRC4}/32"], match="src", netns=tb1.ns("receiver")) as tap:
        tap.attach("eth0", "ingress")
        with Capture(tb1.ns("receiver"), "eth0", exact) as rx, Capture(tb1.ns("monitor"), "eth0", exact) as mon:
            send_frames(tb1.ns("sender"), "eth0", [f for fs in frames.values() for f in fs], rate_pps=20000)
    assert dict(rx.counts) == {n: len(f) for n, f in frames.items()}
    assert dict(mon.counts) == {"options": 100, "frag watched": n_frags}
