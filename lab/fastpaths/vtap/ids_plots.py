"""Figures and tables for the IDS notebook (05), from the CSVs of `python -m lab
bench ids` (one row per run, and its -signatures.csv), beside the paper's Table 3.

    >>> df, meta = metrics.read_results(csv)                       # doctest: +SKIP
    >>> table3(df)                      # the paper's Table 3, our medians
    >>> fig = alerts_vs_rate(df)        # Figure 7: alerts per rate, receiver and monitor, and the truth
    >>> fig = behind_cutoff(df, sigs)   # the monitor behind each cutoff: alerts within it, drops, Mbps

Like lab.fastpaths.vtap.plots: no backend is chosen here; the receiver and the monitor have one
colour each in every figure; counts and rates start at zero.
"""

import matplotlib.pyplot as plt
import pandas as pd

from lab import palette
from lab.metrics import PAPER_DIR

SIDES = ["receiver", "monitor"]
SIDE_COLORS = palette.IDS_SIDES
TRUTH_COLOR = palette.TRUTH
# where both sides raise the same (every run without drops) the monitor's
# smaller square sits inside the receiver's circle, and both stay visible
SIDE_MARKERS = {"receiver": {"marker": "o", "markersize": 8}, "monitor": {"marker": "s", "markersize": 4}}


def paper_table3() -> pd.DataFrame:
    """The paper's Table 3 (Testbed 3, Suricata 4 on 1-vCPU VMs, pytbull traffic)."""
    return pd.read_csv(PAPER_DIR / "vtap_table3.csv")


def quota_label(q) -> str:
    return "no quota" if pd.isna(q) else f"{int(q)} % quota"


def _numeric(df):
    d = df[df["rate_mbps"].notna()].copy()
    d["quota"] = d["cpu_quota_pct"].map(quota_label)
    return d


def quotas(df):
    """Quota labels, quota runs first (lowest first), then the unlimited ones."""
    q = sorted(df["cpu_quota_pct"].dropna().unique())
    return [quota_label(x) for x in q] + (["no quota"] if df["cpu_quota_pct"].isna().any() else [])


def table3(df: pd.DataFrame) -> pd.DataFrame:
    """Our Table 3: per quota and rate, the median over trials of each side's
    alerts and drop rate (percent), with the expected alerts and the trials."""
    d = _numeric(df)
    g = d.groupby(["quota", "rate_mbps"], sort=False)
    out = pd.DataFrame(
        {
            "receiver_alerts": g["receiver_alerts"].median(),
            "receiver_drop_pct": 100 * g["receiver_drop_rate"].median(),
            "monitor_alerts": g["monitor_alerts"].median(),
            "monitor_drop_pct": 100 * g["monitor_drop_rate"].median(),
            "expected_alerts": g["expected_alerts"].median(),
            "achieved_mbps": g["achieved_mbps"].median(),
            "trials": g.size(),
        }
    ).reset_index()
    order = {q: i for i, q in enumerate(quotas(df))}
    return out.sort_values(
        ["quota", "rate_mbps"], key=lambda s: s.map(order) if s.name == "quota" else s, ignore_index=True
    )


def beside_paper(df: pd.DataFrame, quota=None) -> pd.DataFrame:
    """The paper's Table 3 and ours (one quota) side by side, per rate; alerts
    as a share of what each run should raise, since the two mixes differ in size."""
    ours = table3(df)
    q = quota if quota is not None else quotas(df)[0]
    ours = ours[ours["quota"] == q].set_index("rate_mbps")
    paper = paper_table3().set_index("rate_mbps")
    out = pd.DataFrame(index=sorted(set(paper.index) | set(ours.index)))
    out.index.name = "rate_mbps"
    for side in SIDES:
        out[f"paper_{side}_alerts"] = paper[f"{side}_alerts"]
        out[f"paper_{side}_drop_pct"] = paper[f"{side}_drop_rate_pct"]
    for side in SIDES:
        out[f"ours_{side}_alerts_pct_of_truth"] = 100 * ours[f"{side}_alerts"] / ours["expected_alerts"]
        out[f"ours_{side}_drop_pct"] = ours[f"{side}_drop_pct"]
    return out.round(2)


def _side_lines(ax, d, value, scale=1.0):
    for side in SIDES:
        g = d.groupby("rate_mbps")[f"{side}_{value}"]
        med, lo, hi = g.median() * scale, g.min() * scale, g.max() * scale
        ax.errorbar(
            med.index,
            med,
            yerr=[med - lo, hi - med],
            color=SIDE_COLORS[side],
            capsize=3,
            label=f"{side} IDS",
            **SIDE_MARKERS[side],
        )


def _paper_panel(ax, column, title):
    """The paper's Table 3 column `column` per side, as a line per side."""
    s = paper_table3()
    for side in SIDES:
        ax.plot(
            s["rate_mbps"], s[f"{side}_{column}"], color=SIDE_COLORS[side], label=f"{side} IDS", **SIDE_MARKERS[side]
        )
    ax.set_title(title)
    return ax


def alerts_vs_rate(df: pd.DataFrame, paper=True):
    """Figure 7's analogue: alerts per replay rate at the receiver and the
    monitor (median, whiskers min..max), the expected alerts as a line; one panel
    per quota, and the paper's figure from its Table 3 first."""
    d = _numeric(df)
    panels = quotas(df)
    n = len(panels) + (1 if paper else 0)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
    axes = list(axes[0])
    if paper:
        ax = _paper_panel(axes.pop(0), "alerts", "paper (Suricata 4, 1-vCPU VMs)")
        ax.set_ylabel("alerts")
    for ax, q in zip(axes, panels, strict=True):
        dq = d[d["quota"] == q]
        _side_lines(ax, dq, "alerts")
        truth = dq.groupby("rate_mbps")["expected_alerts"].median()
        ax.plot(truth.index, truth, color=TRUTH_COLOR, linestyle="--", label="expected (truth)")
        ax.set_title(f"this lab, {q}")
    for ax in fig.axes:
        ax.set_xlabel("replay rate (Mbps)")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
    fig.axes[0].legend(loc="lower left", fontsize="small")
    if len(fig.axes) > 1:
        fig.axes[-1].legend(loc="lower left", fontsize="small")
    fig.tight_layout()
    return fig


def drop_rates(df: pd.DataFrame, paper=True):
    """Drop rate (kernel drops / packets offered to Suricata) per rate and side."""
    d = _numeric(df)
    panels = quotas(df)
    n = len(panels) + (1 if paper else 0)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.4), squeeze=False, sharey=True)
    axes = list(axes[0])
    if paper:
        _paper_panel(axes.pop(0), "drop_rate_pct", "paper")
    for ax, q in zip(axes, panels, strict=True):
        _side_lines(ax, d[d["quota"] == q], "drop_rate", scale=100)
        ax.set_title(f"this lab, {q}")
    for ax in fig.axes:
        ax.set_xlabel("replay rate (Mbps)")
        ax.set_ylim(0, 100)
        ax.set_xlim(left=0)
    fig.axes[0].set_ylabel("drop rate (%)")
    fig.axes[-1].legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    return fig


def signature_recall(sigs: pd.DataFrame, quota="first") -> pd.DataFrame:
    """Per signature and rate: alerts raised as a share of those expected, for
    each side (median over trials), under one quota: which attacks an IDS that
    drops packets stops seeing first."""
    d = sigs[sigs["rate_mbps"].notna() & sigs["expected"].fillna(0).gt(0)].copy()
    d["quota"] = d["cpu_quota_pct"].map(quota_label)
    if quota == "first":
        present = d["cpu_quota_pct"].dropna()
        quota = quota_label(present.min()) if len(present) else "no quota"
    d = d[d["quota"] == quota]
    d["recall_pct"] = 100 * d["alerts"] / d["expected"]
    t = d.groupby(["sid", "msg", "ids", "rate_mbps"])["recall_pct"].median().unstack(["ids", "rate_mbps"])
    return t.sort_index(axis=1).round(1)


def exactness(df: pd.DataFrame, sigs: pd.DataFrame) -> pd.DataFrame:
    """Per rate, quota and side: runs, runs with 0 drops, and runs whose alerts
    equal the expected ones for every signature."""
    rows = []
    for (rate, q), g in df.groupby(["rate", df["cpu_quota_pct"].map(quota_label)], sort=False):
        for side in SIDES:
            rows.append(
                {
                    "rate": rate,
                    "quota": q,
                    "ids": side,
                    "runs": len(g),
                    "runs_without_drops": int((g[f"{side}_drops"] == 0).sum()),
                    "runs_exact_per_signature": int(g[f"{side}_correct"].fillna(False).astype(bool).sum()),
                }
            )
    return pd.DataFrame(rows)


def targets(df: pd.DataFrame, low: pd.DataFrame = None) -> pd.DataFrame:
    """The issue's targets, met or missed on these runs: exactness at 1 Mbps (from
    `low`, a run at 1 Mbps), and monitor against receiver at every rate under a quota."""
    rows = []
    if low is not None:
        for side in SIDES:
            ok = bool((low[f"{side}_drops"] == 0).all() and low[f"{side}_correct"].astype(bool).all())
            rows.append(
                {
                    "target": f"1 Mbps: {side} raises exactly the truth per signature, 0 drops",
                    "value": f"{int(low[f'{side}_correct'].astype(bool).sum())}/{len(low)} runs exact, "
                    f"{int(low[f'{side}_drops'].sum())} drops",
                    "met": ok,
                }
            )
    t = table3(df)
    for q in [x for x in quotas(df) if x != "no quota"]:
        tq = t[t["quota"] == q]
        drop_ok = (tq["monitor_drop_pct"] < tq["receiver_drop_pct"]) | (
            (tq["monitor_drop_pct"] == 0) & (tq["receiver_drop_pct"] == 0)
        )
        alerts_ok = tq["monitor_alerts"] >= tq["receiver_alerts"]
        rows.append(
            {
                "target": f"{q}: monitor's drop rate below the receiver's at every rate (median)",
                "value": f"{int(drop_ok.sum())}/{len(tq)} rates",
                "met": bool(drop_ok.all()),
            }
        )
        rows.append(
            {
                "target": f"{q}: monitor's alerts at least the receiver's at every rate (median)",
                "value": f"{int(alerts_ok.sum())}/{len(tq)} rates",
                "met": bool(alerts_ok.all()),
            }
        )
    return pd.DataFrame(rows)


# --- behind a per-flow cutoff (`bench ids --cutoff ... --elephants ...`) ---------------


def cutoff_label(n) -> str:
    n = int(n)
    if not n:
        return "no cutoff"
    return f"{n >> 20} MiB" if not n % (1 << 20) else f"{n >> 10} KiB" if not n % 1024 else f"{n} B"


def _cutoffs(df):
    """The cutoffs present: none first, then the largest to the smallest."""
    present = sorted(int(c) for c in df["cutoff"].unique())
    return [0] * (0 in present) + sorted((c for c in present if c), reverse=True)


def _with_starts(d):
    """elephant_starts of a CSV from before they could be staggered: together."""
    if "elephant_starts" not in d:
        return d.assign(elephant_starts="together")
    return d.assign(elephant_starts=d["elephant_starts"].fillna("together"))


def _key(v) -> str:
    return "none" if pd.isna(v) else str(v)


def cutoff_runs(df: pd.DataFrame, sigs: pd.DataFrame) -> pd.DataFrame:
    """One row per monitor run: its cutoff, rate and trial, the alerts it raised of the
    signatures within the cutoff against those expected (`within_alerts`, `within_expected`),
    the alerts of the signatures beyond it (`beyond_alerts`: those the cutoff keeps from it,
    expected 0; `beyond_truth`: what the uncut receiver's truth holds of them), its drop
    rate and the Mbps that reached it."""
    m = sigs[sigs["ids"] == "monitor"].copy()
    m["beyond_cutoff"] = m["beyond_cutoff"].astype(bool)
    keys = ["cutoff", "rate", "trial", "cpu_quota_pct", "monitor_at", "elephant_starts"]
    m, df = _with_starts(m), _with_starts(df)
    for k in keys:  # no quota is NaN, which groupby and join would drop: a key of its own
        m[k] = m[k].map(_key)
    inside, outside = m[~m["beyond_cutoff"]], m[m["beyond_cutoff"]]
    w = inside.groupby(keys)[["alerts", "expected"]].sum()
    w.columns = ["within_alerts", "within_expected"]
    b = outside.groupby(keys)["alerts"].sum().rename("beyond_alerts")
    d = df.copy()
    for k in keys:
        d[k] = d[k].map(_key)
    d = d.join(w, on=keys).join(b, on=keys)
    d["beyond_alerts"] = d["beyond_alerts"].fillna(0)
    d["within_pct"] = 100 * d["within_alerts"] / d["within_expected"]
    d["cutoff"] = d["cutoff"].astype(int)
    d["elephant_starts"] = d["elephant_starts"].astype(str)
    return d


def cutoff_table(df: pd.DataFrame, sigs: pd.DataFrame) -> pd.DataFrame:
    """Per cutoff and rate, medians over trials: the monitor's alerts within the cutoff as a
    share of those expected, its drops (%), Mbps at the monitor and the byte saving against
    the uncut run, and the tap's ns per packet."""
    d = cutoff_runs(df, sigs)
    # what varies besides the rate and the cutoff is a level of its own, never pooled
    by = ["rate_mbps", *(k for k in ("cpu_quota_pct", "monitor_at", "elephant_starts") if d[k].nunique() > 1), "cutoff"]
    g = d.groupby(by)
    out = pd.DataFrame(
        {
            "within_pct": g["within_pct"].median(),
            "within_expected": g["within_expected"].median(),
            "monitor_drop_pct": 100 * g["monitor_drop_rate"].median(),
            "monitor_mbps": g["monitor_mbps"].median(),
            "tap_ns_per_run": g["tap_ns_per_run"].median(),
            "trials": g.size(),
        }
    )
    uncut = out.xs(0, level="cutoff")["monitor_mbps"] if 0 in d["cutoff"].values else None
    if uncut is not None:  # against the uncut run of the same rate (quota, place, starts)
        same = [key[:-1] if len(key) > 2 else key[0] for key in out.index]
        out["bytes_saved_pct"] = [
            100 * (1 - mbps / uncut[k]) if k in uncut else float("nan")
            for k, mbps in zip(same, out["monitor_mbps"], strict=True)
        ]
    out = out.rename(index=cutoff_label, level="cutoff")
    return out.round(2)


def behind_cutoff(df: pd.DataFrame, sigs: pd.DataFrame):
    """Three panels per rate, a line per cutoff (dashed where the elephants' starts were
    staggered; median, whiskers min to max): the monitor's
    alerts within its cutoff as a share of those expected; its drop rate; the Mbps that
    reached it."""
    d = cutoff_runs(df, sigs)
    d = d[d["rate_mbps"].notna()]
    # one quota and place per figure (the lowest quota's, the local monitor's): never pooled
    first = d.sort_values(["cpu_quota_pct", "monitor_at"]).iloc[0] if len(d) else None
    several = len(d[["cpu_quota_pct", "monitor_at"]].drop_duplicates()) > 1
    if several:
        d = d[(d["cpu_quota_pct"] == first["cpu_quota_pct"]) & (d["monitor_at"] == first["monitor_at"])]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    panels = [
        ("within_pct", 1.0, "alerts within the cutoff (% of expected)"),
        ("monitor_drop_rate", 100.0, "monitor IDS drop rate (%)"),
        ("monitor_mbps", 1.0, "Mbps at the monitor"),
    ]
    starts = sorted(d["elephant_starts"].unique(), key=lambda m: m != "together")
    for (i, c), m in ((ic, m) for ic in enumerate(_cutoffs(d)) for m in starts):
        sub = d[(d["cutoff"] == c) & (d["elephant_starts"] == m)]
        label = cutoff_label(c) + (f", {m}" if len(starts) > 1 else "")
        for ax, (col, scale, _) in zip(axes, panels, strict=True):
            g = sub.groupby("rate_mbps")[col]
            med, lo, hi = g.median() * scale, g.min() * scale, g.max() * scale
            ax.errorbar(
                med.index,
                med,
                yerr=[med - lo, hi - med],
                color=palette.CUTOFFS[i % len(palette.CUTOFFS)],
                marker="o" if m == "together" else "s",
                linestyle="-" if m == "together" else "--",
                capsize=3,
                label=label,
            )
    for ax, (_, _, title) in zip(axes, panels, strict=True):
        ax.set_xlabel("replay rate (Mbps)")
        ax.set_ylabel(title)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    axes[0].set_ylim(0, 105)
    axes[1].set_ylim(0, 100)
    axes[0].legend(loc="lower left", fontsize="small")
    if several:
        q = first["cpu_quota_pct"]
        fig.suptitle(f"quota {q if q == 'none' else q + ' %'}, monitor {first['monitor_at']}", fontsize="medium")
    fig.tight_layout()
    return fig
