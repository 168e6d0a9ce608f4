"""The load balancer at TC on live traffic, on a segment with the kernel's defaults
(user_segment: TX checksum offload and TSO on, no forwarding, nothing on the veth
peers): what BPF_PROG_TEST_RUN cannot show. A sender's TSO hands the LB GSO frames
whose checksums are partial; they must reach the backend whole and right. And the
LB beside an observer on the same hook: the vTAP's filter sees the frames before the
LB sends them on, whichever of the two started first."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT
from helpers import Tool

from ebpf import tc
from lab import netns
from lab.fastpaths.lb.testbed import user_segment

PORT = 7100
SIZE = 16 << 20  # bytes the client uploads: a few hundred GSO frames

SINK = r"""
import hashlib, socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(4)
print("ready", flush=True)
c, _ = s.accept()
h, n = hashlib.sha256(), 0
while b := c.recv(1 << 20):
    h.update(b)
    n += len(b)
c.sendall(f"{n} {h.hexdigest()}".encode())
c.close()
"""

UPLOAD = r"""
import socket, sys
data = bytes(range(256)) * (int(sys.argv[3]) // 256)
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
s.sendall(data)
s.shutdown(socket.SHUT_WR)
print(s.recv(200).decode())
"""


def counter(ns, name) -> int:
    out = netns.run(ns, ["nstat", "-az", name], capture_output=True, text=True).stdout
    return int(out.split()[-2]) if name in out else 0


def lost_retransmitted(ns) -> int:
    """Segments the host retransmitted that the receiver had not had: every retransmission
    but those it reported back as duplicates (D-SACK). A loaded two-CPU machine stalls a
    sender past its timers now and then (a whole GSO frame, 45 segments, sent again at the
    tail-loss probe or timeout, found under a loaded suite with nothing lost on any link);
    those reach the receiver twice, and say nothing about what the LB did."""
    return counter(ns, "TcpRetransSegs") - counter(ns, "TcpExtTCPDSACKRecvSegs")


def csum_errors(ns) -> int:
    out = netns.run(ns, ["nstat", "-az", "TcpInCsumErrors"], capture_output=True, text=True).stdout
    return int(out.split()[-2]) if "TcpInCsumErrors" in out else 0


def upload(tb, v6, size, mode="nat", during=None):
    """`size` bytes from the client to a service on the one backend, through `lab lb` at
    TC (--hook auto on a veth): (the backend's "count digest", the LB's final counters,
    the backend's row name, the VIP). during(): called once the LB serves, before the
    upload (what to read before it)."""
    vip, be = (tb.vip6, tb.backend6(0)) if v6 else (tb.vip4, tb.backend4(0))
    name = f"[{be}]:{PORT}" if v6 else f"{be}:{PORT}"
    svc = f"tcp:[{vip}]:{PORT}" if v6 else f"tcp:{vip}:{PORT}"
    bound = vip if mode == "dsr" else be  # in DSR the backend answers from the VIP it holds
    sink = tb.topo.popen("be1", [sys.executable, "-c", SINK, bound, str(PORT)], stdout=subprocess.PIPE, text=True)
    tool = None
    try:
        assert sink.stdout.readline().strip() == "ready"
        args = ["--iface", "eth0", "--service", svc, "--backend", name, "--mode", mode, "--health-check", "none"]
        tool = Tool(tb.ns("lb"), "lb", *args)
        assert tool.attached["hook"] == "tc", tool.attached
        if during:
            during()
        # The sender on one CPU: a veth hands each frame to the backlog of the CPU that sends
        # it, and every hop after runs from there. A sender that moves to the other CPU
        # mid-stream has its next frames processed beside the last ones, and a GSO frame
        # overtakes another (seen as 45 to 180 retransmitted segments under a loaded suite,
        # with no frame lost anywhere; none with the sender pinned, and none going direct,
        # where there are fewer hops). What is checked is what the LB does to the frames.
        cpu = str(min(os.sched_getaffinity(0)))
        got = tb.topo.run(
            "client",
            ["taskset", "-c", cpu, sys.executable, "-c", UPLOAD, vip, str(PORT), str(size)],
            timeout=60,
            capture_output=True,
            text=True,
        )
        final, _ = tool.stop()
    finally:
        if tool:
            tool.kill()
        sink.kill()
        sink.wait()
    return got.stdout.strip(), final, name, vip


@pytest.mark.parametrize("mode", ["nat", "dsr"])
@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_an_upload_in_gso_frames_with_partial_checksums_arrives_whole(mode, v6):
    """16 MB from the client to a service, through the LB at TC (--hook auto on a veth),
    the senders' offloads as a veth comes: every byte arrives, in order (the backend's
    digest), with no checksum error at either end and nothing that had to be sent again
    (a retransmission the receiver had had already is the machine's timing); the LB's
    counters show frames far longer than the MTU went through it whole (GSO)."""
    with user_segment(backends=1, dsr=mode == "dsr") as tb:
        before = []
        got, final, name, _ = upload(
            tb,
            v6,
            SIZE,
            mode,
            lambda: before.extend((lost_retransmitted(tb.ns("client")), lost_retransmitted(tb.ns("be1")))),
        )
        want = hashlib.sha256(bytes(range(256)) * (SIZE // 256)).hexdigest()
        assert got == f"{SIZE} {want}"
        assert [lost_retransmitted(tb.ns("client")), lost_retransmitted(tb.ns("be1"))] == before
        assert csum_errors(tb.ns("client")) == csum_errors(tb.ns("be1")) == 0
        assert final["drop"] == 0 and final["dropped_too_big"] == 0, final
        row = final["backends"][name]
        assert row["bytes"] / row["packets"] > 3000, row  # GSO frames, sent on whole


def monitor(tb):
    """A monitor for the vTAP on the LB host: mon0, its copies counted at mon1."""
    ns = tb.ns("lb")
    netns.run(ns, ["ip", "link", "add", "mon0", "type", "veth", "peer", "name", "mon1"], check=True)
    for dev in ("mon0", "mon1"):
        netns.run(ns, ["ip", "link", "set", dev, "up"], check=True)


def rx_packets(ns, dev) -> int:
    out = netns.run(ns, ["ip", "-j", "-s", "link", "show", dev], capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["stats64"]["rx"]["packets"]


@pytest.mark.parametrize("first", ["vtap", "lb"])
def test_the_vtap_sees_the_lbs_frames_whichever_starts_first(first):
    """The vTAP's filter goes first on the hook and hands every frame on (TC_ACT_UNSPEC);
    the LB's goes after every filter there: each client packet to the VIP is copied to the
    monitor and then balanced, in either start order."""
    with user_segment(backends=1) as tb:
        monitor(tb)
        ns = tb.ns("lb")
        vtap_argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "vtap", "--monitor", "mon0"]
        vtap_argv += ["--iface", "eth0", "--direction", "ingress", "--watch", f"{tb.client4}/32", "--json"]
        sink = tb.topo.popen(
            "be1", [sys.executable, "-c", SINK, tb.backend4(0), str(PORT)], stdout=subprocess.PIPE, text=True
        )
        procs, tool = [], None
        try:
            assert sink.stdout.readline().strip() == "ready"
            for who in (first, "lb" if first == "vtap" else "vtap"):
                if who == "vtap":
                    v = subprocess.Popen(vtap_argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    procs.append(v)
                    assert '"attached"' in v.stdout.readline(), v.stderr.read()
                else:
                    args = ["--iface", "eth0", "--service", f"tcp:{tb.vip4}:{PORT}"]
                    tool = Tool(ns, "lb", *args, "--backend", f"{tb.backend4(0)}:{PORT}", "--health-check", "none")
            filters = tc.filters_of("vtap", ns) + tc.filters_of("lab-lb", ns)
            prio = {f.entry.name.split(":")[-1]: f.entry.prio for f in filters if f.direction == "ingress"}
            assert prio["tc_lb"] > max(p for n, p in prio.items() if n != "tc_lb"), prio
            copies = rx_packets(ns, "mon1")
            got = tb.topo.run(
                "client",
                [sys.executable, "-c", UPLOAD, tb.vip4, str(PORT), str(1 << 16)],
                timeout=30,
                capture_output=True,
                text=True,
            )
            assert got.stdout.split()[0] == str(1 << 16)
            final, _ = tool.stop()
            tool = None
        finally:
            if tool:
                tool.kill()
            for p in procs:
                p.terminate()
                p.wait(timeout=30)
            sink.kill()
            sink.wait()
        # every client frame the LB balanced was copied first (ARP and the like too: more, never fewer)
        assert final["to_backend"] > 0 and rx_packets(ns, "mon1") - copies >= final["to_backend"], final


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_a_sender_learns_the_lbs_smaller_mtu_from_its_icmp_error(v6):
    """The LB's interface has a smaller MTU (1400) than the rest of the segment (1500), as
    a misconfigured segment does. A veth still hands it the client's GSO frames (their
    segments are checked only when they leave): the LB answers the first with the error
    forwarding would send ("fragmentation needed", "packet too big"), the client's kernel
    takes the smaller MTU for the VIP (its route cache says 1400) and the upload arrives
    whole. Without the error the connection stalled: nothing fragments for a program
    that redirects."""
    with user_segment(backends=1) as tb:
        netns.run(tb.ns("lb"), ["ip", "link", "set", "eth0", "mtu", "1400"], check=True)
        got, final, _, vip = upload(tb, v6, 1 << 22)
        assert got.split()[0] == str(1 << 22), got
        route = netns.run(tb.ns("client"), ["ip", "route", "get", vip], capture_output=True, text=True).stdout
        assert "mtu 1400" in route, route
        assert final["too_big"] >= 1 and final["dropped_too_big"] == 0, final
