"""Shared by the benchmarks: flow mixes, interleaved trial order, progress, summaries."""

import sys
import time

import pandas as pd

from ..traffic import Flow, Marker, flow_frames

SIZES = [64, 128, 256, 512, 1024, 1280, 1518]
FCS = 4  # sizes are Ethernet frame sizes with FCS, as in RFC 2544 and the paper; the kernel counts without


def parse_list(text, conv=str, allowed=None, what="value"):
    items = [conv(x.strip()) for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"empty {what} list")
    if allowed is not None:
        bad = [x for x in items if x not in allowed]
        if bad:
            raise ValueError(f"unknown {what} {bad[0]!r} (choose from {', '.join(map(str, allowed))})")
    return items


def udp_frames(src, dst, src_mac, dst_mac, size, flows=4, base_sport=40000, dport=5001):
    """One frame per flow: UDP from src to dst, source ports base_sport.., each
    `size` bytes long with FCS (so size - 4 on the wire as the kernel counts)."""
    if not 64 <= size <= 1518:
        raise ValueError(f"frame size {size} is outside 64..1518")
    marker = Marker()
    out = []
    for i in range(flows):
        out += flow_frames(Flow(f"f{i}", src, dst, "udp", sport=base_sport + i, dport=dport, count=1,
                                size=size - FCS), marker, src_mac, dst_mac)
    return out


def close_all(*groups):
    """Close the generators and peers of a bench run (dicts of them), in order."""
    for group in groups:
        for obj in group.values():
            obj.close()


def columns_first(rows, columns) -> pd.DataFrame:
    """The rows as a table whose documented columns come first, in their order
    (present even where no row has them), then any others."""
    df = pd.DataFrame(rows)
    return df.reindex(columns=columns + [c for c in df.columns if c not in columns])


def interleaved(trials, sizes, variants):
    """(trial, size, variant) in the order runs happen: every variant once per
    size within a trial, starting with a different variant each trial, so that
    slow drift of the machine (steal time) spreads evenly over the variants."""
    if not variants:
        return
    for t in range(trials):
        for s in sizes:
            k = t % len(variants)
            for v in variants[k:] + variants[:k]:
                yield t, s, v


class Progress:
    """A one-line progress bar on stderr with an estimate of the time left."""

    def __init__(self, total, stream=sys.stderr, width=28):
        self.total, self.stream, self.width = total, stream, width
        self.done = 0
        self.start = time.monotonic()

    def step(self, label):
        self.done += 1
        frac = self.done / self.total
        el = time.monotonic() - self.start
        eta = el / self.done * (self.total - self.done)
        bar = "#" * int(frac * self.width) + "." * (self.width - int(frac * self.width))
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {label:<36.36} eta {eta:4.0f}s")
        if self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def summarize(df: pd.DataFrame, keys, values) -> pd.DataFrame:
    """Median over trials with min and max, one row per combination of keys."""
    g = df.groupby(keys, sort=True)[values]
    out = pd.concat({"median": g.median(), "min": g.min(), "max": g.max()}, axis=1)
    out.columns = [f"{v}_{stat}" for stat, v in out.columns]
    return out.reset_index()
