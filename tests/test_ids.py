"""The IDS experiment (issue 10): the attack generator and its truth, Suricata in
a lab namespace (lab.daemons.suricata), and `python -m lab bench ids` on Testbed 3."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter

import pandas as pd
import pytest
from conftest import ROOT, require_tool
from helpers import assert_bench_refused, start_until
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.layers.vxlan import VXLAN

from lab import cgroups, netns
from lab.daemons import suricata as ids
from lab.runs import RUN_DIR
from lab.testbeds import pair
from lab.traffic import attacks, elephants

PY = sys.executable


@pytest.fixture(autouse=True)
def tools(request):
    """Suricata and tcpreplay, but for the tests of the pure-Python attack generator."""
    if request.node.get_closest_marker("generator_only"):
        return
    require_tool("suricata")
    require_tool("tcpreplay")


def lab_cmd(*args, timeout=600, **kw):
    return subprocess.run([PY, "-m", "lab", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw)


def suricata_leftovers():
    """Run directories, cgroups and processes of this lab instance's Suricatas (the
    suite's other worker is another instance: lab.netns.PREFIX)."""
    mine = f"{RUN_DIR}/{netns.PREFIX}".encode()
    dirs = sorted(RUN_DIR.glob(f"{netns.PREFIX}*{ids.SUFFIX}")) if RUN_DIR.exists() else []
    procs = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"suricata") and any(mine in c for c in cmd):
                procs.append(int(p))
    return dirs, own_cgroups(), procs


def own_cgroups():
    return [c for c in cgroups.lab_cgroups() if c.name.startswith(netns.PREFIX)]


# --- the generator and its truth -------------------------------------------------------


@pytest.mark.generator_only
def test_generator_is_deterministic_and_repetitions_multiply_the_truth(tmp_path):
    a, b = attacks.generate(seed=5, repetitions=6), attacks.generate(seed=5, repetitions=6)
    attacks.write_pcap(tmp_path / "a.pcap", a.frames)
    attacks.write_pcap(tmp_path / "b.pcap", b.frames)
    digest = [hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() for n in ("a.pcap", "b.pcap")]
    assert digest[0] == digest[1] and a.truth == b.truth
    assert attacks.generate(seed=6, repetitions=6).frames != a.frames
    one = attacks.generate(seed=5, repetitions=1)
    assert a.truth == Counter({sid: 6 * n for sid, n in one.truth.items()})
    # every signature of the project's ruleset is exercised (the markers deep in long
    # transfers by lab.traffic.elephants), and nothing else is expected
    assert set(a.truth) | set(elephants.MARKS.values()) == set(attacks.rule_messages()) and all(a.truth.values())
    assert not set(a.truth) & set(elephants.MARKS.values())
    assert attacks.read_pcap(tmp_path / "a.pcap") == a.frames


@pytest.mark.generator_only
def test_derived_repetitions_keep_each_checksum_right_or_wrong_as_crafted():
    t = attacks.generate(seed=2, repetitions=attacks.CRAFTED + 1)
    n = len(attacks.generate(seed=2, repetitions=1).frames)  # repetition 0, the same with the same seed
    crafted, derived = t.frames[:n], t.frames[-n:]  # the last repetition is derived from repetition 0
    assert crafted != derived

    def valid(frame):
        """{layer: checksum as crafted == checksum scapy computes} for IP and, in
        unfragmented packets, TCP/UDP (a UDP checksum of 0 is "none")."""
        pkt = Ether(frame)
        out = {}
        for layer in (IP, TCP, UDP):
            if layer not in pkt or (layer is not IP and (pkt[IP].frag or pkt[IP].flags.MF)):
                continue
            if layer is UDP and pkt[UDP].chksum == 0:
                continue
            redo = Ether(frame)
            del redo[layer].chksum
            out[layer.__name__] = Ether(bytes(redo))[layer].chksum == pkt[layer].chksum
        return out

    checked = Counter()
    for c, d in zip(crafted, derived, strict=True):
        vc, vd = valid(c), valid(d)
        assert vc == vd, (Ether(c).summary(), vc, vd)
        for k, v in vc.items():
            checked[(k, v)] += 1
    assert checked[("IP", False)] and checked[("TCP", False)] and checked[("TCP", True)] and checked[("UDP", True)]


def test_truth_agrees_with_suricata_reading_the_pcap_offline(tmp_path):
    t = attacks.generate(seed=3, repetitions=attacks.CRAFTED + 3)
    pcap = tmp_path / "attacks.pcap"
    attacks.write_pcap(pcap, t.frames)
    seen = ids.offline(pcap, attacks.RULES, home_net=attacks.HOME_NET)
    assert seen.decoder_packets == len(t.frames)
    assert dict(seen.alerts) == dict(t.truth)
    # and the truth file says the same, read back
    attacks.write_truth(tmp_path / "truth.csv", t.truth)
    assert attacks.read_truth(tmp_path / "truth.csv") == t.truth


# --- Suricata in a namespace ----------------------------------------------------------


def test_suricata_lifecycle_counts_alerts_and_leaves_nothing(tmp_path):
    rules = tmp_path / "ping.rules"
    rules.write_text('alert icmp any any -> any any (msg:"ping"; itype:8; sid:1; rev:1;)\n')
    before = suricata_leftovers()
    with pair() as t:
        s = ids.Suricata(t.ns("b"), "eth0", rules, cpu=1, quota_pct=50)
        with s:
            assert s.running and s.dir.is_dir() and s.cgroup.path.is_dir()
            assert s.proc.pid in [int(x) for x in s.cgroup.procs_file.read_text().split()]
            t.run("a", ["ping", "-c", "7", "-i", "0.01", "-q", t.addr("b", "eth0")], capture_output=True)
            s.wait_idle(14)  # 7 requests in, 7 replies out: the socket sees both directions
            res = s.stop()
            assert not s.running
        assert res.alerts == Counter({1: 7}) and res.kernel_packets == 14 and res.kernel_drops == 0
        assert not s.dir.exists() and not s.cgroup.path.exists()
    assert suricata_leftovers() == before


def test_suricata_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "bad.rules"
    bad.write_text('alert tcp any any -> any any (msg:"typo"; contnt:"x"; sid:2; rev:1;)\n')
    with pair() as t:
        with pytest.raises(netns.LabError, match=r"did not start: detect-parse: unknown rule keyword 'contnt'"):
            ids.Suricata(t.ns("b"), "eth0", bad).start()
        with pytest.raises(netns.LabError, match=r"nosuch0"):
            ids.Suricata(t.ns("b"), "nosuch0", attacks.RULES).start()
        with pytest.raises(netns.LabError, match=r"rules file .*missing.rules not found"):
            ids.Suricata(t.ns("b"), "eth0", tmp_path / "missing.rules")
        with pytest.raises(ValueError, match=r"outside 1\.\."):
            ids.Suricata(t.ns("b"), "eth0", attacks.RULES, quota_pct=1000)
    assert not list(RUN_DIR.glob(f"{netns.PREFIX}*{ids.SUFFIX}")) and not own_cgroups()


# --- the bench ----------------------------------------------------------------------------


def read_bench(out):
    main = [p for p in out.glob("ids-*.csv") if not p.name.endswith("-signatures.csv")]
    assert len(main) == 1
    return pd.read_csv(main[0]), pd.read_csv(ids_signatures(main[0]))


def ids_signatures(path):
    return path.with_name(path.stem + "-signatures.csv")


def test_low_rate_replay_through_testbed3_raises_exactly_the_truth(tmp_path):
    r = lab_cmd(
        "bench",
        "ids",
        "--rates",
        "1",
        "--trials",
        "1",
        "--cpu-quota",
        "50,none",
        "--loop",
        "2",
        "--seed",
        "4",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    df, sigs = read_bench(tmp_path)
    truth = attacks.generate(seed=4, repetitions=2).truth
    assert len(df) == 2 and sorted(df["cpu_quota_pct"].fillna(0)) == [0, 50]
    frames = len(attacks.generate(seed=4, repetitions=2).frames)
    for _, row in df.iterrows():
        assert row["packets_sent"] == frames and row["mirrored"] == frames
        for who in ("receiver", "monitor"):
            assert row[f"{who}_packets"] == frames and row[f"{who}_drops"] == 0
            assert row[f"{who}_alerts"] == row["expected_alerts"] == sum(truth.values())
            assert row[f"{who}_correct"]
    assert len(sigs) == 2 * 2 * len(truth)
    for (_, who, sid), g in sigs.groupby(["cpu_quota_pct", "ids", "sid"], dropna=False):
        assert list(g["alerts"]) == list(g["expected"]) == [truth[sid]], (who, sid)
    # the summary table: a row per quota, each IDS's trials whose alerts are exactly the truth
    table = r.stdout.splitlines()
    head = next(i for i, ln in enumerate(table) if "expected" in ln and "|" in ln)
    assert table[head].count("correct") == 2
    rows = [ln for ln in table[head + 1 :] if "|" in ln]
    assert len(rows) == 2 and all(ln.count(" 1/1 ") == 2 for ln in rows), rows
    # the sidecar records --loop as given (it said 1: tcpreplay's loop count)
    params = json.loads(next(tmp_path.glob("ids-*.json")).read_text())["parameters"]
    assert (params["loop"], params["repetitions"], params["tcpreplay_loop"]) == (2, 2, 1)
    # the progress bar numbers trials as the CSV does, from 0 (it said t1 for the CSV's trial 0)
    assert set(df["trial"]) == {0}
    assert set(re.findall(r"trial (\d+)", r.stderr)) == {"0"}, r.stderr


def test_a_remote_collector_behind_vxlan_raises_exactly_the_truth(tmp_path):
    """--at remote: the monitor's Suricata on a collector two hops away, the
    copies in VXLAN from vTAP sessions: it reads every copy (as the outer
    packets the tunnel carries) and raises exactly the alerts the truth says,
    as the receiver's does."""
    r = lab_cmd(
        "bench",
        "ids",
        "--rates",
        "1",
        "--trials",
        "1",
        "--cpu-quota",
        "none",
        "--loop",
        "2",
        "--seed",
        "5",
        "--at",
        "remote",
        "--out",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    df, sigs = read_bench(tmp_path)
    gen = attacks.generate(seed=5, repetitions=2)
    frames, truth = len(gen.frames), gen.truth
    assert len(df) == 1
    row = df.iloc[0]
    assert row["monitor_at"] == "remote"
    assert row["packets_sent"] == row["mirrored"] == frames
    # the collector's link carries a few frames of its own (the router's ARP and
    # neighbour discovery for it): the copies are all there, and little else
    assert row["receiver_packets"] == frames <= row["monitor_packets"] <= frames + 16
    for who in ("receiver", "monitor"):
        assert row[f"{who}_drops"] == 0
        assert row[f"{who}_alerts"] == sum(truth.values()) and row[f"{who}_correct"]
    assert set(sigs["monitor_at"]) == {"remote"}
    assert " remote " in r.stdout


def test_users_pcap_truth_and_watch_list(tmp_path):
    """A pcap of the user's is replayed unchanged; --truth is what is expected;
    --watch narrows what the vTAP copies to the monitor."""
    t = attacks.generate(seed=8, repetitions=1)
    pcap, truth = tmp_path / "mine.pcap", tmp_path / "truth.csv"
    attacks.write_pcap(pcap, t.frames)
    attacks.write_truth(truth, t.truth)
    addrs = Counter(ip for f in t.frames if f[12:14] == b"\x08\x00" for ip in (f[26:30], f[30:34]))
    victim = ".".join(map(str, max((a for a in addrs if a[:3] == bytes([198, 18, 1])), key=addrs.get)))
    out = tmp_path / "out"
    r = lab_cmd(
        "bench",
        "ids",
        "--rates",
        "1",
        "--trials",
        "1",
        "--cpu-quota",
        "none",
        "--pcap",
        str(pcap),
        "--truth",
        str(truth),
        "--home-net",
        attacks.HOME_NET,
        "--watch",
        f"{victim}/32",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    df, sigs = read_bench(out)
    row = df.iloc[0]
    watched = sum(1 for f in t.frames if victim in (Ether(f)[IP].src, Ether(f)[IP].dst))
    assert 0 < watched < len(t.frames)
    assert row["packets_sent"] == len(t.frames) and row["receiver_packets"] == len(t.frames)
    assert row["mirrored"] == row["monitor_packets"] == watched
    assert row["receiver_correct"] and row["receiver_alerts"] == sum(t.truth.values())
    assert row["monitor_alerts"] < row["receiver_alerts"]


def test_traffic_in_a_vxlan_tunnel_alerts_on_the_inner_packets(tmp_path):
    """A user's pcap of tunnelled traffic (VXLAN, as between two hypervisors):
    the vTAP copies the outer frames, and both IDSes look inside them."""
    t = attacks.generate(seed=9, repetitions=1)
    outer = [
        bytes(
            Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
            / IP(src="198.18.9.1", dst="198.18.9.2")
            / UDP(sport=40000 + i % 512, dport=4789)
            / VXLAN(vni=42)
            / Ether(f)
        )
        for i, f in enumerate(t.frames)
    ]
    pcap = tmp_path / "vxlan.pcap"
    attacks.write_pcap(pcap, outer)
    out = tmp_path / "out"
    r = lab_cmd(
        "bench",
        "ids",
        "--rates",
        "2",
        "--trials",
        "1",
        "--cpu-quota",
        "none",
        "--pcap",
        str(pcap),
        "--home-net",
        attacks.HOME_NET,
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    df, sigs = read_bench(out)
    row = df.iloc[0]
    assert row["expected_alerts"] == sum(t.truth.values())  # Suricata offline, on the same pcap
    # frames 50 bytes longer than a 1500-byte MTU allows: the testbed's links are
    # made to fit the pcap's longest (tcpreplay once refused 36 of them, silently)
    assert max(map(len, outer)) > 1514 and row["packets_failed"] == 0
    assert row["mirrored"] == row["packets_sent"] == len(outer)
    for who in ("receiver", "monitor"):
        assert row[f"{who}_correct"] and row[f"{who}_drops"] == 0
    got = sigs[sigs["ids"] == "monitor"].set_index("sid")["alerts"].to_dict()
    assert got == dict(t.truth)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pcap", "/nonexistent/x.pcap"], r"pcap file /nonexistent/x.pcap not found"),
        (["--rules", "/nonexistent/x.rules"], r"rules file /nonexistent/x.rules not found"),
        (["--rates", "fast"], r"unknown rate 'fast'"),
        (["--cpu-quota", "lots"], r"unknown CPU quota 'lots'"),
        (["--home-net", "198.18.1.0/33"], r"--home-net: '198.18.1.0/33' is not an address or CIDR"),
        (["--truth", "/nonexistent/t.csv"], r"truth file /nonexistent/t.csv not found"),
        (["--loop", "20000"], r"--loop 20000 would make a 2\.\d GB pcap; the most is 1\.1 GB"),
        (["--loop", "3000", "--rates", "1,10"], r"one replay at 1 Mbps would take \d+ s, more than a load run may"),
        (["--cpus", "0,7"], r"--cpus 0,7: this machine has CPUs 0\.\.\d"),
        (["--at", "moon"], r"unknown --at place 'moon' \(choose from local, remote\)"),
        (["--cutoff", "0,lots"], r"--cutoff must be bytes \(65536, 64K, 1MiB\), not 'lots'"),
        (["--elephants", "4"], r"--elephants must be N x SIZE, N from 1 to 64 \(4x16M\), not '4'"),
        (["--elephants", "2x1K"], r"--elephants: each transfer from 64K to 256M, not 1K"),
        (["--elephants", "2x1M", "--pcap", "/etc/hostname"], r"--elephants goes with the project's traffic"),
        (["--elephant-starts", "soon"], r"unknown --elephant-starts mode 'soon' \(choose from together, staggered\)"),
        (["--elephant-starts", "staggered"], r"--elephant-starts goes with --elephants N x SIZE"),
    ],
)
def test_bench_bad_input_is_one_line(args, message, tmp_path):
    r = lab_cmd("bench", "ids", "--trials", "1", "--out", str(tmp_path), *args, timeout=120)
    assert_bench_refused(r, message, tmp_path)


def test_bench_shows_suricatas_own_error_for_a_rejected_ruleset(tmp_path):
    bad = tmp_path / "bad.rules"
    bad.write_text('alert tcp any any -> any any (msg:"typo"; contnt:"x"; sid:2; rev:1;)\n')
    r = lab_cmd(
        "bench", "ids", "--rules", str(bad), "--loop", "1", "--rates", "1", "--out", str(tmp_path / "o"), timeout=120
    )
    assert r.returncode == 1
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert errors == [f"lab bench: error: suricata rejects {bad}: detect-parse: unknown rule keyword 'contnt'."]


def _start_bench_and_wait_for_both_idses(tmp_path):
    return start_until(
        [
            PY,
            "-m",
            "lab",
            "bench",
            "ids",
            "--rates",
            "1",
            "--trials",
            "1",
            "--cpu-quota",
            "30",
            "--loop",
            "40",
            "--out",
            str(tmp_path),
        ],
        lambda: len(suricata_leftovers()[2]) >= 2,
        cwd=ROOT,
    )  # both IDSes running: the replay is on


def test_interrupted_bench_removes_everything_itself(tmp_path):
    before, namespaces = suricata_leftovers(), set(netns.lab_namespaces())
    proc = _start_bench_and_wait_for_both_idses(tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "lab: interrupted; everything this run started has been removed"
    assert "Traceback" not in err
    assert suricata_leftovers() == before and set(netns.lab_namespaces()) == namespaces
    assert not list(tmp_path.iterdir())  # no half-written results


def test_killed_bench_is_cleaned_up(tmp_path):
    """SIGKILL mid-run leaves Suricatas running in the namespaces, their run
    directories and cgroups; `python -m lab cleanup` removes all of it."""
    before, namespaces = suricata_leftovers(), set(netns.lab_namespaces())
    proc = _start_bench_and_wait_for_both_idses(tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    dirs, cgroups, procs = suricata_leftovers()
    assert len(dirs) >= 2 and len(cgroups) >= 2 and len(procs) == 2  # what the kill left
    r = lab_cmd("cleanup", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Suricata run directory" in r.stdout and "cgroup" in r.stdout
    assert suricata_leftovers() == before
    assert set(netns.lab_namespaces()) == namespaces
