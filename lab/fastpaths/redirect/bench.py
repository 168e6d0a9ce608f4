"""python -m lab bench redirect: the experiment of the student report on
netfilter vs XDP (a UDP destination rewrite by netfilter or by XDP) against
every method we have, on the router testbed (lab.fastpaths.redirect.testbed.router_testbed,
lab.fastpaths.redirect.rig.RouterRig).

Two workloads:
  transfer  the report's: a file (512 MB) sent over UDP to the service, 5 trials per
            method; per trial its seconds, goodput, datagrams, repairs, digest, and
            the router core's busy time; per second, mpstat's columns for every core
            (a second CSV, *_cpu, for the report's per-second graphs)
  rate      frames at the generator's ceiling and at a paced rate, per size and
            number of flows (nft-dnat: that many conntrack entries; each flow comes
            in bursts of up to 4096 frames, so lookups still dominate): forwarded
            packets/s (out of the router's egress: sent, or refused by the server's
            full ring), delivered packets/s (what the server got) and the router
            core's ns per forwarded packet
Methods run interleaved within each trial (common.interleaved).
"""

import argparse
import sys

import pandas as pd

from lab.bench import common
from lab.console import renamed
from lab.metrics import CPU_COLUMNS, write_results
from lab.traffic import GENERATORS
from lab.traffic.partial import partial

from .peers import METHODS
from .peers import method as make_method
from .rig import RouterRig
from .testbed import router_testbed

NAME = "redirect"
SUMMARY = "the netfilter-vs-XDP report: a UDP destination rewrite; transfer CPU and forwarding rate"
DESCRIPTION = __doc__.split("\n\n", 1)[1]
EXAMPLES = """\
examples:
  python -m lab bench redirect                          # the report's transfer: 512 MB, 5 trials, every method
  python -m lab bench redirect --peers nft-dnat,xdp-pass,xdp-forward --trials 5 --out datasets/reference
  python -m lab bench redirect --workload rate --sizes 64,1518 --flows 1,1024 --trials 5
                                                        # forwarding rate and cost, ceiling and paced
  python -m lab bench redirect --workload rate --peers nft-dnat,xdp-forward --xdp-modes native,generic
  python -m lab bench redirect --transfer-size 8M --trials 1 --peers route,xdp-pass
                                                        # a smoke test
"""
METHOD_ORDER = ["route", "nft-dnat", "nft-stateless", "xdp-pass", "xdp-forward", "tc-bpf"]
COLUMNS = [
    "workload",
    "method",
    "mode",
    "size",
    "flows",
    "trial",
    "duration_s",
    "sender_pps",
    "forwarded_pps",
    "dut_ns_per_pkt",
    "cpu_usr",
    "cpu_sys",
    "cpu_soft",
    "cpu_idle",
]
TRANSFER_COLUMNS = ["bytes", "seconds", "goodput_mbps", "datagrams", "repaired", "digest_ok", "dut_busy_ms"]


def _size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "--workload",
        default="transfer",
        choices=("transfer", "rate"),
        help="a file transfer (the report's) or frames at a rate (default %(default)s)",
    )
    common.add_options(
        p,
        trials=5,
        duration=3.0,
        peers=METHOD_ORDER,
        old_peers="--methods",
        cpus="generator (and client, server),router",
    )
    p.add_argument(
        "--xdp-modes", default="native,generic", help="XDP modes the xdp-* methods run in (default %(default)s)"
    )
    renamed(p, "--modes", "--xdp-modes")
    p.add_argument(
        "--transfer-size",
        default="512M",
        metavar="BYTES",
        help="transfer: bytes per file, K/M/G allowed (default %(default)s, the report's)",
    )
    p.add_argument("--family", type=int, default=4, choices=(4, 6), help="IP version (default %(default)s)")
    p.add_argument(
        "--vip",
        default="routed",
        choices=("routed", "router"),
        help="the service address routed to the router, or the router's own (the netfilter-vs-XDP "
        "report's design: replies are then translated after routing) (default %(default)s)",
    )
    p.add_argument("--sizes", default="64,1518", help="rate: frame sizes with FCS (default %(default)s)")
    p.add_argument("--flows", default="1,1024", help="rate: numbers of UDP flows (default %(default)s)")
    p.add_argument(
        "--rates", default="ceiling,100000", help="rate: offered loads, 'ceiling' or packets/s (default %(default)s)"
    )
    p.add_argument(
        "--sender-csum",
        default="whole",
        help="rate: the generator's TCP/UDP checksums, whole and/or partial (as a sender with TX "
        "checksum offload leaves them), interleaved (default %(default)s)",
    )


def method_specs(methods, modes):
    """["xdp-pass:native", ...]: each method in each of its modes the user asked for."""
    out = []
    for name in methods:
        cls = METHODS[name]
        out += [name] if cls.modes == (None,) else [f"{name}:{m}" for m in cls.modes if m in modes]
    return out


def main(args):
    methods, cpus = common.checked_options(args, METHOD_ORDER, "method", cpus="generator,router")
    modes = common.parse_list(args.xdp_modes, str, ["native", "generic"], "mode")
    specs = method_specs(methods, modes)
    if args.workload == "transfer":
        size = _size(args.transfer_size)
        if not 1 << 10 <= size <= 4 << 30:
            raise ValueError(f"--transfer-size must be 1K..4G, not {args.transfer_size}")
        df, paths = run_transfer(specs, args.trials, size, args.family, cpus, args.out, vip=args.vip)
    else:
        sizes = common.parse_list(args.sizes, int, what="size")
        flows = common.parse_list(args.flows, int, what="flow count")
        rates = [None if r == "ceiling" else int(r) for r in common.parse_list(args.rates, str, what="rate")]
        csums = common.parse_list(args.sender_csum, str, ["whole", "partial"], "sender checksum")
        df, paths = run_rate(
            specs,
            args.trials,
            sizes,
            flows,
            rates,
            args.duration,
            args.family,
            cpus,
            args.out,
            csums=csums,
            vip=args.vip,
        )
    print_summary(df)
    print("\nwrote " + " and ".join(f"{p} ({p.with_suffix('.json').name})" for p in paths))
    return 0


def _cpu_row(cpu, dut_cpu):
    core = cpu.summary().loc[dut_cpu]
    return {f"cpu_{c}": float(core[c]) for c in CPU_COLUMNS}, float(core["busy_ns"])


def run_transfer(specs, trials, size, family, cpus, out=None, progress=True, vip="routed"):
    """The report's workload. Returns (DataFrame, [CSV paths])."""
    gen_cpu, dut_cpu = cpus
    rows, seconds_rows = [], []
    bar = common.Progress(trials * len(specs)) if progress else None
    with RouterRig(router_testbed(vip_on_router=vip == "router"), gen_cpu, dut_cpu) as rig:
        methods = {s: make_method(s, rig.tb) for s in specs}
        try:
            for trial, _, spec in common.interleaved(trials, [size], specs):
                m = methods[spec]
                r = rig.run_transfer(m, size, seconds=max(60.0, size / 2e6), family=family)
                rep, cpu = r["report"], r["cpu"]
                cols, busy = _cpu_row(cpu, dut_cpu)
                x = rep.extra
                rows.append(
                    {
                        "workload": "transfer",
                        "method": m.name,
                        "mode": m.mode or "",
                        "size": None,
                        "flows": 1,
                        "trial": trial,
                        "duration_s": round(x["seconds"], 3),
                        "sender_pps": x["datagrams"] / x["seconds"],
                        "forwarded_pps": None,
                        "dut_ns_per_pkt": busy / x["datagrams"],
                        **cols,
                        "bytes": size,
                        "seconds": x["seconds"],
                        "goodput_mbps": size * 8 / x["seconds"] / 1e6,
                        "datagrams": x["datagrams"],
                        "repaired": x["retransmitted"],
                        "digest_ok": bool(x["ok"] and r["server"] and r["server"].get("ok")),
                        "dut_busy_ms": busy / 1e6,
                        "family": family,
                        "vip": vip,
                        "translated": r["method"].get("translated", 0),
                    }
                )
                for s in cpu.samples().to_dict("records"):
                    seconds_rows.append({"method": m.name, "mode": m.mode or "", "trial": trial, **s})
                if bar:
                    bar.step(f"{m.label} trial {trial}")
        finally:
            common.close_all(methods)
    df = common.columns_first(rows, COLUMNS + TRANSFER_COLUMNS)
    params = {
        "workload": "transfer",
        "methods": specs,
        "trials": trials,
        "bytes": size,
        "family": family,
        "gen_cpu": gen_cpu,
        "dut_cpu": dut_cpu,
        "vip": vip,
    }
    path = write_results(df, "redirect_transfer", params, out)
    cpu_path = write_results(pd.DataFrame(seconds_rows), "redirect_transfer_cpu", params, out, companion_of=path)
    return df, [path, cpu_path]


def run_rate(
    specs,
    trials,
    sizes,
    flows_list,
    rates,
    duration,
    family,
    cpus,
    out=None,
    progress=True,
    csums=("whole",),
    vip="routed",
):
    """Frames at rates. Returns (DataFrame, [CSV path]). csums: the generator's
    checksums, "whole" and/or "partial" (lab.traffic.partial), interleaved as
    variants of each method."""
    gen_cpu, dut_cpu = cpus
    rows = []
    settings = [(s, f, r) for s in sizes for f in flows_list for r in rates]
    variants = [(spec, c) for spec in specs for c in csums]
    bar = common.Progress(trials * len(settings) * len(variants)) if progress else None
    with RouterRig(router_testbed(vip_on_router=vip == "router"), gen_cpu, dut_cpu) as rig:
        tb = rig.tb
        methods = {s: make_method(s, tb) for s in specs}
        gens = {}
        try:
            for trial, setting, (spec, csum) in common.interleaved(trials, settings, variants):
                size, nflows, rate = setting
                m = methods[spec]
                to, port = m.target(family)
                key = (size, nflows, to, port, csum)
                if key not in gens:
                    src = tb.client4 if family == 4 else tb.client6
                    frames = common.udp_frames(
                        src,
                        to,
                        tb.topo.mac(tb.client, "eth0"),
                        tb.topo.mac(tb.dut, tb.dut_in),
                        size,
                        nflows,
                        base_sport=20000,
                        dport=port,
                    )
                    if csum == "partial":
                        frames = [partial(f) for f in frames]
                    gens[key] = GENERATORS["xdp"](tb.ns(tb.client), "eth0", frames, cpu=gen_cpu).open()
                r = rig.run_rate(gens[key], m, seconds=duration, rate_pps=rate)
                rep, cpu = r["report"], r["cpu"]
                cols, busy = _cpu_row(cpu, dut_cpu)
                secs = rep.seconds
                rows.append(
                    {
                        "workload": "rate",
                        "method": m.name,
                        "mode": m.mode or "",
                        "size": size,
                        "flows": nflows,
                        "trial": trial,
                        "duration_s": round(secs, 3),
                        "sender_pps": rep.pps,
                        "forwarded_pps": r["forwarded"] / secs,
                        "dut_ns_per_pkt": busy / r["forwarded"] if r["forwarded"] else None,
                        **cols,
                        "delivered_pps": r["delivered"] / secs,
                        "delivered_packets": r["delivered"],
                        "offered_pps": rate or 0,
                        "sent_packets": rep.packets,
                        "sender_dropped": rep.dropped,
                        "forwarded_packets": r["forwarded"],
                        "forwarded_mbps": r["forwarded"] * (size * 8) / secs / 1e6,
                        "family": family,
                        "vip": vip,
                        "translated": r["method"].get("translated", 0),
                        "sender_csum": csum,
                    }
                )
                if bar:
                    bar.step(f"{m.label} {csum} {size}B {nflows}f {rate or 'max'} trial {trial}")
        finally:
            common.close_all(gens, methods)
    df = common.columns_first(rows, COLUMNS)
    params = {
        "workload": "rate",
        "methods": specs,
        "trials": trials,
        "sizes": sizes,
        "flows": flows_list,
        "rates": rates,
        "duration_s": duration,
        "family": family,
        "gen_cpu": gen_cpu,
        "dut_cpu": dut_cpu,
        "fcs": common.FCS,
        "sender_csum": list(csums),
        "vip": vip,
    }
    return df, [write_results(df, "redirect_rate", params, out)]


def summary(df: pd.DataFrame) -> pd.DataFrame:
    keys = ["workload", "method", "mode", "size", "flows"]
    if "offered_pps" in df:
        keys.append("offered_pps")
    if "sender_csum" in df and df["sender_csum"].nunique() > 1:
        keys.append("sender_csum")
    values = ["dut_ns_per_pkt", "cpu_soft", "cpu_sys"] + (
        ["forwarded_pps"] if df["workload"].iloc[0] == "rate" else ["goodput_mbps", "dut_busy_ms"]
    )
    d = df.fillna({"size": 0})
    return common.summarize(d, keys, values)


def print_summary(df, stream=sys.stdout):
    s = summary(df)
    transfer = df["workload"].iloc[0] == "transfer"
    stream.write(
        "\nmedian [min..max] over trials; ns of router CPU per "
        + ("datagram" if transfer else "forwarded packet")
        + "\n"
    )
    for _, r in s.iterrows():
        label = f"{r['method']}{':' + r['mode'] if r['mode'] else ''}"
        if "sender_csum" in r:
            label += f" ({r['sender_csum']} csum)"
        if transfer:
            stream.write(
                f"  {label:<22} goodput {common.span(r, 'goodput_mbps'):>18} Mbit/s  router busy "
                f"{common.span(r, 'dut_busy_ms'):>18} ms  {common.span(r, 'dut_ns_per_pkt'):>18} ns/datagram\n"
            )
        else:
            offered = "max" if not r.get("offered_pps") else f"{r['offered_pps'] / 1e3:.0f}k"
            stream.write(
                f"  {label:<36} {int(r['size']):>5} B {int(r['flows']):>5} flows {offered:>5}  "
                f"forwarded {common.span(r, 'forwarded_pps', 1e3):>16} kpps  "
                f"{common.span(r, 'dut_ns_per_pkt'):>18} ns/pkt\n"
            )
