"""The load balancer as a service (issue 33, part 2): a restart breaks no connection.

`lab lb --keep` leaves its datapath attached and serving when it exits; the
next `lab lb` on the interface takes it over (its sessions, LB ports, Maglev
tables and counters) and applies its own services, backends and weights. A
`kill -9` leaves the same. Judged by 200 long-lived TCP connections (100 per
family, tests/echo.py hold), each sending a line every 100 ms and reading it
back while the controller stops and starts again: none broken, every line
echoed in order."""

import json
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from helpers import ECHO, PORT, Tool, echo_servers, stop_all, wait_for

from ebpf import tc, xdp
from lab import netns
from lab.fastpaths.lb.testbed import user_segment

PER_FAMILY = 100


def lb_args(tb, mode="nat", weights=(1, 1), reordered=False, hook="xdp"):
    """reordered: a UDP service first and the backends in reverse order, so that a run that
    numbered services and backends anew would number them differently."""
    at = ["--prepare-peer"] if hook == "xdp" else ["--hook", "tc"]
    args = ["--iface", "eth0", *at, "--check-interval", "0.3", "--mode", mode]
    if reordered:
        args += ["--service", f"udp:{tb.vip4}:{PORT}"]
    for vip in (tb.vip4, f"[{tb.vip6}]"):
        args += ["--service", f"tcp:{vip}:{PORT}"]
    order = list(enumerate(weights))
    for i, w in reversed(order) if reordered else order:
        args += ["--backend", f"{tb.backend4(i)}:{PORT}@{w}", "--backend", f"[{tb.backend6(i)}]:{PORT}@{w}"]
    return args


class Held:
    """tests/echo.py hold from the client: the connections open on entering."""

    def __init__(self, tb):
        self.p = tb.topo.popen(
            "client",
            [sys.executable, ECHO, "hold", f"{tb.vip4},{tb.vip6}", str(PORT), str(PER_FAMILY)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.p.stdout.readline().strip() == "ready"

    def result(self) -> dict:
        out, _ = self.p.communicate("", timeout=60)
        return json.loads(out)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def closing(tb) -> list[str]:
    """The held connections' sockets not yet through their close: the client's before
    TIME_WAIT, the backends' before CLOSED. A backend's last ACK reaches it only after
    the LB has forwarded it (and counted the close): none left means the LB saw every one."""
    left = []
    for host, where, states in (
        ("client", f"dport = :{PORT}", ["established", "fin-wait-1", "fin-wait-2", "closing"]),
        *((b, f"sport = :{PORT}", ["established", "close-wait", "last-ack"]) for b in tb.backends),
    ):
        argv = ["ss", "-Htan", *(w for st in states for w in ("state", st)), f"( {where} )"]
        out = netns.run(tb.ns(host), argv, capture_output=True, text=True, check=True).stdout
        left += [f"{host}: {ln}" for ln in out.splitlines() if ln.strip()]
    return left


def without_compiler(pid) -> list[str]:
    """What of BCC's compiler a running controller maps (libbcc, LLVM, clang): nothing, as
    lab lb compiles in a child that is gone by the time it serves (issue 33, part 3), when
    no image of its program is kept (with one, nothing compiles at all)."""
    with open(f"/proc/{pid}/maps") as f:
        libs = {ln.split()[-1] for ln in f if "/" in ln}
    children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    return sorted(lib for lib in libs if any(n in lib for n in ("libbcc", "LLVM", "clang"))) + children


def run_out(tool):
    """SIGTERM: exit status 0, then (every JSON line, every stderr line)."""
    tool.p.send_signal(15)
    assert tool.p.wait(timeout=30) == 0
    return [json.loads(ln) for ln in iter(tool.out.q.get, None)], list(iter(tool.err.q.get, None))


def programs(tb):
    """(the LB's program ids: XDP's and its TC filters', the switch's: the veth peer's pass program)."""
    lb = [a[3] for a in xdp.attached(tb.ns("lb"))] + [f.entry.prog_id for f in tc.filters_of("lab-lb", tb.ns("lb"))]
    return lb, [a[3] for a in xdp.attached(tb.ns("switch"))]


def connect_and_echo(tb, addr, n):
    """n new TCP connections from the client, each echoing one line: how many did."""
    code = (
        "import socket\n"
        "ok = 0\n"
        f"for i in range({n}):\n"
        f"    with socket.create_connection(({addr!r}, {PORT}), timeout=5) as c:\n"
        "        c.sendall(b'x\\n')\n"
        "        ok += c.recv(16) == b'x\\n'\n"
        "print(ok)\n"
    )
    r = netns.run(tb.ns("client"), [sys.executable, "-c", code], capture_output=True, text=True)
    return int(r.stdout)


def lab_lb(tb, *args):
    return netns.run(
        tb.ns("lb"), [sys.executable, "-m", "lab", "lb", *args], check=False, capture_output=True, text=True, cwd=ROOT
    )


@pytest.fixture
def segment(request):
    """A plain segment (lab.fastpaths.lb.testbed.user_segment) with forwarding on and echo
    servers on the backends: (testbed, the LB's mode), NAT unless parametrized."""
    mode = getattr(request, "param", "nat")
    with user_segment(dsr=mode == "dsr") as tb:
        netns.run(
            tb.ns("lb"),
            ["sysctl", "-w", "net.ipv4.conf.eth0.forwarding=1", "net.ipv6.conf.eth0.forwarding=1"],
            capture_output=True,
        )
        procs = echo_servers(tb.topo, tb.backends)
        try:
            yield tb, mode
        finally:
            stop_all(procs)


@pytest.mark.parametrize("hook", ["xdp", "tc"])
@pytest.mark.parametrize("segment", ["nat", "dsr"], indirect=True)
def test_a_kept_lb_stopped_and_started_again_breaks_no_connection(segment, hook):
    tb, _ = segment
    mode = (
        "dsr"
        if tb.backends
        and netns.run(
            tb.ns(tb.backends[0]), ["ip", "-br", "addr", "show", "lo"], capture_output=True, text=True
        ).stdout.count(tb.vip4)
        else "nat"
    )
    # no image kept (ebpf/images.py): each start compiles, and still maps no compiler
    cold = {"VTL_BPF_CACHE": "off"}
    first = Tool(tb.ns("lb"), "lb", *lb_args(tb, mode, hook=hook), "--keep", env=cold)
    held = Held(tb)
    try:
        assert without_compiler(first.p.pid) == []
        time.sleep(1)
        lines, _ = run_out(first)
        assert lines[-1] == {"event": "kept", "iface": "eth0", "sessions": 2 * PER_FAMILY}
        before = lines[-2]  # the final counters
        kept = programs(tb)
        # the LB's program (and at XDP the peer's), serving with no process
        assert [len(k) for k in kept] == [1, 1 if hook == "xdp" else 0]
        time.sleep(2)
        second = Tool(tb.ns("lb"), "lb", *lb_args(tb, mode, hook=hook), env=cold)
        assert second.attached["taken_over"] and second.attached["sessions_taken_over"] == 2 * PER_FAMILY
        assert programs(tb) == kept  # the same programs: nothing was swapped
        assert without_compiler(second.p.pid) == []
        time.sleep(1)
        open_ = closing(tb)  # (what the wait below looks at: every held connection, both ends)
        assert sum(ln.startswith("client") for ln in open_) == 2 * PER_FAMILY == len(open_) // 2, open_[:4]
        got = held.result()
        # the client's process has exited, its connections' closes run on in the kernels:
        # the second run is stopped once every one has gone through it (found as 188 of
        # 200 closes counted, under a loaded suite)
        wait_for(lambda: not closing(tb), what="every held connection's close through the LB")
        lines, warnings = run_out(second)
    finally:
        held.kill()
        first.kill()
    assert got["connections"] == 2 * PER_FAMILY and got["broken"] == got["wrong"] == 0, got
    assert got["echoed"] == got["sent"] > 2 * PER_FAMILY * 30, got  # every line back, for >3 s of lines
    final = lines[-1]
    # the counters went on: the second run made no session of its own
    assert final["new_sessions"] == before["new_sessions"] == 2 * PER_FAMILY
    assert final["to_backend"] > before["to_backend"]
    if mode == "nat":
        assert final["closed_fin"] == 2 * PER_FAMILY  # each connection's close, seen by the second run's datapath
    assert final["dropped_no_session"] == 0
    # without --keep, its exit removed everything, the kept run's peer program too
    assert programs(tb) == ([], [])


def test_a_restart_that_changes_a_weight_keeps_every_connection_where_it_was(segment):
    """The second run gives one backend weight 3, the backends in another order and a new
    service first: the kept services and backends keep their ids and indices (sessions name
    them), the new service takes a free one, and new connections follow the new weights."""
    tb, _ = segment
    first = Tool(tb.ns("lb"), "lb", *lb_args(tb), "--keep")
    held = Held(tb)
    try:
        time.sleep(0.5)
        lines, _ = run_out(first)
        before = lines[-2]
        second = Tool(tb.ns("lb"), "lb", *lb_args(tb, weights=(3, 1), reordered=True))
        assert second.attached["taken_over"]
        # new connections follow the new weights; the held ones stay where they were
        assert connect_and_echo(tb, tb.vip4, 40) == 40
        got = held.result()
        lines, _ = run_out(second)
    finally:
        held.kill()
        first.kill()
    assert got["broken"] == got["wrong"] == 0 and got["echoed"] == got["sent"], got
    rows, old = lines[-1]["backends"], before["backends"]
    b0, b1 = f"{tb.backend4(0)}:{PORT}", f"{tb.backend4(1)}:{PORT}"
    assert (rows[b0]["weight"], rows[b1]["weight"]) == (3, 1)
    moved = {b: rows[b]["new_sessions"] - old[b]["new_sessions"] for b in (b0, b1)}
    assert sum(moved.values()) == 40 and moved[b0] > 20, moved  # 3 of 4 expected (30): > 20 is 3.7 sigma


def test_a_killed_lb_is_taken_over_and_one_of_another_mode_refused_with_nothing_changed(segment):
    tb, _ = segment
    first = Tool(tb.ns("lb"), "lb", *lb_args(tb))  # no --keep: killed, it leaves the same
    held = Held(tb)
    try:
        time.sleep(0.5)
        first.p.kill()
        first.p.wait()
        kept = programs(tb)
        assert [len(k) for k in kept] == [1, 1]
        # another program (DSR): refused, in one line that says what replaces it; nothing changed
        r = lab_lb(tb, *lb_args(tb, "dsr"), "--duration", "1")
        errors = [ln for ln in r.stderr.splitlines() if " error: " in ln]
        assert r.returncode == 2 and len(errors) == 1, r.stderr
        assert "eth0 runs a kept xdp_lb that this one cannot take over: its program is another" in errors[0]
        assert "--replace puts this one in its place (its established sessions are lost)" in errors[0]
        assert "nothing changed" in errors[0]
        assert programs(tb) == kept
        # the same program: taken over; a second instance beside it is refused
        second = Tool(tb.ns("lb"), "lb", *lb_args(tb))
        assert second.attached["sessions_taken_over"] == 2 * PER_FAMILY
        r = lab_lb(tb, *lb_args(tb), "--duration", "1")
        assert r.returncode == 1 and f"eth0 already runs xdp_lb (pid {second.p.pid}" in r.stderr, r.stderr
        time.sleep(0.5)
        got = held.result()
        run_out(second)
    finally:
        held.kill()
        first.kill()
    assert got["connections"] == 2 * PER_FAMILY and got["broken"] == got["wrong"] == 0, got
    assert got["echoed"] == got["sent"], got
    assert programs(tb) == ([], [])


def test_cleanup_removes_a_kept_lb_and_says_so(segment):
    tb, _ = segment
    first = Tool(tb.ns("lb"), "lb", *lb_args(tb), "--keep", "--health-check", "none")
    run_out(first)
    assert [len(k) for k in programs(tb)] == [1, 1]
    r = lab_lb(tb, "--cleanup")
    assert "lb: removed xdp_lb on eth0 (native): a load balancer left serving (--keep, or killed)" in r.stdout
    assert "removed xdp_peer_pass on lb" in r.stdout
    assert programs(tb) == ([], [])
