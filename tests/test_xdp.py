"""XDP attach and detach (ebpf.xdp) on a real veth: detach removes our program and
never one that took the hook after ours, and is quiet when the device or the
namespace went first. And the throughput rig, whose sinks are XDP programs:
closing it frees everything even when a sink refuses."""

import ctypes
import os
import sys
import time

import pytest
from conftest import require
from helpers import in_a_thread_without_net_admin
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from ebpf import AttachError, testrun, xdp
from ebpf.instruments.xdp_sink import XdpSink
from lab import netns, testbeds
from lab.fastpaths.vtap.rig import ThroughputRig
from lab.netns import LabError

BPF_XDP = 37  # enum bpf_attach_type (uapi bpf.h)


@pytest.fixture
def topo():
    with testbeds.pair(name="xdp") as t:
        yield t


def _on_hook(ns, ifname="eth0", mode="native"):
    """Id of the program on the device's hook, 0 when none."""
    with netns.ipr(ns) as ip:
        return xdp.attached_prog_id(ip, ip.link_lookup(ifname=ifname)[0], mode)


def _unhook_behind_its_back(ns, ifname="eth0"):
    """What another tool does: remove whatever is on the hook, by netlink."""
    with netns.ipr(ns) as ip:
        ip.link(
            "set",
            index=ip.link_lookup(ifname=ifname)[0],
            xdp={"attrs": [("IFLA_XDP_FD", -1), ("IFLA_XDP_FLAGS", xdp.MODES["native"])]},
        )


def test_detach_removes_our_program(topo):
    ns = topo.ns("a")
    with XdpSink() as sink:
        a = sink.attach("eth0", netns=ns)
        assert _on_hook(ns) == xdp.prog_id(a.prog_fd)
        assert xdp.detach(a) is True
        assert _on_hook(ns) == 0
        assert xdp.detach(a) is False  # nothing of ours left on the hook: nothing to do


def test_detach_leaves_a_program_that_replaced_ours(topo):
    ns = topo.ns("a")
    with XdpSink() as ours, XdpSink() as theirs:
        ours.attach("eth0", netns=ns)
        _unhook_behind_its_back(ns)
        b = theirs.attach("eth0", netns=ns)  # through ebpf.xdp.attach, as any lab user would
        assert _on_hook(ns) == xdp.prog_id(b.prog_fd)
        ours.close()  # detaches `a`, as the lab's teardown does: theirs stays, and no error
        assert _on_hook(ns) == xdp.prog_id(b.prog_fd)
    assert _on_hook(ns) == 0  # theirs went with its own close()


def test_detach_leaves_a_program_attached_through_a_bpf_link(topo):
    """libbpf's bpf_program__attach_xdp() attaches through a bpf_link: the kernel
    answers a netlink detach with EBUSY, which is not ours to report either."""
    ns = topo.ns("a")
    lib = testrun.libbpf()
    lib.bpf_link_create.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.bpf_link_create.restype = ctypes.c_int
    with XdpSink() as ours, XdpSink() as theirs:
        ours.attach("eth0", netns=ns)
        _unhook_behind_its_back(ns)
        fd = theirs.load(theirs.FUNCTION, "XDP").fd
        with netns.entered(ns):  # BPF_LINK_CREATE takes an ifindex of the caller's namespace
            link = lib.bpf_link_create(fd, topo.ifindex("a", "eth0"), BPF_XDP, None)
        assert link >= 0, f"bpf_link_create: {-link}"
        try:
            ours.close()  # detaches `a`: theirs stays, and no error
            assert _on_hook(ns) == xdp.prog_id(fd)
        finally:
            os.close(link)  # the link's last fd: the kernel detaches theirs
    assert _on_hook(ns) == 0


def test_detach_is_quiet_when_the_device_is_gone(topo):
    ns = topo.ns("a")
    with XdpSink() as sink:
        a = sink.attach("eth0", netns=ns)
        with netns.ipr(ns) as ip:
            ip.link("del", index=a.ifindex)
        assert xdp.detach(a) is False
    # close() detached again: no error either


def test_detach_is_quiet_when_the_namespace_is_gone():
    t = testbeds.pair(name="xdp")
    with XdpSink() as sink:
        with t:
            a = sink.attach("eth0", netns=t.ns("a"))
        assert xdp.detach(a) is False


# --- the throughput rig's sinks: close() frees everything even when a sink refuses ---


@pytest.fixture
def rig_parts():
    """A ThroughputRig on testbed 1 (three XDP sinks, two UDP sockets), with what
    close() must free: its namespaces and its sockets."""
    require(os.cpu_count() >= 2, "two CPUs (the rig pins the generator and the DUT apart)")
    rig = ThroughputRig(testbeds.testbed1(), gen_cpu=0, dut_cpu=1).__enter__()
    try:
        yield rig, [rig.tb.ns(h) for h in rig.tb.topo.hosts], list(rig.sockets)
    finally:
        rig.tb.topo.teardown()  # only matters when close() did not get that far


def _check_all_freed(rig, namespaces, sockets, message):
    assert not any(netns.exists(n) for n in namespaces), "the testbed was left up"
    assert all(s.fileno() == -1 for s in sockets), "sockets were left open"
    assert not rig.sinks and not rig.sockets
    # every sink was tried, not just the first: each is named in the one error
    assert all(f"{label} sink" in message for label in ("dut", "monitor")), message
    assert "Operation not permitted" in message


def test_rig_close_does_every_step_then_reports_what_failed(rig_parts):
    rig, namespaces, sockets = rig_parts
    assert len(rig.sinks) >= 2 and sockets
    # The sinks' XDP detach is refused for real (EPERM), the rest needs no CAP_NET_ADMIN.
    raised = in_a_thread_without_net_admin(rig.close)
    _check_all_freed(rig, namespaces, sockets, str(raised))
    assert isinstance(raised, LabError), f"close raised {raised!r}"


def test_rig_close_failure_is_a_note_on_the_error_that_ended_the_run(rig_parts):
    rig, namespaces, sockets = rig_parts
    error = RuntimeError("the run failed")
    raised = in_a_thread_without_net_admin(lambda: rig.__exit__(RuntimeError, error, None))
    notes = getattr(error, "__notes__", [])
    _check_all_freed(rig, namespaces, sockets, " ".join(notes))
    assert raised is None  # __exit__ lets the run's own error propagate, unreplaced
    assert len(notes) == 1


@pytest.mark.parametrize("mode, attached", [("native", "xdp"), ("generic", "xdpgeneric")])
def test_each_mode_attaches_where_it_says(topo, mode, attached):
    ns = topo.ns("a")
    with XdpSink() as sink:
        a = sink.attach("eth0", netns=ns, mode=mode)
        with netns.ipr(ns) as ip:
            assert xdp.attached_mode(ip, a.ifindex) == attached
            assert xdp.attached_prog_id(ip, a.ifindex, mode) == xdp.prog_id(a.prog_fd)
    with netns.ipr(ns) as ip:
        assert xdp.attached_mode(ip, ip.link_lookup(ifname="eth0")[0]) is None


def test_offload_is_attempted_and_refused_with_the_kernels_reason(topo):
    """A veth cannot run BPF: the program is really loaded for the device, the
    kernel refuses, and the error says what offload needs and why, in one line."""
    ns = topo.ns("a")
    with XdpSink() as sink:
        with pytest.raises(AttachError) as e:
            sink.attach("eth0", netns=ns, mode="offload")
        assert sink._xdp == []
    msg = str(e.value)
    assert msg.startswith("offloading xdp_sink to eth0: offload needs a NIC that runs BPF, such as Netronome nfp: ")
    assert "Invalid argument" in msg and "\n" not in msg
    with netns.ipr(ns) as ip:
        assert xdp.attached_mode(ip, ip.link_lookup(ifname="eth0")[0]) is None


def test_a_tunnel_without_native_xdp_is_told_to_use_generic(topo):
    """Seen using `python -m lab redirect` on a VXLAN device: native mode failed
    with a bare "Operation not supported". The line now says what works, and
    generic mode does."""
    ns = topo.ns("a")
    netns.run(
        ns,
        [
            "ip",
            "link",
            "add",
            "vx0",
            "type",
            "vxlan",
            "id",
            "42",
            "dstport",
            "4789",
            "dev",
            "eth0",
            "remote",
            str(topo.hosts["b"].ifaces["eth0"].addrs[0].ip),
        ],
        check=True,
    )
    netns.run(ns, ["ip", "link", "set", "vx0", "up"], check=True)
    with XdpSink() as sink:
        with pytest.raises(AttachError) as e:
            sink.attach("vx0", netns=ns, mode="native")
        assert str(e.value) == (
            "attaching XDP (native) to vx0: Operation not supported (its driver has no native XDP: use mode generic)"
        )
        assert sink.xdp_attachments == []
        a = sink.attach("vx0", netns=ns, mode="generic")
        assert _on_hook(ns, "vx0", "generic") == xdp.prog_id(a.prog_fd)


def test_a_window_sink_spans_from_its_first_counted_frame_to_its_last():
    """A host's rates are taken over its sinks' windows (XdpSink(window=True)): the first
    frame's time, and the last of the frames that open a tick of the coarse clock or a
    new 64 (xdp_sink.bpf.c). Frames of two runs 30 ms apart, each run within the
    CLOCK_MONOTONIC readings around it: the window starts in the first run and ends in
    the second, and within one run of 200 frames (one tick, most likely) it grows too."""
    frame = bytes(Ether() / IP(src="198.18.0.1", dst="198.18.0.2") / UDP(sport=9, dport=5001) / (b"x" * 18))
    other = bytes(Ether() / IP(src="198.18.0.9", dst="198.18.0.2") / UDP(sport=9, dport=5001) / (b"x" * 18))
    now, cpus = time.monotonic, os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # one CPU's entry (the sink's are per CPU)
    try:
        with XdpSink("drop", match=("198.18.0.1", 5001), window=True) as sink:
            fd = sink.load(sink.FUNCTION, "XDP").fd
            assert testrun.run(fd, other, repeat=10).verdict == "XDP_PASS"  # not counted, not timed
            assert sink.counters()["packets"] == 0 and sink.counters()["window_s"] == 0.0
            t0 = now()
            testrun.run(fd, frame, repeat=200)
            t1 = now()
            one = sink.counters()
            time.sleep(0.03)
            t2 = now()
            testrun.run(fd, frame, repeat=200)
            t3 = now()
            two = sink.counters()
    finally:
        os.sched_setaffinity(0, cpus)
    assert one["packets"] == 200 and t0 <= one["first_s"] < one["last_s"] <= t1, (t0, one, t1)
    assert two["packets"] == 400 and two["first_s"] == one["first_s"], two
    assert t2 <= two["last_s"] <= t3 and two["window_s"] == two["last_s"] - two["first_s"], (t2, two, t3)


def test_the_tc_floor_sends_each_frame_back_out_of_its_interface_with_the_macs_swapped():
    """The TC twin of `xdp-bench tx -m swap` (what the LB at TC is measured against):
    frames into b's eth0 come back to a, counted once each, their addresses swapped."""
    from ebpf.instruments.tc_swap import TcSwap  # noqa: PLC0415
    from lab.topology import Topology  # noqa: PLC0415

    topo = Topology("tcswap")
    topo.add_host("a")
    topo.add_host("b")
    topo.add_link("a", "b", a_addrs=["198.18.63.1/24"], b_addrs=["198.18.63.2/24"])
    n, dport = 50, 9137
    with topo, TcSwap() as floor, XdpSink("drop", match=("198.18.63.1", dport)) as back:
        a_mac, b_mac = topo.mac("a", "eth0"), topo.mac("b", "eth0")
        frame = Ether(src=a_mac, dst=b_mac) / IP(src="198.18.63.1", dst="198.18.63.2") / UDP(dport=dport)
        r = testrun.run(floor.load_program().fd, bytes(frame), xdp=False, ingress_ifindex=1)
        assert r.retval == 7  # TC_ACT_REDIRECT
        assert r.data[:12] == bytes.fromhex(a_mac.replace(":", "") + b_mac.replace(":", "")), r.data[:12].hex()
        floor.reset_counters()
        back.attach("eth0", netns=topo.ns("a"))  # a counts what comes back, the sender's frames only
        floor.attach("eth0", netns=topo.ns("b"))
        send = (
            "from scapy.all import Ether, sendp; "
            f"sendp(Ether(bytes.fromhex('{bytes(frame).hex()}')), iface='eth0', count={n}, verbose=0)"
        )
        topo.run("a", [sys.executable, "-c", send], check=True)
        deadline = time.monotonic() + 5
        while back.counters()["packets"] < n and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # and no more than n
        assert back.counters()["packets"] == n
        assert floor.counters() == {"packets": n, "bytes": n * len(frame)}
