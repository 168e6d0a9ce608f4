"""TcMirror on real veths in the paper's testbeds: exact mirror counts."""

import threading
import time

import pytest
from helpers import (
    RX4,
    RX4_ALT,
    RX6,
    UNWATCHED_SRC4,
    UNWATCHED_SRC6,
    WATCHED_SRC4,
    WATCHED_SRC6,
    frames_in,
    invariant,
    run_flows,
    wait_for,
)
from scapy.layers.l2 import ARP, Ether

from ebpf import InputError, TcMirror, netdev, tc, testrun
from lab import netns
from lab.topology import Topology
from lab.traffic import Capture, ExactFrames, Flow, Marker, build, flow_frames, send_frames

N = 500
CLONES = ["action", "helper"]  # who copies: the filter's mirred action, or bpf_clone_redirect()


def tap_for(tb, **kw):
    return TcMirror(monitor=tb.monitor_iface, netns=tb.ns(tb.tap_host), **kw)


def settled(tap, key, want, seconds=5):
    """tap.counters() once counter `key` has reached `want` (frames still in
    flight on a loaded machine), or as they are after `seconds`."""
    deadline = time.monotonic() + seconds
    while (c := tap.counters())[key] < want and time.monotonic() < deadline:
        time.sleep(0.01)
    return c


def kernel_prog_id(tb):
    """The program id of the one vTAP filter on the tapped hook, as the kernel
    reports it (TCA_BPF_ID), not as this process remembers it."""
    with netdev.ipr(tb.ns(tb.tap_host)) as ip:
        (entry,) = [
            e
            for e in tc.entries(ip, ip.link_lookup(ifname=tb.tap_iface)[0], tc.PARENTS["ingress"])
            if e.name.startswith("vtap")
        ]
    assert entry.prog_id > 0
    return entry.prog_id


@pytest.mark.parametrize("clone", CLONES)
@pytest.mark.parametrize(
    "match, want",
    [
        ("src", {"src-watched": N, "dst-watched": 0, "none": 0}),
        ("dst", {"src-watched": 0, "dst-watched": N, "none": 0}),
        ("any", {"src-watched": N, "dst-watched": N, "none": 0}),
    ],
)
def test_match_modes_mirror_exact_counts(tb1, match, want, clone):
    flows = [
        Flow("src-watched", WATCHED_SRC4, RX4, count=N),
        Flow("dst-watched", UNWATCHED_SRC4, RX4_ALT, count=N),
        Flow("none", UNWATCHED_SRC4, RX4, count=N),
    ]
    with tap_for(tb1, watch=[f"{WATCHED_SRC4}/32", f"{RX4_ALT}/32"], match=match, clone=clone) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        _, rx, mon = run_flows(tb1, flows)
        c = tap.counters()
    assert dict(rx) == {f.name: N for f in flows}, "the vTAP must not disturb the original traffic"
    assert {k: mon[k] for k in want} == want
    # every frame matched was copied, and every copy arrived
    assert c["matched"] == c["cloned"] == sum(mon.values()) == sum(want.values()) and c["failed"] == 0
    assert invariant(c)


def test_ipv6_prefixes_and_tcp(tb1):
    flows = [
        Flow("w6-udp", WATCHED_SRC6, RX6, count=N),
        Flow("w6-tcp", WATCHED_SRC6, RX6, "tcp", count=N),
        Flow("u6", UNWATCHED_SRC6, RX6, count=N),
        Flow("u4", UNWATCHED_SRC4, RX4, "tcp", count=N),
    ]
    with tap_for(tb1, watch=["2001:2:0:1::8/125"], match="src") as tap:  # ::8 .. ::f, not ::10
        tap.attach(tb1.tap_iface, "ingress")
        _, rx, mon = run_flows(tb1, flows)
    assert sum(mon.values()) == 0  # the prefix length is honoured
    with tap_for(tb1, watch=["2001:2:0:1::10/124"], match="src") as tap:  # ::10 .. ::1f
        tap.attach(tb1.tap_iface, "ingress")
        _, rx, mon = run_flows(tb1, flows)
    assert dict(mon) == {"w6-udp": N, "w6-tcp": N}
    assert dict(rx) == {f.name: N for f in flows}


@pytest.mark.parametrize("clone", CLONES)
@pytest.mark.parametrize("vlans", [((0x8100, 100),), ((0x88A8, 10), (0x8100, 20))], ids=["802.1Q", "QinQ"])
def test_vlan_tagged_frames_mirrored_exactly_and_intact(tb1, vlans, clone):
    marker = Marker()
    watched = flow_frames(Flow("w", WATCHED_SRC4, RX4, count=N, vlans=vlans), marker, tb1.sender_mac, tb1.next_hop_mac)
    unwatched = flow_frames(
        Flow("u", UNWATCHED_SRC4, RX4, count=N, vlans=vlans), marker, tb1.sender_mac, tb1.next_hop_mac
    )
    exact = ExactFrames({"w": watched, "u": unwatched})
    with tap_for(tb1, watch=[f"{WATCHED_SRC4}/32"], clone=clone) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        with Capture(tb1.ns("monitor"), "eth0", exact) as mon:
            send_frames(
                tb1.ns("sender"),
                "eth0",
                [f for pair in zip(watched, unwatched, strict=True) for f in pair],
                rate_pps=20000,
            )
        c = tap.counters()
    # Byte-exact: the copies carry every tag the sender put on the wire.
    assert dict(mon.counts) == {"w": N}
    assert c["matched"] == c["cloned"] == mon.counts["w"] and invariant(c)


def test_arp_and_other_frames_that_are_not_ip(tb1):
    arp = [
        bytes(
            Ether(src=tb1.sender_mac, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=WATCHED_SRC4, pdst=RX4, hwsrc=tb1.sender_mac)
        )
        + bytes([i % 256])
        for i in range(50)
    ]
    exact = ExactFrames({"arp": arp})
    with tap_for(tb1, watch=[f"{WATCHED_SRC4}/32"]) as tap:  # a watch-list cannot match ARP: not mirrored
        tap.attach(tb1.tap_iface, "ingress")
        with Capture(tb1.ns("monitor"), "eth0", exact) as mon:
            send_frames(tb1.ns("sender"), "eth0", arp)
        c = tap.counters()
    assert mon.counts["arp"] == 0 and c["not_ip"] >= 50
    with tap_for(tb1, watch=None) as tap:  # no watch-list: everything, ARP included
        tap.attach(tb1.tap_iface, "ingress")
        with Capture(tb1.ns("monitor"), "eth0", exact) as mon:
            send_frames(tb1.ns("sender"), "eth0", arp)
    assert mon.counts["arp"] == 50


def test_empty_watch_list_mirrors_nothing(tb1):
    with tap_for(tb1, watch=[]) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        _, rx, mon = run_flows(tb1, [Flow("a", WATCHED_SRC4, RX4, count=N)])
        c = tap.counters()
    assert rx["a"] == N and mon["a"] == 0 and c["matched"] == 0


def test_egress_direction(tb1):
    """Frames the receiver sends are seen on its eth0 egress hook."""
    flows = [Flow("w", RX4, WATCHED_SRC4, count=N), Flow("u", RX4, UNWATCHED_SRC4, count=N)]
    marker = Marker()
    frames = build(flows, marker, tb1.topo.mac("receiver", "eth0"), tb1.sender_mac)
    with tap_for(tb1, watch=[f"{WATCHED_SRC4}/32"], match="dst") as tap:
        tap.attach("eth0", "egress")
        with Capture(tb1.ns("sender"), "eth0", marker) as at_sender, Capture(tb1.ns("monitor"), "eth0", marker) as mon:
            send_frames(tb1.ns("receiver"), "eth0", frames, rate_pps=20000)
    assert dict(at_sender.counts) == {"w": N, "u": N}
    assert dict(mon.counts) == {"w": N}


def test_both_directions_on_several_interfaces(tb2):
    """Testbed 2: the tap node taps both bridge ports in both directions, so a
    frame crossing the bridge is cloned twice (in at one port, out at the other)."""
    with tap_for(tb2, watch=[f"{WATCHED_SRC4}/32"], match="src") as tap:  # not the ICMP errors coming back
        tap.attach_many(["eth0", "eth1"], "both")
        assert len(tap.tc_filters) == 4
        _, rx, mon = run_flows(tb2, [Flow("fwd", WATCHED_SRC4, RX4, count=N)])
        c = tap.counters()
    assert rx["fwd"] == N
    assert c["matched"] == c["cloned"] == mon["fwd"] == 2 * N and invariant(c)


def test_sampling_ratio_within_tolerance(tb1):
    n, rate = 4000, 4
    with tap_for(tb1, watch=None, sample=rate) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        at_monitor = frames_in(tb1.ns(tb1.monitor), tb1.monitor_capture_iface)
        _, rx, mon = run_flows(tb1, [Flow("s", WATCHED_SRC4, RX4, count=n)])
        c = tap.counters()
    # Random 1-in-4 sampling: expected 1000, sd = sqrt(n p (1-p)) = 27.4; accept +-5 sd.
    assert rx["s"] == n
    assert 1000 - 137 <= mon["s"] <= 1000 + 137
    # (watching everything: a frame of the kernel's own could be sampled too, and arrive)
    assert c["matched"] >= n and c["cloned"] == at_monitor() >= mon["s"]
    assert c["sampled_out"] == c["matched"] - c["cloned"] > 0 and c["failed"] == 0 and invariant(c)


def test_live_changes_take_effect_without_reload(tb1):
    flows = [Flow("a", WATCHED_SRC4, RX4, count=N), Flow("b", UNWATCHED_SRC4, RX4, count=N)]
    with tap_for(tb1, watch=[f"{WATCHED_SRC4}/32"]) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        prog_id = kernel_prog_id(tb1)  # the id the kernel gives a load: a reload gets a new one
        _, _, mon = run_flows(tb1, flows)
        assert dict(mon) == {"a": N}
        tap.set_watch([f"{UNWATCHED_SRC4}/32"])
        _, _, mon = run_flows(tb1, flows)
        assert dict(mon) == {"b": N}
        tap.set_watch(None)
        tap.set_sample(1_000_000)
        tap.reset_counters()
        at_monitor = frames_in(tb1.ns(tb1.monitor), tb1.monitor_capture_iface)
        _, _, mon = run_flows(tb1, flows)
        c = tap.counters()
        assert mon["a"] + mon["b"] <= 2  # 1 in a million of 1000 packets
        assert c["matched"] >= 2 * N and c["cloned"] == at_monitor() <= 2 and invariant(c)
        assert kernel_prog_id(tb1) == prog_id  # the same program all along


@pytest.mark.parametrize("clone", CLONES)
def test_live_monitor_change(clone):
    t = Topology("two-monitors")
    for h in ("sender", "receiver", "monitor"):
        t.add_host(h)
    t.add_link("sender", "receiver")
    t.add_link("receiver", "monitor", a_if="mon0", b_if="m0", a_addrs=[], b_addrs=[])
    t.add_link("receiver", "monitor", a_if="mon1", b_if="m1", a_addrs=[], b_addrs=[])
    with t:
        marker = Marker()
        src, dst = t.addr("sender", "eth0"), t.addr("receiver", "eth0")

        def send(name):
            frames = build([Flow(name, src, dst, count=N)], marker, t.mac("sender", "eth0"), t.mac("receiver", "eth0"))
            send_frames(t.ns("sender"), "eth0", frames, rate_pps=20000)

        with (
            TcMirror(monitor="mon0", netns=t.ns("receiver"), clone=clone) as tap,
            Capture(t.ns("monitor"), "m0", marker) as m0,
            Capture(t.ns("monitor"), "m1", marker) as m1,
        ):
            tap.attach("eth0", "ingress")
            at_m0, at_m1 = frames_in(t.ns("monitor"), "m0"), frames_in(t.ns("monitor"), "m1")
            send("first")
            tap.monitor = "mon1"
            send("second")
            c = tap.counters()
            arrived = at_m0() + at_m1()
    assert dict(m0.counts) == {"first": N}
    assert dict(m1.counts) == {"second": N}
    # (watching everything: the kernel's own frames are copied too, and arrive)
    assert c["cloned"] == arrived >= 2 * N and c["failed"] == 0 and invariant(c)


@pytest.mark.parametrize("clone", CLONES)
def test_clone_failure_is_counted_with_its_bytes(tb1, clone):
    """A monitor that disappears refuses clones: counted as failed, originals
    pass. The copies that went out before stay in cloned and cloned_bytes; the
    refused ones leave both (on the action path they were counted as handed over
    first, and moved when mirred reported them)."""
    marker = Marker()
    size = 200
    before = build([Flow("a", WATCHED_SRC4, RX4, count=N, size=size)], marker, tb1.sender_mac, tb1.next_hop_mac)
    after = build([Flow("b", WATCHED_SRC4, RX4, count=N, size=size)], marker, tb1.sender_mac, tb1.next_hop_mac)
    with tap_for(tb1, watch=[f"{WATCHED_SRC4}/32"], clone=clone) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        at_monitor = frames_in(tb1.ns(tb1.monitor), tb1.monitor_capture_iface)
        with Capture(tb1.ns("receiver"), "eth0", marker) as rx:
            send_frames(tb1.ns("sender"), "eth0", before, rate_pps=20000)
            c = settled(tap, "cloned", N)  # every frame through the tap before the monitor goes
            assert c["cloned"] == N and c["cloned_bytes"] == N * size and c["failed"] == 0
            wait_for(lambda: at_monitor() >= N, what=f"{N} copies at the monitor")
            arrived = at_monitor()  # (the monitor's end goes with mon0)
            with netns.ipr(tb1.ns("receiver")) as ip:
                ip.link("del", index=ip.link_lookup(ifname="mon0")[0])
            send_frames(tb1.ns("sender"), "eth0", after, rate_pps=20000)
        c = settled(tap, "matched", 2 * N)
    assert rx.counts["a"] == rx.counts["b"] == N
    assert c["matched"] == 2 * N and c["failed"] == N and c["cloned"] == arrived == N
    assert c["cloned_bytes"] == N * size and invariant(c)


@pytest.mark.parametrize("clone, failed", [("action", N), ("helper", 0)])
def test_a_monitor_that_is_down(tb1, clone, failed):
    """mirred checks the device: on the action path a monitor that is down refuses
    each copy, counted as failed. bpf_clone_redirect does not: the copies are
    queued to the down device and dropped there, and nothing counts them."""
    marker = Marker()
    frames = build([Flow("a", WATCHED_SRC4, RX4, count=N)], marker, tb1.sender_mac, tb1.next_hop_mac)
    with tap_for(tb1, watch=[f"{WATCHED_SRC4}/32"], clone=clone) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        tb1.topo.run("receiver", ["ip", "link", "set", "mon0", "down"])
        with Capture(tb1.ns("monitor"), "eth0", marker) as mon, Capture(tb1.ns("receiver"), "eth0", marker) as rx:
            send_frames(tb1.ns("sender"), "eth0", frames, rate_pps=20000)
        c = tap.counters()
        assert tap.health().monitor_state == "down"
    assert rx.counts["a"] == N and mon.counts["a"] == 0
    # the helper's copies are "cloned" but never arrive: nothing tells it the device was down
    assert c["matched"] == N and c["failed"] == failed and c["cloned"] == N - failed and invariant(c)


def test_counters_read_before_attach_leave_the_maps_filled(tb1):
    """counters() and reset_counters() before attach(): the maps are filled
    whenever they are first created, so the monitor and the watch-list are there
    when the program runs (before, the monitor's ifindex stayed 0 for good)."""
    with tap_for(tb1, watch=[f"{WATCHED_SRC4}/32"]) as tap:
        tap.table("stats")  # anything that compiles, before any attach
        assert tap.counters()["seen"] == 0
        tap.reset_counters()
        tap.attach(tb1.tap_iface, "ingress")
        _, rx, mon = run_flows(tb1, [Flow("a", WATCHED_SRC4, RX4, count=N), Flow("u", UNWATCHED_SRC4, RX4, count=N)])
        c = tap.counters()
    assert dict(mon) == {"a": N} and c["cloned"] == N


def test_watch_list_changes_leave_no_gap(tb1):
    """Flipping between a watch-list that holds the source and mirror-all while
    traffic flows: both mirror every frame, so the monitor must get every one.
    (set_watch(None) used to delete the entries before switching mirror-all on.)
    The program is built with its test-only pause between reading the flag and
    the lookup, 30-60 us, so that flips land there: a frame that read the flag
    before mirror-all went on and looked up after the entries left used to be
    missed, once in a few thousand runs without the pause (one frame in 6000,
    once), some 7% of the frames with it."""
    marker = Marker()
    n = 6000
    frames = build([Flow("a", WATCHED_SRC4, RX4, count=n)], marker, tb1.sender_mac, tb1.next_hop_mac)
    with tap_for(tb1, watch=[f"{WATCHED_SRC4}/32"], cflags=["-DVTAP_TEST_RACE_WINDOW=3000"]) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        done = threading.Event()
        flips = [0]

        def flip():
            while not done.is_set():
                tap.set_watch(None)
                tap.set_watch([f"{WATCHED_SRC4}/32", f"{UNWATCHED_SRC4}/32"])
                tap.set_watch([f"{WATCHED_SRC4}/32"])
                flips[0] += 1

        t = threading.Thread(target=flip)
        with Capture(tb1.ns("monitor"), "eth0", marker) as mon:
            t.start()
            try:
                send_frames(tb1.ns("sender"), "eth0", frames, rate_pps=4000)
            finally:
                done.set()
                t.join()
        c = tap.counters()
    assert flips[0] > 20
    assert mon.counts["a"] == n
    assert c["failed"] == 0


def test_sample_rate_limits(tb1):
    with pytest.raises(InputError, match="sample rate must be an integer from 1"):
        tap_for(tb1, sample=2**32)  # a __u32 in the map: 2**32 would wrap to 0, "keep all"
    with tap_for(tb1, sample=2**32 - 1) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        _, _, mon = run_flows(tb1, [Flow("a", WATCHED_SRC4, RX4, count=N)])
        c = tap.counters()
    assert c["matched"] >= N and c["cloned"] <= 1


def test_a_namespace_that_does_not_exist():
    with pytest.raises(InputError, match=r"no network namespace named 'vtl-nowhere' \(/run/netns/vtl-nowhere"):
        TcMirror(monitor="mon0", netns="vtl-nowhere")


@pytest.mark.parametrize("clone, failed", [("action", N), ("helper", 0)])
def test_a_monitor_without_carrier(tb1, clone, failed):
    """The monitor is up but its link is not (the far end of its veth is down):
    mirred refuses the copies just as for a monitor that is down, and health()
    says no-carrier rather than up."""
    marker = Marker()
    frames = build([Flow("a", WATCHED_SRC4, RX4, count=N)], marker, tb1.sender_mac, tb1.next_hop_mac)
    with tap_for(tb1, watch=[f"{WATCHED_SRC4}/32"], clone=clone) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        tb1.topo.run("monitor", ["ip", "link", "set", "eth0", "down"])
        assert tap.health().monitor_state == "no-carrier"
        send_frames(tb1.ns("sender"), "eth0", frames, rate_pps=20000)
        c = settled(tap, "matched", N)
    assert c["matched"] == N and c["failed"] == failed and c["cloned"] == N - failed and invariant(c)


def test_counters_by_interface(tb2):
    """tb2's tap node taps both bridge ports: the frame in at eth0 and out at eth1
    counts once on each, and the totals are their sum."""
    with tap_for(tb2, watch=[f"{WATCHED_SRC4}/32"], match="src") as tap:
        tap.attach_many(["eth0", "eth1"], "both")
        _, rx, mon = run_flows(tb2, [Flow("fwd", WATCHED_SRC4, RX4, count=N)])
        totals, rows = tap.snapshot()
    assert set(rows) == {"eth0", "eth1"}
    assert rows["eth0"]["cloned"] == rows["eth1"]["cloned"] == N
    assert all(totals[k] == rows["eth0"][k] + rows["eth1"][k] for k in totals)


def test_failures_of_a_filter_removed_from_outside_are_kept(tb1):
    """The monitor goes, copies fail; then the filter is removed from outside.
    The failures counted so far must stay counted (they were read back as 0 from
    the vanished action before)."""
    marker = Marker()
    frames = build([Flow("a", WATCHED_SRC4, RX4, count=N)], marker, tb1.sender_mac, tb1.next_hop_mac)
    with tap_for(tb1, watch=[f"{WATCHED_SRC4}/32"]) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        with netns.ipr(tb1.ns("receiver")) as ip:
            ip.link("del", index=ip.link_lookup(ifname="mon0")[0])
        send_frames(tb1.ns("sender"), "eth0", frames, rate_pps=20000)
        before = settled(tap, "failed", N)
        tc.cleanup("vtap", tb1.ns("receiver"), spare_live=False)
        after = tap.counters()
    assert before["failed"] == after["failed"] == N and after["cloned"] == 0 and after["matched"] == N
    assert invariant(after)


def test_a_watch_list_change_that_does_not_fit_twice(tb1):
    """Room for 4 per family, 3 watched, 3 others wanted: old and new together do
    not fit, so the old entries leave first, and the change succeeds (it ended in
    a bare 'No space left' from BCC, with the maps half-changed)."""
    new_hosts = [f"198.18.1.{i}/32" for i in (10, 11, 12)]
    with tap_for(tb1, watch=["198.18.9.1/32", "198.18.9.2/32", "198.18.9.3/32"], watch_max=4) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        tap.set_watch(new_hosts)
        assert tap.watch == new_hosts
        _, rx, mon = run_flows(tb1, [Flow("a", WATCHED_SRC4, RX4, count=N), Flow("u", UNWATCHED_SRC4, RX4, count=N)])
        with pytest.raises(InputError, match="more than the 4 it has room for"):
            tap.set_watch([f"198.18.2.{i}/32" for i in range(5)])
        assert tap.watch == new_hosts  # a refused change changes nothing
    assert dict(mon) == {"a": N}


@pytest.mark.parametrize("match", ["dst", None, "src"], ids=["dst", "any-by-default", "src"])
def test_ipv6_destination_alone_watched_is_copied_exactly(match):
    """The IPv6 counterpart of the dst-watched flow of test_match_modes_mirror_exact_counts:
    frames whose destination alone is watched (their source is not) are copied, every
    one, under --match dst and under the default (any); under src, none. Frames to an
    unwatched destination never are. Through BPF_PROG_TEST_RUN on the program TcMirror
    loads (the action path): a run that returns VERDICT_MIRROR is a frame the filter's
    mirred action copies to the monitor, one copy each, and the program counts it
    `mirrored`; the rest pass, `unmatched`."""
    n, mirror = 100, 2**32 - 1  # VERDICT_MIRROR (-1) as the test run's u32 return value
    marker = Marker()
    flows = [Flow("dst-watched", UNWATCHED_SRC6, RX6, count=n), Flow("none", UNWATCHED_SRC6, "2001:2:0:9::9", count=n)]
    want = {"dst-watched": 0 if match == "src" else n, "none": 0}
    with TcMirror(monitor="lo", watch=[f"{RX6}/128"], **({"match": match} if match else {})) as tap:
        assert tap.match == (match or "any")
        fd = tap.load_program().fd
        copied = {
            f.name: sum(
                testrun.run(fd, frame, xdp=False).retval == mirror
                for frame in flow_frames(f, marker, "02:00:00:00:00:01", "02:00:00:00:00:02")
            )
            for f in flows
        }
        e = tap.exits(index=1)  # a test run's skb comes in on lo, ifindex 1: that counter slot
    assert copied == want
    assert e["seen"] == 2 * n and e["verdict"]["mirror"] == e["reason"]["mirrored"] == sum(want.values())
    assert e["reason"]["unmatched"] == 2 * n - sum(want.values())
