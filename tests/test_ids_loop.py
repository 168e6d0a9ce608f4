"""The closed loop (`python -m lab bench ids-loop`): the monitor's vTAP cuts every flow
after 64 KiB and follows the monitor's Suricata alerts; an attacker's transfer raises an
alert 32 KiB in, and its 512 KiB marker reaches the IDS only if that alert had the
attacker copied whole in time. Run as a user runs it, small: exact counts, no timings."""

import re
import subprocess
import sys

import pandas as pd
import pytest
from conftest import ROOT, require_tool
from helpers import assert_bench_refused

PY = sys.executable
ATTACKERS = ["198.19.201.10", "198.19.201.12", "198.19.201.14", "198.19.201.15"]  # paced(4, 2): alternating


@pytest.fixture(autouse=True)
def tools():
    require_tool("suricata")
    require_tool("tcpreplay")


def lab_cmd(*args, timeout=600):
    return subprocess.run([PY, "-m", "lab", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_alerts_have_each_attacker_copied_whole_and_the_ids_sees_past_the_cutoff(tmp_path):
    """4 attackers and 2 benign transfers of 600 KiB, each at 1 Mbps (the 512 KiB marker
    comes 4 s after the alert the 32 KiB one raises), behind a 64 KiB cutoff with alerts
    steering the tap: every attacker is held, copied whole, and raises both markers, and
    no benign host is held. (Cut alone, the monitor raises no 512 KiB marker: the cutoff
    test of test_ids_notebook.py; the mutant alerts-held-not-whole fails this one.) The
    held hosts' waits are measured, from the alert's line and from its packet."""
    r = lab_cmd(
        "bench", "ids-loop", "--modes", "alerts", "--attackers", "4", "--benign", "2",
        "--size", "600K", "--mbps", "1", "--every", "0.25", "--trials", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (csv,) = [p for p in tmp_path.glob("ids_loop-*.csv") if not p.stem.endswith("-waits")]
    (loop,) = [row for _, row in pd.read_csv(csv).iterrows()]
    waits = pd.read_csv(csv.with_name(csv.stem + "-waits.csv"))
    assert loop["mode"] == "alerts" and loop["packets_sent"] > 0 and loop["monitor_drops"] == 0
    assert loop["early_alerts"] == 4 and loop["correct"] and loop["cut"] > 0  # the benign ones stay cut
    # each attacker's two alerts read; each held once, copied whole: its late marker seen
    assert (loop["held"], loop["first_copies"], loop["late_alerts"], loop["alerts_read"]) == (4, 4, 4, 8)
    assert sorted(waits["host"]) == ATTACKERS and set(waits["mode"]) == {"alerts"}
    assert (waits["wait_s"] >= 0).all() and waits["wait_from_packet_s"].notna().all()
    assert loop["wait_median_s"] == pytest.approx(waits["wait_s"].median())
    assert re.search(r"alerts\s+4\s", r.stdout) and "4/4" in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--modes", "open"], r"unknown mode 'open' \(choose from cutoff, alerts, whole\)"),
        (["--size", "100K"], r"--size must hold the 512 KiB marker"),
        (["--cutoff", "600K"], r"--cutoff must keep the 32 KiB marker and cut before the 512 KiB one"),
        (["--cpu-quota", "lots"], r"--cpu-quota must be a percent of a core"),
        (["--attackers", "0"], r"--attackers must be 1\.\.100"),
        (["--every", "60", "--attackers", "10"], r"the transfers would last \d+ s, more than a load run may"),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(args, message, tmp_path):
    r = lab_cmd("bench", "ids-loop", "--trials", "1", "--out", str(tmp_path), *args, timeout=120)
    assert_bench_refused(r, message, tmp_path)
