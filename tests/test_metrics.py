"""CPU sampling (mpstat's columns), interface counters and result files."""

import json
import os
import platform
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest
from helpers import snmp, wait_for

from lab import testbeds
from lab.bench.common import udp_frames
from lab.fastpaths.vtap.peers import NoMirror
from lab.fastpaths.vtap.rig import ThroughputRig
from lab.metrics import (
    CPU_COLUMNS,
    USER_HZ,
    CpuSampler,
    IfaceCounters,
    cpu_percent,
    read_proc_stat,
    read_results,
    write_results,
)
from lab.traffic import Flow, Marker, XdpGenerator, build, send_frames

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_columns_add_up_to_100_per_core_under_load():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    t = threading.Thread(target=spin)
    t.start()
    try:
        with CpuSampler(interval=0.2) as cpu:
            time.sleep(1.1)
    finally:
        stop.set()
        t.join()
    samples = cpu.samples()
    assert len(samples) >= 5 * 3  # per interval: every core and "all"
    sums = samples[CPU_COLUMNS].sum(axis=1)
    assert ((sums - 100).abs() <= 1).all(), sums.describe()
    summary = cpu.summary()
    assert ((summary[CPU_COLUMNS].sum(axis=1) - 100).abs() <= 1).all()
    assert summary.loc["all", "busy_ns"] > 0.3e9  # the spinning thread was seen


def test_cpu_percent_follows_mpstat_definitions(tmp_path):
    # user and nice include guest time; mpstat shows them without it
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.write_text("cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\nintr 1\n")
    b.write_text("cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 30 10 20 25 5 4 6 10 10 5\nintr 1\n")
    p = cpu_percent(read_proc_stat(a)[0], read_proc_stat(b)[0])
    total = 30 + 10 + 20 + 25 + 5 + 4 + 6 + 10  # guest fields are inside user and nice
    assert p["usr"] == 100 * (30 - 10) / total and p["nice"] == 100 * (10 - 5) / total
    assert p["sys"] == 100 * 20 / total and p["idle"] == 100 * 25 / total and p["steal"] == 100 * 10 / total
    assert abs(sum(p[c] for c in CPU_COLUMNS) - 100) < 1e-9


def test_interface_counters_count_what_was_sent(tb1):
    marker = Marker()
    frames = build([Flow("x", "198.18.1.10", "198.18.1.2", count=500)], marker, tb1.sender_mac, tb1.next_hop_mac)
    c = IfaceCounters({"tx": (tb1.ns("sender"), "eth0"), "rx": (tb1.ns("receiver"), "eth0")})
    c.mark()
    report = send_frames(tb1.ns("sender"), "eth0", frames, rate_pps=20_000)
    wait_for(lambda: c.delta()["rx"]["rx_packets"] >= 500, what="500 frames at the receiver")
    d = c.delta()
    assert d["tx"]["tx_packets"] == report.packets == 500
    assert d["rx"]["rx_packets"] == 500
    assert d["tx"]["tx_bytes"] == sum(map(len, frames))


def test_results_have_a_sidecar_with_machine_and_parameters(tmp_path):
    df = pd.DataFrame([{"size": 64, "pps": 1.0}])
    path = write_results(df, "unit", {"sizes": [64]}, tmp_path)
    back, meta = read_results(path)
    assert back.to_dict("records") == [{"size": 64, "pps": 1.0}]
    assert meta["parameters"] == {"sizes": [64]}
    for key in ("kernel", "cpu_model", "cores", "commit", "date", "tools"):
        assert meta[key], key
    # this machine, as the kernel and git describe it
    with open("/proc/cpuinfo") as f:
        info = [line.split(":", 1) for line in f if ":" in line]
    assert meta["kernel"] == os.uname().release and meta["host"] == os.uname().nodename
    assert meta["cores"] == sum(k.strip() == "processor" for k, _ in info) == os.cpu_count()
    models = {v.strip() for k, v in info if k.strip() == "model name"}
    assert meta["cpu_model"] in models or (not models and meta["cpu_model"] == platform.processor())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert meta["commit"] in (head, head + "-dirty")
    written = datetime.fromisoformat(meta["date"])
    assert written.tzinfo is not None and abs(datetime.now(timezone.utc) - written) < timedelta(minutes=5)
    assert meta["tools"]["python"] == platform.python_version() and meta["tools"]["pandas"] == pd.__version__
    assert json.loads(path.with_suffix(".json").read_text())["csv"] == path.name


def test_a_companion_csv_takes_its_partners_time(tmp_path):
    """The redirect bench writes redirect_transfer-T.csv and then
    redirect_transfer_cpu-T.csv, and notebook 02 finds one from the other's name.
    Written across a second boundary, the second once got T+1 and the notebook
    failed (found by a fresh-clone CI run)."""
    df = pd.DataFrame([{"a": 1}])
    first = write_results(df, "pair", {}, tmp_path)
    second = write_results(df, "pair", {}, tmp_path)  # in the same second, it is "-2"
    start = datetime.now(timezone.utc).second
    while datetime.now(timezone.utc).second == start:  # the clock moves on, as it did in CI
        time.sleep(0.01)
    for p in (first, second):
        companion = write_results(df, "pair_cpu", {}, tmp_path, companion_of=p)
        assert companion.name == p.name.replace("pair-", "pair_cpu-")
        assert companion.with_suffix(".json").exists()


def test_busy_time_is_wall_time_minus_idle(tmp_path):
    """The tick may miss bursty work; idle is measured exactly. Over 1 s with 50
    ticks idle and only 10 sampled busy, the core was busy 0.5 s, split as the
    tick saw it."""
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.write_text("cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\nintr 1\n")
    idle, usr, sys_ = USER_HZ // 2, USER_HZ // 20, USER_HZ // 20
    b.write_text(f"cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 {usr} 0 {sys_} {idle} 0 0 0 0 0 0\nintr 1\n")
    p = cpu_percent(read_proc_stat(a)[0], read_proc_stat(b)[0], elapsed_ns=1e9)
    assert p["busy_ns"] == 0.5e9 and p["total_ns"] == 1e9
    assert p["idle"] == 50 and p["usr"] == 25 and p["sys"] == 25
    assert abs(sum(p[c] for c in CPU_COLUMNS) - 100) < 1e-9


def test_the_windows_busy_time_is_the_sum_of_its_seconds():
    """The bench writes each trial's busy time and its seconds' busy times, and the
    two must agree. A reading lands between ticks: one interval counts more idle
    ticks than its wall time holds (clamped up to them), the next fewer. Computed
    over the whole window at once, the clamp fell differently, and a CI run's
    router core was busy 40.0 ms in the trial and 40.9 ms in its seconds."""

    def reading(user, idle):
        fields = f"{user} 0 0 {idle} 0 0 0 0 0 0"
        return {"all": read_fields(fields), 0: read_fields(fields)}

    def read_fields(text):
        return dict(
            zip(
                ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice"],
                map(int, text.split()),
                strict=True,
            )
        )

    tick = USER_HZ // 100 or 1  # 10 ms in ticks
    cpu = CpuSampler()
    # 0.1 s, 0.1 s: the first interval saw 12 ticks of idle in 10 ticks of time, the second 6 and 2 busy
    cpu._readings = [(0.0, reading(0, 0)), (0.1, reading(0, 12 * tick)), (0.2, reading(2 * tick, 18 * tick))]
    seconds = cpu.samples()
    for core in ("all", 0):
        per = seconds[seconds["cpu"] == core]
        assert cpu.summary().loc[core, "busy_ns"] == pytest.approx(per["busy_ns"].sum(), rel=1e-9)
        assert cpu.summary().loc[core, "total_ns"] == pytest.approx(per["total_ns"].sum(), rel=1e-9)
    assert cpu.summary().loc[0, "busy_ns"] == pytest.approx(0.1e9 - 6 * tick * 1e9 / USER_HZ)


def test_rig_gives_a_receiving_dut_a_socket_so_frames_cost_no_icmp():
    """In testbed 1 the load ends at the DUT: its rig socket takes it (and drops it
    when full), so the DUT never spends time on port-unreachable replies."""
    tb = testbeds.testbed1()
    with ThroughputRig(tb, 0, 1) as rig:
        frames = udp_frames("198.18.1.10", "198.18.1.2", tb.sender_mac, tb.next_hop_mac, 128, dport=rig.udp_port)
        ns = rig.dut_ns
        unreach, arrived = snmp(ns, "Icmp", "OutDestUnreachs"), snmp(ns, "Udp", "InErrors")
        with XdpGenerator(tb.ns(tb.sender), tb.sender_iface, frames, cpu=0) as gen:
            m = rig.run(gen, NoMirror(ns, tb.tap_iface, tb.monitor_iface), seconds=1, count=5000, rate_pps=20000)
        # every frame the sender's veth took reached the DUT; what it refused is counted (its
        # ring holds 12.8 ms at 20 kpps, and the suite's other worker may take the DUT's core
        # longer: 12 of 5000 once), and is at most a share of the run
        rep, got = m["report"], m["counts"]["dut"]["packets"]
        assert rep.packets == 5000 and got == rep.packets - rep.dropped and rep.dropped <= rep.packets // 2
        assert snmp(ns, "Icmp", "OutDestUnreachs") == unreach
        # the socket never reads: a few datagrams fill it, the rest are refused there
        assert snmp(ns, "Udp", "InErrors") - arrived >= got - 100
