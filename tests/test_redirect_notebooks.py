"""Notebooks 02 (XDP redirect against netfilter) and 03 (XDP modes): run for real
with tiny parameters, on the reference CSVs, and as committed; and their figures'
colours and axes."""

import csv

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from helpers import ROOT, assert_every_figure_shown_once, execute_notebook, read_notebook
from matplotlib.colors import same_color
from matplotlib.container import BarContainer

from lab.fastpaths.redirect import plots as rp
from lab.fastpaths.redirect.peers import METHODS

NB02 = ROOT / "notebooks" / "02_xdp_redirect.ipynb"
NB03 = ROOT / "notebooks" / "03_xdp_modes.ipynb"
REF = "datasets/reference/"
TRANSFER_CSV = REF + "redirect_transfer-20261123T152634Z.csv"
RATE_CSV = REF + "redirect_rate-20261123T155809Z.csv"
MODES_CSV = REF + "xdp_modes-20261123T154916Z.csv"
FIGURES02 = [
    "redirect_cpu_per_second_all.png",
    "redirect_cpu_per_second_router.png",
    "redirect_rate_ns.png",
    "redirect_rate_pps.png",
    "redirect_transfer_costs.png",
]
FIGURES03 = ["xdp_modes_ceiling.png", "xdp_modes_equal_load.png"]


def _figures(d):
    return sorted(p.name for p in d.glob("*.png"))


def test_notebook02_runs_both_workloads_and_writes_figures(tmp_path):
    nb = execute_notebook(
        NB02,
        {
            "VTL_METHODS": "nft-dnat,xdp-forward",
            "VTL_MODES": "native",
            "VTL_TRIALS": "1",
            "VTL_TRANSFER_SIZE": str(16 << 20),
            "VTL_SIZES": "64",
            "VTL_FLOWS": "1",
            "VTL_RATES": "ceiling",
            "VTL_DURATION": "0.5",
            "VTL_OUT": str(tmp_path / "results"),
            "VTL_FIGURES": str(tmp_path / "figures"),
        },
    )
    assert _figures(tmp_path / "figures") == FIGURES02
    assert all((tmp_path / "figures" / f).stat().st_size > 10_000 for f in FIGURES02)
    assert_every_figure_shown_once(nb, FIGURES02)
    results = tmp_path / "results"
    transfer = pd.read_csv(next(results.glob("redirect_transfer-*.csv")))
    assert sorted(rp.with_labels(transfer)["label"]) == ["nft-dnat", "xdp-forward:native"]
    assert transfer["digest_ok"].all()
    assert len(list(results.glob("redirect_transfer_cpu-*.csv"))) == len(list(results.glob("redirect_rate-*.csv"))) == 1


def test_notebook03_runs_every_mode_and_writes_figures(tmp_path):
    nb = execute_notebook(
        NB03,
        {
            "VTL_PROGRAMS": "drop,forward",
            "VTL_MODES": "native,generic,offload",
            "VTL_RATES": "ceiling,20000",
            "VTL_TRIALS": "1",
            "VTL_DURATION": "0.5",
            "VTL_OUT": str(tmp_path / "results"),
            "VTL_FIGURES": str(tmp_path / "figures"),
        },
    )
    assert _figures(tmp_path / "figures") == FIGURES03
    assert_every_figure_shown_once(nb, FIGURES03)
    df = pd.read_csv(next((tmp_path / "results").glob("xdp_modes-*.csv")))
    off = df[df["mode"] == "offload"]
    assert len(off) and (off["status"] == "unavailable").all()
    assert off["reason"].str.contains("offload needs a NIC that runs BPF").all()


def test_notebooks_on_the_reference_csvs_show_every_figure(tmp_path):
    nb = execute_notebook(
        NB02, {"VTL_TRANSFER_CSV": TRANSFER_CSV, "VTL_RATE_CSV": RATE_CSV, "VTL_FIGURES": str(tmp_path / "02")}
    )
    assert _figures(tmp_path / "02") == FIGURES02
    assert_every_figure_shown_once(nb, FIGURES02)
    nb = execute_notebook(NB03, {"VTL_CSV": MODES_CSV, "VTL_FIGURES": str(tmp_path / "03")})
    assert _figures(tmp_path / "03") == FIGURES03
    assert_every_figure_shown_once(nb, FIGURES03)


def test_committed_notebooks_hold_their_figures():
    """What a reader sees on opening them without running them."""
    assert_every_figure_shown_once(read_notebook(NB02), FIGURES02)
    assert_every_figure_shown_once(read_notebook(NB03), FIGURES03)


def test_every_method_has_its_own_colour_and_bars_start_at_zero():
    labels = [name if cls.modes == (None,) else f"{name}:{m}" for name, cls in METHODS.items() for m in cls.modes]
    assert set(labels) <= set(rp.METHOD_COLORS)
    assert len(set(rp.METHOD_COLORS.values())) == len(rp.METHOD_COLORS)
    transfer = pd.read_csv(ROOT / TRANSFER_CSV)
    figs = [rp.transfer_costs(transfer), rp.rate_panels(pd.read_csv(ROOT / RATE_CSV), offered=0)]
    try:
        for fig in figs:
            fig.canvas.draw()
            for ax in fig.axes:
                assert ax.get_ylim()[0] == 0
                bars = [c for c in ax.containers if isinstance(c, BarContainer)]
                names = [t.get_text() for t in ax.get_xticklabels()]
                assert len(bars) == 1 and len(names) == len(bars[0]) > 1
                for bar, m in zip(bars[0], names, strict=True):
                    assert same_color(bar.get_facecolor(), rp.METHOD_COLORS[m])
    finally:
        for fig in figs:
            plt.close(fig)


def test_beside_report_puts_the_reports_averages_above_ours():
    cpu = pd.read_csv(ROOT / TRANSFER_CSV.replace("redirect_transfer-", "redirect_transfer_cpu-"))
    t = rp.beside_report(cpu, dut_core=1)
    report = t[t["source"] == "report (all cores)"].set_index("method")
    assert report.loc["netfilter", "soft"] == 34.78 and report.loc["xdp", "soft"] == 17.81
    assert round(report.loc["netfilter", "idle"], 2) == 37.78  # 100 minus the printed columns
    ours = t[t["source"] == "lab (router core 1)"]
    assert set(ours["method"]) == set(rp.with_labels(cpu)["label"])
    # Every second's columns sum to 100, so their means do too.
    means = rp.cpu_averages(cpu, 1).set_index("method")
    assert ((means.sum(axis=1) - 100).abs() < 0.01).all()
    # each of our rows is the mean of the router core's seconds in the raw CSV, per method and mode
    raw = {}
    with open(ROOT / TRANSFER_CSV.replace("redirect_transfer-", "redirect_transfer_cpu-"), newline="") as f:
        for r in csv.DictReader(f):
            if r["cpu"] == "1":
                raw.setdefault(r["method"] + (f":{r['mode']}" if r["mode"] else ""), []).append(r)
    assert sorted(ours["method"]) == sorted(raw)
    for _, row in ours.iterrows():
        seconds = raw[row["method"]]
        for col in ("usr", "sys", "soft", "irq", "steal", "idle"):
            assert row[col] == pytest.approx(sum(float(r[col]) for r in seconds) / len(seconds)), (row["method"], col)
