"""python -m lab bench port-filter: what dropping a frame to a filtered port
costs the device under test (DUT): the XDP port filter against an nftables
drop rule and against no filter at all.

A sender namespace offers UDP frames to a filtered port of the DUT at a fixed
rate for --duration seconds; the peer drops them at the DUT's receiving
interface. The DUT's receive work runs in a NAPI thread of its own (the
kernel's polled receive path, here threaded and pinned to the DUT's CPU, with
GRO on so that a veth without an XDP program has one), so its CPU time per
frame is the cost compared. Runs of different peers interleave. One CSV row
per run.
"""

import argparse
import sys
import time

import pandas as pd

from lab import metrics, netns
from lab.bench import common
from lab.console import renamed
from lab.metrics import CPU_COLUMNS, CpuSampler, write_results
from lab.rig import Rig
from lab.topology import Topology
from lab.traffic import GENERATORS

from .peers import PEERS

NAME = "port-filter"
SUMMARY = "the XDP port filter against an nftables drop rule: DUT ns per dropped frame"
DESCRIPTION = __doc__.split("\n\n", 1)[1]
EXAMPLES = """\
examples:
  python -m lab bench port-filter                      # every peer at 64 B, 100 kpps, 3 trials of 2 s
  python -m lab bench port-filter --peers xdp,nft --sizes 64,1518 --trials 5
  python -m lab bench port-filter --peers none,xdp --trials 1 --duration 0.5 --rate 20000
                                                       # a smoke test: 2 runs of half a second
"""
PORT = 9  # the filtered port (discard)
COLUMNS = [
    "peer",
    "mode",
    "size",
    "trial",
    "offered_pps",
    "duration_s",
    "sent_packets",
    "sender_dropped",
    "dropped",
    "dut_ns_per_pkt",
    "cpu_usr",
    "cpu_sys",
    "cpu_soft",
    "cpu_idle",
]


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    common.add_options(p, trials=3, duration=2.0, peers=list(PEERS), cpus="generator,DUT")
    p.add_argument("--xdp-modes", default="native", help="XDP modes the xdp peer runs in (default %(default)s)")
    renamed(p, "--modes", "--xdp-modes")
    p.add_argument("--sizes", default="64", help="frame sizes in bytes with FCS (default %(default)s)")
    p.add_argument("--rate", type=int, default=100_000, metavar="PPS", help="offered frames/s (default %(default)s)")


def main(args):
    peers, cpus = common.checked_options(args, list(PEERS), "peer", cpus="generator,DUT")
    modes = common.parse_list(args.xdp_modes, str, ["native", "generic"], "mode")
    sizes = common.parse_list(args.sizes, int, what="size")
    if not 1000 <= args.rate <= 1_000_000:
        raise ValueError(f"--rate must be 1000..1000000 frames/s, not {args.rate}")
    df, path = run(peers, modes, sizes, args.trials, args.duration, args.rate, cpus, args.out)
    print_summary(df)
    print(f"\nwrote {path} and {path.with_suffix('.json').name}")
    return 0


def variants(peers, modes):
    """(name, mode) of each peer in each XDP mode asked for that it runs in."""
    return [(n, m) for n in peers for m in PEERS[n].modes if m is None or m in modes]


class PairRig(Rig):
    """A sender and the DUT on one veth pair (lab.rig.Rig). The DUT's veth gets
    NAPI whatever the peer (GRO gives it one), in a thread pinned to the DUT's
    CPU; the sender's TSO is off, so that its frames reach that NAPI and not
    the sender's backlog; frames no peer drops end in a socket that never reads."""

    def __init__(self, gen_cpu=0, dut_cpu=1):
        t = Topology("pfbench")
        t.add_host("src")
        t.add_host("dut")
        t.add_link("src", "dut")
        super().__init__(t, gen_cpu, dut_cpu)

    def set_up(self):
        ns = self.tb.ns("dut")
        netns.run(ns, ["ethtool", "-K", "eth0", "gro", "on"], capture_output=True)
        netns.run(self.tb.ns("src"), ["ethtool", "-K", "eth0", "tso", "off"], capture_output=True)
        metrics.threaded_napi(ns, "eth0", self.dut_cpu)
        self.udp_sink(ns, PORT)

    def run(self, generator, peer, seconds, rate_pps):
        """One bounded run of `peer` (attached for it): the send report, what
        the peer dropped, and the DUT core's CPU."""
        with peer:
            peer.ready()
            base = peer.counters()["dropped"]
            with CpuSampler(interval=1.0) as cpu:
                rep = generator.send(seconds=seconds, rate_pps=rate_pps)
                time.sleep(0.2)  # the last frames through the DUT's queue
            dropped = peer.counters()["dropped"] - base
        return {"report": rep, "dropped": dropped, "cpu": cpu.summary().loc[self.dut_cpu]}


def run(peers, modes, sizes, trials, duration, rate, cpus=(0, 1), out=None, progress=True):
    gen_cpu, dut_cpu = cpus
    rows, chosen = [], variants(peers, modes)
    bar = common.Progress(trials * len(sizes) * len(chosen)) if progress else None
    with PairRig(gen_cpu, dut_cpu) as rig:
        t = rig.tb
        made = {v: PEERS[v[0]](t.ns("dut"), "eth0", [f"udp:{PORT}"], v[1]) for v in chosen}
        gens = {}
        try:
            for trial, size, v in common.interleaved(trials, sizes, chosen):
                if size not in gens:
                    frames = common.udp_frames(
                        t.addr("src", "eth0"),
                        t.addr("dut", "eth0"),
                        t.mac("src", "eth0"),
                        t.mac("dut", "eth0"),
                        size,
                        dport=PORT,
                    )
                    gens[size] = GENERATORS["xdp"](t.ns("src"), "eth0", frames, cpu=gen_cpu).open()
                m = rig.run(gens[size], made[v], duration, rate)
                rep, core = m["report"], m["cpu"]
                arrived = rep.packets - rep.dropped
                rows.append(
                    {
                        "peer": v[0],
                        "mode": v[1],
                        "size": size,
                        "trial": trial,
                        "offered_pps": rate,
                        "duration_s": round(rep.seconds, 3),
                        "sent_packets": rep.packets,
                        "sender_dropped": rep.dropped,
                        "dropped": m["dropped"],
                        "dut_ns_per_pkt": float(core["busy_ns"]) / arrived if arrived else None,
                        **{f"cpu_{c}": float(core[c]) for c in CPU_COLUMNS},
                    }
                )
                if bar:
                    bar.step(f"{made[v].label} {size}B trial {trial}")
        finally:
            common.close_all(gens, made)
    df = common.columns_first(rows, COLUMNS)
    params = {
        "peers": peers,
        "modes": modes,
        "sizes": sizes,
        "trials": trials,
        "duration_s": duration,
        "rate_pps": rate,
        "gen_cpu": gen_cpu,
        "dut_cpu": dut_cpu,
        "port": PORT,
        "fcs_bytes": common.FCS,
    }
    return df, write_results(df, "port_filter", params, out)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    d = df.assign(label=df["peer"] + df["mode"].fillna("").map(lambda m: f":{m}" if m else ""))
    return common.summarize(d, ["size", "label"], ["dut_ns_per_pkt", "dropped"])


def print_summary(df, stream=sys.stdout):
    stream.write("\nmedian [min..max] over trials; ns of DUT CPU per frame\n")
    for _, r in summary(df).iterrows():
        stream.write(
            f"  {int(r['size']):>5} B {r['label']:<12} {r['dut_ns_per_pkt_median']:8.0f} "
            f"[{r['dut_ns_per_pkt_min']:.0f}..{r['dut_ns_per_pkt_max']:.0f}]  "
            f"dropped {r['dropped_median']:.0f}\n"
        )
