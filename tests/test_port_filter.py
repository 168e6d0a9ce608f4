"""The worked example of docs/adding-a-fast-path.md, a fast path added
through the registry: the XDP port filter's golden fixtures (BPF_PROG_TEST_RUN),
its command line on real traffic, its nftables peer, a tiny bench run, and the
guide held against the code it walks through."""

import json
import re
import signal
import socket
import subprocess
import sys

import pandas as pd
import pytest
from conftest import ROOT, require_tool
from helpers import wait_for
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Raw

from ebpf import InputError, testrun, xdp
from ebpf.port_filter.xdp_port_filter import XdpPortFilter
from lab import netns
from lab.fastpath import fastpath, tool_table
from lab.fastpaths.port_filter import bench
from lab.fastpaths.port_filter.peers import NftFilter
from lab.testbeds import pair
from lab.traffic import Flow, Marker, build, send_frames

ETH = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
A4, B4, A6, B6 = "198.18.1.1", "198.18.1.2", "2001:2:0:1::1", "2001:2:0:1::2"
DROP = ["udp:9", "tcp:23"]

# description, frame, verdict, the reason it is counted under
FIXTURES = [
    ("udp to a dropped port", ETH / IP(src=A4, dst=B4) / UDP(sport=1000, dport=9) / b"x", "XDP_DROP", "filtered"),
    ("tcp to a dropped port", ETH / IP(src=A4, dst=B4) / TCP(sport=1000, dport=23, flags="S"), "XDP_DROP", "filtered"),
    ("udp6 to a dropped port", ETH / IPv6(src=A6, dst=B6) / UDP(sport=1000, dport=9), "XDP_DROP", "filtered"),
    (
        "a VLAN-tagged udp to a dropped port",
        ETH / Dot1Q(vlan=5) / IP(src=A4, dst=B4) / UDP(dport=9),
        "XDP_DROP",
        "filtered",
    ),
    (
        "IPv4 options, udp to a dropped port",
        ETH / IP(src=A4, dst=B4, options=b"\x94\x04\x00\x00") / UDP(dport=9),
        "XDP_DROP",
        "filtered",
    ),
    ("udp to another port", ETH / IP(src=A4, dst=B4) / UDP(sport=1000, dport=10), "XDP_PASS", "unmatched"),
    ("tcp to the port dropped for udp", ETH / IP(src=A4, dst=B4) / TCP(dport=9), "XDP_PASS", "unmatched"),
    (
        "the source port dropped, not the destination",
        ETH / IP(src=A4, dst=B4) / UDP(sport=9, dport=10),
        "XDP_PASS",
        "unmatched",
    ),
    ("icmp", ETH / IP(src=A4, dst=B4) / ICMP(), "XDP_PASS", "unmatched"),
    ("arp", Ether(src="02:00:00:00:00:01", dst="ff:ff:ff:ff:ff:ff") / ARP(pdst=B4), "XDP_PASS", "not_ip"),
    ("a later fragment (no ports)", ETH / IP(src=A4, dst=B4, frag=8, proto=17) / (b"x" * 16), "XDP_PASS", "fragment"),
    (
        "a udp header cut short",
        Raw(bytes(ETH / IP(src=A4, dst=B4) / UDP(dport=9))[: 14 + 20 + 4]),
        "XDP_PASS",
        "malformed",
    ),
]


@pytest.fixture(scope="module")
def port_filter():
    with XdpPortFilter(DROP) as f:
        f.load_program()
        yield f


@pytest.mark.parametrize("what, frame, verdict, reason", FIXTURES, ids=[f[0] for f in FIXTURES])
def test_fixture(port_filter, what, frame, verdict, reason):
    port_filter.reset_counters()
    r = testrun.run(port_filter.load_program().fd, bytes(frame))
    assert r.verdict == verdict and r.data == bytes(frame), what  # never rewritten
    c = port_filter.counters()
    assert c["seen"] == c[reason] == 1 == c["drop" if verdict == "XDP_DROP" else "pass"], (what, c)
    assert c["dropped_filtered"] == (reason == "filtered")


def test_the_list_changes_live_and_bad_ports_are_refused(port_filter):
    frame = bytes(ETH / IP(src=A4, dst=B4) / UDP(dport=53))
    fd = port_filter.load_program().fd
    assert testrun.run(fd, frame).verdict == "XDP_PASS"
    port_filter.set_ports(DROP + ["udp:53"])
    assert testrun.run(fd, frame).verdict == "XDP_DROP"
    port_filter.set_ports(DROP)
    assert testrun.run(fd, frame).verdict == "XDP_PASS"
    for bad in ("udp:0", "sctp:9", "udp", "udp:65536"):
        with pytest.raises(InputError, match="bad port"):
            XdpPortFilter([bad])


SO_RCVBUFFORCE = 33  # <asm-generic/socket.h>; Python does not name it (root may pass rmem_max)


def receiver(ns, port):
    """A UDP socket of namespace `ns` on `port`: how many datagrams it received."""
    with netns.entered(ns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # Room for every datagram a test sends before it reads: the default buffer
    # holds 256 of them (UdpRcvbufErrors counted the rest).
    s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 4 << 20)
    s.bind(("0.0.0.0", port))
    s.setblocking(False)
    got = [0]

    def count():
        try:
            while True:
                s.recv(2048)
                got[0] += 1
        except BlockingIOError:
            pass
        return got[0]

    return s, count


def send_udp(tb, port, n):
    frames = build(
        [Flow(f"p{port}", tb.addr("a", "eth0"), tb.addr("b", "eth0"), "udp", dport=port, count=n)],
        Marker(),
        tb.mac("a", "eth0"),
        tb.mac("b", "eth0"),
    )
    return send_frames(tb.ns("a"), "eth0", frames, rate_pps=5000)


@pytest.mark.parametrize("peer", ["command", "nft"])
def test_real_traffic_is_dropped_exactly_and_the_rest_arrives(peer):
    """N datagrams to the dropped port and N to another, from another
    namespace: the filter counts N dropped, and the receiver's socket on the
    other port gets all N; through the command line, and through the nftables
    rule the bench compares it with."""
    n = 300
    with pair("a", "b", "pfreal") as tb:
        s9, got9 = receiver(tb.ns("b"), 9)
        s10, got10 = receiver(tb.ns("b"), 10)
        try:
            if peer == "command":
                proc = tb.popen(
                    "b",
                    [
                        sys.executable,
                        "-m",
                        "lab",
                        "port-filter",
                        "--iface",
                        "eth0",
                        "--drop",
                        "udp:9",
                        "--json",
                        "--interval",
                        "0.2",
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=ROOT,
                )
                assert json.loads(proc.stdout.readline())["event"] == "attached", proc.stderr.read()
                filt = None
            else:
                filt = NftFilter(tb.ns("b"), "eth0", ["udp:9"]).__enter__()
            assert send_udp(tb, 9, n).packets == n and send_udp(tb, 10, n).packets == n
            wait_for(lambda: got10() == n, what=f"{n} datagrams at port 10")
            if filt is None:
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=15)
                assert proc.returncode == 0, err
                final = json.loads(out.splitlines()[-1])
                assert final["event"] == "final" and final["drop"] == n and final["dropped_filtered"] == n, final
                assert final["seen"] == final["drop"] + final["pass"]
            else:
                assert filt.counters()["dropped"] == n
                filt.close()
            assert got9() == 0 and got10() == n
            assert xdp.attached(tb.ns("b")) == []
        finally:
            s9.close()
            s10.close()


def test_a_killed_filter_is_removed_by_cleanup():
    with pair("a", "b", "pfkill") as tb:
        argv = [sys.executable, "-m", "lab", "port-filter", "--iface", "eth0", "--drop", "udp:9", "--json"]
        proc = tb.popen("b", argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        assert json.loads(proc.stdout.readline())["event"] == "attached"
        proc.kill()
        proc.wait()
        assert len(xdp.attached(tb.ns("b"))) == 1
        r = tb.run(
            "b", [sys.executable, "-m", "lab", "port-filter", "--cleanup"], capture_output=True, text=True, cwd=ROOT
        )
        assert r.returncode == 0 and "port-filter: removed xdp_port_filter on eth0" in r.stdout, r.stdout
        assert xdp.attached(tb.ns("b")) == []


def test_bad_input_is_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "lab", "port-filter", "--iface", "eth0", "--drop", "sctp:9"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "python -m lab port-filter: error: bad port 'sctp:9': want PROTO:PORT, PROTO tcp or udp, PORT 1-65535 (udp:9)"
    ], r.stderr


def test_a_tiny_bench_run(tmp_path):
    """Every peer once: the CSV has the documented columns, what was sent
    arrived, and each filter dropped exactly what arrived (none dropped none)."""
    require_tool("nft")
    df, path = bench.run(["none", "xdp", "nft"], ["native"], [64], 1, 0.5, 20000, out=tmp_path, progress=False)
    assert list(df.columns[: len(bench.COLUMNS)]) == bench.COLUMNS
    assert sorted(df["peer"]) == ["nft", "none", "xdp"]
    for _, r in df.iterrows():
        arrived = r["sent_packets"] - r["sender_dropped"]
        assert r["sent_packets"] == 10_000 and arrived > 0
        assert r["dropped"] == (0 if r["peer"] == "none" else arrived), r
        assert r["dut_ns_per_pkt"] > 0
    assert pd.read_csv(path).shape == df.shape


def test_it_is_in_the_registry_and_every_listing_that_reads_it():
    """Added as a folder, and nothing else: the command line, the benches and
    the README's table of tools know it from the registry."""
    fp = fastpath("port-filter")
    assert fp.program_class() is XdpPortFilter and set(fp.peer_classes()) == {"none", "xdp", "nft"}
    lab_help = subprocess.run([sys.executable, "-m", "lab", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert re.search(r"^  port-filter\s+drop TCP/UDP frames to listed ports$", lab_help.stdout, re.M)
    bench_help = subprocess.run(
        [sys.executable, "-m", "lab", "bench", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert "port-filter" in bench_help.stdout
    assert "| **port-filter**: drop TCP/UDP frames to listed ports |" in tool_table()


GUIDE = ROOT / "docs" / "adding-a-fast-path.md"


def test_the_guide_stands_on_the_code(tmp_path):
    """docs/adding-a-fast-path.md cannot rot: each excerpt stands verbatim in
    the file its first line names, its table of files is the example's files,
    and its smoke run of the bench runs."""
    text = GUIDE.read_text()
    blocks = re.findall(r"```(\w+)\n(.*?)```", text, re.S)
    excerpts = [(b.splitlines()[0], b.splitlines()[1:]) for lang, b in blocks if lang in ("c", "python")]
    assert len(excerpts) >= 6
    for head, lines in excerpts:
        path = ROOT / head.lstrip("/# ").strip()
        assert "\n".join(lines) in path.read_text(), f"{head}: the excerpt no longer stands in the file"
    listed = set(re.findall(r"^\| `([\w/.]+)` \|", text, re.M))
    example = {
        str(p.relative_to(ROOT))
        for p in [
            *(ROOT / "ebpf/port_filter").glob("*.[pc]*"),
            *(ROOT / "lab/fastpaths/port_filter").glob("*.py"),
            ROOT / "tests/test_port_filter.py",
        ]
    }
    assert listed == example
    count = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()[
        len(example)
    ]
    assert re.search(rf"^{count.capitalize()} files and this page, and one line in a shared file", text, re.M), (
        f"the guide's count is not the {count} files the example has"
    )
    (cmd,) = [b.strip() for lang, b in blocks if lang == "sh"]
    r = subprocess.run(
        [sys.executable, *cmd.split()[1:], "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode == 0 and "wrote" in r.stdout, r.stderr
    assert len(list(tmp_path.glob("port_filter-*.csv"))) == 1
