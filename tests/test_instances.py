"""Several vTAPs in one namespace, cleanup, and what each instance may touch:
a vTAP removes only what it attached, cleanup spares live instances, and a
vTAP whose filter vanishes says so and exits non-zero."""

import json
import signal
import subprocess
import sys

from helpers import RX4, WATCHED_SRC4, run_flows

from ebpf import TcMirror, netdev, tc
from lab.fastpaths.vtap.demo import start_vtap
from lab.traffic import Flow

N = 400


def vtap(tb, *args, timeout=60):
    return tb.topo.run(
        tb.tap_host, [sys.executable, "-m", "vtap", *args], check=False, capture_output=True, text=True, timeout=timeout
    )


def stop(proc):
    """Ctrl-C; returns vtap's stderr once it has exited 0."""
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    return err


def vtap_filters(tb):
    return [f for f in tc.hook_snapshot(tb.ns(tb.tap_host))["eth0"][1] if "vtap" in f[3]]


def test_cleanup_spares_a_running_vtap_and_all_removes_it(tb1):
    proc = start_vtap(tb1, ["--interval", "0.2"])
    try:
        r = vtap(tb1, "--cleanup")
        assert r.returncode == 0, r.stderr
        assert "left filter vtap+clsact:tc_mirror on eth0 ingress alone: a running vtap holds it" in r.stdout
        assert f"(pid {proc.pid})" in r.stdout
        assert len(vtap_filters(tb1)) == 1
        _, rx, mon = run_flows(tb1, [Flow("a", WATCHED_SRC4, RX4, count=N)])
        assert mon["a"] == N  # still mirroring
        r = vtap(tb1, "--cleanup", "--all")
        assert r.returncode == 0 and "removed filter vtap+clsact:tc_mirror on eth0 ingress (live: pid" in r.stdout
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The running vTAP noticed within an interval, said why, and failed.
    assert proc.returncode == 1, err
    assert "vtap: error: stopped: the vTAP filter on eth0 ingress is gone: its filter was removed from outside" in err
    assert json.loads(out.splitlines()[-1])["event"] == "final"
    assert tc.hook_snapshot(tb1.ns("receiver"))["eth0"] == (False, [])


def test_a_vtap_removes_only_the_filter_it_attached(tb1):
    """A's filter is cleaned up from outside, B then takes the same priority and
    handle. Stopping A must leave B's filter, and B must keep mirroring."""
    ns = tb1.ns("receiver")
    a = TcMirror(monitor="mon0", netns=ns)
    b = TcMirror(monitor="mon0", netns=ns)
    try:
        (fa,) = a.attach("eth0", "ingress")
        removed, _ = tc.cleanup("vtap", ns, spare_live=False)
        assert removed
        (fb,) = b.attach("eth0", "ingress")
        assert (fb.prio, fb.handle, fb.name) == (fa.prio, fa.handle, fa.name) and fb.prog_id != fa.prog_id
        a.close()
        assert [f[3] for f in vtap_filters(tb1)] == [fb.name]
        b.reset_counters()
        _, rx, mon = run_flows(tb1, [Flow("b", WATCHED_SRC4, RX4, count=N)])
        assert mon["b"] == N and b.counters()["cloned"] == N
    finally:
        a.close()
        b.close()
    assert tc.hook_snapshot(ns)["eth0"] == (False, [])


def test_a_second_vtap_on_the_same_hook_is_warned_about_live_or_orphaned(tb1):
    first = start_vtap(tb1, ["--interval", "0.2"])
    second = start_vtap(tb1, ["--interval", "0.2"])
    try:
        # Both copy each frame: the monitor gets every frame twice, as warned.
        _, rx, mon = run_flows(tb1, [Flow("a", WATCHED_SRC4, RX4, count=N)])
        assert rx["a"] == N and mon["a"] == 2 * N
        err = stop(second)
        assert (
            f"vtap: warning: eth0 ingress already has another vTAP filter (vtap pid {first.pid} runs it) "
            "copying to the same monitor mon0: frames both match arrive there twice"
        ) in err, err
        first.send_signal(signal.SIGKILL)
        first.wait()
        third = start_vtap(tb1, ["--interval", "0.2"])
        err = stop(third)
        assert "another vTAP filter (left by a killed vtap: `vtap --cleanup` removes it)" in err, err
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
                p.wait()
    r = vtap(tb1, "--cleanup")
    assert "removed filter vtap+clsact:tc_mirror on eth0 ingress" in r.stdout
    assert tc.hook_snapshot(tb1.ns("receiver"))["eth0"] == (False, [])


def test_a_vtap_whose_interface_is_deleted_says_so(tb2):
    """tb2: the tap node taps eth1 too; deleting eth1 ends the run with exit 1."""
    proc = tb2.topo.popen(
        "tapnode",
        [
            sys.executable,
            "-m",
            "vtap",
            "--monitor",
            "mon0",
            "--iface",
            "eth0",
            "--iface",
            "eth1",
            "--json",
            "--interval",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert json.loads(proc.stdout.readline())["event"] == "attached"
    tb2.topo.run("tapnode", ["ip", "link", "del", "eth1"])
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 1
    assert "vtap: error: stopped: the vTAP filter on eth1 ingress is gone: eth1 was deleted" in err
    assert tc.hook_snapshot(tb2.ns("tapnode"))["eth0"] == (False, [])


def test_a_slot_taken_between_look_and_add_is_placed_again(tb1, monkeypatch):
    """Two vTAPs starting together both read the hook, then add: the second add
    finds its slot taken (EEXIST) and must place again, not fail. The race is
    made real and certain: right after our placement, another instance attaches
    into that very slot."""
    ns = tb1.ns("receiver")
    place, taken = tc._place, []

    def place_then_lose_the_race(ip, ifindex, parent):
        slot = place(ip, ifindex, parent)
        if not taken:
            taken.append(slot)
            other.attach("eth0", "ingress")  # its own placement sees `taken` and goes straight in
        return slot

    monkeypatch.setattr(tc, "_place", place_then_lose_the_race)
    # `tap` made the clsact qdisc, so it goes last and removes it. (Had it gone
    # first, `other`, which found the qdisc there with no filter to say whose,
    # would leave it in place, empty, as it leaves anybody's.)
    with TcMirror(monitor="mon0", netns=ns) as tap, TcMirror(monitor="mon0", netns=ns) as other:
        (f,) = tap.attach("eth0", "ingress")
        (o,) = other.tc_filters
        assert (o.prio, o.handle) == taken[0][:2] != (f.prio, f.handle)
        _, rx, mon = run_flows(tb1, [Flow("a", WATCHED_SRC4, RX4, count=N)])
        assert rx["a"] == N and mon["a"] == 2 * N  # both really copy
    assert tc.hook_snapshot(ns)["eth0"] == (False, [])


def test_a_clsact_made_between_look_and_add_is_used(tb1, monkeypatch):
    """The other race: both see no clsact qdisc and both add one. The second add
    (EEXIST) must use the qdisc that is there, and leave it to its maker."""
    ns = tb1.ns("receiver")
    has, made = tc.has_clsact, []

    def look_then_lose_the_race(ip, ifindex):
        there = has(ip, ifindex)
        if not there and not made:
            with netdev.ipr(ns) as other:
                other.tc("add", "clsact", index=ifindex)
            made.append(ifindex)
        return there

    monkeypatch.setattr(tc, "has_clsact", look_then_lose_the_race)
    with TcMirror(monitor="mon0", netns=ns) as tap:
        (f,) = tap.attach("eth0", "ingress")
        assert made and f.name == "vtap:tc_mirror"  # not "+clsact": we did not make it
        _, rx, mon = run_flows(tb1, [Flow("a", WATCHED_SRC4, RX4, count=N)])
        assert mon["a"] == N
    assert tc.hook_snapshot(ns)["eth0"] == (True, [])  # the maker's qdisc stays, empty
