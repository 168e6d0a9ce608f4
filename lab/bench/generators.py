"""python -m lab bench generators: how fast each packet source pushes frames of
each size into a veth whose peer drops them with XDP (so the sink never limits
it). Interleaved trials; the sink's count is the rate."""

import argparse
import sys
import time

import pandas as pd

from ebpf.instruments.xdp_sink import XdpSink

from ..metrics import write_results
from ..topology import Topology
from ..traffic import GENERATORS
from .common import FCS, Progress, add_options, checked_options, interleaved, parse_list, summarize, udp_frames

NAME = "generators"
SUMMARY = "our XDP generator against trafgen, per frame size"
DESCRIPTION = """\
How fast each packet source pushes frames of each size into a veth whose peer
drops them with XDP, so that the sink never limits it; the sink's count is the
rate. Runs of the generators interleave. Writes one CSV row per run and a JSON
sidecar, and prints a table of medians."""
EXAMPLES = """\
examples:
  python -m lab bench generators            # both generators at 64, 512 and 1518 B: 18 runs of 3 s
  python -m lab bench generators --trials 3 --duration 2 --out datasets/reference
                                            # the README's reference run
  python -m lab bench generators --peers xdp --sizes 64 --trials 1 --duration 1
                                            # a smoke test: 1 run of 1 s
"""


def add_arguments(p):
    # Defaults are shown with %(default)s, so the text cannot drift from the value.
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("--sizes", default="64,512,1518", help="frame sizes in bytes with FCS (default %(default)s)")
    add_options(p, trials=3, duration=3.0, peers=list(GENERATORS), old_peers="--generators")


def main(a):
    sizes = parse_list(a.sizes, int, what="size")
    gens, _ = checked_options(a, list(GENERATORS), "generator")
    df, path = run(sizes, gens, a.trials, a.duration, a.out)
    print_summary(df)
    print(f"\nwrote {path} and {path.with_suffix('.json').name}")
    return 0


def run(sizes, gens, trials, duration, out=None, cpu=0, progress=True):
    t = Topology("genbench")
    t.add_host("tx")
    t.add_host("rx")
    t.add_link("tx", "rx")
    rows = []
    bar = Progress(trials * len(sizes) * len(gens)) if progress else None
    sources = {}  # (generator, size) -> an open generator: compiled and set up once
    with t, XdpSink("drop") as sink:
        sink.attach("eth0", netns=t.ns("rx"))
        try:
            for trial, size, name in interleaved(trials, sizes, gens):
                if (name, size) not in sources:
                    frames = udp_frames(
                        t.addr("tx", "eth0"), t.addr("rx", "eth0"), t.mac("tx", "eth0"), t.mac("rx", "eth0"), size
                    )
                    sources[name, size] = GENERATORS[name](t.ns("tx"), "eth0", frames, cpu=cpu).open()
                sink.reset_counters()
                rep = sources[name, size].send(seconds=duration)
                time.sleep(0.1)  # let the veth ring drain into the sink
                got = sink.counters()["packets"]
                rows.append(
                    {
                        "generator": name,
                        "size": size,
                        "trial": trial,
                        "duration_s": rep.seconds,
                        "sent_packets": rep.packets,
                        "received_packets": got,
                        "sent_pps": rep.pps,
                        "received_pps": got / rep.seconds,
                        "received_mbps": got * size * 8 / rep.seconds / 1e6,
                    }
                )
                if bar:
                    bar.step(f"{name} {size}B trial {trial}")
        finally:
            for g in sources.values():
                g.close()
    df = pd.DataFrame(rows)
    path = write_results(
        df,
        "generators",
        {"sizes": sizes, "generators": gens, "trials": trials, "duration_s": duration, "cpu": cpu, "fcs_bytes": FCS},
        out,
    )
    return df, path


def print_summary(df, stream=sys.stdout):
    s = summarize(df, ["size", "generator"], ["received_pps"])
    stream.write("\nreceived kpps, median [min..max]\n")
    for _, r in s.iterrows():
        stream.write(
            f"{r['size']:>5} {r['generator']:<8} {r['received_pps_median'] / 1e3:9.0f} "
            f"[{r['received_pps_min'] / 1e3:.0f}..{r['received_pps_max'] / 1e3:.0f}]\n"
        )
