"""`python -m vtap` as a user runs it: inside a namespace, with real signals."""

import json
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from ebpf import tc
from lab.demo import start_vtap, stop_vtap
from lab.traffic import Flow
from helpers import RX4, UNWATCHED_SRC4, WATCHED_SRC4, invariant, run_flows

ROOT = Path(__file__).resolve().parents[1]


def vtap(tb, *args, timeout=60, **kw):
    return tb.topo.run(tb.tap_host, [sys.executable, "-m", "vtap", *args], check=False,
                       capture_output=True, text=True, timeout=timeout, **kw)


def test_mirrors_and_reports_json_until_sigint(tb1):
    proc = start_vtap(tb1, ["--watch", f"{WATCHED_SRC4}/32", "--interval", "0.2"])
    _, rx, mon = run_flows(tb1, [Flow("w", WATCHED_SRC4, RX4, count=400), Flow("u", UNWATCHED_SRC4, RX4, count=400)])
    final = stop_vtap(proc)
    assert dict(mon) == {"w": 400} and rx["u"] == 400
    assert final["cloned"] == 400 and invariant(final)
    assert tc.hook_snapshot(tb1.ns("receiver"))["eth0"] == (False, [])


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


@pytest.mark.parametrize("args, message", [
    (["--monitor", "mon0", "--iface", "eth9"], "no interface named 'eth9'"),
    (["--monitor", "mon9"], "no interface named 'mon9'"),
    (["--monitor", "mon0", "--iface", "mon0"], "monitor mon0 is also a tapped interface"),
    (["--monitor", "mon0", "--watch", "198.18.1.300/32"], "bad CIDR '198.18.1.300/32'"),
    (["--monitor", "mon0", "--watch", "198.18.1.1/24"], "host bits set (did you mean 198.18.1.0/24?)"),
    (["--monitor", "mon0", "--sample", "0"], "--sample must be >= 1"),
    (["--monitor", "mon0", "--direction", "sideways"], "--direction must be ingress, egress or both"),
    (["--monitor", "mon0", "--match", "both"], "--match must be src, dst or any"),
    (["--iface", "eth0"], "--monitor is required"),
])
def test_bad_input_is_one_line_and_attaches_nothing(tb1, args, message):
    before = tc.hook_snapshot(tb1.ns("receiver"))
    r = vtap(tb1, *args)
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("vtap: error: "), r.stderr
    assert message in r.stderr
    assert tc.hook_snapshot(tb1.ns("receiver")) == before


def test_monitor_veth_peer_is_refused():
    from lab.topology import Topology
    t = Topology("loop")
    t.add_host("h")
    with t:
        t.run("h", ["ip", "link", "add", "mon0", "type", "veth", "peer", "name", "mon0p"])
        t.run("h", ["ip", "link", "set", "mon0", "up"])
        t.run("h", ["ip", "link", "set", "mon0p", "up"])
        r = t.run("h", [sys.executable, "-m", "vtap", "--monitor", "mon0", "--iface", "mon0p"],
                  check=False, capture_output=True, text=True)
        assert r.returncode == 1 and "other end of monitor mon0's veth pair" in r.stderr
        r = t.run("h", [sys.executable, "-m", "vtap", "--monitor", "mon0"], check=False, capture_output=True, text=True)
        assert r.returncode == 2 and "no interface to tap" in r.stderr  # the default skips the peer


def test_verifier_rejection_shows_the_verifiers_line(tb1, tmp_path):
    src = (ROOT / "ebpf/tc_mirror.bpf.c").read_text()
    check = "if ((void *)(ip + 1) > data_end)\n\t\t\treturn MALFORMED;"
    assert check in src
    broken = tmp_path / "tc_mirror_unchecked.bpf.c"
    broken.write_text(src.replace(check, "/* bounds check removed */"))
    before = tc.hook_snapshot(tb1.ns("receiver"))
    r = vtap(tb1, "--monitor", "mon0", "--watch", "198.18.0.0/15", "--program", str(broken))
    assert r.returncode == 1
    assert r.stderr.startswith("vtap: error: verifier rejected tc_mirror: ") and r.stderr.count("\n") == 1, r.stderr
    assert "packet" in r.stderr  # e.g. "invalid access to packet, off=... R.. offset is outside of the packet"
    assert tc.hook_snapshot(tb1.ns("receiver")) == before


def test_not_root(tb1):
    r = tb1.topo.run(tb1.tap_host, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                    sys.executable, "-m", "vtap", "--monitor", "mon0"],
                     check=False, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip() == (
        "vtap: error: must run as root (loading BPF programs and changing TC hooks needs CAP_BPF and CAP_NET_ADMIN)")


def test_bcc_not_importable_says_how_to_set_up(tb1):
    # -S: no site packages, so Debian's bcc is out of reach; the venv's own
    # packages (pyroute2) and the project stay importable through PYTHONPATH.
    site = sysconfig.get_paths()["purelib"]
    r = tb1.topo.run(tb1.tap_host, [sys.executable, "-S", "-m", "vtap", "--monitor", "mon0"], check=False,
                     capture_output=True, text=True, env={"PYTHONPATH": f"{ROOT}:{site}", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("vtap: error: BCC is not importable") and "make setup" in r.stderr
    assert r.stderr.count("\n") == 1


def test_cleanup_after_sigkill_restores_the_namespace(tb1):
    ns = tb1.ns("receiver")
    from pyroute2 import IPRoute
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
