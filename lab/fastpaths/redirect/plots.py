"""Figures and tables for the redirect notebooks (02 and 03), from the CSVs of
`python -m lab bench redirect` and `python -m lab bench xdp-modes`.

    >>> df, meta = metrics.read_results(transfer_csv)            # doctest: +SKIP
    >>> cpu, _ = metrics.read_results(transfer_cpu_csv)          # doctest: +SKIP
    >>> fig = cpu_per_second(cpu, ["nft-dnat", "xdp-forward:native"])   # the report's graphs
    >>> beside_report(cpu)                                        # its table of averages, and ours

Like lab.fastpaths.vtap.plots: no backend is chosen here, every method has one colour in every
figure (its own, lab.palette), and the axes of rates and costs start at zero. A method
is named as on the command line, with its XDP mode: "xdp-forward:native".
"""

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Patch
from matplotlib.ticker import EngFormatter

from lab import palette
from lab.metrics import PAPER_DIR

# every method in its own colour (lab.palette), an XDP method's generic mode the pale shade of its native one
METHOD_ORDER = palette.labels("redirect")
METHOD_COLORS = palette.colours("redirect")
# The report's per-second graphs stack these three of mpstat's columns.
STACK = [("usr", 0.35), ("sys", 0.65), ("soft", 1.0)]
STACK_COLORS = palette.CPU
MODE_COLORS = palette.MODES
PROGRAM_ORDER = ["drop", "tx", "redirect", "forward"]  # lab.fastpaths.redirect.modes_bench.PROGRAMS


def method_color(label: str) -> str:
    return palette.colour(label, "redirect")


def with_labels(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with a `label` column: the method and, for XDP methods, its mode."""
    d = df.copy()
    mode = d["mode"].fillna("").astype(str) if "mode" in d else pd.Series("", index=d.index)
    d["label"] = d["method"] + mode.map(lambda m: f":{m}" if m else "")
    return d


def _labels(d):
    return palette.in_order(d["label"], "redirect")


def report_cpu_per_second() -> pd.DataFrame:
    """The report's mpstat lines, one per second, for netfilter and XDP."""
    path = PAPER_DIR / "redirect_cpu_per_second.csv"
    if not path.exists():  # an installed package has no datasets/
        raise FileNotFoundError(f"{path} not found: the report's figures are in the repository's datasets/paper")
    d = pd.read_csv(path).rename(columns=lambda c: c.removeprefix("cpu_"))
    return d.rename(columns={"second": "t"})


def _per_second(cpu, label, core):
    """Mean over trials of each second's columns (a trial's second n is its n-th
    sample), for one method and one CPU ("all" or a core number)."""
    d = cpu[(cpu["label"] == label) & (cpu["cpu"].astype(str) == str(core))].copy()
    d["second"] = d.groupby("trial").cumcount() + 1
    return d.groupby("second")[[c for c, _ in STACK]].mean()


def _stack(ax, per_sec, title):
    x = per_sec.index.to_numpy()
    ax.stackplot(
        x,
        *[per_sec[c].to_numpy() for c, _ in STACK],
        labels=[f"%{c}" for c, _ in STACK],
        colors=[STACK_COLORS[c] for c, _ in STACK],
        alpha=0.85,
        step=None,
    )
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("second of the transfer")
    ax.set_ylim(0, 100)
    ax.set_xlim(left=1)
    ax.grid(alpha=0.3)


def cpu_per_second(cpu: pd.DataFrame, methods, core="all", report=True):
    """The report's graphs: %usr, %sys and %soft stacked, per second of the
    transfer, one panel per method (mean over trials), first the report's own
    netfilter and XDP panels when `report`. `core` is "all" (mpstat's all-CPU
    line, as in the report) or a core number (the router's core)."""
    cpu = with_labels(cpu)
    panels = []
    if report:
        s = report_cpu_per_second()
        for m, title in (("netfilter", "report: netfilter module"), ("xdp", "report: XDP")):
            panels.append((s[s["method"] == m].set_index("t")[[c for c, _ in STACK]], title))
    where = "all cores" if str(core) == "all" else f"core {core}"
    for m in methods:
        panels.append((_per_second(cpu, m, core), f"lab: {m} ({where})"))
    if not panels:
        raise ValueError("no methods to draw")
    fig, axes = plt.subplots(
        1, len(panels), figsize=(3.4 * len(panels), 3.4), squeeze=False, sharey=True, layout="constrained"
    )
    for ax, (per_sec, title) in zip(axes[0], panels, strict=True):
        _stack(ax, per_sec, title)
    axes[0][0].set_ylabel("% CPU (mpstat)")
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside lower center", ncols=len(STACK), frameon=False)
    return fig


def cpu_averages(cpu: pd.DataFrame, core="all") -> pd.DataFrame:
    """Per method, the mean of each mpstat column over every second of every trial."""
    d = with_labels(cpu)
    d = d[d["cpu"].astype(str) == str(core)]
    cols = [c for c in ("usr", "nice", "sys", "iowait", "irq", "soft", "steal", "guest", "gnice", "idle") if c in d]
    out = d.groupby("label")[cols].mean()
    return out.reindex(_labels(d)).reset_index().rename(columns={"label": "method"})


def beside_report(cpu: pd.DataFrame, dut_core=None) -> pd.DataFrame:
    """The report's table of averages (mpstat's Average line over its 5 transfers)
    above ours: every core, as the report's mpstat printed, and, when `dut_core`
    is given, the router's core alone."""
    report = pd.read_csv(PAPER_DIR / "redirect_cpu_avg.csv")
    rows = [
        {
            "source": "report (all cores)",
            "method": r["method"],
            "usr": r["cpu_usr"],
            "sys": r["cpu_sys"],
            "soft": r["cpu_soft"],
            "irq": r["cpu_irq"],
            "steal": r["cpu_steal"],
            "idle": 100 - sum(r[f"cpu_{c}"] for c in ("usr", "nice", "sys", "iowait", "irq", "soft", "steal")),
        }
        for _, r in report.iterrows()
    ]
    parts = [pd.DataFrame(rows), cpu_averages(cpu, "all").assign(source="lab (all cores)")]
    if dut_core is not None:
        parts.append(cpu_averages(cpu, dut_core).assign(source=f"lab (router core {dut_core})"))
    t = pd.concat(parts, ignore_index=True)
    return t[["source", "method", "usr", "sys", "soft", "irq", "steal", "idle"]]


def _bars(ax, d, value, scale=1.0):
    """One bar per method: median, whiskers from min to max."""
    ms = _labels(d)
    g = d.groupby("label")[value]
    med, lo, hi = (s.reindex(ms) / scale for s in (g.median(), g.min(), g.max()))
    ax.bar(
        range(len(ms)),
        med.values,
        yerr=[(med - lo).values, (hi - med).values],
        capsize=3,
        ecolor="0.25",
        color=[method_color(m) for m in ms],
        hatch=[("//" if m == "route" else None) for m in ms],
    )
    ax.set_xticks(range(len(ms)), ms, rotation=30, ha="right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)  # the caller sets the y range once every panel is drawn


def transfer_costs(df: pd.DataFrame):
    """The file transfers: goodput, the router core's busy ms, and its ns per
    datagram, one bar per method (median, min..max)."""
    d = with_labels(df)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), layout="constrained")
    for ax, (col, ylabel) in zip(
        axes,
        (
            ("goodput_mbps", "goodput (Mbit/s)"),
            ("dut_busy_ms", "router core busy (ms per transfer)"),
            ("dut_ns_per_pkt", "router ns per datagram"),
        ),
        strict=True,
    ):
        _bars(ax, d, col)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
    size = d["bytes"].iloc[0] / 2**20
    fig.suptitle(f"{size:.0f} MiB over UDP, {d['trial'].nunique()} trials per method", fontsize=10)
    return fig


def _offered_label(v):
    return "the generator's ceiling" if not v else f"{v / 1e3:.0f} kpps offered"


def _at_load(df, offered):
    """The rows at one offered load: `offered` (0: the ceiling), or when None
    the ceiling if the runs had one, else their lowest paced rate."""
    loads = df["offered_pps"].fillna(0)
    if offered is None:
        offered = 0 if (loads == 0).any() else loads.min()
    d = df[loads == offered]
    if d.empty:
        raise ValueError(f"no runs at {_offered_label(offered)} (offered: {sorted(set(loads))})")
    return d, offered


def rate_panels(df: pd.DataFrame, value="forwarded_pps", ylabel="forwarded packets/s", offered=None):
    """Rate runs at one offered load (see _at_load): one panel per frame size
    and number of flows, one bar per method (median, min..max)."""
    d, offered = _at_load(with_labels(df), offered)
    keys = sorted({(int(s), int(f)) for s, f in zip(d["size"], d["flows"], strict=True)})
    fig, axes = plt.subplots(
        1, len(keys), figsize=(3.6 * len(keys), 3.9), squeeze=False, sharey=True, layout="constrained"
    )
    for ax, (size, flows) in zip(axes[0], keys, strict=True):
        _bars(ax, d[(d["size"] == size) & (d["flows"] == flows)], value)
        ax.set_title(f"{size} B, {flows} flow{'s' if flows > 1 else ''}", fontsize=10)
        if "pps" in value:
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    axes[0][0].set_ylim(bottom=0)  # shared: once, after every panel's bars and whiskers
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(_offered_label(offered), fontsize=10)
    return fig


def rate_table(df: pd.DataFrame) -> pd.DataFrame:
    """Median forwarded kpps and router ns per packet, a row per method, a column
    per (size, flows, offered load)."""
    d = with_labels(df)
    d["setting"] = [
        f"{int(s)}B {int(f)}f {'max' if not o else f'{o / 1e3:.0f}k'}"
        for s, f, o in zip(d["size"], d["flows"], d["offered_pps"].fillna(0), strict=True)
    ]
    med = d.groupby(["label", "setting"])[["forwarded_pps", "dut_ns_per_pkt"]].median()
    med["forwarded_pps"] /= 1e3
    wide = med.rename(columns={"forwarded_pps": "kpps", "dut_ns_per_pkt": "ns/pkt"}).unstack("setting")
    wide.columns = [f"{setting} {what}" for what, setting in wide.columns]
    wide = wide[sorted(wide.columns, key=lambda c: (c.rsplit(" ", 1)[0], c.endswith("ns/pkt")))]
    return wide.reindex(_labels(d)).rename_axis("method")


def forwarded_and_delivered(df: pd.DataFrame) -> pd.DataFrame:
    """At the generator's ceiling, median kpps per method: forwarded (out of the
    router) and delivered (what the server's side, on the generator's core,
    took in), a column pair per size and number of flows."""
    d = with_labels(df)
    d = d[d["offered_pps"].fillna(0) == 0]
    if "delivered_pps" not in d:  # a CSV from before the two were told apart
        d = d.assign(delivered_pps=d["forwarded_pps"])
    out = d.groupby(["label", "size", "flows"])[["forwarded_pps", "delivered_pps"]].median() / 1e3
    out = out.unstack(["size", "flows"])
    out.columns = [f"{s} B {f}f {what.split('_')[0]}" for what, s, f in out.columns]
    return out[sorted(out.columns)].reindex(_labels(d)).rename_axis("kpps at the ceiling")


def transfer_table(df: pd.DataFrame) -> pd.DataFrame:
    """The file transfers, median per method, and whether every digest matched."""
    d = with_labels(df)
    cols = ["seconds", "goodput_mbps", "datagrams", "translated", "repaired", "dut_busy_ms", "dut_ns_per_pkt"]
    out = d.groupby("label")[cols].median().reindex(_labels(d))
    return out.assign(digests_ok=d.groupby("label")["digest_ok"].all()).rename_axis("method")


def _median(d, label, col, **where):
    for k, v in where.items():
        d = d[d[k].fillna(0) == v]
    v = d[d["label"] == label][col]
    return v.median() if len(v) else float("nan")


def targets(rate: pd.DataFrame = None, transfer: pd.DataFrame = None, modes: pd.DataFrame = None) -> pd.DataFrame:
    """Issue 9's targets, each as measured (medians over trials): one row per
    target with the ratio, the bound and whether it was met."""
    rows = []

    def add(target, value, bound, sense):
        met = (value <= bound) if sense == "<=" else (value >= bound)
        rows.append(
            {
                "target": target,
                "measured": round(value, 3),
                "bound": f"{sense} {bound}",
                "met": bool(met) if value == value else None,
            }
        )

    if rate is not None:
        r = with_labels(rate)
        at = {"size": 64, "flows": 1, "offered_pps": 0}
        ns = {m: _median(r, m, "dut_ns_per_pkt", **at) for m in ("nft-dnat", "xdp-forward:native", "xdp-pass:native")}
        pps = {m: _median(r, m, "forwarded_pps", **at) for m in ("nft-dnat", "xdp-forward:native")}
        add("xdp-forward native ns/pkt ÷ nft-dnat (64 B, 1 flow)", ns["xdp-forward:native"] / ns["nft-dnat"], 0.5, "<=")
        add("xdp-forward native pps ÷ nft-dnat (64 B, 1 flow)", pps["xdp-forward:native"] / pps["nft-dnat"], 2, ">=")
        add("xdp-pass native ns/pkt ÷ nft-dnat (64 B, 1 flow)", ns["xdp-pass:native"] / ns["nft-dnat"], 0.9, "<=")
    if transfer is not None:
        t = with_labels(transfer)
        add(
            f"{t['bytes'].iloc[0] / 2**20:.0f} MiB transfer: xdp-forward native busy ÷ nft-dnat",
            _median(t, "xdp-forward:native", "dut_busy_ms") / _median(t, "nft-dnat", "dut_busy_ms"),
            0.6,
            "<=",
        )
    if modes is not None:
        m = modes[(modes["status"] == "ok") & (modes["program"] == "drop") & (modes["offered_pps"].fillna(0) == 0)]
        g = m.groupby("mode")["handled_pps"].median()
        add(
            "XDP_DROP pps native ÷ generic (ceiling)",
            g.get("native", float("nan")) / g.get("generic", float("nan")),
            1.5,
            ">=",
        )
    return pd.DataFrame(rows)


# ---- the Cilium/SmartNIC benchmark note: XDP modes ----------------------------


def _programs(d):
    present = set(d["program"])
    return [p for p in PROGRAM_ORDER if p in present] + sorted(present - set(PROGRAM_ORDER))


def modes_bars(df: pd.DataFrame, offered=None):
    """Figure 1 of the Cilium/SmartNIC benchmark note on this machine: at one
    offered load (see _at_load), per program the router core's busy % and its
    ns per handled packet, a bar per mode (median, min..max). Offload, where
    the kernel refused it, is a grey outline marked 'unavailable'."""
    d, offered = _at_load(df, offered)
    d = d.copy()
    d["cpu_busy"] = 100 - d["cpu_idle"]
    programs = _programs(d)
    modes = [m for m in ("native", "generic", "offload") if m in set(d["mode"])]
    width = 0.8 / len(modes)
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9), layout="constrained")
    for ax, (col, ylabel) in zip(
        axes,
        (
            ("cpu_busy", "router core busy (%)"),
            ("dut_ns_per_pkt", "router ns per handled packet"),
            ("handled_pps", "handled packets/s"),
        ),
        strict=True,
    ):
        for i, mode in enumerate(modes):
            x = [p + (i - (len(modes) - 1) / 2) * width for p in range(len(programs))]
            sub = d[d["mode"] == mode]
            if (sub["status"] != "ok").all():
                ax.bar(x, [0] * len(x), width, color="none", edgecolor=MODE_COLORS[mode], label=mode)
                for xi in x:
                    ax.text(xi, 0, " unavailable", rotation=90, va="bottom", ha="center", fontsize=7, color="0.35")
                continue
            g = sub.groupby("program")[col]
            med, lo, hi = (s.reindex(programs) for s in (g.median(), g.min(), g.max()))
            ax.bar(
                x,
                med.values,
                width,
                yerr=[(med - lo).values, (hi - med).values],
                capsize=2,
                ecolor="0.25",
                color=MODE_COLORS[mode],
                label=mode,
            )
        ax.set_xticks(range(len(programs)), programs)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
        if "pps" in col:
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    fig.suptitle(_offered_label(offered), fontsize=10)
    keys = [Patch(facecolor=MODE_COLORS[m] if m != "offload" else "none", edgecolor=MODE_COLORS[m]) for m in modes]
    fig.legend(keys, modes, loc="outside lower center", ncols=len(modes), frameon=False)
    return fig


def modes_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per program: generic ÷ native in router ns per packet at the equal offered
    load, and native ÷ generic in packets/s at the ceiling; the note's published
    ratios (offload against native and generic) beside them."""
    ok = df[df["status"] == "ok"]
    paced = sorted(v for v in ok["offered_pps"].fillna(0).unique() if v)
    rows = []
    for p in _programs(ok):
        d = ok[ok["program"] == p]
        r = {"program": p}
        if paced:
            e = d[d["offered_pps"] == paced[0]].groupby("mode")["dut_ns_per_pkt"].median()
            if {"native", "generic"} <= set(e.index):
                r[f"generic ÷ native ns/pkt at {paced[0] / 1e3:.0f} kpps"] = e["generic"] / e["native"]
        c = d[d["offered_pps"].fillna(0) == 0].groupby("mode")["handled_pps"].median()
        if {"native", "generic"} <= set(c.index):
            r["native ÷ generic pps at the ceiling"] = c["native"] / c["generic"]
        rows.append(r)
    return pd.DataFrame(rows)


def note_modes() -> pd.DataFrame:
    """The Cilium/SmartNIC benchmark note's ratios, and what this machine said
    when offload was tried."""
    return pd.read_csv(PAPER_DIR / "xdp_modes_cpu.csv")


def offload_reasons(df: pd.DataFrame) -> pd.DataFrame:
    off = df[df["mode"] == "offload"]
    return off[["program", "status", "reason"]].drop_duplicates("program").reset_index(drop=True)
