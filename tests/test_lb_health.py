"""The load balancer's drain, health checks and session ending through its
command line (python -m lab lb), as a user runs it on a segment built with the
kernel's defaults (lab.fastpaths.lb.testbed.user_segment), with echo servers (tests/echo.py)
serving TCP and UDP on each backend:

- a drained backend (weight 0 in --backends-file) gets no new session;
- a backend that fails silently (its switch port down: probes time out, nothing
  refuses) leaves after --fall probes, and new sessions avoid it;
- with every backend down, nothing is sent to any (each new flow dropped as
  no-backend);
- when the links come back, each backend is used again only after --rise
  probes have passed (counted at the backends: each probe is a TCP connection
  accepted there);
- at the end every session has left the table: NAT TCP by both FINs, DSR TCP by
  the FIN timeout (the LB never sees the backend's FIN), UDP by its timeout.

NAT is run over IPv6 (an IPv6 service, health checks of IPv6 backends from the
LB's own address) and DSR over IPv4; tests/test_user_topologies.py runs both
modes over both families without failures."""

import json
import queue
import time

import pytest
from helpers import PORT, Tool, assert_run_averages, echo_servers, exchange, stop_all

from ebpf import xdp
from lab import netns
from lab.fastpaths.lb.testbed import user_segment

RISE, FALL, CHECK = 5, 2, 0.2
N = 8


def accepted(count_dir, host):
    """TCP connections the host's echo server has accepted (handshakes completed:
    a probe whose SYN arrives after the prober gave up is refused by it, not counted)."""
    try:
        return int((count_dir / host).read_text())
    except FileNotFoundError:
        return 0


def fresh(tool, timeout=20.0):
    """The tool's counters sampled after this call: queued lines are dropped,
    and so is the first one after them (it may have been sampled before)."""
    while True:
        try:
            line = tool.out.q.get_nowait()
        except queue.Empty:
            break
        assert line is not None, "the tool stopped"
    for _ in range(2):
        line = tool.out.next(timeout, "a line of counters")
        assert line is not None, "the tool stopped"
    obj = json.loads(line)
    assert obj["event"] == "counters", obj
    return obj


def delta(after, before, backend, key="new_sessions"):
    return after["backends"][backend][key] - before["backends"][backend][key]


@pytest.mark.parametrize("mode, family", [("nat", 6), ("dsr", 4)], ids=["nat-ipv6", "dsr-ipv4"])
def test_drain_silent_failure_all_down_recovery_and_sessions_ending(mode, family, tmp_path):
    with user_segment(dsr=mode == "dsr") as tb:
        t = tb.topo
        netns.run(tb.ns("lb"), ["sysctl", "-qw", "net.ipv4.conf.eth0.forwarding=1", "net.ipv6.conf.eth0.forwarding=1"])
        if family == 4:
            vip, dst, addrs = tb.vip4, tb.vip4, [tb.backend4(i) for i in range(2)]
        else:
            vip, dst, addrs = f"[{tb.vip6}]", tb.vip6, [f"[{tb.backend6(i)}]" for i in range(2)]
        be1, be2 = (f"{a}:{PORT}" for a in addrs)
        backends = tmp_path / "backends.txt"
        backends.write_text(f"{be1}\n{be2}\n")
        servers = echo_servers(t, tb.backends, count_dir=tmp_path)
        tool = Tool(
            tb.ns("lb"),
            "lb",
            "--iface",
            "eth0",
            "--service",
            f"tcp:{vip}:{PORT}",
            "--service",
            f"udp:{vip}:{PORT}",
            "--backends-file",
            str(backends),
            "--mode",
            mode,
            "--prepare-peer",
            "--check-interval",
            str(CHECK),
            "--rise",
            str(RISE),
            "--fall",
            str(FALL),
            "--timeout",
            "udp=1",
            "--timeout",
            "fin=1",
            interval=0.2,
        )
        try:
            assert tool.attached["backends"] == [be1, be2]
            full = {"udp": N, "tcp": N, "n": N}

            # both serve
            before = fresh(tool)
            assert exchange(t, "client", dst, PORT, N) == full
            after = fresh(tool)
            assert delta(after, before, be1) > 0 and delta(after, before, be2) > 0
            assert after["established"] - before["established"] == N  # each TCP connection once

            # drained: no new session for be2
            backends.write_text(f"{be1}\n{be2}@0\n")
            tool.err.wait_for("backends now")
            before = fresh(tool)
            assert before["backends"][be2]["weight"] == 0
            assert exchange(t, "client", dst, PORT, N) == full
            after = fresh(tool)
            assert delta(after, before, be2) == 0 and delta(after, before, be1) >= 2 * N

            # back in; then be2 fails silently: its port on the switch goes down
            backends.write_text(f"{be1}\n{be2}\n")
            tool.err.wait_for("backends now")
            t.run("switch", ["ip", "link", "set", "be2", "down"])
            assert tool.err.wait_for("unhealthy", timeout=30).strip().endswith(f"unhealthy: {be2}")
            before = fresh(tool)
            assert not before["backends"][be2]["healthy"] and before["backends"][be1]["healthy"]
            assert exchange(t, "client", dst, PORT, N) == full
            after = fresh(tool)
            assert delta(after, before, be2) == 0 and delta(after, before, be1) >= 2 * N

            # every backend down: nothing reaches any, each new flow is dropped
            t.run("switch", ["ip", "link", "set", "be1", "down"])
            assert tool.err.wait_for("unhealthy", timeout=30).strip().endswith(f"unhealthy: {be1}, {be2}")
            before = fresh(tool)
            assert exchange(t, "client", dst, PORT, 1, expect_none=True) == {"udp": 0, "tcp": 0, "n": 1}
            after = fresh(tool)
            assert after["to_backend"] == before["to_backend"]
            assert after["dropped_no_backend"] - before["dropped_no_backend"] >= 2  # the datagram and the SYN(s)

            # recovery: each backend back only after RISE probes have passed there
            opens = [accepted(tmp_path, b) for b in tb.backends]
            for b in tb.backends:
                t.run("switch", ["ip", "link", "set", b, "up"])
            tool.err.wait_for("every backend is healthy", timeout=30)
            probes = [accepted(tmp_path, b) - o for b, o in zip(tb.backends, opens, strict=True)]
            assert min(probes) >= RISE, probes
            before = fresh(tool)
            assert before["backends"][be1]["healthy"] and before["backends"][be2]["healthy"]
            assert exchange(t, "client", dst, PORT, N) == full
            after = fresh(tool)
            assert delta(after, before, be1) > 0 and delta(after, before, be2) > 0

            # every session leaves the table: TCP (NAT) by FINs, the rest by --timeout (1 s),
            # well before the defaults (FIN 10 s, UDP 30 s) would have removed them
            deadline = time.monotonic() + 8
            while sum(r["active_sessions"] for r in fresh(tool)["backends"].values()):
                assert time.monotonic() < deadline, "sessions left in the table past their --timeout"
            final, warnings = tool.stop()
            assert_run_averages(final, final["backends"])  # a run of seconds: not the last interval's rates
            if mode == "nat":
                assert final["closed_fin"] == final["established"] > 0  # each TCP connection closed by FINs
            else:
                assert final["closed_fin"] == 0 and final["to_client"] == 0  # the LB saw one direction
            assert xdp.attached(tb.ns("lb")) == []
            assert not [a for a in xdp.attached(tb.ns("switch")) if a[0] == "lb"]  # --prepare-peer's, gone
        finally:
            tool.kill()
            stop_all(servers)
