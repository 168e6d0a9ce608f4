"""`python -m vtap` as a user runs it: inside a namespace, with real signals."""

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers import RX4, UNWATCHED_SRC4, WATCHED_SRC4, Lines, invariant, run_flows, unchecked_copy
from pyroute2 import IPRoute

from ebpf import tc
from lab.fastpaths.vtap.demo import start_vtap, stop_vtap
from lab.topology import Topology
from lab.traffic import Capture, Flow, Marker, build, send_frames

ROOT = Path(__file__).resolve().parents[1]


def vtap(tb, *args, timeout=60, **kw):
    return tb.topo.run(
        tb.tap_host,
        [sys.executable, "-m", "vtap", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def test_mirrors_and_reports_json_until_sigint(tb1):
    proc = start_vtap(tb1, ["--watch", f"{WATCHED_SRC4}/32", "--interval", "0.2"])
    _, rx, mon = run_flows(tb1, [Flow("w", WATCHED_SRC4, RX4, count=400), Flow("u", UNWATCHED_SRC4, RX4, count=400)])
    final = stop_vtap(proc)
    assert dict(mon) == {"w": 400} and rx["u"] == 400
    assert final["matched"] == final["cloned"] == mon["w"] and final["failed"] == 0 and invariant(final)
    assert tc.hook_snapshot(tb1.ns("receiver"))["eth0"] == (False, [])


def test_the_cutoff_in_the_json_and_the_summary(tb1):
    """--cutoff: said in the "attached" object and line, its counters in every JSON object
    (the table's too, and evicted works out from the kernel's), a line in the summary."""
    r = vtap(tb1, "--monitor", "mon0", "--cutoff", "64K", "--flows", "128", "--duration", "0.6", "--json")
    assert r.returncode == 0, r.stderr
    attached, *samples = map(json.loads, r.stdout.splitlines())
    assert (attached["cutoff"], attached["flows_max"], attached["flow_timeout"]) == (65536, 128, 300.0)
    for k in ("cut", "cut_bytes", "ends_copied", "flows_new", "flows", "evicted", "uncut_fragment"):
        assert samples[-1][k] == 0, k
    r = vtap(tb1, "--monitor", "mon0", "--cutoff", "1MiB", "--duration", "0.6")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "cutoff 1048576 bytes per flow and direction (65536 flows, idle 300 s)" in lines[0]
    assert lines[1].split()[-1] == "CUT" and lines[-1].split()[0] == "cutoff:" and "0 evicted" in lines[-1]


def test_table_output_and_duration_exit(tb1):
    before = tc.hook_snapshot(tb1.ns("receiver"))
    r = vtap(tb1, "--monitor", "mon0", "--duration", "1.2", "--interval", "0.5")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("vtap: tapping eth0 (ingress) -> mon0; watching everything")
    assert "SEEN/s" in lines[1] and lines[-1].startswith("total")
    assert tc.hook_snapshot(tb1.ns("receiver")) == before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_detach(tb1, sig):
    before = tc.hook_snapshot(tb1.ns("receiver"))
    proc = start_vtap(tb1, [])
    assert tc.hook_snapshot(tb1.ns("receiver")) != before
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["event"] == "final"
    assert tc.hook_snapshot(tb1.ns("receiver")) == before


def test_a_signal_at_any_moment_is_a_clean_stop(tb1):
    """A signal lands wherever the program is: in a sleep, or half-way through a
    netlink call (at --interval 0.01 it is mostly the latter). Before, the
    handler raised right there, and pyroute2, interrupted while building an event
    loop, left "Exception ignored ... _UnixSelectorEventLoop" on stderr."""
    before = tc.hook_snapshot(tb1.ns("receiver"))
    for i, sig in enumerate([signal.SIGINT, signal.SIGTERM, signal.SIGHUP] * 3):
        proc = start_vtap(tb1, ["--interval", "0.01"])
        time.sleep(0.01 * i)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0 and err == "", (sig, err)
        assert json.loads(out.splitlines()[-1])["event"] == "final"
        assert tc.hook_snapshot(tb1.ns("receiver")) == before


@pytest.mark.parametrize(
    "args, message",
    [
        (["--monitor", "mon0", "--iface", "eth9"], "no interface named 'eth9'"),
        (["--monitor", "mon9"], "no interface named 'mon9'"),
        (["--monitor", "mon0", "--iface", "mon0"], "monitor mon0 is also a tapped interface"),
        (["--monitor", "mon0", "--watch", "198.18.1.300/32"], "bad CIDR '198.18.1.300/32'"),
        (["--monitor", "mon0", "--watch", "198.18.1.1/24"], "host bits set (did you mean 198.18.1.0/24?)"),
        (["--monitor", "mon0", "--sample", "0"], "--sample must be from 1 (every matched packet) to 4294967295, not 0"),
        (["--monitor", "mon0", "--sample", "4294967296"], "--sample must be from 1"),  # wrapped to 0: mirrored all
        (["--monitor", "mon0", "--direction", "sideways"], "argument --direction: invalid choice: 'sideways'"),
        (["--monitor", "mon0", "--match", "both"], "argument --match: invalid choice: 'both'"),
        (["--monitor", "mon0", "--interval", "nan"], "--interval must be a number of seconds > 0, not nan"),
        (["--monitor", "mon0", "--interval", "inf"], "--interval must be a number of seconds > 0, not inf"),
        (["--monitor", "mon0", "--duration", "nan"], "--duration must be a number of seconds > 0, not nan"),
        (["--iface", "eth0"], "--monitor is required"),
        (
            ["--monitor", "mon0", "--watch-file", "/nonexistent/hosts.txt"],
            "cannot read watch-list file /nonexistent/hosts.txt: No such file or directory",
        ),
        (
            ["--monitor", "mon0", "--watch", "198.18.1.0/24", "--watch", "198.18.2.0/24", "--watch-max", "1"],
            "the watch-list has 2 IPv4 entries, more than the 1 it has room for",
        ),
        (["--monitor", "mon0", "--watch-max", "0"], "--watch-max must be at least 1"),
        (["--all"], "--all goes with --cleanup"),
        (["--monitor", "mon0", "--sample", "x"], "argument --sample: invalid int value: 'x'"),
        (["--monitor", "mon0", "--cutoff", "1.5M"], "--cutoff must be bytes (65536, 64K, 1MiB), not '1.5M'"),
        (["--monitor", "mon0", "--flows", "64"], "--flows goes with --cutoff BYTES"),
        (["--monitor", "mon0", "--cutoff", "1K", "--flows", "0"], "--flows must be from 1 to 16777216, not 0"),
        (["--monitor", "mon0", "--cutoff", "1K", "--flow-timeout", "-1"], "--flow-timeout must be a positive"),
        (["--hook", "xdp", "--monitor", "mon0", "--cutoff", "x"], "--cutoff must be bytes"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_attaches_nothing(tb1, args, message):
    """Everything wrong with the command as given exits 2 (argparse's rule too),
    with one line: argparse's errors too, without its usage."""
    before = tc.hook_snapshot(tb1.ns("receiver"))
    r = vtap(tb1, *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and (lines[0].startswith("vtap: error: ")), r.stderr
    assert message in r.stderr
    assert tc.hook_snapshot(tb1.ns("receiver")) == before


def test_watch_file_with_comments_and_a_bad_line(tb1, tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"# watched hosts\n\n{WATCHED_SRC4}/32   # the sender's watched address\n198.18.1.0/33\n")
    r = vtap(tb1, "--monitor", "mon0", "--watch-file", str(hosts))
    assert r.returncode == 2
    assert r.stderr == (
        f"vtap: error: {hosts} line 4: bad CIDR '198.18.1.0/33': not an IPv4 or IPv6 address or network\n"
    )


def test_watch_file_of_100000_entries_mirrors_exactly(tb1, tmp_path):
    """Past the default room of 1024 (a traceback before): a file of 100,000 /32s
    and /128s, the watched source among them, sized to fit without --watch-max."""
    base4 = int(ipaddress.ip_address("198.19.0.0"))
    lines = [f"{ipaddress.ip_address(base4 + i)}/32" for i in range(60_000)]
    lines += [f"2001:2:ff::{i:x}/128" for i in range(40_000)]
    lines.insert(31_337, f"{WATCHED_SRC4}/32")
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# a big watch-list\n" + "\n".join(lines) + "\n")
    proc = start_vtap(tb1, ["--watch-file", str(hosts), "--interval", "0.5"], timeout=120)
    _, rx, mon = run_flows(tb1, [Flow("w", WATCHED_SRC4, RX4, count=400), Flow("u", UNWATCHED_SRC4, RX4, count=400)])
    final = stop_vtap(proc)
    assert dict(mon) == {"w": 400} and rx["u"] == 400 and final["cloned"] == 400


def test_output_closed_early_detaches_quietly(tb1):
    """`vtap | head -n 3`: no BrokenPipe traceback, exit 0, nothing left attached."""
    before = tc.hook_snapshot(tb1.ns("receiver"))
    cmd = f"set -o pipefail; {sys.executable} -m vtap --monitor mon0 --iface eth0 --interval 0.1 | head -n 3"
    r = tb1.topo.run(tb1.tap_host, ["bash", "-c", cmd], check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and len(r.stdout.splitlines()) == 3
    assert tc.hook_snapshot(tb1.ns("receiver")) == before


def test_table_shows_every_counter_per_interface_and_run_averages(tb2):
    """Two tapped interfaces: a row each and an `all` row; sampled_out, not_ip and
    malformed are shown; the final rows' rates are averages over the whole run,
    not the last interval's (which saw no traffic here): between none and the
    busiest interval's, and no more than the run's count over its ticks' intervals."""
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
            "--watch",
            f"{WATCHED_SRC4}/32",
            "--match",
            "src",
            "--sample",
            "2",
            "--interval",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = Lines(proc.stdout)
    assert out.next().startswith("vtap: tapping eth0, eth1 (ingress) -> mon0")
    run_flows(tb2, [Flow("w", WATCHED_SRC4, RX4, count=1000)])
    lines, quiet = [], 0
    while quiet < 2:  # vtap's own rows show two intervals without traffic on eth0 after all 1000
        lines.append(out.next(what="interval row"))
        f = lines[-1].split()
        if f[:1] == ["TIME"]:
            head = f
        elif f[1:2] == ["eth0"]:
            quiet = quiet + 1 if int(f[head.index("SEEN")]) == 1000 and f[head.index("SEEN/s")] == "0" else 0
    proc.send_signal(signal.SIGINT)
    lines += iter(out.next, None)
    err = proc.stderr.read()
    assert proc.wait(timeout=15) == 0, err
    proc.stdout.close()
    proc.stderr.close()
    assert head[:2] == ["TIME", "IFACE"] and {"SAMPLED", "NOT-IP", "MALFORMED", "OVERSIZE"} <= set(head)
    final_head = max(i for i, ln in enumerate(lines) if ln.startswith("SUMMARY"))
    rows = {ln.split()[1]: ln.split() for ln in lines[final_head + 1 :]}
    assert set(rows) == {"eth0", "eth1", "all"} and all(r[0] == "total" for r in rows.values())
    col = {name: i for i, name in enumerate(lines[final_head].split())}
    eth0, eth1, total = rows["eth0"], rows["eth1"], rows["all"]
    # eth1 ingress sees only the receiver's ICMP errors, which are not from the watched source
    assert int(eth0[col["SEEN"]]) == 1000 and int(eth1[col["MATCHED"]]) == 0
    assert int(total[col["SEEN"]]) == int(eth0[col["SEEN"]]) + int(eth1[col["SEEN"]])
    assert int(total[col["MATCHED"]]) == 1000
    # 1 in 2 at random (a bpf_get_prandom_u32() below 2^31 copies: tc_mirror.bpf.c), not every
    # other frame, so no count is exact: the copies are binomial, mean 500, sd sqrt(1000 / 4) = 15.8;
    # accept +-5 sd (a rate taken as 1 in 3 or 2 in 3 is some 10 sd out)
    cloned, sampled = int(total[col["CLONED"]]), int(total[col["SAMPLED"]])
    assert cloned + sampled == 1000 and 500 - 79 <= cloned <= 500 + 79, (cloned, sampled)
    # the interval rows: the first is the run's start, each later one a tick at least an
    # interval (0.5 s) after the one before, so the run lasted at least 0.5 s per tick
    ticks = [ln.split() for ln in lines[:final_head] if ln.split()[1:2] == ["eth0"]][1:]
    average, busiest = float(eth0[col["SEEN/s"]]), max(float(f[col["SEEN/s"]]) for f in ticks)
    assert 0 < average < busiest and average <= 1000 / (0.5 * len(ticks)) + 0.5, (average, busiest, len(ticks))


def test_monitor_veth_peer_is_refused():
    t = Topology("loop")
    t.add_host("h")
    with t:
        t.run("h", ["ip", "link", "add", "mon0", "type", "veth", "peer", "name", "mon0p"])
        t.run("h", ["ip", "link", "set", "mon0", "up"])
        t.run("h", ["ip", "link", "set", "mon0p", "up"])
        r = t.run(
            "h",
            [sys.executable, "-m", "vtap", "--monitor", "mon0", "--iface", "mon0p"],
            check=False,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 2 and "(the other end of mon0's veth pair): they would be copied again" in r.stderr
        r = t.run("h", [sys.executable, "-m", "vtap", "--monitor", "mon0"], check=False, capture_output=True, text=True)
        assert r.returncode == 2 and "no interface to tap" in r.stderr  # the default skips the peer


def test_verifier_rejection_shows_the_verifiers_line(tb1, tmp_path):
    broken = unchecked_copy(ROOT / "ebpf/vtap/tc_mirror.bpf.c", "skb->data", tmp_path)
    before = tc.hook_snapshot(tb1.ns("receiver"))
    r = vtap(tb1, "--monitor", "mon0", "--watch", "198.18.0.0/15", "--program", str(broken))
    assert r.returncode == 1
    assert r.stderr.startswith("vtap: error: verifier rejected tc_mirror: ") and r.stderr.count("\n") == 1, r.stderr
    assert "packet" in r.stderr  # e.g. "invalid access to packet, off=... R.. offset is outside of the packet"
    assert tc.hook_snapshot(tb1.ns("receiver")) == before


ROOT_ERROR = (
    "vtap: error: must run as root (loading BPF programs and changing TC hooks needs CAP_BPF and "
    "CAP_NET_ADMIN, which root has; this process lacks CAP_BPF and CAP_NET_ADMIN)\n"
)


def test_not_root_as_a_normal_user(tb1):
    """A normal user with a checkout of their own. uid 65534 cannot read this
    checkout if it lives under a private directory (a 0700 home, mktemp -d), so
    it gets a world-readable copy of the packages the check needs, and the
    system Python: the check runs before anything heavier is imported."""
    with tempfile.TemporaryDirectory(prefix="vtl-nonroot-", dir="/tmp") as tmp:  # not $TMPDIR: maybe private
        os.chmod(tmp, 0o755)
        for pkg in ("vtap", "ebpf", "lab"):
            shutil.copytree(ROOT / pkg, Path(tmp) / pkg, ignore=shutil.ignore_patterns("__pycache__"))
        r = tb1.topo.run(
            tb1.tap_host,
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-m",
                "vtap",
                "--monitor",
                "mon0",
            ],
            check=False,
            capture_output=True,
            text=True,
            cwd=tmp,
            env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        )
    assert r.returncode == 2 and r.stderr == ROOT_ERROR, r.stderr


def test_not_root_as_root_without_capabilities(tb1):
    """uid 0 with no capabilities (a locked-down container) is refused the same
    way, by the command line and by the Python API, before BCC trips on a map."""
    drop = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
    before = tc.hook_snapshot(tb1.ns("receiver"))
    r = tb1.topo.run(
        tb1.tap_host,
        drop + [sys.executable, "-m", "vtap", "--monitor", "mon0"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 2 and r.stderr == ROOT_ERROR, r.stderr
    api = (
        "from ebpf import TcMirror, PrivilegeError\n"
        "try:\n    TcMirror(monitor='mon0').attach('eth0')\n"
        "except PrivilegeError as e:\n    print('refused:', e)\n"
    )
    r = tb1.topo.run(
        tb1.tap_host, drop + [sys.executable, "-c", api], check=False, capture_output=True, text=True, cwd=ROOT
    )
    assert r.stdout.startswith("refused: must run as root") and r.returncode == 0, r.stderr
    assert tc.hook_snapshot(tb1.ns("receiver")) == before


def test_bcc_not_importable_says_how_to_set_up(tb1):
    # -S: no site packages, so Debian's bcc is out of reach; the venv's own
    # packages (pyroute2) and the project stay importable through PYTHONPATH.
    site = sysconfig.get_paths()["purelib"]
    r = tb1.topo.run(
        tb1.tap_host,
        [sys.executable, "-S", "-m", "vtap", "--monitor", "mon0"],
        check=False,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{ROOT}:{site}", "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("vtap: error: BCC is not importable") and "make setup" in r.stderr
    assert r.stderr.count("\n") == 1


def test_cleanup_after_sigkill_restores_the_namespace(tb1):
    ns = tb1.ns("receiver")
    with IPRoute(netns=ns, flags=0) as ip:  # a foreign clsact on mon0 that cleanup must not touch
        ip.tc("add", "clsact", index=ip.link_lookup(ifname="mon0")[0])
    before = tc.hook_snapshot(ns)
    proc = start_vtap(tb1, ["--direction", "both"])
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = tc.hook_snapshot(ns)["eth0"]
    assert left[0] and len(left[1]) == 2, "SIGKILL should leave the filters behind"
    r = vtap(tb1, "--cleanup")
    assert r.returncode == 0, r.stderr
    assert "removed filter vtap+clsact:tc_mirror on eth0 ingress" in r.stdout
    assert "removed clsact qdisc on eth0" in r.stdout
    assert tc.hook_snapshot(ns) == before
    r = vtap(tb1, "--cleanup")
    assert "nothing to clean up" in r.stdout


def test_help_teaches_by_example():
    r = subprocess.run([sys.executable, "-m", "vtap", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "examples:" in r.stdout and "--cleanup" in r.stdout


def test_ebpf_flag_prints_the_c_text(tb1):
    r = vtap(tb1, "--monitor", "mon0", "--match", "dst", "--ebpf")
    assert r.returncode == 0
    assert "int tc_mirror(struct __sk_buff *skb)" in r.stdout and "-DVTAP_MATCH_SRC=0" in r.stdout


class Stderr:
    """A running vtap's stderr, read line by line in a thread, so a test can wait
    for what vtap says instead of sleeping."""

    def __init__(self, proc):
        self.lines, self.proc = [], proc
        self.thread = threading.Thread(target=lambda: self.lines.extend(iter(proc.stderr.readline, "")), daemon=True)
        self.thread.start()

    def wait_for(self, text, seconds=15):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if any(text in ln for ln in self.lines):
                return
            time.sleep(0.02)
        raise AssertionError(f"vtap did not say {text!r}; it said {self.lines}")

    def text(self):
        self.thread.join(timeout=15)
        return "".join(self.lines)


@pytest.mark.parametrize("clone", ["action", "helper"])
def test_monitor_deleted_and_made_again_while_running(tb1, clone):
    """Deleted: said once, and the copies count as failed. Made again under its
    name: said, and the copies go to the new device."""
    proc = start_vtap(tb1, ["--interval", "0.1", "--watch", f"{WATCHED_SRC4}/32", "--clone", clone])
    err = Stderr(proc)
    marker = Marker()

    def send(name):
        frames = build([Flow(name, WATCHED_SRC4, RX4, count=300)], marker, tb1.sender_mac, tb1.next_hop_mac)
        with Capture(tb1.ns("monitor"), "eth0", marker) as mon:
            send_frames(tb1.ns("sender"), "eth0", frames, rate_pps=20000)
        return mon.counts[name]

    tb1.topo.run("receiver", ["ip", "link", "del", "mon0"])  # its peer, the monitor's eth0, goes too
    tb1.topo.run(
        "receiver", ["ip", "link", "add", "spare", "type", "veth", "peer", "name", "eth0", "netns", tb1.ns("monitor")]
    )  # so that the capture has an eth0 to open
    err.wait_for("monitor mon0 was deleted")
    assert send("gone") == 0
    tb1.topo.run("receiver", ["ip", "link", "del", "spare"])
    tb1.topo.run(
        "receiver", ["ip", "link", "add", "mon0", "type", "veth", "peer", "name", "eth0", "netns", tb1.ns("monitor")]
    )
    tb1.topo.run("receiver", ["ip", "link", "set", "mon0", "up"])
    tb1.topo.run("monitor", ["ip", "link", "set", "eth0", "up"])
    err.wait_for("monitor mon0 was made again")
    arrived = send("back")
    proc.send_signal(signal.SIGINT)
    out = proc.stdout.read()
    assert proc.wait(timeout=15) == 0
    said = err.text()
    final = json.loads(out.splitlines()[-1])
    assert "vtap: warning: monitor mon0 was deleted: copies fail (counted as failed)" in said
    assert "vtap: warning: monitor mon0 was made again: copies go to the new mon0" in said
    # the second 300 copied and arrived, the first 300 failed
    assert final["matched"] == 600 and final["failed"] == 300 and final["cloned"] == arrived == 300
    assert invariant(final)


@pytest.mark.parametrize(
    "clone, what",
    [
        ("action", "its copies are refused and counted as failed"),
        ("helper", "the kernel drops the copies without an error"),
    ],
)
def test_monitor_down_at_start_and_up_again(tb1, clone, what):
    before = tc.hook_snapshot(tb1.ns("receiver"))
    tb1.topo.run("receiver", ["ip", "link", "set", "mon0", "down"])
    proc = start_vtap(tb1, ["--interval", "0.1", "--clone", clone])
    err = Stderr(proc)
    err.wait_for(f"vtap: warning: monitor mon0 is down: {what}")
    tb1.topo.run("receiver", ["ip", "link", "set", "mon0", "up"])
    err.wait_for("vtap: warning: monitor mon0 is up again")
    proc.send_signal(signal.SIGINT)
    proc.stdout.read()
    assert proc.wait(timeout=15) == 0
    assert tc.hook_snapshot(tb1.ns("receiver")) == before


def test_oversize_copies_are_announced_once(tb1):
    """The monitor's MTU lowered while vtap runs: vtap notices the new MTU, counts
    the copies that no longer fit, and says so once, not per interval."""
    proc = start_vtap(tb1, ["--interval", "0.1"])
    err, out = Stderr(proc), Lines(proc.stdout)
    tb1.topo.run("receiver", ["ip", "link", "set", "mon0", "mtu", "1000"])
    marker = Marker()

    def big(n):
        return build([Flow("big", WATCHED_SRC4, RX4, count=n, size=1200)], marker, tb1.sender_mac, tb1.next_hop_mac)

    def counted(matched):
        """vtap's counters once its rows show `matched` watched frames."""
        while True:
            c = json.loads(out.next(what="a row of counters"))
            if c.get("matched", 0) >= matched:
                return c

    # one frame at a time until one is counted oversize: from then on vtap has the new MTU
    probes, deadline = 0, time.monotonic() + 30
    while True:
        send_frames(tb1.ns("sender"), "eth0", big(1))
        probes += 1
        if counted(probes)["oversize"]:
            break
        assert time.monotonic() < deadline, "vtap never read the monitor's new MTU"
    for _ in range(2):
        send_frames(tb1.ns("sender"), "eth0", big(100), rate_pps=20000)
    assert counted(probes + 200)["matched"] == probes + 200
    err.wait_for("copies were longer than monitor mon0's MTU (1000) allows")
    proc.send_signal(signal.SIGINT)
    final = json.loads([ln for ln in iter(lambda: out.next(what="the final row"), None)][-1])
    assert proc.wait(timeout=15) == 0
    assert final["event"] == "final" and final["oversize"] == 201  # the last probe and every one after it
    assert err.text().count("longer than monitor") == 1


def test_watch_list_from_standard_input(tb1):
    proc = tb1.topo.popen(
        tb1.tap_host,
        [sys.executable, "-m", "vtap", "--monitor", "mon0", "--iface", "eth0", "--watch-file", "-", "--json"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdin.write(f"# from a pipe\n{WATCHED_SRC4}/32\n")
    proc.stdin.close()
    proc.stdin = None  # communicate() must not touch it again
    assert json.loads(proc.stdout.readline())["watch"] == [f"{WATCHED_SRC4}/32"]
    _, rx, mon = run_flows(tb1, [Flow("w", WATCHED_SRC4, RX4, count=200), Flow("u", UNWATCHED_SRC4, RX4, count=200)])
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert dict(mon) == {"w": 200}


@pytest.mark.parametrize("args", [["--cleanup"], ["--monitor", "mon0", "--ebpf"]])
def test_other_output_into_head_is_quiet_too(tb1, args):
    cmd = f"set -o pipefail; {sys.executable} -m vtap {' '.join(args)} | head -n 1"
    r = tb1.topo.run(tb1.tap_host, ["bash", "-c", cmd], check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def caught_signals(pid):
    """The signals a process has handlers for (SigCgt in /proc/<pid>/status)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigCgt:"):
            mask = int(line.split()[1], 16)
            return {sig for sig in signal.Signals if mask >> (sig - 1) & 1}
    return set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_before_attaching_detaches_cleanly(tb1, sig):
    """The signal lands as soon as vtap handles it: in its imports, the compile
    or the attach, long before "attached". It stops at the next step: exit 0,
    nothing on stderr, nothing attached."""
    before = tc.hook_snapshot(tb1.ns("receiver"))
    proc = tb1.topo.popen(
        tb1.tap_host,
        [sys.executable, "-m", "vtap", "--monitor", "mon0", "--iface", "eth0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20
    # SIGHUP: Python itself catches SIGINT from its start, vtap's handlers come
    # with the others, all three at once
    while signal.SIGHUP not in caught_signals(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and err == "", err
    assert '"attached"' not in out  # it stopped before attaching (the compile alone takes far longer)
    assert tc.hook_snapshot(tb1.ns("receiver")) == before


# --- every command line's errors, as given (no testbed: they stop before anything runs) ----------


def in_empty_netns(*argv, timeout=60):
    """The command in a network namespace of its own, empty but for lo (down):
    whatever it would do, it does nothing to the machine's."""
    return subprocess.run(
        ["unshare", "--net", sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "argv, error",
    [
        (
            ["-m", "vtap", "--direction", "sideways"],
            "vtap: error: argument --direction: invalid choice: 'sideways' (choose from 'ingress', 'egress', 'both')",
        ),
        (["-m", "vtap", "--match", "foo"], "vtap: error: argument --match: invalid choice: 'foo'"),
        (["-m", "vtap", "--monitor", "mon0", "--frobnicate"], "vtap: error: unrecognized arguments: --frobnicate"),
        (
            ["-m", "lab", "redirect", "--action", "sideways"],
            "python -m lab redirect: error: argument --action: invalid choice: 'sideways'",
        ),
        (["-m", "lab", "lb", "--mode", "foo"], "python -m lab lb: error: argument --mode: invalid choice: 'foo'"),
        (["-m", "lab", "lb", "--hook", "nic"], "python -m lab lb: error: argument --hook: invalid choice: 'nic'"),
        (
            ["-m", "lab", "lb", "--health-check", "http"],
            "python -m lab lb: error: argument --health-check: invalid choice",
        ),
        (
            ["-m", "lab", "bench", "redirect", "--workload", "x"],
            "lab bench: error: argument --workload: invalid choice: 'x'",
        ),
        (["-m", "lab", "bench", "lb", "--napi", "x"], "lab bench: error: argument --napi: invalid choice: 'x'"),
        (
            ["-m", "lab", "bench", "vtap-throughput", "--generator", "x"],
            "lab bench: error: argument --generator: invalid",
        ),
        (["-m", "lab", "bench", "ids", "--trials", "x"], "lab bench: error: argument --trials: invalid int value: 'x'"),
        (["-m", "lab", "bench", "nosuch"], "lab bench: error: argument bench: invalid choice: 'nosuch'"),
        (["-m", "lab", "frobnicate"], "lab: error: argument cmd: invalid choice: 'frobnicate'"),
        (["-m", "lab", "demo", "--count", "0"], "lab: error: --count must be between 1 and 100000"),
        (["-m", "lab", "jupyter", "--port", "x"], "lab jupyter: error: argument --port: invalid int value: 'x'"),
        (["-m", "lab", "jupyter", "--port", "70000"], "lab jupyter: error: --port must be from 1 to 65535, not 70000"),
    ],
)
def test_argparse_errors_are_one_line_exit_2(argv, error):
    """argparse printed its usage (six lines and more) before the error; every
    tool says its errors in one line, named as in its other errors."""
    r = in_empty_netns(*argv)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(error), r.stderr


@pytest.mark.parametrize(
    "tool, args, ignored",
    [
        (["vtap"], ["--monitor", "mon0"], "--monitor"),
        (["vtap"], ["--all", "--json", "--direction", "both"], "--direction, --json"),
        (["vtap"], ["--ebpf"], "--ebpf"),
        (["lab", "redirect"], ["--iface", "eth0", "--rule", "udp:198.18.0.17:8080=198.18.2.2:8083"], "--iface, --rule"),
        (["lab", "redirect"], ["--all", "--duration", "5"], "--duration"),
        (["lab", "lb"], ["--service", "tcp:1.2.3.4:80", "--interval", "2"], "--service, --interval"),
        (["lab", "lb"], ["--mode", "dsr"], "--mode"),
    ],
)
def test_cleanup_refuses_the_options_it_would_ignore(tool, args, ignored):
    """`vtap --cleanup --monitor mon0` cleaned up and said nothing of --monitor:
    the user may have meant something else. --cleanup takes --all only."""
    name = "vtap" if tool == ["vtap"] else f"python -m lab {tool[1]}"
    r = in_empty_netns("-m", *tool, "--cleanup", *args)
    assert (r.returncode, r.stdout) == (2, ""), r.stdout + r.stderr
    assert r.stderr == f"{name}: error: --cleanup takes no option but --all; it would ignore {ignored}\n"


@pytest.mark.parametrize("tool, name", [(["vtap"], "vtap"), (["lab", "redirect"], "redirect"), (["lab", "lb"], "lb")])
def test_cleanup_with_all_still_runs(tool, name):
    r = in_empty_netns("-m", *tool, "--cleanup", "--all")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout == f"{name}: nothing to clean up in this namespace\n"


def test_no_route_to_a_backend_is_said_in_words():
    """A NetlinkError's str() is its tuple: "no route to backend 198.18.2.2
    ((101, 'Network is unreachable'))"."""
    r = in_empty_netns("-m", "lab", "redirect", "--iface", "lo", "--rule", "udp:198.18.0.17:8080=198.18.2.2:8083")
    assert r.returncode == 2
    assert r.stderr == "python -m lab redirect: error: no route to backend 198.18.2.2 (Network is unreachable)\n"
