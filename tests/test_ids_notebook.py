"""The IDS experiment behind a per-flow cutoff (`bench ids --cutoff --elephants`) and
notebook 05, which draws Table 3 and the cutoff figure: one small cutoff run, shared by
its test and the notebook (a file of its own, so that the suite's workers share the IDS
runs out)."""

import json
import re

import pandas as pd
import pytest
from conftest import ROOT
from helpers import assert_every_figure_shown_once, execute_notebook, read_notebook
from test_ids import lab_cmd, read_bench, tools  # noqa: F401 -- tools: the autouse fixture (Suricata, tcpreplay)

from lab.traffic import attacks, elephants


@pytest.fixture(scope="module")
def cutoff_run(tmp_path_factory):
    """One small cutoff run from the command line, the elephants starting together and
    staggered, for its test and for notebook 05's cutoff figure (both in this file, so in
    one worker: run once)."""
    out = tmp_path_factory.mktemp("cutoff")
    r = lab_cmd(
        "bench", "ids", "--rates", "4", "--trials", "1", "--cpu-quota", "none", "--loop", "1", "--seed", "2",
        "--cutoff", "64K", "--elephants", "2x1M", "--elephant-starts", "together,staggered", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r, out


def test_a_cutoff_keeps_from_the_monitor_exactly_the_signatures_beyond_it(cutoff_run):
    """Elephants (2 of 1 MiB, markers 32 KiB and 512 KiB in) mixed into the attack mix at a
    modest rate, the monitor's tap cutting at 64 KiB: the receiver, which gets every frame,
    raises every alert; the monitor every alert but the 512 KiB markers', exactly (its truth
    says so, signature by signature), from a fraction of the bytes; the tap's own time per
    packet is read. The same, exactly, with the elephants' starts staggered (their own pcap)."""
    r, out = cutoff_run
    df, sigs = read_bench(out)
    truth = attacks.generate(seed=2, repetitions=1).truth + elephants.truth(2, 1 << 20)
    beyond = {9100041: 2}
    starts = ["staggered", "together"]
    assert sorted(zip(df["cutoff"], df["elephant_starts"], strict=True)) == [(65536, m) for m in starts]
    for _, row in df.iterrows():
        assert row["receiver_alerts"] == row["expected_alerts"] == sum(truth.values()) and row["receiver_correct"]
        assert row["monitor_expected_alerts"] == sum(truth.values()) - 2
        assert row["monitor_alerts"] == row["monitor_expected_alerts"] and row["monitor_correct"]
        assert row["monitor_drops"] == row["receiver_drops"] == 0 and row["tap_ns_per_run"] > 0
        assert row["cut"] > 0 and row["monitor_mbps"] < row["achieved_mbps"] / 2  # both count frames with FCS
    assert df["packets_sent"].nunique() == 1  # the same frames in both pcaps
    for m in starts:
        mon = sigs[(sigs["ids"] == "monitor") & (sigs["cutoff"] == 65536) & (sigs["elephant_starts"] == m)]
        mon = mon.set_index("sid")
        assert mon.loc[9100041, "beyond_cutoff"] and mon.loc[9100041, "alerts"] == 0 == mon.loc[9100041, "expected"]
        assert not mon.loc[9100040, "beyond_cutoff"] and mon.loc[9100040, "alerts"] == 2
        assert set(mon.index[mon["beyond_cutoff"]]) == set(beyond)
    assert "expected: the receiver's / the monitor's" in r.stdout
    assert re.search(r"64K\s+staggered", r.stdout), r.stdout


# --- the notebook --------------------------------------------------------------------------

NB05 = ROOT / "notebooks" / "05_ids.ipynb"
FIGURES05 = ["ids_alerts.png", "ids_cutoff.png", "ids_drop_rates.png"]


def test_notebook05_runs_the_bench_and_shows_every_figure(tmp_path, cutoff_run):
    nb = execute_notebook(
        NB05,
        {
            "VTL_RATES": "1,4",
            "VTL_QUOTAS": "none",  # two runs; the suite's time goes to the cutoff run's four
            "VTL_TRIALS": "1",
            "VTL_LOOP": "2",
            # the cutoff figure from the cutoff test's run (the same API; not run twice)
            "VTL_CUTOFF_CSV": str(next(p for p in cutoff_run[1].glob("ids-*.csv") if "signatures" not in p.name)),
            "VTL_OUT": str(tmp_path / "results"),
            "VTL_FIGURES": str(tmp_path / "figures"),
        },
    )
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == FIGURES05
    assert_every_figure_shown_once(nb, FIGURES05)
    path = next(p for p in (tmp_path / "results").glob("ids-*.csv") if "signatures" not in p.name)
    df = pd.read_csv(path)
    assert len(df) == 2 and df["receiver_correct"].all() and df["monitor_correct"].all()
    # the alerts of each IDS in each run, signature by signature, are the generator's truth for
    # the traffic replayed (the seed the sidecar names, VTL_LOOP repetitions), not the bench's column
    meta = json.loads(path.with_suffix(".json").read_text())["parameters"]
    assert meta["repetitions"] == 2
    truth = attacks.generate(seed=meta["seed"], repetitions=2).truth
    sigs = pd.read_csv(path.with_name(path.stem + "-signatures.csv"))
    runs = sigs.groupby(["rate", "trial", "cpu_quota_pct", "ids"], dropna=False)
    assert len(runs) == 2 * len(df)  # the receiver's and the monitor's, per run
    for run, g in runs:
        assert {int(r.sid): int(r.alerts) for r in g.itertuples() if r.alerts} == dict(truth), run
    assert (df["receiver_alerts"] == sum(truth.values())).all() and (df["monitor_alerts"] == sum(truth.values())).all()
    # the targets table says the 1 Mbps runs were exact
    out = "".join(o.get("data", {}).get("text/plain", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "1 Mbps: receiver raises exactly the truth" in out
    # the cutoff table: behind 64 KiB, every alert within it
    assert re.search(r"64 KiB\s+100\.0", out), out


def test_committed_notebook05_holds_its_figures():
    assert_every_figure_shown_once(read_notebook(NB05), FIGURES05)
