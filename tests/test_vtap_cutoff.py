"""The vTAP's per-flow cutoff (ebpf/vtap/cutoff.h) at the TC hook: its boundaries through
BPF_PROG_TEST_RUN on the program TcMirror loads (the action path: a run that returns
VERDICT_MIRROR is a frame the filter's mirred action copies), the table's eviction and
idle expiry, the live API; then real TCP through a tap on a testbed."""

import socket
import threading
import time

import pytest
from fixtures import cutoff as fx
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from ebpf import InputError, TcMirror, netdev, testrun
from ebpf.vtap.cutoff import parse_size
from lab.traffic import Capture

MIRROR = 2**32 - 1  # VERDICT_MIRROR (-1) as the test run's u32 return value
ENDS = fx.Ends("198.18.1.10", "198.18.2.2", "2001:2:0:1::10", "2001:2:0:2::2")
LO = 1  # a test run's skb comes in on lo: that counter slot


def tc_tap(**kw):
    """A TcMirror loaded in this namespace, attached nowhere (the test runs hand it frames)."""
    tap = TcMirror(monitor="lo", **kw)
    tap.load_program()
    tap._note_slot(LO, "lo")  # counted as if attached there
    return tap


def sender(tap):
    fd = tap.load_program().fd
    return lambda frame: testrun.run(fd, frame, xdp=False).retval == MIRROR


def test_every_boundary_exactly():
    """Each scenario's every segment copied or cut as fixtures/cutoff.py says, and the
    counters exact: frames and bytes cut, ends copied past the cut, flows made, ended
    and started over."""
    with tc_tap(cutoff=fx.CUT) as tap:
        got = fx.run(fx.SCENARIOS, sender(tap), ENDS)
        c = tap.counters()
        e = tap.exits(index=LO)
    assert got == fx.want(fx.SCENARIOS)
    cut_frames = [f for sc in fx.SCENARIOS for f, copied in fx.frames(sc, ENDS, 0) if not copied]
    assert c["cut"] == e["reason"]["cut"] == len(cut_frames) == sum(sc.cut for sc in fx.SCENARIOS)
    assert c["cut_bytes"] == sum(map(len, cut_frames))
    assert c["ends_copied"] == sum(sc.ends_copied for sc in fx.SCENARIOS)
    assert c["flows_new"] == len(fx.SCENARIOS) + 1  # "fins" makes its flow again after it ended
    assert c["flows_ended"] == 2 and c["flows_restarted"] == 1  # fins and rst; syn-again
    remembered = len(fx.SCENARIOS) + 1 - 2
    assert c["flows"] == remembered and c["evicted"] == 0
    assert c["matched"] == c["seen"] == c["cloned"] + c["cut"]
    assert c["uncut_fragment"] == c["uncut_no_ports"] == c["uncut_malformed"] == 0


def test_frames_without_a_flow_are_copied_and_counted_by_reason():
    with tc_tap(cutoff=1) as tap:
        send = sender(tap)
        frames = fx.no_flow_frames(ENDS)
        assert all(send(f) for _, f in frames for _ in range(3))
        # a TCP header cut short: copied (the vTAP copies what it cannot parse past IP)
        short = bytes(Ether() / IP(src=ENDS.client4, dst=ENDS.server4, proto=6) / Raw(b"t" * 8))
        assert send(short)
        c = tap.counters()
    assert c["uncut_fragment"] == 6 and c["uncut_no_ports"] == 6 and c["uncut_malformed"] == 1
    assert c["flows_new"] == c["cut"] == 0


def test_a_full_table_evicts_and_an_evicted_flow_starts_from_zero():
    """flows=8: 200 flows later, the first (past its cut, then idle) is gone from the
    table, so its next segment is copied again; what was evicted is made less ended
    less held."""
    with tc_tap(cutoff=100, flows=8) as tap:
        send = sender(tap)
        first = fx.Scenario("first", [(fx.data(100), True), (fx.data(1), False)])
        assert fx.run([first], send, ENDS, first_port=30000) == fx.want([first])
        others = [fx.Scenario(f"f{i}", [(fx.data(10), True)]) for i in range(200)]
        fx.run(others, send, ENDS, first_port=31000)
        again = fx.Scenario("again", [(fx.data(1), True)])
        assert fx.run([again], send, ENDS, first_port=30000) == fx.want([again])
        c = tap.counters()
    assert c["flows_new"] == 202 and c["flows_ended"] == 0
    assert 1 <= c["flows"] <= 8 and c["evicted"] == 202 - c["flows"]


def test_an_idle_flow_starts_again_after_its_timeout():
    with tc_tap(cutoff=100, flow_timeout=0.2) as tap:
        send = sender(tap)
        sc = fx.Scenario("idle", [(fx.data(100), True), (fx.data(1), False)])
        assert fx.run([sc], send, ENDS) == fx.want([sc])
        time.sleep(0.3)
        assert fx.run([sc], send, ENDS) == fx.want([sc])  # from zero: 100 copied, then cut
        c = tap.counters()
    assert c["flows_restarted"] == 1 and c["flows_new"] == 1


def test_the_cutoff_changes_live_and_the_table_outlives_watch_list_edits():
    with tc_tap(cutoff=0, watch=["198.18.0.0/15"]) as tap:
        send = sender(tap)
        assert tap.cutoff == 0 and tap.flows == 65536
        big = fx.Scenario("big", [(fx.data(1400), True)] * 3)
        assert fx.run([big], send, ENDS) == fx.want([big])  # 0: off, nothing tracked
        assert tap.counters()["flows_new"] == 0
        tap.set_cutoff("1K")
        sc = fx.Scenario("on", [(fx.data(1024), True), (fx.data(1), False)])
        assert fx.run([sc], send, ENDS, first_port=42000) == fx.want([sc])
        tap.set_watch(["198.18.1.0/24", "2001:2::/48"])  # the flow stays where it was
        after = fx.Scenario("on", [(fx.data(1), False)])
        assert fx.run([after], send, ENDS, first_port=42000) == fx.want([after])
        tap.set_cutoff(0)
        assert fx.run([after], send, ENDS, first_port=42000) == {"on": [True]} and tap.cutoff == 0
        assert "off" in tap.describe()["cutoff"]


def test_bad_cutoffs_and_a_tap_without_a_table():
    assert parse_size("64K") == 65536 and parse_size("1MiB") == 1 << 20 and parse_size(7) == 7
    for bad in ("-1", "1.5M", "lots", True, -3):
        with pytest.raises(InputError, match="cutoff"):
            TcMirror(monitor="lo", cutoff=bad)
    for bad in (0, -1, 1 << 30, "8"):
        with pytest.raises(InputError, match="flows"):
            TcMirror(monitor="lo", cutoff=1, flows=bad)
    with pytest.raises(InputError, match="flow_timeout"):
        TcMirror(monitor="lo", cutoff=1, flow_timeout=0)
    with tc_tap() as tap:
        with pytest.raises(InputError, match="no flow table"):
            tap.set_cutoff(100)
        assert "cut" not in tap.counters() and tap.flows is None
        # and its program has no table at all: a tap without a cutoff pays nothing
        assert "flows" not in tap.c_text().split("#ifdef VTAP_FLOWS")[0] and tap.flows_now() == 0


def test_a_frame_longer_than_the_cutoff_goes_whole():
    """The frame that crosses the line goes whole, however long (at TC a GSO frame: one
    skb of many segments, its payload what its IP header says)."""
    with tc_tap(cutoff=fx.CUT) as tap:
        send = sender(tap)
        big = bytes(
            Ether() / IP(src=ENDS.client4, dst=ENDS.server4) / TCP(sport=1, dport=2, flags="A") / Raw(b"g" * 2500)
        )
        assert send(big) and not send(big)


def transfer(tb, size, port=5201):
    """size bytes over TCP from the sender to the receiver (Testbed 1's), both ends
    closing: a FIN from each side. Sockets of this process, each thread in its host's
    namespace."""
    ready, got = threading.Event(), []

    def serve():
        with netdev.entered(tb.ns(tb.receiver)), socket.create_server((tb.dst4, port)) as srv:
            ready.set()
            conn, _ = srv.accept()
            with conn:
                n = 0
                while chunk := conn.recv(1 << 16):
                    n += len(chunk)
                got.append(n)

    server = threading.Thread(target=serve)
    server.start()
    assert ready.wait(5)
    with netdev.entered(tb.ns(tb.sender)), socket.create_connection((tb.dst4, port), timeout=10) as c:
        c.sendall(b"e" * size)
        c.shutdown(socket.SHUT_WR)
        assert c.recv(1) == b""  # the server's FIN
    server.join(10)
    assert got == [size]


def tcp_seen(frame: bytes):
    """A copy at the monitor: (direction, payload bytes, flags) of the transfer's TCP."""
    p = Ether(frame)
    if TCP not in p or 5201 not in (p[TCP].sport, p[TCP].dport):
        return None
    way = "c2s" if p[TCP].dport == 5201 else "s2c"
    return way, len(p[IP]) - p[IP].ihl * 4 - p[TCP].dataofs * 4, str(p[TCP].flags)


def test_a_real_transfer_is_cut_after_its_first_bytes_and_its_ends_still_copied(tb1):
    """4 MB over TCP through a tap with a 64 KiB cutoff on the receiver's eth0, both
    directions, the kernel's defaults (TSO on the sender: the tap meets 64 KB GSO frames):
    the monitor gets the first 64 KiB of the client's bytes (the frame that crosses the
    line whole, so less than one GSO frame more), every SYN and FIN, and the flow is
    forgotten after its two FINs."""
    cut, size = 64 << 10, 4 << 20
    with (
        TcMirror(monitor=tb1.monitor_iface, netns=tb1.ns(tb1.tap_host), cutoff=cut) as tap,
        Capture(tb1.ns(tb1.monitor), tb1.monitor_capture_iface, tcp_seen, keep=True) as mon,
    ):
        tap.attach(tb1.tap_iface, "both")
        transfer(tb1, size)
        c = settled_flows(tap)
    seen = [tcp_seen(f) for f in mon.frames]
    seen = [s for s in seen if s]
    # the data the cutoff counted: a segment with SYN, FIN or RST is copied past the cut,
    # its payload too (the client's last data often carries its FIN: under load that last
    # GSO frame held up to 64 KB, and a bound on all the bytes failed 2 runs in 5 suites)
    c2s = sum(n for way, n, f in seen if way == "c2s" and not set(f) & set("SFR"))
    assert cut <= c2s < cut + (64 << 10), c2s
    flags = [(way, f) for way, _, f in seen]
    assert ("c2s", "S") in flags and ("s2c", "SA") in flags
    assert (
        sum("F" in f for way, f in flags if way == "c2s") == 1
        and sum("F" in f for way, f in flags if way == "s2c") == 1
    )
    assert c["cut"] > 0 and c["cut_bytes"] > size - c2s - cut  # what the monitor did not get
    assert c["flows_new"] == 1 and c["flows_ended"] == 1 and c["flows"] == 0 and c["evicted"] == 0
    assert c["cloned"] == len(seen) and c["failed"] == 0


def settled_flows(tap, seconds=5):
    """The counters once the flow was forgotten (its last FIN may still be in flight)."""
    deadline = time.monotonic() + seconds
    while (c := tap.counters())["flows_ended"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    return c
