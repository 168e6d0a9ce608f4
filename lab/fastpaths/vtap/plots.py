"""Figures and tables for the notebooks, from result DataFrames (so tests reach them).

    >>> df, meta = metrics.read_results(csv)                      # doctest: +SKIP
    >>> fig = pps_vs_size(df)                                     # Figures 5 and 6
    >>> beside_paper(df, testbed=1)                               # Table 1 and ours

No matplotlib backend is chosen here: a process without a display gets Agg by
itself, and a Jupyter kernel its inline backend, which shows each figure a cell
makes once, at the end of the cell. (Forcing Agg here left the notebook without
figures.) Every figure draws a mirror in the same colour, its own (lab.palette).
"""

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.colors import to_rgba
from matplotlib.patches import Patch
from matplotlib.ticker import EngFormatter, MaxNLocator

from lab import palette
from lab.metrics import PAPER_DIR

# One colour and marker per mirror in every figure, each mirror's own (lab.palette)
MIRROR_ORDER = palette.labels("vtap")
MIRROR_COLORS = palette.colours("vtap")
TESTBED_TITLES = {
    1: "Testbed 1: vTAP on the receiver",
    2: "Testbed 2: vTAP on a bridging node",
    3: "Testbed 3: vTAP on a routing node",
}
# The DUT core's time as stacked bars in the mirror's colour: busy columns from
# solid to pale, steal hatched, idle an empty outline (mpstat's names).
CPU_SHADES = [
    ("sys", {"alpha": 1.0}),
    ("soft", {"alpha": 0.45, "hatch": "///"}),
    ("usr", {"alpha": 0.2, "hatch": "..."}),
    ("steal", {"alpha": 0.0, "hatch": "xxx"}),
    ("idle", {"alpha": 0.0}),
]
RATIO_PEERS = ["ebpf-helper", "tc-mirred", "nft-dup", "ovs"]  # ratios(): eBPF over each of these


def mirror_color(mirror: str) -> str:
    return palette.colour(mirror, "vtap")


def _line_style(mirror):
    return {
        "color": mirror_color(mirror),
        "marker": palette.marker(mirror, "vtap"),
        "linestyle": "--" if mirror == "none" else "-",
    }


def paper_table(testbed: int) -> pd.DataFrame:
    path = PAPER_DIR / f"vtap_table{testbed}.csv"
    if not path.exists():  # an installed package has no datasets/
        raise FileNotFoundError(f"{path} not found: the paper's tables are in the repository's datasets/paper")
    return pd.read_csv(path)


def medians(df: pd.DataFrame) -> pd.DataFrame:
    cols = [
        "receiver_pps",
        "monitor_pps",
        "receiver_mbps",
        "monitor_mbps",
        "dut_ns_per_pkt",
        "cpu_usr",
        "cpu_sys",
        "cpu_soft",
        "cpu_steal",
        "cpu_idle",
    ]
    return df.groupby(["testbed", "mirror", "size"])[cols].median().reset_index()


def _mirrors(df):
    present = set(df["mirror"])
    return palette.in_order(present, "vtap")


def _panels(df, rows=1, height=3.8):
    """One column of axes per testbed, with room below them for a shared legend."""
    tbs = sorted(int(t) for t in df["testbed"].unique())
    fig, axes = plt.subplots(
        rows, len(tbs), figsize=(5.5 * len(tbs), height * rows), squeeze=False, layout="constrained"
    )
    for ax, tb in zip(axes[0], tbs, strict=True):
        ax.set_title(TESTBED_TITLES.get(tb, f"Testbed {tb}"))
    return fig, axes, tbs


def _legend_below(fig, axes, **kw):
    """One legend for all panels, below them, where it covers no data."""
    seen = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, h)
    if seen:
        fig.legend(
            list(seen.values()), list(seen), loc="outside lower center", ncols=min(len(seen), 6), frameon=False, **kw
        )


def _size_axis(ax, d, label=True):
    sizes = sorted(d["size"].unique())
    ax.set_xticks(sizes, [str(s) for s in sizes], fontsize=8)
    if label:
        ax.set_xlabel("frame size (bytes, with FCS)")
    ax.grid(alpha=0.3)


def pps_vs_size(df: pd.DataFrame, value="monitor_pps", ylabel="monitor packets/s"):
    """One panel per testbed: `value` against frame size per mirror, median with
    a min..max band (the analogue of the paper's Figures 5 and 6)."""
    fig, axes, tbs = _panels(df)
    for ax, tb in zip(axes[0], tbs, strict=True):
        d = df[df["testbed"] == tb]
        for m in _mirrors(d):
            if m == "none" and value.startswith("monitor"):
                continue  # nothing to copy
            g = d[d["mirror"] == m].groupby("size")[value]
            med, lo, hi = g.median(), g.min(), g.max()
            ax.plot(med.index, med.values, label=m, **_line_style(m))
            ax.fill_between(med.index, lo.values, hi.values, color=mirror_color(m), alpha=0.15, linewidth=0)
        _size_axis(ax, d)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        if "pps" in value:
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))  # 600k, 1.2M
    _legend_below(fig, axes)
    return fig


def _size_suffix(size):
    return f", {size} B" if size else ", all sizes"


def ns_per_pkt(df: pd.DataFrame, size=None):
    """DUT-core ns of busy CPU per received packet, one bar per mirror: median,
    with a whisker from the cheapest to the dearest trial."""
    d = df if size is None else df[df["size"] == size]
    fig, axes, tbs = _panels(d)
    for ax, tb in zip(axes[0], tbs, strict=True):
        g = d[d["testbed"] == tb].groupby("mirror")["dut_ns_per_pkt"]
        ms = _mirrors(d[d["testbed"] == tb])
        med, lo, hi = (s.reindex(ms) for s in (g.median(), g.min(), g.max()))
        ax.bar(
            range(len(ms)),
            med.values,
            yerr=[med - lo, hi - med],
            capsize=3,
            ecolor="0.25",
            color=[mirror_color(m) for m in ms],
        )
        ax.set_xticks(range(len(ms)), ms, rotation=20)
        ax.set_title(ax.get_title() + _size_suffix(size))
        ax.set_ylabel("DUT ns per received packet")
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
    return fig


def cpu_per_mirror(df: pd.DataFrame, size=None):
    """The DUT core's time split into mpstat's columns, one stacked bar per mirror
    in the mirror's colour; the columns are told apart by shade (CPU_SHADES)."""
    d = df if size is None else df[df["size"] == size]
    fig, axes, tbs = _panels(d)
    for ax, tb in zip(axes[0], tbs, strict=True):
        m = d[d["testbed"] == tb].groupby("mirror")[[f"cpu_{c}" for c, _ in CPU_SHADES]].median()
        ms = _mirrors(d[d["testbed"] == tb])
        m = m.reindex(ms)
        bottom = pd.Series(0.0, index=ms)
        for col, shade in CPU_SHADES:
            v = m[f"cpu_{col}"]
            ax.bar(
                range(len(ms)),
                v.values,
                bottom=bottom.values,
                hatch=shade.get("hatch"),
                color=[to_rgba(mirror_color(x), shade["alpha"]) for x in ms],
                edgecolor=[mirror_color(x) for x in ms],
                linewidth=0.8,
            )
            bottom += v
        ax.set_xticks(range(len(ms)), ms, rotation=20)
        ax.set_title(ax.get_title() + _size_suffix(size))
        ax.set_ylabel("% of the DUT core (median)")
        ax.set_ylim(0, 100)
    grey = "#555555"
    keys = [Patch(facecolor=to_rgba(grey, s["alpha"]), edgecolor=grey, hatch=s.get("hatch")) for _, s in CPU_SHADES]
    fig.legend(keys, [c for c, _ in CPU_SHADES], loc="outside lower center", ncols=len(CPU_SHADES), frameon=False)
    return fig


def ratios_vs_size(df: pd.DataFrame):
    """ratios() as lines against frame size, one colour per peer: the vTAP's
    monitor PPS over the peer's (above 1: the vTAP copies more) and its DUT ns
    per packet over the peer's (below 1: the vTAP costs less). The vTAP is the
    TC one, or on a routing node (Testbed 3) the XDP one, where it ran."""
    r = ratios(df)
    fig, axes, tbs = _panels(df, rows=2, height=3.2)
    for col, tb in enumerate(tbs):
        d = r[r["testbed"] == tb].sort_values("size")
        ours = "ebpf-xdp" if any(c.startswith("ebpf-xdp/") for c in d.columns if d[c].notna().any()) else "ebpf"
        peers = ["ebpf", *RATIO_PEERS] if ours == "ebpf-xdp" else RATIO_PEERS
        for row, (unit, ylabel) in enumerate(
            (("pps", f"{ours} ÷ peer: monitor packets/s"), ("ns", f"{ours} ÷ peer: DUT ns per packet"))
        ):
            ax = axes[row][col]
            for peer in peers:
                c = f"{ours}/{peer} {unit}"
                if c in d and d[c].notna().any():
                    ax.plot(d["size"], d[c], label=peer, **_line_style(peer))
            ax.axhline(1.0, color="black", linewidth=1, linestyle=":", zorder=1)
            _size_axis(ax, d, label=row == 1)
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
    _legend_below(fig, axes, title="peer (the vTAP's value divided by this mirror's)")
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
        for ours, peers in (
            ("ebpf", ("ovs", "tc-mirred", "nft-dup", "ebpf-helper")),
            ("ebpf-xdp", ("tc-mirred", "nft-dup", "ebpf")),
        ):
            if ours not in by.index:
                continue
            for peer in peers:
                if peer in by.index and by.loc[peer, "monitor_pps"]:
                    r[f"{ours}/{peer} pps"] = by.loc[ours, "monitor_pps"] / by.loc[peer, "monitor_pps"]
                    r[f"{ours}/{peer} ns"] = by.loc[ours, "dut_ns_per_pkt"] / by.loc[peer, "dut_ns_per_pkt"]
        for m in by.index:
            if m != "none" and by.loc[m, "receiver_pps"]:
                r[f"{m} monitor/receiver"] = by.loc[m, "monitor_pps"] / by.loc[m, "receiver_pps"]
        out.append(r)
    return pd.DataFrame(out)


# The XDP vTAP's targets on a node that routes (Testbed 3), against tc mirred.
XDP_TARGETS = (
    ("monitor pps, ebpf-xdp / tc-mirred at 64 B", ">=", 2.0),
    ("DUT ns per packet, ebpf-xdp / tc-mirred at 64 B", "<=", 0.5),
    ("monitor / receiver pps of ebpf-xdp, every size", ">=", 0.999),
)


def xdp_targets(df: pd.DataFrame) -> pd.DataFrame:
    """Each target of the XDP vTAP, its measured median (the worst size for the
    monitor/receiver one) and whether it is met; empty without Testbed 3 runs
    of ebpf-xdp and tc-mirred."""
    r = ratios(df[df["testbed"] == 3]) if (df["testbed"] == 3).any() else pd.DataFrame()
    if r.empty or "ebpf-xdp/tc-mirred pps" not in r:
        return pd.DataFrame(columns=["target", "wanted", "measured", "met"])
    small = r[r["size"] == r["size"].min()].iloc[0]
    measured = [small["ebpf-xdp/tc-mirred pps"], small["ebpf-xdp/tc-mirred ns"], r["ebpf-xdp monitor/receiver"].min()]
    rows = []
    for (what, op, want), got in zip(XDP_TARGETS, measured, strict=True):
        met = got >= want if op == ">=" else got <= want
        rows.append({"target": what, "wanted": f"{op} {want:g}", "measured": round(float(got), 3), "met": bool(met)})
    return pd.DataFrame(rows)


# --- on hosts (notebook 07) ---------------------------------------------------------------------
PLACES = ("namespaces", "hosts")


def by_place(hosts: pd.DataFrame, namespaces: pd.DataFrame) -> pd.DataFrame:
    """A hosts run and a namespaces run as one frame, `place` saying which (a run without
    the column is the namespaces'), on what both ran: their testbeds, mirrors and sizes."""
    h = hosts.assign(place="hosts")
    n = namespaces.assign(place="namespaces")
    for col in ("testbed", "mirror", "size"):
        common_values = set(h[col]) & set(n[col])
        h, n = h[h[col].isin(common_values)], n[n[col].isin(common_values)]
    return pd.concat([n, h], ignore_index=True)


def places(df: pd.DataFrame, value="monitor_pps", ylabel="monitor packets/s"):
    """`value` per mirror, one panel per frame size: the namespaces run's bar beside the
    hosts run's, median with a whisker from the slowest to the fastest trial."""
    sizes = sorted(df["size"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 3.8), squeeze=False, sharey=True)
    for ax, size in zip(axes[0], sizes, strict=True):
        d = df[df["size"] == size]
        ms = [m for m in _mirrors(d) if not (m == "none" and value.startswith("monitor"))]
        width = 0.38
        for k, place in enumerate(PLACES):
            g = d[d["place"] == place].groupby("mirror")[value]
            med, lo, hi = (s.reindex(ms) for s in (g.median(), g.min(), g.max()))
            xs = [i + (k - 0.5) * width for i in range(len(ms))]
            colours = [to_rgba(mirror_color(m), 1.0 if place == "hosts" else 0.45) for m in ms]
            ax.bar(xs, med.values, width, yerr=[med - lo, hi - med], capsize=3, ecolor="0.25", color=colours)
        ax.set_xticks(range(len(ms)), ms, rotation=20)
        ax.set_title(f"{size} B")
        ax.set_ylim(bottom=0)
        if "pps" in value:
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    axes[0][0].set_ylabel(ylabel)
    fig.legend(
        handles=[Patch(color=to_rgba("0.3", 0.45), label="namespaces"), Patch(color="0.3", label="hosts")],
        loc="lower center",
        ncol=2,
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def orchestration(meta: dict, namespaces_s=None, target_s=2.0):
    """Each run's wall time on hosts beyond its --duration (start, go, stop and results
    through Ansible); with `namespaces_s` (the namespace path's own time beyond its
    --duration per run), the target: at most `target_s` more than that."""
    runs = pd.DataFrame(meta["hosts"]["orchestration"]["runs"])
    over = runs["wall_s"] - runs["duration_s"]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    ax.plot(range(len(over)), over.values, "o", color="0.25")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if namespaces_s is not None:
        for y, what in (
            (namespaces_s, "namespaces"),
            (namespaces_s + target_s, f"target: namespaces + {target_s:g} s"),
        ):
            ax.axhline(y, color="0.5", linestyle=":", linewidth=1)
            ax.text(len(over) - 0.5, y, f" {what}", va="bottom", ha="right", fontsize=8)
    ax.set_xlabel("run")
    ax.set_ylabel("seconds beyond --duration")
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    return fig


HOST_ROLES = ("sender", "tap", "receiver", "monitor")


def host_cpu(df: pd.DataFrame, size=None):
    """Each role's host: busy percent of all its cores over its own window, per mirror
    (median, whisker min..max). On namespaces as hosts every host is the same machine."""
    d = df if size is None else df[df["size"] == size]
    roles = [r for r in HOST_ROLES if f"{r}_host_busy_pct" in d]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    if not roles:  # a run from before the lab recorded it: said in the figure, not an empty axis
        ax.text(0.5, 0.5, "this run did not record CPU per host", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    ms = _mirrors(d)
    width = 0.8 / max(len(ms), 1)
    for k, m in enumerate(ms):
        g = d[d["mirror"] == m]
        med = [g[f"{r}_host_busy_pct"].median() for r in roles]
        lo = [g[f"{r}_host_busy_pct"].min() for r in roles]
        hi = [g[f"{r}_host_busy_pct"].max() for r in roles]
        xs = [i + (k - (len(ms) - 1) / 2) * width for i in range(len(roles))]
        yerr = [[a - b for a, b in zip(med, lo, strict=True)], [b - a for a, b in zip(med, hi, strict=True)]]
        ax.bar(xs, med, width, yerr=yerr, capsize=2, ecolor="0.25", color=mirror_color(m), label=m)
    ax.set_xticks(range(len(roles)), [f"{r} ({d[f'{r}_host'].iloc[0]})" for r in roles])
    ax.set_ylabel(f"host busy %{_size_suffix(size)}")
    ax.set_ylim(0, 100)
    ax.legend(frameon=False, fontsize=8, ncol=len(ms))
    fig.tight_layout()
    return fig
