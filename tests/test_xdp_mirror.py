"""The XDP vTAP (ebpf.XdpMirror, xdp_mirror.bpf.c): its golden fixtures through
BPF_PROG_TEST_RUN on Testbed 3's tap node (so bpf_fib_lookup() answers from
real routes and neighbours), then real traffic through it."""

import asyncio
import contextlib
import sys
import threading
from collections import Counter

import pytest
from fixtures import cutoff as cut_fx
from fixtures import mirror as fx
from helpers import frames_in, run_flows, wait_for
from scapy.layers.l2 import Ether

from ebpf import netdev, testrun
from ebpf.instruments.xdp_peer_pass import XdpPeerPass
from ebpf.vtap.xdp_mirror import SLOW_REASONS, XdpMirror
from lab import netns, testbeds
from lab.traffic import Capture, Flow, Marker, build, send_frames

FIXTURES = fx.fixtures()


@pytest.fixture(scope="module")
def node():
    """Testbed 3 and, on its tap node: eth2 to the receiver's eth1, whose peer
    runs no XDP program; a route with a small MTU, an unreachable one; the
    monitor's MTU at fx.MONITOR_MTU. Native XDP pass programs on the receiver's
    eth0 and the monitor's eth0, so that eth1 and mon0 take XDP frames."""
    tb = testbeds.testbed3()
    tb.topo.add_link(
        "tapnode",
        "receiver",
        a_if="eth2",
        b_if="eth1",
        a_addrs=["198.18.3.254/24", "2001:2:0:3::fe/64"],
        b_addrs=["198.18.3.2/24", "2001:2:0:3::2/64"],
    )
    with tb:
        run = tb.topo.run
        run("tapnode", ["ip", "route", "add", "198.18.9.0/24", "via", fx.DST4, "mtu", "lock", "1300"], check=True)
        run("tapnode", ["ip", "route", "add", "unreachable", "198.18.99.0/24"], check=True)
        for host, ifname in (("tapnode", "mon0"), ("monitor", "eth0")):
            run(host, ["ip", "link", "set", "dev", ifname, "mtu", str(fx.MONITOR_MTU)], check=True)
        peers = [XdpPeerPass(), XdpPeerPass()]
        try:
            peers[0].attach("eth0", tb.ns("receiver"))
            peers[1].attach("eth0", tb.ns("monitor"))
            yield tb
        finally:
            for p in peers:
                p.close()


def mirror(tb, **kw):
    """An XdpMirror on the tap node, loaded, its egresses read; not attached
    (the fixtures run it through BPF_PROG_TEST_RUN)."""
    tap = XdpMirror("mon0", watch=kw.pop("watch", fx.WATCH), netns=tb.ns("tapnode"), **kw)
    tap.load_program()
    tap.refresh_egresses()
    tap._note_slot(tb.topo.ifindex("tapnode", "eth0"), "eth0")  # counted as if attached there
    return tap


def run(tb, tap, frame):
    """One test run, inside the tap node's namespace (where the ingress index,
    the routes and the devmaps' devices are), as if it came in on eth0."""
    with netdev.entered(tb.ns("tapnode")):
        return testrun.run(tap.load_program().fd, frame, ingress_ifindex=tb.topo.ifindex("tapnode", "eth0"))


@pytest.fixture(scope="module")
def tap(node):
    with mirror(node) as t:
        yield t


def expected(tb, f, data):
    if not f.sent_on:
        return data
    return fx.routed(data, tb.topo.mac("tapnode", "eth1"), tb.topo.mac("receiver", "eth0"))


@pytest.mark.parametrize("f", FIXTURES, ids=[f.description for f in FIXTURES])
def test_fixture(node, tap, f):
    data = bytes(f.frame)
    before = tap.exits()
    r = run(node, tap, data)
    after = tap.exits()
    assert r.verdict == f.verdict, f.description
    want = expected(node, f, data)
    assert r.data == want, (f.description, Ether(r.data).show2(dump=True), Ether(want).show2(dump=True))
    moved = {k: after["reason"][k] - before["reason"][k] for k in after["reason"]}
    assert moved == {k: int(k == f.reason) for k in moved}, f.description


def test_counters_are_exact(node):
    """Each fixture once: every frame in `seen`, in one verdict and one reason;
    matched is what was watched; cloned what was copied."""
    with mirror(node) as t:
        for f in FIXTURES:
            run(node, t, bytes(f.frame))
        c, e = t.counters(), t.exits()
    want = Counter(f.reason for f in FIXTURES)
    assert c["seen"] == e["seen"] == len(FIXTURES) == sum(e["verdict"].values()) == sum(e["reason"].values())
    for name, n in want.items():
        assert (e["reason"][name] if name == "mirrored" else c[name]) == n, name
    assert c["matched"] == len(FIXTURES) - want["unmatched"] - want["not_ip"] - want["malformed"]
    assert c["mirror"] == want["mirrored"] == c["forwarded"]
    assert (
        c["csum_finished"]
        == sum(fx.partial.is_partial(bytes(f.frame)) for f in FIXTURES if f.sent_on and "partial" in f.description)
        == 4
    )
    assert c["cloned_bytes"] == sum(len(bytes(f.frame)) for f in FIXTURES if f.reason == "mirrored")
    # a test run transmits nothing: every copy stays pending, never reported by the
    # device, and so counted as failed (as a copy the kernel skips is); no redirect
    # error, and the frames to the egress lost likewise
    assert c["failed"] == c["egress_dropped"] == want["mirrored"]
    assert c["cloned"] == c["redirect_errors"] == 0


def test_generic_mode_keeps_a_partial_checksum(node):
    """In generic mode each copy leaves as an skb that carries the partial
    checksum on: the program must leave the field as it found it."""
    data = fx.partial.as_partial(bytes(FIXTURES[0].frame))
    with mirror(node) as t:
        t.table("skb_mode")[t.table("skb_mode").Key(0)] = t.table("skb_mode").Leaf(1)
        r = run(node, t, data)
        assert t.counters()["csum_finished"] == 0
    assert r.verdict == "XDP_REDIRECT"
    out = fx.routed(bytes(FIXTURES[0].frame), node.topo.mac("tapnode", "eth1"), node.topo.mac("receiver", "eth0"))
    assert r.data == fx.partial.as_partial(out)  # routed, and still partial


def test_sampled_out_goes_to_the_kernel(node):
    """1 in 2^32-1: practically never copied; a watched frame sampled out is
    not forwarded by default, and forwarded alone with forward='all'."""
    data = bytes(FIXTURES[0].frame)
    with mirror(node, sample=2**32 - 1) as t:
        r = run(node, t, data)
        assert (r.verdict, r.data) == ("XDP_PASS", data)
        assert t.counters()["sampled_out"] == t.counters()["matched"] == 1
    with mirror(node, sample=2**32 - 1, forward="all") as t:
        r = run(node, t, data)
        assert r.verdict == "XDP_REDIRECT"
        assert r.data == expected(node, FIXTURES[0], data)
        c = t.counters()
        assert (c["sampled_out"], c["redirect"], c["mirror"], c["forwarded"]) == (1, 1, 0, 1)


def test_forward_all_sends_unwatched_frames_alone(node):
    unwatched = next(f for f in FIXTURES if f.description == "unwatched")
    slow = next(f for f in FIXTURES if f.reason == "no_xdp_egress")
    with mirror(node, forward="all") as t:
        r = run(node, t, bytes(unwatched.frame))
        assert r.verdict == "XDP_REDIRECT"
        assert r.data == fx.routed(
            bytes(unwatched.frame), node.topo.mac("tapnode", "eth1"), node.topo.mac("receiver", "eth0")
        )
        r = run(node, t, bytes(slow.frame))  # not watched either way: passed, counted as unmatched
        e = t.exits()
    assert (r.verdict, r.data) == ("XDP_PASS", bytes(slow.frame))
    assert e["verdict"]["redirect"] == 1 and e["reason"]["unmatched"] == 1 and e["reason"]["no_xdp_egress"] == 1


def test_mirror_everything_without_a_watch_list(node):
    """watch=None copies every IP frame it can send on; a frame that is not
    IP cannot be routed, and passes."""
    with mirror(node, watch=None) as t:
        unwatched = next(f for f in FIXTURES if f.description == "unwatched")
        assert run(node, t, bytes(unwatched.frame)).verdict == "XDP_REDIRECT"
        arp = next(f for f in FIXTURES if f.reason == "not_ip")
        assert run(node, t, bytes(arp.frame)).verdict == "XDP_PASS"
        c = t.counters()
    assert (c["mirror"], c["not_ip"], c["matched"]) == (1, 1, 1)


@pytest.mark.parametrize(
    "match, src_watched, copied", [("src", True, 1), ("src", False, 0), ("dst", True, 0), ("dst", False, 1)]
)
def test_match_src_or_dst(node, match, src_watched, copied):
    frame = bytes(FIXTURES[0].frame)  # SRC4 -> DST4
    watch = [f"{fx.SRC4}/32"] if src_watched else [f"{fx.DST4}/32"]
    with mirror(node, watch=watch, match=match) as t:
        run(node, t, frame)
        assert t.counters()["mirror"] == copied


# --- real traffic -----------------------------------------------------------------
# Testbed 3 as the bench builds it: native XDP pass programs where the frames
# leave to (the receiver's and the monitor's eth0), so eth1 and mon0 take XDP frames.

N = 500
RATE = 20_000  # packets/s: modest, zero loss required
SRC4, DST4, UNW_DST4 = testbeds.Testbed.src4, "198.18.2.2", "198.18.2.3"
SRC6, DST6 = testbeds.Testbed.src6, "2001:2:0:2::2"


@contextlib.contextmanager
def routed_bed(peers=("receiver", "monitor")):
    with testbeds.testbed3() as tb, contextlib.ExitStack() as stack:
        for host in peers:
            stack.enter_context(XdpPeerPass()).attach("eth0", tb.ns(host))
        yield tb


def tap_on(tb, mode="native", **kw):
    tap = XdpMirror("mon0", netns=tb.ns("tapnode"), watch=kw.pop("watch", [f"{DST4}/32", f"{DST6}/128"]), **kw)
    tap.attach("eth0", mode)
    return tap


def exact(c):
    """The XDP vTAP's own tally: every frame seen in one verdict and one reason;
    every watched frame copied, sampled out, failed or sent to the kernel by a
    named reason."""
    reasons = ("not_ip", "malformed", "unmatched", "sampled_out", "cloned", "failed", *SLOW_REASONS)
    # the copies the monitor's driver refused or the kernel skipped were made
    # (mirror) or not (clone_failed, redirect): the verdicts' sum is seen all the same
    return c["seen"] == c["pass"] + c["mirror"] + c["redirect"] == sum(c[k] for k in reasons) and c["matched"] == c[
        "cloned"
    ] + c["sampled_out"] + c["failed"] + sum(c[k] for k in SLOW_REASONS)


@pytest.mark.parametrize("mode", ["native", "generic"])
def test_exact_counts_at_receiver_and_monitor(mode):
    flows = [
        Flow("w4", SRC4, DST4, count=N),
        Flow("w6", SRC6, DST6, "tcp", count=N),
        Flow("u4", SRC4, UNW_DST4, count=N),
    ]
    with routed_bed() as tb, tap_on(tb, mode) as tap:
        _, rx, mon = run_flows(tb, flows)
        c = tap.counters()
    assert dict(rx) == {"w4": N, "w6": N, "u4": N}, "every frame reaches the receiver"
    assert dict(mon) == {"w4": N, "w6": N}, "every watched frame, and only those, at the monitor"
    assert c["cloned"] == c["matched"] == 2 * N and c["failed"] == 0 and c["egress_dropped"] == 0
    assert c["unmatched"] >= N and exact(c)
    assert c["forwarded"] == c["cloned"]  # the unwatched went the kernel's way


def test_fragments_are_each_copied():
    """Every fragment of a watched datagram carries the watched addresses: each
    is copied, and the receiver reassembles every datagram."""
    n = 100
    with routed_bed() as tb, tap_on(tb) as tap:
        at_monitor = frames_in(tb.ns("monitor"), "eth0")
        before = snmp_any(tb.ns("receiver"), "IpReasmOKs")
        run_flows(tb, [Flow("frag", SRC4, DST4, count=n, size=1400, fragment=600)])
        wait_for(lambda: at_monitor() >= 3 * n, what="every fragment at the monitor")
        c, copies = tap.counters(), at_monitor()
        reassembled = snmp_any(tb.ns("receiver"), "IpReasmOKs") - before
    assert c["cloned"] == c["matched"] == 3 * n == copies and exact(c)
    assert reassembled == n


def test_sampling_counts_every_frame_once():
    n = 4000
    with routed_bed() as tb, tap_on(tb, sample=4) as tap:
        _, rx, mon = run_flows(tb, [Flow("w", SRC4, DST4, count=n)])
        c = tap.counters()
    assert rx["w"] == n  # the sampled-out went through the kernel
    assert c["matched"] == n == c["cloned"] + c["sampled_out"] and mon["w"] == c["cloned"]
    assert 0.2 * n < c["cloned"] < 0.3 * n and exact(c)


def test_vlan_tagged_frames_go_to_the_kernel_counted():
    """A tagged frame is the VLAN subinterface's to route, the kernel's business:
    counted as vlan, passed untouched, not copied. (This kernel has no VLAN
    devices, so here the kernel then drops them: the receiver gets none.)"""
    with routed_bed() as tb, tap_on(tb) as tap:
        marker = Marker()
        frames = build(
            [Flow("tagged", SRC4, DST4, count=N, vlans=((0x8100, 100),))], marker, tb.sender_mac, tb.next_hop_mac
        )
        with Capture(tb.ns("monitor"), "eth0", marker) as mon:  # (none reaches the receiver: nothing to wait for)
            assert send_frames(tb.ns("sender"), "eth0", frames, rate_pps=RATE).packets == N
            wait_for(lambda: tap.counters()["seen"] >= N, what="every tagged frame at the tap")
        c = tap.counters()
    assert mon.counts["tagged"] == 0
    assert c["vlan"] == c["matched"] == N and exact(c)


def test_a_monitor_that_takes_no_xdp_frames_counts_every_copy_failed():
    """The kernel skips, without a word, a device that takes no XDP frames (the
    monitor's peer runs no XDP program): the copies stay pending, counted as
    failed; the receiver still gets everything."""
    with routed_bed(peers=("receiver",)) as tb, tap_on(tb) as tap:
        assert tap.health().monitor_state == "no-xdp"
        _, rx, mon = run_flows(tb, [Flow("w", SRC4, DST4, count=N)])
        c = tap.counters()
    assert rx["w"] == N and mon["w"] == 0
    assert c["failed"] == c["matched"] == N and c["cloned"] == 0 and exact(c)
    assert c["redirect"] == N  # each to its egress alone


def test_an_egress_that_takes_no_xdp_frames_sends_them_to_the_kernel():
    with routed_bed(peers=("monitor",)) as tb, tap_on(tb) as tap:
        assert "eth1" in tap.not_egresses and tap.egresses == []
        _, rx, mon = run_flows(tb, [Flow("w", SRC4, DST4, count=N)])
        c = tap.counters()
    assert rx["w"] == N and mon["w"] == 0
    assert c["no_xdp_egress"] == c["matched"] == N and exact(c)


def test_two_taps_on_two_nodes_with_the_same_interface_indexes():
    """Each tap counts what became of its own frames only: the tracepoints see
    both nodes' queues, whose devices have the same indexes. One monitor takes
    no XDP frames (every copy failed), the other does (none)."""
    with routed_bed() as tb1, routed_bed(peers=("receiver",)) as tb2:
        assert tb1.topo.ifindex("tapnode", "mon0") == tb2.topo.ifindex("tapnode", "mon0")
        with tap_on(tb1) as t1, tap_on(tb2) as t2:
            results = {}
            threads = [
                threading.Thread(
                    target=lambda tb=tb, k=k: results.__setitem__(k, run_flows(tb, [Flow("w", SRC4, DST4, count=2000)]))
                )
                for k, tb in (("1", tb1), ("2", tb2))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            c1, c2 = t1.counters(), t2.counters()
    assert results["1"][2]["w"] == 2000 == c1["cloned"] and c1["failed"] == 0
    assert results["2"][2]["w"] == 0 and c2["failed"] == 2000 and c2["cloned"] == 0


def test_watch_list_changes_leave_no_gap():
    """As the TC vTAP's: flips between a list that holds the destination and
    mirror-all while traffic flows, with the test-only pause between the flag's
    first read and the lookup (1000 clock reads: some 50 frames of the 6000 land
    in a flip, each rescued by the second read of the flag): every frame must be
    copied."""
    n = 6000
    with routed_bed() as tb, tap_on(tb, watch=[f"{DST4}/32"], cflags=["-DVTAP_TEST_RACE_WINDOW=1000"]) as tap:
        done, flips = threading.Event(), [0]

        def flip():
            while not done.is_set():
                tap.set_watch(None)
                tap.set_watch([f"{DST4}/32", f"{UNW_DST4}/32"])
                tap.set_watch([f"{DST4}/32"])
                flips[0] += 1

        t = threading.Thread(target=flip)
        t.start()
        try:
            _, rx, mon = run_flows(tb, [Flow("w", SRC4, DST4, count=n)], rate=4000)
        finally:
            done.set()
            t.join()
        c = tap.counters()
    assert flips[0] > 20
    assert mon["w"] == rx["w"] == n == c["cloned"]


def test_socket_traffic_on_default_offloads_arrives_with_valid_checksums():
    """UDP from a socket, both families, through a veth with TX checksum offload
    on (as it comes): the checksums reach XDP partial, and the program finishes
    them, for the receiver (no InCsumErrors) and the monitor alike."""
    send = (
        "import socket, time\n"
        "for fam, dst in ((socket.AF_INET, '%s'), (socket.AF_INET6, '%s')):\n"
        "    s = socket.socket(fam, socket.SOCK_DGRAM)\n"
        "    for i in range(200):\n"
        "        s.sendto(b'x' * 300, (dst, 9)); time.sleep(0.0005)\n"
    ) % (DST4, DST6)
    with routed_bed() as tb, tap_on(tb) as tap:
        at_monitor = frames_in(tb.ns("monitor"), "eth0")
        before = {
            k: snmp_any(tb.ns("receiver"), k)
            for k in ("UdpNoPorts", "Udp6NoPorts", "UdpInCsumErrors", "Udp6InCsumErrors")
        }
        tb.topo.run("sender", [sys.executable, "-c", send], check=True)
        wait_for(lambda: at_monitor() >= 400, what="400 copies at the monitor")
        after = {k: snmp_any(tb.ns("receiver"), k) for k in before}
        c, copies = tap.counters(), at_monitor()
    moved = {k: after[k] - before[k] for k in before}
    assert moved == {"UdpNoPorts": 200, "Udp6NoPorts": 200, "UdpInCsumErrors": 0, "Udp6InCsumErrors": 0}
    assert c["csum_finished"] == c["cloned"] == copies == 400


def snmp_any(ns, name):
    """One counter of `nstat -az` in a namespace (IPv4 and IPv6 MIBs alike)."""
    out = netns.run(ns, ["nstat", "-az", name], capture_output=True, text=True).stdout
    return int(next(line.split()[1] for line in out.splitlines() if line.startswith(name + " ")))


def test_the_api_inside_a_running_asyncio_loop():
    """As typed into a notebook cell, whose thread runs an asyncio loop: every
    netlink question the XdpMirror asks (devices, XDP hooks, the netdev family's
    xdp-features) must work there."""

    async def cell():
        asyncio.get_running_loop()
        with routed_bed() as tb, tap_on(tb) as tap:
            state, egresses = tap.health().monitor_state, tap.egresses
            _, rx, mon = run_flows(tb, [Flow("w", SRC4, DST4, count=100)])
            return state, egresses, dict(mon), tap.counters()["cloned"]

    state, egresses, mon, cloned = asyncio.run(cell())
    assert (state, egresses, mon, cloned) == ("up", ["eth1"], {"w": 100}, 100)


def test_the_cutoff_at_xdp_cuts_each_boundary_exactly(node):
    """The per-flow cutoff (cutoff.h, the TC vTAP's too: tests/test_vtap_cutoff.py) at
    the XDP hook: every scenario of one direction (the way back is routed out of an
    interface the fast path cannot send from) copied or cut as at TC; a cut frame goes
    to the kernel untouched, counted `cut`."""
    scenarios = [sc for sc in cut_fx.SCENARIOS if not any(seg.back for seg, _ in sc.steps)]
    ends = cut_fx.Ends(fx.SRC4, fx.DST4, fx.SRC6, fx.DST6)
    verdicts = Counter()

    def send(frame):
        r = run(node, tap, frame)
        verdicts[r.verdict] += 1
        assert r.verdict in ("XDP_REDIRECT", "XDP_PASS")
        return r.verdict == "XDP_REDIRECT"

    with mirror(node, cutoff=cut_fx.CUT) as tap:
        got = cut_fx.run(scenarios, send, ends)
        c = tap.counters()
        e = tap.exits()
    assert got == cut_fx.want(scenarios)
    cut = sum(sc.cut for sc in scenarios)
    assert c["cut"] == e["reason"]["cut"] == verdicts["XDP_PASS"] == cut
    assert e["reason"]["mirrored"] == verdicts["XDP_REDIRECT"]  # (a test run's queue reports no copy sent)
    assert c["ends_copied"] == sum(sc.ends_copied for sc in scenarios) and c["flows_restarted"] == 1
    assert c["flows_new"] == len(scenarios) and c["flows_ended"] == 1 and c["flows"] == len(scenarios) - 1


def test_a_held_host_goes_whole_past_the_cutoff_at_xdp(node):
    """At XDP as at TC (watch.h is one): a flow cut behind the cutoff; its source held by
    watch_for(), its next segments copied (XDP_REDIRECT to the egress and the monitor),
    however far past the cutoff; the hold ended, cut again."""
    ends = cut_fx.Ends(fx.SRC4, fx.DST4, fx.SRC6, fx.DST6)

    def send(frame):
        return run(node, tap, frame).verdict == "XDP_REDIRECT"

    before = cut_fx.Scenario("f", [(cut_fx.data(100), True), (cut_fx.data(1), False)])
    held = cut_fx.Scenario("f", [(cut_fx.data(500), True), (cut_fx.data(500), True)])
    with mirror(node, cutoff=100) as tap:
        assert cut_fx.run([before], send, ends) == cut_fx.want([before])
        tap.watch_for(fx.SRC4, 30)
        assert cut_fx.run([held], send, ends) == cut_fx.want([held])
        tap.stop_alerts()  # the hold ends: the host leaves the watch-list
        again = cut_fx.Scenario("f", [(cut_fx.data(1), False)])
        assert cut_fx.run([again], send, ends) == cut_fx.want([again])
