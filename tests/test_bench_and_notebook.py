"""The throughput bench and its notebook, run for real with tiny parameters."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from helpers import assert_every_figure_shown_once, execute_notebook, read_notebook
from matplotlib.colors import same_color
from matplotlib.container import BarContainer

from lab.bench import generators
from lab.fastpaths.vtap import bench as vt
from lab.fastpaths.vtap import peers as mirrors
from lab.fastpaths.vtap import plots
from lab.metrics import CPU_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
# What a sender's veth may refuse at 20 kpps (test_bench_command_line says why), as a share of
# the frames sent: only that most arrive. How many it refuses is the machine's, not the vTAP's:
# its ring holds 12.8 ms, and the suite's other worker takes the DUT's core for longer (2.9 %
# of a run once, where 0.2 % was the most seen with one worker); every test checks the
# identity (what the veth took arrived, exactly), which is what the vTAP answers for.
SENDER_DROP_SHARE = 0.5


def test_tiny_sweep_writes_documented_columns_and_sidecar(tmp_path):
    df, path = vt.run(
        [1], [64], ["none", "ebpf"], trials=1, duration=0.5, out=tmp_path, progress=False, rate_pps=20_000
    )
    back = pd.read_csv(path)
    assert list(back.columns[: len(vt.COLUMNS)]) == vt.COLUMNS
    assert len(back) == 2 and set(back["mirror"]) == {"none", "ebpf"}
    e = back[back["mirror"] == "ebpf"].iloc[0]
    n = back[back["mirror"] == "none"].iloc[0]
    assert e["monitor_pps"] > 0 and n["monitor_pps"] == 0
    # at a modest rate nothing is lost past the sender's veth (see test_bench_command_line for
    # what it may refuse): the loss is exactly what it refused
    for r in (e, n):
        assert r["sent_packets"] == 10_000 and r["sender_dropped"] <= SENDER_DROP_SHARE * r["sent_packets"]
        assert r["receiver_packets"] == r["sent_packets"] - r["sender_dropped"]
        assert r["receiver_loss"] == pytest.approx(r["sender_dropped"] / r["sent_packets"], abs=1e-12)
    assert e["vtap_cloned"] == e["monitor_packets"] == e["receiver_packets"]  # every frame cloned, every clone arrived
    for _, r in back.iterrows():
        assert abs(sum(r[f"cpu_{c}"] for c in CPU_COLUMNS) - 100) <= 1
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["parameters"]["mirrors"] == ["none", "ebpf"] and meta["kernel"] and meta["commit"]


def test_testbed3_runs_the_xdp_vtap_and_the_mirrors_that_route(tmp_path):
    """On the node that routes: the XDP vTAP sends every frame on and copies it,
    counted exactly at a modest rate; what does not apply there is skipped when
    the mirrors are left to their default, and refused in one line when asked for."""
    df, path = vt.run(
        [3],
        [64],
        ["none", "ebpf-xdp", "tc-mirred", "ovs"],
        trials=1,
        duration=0.5,
        out=tmp_path,
        progress=False,
        rate_pps=20_000,
    )
    assert sorted(df["mirror"]) == ["ebpf-xdp", "none", "tc-mirred"]  # OVS does not route here
    for _, r in df.iterrows():
        assert r["sent_packets"] == 10_000 and r["sender_dropped"] <= SENDER_DROP_SHARE * r["sent_packets"]
        assert r["receiver_packets"] == r["sent_packets"] - r["sender_dropped"]
    x = df[df["mirror"] == "ebpf-xdp"].iloc[0]
    assert x["vtap_cloned"] == x["monitor_packets"] == x["receiver_packets"] == x["dut_packets"]
    bad = subprocess.run(
        [sys.executable, "-m", "lab", "bench", "vtap-throughput", "--testbed", "1,3", "--peers", "ebpf-xdp"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert (
        bad.returncode == 1
        and bad.stderr.strip() == "lab bench: error: mirror ebpf-xdp does not apply to testbed 1 (only to 3)"
    )


def test_the_session_dimension_counts_every_copy_where_it_goes(tmp_path):
    """vTAP sessions on Testbed 3 with 16 rules, to the monitor and tunnelled
    to the collector, whole and cut: at a modest rate every frame the sender's
    veth took is copied and arrives where the target is, and the programs' own
    run times (the kernel's statistics) are read per packet."""
    df, path = vt.run(
        [3],
        [1518],
        ["ebpf-sessions"],
        trials=1,
        duration=0.5,
        out=tmp_path,
        progress=False,
        rate_pps=20_000,
        sessions={"rules": [16], "targets": ["local", "vxlan", "erspan"], "truncate": [0, 128]},
    )
    assert len(df) == 6
    assert sorted(set(zip(df["rules"], df["target"], df["truncate"], strict=True))) == sorted(
        (16, t, c) for t in ("erspan", "local", "vxlan") for c in (0, 128)
    )
    overhead = {"local": 0, "vxlan": 50, "erspan": 50}  # outer IPv4, UDP + VXLAN or GRE+seq + ERSPAN II
    for _, r in df.iterrows():
        assert r["sent_packets"] == 10_000 and r["sender_dropped"] <= SENDER_DROP_SHARE * r["sent_packets"]
        assert r["receiver_packets"] == r["sent_packets"] - r["sender_dropped"] == r["monitor_packets"]
        assert r["vtap_cloned"] == r["monitor_packets"] and r["vtap_failed"] == 0
        assert r["tap_runs"] == r["sender_runs"] == r["receiver_packets"] and 0 < r["tap_ns_per_run"] < 100_000
        copy = (128 if r["truncate"] else 1514) + overhead[r["target"]]
        assert r["monitor_mbps"] == pytest.approx((copy + 4) * 8 * r["monitor_pps"] / 1e6, rel=1e-9)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab",
            "bench",
            "vtap-throughput",
            "--testbed",
            "3",
            "--peers",
            "ebpf-sessions",
            "--targets",
            "gre",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert bad.returncode == 1 and "unknown target 'gre'" in bad.stderr


def test_the_cutoff_dimension_times_the_tap_and_cuts_exactly(tmp_path):
    """--cutoff 0,1K on the vTAP: each run's own program time read (the kernel's
    statistics), one run per packet; off, every frame copied; at 1 KiB, each of the 4
    UDP flows' first ceil(1024 / 18) frames (18 bytes of payload in a 64-byte frame)
    copied and the rest cut, exactly, at a modest rate."""
    df, _ = vt.run(
        [1],
        [64],
        ["ebpf"],
        trials=1,
        duration=0.5,
        out=tmp_path,
        progress=False,
        rate_pps=20_000,
        sessions={"rules": [1], "targets": ["local"], "truncate": [0], "cutoffs": [0, 1024]},
    )
    assert sorted(df["cutoff"]) == [0, 1024] and set(df["mirror"]) == {"ebpf"}
    for _, r in df.iterrows():
        assert r["tap_runs"] == r["receiver_packets"] == r["sent_packets"] - r["sender_dropped"]
        assert 0 < r["tap_ns_per_run"] < 100_000
        copied = 4 * -(-1024 // 18) if r["cutoff"] else r["receiver_packets"]
        assert r["monitor_packets"] == r["vtap_cloned"] == copied
        assert r["vtap_cut"] == (r["receiver_packets"] - copied if r["cutoff"] else 0)
    assert set(vt.with_variant(df)["variant"]) == {"ebpf", "ebpf cutoff 1024"}


def test_bench_command_line(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "lab",
        "bench",
        "vtap-throughput",
        "--testbed",
        "2",
        "--sizes",
        "128",
        "--peers",
        "tc-mirred",
        "--trials",
        "1",
        "--duration",
        "1",
        "--out",
        str(tmp_path),
    ]
    r = subprocess.run(cmd + ["--rate", "20000"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "tc-mirred" in r.stdout and "wrote" in r.stdout
    csvs = list(tmp_path.glob("vtap_throughput-*.csv"))
    assert len(csvs) == 1
    run = pd.read_csv(csvs[0]).iloc[0]
    # Paced at a modest rate: every frame the sending veth took arrived at the receiver
    # and at the monitor, exactly. The sender itself may refuse some, counted: its
    # 256-frame ring holds 12.8 ms at 20 kpps, and fills whenever the DUT's core is
    # away longer, as while the kernel tears down the previous test's namespaces or the
    # hypervisor takes the vCPU (4 of 20000 once in a full suite, 32 in another, 0 of
    # 120000 in six runs alone). How often that happens is the VM's, not the vTAP's, so
    # the bound (SENDER_DROP_SHARE) is loose; the identity below is what the vTAP answers for.
    assert run["offered_pps"] == 20000 and run["sent_packets"] == 20000
    assert run["sender_dropped"] <= SENDER_DROP_SHARE * run["sent_packets"]
    assert run["receiver_packets"] == run["sent_packets"] - run["sender_dropped"] == run["monitor_packets"] > 0
    for args, msg in ((["--peers", "bogus"], "unknown mirror 'bogus'"), (["--rate", "0"], "--rate must be")):
        bad = subprocess.run(cmd[:5] + args, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert bad.returncode == 1 and bad.stderr.strip().count("\n") == 0
        assert msg in bad.stderr
    # the bench's former spelling of --peers, taken for one release with a note
    old = subprocess.run(cmd[:5] + ["--mirrors", "bogus"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert old.returncode == 1 and old.stderr.splitlines() == [
        "lab bench: warning: --mirrors is now --peers; the old spelling goes in the next release",
        "lab bench: error: unknown mirror 'bogus' (choose from none, ebpf, ebpf-helper, ebpf-xdp, ebpf-sessions, "
        "tc-mirred, nft-dup, ovs)",
    ], old.stderr


NOTEBOOK = ROOT / "notebooks" / "01_vtap_throughput.ipynb"
REFERENCE_CSV = "datasets/reference/vtap_throughput-20261122T071150Z.csv"
FIGURES = [
    "vtap_cpu.png",
    "vtap_monitor_mbps.png",
    "vtap_monitor_pps.png",
    "vtap_ns_per_pkt.png",
    "vtap_ratios.png",
    "vtap_receiver_pps.png",
]


def test_notebook_executes_and_writes_figures(tmp_path):
    env = {
        "VTL_TESTBEDS": "1",
        "VTL_SIZES": "64,512",
        "VTL_MIRRORS": "none,ebpf,tc-mirred",
        "VTL_TRIALS": "1",
        "VTL_DURATION": "0.5",
        "VTL_OUT": str(tmp_path / "results"),
        "VTL_FIGURES": str(tmp_path / "figures"),
    }
    nb = execute_notebook(NOTEBOOK, env)
    figs = sorted(p.name for p in (tmp_path / "figures").glob("*.png"))
    assert figs == FIGURES
    assert all((tmp_path / "figures" / f).stat().st_size > 10_000 for f in figs)
    assert_every_figure_shown_once(nb, FIGURES)


def test_notebook_on_the_reference_csv_shows_every_figure(tmp_path):
    # Every mirror and both testbeds, as the copy in the repository was run; no sweep.
    nb = execute_notebook(NOTEBOOK, {"VTL_CSV": REFERENCE_CSV, "VTL_FIGURES": str(tmp_path)})
    assert sorted(p.name for p in tmp_path.glob("*.png")) == FIGURES
    assert_every_figure_shown_once(nb, FIGURES)


def test_committed_notebook_holds_its_figures():
    """What a reader sees on opening the notebook without running it."""
    assert_every_figure_shown_once(read_notebook(NOTEBOOK), FIGURES)


def test_every_figure_draws_a_mirror_in_its_colour_from_zero_with_legends_outside():
    assert set(mirrors.MIRRORS) <= set(plots.MIRROR_COLORS)
    assert len(set(plots.MIRROR_COLORS.values())) == len(plots.MIRROR_COLORS)
    df = pd.read_csv(ROOT / REFERENCE_CSV)
    figs = [plots.pps_vs_size(df, v) for v in ("monitor_pps", "monitor_mbps", "receiver_pps")]
    figs += [plots.ns_per_pkt(df, size=64), plots.cpu_per_mirror(df, size=64), plots.ratios_vs_size(df)]
    try:
        for fig in figs:
            fig.canvas.draw()
            for ax in fig.axes:
                assert ax.get_ylim()[0] == 0 and ax.get_legend() is None
                for line in ax.get_lines():
                    if line.get_label() in plots.MIRROR_COLORS:
                        assert same_color(line.get_color(), plots.MIRROR_COLORS[line.get_label()])
                bars = [c for c in ax.containers if isinstance(c, BarContainer)]
                if bars:  # one bar per mirror, named on the x axis (the CPU chart: its sys segment)
                    names = [t.get_text() for t in ax.get_xticklabels()]
                    assert len(names) == len(bars[0]) > 1
                    for bar, m in zip(bars[0], names, strict=True):
                        assert same_color(bar.get_facecolor(), plots.MIRROR_COLORS[m])
                for legend in fig.legends:
                    assert not legend.get_window_extent().overlaps(ax.get_window_extent())
        assert [len(f.legends) for f in figs] == [1, 1, 1, 0, 1, 1]
    finally:
        for fig in figs:
            plt.close(fig)


def _lab_help(*args):
    r = subprocess.run(
        [sys.executable, "-m", "lab", *args, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_bench_help_shows_every_default_and_examples():
    benches = {vt.NAME: vt.SUMMARY, generators.NAME: generators.SUMMARY}
    for text in (_lab_help(), _lab_help("bench")):  # each bench on one line, with what it does
        for name, summary in benches.items():
            assert any(line.split() == [name] + summary.split() for line in text.splitlines()), text
    for name in benches:
        text = _lab_help("bench", name)
        options = text.split("\noptions:\n")[1].split("\n\n")[0]
        entries = re.split(r"\n(?=  -)", options)  # one per option, with its wrapped help lines
        assert len(entries) > 3
        for entry in entries:
            if not entry.lstrip().startswith("-h, --help"):
                assert "default" in " ".join(entry.split()), f"{name}: {entry.strip()}"
        examples = text.split("\nexamples:\n")[1].splitlines()
        commands = [line.strip() for line in examples if line.strip() and not line.strip().startswith("#")]
        assert len(commands) >= 3 and all(c.startswith(f"python -m lab bench {name}") for c in commands)
