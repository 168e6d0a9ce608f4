"""Shared by the benchmarks: their common options, flow mixes, interleaved trial
order, progress, summaries."""

import os
import sys
import time

import pandas as pd

from ..console import renamed
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


def add_options(p, trials, duration=None, peers=None, old_peers=None, cpus=None):
    """The options every bench spells the same, declared once, with the bench's
    defaults:
      --peers     which of `peers` (names, in order) to compare; all by default
      --trials    how many times each setting runs, the runs interleaved (see interleaved())
      --duration  seconds of load per run
      --cpus      two CPUs, `cpus` saying what for ("generator,DUT")
      --out       where the CSV and its sidecar go
    `old_peers`: the bench's former spelling of --peers, taken for one release."""
    if peers is not None:
        p.add_argument(
            "--peers",
            default=",".join(peers),
            metavar="NAME[,NAME...]",
            help=f"what to compare: any of {','.join(peers)} (default: all)",
        )
        if old_peers:
            renamed(p, old_peers, "--peers")
    p.add_argument("--trials", type=int, default=trials, help="trials per setting, interleaved (default %(default)s)")
    if duration is not None:
        p.add_argument("--duration", type=float, default=duration, help="seconds of load per run (default %(default)s)")
    if cpus:
        p.add_argument("--cpus", default="0,1", help=f"two CPUs: {cpus} (default %(default)s)")
    p.add_argument("--out", metavar="DIR", help="directory for the CSV and its sidecar (default datasets/results)")


def checked_options(a, peers=None, what="peer", duration=(0.5, 60.0), cpus=None):
    """add_options' values, checked (a ValueError says what is wrong, in one
    line): the peers chosen (a list) and the two CPUs (a tuple)."""
    if not 1 <= a.trials <= 100:
        raise ValueError(f"--trials must be 1..100, not {a.trials}")
    if getattr(a, "duration", None) is not None and not duration[0] <= a.duration <= duration[1]:
        raise ValueError(f"--duration must be in {duration[0]:g}..{duration[1]:g} s, not {a.duration:g}")
    chosen = parse_list(a.peers, str, peers, what) if peers is not None else None
    pair = None
    if cpus:
        pair = tuple(parse_list(a.cpus, int, what="cpu"))
        if len(pair) != 2 or pair[0] == pair[1]:
            raise ValueError(f"--cpus takes two different CPUs: {cpus}")
        if max(pair) >= (os.cpu_count() or 1) or min(pair) < 0:
            raise ValueError(f"--cpus {a.cpus}: this machine has CPUs 0..{(os.cpu_count() or 1) - 1}")
    return chosen, pair


def udp_frames(src, dst, src_mac, dst_mac, size, flows=4, base_sport=40000, dport=5001):
    """One frame per flow: UDP from src to dst, source ports base_sport.., each
    `size` bytes long with FCS (so size - 4 on the wire as the kernel counts)."""
    if not 64 <= size <= 1518:
        raise ValueError(f"frame size {size} is outside 64..1518")
    marker = Marker()
    out = []
    for i in range(flows):
        out += flow_frames(
            Flow(f"f{i}", src, dst, "udp", sport=base_sport + i, dport=dport, count=1, size=size - FCS),
            marker,
            src_mac,
            dst_mac,
        )
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


def span(row, col, scale=1.0, fmt="{:.0f}") -> str:
    """One of summarize()'s values as a report shows it: "median [min..max]", each divided by scale."""
    return "{} [{}..{}]".format(*(fmt.format(row[f"{col}_{stat}"] / scale) for stat in ("median", "min", "max")))


def run_times(times) -> dict:
    """A row's per-packet times (ns, one a run): median, mean and p99."""
    t = sorted(times)
    return {"ns_median": t[len(t) // 2], "ns_mean": round(sum(t) / len(t), 1), "ns_p99": t[int(len(t) * 0.99)]}
