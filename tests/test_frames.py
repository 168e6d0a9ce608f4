"""lab.traffic's frame builder: a flow's frames after the first are that frame's
bytes with the sequence number and checksums written again. They must be byte
for byte what scapy builds for each (no namespace needed: pure bytes)."""

import struct

import pytest

from lab.traffic import Flow, Marker
from lab.traffic.frames import flow_frames, scapy_flow_frames

MACS = ("02:00:00:00:00:01", "02:00:00:00:00:02")
FLOWS = [
    Flow("udp4", "198.18.1.10", "198.18.0.17", count=300),
    Flow("tcp4", "198.18.1.10", "198.18.0.17", "tcp", count=300, size=1518),
    Flow("raw4", "198.18.1.10", "198.18.0.17", "raw", count=50),
    Flow("udp6", "2001:2:0:1::10", "2001:2::17", count=300, size=64),
    Flow("tcp6", "2001:2:0:1::10", "2001:2::17", "tcp", count=300, size=900),
    Flow("raw6", "2001:2:0:1::10", "2001:2::17", "raw", count=50),
    Flow("qinq-tcp4", "198.18.1.10", "198.18.0.17", "tcp", count=100, vlans=((0x88A8, 10), (0x8100, 20))),
    Flow("vlan-udp6", "2001:2:0:1::10", "2001:2::17", count=100, vlans=((0x8100, 100),)),
    Flow("options-udp4", "198.18.1.10", "198.18.0.17", count=100, ip_options=b"\x07\x07\x04" + b"\0" * 4),
    Flow("id-wraps-udp4", "198.18.1.10", "198.18.0.17", count=65_540, size=60),
    Flow("odd-udp4", "198.18.1.10", "198.18.0.17", count=20, size=101),
]


@pytest.mark.parametrize("flow", FLOWS, ids=[f.name for f in FLOWS])
def test_every_frame_is_what_scapy_builds(flow):
    marker = Marker()
    fast = flow_frames(flow, marker, *MACS)
    # scapy takes 1/3 ms a frame: all of a short flow, and of the long one its first
    # frames, the IPv4 id's wrap and its last
    seqs = sorted({*range(min(flow.count, 300)), *range(65_530, min(flow.count, 65_540)), flow.count - 1})
    slow = scapy_flow_frames(flow, marker, *MACS, seqs=seqs)
    assert len(fast) == flow.count
    differ = [seq for seq, b in zip(seqs, slow, strict=True) if fast[seq] != b]
    assert not differ, f"frames {differ[:5]} differ from scapy's"
    assert len(set(fast)) == flow.count  # each its own sequence number


@pytest.mark.parametrize("v6", [False, True], ids=["udp4", "udp6"])
def test_a_udp_checksum_that_sums_to_zero_is_sent_as_ffff(v6):
    """The one frame in 65536 whose UDP sum is 0: scapy sends 0xFFFF, so must we.
    The source port is chosen so that frame 1's sum is 0."""
    src, dst = ("2001:2:0:1::10", "2001:2::17") if v6 else ("198.18.1.10", "198.18.0.17")
    l4 = 14 + (40 if v6 else 20)
    marker = Marker()
    probe = scapy_flow_frames(Flow("p", src, dst, sport=0, count=2), marker, *MACS)[1]
    (ck,) = struct.unpack_from("!H", probe, l4 + 6)  # with port 0; port `ck` completes the sum to all ones
    flow = Flow("p", src, dst, sport=ck, count=2)
    fast, slow = flow_frames(flow, marker, *MACS), scapy_flow_frames(flow, marker, *MACS)
    assert struct.unpack_from("!H", slow[1], l4 + 6)[0] == 0xFFFF  # the case is hit
    assert fast == slow
