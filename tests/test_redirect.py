"""XdpRedirect on the real kernel, in the report's set-up (lab.fastpaths.redirect.testbed.router_testbed):
a file arrives whole through every action and mode, and the client's connected
socket takes the replies (so they came from the service's address); counters
are exact; rules change live; the fast path's fallbacks are counted; and the
command line as a user runs it."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import Lines, assert_run_averages, nft_udp_counter, unchecked_copy, wait_for
from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from ebpf import XdpRedirect, tc, xdp
from lab.fastpaths.redirect.testbed import router_testbed
from lab.traffic import Capture, FileTransfer, FileTransferServer, Flow, Marker, build, send_frames

ROOT = Path(__file__).resolve().parents[1]
N = 300


@pytest.fixture(scope="module")
def idle_rtb():
    """One testbed for the tests that only start the command and find nothing
    attached after it (each checks that): built once, not fourteen times."""
    with router_testbed() as tb:
        yield tb


@pytest.fixture
def rtb(request):
    """TX checksum offload on at the client and server, as a veth comes; a test
    may ask for it off (whole checksums) with indirect parametrisation."""
    with router_testbed(tx_csum_offload=getattr(request, "param", True)) as tb:
        yield tb


def to_service(tb, n, family=4, ttl=64, size=200, dport=None, marker=None):
    """n datagrams from the client to the service, as crafted frames (one flow, "s")."""
    src, dst = (tb.client4, tb.vip4) if family == 4 else (tb.client6, tb.vip6)
    flow = Flow("s", src, dst, "udp", sport=40000, dport=dport or tb.service_port, count=n, size=size)
    frames = build([flow], marker or Marker(), tb.topo.mac("client", "eth0"), tb.topo.mac("dut", "eth0"))
    if ttl != 64:
        frames = [bytes(Ether(f)) for f in frames]
        frames = [bytes(_with_ttl(Ether(f), ttl)) for f in frames]
    return frames


def _with_ttl(p, ttl):
    if IPv6 in p:
        p[IPv6].hlim = ttl
    else:
        p[IP].ttl = ttl
        del p[IP].chksum
    return p.__class__(bytes(p))


@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize("mode", ["native", "generic"])
@pytest.mark.parametrize("action", ["pass", "forward"])
def test_a_file_arrives_whole_and_replies_come_from_the_service(rtb, action, mode, family):
    transfer_through(rtb, action, mode, family)


@pytest.mark.parametrize("rtb", [False], indirect=True, ids=["senders without TX checksum offload"])
def test_a_file_arrives_whole_when_the_senders_checksums_are_whole_too(rtb):
    transfer_through(rtb, "forward", "native", 4)


def transfer_through(rtb, action, mode, family):
    vip, server = (rtb.vip4, rtb.server4) if family == 4 else (rtb.vip6, rtb.server6)
    with XdpRedirect(rtb.rules("udp"), action=action, netns=rtb.ns("dut")) as prog:
        prog.attach(rtb.dut_in, mode)
        prog.attach(rtb.dut_out, mode)
        with FileTransferServer(rtb.ns("server"), server, rtb.backend_port) as srv:
            # a connected client: a reply from anywhere but vip:8080 never reaches it
            rep = FileTransfer(rtb.ns("client"), "eth0", vip, rtb.service_port, size=2 << 20).send(seconds=30)
            done = srv.wait_result(timeout=10)
        c = prog.counters()
        rules = prog.rule_counters()
    assert rep.extra["ok"] and done["ok"] and rep.extra["sha256"] == done["sha256"]
    rule = rules[rtb.rules("udp")[0 if family == 4 else 1]]
    assert rule["packets"] == c["to_backend"] == rep.extra["datagrams"]  # every datagram the client sent
    assert rule["reply_packets"] == c["to_client"] > 0
    assert c["seen"] == c["pass"] + c["redirect"]
    if action == "forward":  # every rewritten frame sent on by the program (nothing here needs the kernel's way)
        assert c["redirect"] == c["to_backend"] + c["to_client"]
    else:
        assert c["redirect"] == 0


@pytest.mark.parametrize("action", ["pass", "forward"])
def test_counts_are_exact_and_rules_change_live(rtb, action):
    at_server = nft_udp_counter(rtb.ns("server"), rtb.backend_port)
    frames = to_service(rtb, N)
    with XdpRedirect(rtb.rules("udp", families=(4,)), action=action, netns=rtb.ns("dut")) as prog:
        prog.attach(rtb.dut_in)
        prog.attach(rtb.dut_out)
        send_frames(rtb.ns("client"), "eth0", frames, rate_pps=20000)
        wait_for(lambda: at_server() >= N, what=f"{N} datagrams at the server")
        assert at_server() == N and prog.counters()["to_backend"] == N
        prog.remove_rule(prog.rules[0])  # live: the same program, a map entry less
        send_frames(rtb.ns("client"), "eth0", frames, rate_pps=20000)
        wait_for(lambda: prog.counters()["unmatched"] >= N, what=f"{N} datagrams without a rule")
        assert prog.counters()["to_backend"] == N
        prog.add_rule(rtb.rules("udp", families=(4,))[0])
        send_frames(rtb.ns("client"), "eth0", frames, rate_pps=20000)
        wait_for(lambda: at_server() >= 2 * N, what=f"{2 * N} datagrams at the server")
        # (none of the ruleless ones arrived: the VIP is no address of the server's)
        assert at_server() == 2 * N and prog.rule_counters()[str(prog.rules[0])]["packets"] == N


def test_forward_leaves_to_the_kernel_what_its_fast_path_cannot_take(rtb):
    """TTL 1 (the kernel sends the ICMP error), no neighbour entry yet (the kernel
    resolves it, and the fast path takes over), larger than the egress MTU (the
    kernel fragments): each handed over rewritten, and counted by reason."""
    at_server = nft_udp_counter(rtb.ns("server"), rtb.backend_port)
    with XdpRedirect(rtb.rules("udp", families=(4,)), action="forward", netns=rtb.ns("dut")) as prog:
        prog.attach(rtb.dut_in)
        prog.attach(rtb.dut_out)
        send_frames(rtb.ns("client"), "eth0", to_service(rtb, 20, ttl=1), rate_pps=2000)
        wait_for(lambda: prog.counters()["slow_ttl"] >= 20, what="20 datagrams with TTL 1 at the router")
        c = prog.counters()
        assert c["slow_ttl"] == 20 and c["pass"] >= 20 and c["redirect"] == 0

        # no neighbour: the first datagram goes to the kernel, which resolves the server's
        # address and then sends it on; every one after it takes the fast path
        rtb.topo.run("dut", ["ip", "neigh", "del", rtb.server4, "dev", rtb.dut_out])
        send_frames(rtb.ns("client"), "eth0", to_service(rtb, 1), rate_pps=200)
        wait_for(lambda: at_server() >= 1, what="the first datagram, after the kernel resolved the server")
        c = prog.counters()
        assert (c["slow_no_neigh"], c["redirect"], c["to_backend"]) == (1, 0, 20 + 1)  # (the TTL 1 ones too)
        send_frames(rtb.ns("client"), "eth0", to_service(rtb, 49), rate_pps=2000)
        wait_for(lambda: at_server() >= 50, what="50 datagrams at the server")
        c = prog.counters()
        assert (c["slow_no_neigh"], c["redirect"], c["to_backend"]) == (1, 49, 20 + 50)

        rtb.topo.run("dut", ["ip", "link", "set", rtb.dut_out, "mtu", "1000"])
        send_frames(rtb.ns("client"), "eth0", to_service(rtb, 20, size=1200), rate_pps=2000)
        wait_for(lambda: prog.counters()["slow_too_big"] >= 20, what="20 datagrams too big for eth1")
        c = prog.counters()
        assert c["slow_too_big"] == 20 and c["redirect"] == 49
        wait_for(lambda: at_server() >= 50 + 20, what="70 datagrams at the server")
    assert at_server() == 50 + 20  # the kernel delivered them all (the big ones in fragments), the TTL 1 ones none


def test_forward_in_ipv6_decrements_the_hop_limit_and_leaves_1_and_too_big_to_the_kernel(rtb):
    """As TTL 1 in IPv4: the kernel, not the fast path, answers a hop limit of 1
    (ICMPv6 time exceeded), and a packet larger than the egress MTU (ICMPv6
    packet too big: IPv6 routers do not fragment); neither reaches the server.
    What the fast path forwards arrives with its hop limit one lower."""
    at_server = nft_udp_counter(rtb.ns("server"), rtb.backend_port)
    with XdpRedirect(rtb.rules("udp", families=(6,)), action="forward", netns=rtb.ns("dut")) as prog:
        prog.attach(rtb.dut_in)
        prog.attach(rtb.dut_out)
        send_frames(rtb.ns("client"), "eth0", to_service(rtb, 20, family=6, ttl=1), rate_pps=2000)
        wait_for(lambda: prog.counters()["seen"] >= 20, what="20 datagrams with hop limit 1 at the router")
        c = prog.counters()
        assert c["slow_ttl"] == 20 and c["redirect"] == 0 and c["to_backend"] == 20
        marker = Marker()
        with Capture(rtb.ns("server"), "eth0", marker, keep=True, expect=20) as cap:
            send_frames(rtb.ns("client"), "eth0", to_service(rtb, 20, family=6, ttl=2, marker=marker), rate_pps=2000)
        assert cap.counts == {"s": 20} and {Ether(f)[IPv6].hlim for f in cap.frames} == {1}
        # 1300 bytes of IPv6 to an egress of 1280: too big by the whole packet (header included)
        rtb.topo.run("dut", ["ip", "link", "set", rtb.dut_out, "mtu", "1280"])
        send_frames(rtb.ns("client"), "eth0", to_service(rtb, 20, family=6, size=14 + 1300), rate_pps=2000)
        wait_for(lambda: prog.counters()["slow_too_big"] >= 20, what="20 datagrams too big for eth1")
        c = prog.counters()
        assert c["slow_ttl"] == 20 and c["slow_too_big"] == 20
        assert c["redirect"] + c["slow_no_neigh"] == 20  # the hop-limit-2 ones only
    assert at_server() == 20


def redirect_cli(tb, *args, **kw):
    return tb.topo.run(
        "dut",
        [sys.executable, "-m", "lab", "redirect", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        **kw,
    )


@pytest.mark.parametrize(
    "args, status, message",
    [
        (["--iface", "eth9", "--rule", "udp:198.18.0.17:8080=198.18.2.2:8083"], 2, "no interface named 'eth9'"),
        (["--iface", "eth0", "--rule", "udp:198.18.0.17:8080"], 2, "bad rule 'udp:198.18.0.17:8080'"),
        (["--iface", "eth0", "--rule", "sctp:198.18.0.17:80=198.18.2.2:80"], 2, "bad rule"),
        (["--iface", "eth0", "--rule", "udp:198.18.0.17:0=198.18.2.2:8083"], 2, "port 0 is out of range"),
        (["--iface", "eth0", "--rule", "udp:198.18.0.17:8080=198.18.2.2:65536"], 2, "port 65536 is out of range"),
        (
            ["--iface", "eth0", "--rule", "udp:198.18.0.17:8080=[2001:2:0:2::2]:8083"],
            2,
            "an IPv4 service cannot have an IPv6 backend",
        ),
        (["--iface", "eth0", "--rule", "udp:2001:2::17:8080=[2001:2:0:2::2]:8083"], 2, "bad rule"),
        (
            [
                "--iface",
                "eth0",
                "--rule",
                "udp:198.18.0.17:8080=198.18.2.2:8083",
                "--rule",
                "udp:198.18.0.17:8080=198.18.2.2:9999",
            ],
            2,
            "two rules for udp:198.18.0.17:8080",
        ),
        (
            [
                "--iface",
                "eth0",
                "--rule",
                "udp:198.18.0.17:8080=198.18.2.2:8083",
                "--rule",
                "udp:198.18.0.18:8080=198.18.2.2:8083",
            ],
            2,
            "two rules send to backend udp:198.18.2.2:8083",
        ),
        (
            ["--iface", "eth0", "--rule", "udp:198.18.0.17:8080=198.18.2.2:8083", "--xdp-mode", "turbo"],
            2,
            "argument --xdp-mode: invalid choice: 'turbo'",
        ),
        (
            ["--iface", "eth0", "--rule", "udp:198.18.0.17:8080=198.18.2.2:8083", "--xdp-mode", "offload"],
            1,
            "offload needs a NIC that runs BPF, such as Netronome nfp: Invalid argument",
        ),
        (["--iface", "eth0"], 2, "--rule is required"),
    ],
)
def test_bad_input_is_one_line_and_attaches_nothing(idle_rtb, args, status, message):
    r = redirect_cli(idle_rtb, *args)
    assert r.returncode == status, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ": error: " in ln]
    others = [
        ln
        for ln in r.stderr.splitlines()
        if ": error: " not in ln and ": warning: " not in ln and not ln.startswith(("usage:", " "))
    ]  # argparse's usage lines come with its errors
    assert len(errors) == 1 and message in errors[0] and not others, r.stderr
    assert xdp.attached(idle_rtb.ns("dut")) == []


def test_the_old_spelling_of_the_xdp_mode_still_works_and_says_so(idle_rtb):
    """--mode was the redirect's XDP mode before every tool spelled it --xdp-mode;
    for one release it means the same, with a note."""
    r = redirect_cli(idle_rtb, "--iface", "eth0", "--rule", "udp:198.18.0.17:8080=198.18.2.2:8083", "--mode", "offload")
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == (
        "python -m lab redirect: warning: --mode is now --xdp-mode; the old spelling goes in the next release"
    ), r.stderr
    assert "offload needs a NIC that runs BPF" in lines[-1], r.stderr
    assert xdp.attached(idle_rtb.ns("dut")) == []


def test_not_root(idle_rtb):
    r = idle_rtb.topo.run(
        "dut",
        [
            "setpriv",
            "--bounding-set=-all",
            "--inh-caps=-all",
            sys.executable,
            "-m",
            "lab",
            "redirect",
            "--iface",
            "eth0",
            "--rule",
            idle_rtb.rules()[0],
        ],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 2 and r.stderr.startswith("python -m lab redirect: error: must run as root"), r.stderr


def test_verifier_rejection_shows_the_verifiers_line(idle_rtb, tmp_path):
    broken = unchecked_copy(ROOT / "ebpf/redirect/xdp_redirect.bpf.c", "ctx->data", tmp_path)
    code = (
        "import sys; from ebpf import XdpRedirect\n"
        f"p = XdpRedirect({idle_rtb.rules()!r}, source={str(broken)!r})\n"
        "try:\n    p.load_program()\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    )
    r = idle_rtb.topo.run("dut", [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.startswith("VerifierError verifier rejected xdp_redirect: ") and "packet" in r.stdout, r.stdout


def test_runs_counts_and_detaches_on_sigterm(rtb):
    at_server = nft_udp_counter(rtb.ns("server"), rtb.backend_port)
    proc = rtb.topo.popen(
        "dut",
        [
            sys.executable,
            "-m",
            "lab",
            "redirect",
            "--iface",
            "eth0",
            *sum((["--rule", r] for r in rtb.rules()), []),
            "--json",
            "--interval",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    first = json.loads(proc.stdout.readline())
    assert first["event"] == "attached" and first["ifaces"] == ["eth0", "eth1"]  # eth1: where replies arrive
    send_frames(rtb.ns("client"), "eth0", to_service(rtb, N), rate_pps=20000)
    send_frames(rtb.ns("client"), "eth0", to_service(rtb, N, family=6), rate_pps=20000)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "also attaching to eth1: replies from 198.18.2.2, 2001:2:0:2::2 arrive there" in err
    final = json.loads(out.splitlines()[-1])
    assert final["event"] == "final" and final["to_backend"] == 2 * N
    assert [v["packets"] for v in final["rules"].values()] == [N, N]
    assert_run_averages(final, final["rules"])
    assert at_server() == 2 * N  # both families reached the server (the inet table counts both)
    assert xdp.attached(rtb.ns("dut")) == []


def test_cleanup_after_sigkill_spares_a_running_one(rtb):
    killed = rtb.topo.popen(
        "dut",
        [sys.executable, "-m", "lab", "redirect", "--iface", "eth0", "--rule", rtb.rules()[0], "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert json.loads(killed.stdout.readline())["event"] == "attached"
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    left = xdp.attached(rtb.ns("dut"))
    assert len(left) == 2, "SIGKILL leaves the program on eth0 and eth1"
    r = redirect_cli(rtb, "--cleanup")
    assert r.returncode == 0 and r.stdout.count("removed xdp_redirect on") == 2, r.stdout
    assert xdp.attached(rtb.ns("dut")) == []
    live = rtb.topo.popen(
        "dut",
        [sys.executable, "-m", "lab", "redirect", "--iface", "eth0", "--rule", rtb.rules()[0], "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert json.loads(live.stdout.readline())["event"] == "attached"
        r = redirect_cli(rtb, "--cleanup")
        assert "left xdp_redirect on eth0 (native): pid" in r.stdout and len(xdp.attached(rtb.ns("dut"))) == 2
        r = redirect_cli(rtb, "--cleanup", "--all")
        assert r.stdout.count("removed") == 2
        out, err = live.communicate(timeout=15)
        assert live.returncode == 1 and "stopped: the program was removed from" in err, err
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()


def test_a_service_address_the_router_holds_has_its_replies_translated_after_routing(rtb):
    """The netfilter-vs-XDP report's design: the service address is the
    router's own. Given that source at XDP ingress, a reply would reach the
    kernel as a martian (IPv4 drops it), so with pass the tool translates those
    replies at TC egress towards the clients, and says where and why at start.
    Forward sends replies itself (no kernel on their way): XDP as usual."""
    rtb.topo.run("dut", ["ip", "addr", "add", f"{rtb.vip4}/32", "dev", "lo"])
    p = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            rtb.ns("dut"),
            sys.executable,
            "-m",
            "lab",
            "redirect",
            "--iface",
            "eth0",
            "--rule",
            rtb.rules()[0],
            "--rule",
            rtb.rules()[1],
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = Lines(p.stdout)
    try:
        line = out.wait_for("TC egress", timeout=60)
        filters = tc.filters_of("redirect", rtb.ns("dut"))
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    assert line.startswith(
        f"redirect: replies from the backends of {rtb.vip4} are given the service's address "
        f"at TC egress of eth0, after routing: {rtb.vip4} is this host's own address"
    )
    assert [(f.ifname, f.direction) for f in filters] == [("eth0", "egress")]
    assert tc.filters_of("redirect", rtb.ns("dut")) == []  # gone with it
    r = redirect_cli(rtb, "--iface", "eth0", "--rule", rtb.rules()[0], "--duration", "0.3", "--action", "forward")
    assert r.returncode == 0 and "TC egress" not in r.stdout
