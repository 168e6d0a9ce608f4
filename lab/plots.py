"""Figures and tables for the notebooks, from result DataFrames (so tests reach them).

    >>> df, meta = metrics.read_results(csv)                      # doctest: +SKIP
    >>> fig = pps_vs_size(df)                                     # Figures 5 and 6
    >>> beside_paper(df, testbed=1, paper=paper_table(1))         # Table 1 and ours
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: notebooks run in the test suite
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

PAPER_DIR = Path(__file__).resolve().parent.parent / "datasets" / "paper"
MIRROR_ORDER = ["none", "ebpf", "ebpf-helper", "tc-mirred", "nft-dup", "ovs"]  # lab.mirrors.MIRRORS, in display order


def paper_table(testbed: int) -> pd.DataFrame:
    return pd.read_csv(PAPER_DIR / f"vtap_table{testbed}.csv")


def medians(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["receiver_pps", "monitor_pps", "receiver_mbps", "monitor_mbps", "dut_ns_per_pkt",
            "cpu_usr", "cpu_sys", "cpu_soft", "cpu_steal", "cpu_idle"]
    return df.groupby(["testbed", "mirror", "size"])[cols].median().reset_index()


def _mirrors(df):
    return [m for m in MIRROR_ORDER if m in set(df["mirror"])]


def pps_vs_size(df: pd.DataFrame, value="monitor_pps", ylabel="monitor packets/s"):
    """One panel per testbed: `value` against frame size per mirror, median with
    a min..max band (the analogue of the paper's Figures 5 and 6)."""
    tbs = sorted(df["testbed"].unique())
    fig, axes = plt.subplots(1, len(tbs), figsize=(6 * len(tbs), 4), squeeze=False)
    for ax, tb in zip(axes[0], tbs):
        d = df[df["testbed"] == tb]
        for m in _mirrors(d):
            if m == "none" and value.startswith("monitor"):
                continue
            g = d[d["mirror"] == m].groupby("size")[value]
            med, lo, hi = g.median(), g.min(), g.max()
            ax.plot(med.index, med.values, marker="o", label=m)
            ax.fill_between(med.index, lo.values, hi.values, alpha=0.2)
        ax.set_title(f"Testbed {tb}")
        ax.set_xlabel("frame size (bytes)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def cpu_per_mirror(df: pd.DataFrame, size=None):
    """DUT-core CPU split (mpstat columns) per mirror, and ns of busy CPU per packet."""
    d = df if size is None else df[df["size"] == size]
    tbs = sorted(d["testbed"].unique())
    fig, axes = plt.subplots(1, len(tbs), figsize=(6 * len(tbs), 4), squeeze=False)
    for ax, tb in zip(axes[0], tbs):
        m = d[d["testbed"] == tb].groupby("mirror")[["cpu_usr", "cpu_sys", "cpu_soft", "cpu_steal", "cpu_idle"]].median()
        m = m.reindex([x for x in MIRROR_ORDER if x in m.index])
        m.plot.bar(stacked=True, ax=ax)
        ax.set_title(f"Testbed {tb}: DUT core" + (f", {size} B" if size else ""))
        ax.set_ylabel("% of the DUT core")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def beside_paper(df: pd.DataFrame, testbed: int) -> pd.DataFrame:
    """Our medians next to the paper's Table 1 or 2 (monitor PPS and Mbps)."""
    paper = paper_table(testbed).rename(columns=lambda c: c if c == "size" else f"paper_{c}")
    ours = medians(df[df["testbed"] == testbed])
    wide = ours.pivot(index="size", columns="mirror", values="monitor_pps")
    wide.columns = [f"lab_{m}_pps" for m in wide.columns]
    wide = wide.drop(columns=["lab_none_pps"], errors="ignore").reset_index()
    return paper.merge(wide, on="size", how="outer").sort_values("size").reset_index(drop=True)


def ratios(df: pd.DataFrame) -> pd.DataFrame:
    """eBPF over each peer in monitor PPS and in DUT ns per packet, and monitor over
    receiver for each mirror: medians per testbed and size."""
    med = medians(df)
    out = []
    for (tb, size), g in med.groupby(["testbed", "size"]):
        by = g.set_index("mirror")
        r = {"testbed": tb, "size": size}
        if "ebpf" in by.index:
            for peer in ("ovs", "tc-mirred", "nft-dup", "ebpf-helper"):
                if peer in by.index and by.loc[peer, "monitor_pps"]:
                    r[f"ebpf/{peer} pps"] = by.loc["ebpf", "monitor_pps"] / by.loc[peer, "monitor_pps"]
                    r[f"ebpf/{peer} ns"] = by.loc["ebpf", "dut_ns_per_pkt"] / by.loc[peer, "dut_ns_per_pkt"]
        for m in by.index:
            if m != "none" and by.loc[m, "receiver_pps"]:
                r[f"{m} monitor/receiver"] = by.loc[m, "monitor_pps"] / by.loc[m, "receiver_pps"]
        out.append(r)
    return pd.DataFrame(out)
