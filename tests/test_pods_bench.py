"""python -m lab bench pods and notebook 06: a small run of every experiment gives a row
per setting, each carried whole (Gbit/s and transactions measured, no errors), with the
targets said; the notebook runs headless as typed, and on the reference run."""

import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pytest
from conftest import ROOT
from helpers import assert_every_figure_shown_once, execute_notebook, read_notebook, start_until

from lab import cgroups, netns
from lab.fastpaths.pods import plots

NOTEBOOK = ROOT / "notebooks" / "06_pods.ipynb"
REFERENCE_CSV = ROOT / "datasets" / "reference" / "pods-20261127T110431Z.csv"  # every experiment and setting
FIGURES = [
    "pods_cpu_per_gbit.png",
    "pods_rr.png",
    "pods_services.png",
    "pods_stream_ipv4.png",
    "pods_stream_ipv6.png",
    "pods_xdp_modes.png",
]
SMALL = ["--peers", "legacy,ebpf,iptables-legacy,iptables-nft", "--parallel", "1", "--families", "4,6"]
SMALL += ["--paths", "across"]
SMALL += ["--services", "2", "--trials", "1", "--duration", "0.5"]


def test_a_small_run_of_every_experiment_gives_each_setting_its_row(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "lab", "bench", "pods", *SMALL, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    csv = next(tmp_path.glob("pods-*.csv"))
    df = pd.read_csv(csv)
    got = sorted(zip(df["experiment"], df["peer"], df["way"].fillna(""), df["family"], strict=True))
    assert got == sorted(
        [("stream", p, "", f) for p in ("legacy", "ebpf") for f in (4, 6)]
        + [("rr", p, "", 4) for p in ("legacy", "ebpf")]
        + [("services", "ebpf", "connect", 4), ("services", "ebpf", "per-packet", 4), ("services", "legacy", "nft", 4)]
        * 2
        + [("services", f"iptables-{b}", f"iptables-{b}", 4) for b in ("legacy", "nft")] * 2
    )
    # to the service written last and to the first; one service more after each trial, the
    # way it adds one, and removed again; its services built once, the memory they hold said
    sv = df[df["experiment"] == "services"]
    assert sorted(sv["position"]) == ["first"] * 5 + ["last"] * 5 and (sv["build_s"] > 0).all()
    last = sv[sv["position"] == "last"]
    assert (last["add_one_ms"] > 0).all() and (last["remove_one_ms"] > 0).all()
    assert sv[sv["position"] == "first"]["add_one_ms"].isna().all()
    memory = sv.groupby("way")["memory_kib"].first()
    assert (memory > 0).all(), memory  # maps' memlock (eBPF), the rules' charge (the others)
    stream, rest = df[df["experiment"] == "stream"], df[df["experiment"] != "stream"]
    assert (stream["gbps"] > 0).all() and (stream["busy_cores"] > 0).all()
    assert (rest["tps"] > 0).all() and (rest["errors"] == 0).all() and (rest["p50_us"] > 0).all()
    meta = json.loads(csv.with_suffix(".json").read_text())
    assert meta["parameters"]["services"] == [2] and meta["commit"]
    assert "targets (medians):" in r.stdout and "connect() / nftables DNAT connections/s at 2" in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--services", "0"], "--services: 1..16384"),
        (["--services", "16385"], "--services: 1..16384"),
        (["-i", "hosts.yml", "--ways", "nft,iptables-nft"], "--ways iptables-nft: on this machine's namespaces only"),
    ],
)
def test_bad_options_are_one_line(args, message):
    r = subprocess.run([sys.executable, "-m", "lab", "bench", "pods", *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_notebook_executes_and_writes_figures(tmp_path):
    env = {
        "VTL_PEERS": "host,legacy,ebpf,ebpf-redirect",
        "VTL_PARALLEL": "1",
        "VTL_FAMILIES": "4,6",
        "VTL_PATHS": "across",
        "VTL_SERVICES": "2",
        "VTL_TRIALS": "1",
        "VTL_DURATION": "0.5",
        "VTL_OUT": str(tmp_path / "results"),
        "VTL_FIGURES": str(tmp_path / "figures"),
    }
    nb = execute_notebook(NOTEBOOK, env)
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == FIGURES
    assert_every_figure_shown_once(nb, FIGURES)


def test_notebook_on_the_reference_csv_shows_every_figure(tmp_path):
    nb = execute_notebook(NOTEBOOK, {"VTL_CSV": str(REFERENCE_CSV), "VTL_FIGURES": str(tmp_path)})
    assert sorted(p.name for p in tmp_path.glob("*.png")) == FIGURES
    assert_every_figure_shown_once(nb, FIGURES)


def test_committed_notebook_holds_its_figures():
    assert_every_figure_shown_once(read_notebook(NOTEBOOK), FIGURES)


def test_the_targets_table_says_each_target_met_or_not():
    """Each target measured says its number against its target, met or not; those the run did not
    measure (this reference predates kube-proxy's iptables mode and the added service) say so."""
    t = plots.targets(pd.read_csv(REFERENCE_CSV))
    measured = t["result"].str.contains(r"\((?:target) [<>]=") & t["result"].str.endswith(("met", "MISSED"))
    assert len(t) == 7 and measured.sum() == 5
    assert (t[~measured]["result"] == "not measured in this run").all()


def test_a_bench_killed_in_a_block_leaves_what_cleanup_removes(tmp_path):
    """SIGKILL while a way's services are built leaves the testbed and the memory cgroup the
    rules are charged to; `python -m lab cleanup` removes both."""
    before = set(netns.lab_namespaces())

    def mine():
        return [c for c in cgroups.lab_cgroups() if c.name.endswith(".rules") and c.name.startswith(netns.PREFIX)]

    argv = [sys.executable, "-m", "lab", "bench", "pods", "--experiments", "services", "--ways", "iptables-nft"]
    argv += ["--services", "3000", "--trials", "1", "--duration", "1", "--out", str(tmp_path)]
    proc = start_until(argv, lambda: bool(mine()), cwd=ROOT)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert mine() and set(netns.lab_namespaces()) - before
    r = subprocess.run([sys.executable, "-m", "lab", "cleanup"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not mine() and set(netns.lab_namespaces()) == before, r.stdout
