"""lab.traffic.elephants: long TCP transfers with markers at known depths, for the IDS
experiment with a per-flow cutoff. Suricata reading them offline raises exactly their
truth; the vTAP's program with a 64 KiB cutoff copies the segment of the 32 KiB marker
and not the 512 KiB one's, as truth_within() says."""

import pytest
from conftest import require_tool
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether

from ebpf import TcMirror, testrun
from lab.daemons import suricata
from lab.traffic import attacks
from lab.traffic import elephants as el

MIRROR = 2**32 - 1  # VERDICT_MIRROR as the test run's u32 return value


def test_frames_are_whole_tcp_with_every_checksum_right():
    frames, truth = el.elephants(flows=2, size=600 << 10, seed=3)
    assert truth == {9100040: 2, 9100041: 2}
    for f in frames[:50] + frames[-10:]:
        p = Ether(f)
        q = p.copy()
        del q[IP].chksum, q[TCP].chksum
        assert bytes(Ether(bytes(q))) == f
    flags = [str(Ether(f)[TCP].flags) for f in frames]
    assert flags.count("S") == flags.count("SA") == 2 and flags.count("FA") == 4
    assert el.elephants(flows=2, size=600 << 10, seed=3)[0] == frames  # a seed gives the same traffic


def test_suricata_offline_raises_exactly_the_truth(tmp_path):
    require_tool("suricata")
    frames, truth = el.elephants(flows=3, size=1 << 20, seed=1)
    attacks.write_pcap(tmp_path / "e.pcap", frames)
    r = suricata.offline(tmp_path / "e.pcap", attacks.RULES, attacks.HOME_NET)
    assert r.alerts == truth == {9100040: 3, 9100041: 3}


@pytest.mark.parametrize(
    "cutoff, within", [(0, {9100040, 9100041}), (64 << 10, {9100040}), (1 << 20, {9100040, 9100041})]
)
def test_truth_within_a_cutoff(cutoff, within):
    assert set(el.truth_within(2, 1 << 20, cutoff)) == within


def test_the_cutoff_copies_the_markers_it_should():
    """Each elephant's frames through the TC vTAP's program with a 64 KiB cutoff: the
    32 KiB marker's segment copied, the 512 KiB one's cut, the FINs copied."""
    frames, _ = el.elephants(flows=2, size=600 << 10, seed=5)
    with TcMirror(monitor="lo", cutoff=64 << 10) as tap:
        fd = tap.load_program().fd
        copied = [testrun.run(fd, f, xdp=False).retval == MIRROR for f in frames]
    marks = {text: [i for i, f in enumerate(frames) if text in f] for text in el.MARK_TEXT.values()}
    assert [copied[i] for i in marks[b"VTL-BULK-MARK-32K"]] == [True, True]
    assert [copied[i] for i in marks[b"VTL-BULK-MARK-512K"]] == [False, False]
    fins = [i for i, f in enumerate(frames) if str(Ether(f)[TCP].flags) == "FA"]
    assert all(copied[i] for i in fins) and len(fins) == 4
    # the client's data: each flow's first ceil(64 KiB / MSS) segments, the one crossing the line
    # whole; the server's ACKs carry no payload, so their direction never reaches the cutoff
    data = [i for i, f in enumerate(frames) if Ether(f)[TCP].dport == el.PORT and len(Ether(f)[TCP].payload)]
    assert sum(copied[i] for i in data) == 2 * -(-(64 << 10) // attacks.MSS)
