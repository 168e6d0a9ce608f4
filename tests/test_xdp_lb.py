"""XdpLoadBalancer on the real kernel: HTTP from a client namespace through the
LB (native XDP, XDP_TX on veth) to nginx backends, as in the two load-balancer articles."""

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import ROOT, require_tool
from helpers import Lines, wait_for

from ebpf import tc, xdp
from ebpf.abi import defines
from ebpf.instruments.xdp_sink import XdpSink
from ebpf.lb.xdp_lb import XdpLoadBalancer
from lab import netns
from lab.daemons.nginx import SUFFIX, NginxServer
from lab.fastpaths.lb.testbed import lb_testbed
from lab.runs import RUN_DIR


@pytest.fixture
def lab(request):
    """TX checksum offload as a veth comes (the program finishes the partial
    checksums); a test may ask for it off at clients and backends (whole
    checksums) with indirect parametrisation."""
    require_tool("nginx")
    require_tool("curl")
    tb = lb_testbed(tx_csum_offload=getattr(request, "param", True))
    with tb:
        webs = [
            NginxServer(tb.ns(be), tb.backend4(i), tb.backend_port, name=be).start() for i, be in enumerate(tb.backends)
        ]
        webs6 = [
            NginxServer(tb.ns(be), tb.backend6(i), tb.backend_port + 1, name=f"{be}-v6").start()
            for i, be in enumerate(tb.backends)
        ]
        # the switch's port towards the LB runs XDP too: else veth drops the LB's XDP_TX frames
        sink = XdpSink("pass")
        sink.attach(tb.lb, netns=tb.ns(tb.switch))
        lb = XdpLoadBalancer(self4=tb.lb4, self6=tb.lb6, netns=tb.ns(tb.lb))
        try:
            yield tb, lb, webs, webs6
        finally:
            lb.close()
            sink.close()
            for w in webs + webs6:
                w.close()
    assert not list(RUN_DIR.glob(f"{netns.PREFIX}*{SUFFIX}"))


def get(tb, url, n):
    bodies = []
    for _ in range(n):
        r = netns.run(tb.ns(tb.client), ["curl", "-sg", "-m", "5", url], check=False, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        bodies.append(r.stdout.splitlines()[0])
    return bodies


LB_FIN_CLIENT = defines("lb/xdp_lb.h")["LB_FIN_CLIENT"]  # a session's flag: the client's FIN seen


@pytest.mark.parametrize(
    "lab", [True, False], indirect=True, ids=["default offloads", "senders without TX checksum offload"]
)
def test_http_through_the_lb_to_two_backends_ipv4_and_ipv6(lab):
    tb, lb, webs, webs6 = lab
    svc = lb.add_service(f"tcp:{tb.vip4}:{tb.service_port}")
    lb.set_backends(svc, {f"{tb.backend4(i)}:{tb.backend_port}": 1 for i in range(2)})
    svc6 = lb.add_service(f"tcp:[{tb.vip6}]:{tb.service_port}")
    lb.set_backends(svc6, {f"[{tb.backend6(i)}]:{tb.backend_port + 1}": 1 for i in range(2)})
    lb.attach("eth0")
    n = 24
    bodies = get(tb, f"http://{tb.vip4}/", n) + get(tb, f"http://[{tb.vip6}]/", n)
    # every request answered by a backend, and both backends of each family served
    assert set(bodies) == {"served by be1", "served by be2", "served by be1-v6", "served by be2-v6"}
    assert sum(w.requests() for w in webs) == n and sum(w.requests() for w in webs6) == n
    # NAT: the backends saw the LB's address, never the client's
    assert {c for w in webs for c in w.clients()} == {tb.lb4}
    assert {c for w in webs6 for c in w.clients()} == {tb.lb6}
    # each connection one session, established, closed by FIN from both sides: the tables are empty
    c = lb.counters()
    assert c["new_sessions"] == c["established"] == c["closed_fin"] == 2 * n
    assert c["dropped_no_session"] == c["dropped_no_port"] == c["dropped_no_neigh"] == 0
    assert lb.sessions() == []
    per_backend = lb.backend_counters()
    assert sum(v["new_sessions"] for v in per_backend.values()) == 2 * n
    assert all(
        v["new_sessions"] == w for v, w in zip(per_backend.values(), [x.requests() for x in webs + webs6], strict=True)
    )


def tc_qdiscs(tb):
    return subprocess.run(
        ["ip", "netns", "exec", tb.ns(tb.lb), "tc", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True
    ).stdout


def lb_cli(tb, *args):
    return subprocess.Popen(
        ["ip", "netns", "exec", tb.ns(tb.lb), sys.executable, "-m", "lab", "lb", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_command_line_drains_checks_health_and_detaches(lab, tmp_path):
    """python -m lab lb as a user runs it: weights from a file it re-reads,
    health checks, SIGTERM detaches; SIGKILL leaves it attached until --cleanup."""
    tb, _, webs, _ = lab
    backends = tmp_path / "backends.txt"
    backends.write_text(f"{tb.backend4(0)}:{tb.backend_port}\n{tb.backend4(1)}:{tb.backend_port}\n")
    p = lb_cli(
        tb,
        "--iface",
        "eth0",
        "--service",
        f"tcp:{tb.vip4}:80",
        "--backends-file",
        str(backends),
        "--json",
        "--interval",
        "0.2",
        "--check-interval",
        "0.2",
        "--rise",
        "1",
        "--fall",
        "2",
    )
    out, err = Lines(p.stdout), Lines(p.stderr)
    try:
        first = json.loads(out.wait_for("attached", timeout=60))
        assert first["event"] == "attached" and first["mode"] == "nat"
        served = get(tb, f"http://{tb.vip4}/", 30)
        assert set(served) == {"served by be1", "served by be2"}
        # drain be2: new connections avoid it
        backends.write_text(f"{tb.backend4(0)}:{tb.backend_port}\n{tb.backend4(1)}:{tb.backend_port}@0\n")
        err.wait_for("backends now")
        assert set(get(tb, f"http://{tb.vip4}/", 20)) == {"served by be1"}
        # back in, then be2's server dies: the health check takes it out
        backends.write_text(f"{tb.backend4(0)}:{tb.backend_port}\n{tb.backend4(1)}:{tb.backend_port}\n")
        err.wait_for("backends now")
        webs[1].close()
        err.wait_for("unhealthy")
        assert set(get(tb, f"http://{tb.vip4}/", 20)) == {"served by be1"}
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
        assert xdp.attached(tb.ns(tb.lb)) == [] and tc.filters_of("lab-lb", tb.ns(tb.lb)) == []
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for lines in (out, err):
            lines.t.join(timeout=10)  # the streams end with the process; then close them
        p.stdout.close()
        p.stderr.close()
    # killed: the program stays on the interface until --cleanup
    p = lb_cli(
        tb,
        "--iface",
        "eth0",
        "--service",
        f"tcp:{tb.vip4}:80",
        "--backend",
        f"{tb.backend4(0)}:{tb.backend_port}",
        "--json",
        "--health-check",
        "none",
    )
    out = Lines(p.stdout)
    assert json.loads(out.wait_for("attached", timeout=60))["event"] == "attached"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    out.t.join(timeout=10)
    p.stdout.close()
    p.stderr.close()
    # at the hook --hook auto picks on a veth: TC (and nothing at XDP)
    assert len(tc.filters_of("lab-lb", tb.ns(tb.lb))) == 1 and xdp.attached(tb.ns(tb.lb)) == []
    r = subprocess.run(
        ["ip", "netns", "exec", tb.ns(tb.lb), sys.executable, "-m", "lab", "lb", "--cleanup"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "lb: removed filter lab-lb+clsact:tc_lb on eth0 ingress" in r.stdout, r.stdout
    assert tc.filters_of("lab-lb", tb.ns(tb.lb)) == [] and "clsact" not in tc_qdiscs(tb)


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--iface is required"),
        (["--iface", "eth0"], "--service is required"),
        (
            ["--iface", "eth0", "--service", "icmp:1.2.3.4:80", "--backend", "1.2.3.5:80"],
            "bad service 'icmp:1.2.3.4:80'",
        ),
        (["--iface", "eth0", "--service", "tcp:1.2.3.4:80", "--backend", "1.2.3.5"], "bad backend '1.2.3.5'"),
        (["--iface", "eth0", "--service", "tcp:[2001:2::1]:80", "--backend", "1.2.3.5:80"], "has no IPv6 backend"),
        (
            [
                "--iface",
                "eth0",
                "--service",
                "tcp:1.2.3.4:80",
                "--backend",
                "1.2.3.5:80",
                "--hook",
                "tc",
                "--prepare-peer",
            ],
            "--prepare-peer goes with --hook xdp (at TC no peer program is needed)",
        ),
        (
            ["--iface", "eth0", "--service", "tcp:1.2.3.4:80", "--backend", "1.2.3.5:80", "--hook", "tc"]
            + ["--xdp-mode", "generic", "--prepare-peer"],
            "--xdp-mode and --prepare-peer go with --hook xdp",
        ),
        (["--iface", "nosuch0", "--service", "tcp:1.2.3.4:80", "--backend", "1.2.3.5:80"], "nosuch0"),
        # backends named per service: only for services it runs, each family its own
        (
            ["--iface", "eth0", "--service", "tcp:1.2.3.4:80", "--backend", "tcp:1.2.3.4:81=1.2.3.5:80"],
            "backends named for tcp:1.2.3.4:81, which no --service gives",
        ),
        (
            ["--iface", "eth0", "--service", "tcp:1.2.3.4:80", "--backend", "tcp:1.2.3.4:80=[2001:2::5]:80"],
            "backend [2001:2::5]:80 of tcp:1.2.3.4:80: families differ",
        ),
        (
            ["--iface", "eth0", "--service", "tcp:1.2.3.4:80", "--service", "tcp:1.2.3.4:81"]
            + ["--backend", "tcp:1.2.3.4:80=1.2.3.5:80"],
            "service tcp:1.2.3.4:81 has no IPv4 backend",
        ),
        # sizes: one past a limit refused whole, before anything is made
        (
            ["--iface", "eth0", "--service", "tcp:1.2.3.4:80", "--service", "tcp:1.2.3.4:81"]
            + ["--backend", "1.2.3.5:80", "--max-services", "1"],
            "2 services, more than --max-services 1",
        ),
        (
            ["--iface", "eth0", "--service", "tcp:1.2.3.4:80", "--backend", "1.2.3.5:80"]
            + ["--backend", "1.2.3.6:80", "--max-backends", "1"],
            "2 backends, more than --max-backends 1",
        ),
        (
            ["--iface", "eth0", "--service", "tcp:1.2.3.4:80", "--backend", "1.2.3.5:80", "--max-sessions", "0"],
            "--max-sessions must be 1 to",
        ),
        (
            ["--iface", "eth0", "--service", "tcp:1.2.3.4:80", "--backend", "1.2.3.5:80", "--timeout", "udp=0"],
            "bad --timeout 'udp=0'",
        ),
        (
            ["--iface", "eth0", "--service", "tcp:1.2.3.4:80", "--backend", "1.2.3.5:80", "--timeout", "tcp=5"],
            "bad --timeout 'tcp=5'",
        ),
    ],
)
def test_command_line_bad_input_is_one_line(args, message):
    r = subprocess.run([sys.executable, "-m", "lab", "lb", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m lab lb: error: ") and message in lines[0], r.stderr


def test_dsr_backends_answer_the_client_directly():
    """DSR: the LB changes only the destination MAC; each backend holds the VIP
    on its loopback, serves the service's port and answers the client itself, so
    the LB sees the client's packets only. So it never sees a backend's FIN: each
    session ends established with the client's FIN alone, and leaves the table
    when it has idled past the FIN timeout (1 s here; 10 s by default)."""
    require_tool("nginx")
    require_tool("curl")
    tb = lb_testbed(dsr=True)
    with tb:
        webs = [NginxServer(tb.ns(be), tb.vip4, tb.service_port, name=be).start() for be in tb.backends]
        sink = XdpSink("pass")
        sink.attach(tb.lb, netns=tb.ns(tb.switch))
        lb = XdpLoadBalancer(mode="dsr", netns=tb.ns(tb.lb), timeouts={"fin": 1.0})
        try:
            svc = lb.add_service(f"tcp:{tb.vip4}:{tb.service_port}")
            lb.set_backends(svc, {f"{tb.backend4(i)}:{tb.service_port}": 1 for i in range(2)})
            lb.attach("eth0")
            n = 20
            assert set(get(tb, f"http://{tb.vip4}/", n)) == {"served by be1", "served by be2"}
            assert {c for w in webs for c in w.clients()} == {tb.client4}  # the client's own address
            assert sum(w.requests() for w in webs) == n
            c = lb.counters()
            assert c["to_client"] == 0 and c["to_backend"] > 0  # replies never came through the LB
            assert c["new_sessions"] == c["established"] == n
            assert c["closed_fin"] == c["closed_rst"] == 0  # no session could see both FINs
            # every connection's session, established, with the client's FIN (the last may be in flight)
            wait_for(lambda: sum(s["fin"] == LB_FIN_CLIENT for s in lb.sessions()) == n, what=f"{n} sessions FIN'd")
            left = lb.sessions()
            assert len(left) == n and {(s["state"], s["fin"], s["half_open"]) for s in left} == {
                ("established", LB_FIN_CLIENT, False)
            }
            assert {s["client"] for s in left} == {tb.client4} and len({s["client_port"] for s in left}) == n
            swept = []
            wait_for(
                lambda: swept.append(lb.sweep()) or lb.sessions() == [],
                timeout=30,
                what="the sweep to empty the session table",
            )
            assert sum(swept) == n  # each session swept once, nothing else
        finally:
            lb.close()
            sink.close()
            for w in webs:
                w.close()
