"""The port filter's figure: what dropping a frame costs the DUT, per peer,
each in its own colour (lab.palette), from the bench's CSV.

    >>> df, meta = metrics.read_results(csv)      # doctest: +SKIP
    >>> fig = cost_per_frame(df)
"""

import matplotlib.pyplot as plt

from lab import palette


def cost_per_frame(df):
    """Bars: median DUT ns per frame for each peer (and mode), min..max as whiskers."""
    d = df.assign(label=df["peer"] + df["mode"].fillna("").map(lambda m: f":{m}" if m else ""))
    g = d.groupby("label")["dut_ns_per_pkt"]
    labels = palette.in_order(d["label"], "port-filter")
    med, lo, hi = (g.median().reindex(labels), g.min().reindex(labels), g.max().reindex(labels))
    fig, ax = plt.subplots(figsize=(5, 3.2), layout="constrained")
    ax.bar(labels, med, yerr=[med - lo, hi - med], capsize=3, color=[palette.colour(x, "port-filter") for x in labels])
    ax.set_ylabel("DUT ns per frame")
    ax.set_ylim(bottom=0)
    ax.set_title("dropping a frame to a filtered port")
    return fig
