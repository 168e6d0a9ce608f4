"""--metrics on every tool (vtap, vtap --sessions, redirect, lb): a running
tool scraped over HTTP inside its namespace, the exposition checked with
Prometheus's own checker (promtool check metrics, from Debian's prometheus
package), and its values checked against the counters the tool's --json twin
printed for the same interval (which the other tests check against the
programs' own)."""

import json
import queue
import subprocess
import sys
import urllib.request

import pytest
from conftest import ROOT, require_tool
from helpers import PORT, N, Tool, echo_servers, exchange, run_flows, stop_all
from prometheus_client.parser import text_string_to_metric_families
from test_user_topologies import redirect_args
from test_vtap_sessions import CLIENT4, SERVER4, plain_router, send, session_file

from ebpf import netdev, tc
from lab import netns
from lab.fastpaths.lb.testbed import user_segment
from lab.fastpaths.redirect.testbed import user_router
from lab.traffic import Flow

LISTEN = "127.0.0.1:9464"


def scrape(ns, listen=LISTEN):
    with netdev.entered(ns):
        with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as r:
            assert r.status == 200
            return r.read().decode()


def promtool(text):
    """promtool check metrics: exit 0 and nothing said (no lint problem)."""
    require_tool("promtool")
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr
    return r


def samples(text):
    """{(name, ((label, value), ...)): value} of an exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def settled(tool, ns):
    """The next --json sample once traffic has stopped, and a scrape taken
    after it (the same counters: nothing moves any more)."""
    while True:  # the lines printed so far are of before
        try:
            tool.out.q.get_nowait()
        except queue.Empty:
            break
    tool.out.wait_for('"counters"', timeout=10)
    line = json.loads(tool.out.wait_for('"counters"', timeout=10))  # a whole interval after the traffic
    return line, scrape(ns)


def test_vtap_sessions_metrics(tmp_path):
    with plain_router() as t:
        ns = t.ns("router")
        f = tmp_path / "s.toml"
        session_file(f, 5001, kind="erspan")
        tool = Tool(ns, "vtap", "--sessions", str(f), "--iface", "eth0", "--metrics", LISTEN, interval=0.3)
        try:
            send(
                t,
                [
                    Flow("a", CLIENT4, SERVER4, dport=5001, count=30, size=300),
                    Flow("b", CLIENT4, SERVER4, dport=5002, count=10, size=300),
                ],
            )
            line, text = settled(tool, ns)
        finally:
            tool.kill()
    promtool(text)
    got = samples(text)
    s = line["sessions"]["session 1"]
    assert s["sent"] == s["truncated"] == 30
    for k, v in s.items():
        assert got[(f"vtap_session_{k}_total", (("session", "session 1"),))] == v, k
    for k, v in line["ifaces"]["eth0"].items():
        assert got[(f"vtap_{k}_total", (("interface", "eth0"),))] == v, k
    assert got[("vtap_rule_matches_total", (("rule", "1"), ("session", "session 1")))] == 30
    assert "# HELP vtap_session_sent_total copies sent to the session's target" in text
    assert "# TYPE vtap_session_sent_total counter" in text


def test_vtap_metrics(tb1):
    ns = tb1.ns(tb1.tap_host)
    tool = Tool(
        ns,
        "vtap",
        "--monitor",
        "mon0",
        "--iface",
        "eth0",
        "--watch",
        f"{tb1.src4}/32",
        "--metrics",
        LISTEN,
        interval=0.3,
    )
    try:
        run_flows(tb1, [Flow("w", tb1.src4, tb1.dst4, count=200), Flow("u", tb1.alt_src4, tb1.dst4, count=50)])
        line, text = settled(tool, ns)
    finally:
        tool.kill()
    promtool(text)
    got = samples(text)
    row = line["ifaces"]["eth0"]
    assert row["cloned"] == 200 and row["seen"] >= 250
    for k, v in row.items():
        assert got[(f"vtap_{k}_total", (("interface", "eth0"),))] == v, k


def test_vtap_cutoff_metrics(tb1):
    """--cutoff: its counters per interface, the table's `flows` a gauge and `evicted` a
    total; promtool finds nothing to say. Two UDP flows of 200 frames of 86 bytes of
    payload and a cutoff of 8600: each flow's first 100 frames copied, the rest cut."""
    ns = tb1.ns(tb1.tap_host)
    tool = Tool(
        ns, "vtap", "--monitor", "mon0", "--iface", "eth0", "--cutoff", "8600", "--metrics", LISTEN, interval=0.3
    )
    try:
        run_flows(tb1, [Flow("a", tb1.src4, tb1.dst4, count=200), Flow("b", tb1.alt_src4, tb1.dst4, count=200)])
        line, text = settled(tool, ns)
    finally:
        tool.kill()
    promtool(text)
    got = samples(text)
    row = line["ifaces"]["eth0"]
    assert row["cut"] == 200 and row["cloned"] == 200 and row["flows_new"] == 2
    for k in ("cut", "cut_bytes", "flows_new", "ends_copied", "uncut_fragment"):
        assert got[(f"vtap_{k}_total", (("interface", "eth0"),))] == row[k], k
    assert got[("vtap_flows", ())] == line["flows"] == 2 and got[("vtap_evicted_total", ())] == 0
    assert "# TYPE vtap_flows gauge" in text


def test_lb_metrics():
    with user_segment() as tb:
        netns.run(tb.ns("lb"), ["sysctl", "-w", "net.ipv4.conf.eth0.forwarding=1"], capture_output=True)
        servers = echo_servers(tb.topo, tb.backends)
        args = ["--iface", "eth0", "--service", f"tcp:{tb.vip4}:{PORT}", "--service", f"udp:{tb.vip4}:{PORT}"]
        for i in range(2):
            args += ["--backend", f"{tb.backend4(i)}:{PORT}"]
        tool = Tool(
            tb.ns("lb"), "lb", *args, "--prepare-peer", "--health-check", "none", "--metrics", LISTEN, interval=0.3
        )
        try:
            assert exchange(tb.topo, "client", tb.vip4, PORT) == {"udp": N, "tcp": N, "n": N}
            line, text = settled(tool, tb.ns("lb"))
        finally:
            tool.kill()
            stop_all(servers)
    promtool(text)
    got = samples(text)
    assert sum(r["packets"] for r in line["backends"].values()) > 0
    for b, row in line["backends"].items():
        for k, v in row.items():
            if isinstance(v, bool):
                assert got[(f"lb_{k}", (("backend", b),))] == float(v), k
            elif isinstance(v, (int, float)) and not k.endswith("_pps"):
                name = f"lb_{k}" if k in ("active_sessions", "weight", "unanswered") else f"lb_{k}_total"
                assert got[(name, (("backend", b),))] == v, k
    for k in ("tx", "seen"):
        assert got[(f"lb_{k}_total", ())] == line[k] > 0


def test_bad_metrics_addresses_are_refused_with_nothing_attached(tb1):
    ns = tb1.ns(tb1.tap_host)

    def vtap(*args):
        return netns.run(
            ns,
            [sys.executable, "-m", "vtap", "--monitor", "mon0", "--iface", "eth0", *args, "--duration", "1"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )

    for bad, says in (
        ("9464", "expected ADDR:PORT"),
        ("localhost:9464", "'localhost' is not an IP address"),
        ("127.0.0.1:0", "expected ADDR:PORT"),
    ):
        r = vtap("--metrics", bad)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    holder = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns,
            sys.executable,
            "-c",
            "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1', 9464)); "
            "s.listen(); print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = vtap("--metrics", LISTEN)
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 2 and "cannot listen: Address already in use" in r.stderr, r.stderr
    with netdev.ipr(ns) as ip:
        idx = netdev.ifindex_of(ip, "eth0", ns)
        assert not [e for p in tc.PARENTS.values() for e in tc.entries(ip, idx, p)]


@pytest.mark.parametrize("tool", ["redirect"])
def test_redirect_metrics(tool):
    with user_router() as tb:
        servers = echo_servers(tb.topo, ["server"])
        t = Tool(
            tb.ns("router"),
            "redirect",
            *redirect_args(tb, tb.routed4, tb.routed6),
            "--action",
            "forward",
            "--prepare-peer",
            "--metrics",
            LISTEN,
            interval=0.3,
        )
        try:
            assert exchange(tb.topo, "client", tb.routed4, 8080)["udp"] == N
            line, text = settled(t, tb.ns("router"))
        finally:
            t.kill()
            stop_all(servers)
    promtool(text)
    got = samples(text)
    for rule, row in line["rules"].items():
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.endswith("_pps"):
                name = "redirect_unanswered" if k == "unanswered" else f"redirect_{k}_total"
                assert got[(name, (("rule", rule),))] == v, (rule, k)
    assert sum(r["packets"] for r in line["rules"].values()) >= N
