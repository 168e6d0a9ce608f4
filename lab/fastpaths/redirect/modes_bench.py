"""python -m lab bench xdp-modes: the Cilium/SmartNIC benchmark note's
comparison of XDP's modes (generic, native, hardware offload), with the
simplest program of each kind and with the redirect, on the router testbed
(lab.fastpaths.redirect.testbed.router_testbed, lab.fastpaths.redirect.rig.RouterRig).

Programs, on the router's receiving interface:
  drop      count and XDP_DROP (the cheapest thing XDP does)
  tx        count and XDP_TX: back out of the same interface, nothing rewritten
  redirect  count and XDP_REDIRECT to the router's other interface, nothing rewritten
  forward   ebpf.XdpRedirect, action forward: rewrite, route lookup, redirect
each in native and generic mode, at the generator's ceiling and at one equal
offered rate: packets/s handled, the router core's ns per packet, mpstat's
columns. Offload is attempted for real and recorded as unavailable, with the
kernel's reason, where the NIC cannot run BPF (every veth). Modes and programs
run interleaved within each trial.
"""

import argparse
import sys

from ebpf import netdev
from ebpf.instruments.xdp_sink import XdpSink
from ebpf.redirect.xdp_redirect import XdpRedirect
from lab.bench import common
from lab.console import renamed
from lab.metrics import CPU_COLUMNS, write_results
from lab.peer import Peer
from lab.traffic import GENERATORS

from .rig import RouterRig
from .testbed import router_testbed

NAME = "xdp-modes"
SUMMARY = "the Cilium/SmartNIC note: XDP generic vs native (vs offload): drop, tx, redirect, forward"
DESCRIPTION = __doc__.split("\n\n", 1)[1]
EXAMPLES = """\
examples:
  python -m lab bench xdp-modes                       # every program and mode, ceiling and 100 kpps, 5 trials
  python -m lab bench xdp-modes --peers drop --sizes 64,1518 --trials 10
  python -m lab bench xdp-modes --rates 200000 --trials 3 --out datasets/reference
  python -m lab bench xdp-modes --peers drop,forward --trials 1 --duration 1
                                                      # a smoke test
"""
PROGRAMS = ("drop", "tx", "redirect", "forward")
MODES = ("native", "generic", "offload")
COLUMNS = [
    "program",
    "mode",
    "size",
    "trial",
    "duration_s",
    "offered_pps",
    "sender_pps",
    "handled_pps",
    "delivered_pps",
    "dut_ns_per_pkt",
    "cpu_usr",
    "cpu_sys",
    "cpu_soft",
    "cpu_idle",
    "status",
    "reason",
]


class XdpProgram(Peer):
    """One of the programs above, on the router's receiving interface, in one
    mode. counters(): "handled", what the program did with a frame (its own
    count of frames, or for forward its XDP_REDIRECT verdicts): the router's
    work, which the cost per packet is of; and "delivered", where the frames
    ended: the program (drop), the client's sink (tx), the server's sink
    (redirect, forward). Delivery can fall short of handling when the far end's
    ring overflows: the far ends share the generator's core (2 vCPUs)."""

    owns_dut_xdp = True

    def __init__(self, tb, program, mode):
        super().__init__()
        self.tb, self.program, self.mode = tb, program, mode
        self.name = f"{program}:{mode}"
        ns = tb.ns(tb.dut)
        if program == "forward":
            self.prog = XdpRedirect(tb.rules("udp", families=(4,)), action="forward", netns=ns)
        else:
            with netdev.ipr(ns) as ip:
                out = netdev.ifindex_of(ip, tb.dut_out, ns)
            self.prog = XdpSink(program, redirect_ifindex=out if program == "redirect" else None)
        self.counted_at = {"drop": None, "tx": tb.client, "redirect": tb.server, "forward": tb.server}[program]

    def attach(self):
        ns = self.tb.ns(self.tb.dut)
        try:
            if self.program == "forward":
                self.prog.attach(self.tb.dut_in, self.mode)
                self.prog.attach(self.tb.dut_out, self.mode)  # the devmap's far side needs no program, replies do
            else:
                self.prog.attach(self.tb.dut_in, netns=ns, mode=self.mode)
        except BaseException:
            self.detach()  # nothing left half-attached
            raise
        self.attached = True

    def detach(self):
        self.prog.detach()
        self.attached = False

    def counters(self):
        own = self.prog.counters()
        handled = own["redirect"] if self.program == "forward" else own["packets"]
        delivered = handled if self.counted_at is None else self.tb.sinks[self.counted_at].counters()["packets"]
        return {"handled": handled, "delivered": delivered}

    def close(self):
        super().close()
        self.prog.close()


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    common.add_options(p, trials=5, duration=3.0, peers=PROGRAMS, old_peers="--programs", cpus="generator,router")
    p.add_argument("--xdp-modes", default=",".join(MODES), help="any of %(default)s (default: all)")
    renamed(p, "--modes", "--xdp-modes")
    p.add_argument("--sizes", default="64", help="frame sizes with FCS (default %(default)s)")
    p.add_argument(
        "--rates", default="ceiling,100000", help="offered loads, 'ceiling' or packets/s (default %(default)s)"
    )


def main(args):
    programs, cpus = common.checked_options(args, PROGRAMS, "program", cpus="generator,router")
    modes = common.parse_list(args.xdp_modes, str, MODES, "mode")
    sizes = common.parse_list(args.sizes, int, what="size")
    rates = [None if r == "ceiling" else int(r) for r in common.parse_list(args.rates, str, what="rate")]
    df, path = run(programs, modes, sizes, rates, args.trials, args.duration, cpus, args.out)
    print_summary(df)
    print(f"\nwrote {path} and {path.with_suffix('.json').name}")
    return 0


def offload_row(tb, program, size, rate):
    """Offload, tried for real: the kernel's refusal is the row."""
    p = XdpProgram(tb, program, "offload")
    try:
        p.prog.attach_xdp(p.prog.FUNCTION, tb.dut_in, tb.ns(tb.dut), "offload")
        status, reason = "attached", ""
    except Exception as e:  # AttachError: the NIC cannot run BPF
        status, reason = "unavailable", str(e)
    finally:
        p.close()
    return {
        "program": program,
        "mode": "offload",
        "size": size,
        "trial": 0,
        "offered_pps": rate or 0,
        "status": status,
        "reason": reason,
    }


def run(programs, modes, sizes, rates, trials, duration, cpus, out=None, progress=True):
    gen_cpu, dut_cpu = cpus
    rows = []
    run_modes = [m for m in modes if m != "offload"]
    variants = [(p, m) for p in programs for m in run_modes]
    settings = [(s, r) for s in sizes for r in rates]
    bar = common.Progress(max(1, trials * len(settings) * len(variants))) if progress else None
    with RouterRig(router_testbed(), gen_cpu, dut_cpu) as rig:
        tb = rig.tb
        if "offload" in modes:
            rows += [offload_row(tb, p, s, r) for p in programs for s, r in settings]
        peers = {v: XdpProgram(tb, *v) for v in variants}
        gens = {}
        try:
            for trial, (size, rate), variant in common.interleaved(trials, settings, variants):
                peer = peers[variant]
                if size not in gens:
                    frames = common.udp_frames(
                        tb.client4,
                        tb.vip4,
                        tb.topo.mac(tb.client, "eth0"),
                        tb.topo.mac(tb.dut, tb.dut_in),
                        size,
                        1,
                        dport=tb.service_port,
                    )
                    gens[size] = GENERATORS["xdp"](tb.ns(tb.client), "eth0", frames, cpu=gen_cpu).open()
                r = rig.run_rate(gens[size], peer, seconds=duration, rate_pps=rate)
                rep = r["report"]
                handled, delivered = r["method"]["handled"], r["method"]["delivered"]
                core = r["cpu"].summary().loc[dut_cpu]
                rows.append(
                    {
                        "program": peer.program,
                        "mode": peer.mode,
                        "size": size,
                        "trial": trial,
                        "duration_s": round(rep.seconds, 3),
                        "offered_pps": rate or 0,
                        "sender_pps": rep.pps,
                        "handled_pps": handled / rep.seconds,
                        "delivered_pps": delivered / rep.seconds,
                        "dut_ns_per_pkt": float(core["busy_ns"]) / handled if handled else None,
                        **{f"cpu_{c}": float(core[c]) for c in CPU_COLUMNS},
                        "status": "ok",
                        "reason": "",
                        "sent_packets": rep.packets,
                        "sender_dropped": rep.dropped,
                        "handled_packets": handled,
                        "delivered_packets": delivered,
                    }
                )
                if bar:
                    bar.step(f"{peer.name} {size}B {rate or 'max'} trial {trial}")
        finally:
            common.close_all(gens, peers)
    df = common.columns_first(rows, COLUMNS)  # offload rows alone lack most columns
    params = {
        "programs": programs,
        "modes": modes,
        "sizes": sizes,
        "rates": rates,
        "trials": trials,
        "duration_s": duration,
        "gen_cpu": gen_cpu,
        "dut_cpu": dut_cpu,
    }
    return df, write_results(df, "xdp_modes", params, out)


def print_summary(df, stream=sys.stdout):
    ok = df[df["status"] == "ok"]
    if len(ok):
        s = common.summarize(ok, ["program", "mode", "size", "offered_pps"], ["handled_pps", "dut_ns_per_pkt"])
        stream.write("\nmedian [min..max] over trials; ns of router CPU per handled packet\n")
        for _, r in s.iterrows():
            offered = "max" if not r["offered_pps"] else f"{r['offered_pps'] / 1e3:.0f}k"
            stream.write(
                f"  {r['program']:<9} {r['mode']:<8} {int(r['size']):>5} B {offered:>5}  "
                f"{r['handled_pps_median'] / 1e3:8.0f} kpps [{r['handled_pps_min'] / 1e3:.0f}.."
                f"{r['handled_pps_max'] / 1e3:.0f}]  {r['dut_ns_per_pkt_median']:7.0f} ns/pkt "
                f"[{r['dut_ns_per_pkt_min']:.0f}..{r['dut_ns_per_pkt_max']:.0f}]\n"
            )
    for _, r in df[df["status"] != "ok"].drop_duplicates(["program", "mode"]).iterrows():
        stream.write(f"  {r['program']:<9} {r['mode']:<8} {r['status']}: {r['reason']}\n")
