"""Notebook 08, cost as the work grows: run headless with tiny sizes as a user runs it (both
benches from its cells, in the kernel's main thread), every figure shown once; the copy in
the repository holds the figures of the reference runs."""

import pandas as pd
from conftest import ROOT, require_tool
from helpers import assert_every_figure_shown_once, execute_notebook, read_notebook

NB08 = ROOT / "notebooks" / "08_cost_as_the_work_grows.ipynb"
FIGURES08 = ["lb_tables_curves.png", "pods_services_curves.png", "pods_tables_curves.png"]


def test_notebook08_runs_both_benches_and_shows_every_figure(tmp_path):
    require_tool("iptables-legacy-restore")
    nb = execute_notebook(
        NB08,
        {
            "VTL_BACKENDS": "2,5",
            "VTL_SESSIONS": "10,1000",
            "VTL_LB_SERVICES": "1,3",
            "VTL_PACKETS": "500",
            "VTL_PODS_PACKET_SERVICES": "1,30",
            "VTL_SERVICES": "1,3",
            "VTL_WAYS": "connect,nft,iptables-legacy",
            "VTL_TRIALS": "1",
            "VTL_DURATION": "0.5",
            "VTL_OUT": str(tmp_path / "results"),
            "VTL_FIGURES": str(tmp_path / "figures"),
        },
    )
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == FIGURES08
    assert_every_figure_shown_once(nb, FIGURES08)
    pods = pd.read_csv(next((tmp_path / "results").glob("pods-*.csv")))
    assert sorted(zip(pods["way"], pods["services"], pods["position"], strict=True)) == sorted(
        (w, n, pos)
        for w in ("connect", "nft", "iptables-legacy")
        for n, pos in ((1, "last"), (3, "last"), (3, "first"))
    )
    last = pods[pods["position"] == "last"]
    assert (pods["tps"] > 0).all() and (last["add_one_ms"] > 0).all() and (last["remove_one_ms"] > 0).all()
    pods_tables = pd.read_csv(next((tmp_path / "results").glob("pods_tables-*.csv")))
    assert sorted(set(pods_tables["services"])) == [1, 30] and (pods_tables["ns_median"] > 0).all()
    tables = pd.read_csv(next((tmp_path / "results").glob("lb_tables-*.csv")))
    assert sorted(tables[tables["what"] == "sweep"]["size"]) == [10, 1000]
    packet = tables[tables["what"] == "packet"]
    assert sorted(zip(packet["kind"], packet["services"], packet["size"], strict=True)) == sorted(
        (k, s, n) for k in ("established", "syn") for s in (1, 3) for n in (10, 1000)
    )


def test_committed_notebook08_holds_its_figures():
    assert_every_figure_shown_once(read_notebook(NB08), FIGURES08)
