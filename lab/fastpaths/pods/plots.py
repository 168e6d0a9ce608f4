"""Figures and tables for the pods notebook (06), from the CSV of `python -m lab bench
pods` (one row per run: stream, rr or services), beside the Cilium/SmartNIC note and the
peer redirect's commit.

    >>> df, meta = metrics.read_results(csv)          # doctest: +SKIP
    >>> fig = stream_bars(df)          # Gbit/s per way, same node and across, 1 and 10 streams
    >>> fig = cpu_per_gbit(df)         # %usr/%sys/%soft of the machine per Gbit/s
    >>> fig = rr_bars(df)              # TCP_RR latency per way, beside the commit's 122 / 44 us
    >>> fig = services_bars(df)        # connections/s through a service, 1 and 100 services
    >>> fig = services_curves(df)      # the same and the time to add one, as the services grow (log x)
    >>> targets(df)                    # the issue's targets, met or missed

Like the other bundles' plots: each way has one colour in every figure (its peer's); rates
and costs start at zero; bars are medians, whiskers min..max.
"""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from lab import palette
from lab.fastpaths.pods.bench import targets as target_lines
from lab.metrics import PAPER_DIR

WAYS_COLOURS = {
    "connect": "#0072B2",
    "per-packet": "#56B4E9",
    "nft": "#E69F00",
    "iptables-legacy": "#CC6677",
    "iptables-nft": "#882255",
}


def commit_rr() -> pd.DataFrame:
    """The TCP_RR table of the commit that added bpf_redirect_peer()."""
    return pd.read_csv(PAPER_DIR / "pods_redirect_peer_commit.csv")


def _peers(d):
    return palette.in_order(d["peer"], "pods")


def _bar_group(ax, d, names, value, levels, key, scale=1.0, by="peer", colour=None):
    """Bars of `value` (median, whiskers min..max) per `key` level, one per name of column `by`."""
    colour = colour or (lambda name: palette.colour(name, "pods"))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        g = d[d[by] == name].groupby(key)[value]
        if g.ngroups == 0:
            continue
        med, lo, hi = g.median() / scale, g.min() / scale, g.max() / scale
        x = np.array([levels.index(k) for k in med.index]) + (i - (len(names) - 1) / 2) * width
        ax.bar(
            x,
            med.values,
            width,
            color=colour(name),
            label=name,
            yerr=[med.values - lo.values, hi.values - med.values],
            capsize=2,
            ecolor="#333333",
        )
    ax.set_xticks(range(len(levels)), [str(k) for k in levels])
    ax.set_ylim(bottom=0)


def stream_bars(df, family=4):
    """Gbit/s per way: one panel per path (same node, across), streams on the x axis."""
    d = df[(df["experiment"] == "stream") & (df["family"] == family)]
    paths = [p for p in ("same-node", "across") if p in set(d["path"])]
    fig, axes = plt.subplots(1, len(paths), figsize=(5.5 * len(paths), 4), squeeze=False)
    levels = sorted(d["parallel"].unique())
    for ax, path in zip(axes[0], paths, strict=True):
        p = d[d["path"] == path]
        _bar_group(ax, p, _peers(p), "gbps", levels, "parallel")
        ax.set_xlabel("parallel TCP streams (iperf3 -P)")
        ax.set_ylabel("Gbit/s")
        ax.set_title(f"pod to pod, {path} (IPv{family})")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def cpu_per_gbit(df, path="across", parallel=1, family=4):
    """The machine's CPU (both nodes: one kernel) per Gbit/s carried, stacked %usr, %sys,
    %soft in core-seconds per Gbit: the note's 'CPU against traffic'."""
    d = df[
        (df["experiment"] == "stream") & (df["path"] == path) & (df["parallel"] == parallel) & (df["family"] == family)
    ].copy()
    names = _peers(d)
    fig, ax = plt.subplots(figsize=(7.5, 4))
    ncores = 100.0 * d["busy_cores"] / (d["usr_pct"] + d["sys_pct"] + d["soft_pct"]).replace(0, np.nan)
    bottom = np.zeros(len(names))
    for col in ("usr", "sys", "soft"):
        # a column's share of the busy cores, per Gbit/s
        d[f"{col}_per_gbit"] = d[f"{col}_pct"] / 100.0 * ncores / d["gbps"]
        vals = np.array([d[d["peer"] == n][f"{col}_per_gbit"].median() for n in names])
        ax.bar(range(len(names)), vals, 0.6, bottom=bottom, color=palette.CPU[col], label=f"%{col}")
        bottom += np.nan_to_num(vals)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("CPU cores per Gbit/s (median)")
    ax.set_title(f"CPU per Gbit/s, {path}, {parallel} stream{'s' if parallel > 1 else ''} (IPv{family})")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def rr_table(df) -> pd.DataFrame:
    d = df[df["experiment"] == "rr"]
    t = d.groupby("peer")[["tps", "p50_us", "p90_us", "p99_us"]].median()
    return t.reindex(_peers(d)).round(1)


def rr_bars(df):
    """TCP_RR across nodes: median latency (p50, whiskers to p99) per way, beside the commit's
    bpf_redirect() and bpf_redirect_peer() (hollow markers)."""
    d = df[df["experiment"] == "rr"]
    names = _peers(d)
    fig, ax = plt.subplots(figsize=(8, 4))
    med = [d[d["peer"] == n]["p50_us"].median() for n in names]
    p99 = [d[d["peer"] == n]["p99_us"].median() for n in names]
    ax.bar(
        range(len(names)),
        med,
        0.6,
        color=[palette.colour(n, "pods") for n in names],
        yerr=[np.zeros(len(names)), np.array(p99) - np.array(med)],
        capsize=3,
        ecolor="#333333",
    )
    c = commit_rr().set_index("helper")
    label = "the peer redirect's commit (p50)"  # on the first marker drawn (a run may have one peer of the two)
    for helper, ours in (("bpf_redirect", "ebpf-redirect"), ("bpf_redirect_peer", "ebpf")):
        if ours in names:
            ax.plot(names.index(ours), c.loc[helper, "p50_us"], "o", mfc="none", mec="black", ms=8, label=label)
            label = None
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_ylabel("microseconds per transaction (p50, whisker to p99)")
    ax.set_title("TCP_RR across nodes: 1 byte each way")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def _last(d):
    """The runs to the service written last (every run of a CSV from before the first was measured)."""
    return d[d["position"] == "last"] if "position" in d else d


def services_bars(df):
    """Connections per second through a service (TCP_CRR), by translation and number of services."""
    d = _last(df[df["experiment"] == "services"])
    ways = [w for w in WAYS_COLOURS if w in set(d["way"])]
    levels = sorted(int(n) for n in d["services"].unique())
    fig, ax = plt.subplots(figsize=(7, 4))
    d = d.astype({"services": int})
    _bar_group(ax, d, ways, "tps", levels, "services", scale=1000, by="way", colour=WAYS_COLOURS.get)
    ax.set_xlabel("services on the nodes")
    ax.set_ylabel("connections per second (thousands)")
    ax.set_title("A service's connections per second (TCP_CRR)")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def _curve(ax, d, value, way, scale=1.0, label=True, **kw):
    """One way's median of `value` per service count, whiskers min..max."""
    g = d[d["way"] == way].dropna(subset=[value]).groupby("services")[value]
    if not g.ngroups:
        return
    med, lo, hi = g.median() / scale, g.min() / scale, g.max() / scale
    ax.errorbar(
        med.index,
        med,
        yerr=[med - lo, hi - med],
        marker="o",
        capsize=3,
        label=way if label else None,
        color=WAYS_COLOURS.get(way),
        **kw,
    )


def services_curves(df):
    """As the services grow (log x), per way: connections per second to the service written
    last (kube-proxy's worst case in iptables mode; dotted: to the one written first), the
    time to add one more service, and the kernel memory the services hold."""
    d = df[df["experiment"] == "services"].astype({"services": int})
    ways = [w for w in WAYS_COLOURS if w in set(d["way"])]
    panels = 3 if "memory_kib" in d else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4))
    a, b = axes[0], axes[1]
    for way in ways:
        _curve(a, _last(d), "tps", way, scale=1000)
        if "position" in d:
            _curve(a, d[d["position"] == "first"], "tps", way, scale=1000, label=False, ls=":", alpha=0.6)
        if "add_one_ms" in d:
            _curve(b, d, "add_one_ms", way)
        if panels == 3:
            _curve(axes[2], d, "memory_kib", way, scale=1024)
    a.set_ylim(bottom=0)
    a.set_ylabel("connections per second (thousands)")
    a.set_title("To the last service (TCP_CRR; dotted: the first)")
    b.set_ylabel("ms to add one service (both nodes)")
    b.set_title("Adding one more")
    if panels == 3:
        axes[2].set_ylabel("MiB of kernel memory (both nodes)")
        axes[2].set_title("What the services hold")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("services on the nodes")
    for ax in axes[1:]:
        ax.set_yscale("log")
    a.legend(frameon=False)
    fig.tight_layout()
    return fig


def tables_curves(df):
    """`bench pods-tables` (log x): the datapath's time a packet to a service as the services
    grow, a flow's first packet and its next ones, medians with whiskers min..max."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, colour, marker in (("established", "#0072B2", "o"), ("new", "#D55E00", "s")):
        g = df[df["kind"] == kind].groupby("services")["ns_median"]
        med, lo, hi = g.median(), g.min(), g.max()
        label = "its next packets" if kind == "established" else "a flow's first packet"
        ax.errorbar(med.index, med, yerr=[med - lo, hi - med], marker=marker, capsize=3, color=colour, label=label)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("services on the node")
    ax.set_ylabel("ns a packet (the program's run, median)")
    ax.set_title("The datapath, a packet to a service")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def targets(df) -> pd.DataFrame:
    """The issue's targets: one row each, the ratio measured and whether it was met."""
    rows = []
    for line in target_lines(df)[1:]:
        what, _, rest = line.strip().partition(": ")
        rows.append({"target": what, "result": rest})
    return pd.DataFrame(rows)
