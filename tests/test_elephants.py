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


def _client(f):
    return Ether(f)[IP].src if Ether(f)[IP].src.startswith("198.19.200.") else Ether(f)[IP].dst


def test_staggered_starts_are_the_same_frames_each_flow_in_order_starting_one_every_nth():
    mix = [i.to_bytes(2, "big") * 30 for i in range(300)]  # stand-ins for the attack mix's frames
    together, _ = el.elephants(flows=3, size=200 << 10, seed=4)
    out = el.staggered(mix, flows=3, size=200 << 10, seed=4)
    assert sorted(out) == sorted(mix + together)  # the same frames, nothing lost or made
    assert [f for f in out if len(f) == 60] == mix  # the mix's order kept
    big = [f for f in out if len(f) != 60]
    for i in range(3):
        client = f"198.19.200.{10 + i}"
        flow = [f for f in big if _client(f) == client]
        assert flow == [f for f in together if _client(f) == client]  # in the flow's own order
        # flow i begins i/3 of the way into the mix (within one frame)
        first = out.index(flow[0])
        assert abs(sum(len(f) == 60 for f in out[:first]) - 100 * i) <= 1
    assert out[-1] in together  # every flow ends with the mix


def test_paced_transfers_alternate_attackers_and_keep_their_pace(tmp_path):
    timed, bad = el.paced(attackers=3, benign=2, size=600 << 10, mbps=4.0, every=0.5, seed=2)
    assert bad == ["198.19.201.10", "198.19.201.12", "198.19.201.14"]  # a, b, a, b, a
    times = [t for t, _ in timed]
    assert times == sorted(times) and times[0] == 0.0
    for i in range(5):
        mine = [(t, f) for t, f in timed if f"198.19.201.{10 + i}" in (Ether(f)[IP].src, Ether(f)[IP].dst)]
        assert mine[0][0] == pytest.approx(0.5 * i)
        nbytes = sum(len(f) for _, f in mine[:-1])
        assert mine[-1][0] - mine[0][0] == pytest.approx(nbytes * 8 / 4e6)  # its own pace
        marked = any(el.MARK_TEXT[32 << 10] in f for _, f in mine)
        assert marked == (f"198.19.201.{10 + i}" in bad)
    n, size = el.write_timed_pcap(tmp_path / "p.pcap", timed)
    assert (n, size) == (len(timed), sum(len(f) for _, f in timed))
    frames, nb, longest = attacks.pcap_stats(tmp_path / "p.pcap")
    assert (frames, nb) == (n, size)


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
