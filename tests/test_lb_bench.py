"""What `python -m lab bench lb` stands on: the HTTP load generators (wrk and
the lab's open-loop generator), the load balancers it compares (lab.fastpaths.lb.peers),
the bench's command line and notebook 04."""

import json
import math
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import ROOT, require_tool
from helpers import assert_every_figure_shown_once, execute_notebook, lb_bed, read_notebook, start_until, wait_for

from ebpf import xdp
from ebpf.instruments.xdp_sink import XdpSink
from lab import daemons, metrics, netns, nft, testbeds
from lab.bench.common import udp_frames
from lab.fastpaths.lb import bench
from lab.fastpaths.lb.peers import BALANCERS, NftLb
from lab.fastpaths.lb.plots import latency_path
from lab.traffic.frames import send_frames
from lab.traffic.http import QUANTILES, Connections, HttpResult, closed_loop, merge, open_loop


def require_tools(*names):
    for name in names:
        require_tool(name)


@pytest.fixture(scope="module")
def bed():
    require_tools("nginx", "cc")  # the backends, and the open loop's generator (compiled at first use)
    with lb_bed(dsr=True) as (tb, webs):  # tc-dsr's backends serve the VIP too
        yield tb, webs


def test_open_loop_sends_every_request_on_schedule(bed):
    tb, webs = bed
    before = webs[0].requests()
    r = open_loop(tb.ns(tb.client), tb.backend4(0), tb.backend_port, rate=500, connections=10, seconds=2)
    assert r.detail["scheduled"] == r.requests == 1000 and r.errors == 0
    assert served_once_closed(bed) - before == 1000  # the server saw exactly those
    assert len(r.quantiles_ms) == len(QUANTILES) and r.quantiles_ms == sorted(r.quantiles_ms)


def test_open_loop_charges_a_stall_to_the_requests_due_during_it(bed):
    """The server is stopped before a 3 s run at 1000 requests/s starts, and goes
    on S seconds after the first request is seen waiting for it (S = 0.5 s, as
    measured). Every request due from the start until 0.1 s before it went on
    (at least (S - 0.1) s of them: over 1 % of 3000) waits at least S - 0.1 s
    counted from when it was due, so P99 is at least that, whatever else
    happens; a closed loop would have paused its clock instead."""
    tb, webs = bed
    group = webs[1].proc.pid
    ns = tb.ns(tb.backends[1])
    result = {}
    os.killpg(group, signal.SIGSTOP)
    t = threading.Thread(
        target=lambda: result.update(
            r=open_loop(tb.ns(tb.client), tb.backend4(1), tb.backend_port, rate=1000, connections=10, seconds=3)
        )
    )
    try:
        t.start()
        wait_for(lambda: queued_at(ns, tb.backend_port) > 0, timeout=60, what="a request waiting at the stopped server")
        seen = time.monotonic()
        time.sleep(0.5)  # the stall itself: what the test does to the server, not a wait for state
        stall = time.monotonic() - seen
    finally:
        os.killpg(group, signal.SIGCONT)
        t.join()
    r = result["r"]
    assert r.requests == 3000 and r.errors == 0
    assert r.percentile(99) >= (stall - 0.1) * 1000, (stall, r.quantiles_ms[-6:])


def tcp_sockets(ns, port):
    """(state, bytes waiting to be read) of each TCP socket of local port `port`
    in namespace `ns`, IPv4 and IPv6, as the kernel lists them (/proc/net/tcp*;
    states in hex: 01 ESTABLISHED, 03 SYN_RECV, 08 CLOSE_WAIT, 0A LISTEN)."""
    text = netns.run(ns, ["cat", "/proc/net/tcp", "/proc/net/tcp6"], capture_output=True, text=True).stdout
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) > 4 and ":" in f[1] and f[1].rsplit(":", 1)[1] == f"{port:04X}":
            out.append((f[3], int(f[4].split(":")[1], 16)))
    return out


def queued_at(ns, port):
    """Bytes waiting to be read on the namespace's established TCP sockets of local port `port`."""
    return sum(waiting for state, waiting in tcp_sockets(ns, port) if state == "01")


def test_wrk_counts_requests_the_servers_saw(bed):
    require_tool("wrk")
    tb, webs = bed
    before = webs[0].requests()
    r = closed_loop(tb.ns(tb.client), tb.backend4(0), tb.backend_port, connections=4, seconds=1, threads=1)
    assert r.errors == 0 and r.requests > 0
    served = served_once_closed(bed)
    # wrk counts the responses it read; the server may have answered one more per connection, cut off at the end
    assert 0 <= served - before - r.requests <= 4


def served_once_closed(bed, i=0):
    """Requests backend i's nginx has logged, once it has closed every
    connection on its port (none ESTABLISHED, CLOSE_WAIT or SYN_RECV in its
    namespace's /proc/net/tcp): nginx logs a request before it can close the
    connection that carried it, so by then every request is in the log."""
    tb, webs = bed
    ns, port = tb.ns(tb.backends[i]), tb.backend_port

    wait_for(
        lambda: not [s for s, _ in tcp_sockets(ns, port) if s in ("01", "03", "08")],
        timeout=30,
        what="nginx to close every connection",
    )
    return webs[i].requests()


def test_merge_is_the_mixture_of_the_distributions():
    a = HttpResult("x", 10, None, 1000, 0, 1.0, [float(q) for q in QUANTILES])  # 0..100 ms
    b = HttpResult("x", 10, None, 1000, 1, 2.0, [100 + float(q) for q in QUANTILES])  # 100..200 ms
    m = merge([a, b])
    assert (m.requests, m.errors, m.connections, m.seconds) == (2000, 1, 20, 2.0)
    assert m.percentile(50) == pytest.approx(99.5, abs=1.0)  # the middle of the two
    assert m.percentile(25) == pytest.approx(a.percentile(50), abs=1.0)
    assert merge([a]) is a and merge([a, a]).quantiles_ms == pytest.approx(a.quantiles_ms, abs=0.01)


@pytest.mark.parametrize("name", list(BALANCERS))
def test_each_balancer_spreads_connections_and_leaves_nothing(bed, name):
    if name.startswith("haproxy"):
        require_tool("haproxy")
    tb, webs = bed
    lbns = tb.ns(tb.lb)
    sysctls = {
        k: netns.read_sysctl(lbns, k) for k in ("net.ipv4.conf.all.send_redirects", "net.ipv4.conf.eth0.send_redirects")
    }
    seen = [len(w.clients()) for w in webs]
    peer = BALANCERS[name](tb)
    with peer:
        if name != "direct":
            assert peer.pids() or name == "nft-lb"
        if name == "xdp":
            assert peer.maps_bytes() > 0 and len(xdp.attached(lbns)) == 1
        served = []
        for addr, port in peer.targets():
            with Connections(tb.ns(tb.client), addr, port, 40) as c:
                served += c.request()
    assert set(served) == {"served by be1", "served by be2"}  # every request answered, both used
    clients = {c for w, n in zip(webs, seen, strict=True) for c in w.clients()[n:]}
    # through the LB, from its address; in DSR the client's own, kept on the way to the backend
    assert clients == ({tb.client4} if name in ("direct", "tc-dsr") else {tb.lb4})
    # nothing left: no daemon, run directory, rule table or program, the sysctls as they were
    assert not [d for s in daemons.kinds() if s != ".nginx" for d in daemons.RUN_DIR.glob(f"{netns.PREFIX}*{s}")]
    assert peer.pids() == [] and xdp.attached(lbns) == [] and nft.tables(lbns, "ip") == []
    assert {k: netns.read_sysctl(lbns, k) for k in sysctls} == sysctls


class Accounting:
    """What the kernel accounts over a block, read here and not by the bench:
    the machine's busy CPU seconds (/proc/stat: user, nice, system, irq and
    softirq, all CPUs), the CPU seconds of this process's children once reaped
    (getrusage: the bench and every process it started and waited for), and the
    wall time."""

    def __enter__(self):
        self.busy0, self.children0, self.t0 = self._busy(), self._children(), time.monotonic()
        return self

    def __exit__(self, *exc):
        self.busy = self._busy() - self.busy0
        self.children = self._children() - self.children0
        self.wall = time.monotonic() - self.t0
        return False

    @staticmethod
    def _busy():
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
        return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _children():
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime


# Tick-sampled /proc/stat against schedstat's exact times: over 1 s runs, a few ticks either way.
CORES_SLACK = 0.1


def check_cpu_columns(df, used):
    """The bench's CPU columns against the kernel's accounting of the whole run
    (`used`, an Accounting): no row's machine busier than every core of it, the
    rows' busy seconds within the machine's over the run, each LB's processes (and
    NAPI thread) within the machine's busy cores and, once reaped, within the CPU
    time the kernel charged to the bench's children."""
    cores = os.cpu_count()
    assert ((df["machine_cores"] > 0) & (df["machine_cores"] <= cores + CORES_SLACK)).all(), df["machine_cores"]
    assert (df["machine_cores"] * df["duration_s"]).sum() <= used.busy * 1.02 + CORES_SLACK, used.busy
    lbs = df[df["lb"] != "direct"]
    own = lbs["lb_proc_cores"].fillna(0) + lbs["lb_napi_cores"].fillna(0)
    assert (own <= lbs["machine_cores"] + CORES_SLACK).all(), (own, lbs["machine_cores"])
    assert (lbs["lb_proc_cores"] * lbs["duration_s"]).sum() <= used.children * 1.02 + 0.05, used.children
    assert (df["lb_cpu_cores"].dropna().abs() <= cores + CORES_SLACK).all()


def test_bench_writes_both_csvs_with_the_documented_columns(tmp_path):
    require_tools("nginx", "wrk", "cc")
    with Accounting() as used:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "lab",
                "bench",
                "lb",
                "--peers",
                "direct,tc,tc-dsr,nginx-l4",
                "--connections",
                "20",
                "--loads",
                "10",
                "--sessions",
                "0,5000",
                "--trials",
                "1",
                "--duration",
                "1",
                "--out",
                str(tmp_path),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert r.returncode == 0, r.stderr
    csv = next(tmp_path.glob("lb-*.csv"))
    df = pd.read_csv(csv)
    assert list(df.columns[: len(bench.COLUMNS)]) == bench.COLUMNS
    assert len(df) == 10 and set(df["loop"]) == {"closed", "open"} and (df["errors"] == 0).all()
    # --sessions: the DSR peer run with its table empty and filled, each loop; the others once
    assert sorted(df[df["lb"] == "tc-dsr"]["sessions"]) == [0, 0, 5000, 5000]
    assert (df[df["lb"] != "tc-dsr"]["sessions"] == 0).all()
    assert "tc-dsr at 5,000 live sessions / at 0, 20 connections" in r.stdout
    assert (df["requests"] > 0).all() and (df["rps"] > 0).all()
    direct, tc_rows = df[df["lb"] == "direct"], df[df["lb"] == "tc"]
    assert direct["lb_cpu_cores"].isna().all() and (df["napi"] == "softirq").all()
    assert (tc_rows["lb_maps_mb"] > 0).all() and (tc_rows["mode"] == "nat").all()
    assert (tc_rows["lb_proc_cores"] > 0).all() and tc_rows["lb_napi_cores"].isna().all()
    # DSR at TC: the backends answered from the VIP they hold, straight to the clients
    assert (df[df["lb"] == "tc-dsr"]["mode"] == "dsr").all() and len(df[df["lb"] == "tc-dsr"]) == 4
    check_cpu_columns(df, used)
    # softirq: the LB's CPU is known only at equal offered load (the open loop), from the machine's
    assert df[df["loop"] == "closed"]["lb_cpu_cores"].isna().all()
    assert df[(df["loop"] == "open") & (df["lb"] != "direct")]["lb_cpu_cores"].notna().all()
    opened = df[df["loop"] == "open"]
    # the open loop's rate is 10 % of direct's closed-loop capacity measured in the same run,
    # and every request of its schedule was answered: the rate times the run, to one request
    cap = direct[direct["loop"] == "closed"]["rps"].iloc[0]
    assert opened["offered_rps"].tolist() == pytest.approx([cap * 0.1] * 5)
    assert ((opened["requests"] - opened["offered_rps"] * opened["duration_s"]).abs() <= 1).all(), opened
    # at 20 connections nothing is lost anywhere (what the counters count: the test below)
    losses = ["veth_ring_drops", "xdp_tx_errors", "if_dropped", "client_retrans", "lb_retrans", "backend_retrans"]
    assert (df[losses] == 0).all().all(), df[["lb", "loop", *losses, "lost_at"]]
    assert (tc_rows["lb_program_drops"] == 0).all()
    lat = pd.read_csv(bench_latency(csv))
    assert len(lat) == 10 * len(QUANTILES) and lat["latency_ms"].notna().all()
    assert sorted(set(lat[lat["lb"] == "tc-dsr"]["sessions"])) == [0, 5000]
    assert "median over trials" in r.stdout and "open loop" in r.stdout
    # tc among the peers: its cost per packet against its floor (TC's), measured first, in the sidecar
    (floor,) = json.loads(csv.with_suffix(".json").read_text())["parameters"]["floor"]
    assert floor["hook"] == "tc" and floor["floor_ratio"] > 0
    assert floor["lb_ns_per_run"] > floor["floor_ns_per_run"] > 0
    assert (tmp_path / floor["floor_csv"]).is_file() and "against its floor" in r.stdout


def test_bench_with_threaded_napi_reads_the_lbs_kernel_thread(tmp_path):
    require_tools("nginx", "wrk")
    with Accounting() as used:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "lab",
                "bench",
                "lb",
                "--peers",
                "xdp,nginx-l4",
                "--loops",
                "closed",
                "--napi",
                "threaded",
                "--connections",
                "20",
                "--trials",
                "1",
                "--duration",
                "1",
                "--out",
                str(tmp_path),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(next(tmp_path.glob("lb-*.csv")))
    # the NAPI kthread ran (every frame to the LB went through it) and, one thread, on one core at a time
    assert (df["napi"] == "threaded").all() and df["lb_napi_cores"].between(0, 1 + CORES_SLACK).all(), df
    assert (df["lb_napi_cores"] > 0).all()
    check_cpu_columns(df, used)
    # the LB's CPU: its processes and its NAPI thread, within what the machine was busy
    assert (df["lb_cpu_cores"] <= df["machine_cores"] + CORES_SLACK).all(), df


def bench_latency(csv):
    return latency_path(csv)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--peers", "direct,envoy"], "unknown balancer 'envoy'"),
        (["--loops", "half"], "unknown loop 'half'"),
        (["--connections", "0"], "connections must be at least 1"),
        (["--loads", "0"], "loads are percent"),
        (["--duration", "0"], "--duration must be in"),
        (["--capacity", "-5"], "--capacity must be positive"),
    ],
)
def test_bench_bad_input_is_one_line(args, message, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "lab", "bench", "lb", *args, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    # (this module's testbed is a live lab run: the bench warns that it shares the CPUs)
    lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("lab bench: warning: another lab run")]
    assert len(lines) == 1 and lines[0].startswith("lab bench: error: ") and message in lines[0], r.stderr
    assert not list(tmp_path.iterdir())


NB04 = ROOT / "notebooks" / "04_xdp_lb.ipynb"
FIGURES04 = ["lb_cpu.png", "lb_latency_cdf.png", "lb_rps.png"]


def test_notebook04_runs_the_bench_and_shows_every_figure(tmp_path):
    require_tools("nginx", "wrk", "cc")
    with Accounting() as used:
        nb = execute_notebook(
            NB04,
            {
                "VTL_LBS": "direct,xdp,nginx-l4",
                "VTL_CONNECTIONS": "20",
                "VTL_LOADS": "10",
                "VTL_TRIALS": "1",
                "VTL_DURATION": "1",
                "VTL_OUT": str(tmp_path / "results"),
                "VTL_FIGURES": str(tmp_path / "figures"),
            },
        )
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == FIGURES04
    assert_every_figure_shown_once(nb, FIGURES04)
    df = pd.read_csv(next((tmp_path / "results").glob("lb-*.csv")))
    assert len(df) == 6 and not math.isnan(df[(df["lb"] == "xdp") & (df["loop"] == "open")]["lb_cpu_cores"].iloc[0])
    # the kernel that ran the bench is still alive (not reaped): only the machine's accounting applies
    used.children = math.inf
    check_cpu_columns(df, used)


def test_committed_notebook04_holds_its_figures():
    assert_every_figure_shown_once(read_notebook(NB04), FIGURES04)


def _lb_run_dirs():
    return {d for s in (".proxy", ".xdp-lb") for d in daemons.RUN_DIR.glob(f"{netns.PREFIX}*{s}")}


def _comm(pid):
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return None


def _start_bench_and_wait_for(lb, tmp_path):
    """The bench on one LB, closed loop, a run long enough to be interrupted,
    once the load is under way (wrk runs in the client's namespace: the LB is
    up, its XDP program attached)."""
    require_tools("haproxy" if lb.startswith("haproxy") else "nginx", "wrk")
    return start_until(
        [
            sys.executable,
            "-m",
            "lab",
            "bench",
            "lb",
            "--peers",
            lb,
            "--loops",
            "closed",
            "--connections",
            "20",
            "--trials",
            "1",
            "--duration",
            "60",
            "--out",
            str(tmp_path),
        ],
        lambda: any(
            _comm(p) == "wrk" for n in netns.lab_namespaces() if n.endswith("-client") for p in netns.pids(n)
        ),  # (not the set-up's ethtool, run there first)
        cwd=ROOT,
    )


def test_interrupted_bench_removes_everything_itself(tmp_path):
    namespaces = set(netns.lab_namespaces())
    proc = _start_bench_and_wait_for("haproxy-l7", tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group, wrk included
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "lab: interrupted; everything this run started has been removed"
    assert "Traceback" not in err
    assert not _lb_run_dirs() and set(netns.lab_namespaces()) == namespaces
    assert not list(tmp_path.iterdir())  # no half-written results


def test_an_interrupted_spread_stops_its_loads_at_once_even_one_that_ignores_sigint():
    """wrk ignores SIGINT until its threads are up: a Ctrl-C in that moment reached the
    bench alone, whose spread() then waited for its wrk thread's whole run (a bench held
    60 s by one Ctrl-C, once in six suites). Here the interrupt goes to Python only, as
    it then did: the loads must stop at once."""
    require_tool("wrk")
    with testbeds.pair("client", "server", "spread") as t:
        ns, addr = t.ns("client"), t.addr("server", "eth0")
        servers = [  # two servers, as an LB's targets: a thread of spread's each
            t.popen("server", [sys.executable, "-m", "http.server", str(port), "--bind", addr]) for port in (8081, 8082)
        ]
        wait_for(lambda: all(_listening(t.ns("server"), port) for port in (8081, 8082)), what="the servers")
        code = (
            "from lab.traffic.http import closed_loop, spread; "
            f"spread(closed_loop, {ns!r}, [({addr!r}, 8081), ({addr!r}, 8082)], 2, seconds=60, threads=1)"
        )
        proc = start_until(
            [sys.executable, "-c", code],
            lambda: sum(_comm(p) == "wrk" for p in netns.pids(ns)) == 2,
            cwd=ROOT,
        )
        started = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)  # Python only: the wrks do not see it
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - started
        assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
        assert took < 10, f"{took:.1f} s after the interrupt"
        assert not [p for p in netns.pids(ns) if _comm(p) == "wrk"]
        for server in servers:
            netns.stop(server)


def _listening(ns, port):
    out = netns.run(ns, ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
    return bool(out.strip())


def test_killed_bench_is_cleaned_up(tmp_path):
    """SIGKILL mid-run leaves the namespaces, the LB's command line attached in
    one of them and its run directory; `python -m lab cleanup` removes it all."""
    namespaces = set(netns.lab_namespaces())
    proc = _start_bench_and_wait_for("xdp", tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    left = set(netns.lab_namespaces()) - namespaces
    assert left and _lb_run_dirs()
    lbns = next(n for n in left if n.endswith("-lb"))
    assert len(xdp.attached(lbns)) == 1  # the kill left the LB's program on its interface
    r = subprocess.run([sys.executable, "-m", "lab", "cleanup"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "python -m lab lb run directory" in r.stdout
    assert not _lb_run_dirs() and set(netns.lab_namespaces()) == namespaces


def test_the_loss_counters_count_each_frame_a_veth_refused_where_it_was_refused():
    """bench lb's loss columns (lab.metrics.path_losses): a program that sends every frame
    back (XDP_TX) into a veth peer that runs no XDP program has each one refused; the
    counters say how many (each frame the program ran on, once) and at which interface."""
    with testbeds.pair("tx", "rx", "loss") as t, XdpSink("tx") as bounce:
        bounce.attach("eth0", netns=t.ns("rx"))
        spaces = {t.ns("tx"): "tx", t.ns("rx"): "rx"}
        before = metrics.path_losses(spaces)
        frames = udp_frames(
            t.addr("tx", "eth0"), t.addr("rx", "eth0"), t.mac("tx", "eth0"), t.mac("rx", "eth0"), 64, 30
        )
        send_frames(t.ns("tx"), "eth0", frames)
        wait_for(lambda: bounce.counters()["packets"] >= 30, what="the 30 frames at the program")
        lost = metrics.losses_between(before, metrics.path_losses(spaces))
        bounced = bounce.counters()["packets"]  # 30, and whatever else the link carried (IPv6 ND)
    assert lost[t.ns("rx")]["xdp_tx_errors"] == bounced and lost[t.ns("tx")]["xdp_tx_errors"] == 0
    assert f"rx eth0 rx_queue_0_xdp_tx_errors {bounced}" in metrics.where_lost(lost, spaces)


def test_bench_runs_the_lbs_that_hold_services_with_more_of_them(tmp_path):
    """--services 1,3: the LB at TC and nft-lb each run with one service and with three (the
    measured one, two more on the VIP's other ports), every request answered either way;
    nft-lb's three in one verdict map."""
    require_tools("nginx", "wrk")
    r = subprocess.run(
        [sys.executable, "-m", "lab", "bench", "lb", "--peers", "direct,tc,nft-lb", "--loops", "closed"]
        + ["--connections", "20", "--services", "1,3", "--trials", "1", "--duration", "1", "--no-floor"]
        + ["--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(next(tmp_path.glob("lb-*.csv")))
    got = sorted(zip(df["lb"], df["services"], strict=True))
    assert got == [("direct", 1), ("nft-lb", 1), ("nft-lb", 3), ("tc", 1), ("tc", 3)]
    assert (df["errors"] == 0).all() and (df["rps"] > 0).all()
    for lb in ("tc", "nft-lb"):
        assert f"{lb} with 3 services / with 1, 20 connections" in r.stdout, r.stdout


def test_nft_lb_holds_its_services_in_one_map():
    text = NftLb.services_text(SimpleNamespace(TABLE="t", decoy_ports=lambda: [20001, 20002]), "198.18.5.100", 80, 2)
    assert "map services { type ipv4_addr . inet_service : verdict ; }" in text
    assert "198.18.5.100 . 80 : goto svc0, 198.18.5.100 . 20001 : goto svc1, 198.18.5.100 . 20002 : goto svc2" in text
    assert text.count("numgen random mod 2 vmap { 0 : goto be0, 1 : goto be1 }") == 3
