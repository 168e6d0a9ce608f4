"""python -m lab bench xdp-cost: what a program itself costs per packet, read
from the kernel's own BPF run-time statistics (BPF_ENABLE_STATS: run_time_ns
and run_cnt of the program), for frames whose TCP/UDP checksums are whole or
partial (as a sender with TX checksum offload leaves them, which the program
must finish before XDP_TX / XDP_REDIRECT). Interleaved trials."""

import argparse
import ctypes
import os
import sys

from ebpf import XdpLoadBalancer, XdpRedirect, XdpSink
from ebpf.testrun import libbpf

from ..fastpaths.lb.testbed import lb_testbed
from ..metrics import write_results
from ..traffic import GENERATORS
from ..traffic.partial import partial
from . import common

NAME = "xdp-cost"
SUMMARY = "a program's own ns per packet (kernel BPF statistics), whole vs partial sender checksums"
DESCRIPTION = """\
What a fast path's program itself costs per packet, from the kernel's own BPF
run-time statistics (run_time_ns / run_cnt while BPF_ENABLE_STATS is held), on
the load balancer's testbed: the generator sends one UDP flow at a paced rate to
a service of each program, with whole checksums or with partial ones, as a
sender with TX checksum offload (every veth's default) leaves them. Only the
program's run is counted: not the driver, not the stack. Runs interleave."""
EXAMPLES = """\
examples:
  python -m lab bench xdp-cost                  # lb-nat, lb-dsr, xdp-forward at 64 and 1518 B, 5 trials
  python -m lab bench xdp-cost --peers lb-nat --sizes 64 --trials 1 --duration 1   # a smoke test
"""
PROGRAMS = ("lb-nat", "lb-dsr", "xdp-forward")
CSUMS = ("whole", "partial")
COLUMNS = ["program", "size", "sender_csum", "trial", "runs", "ns_per_run", "offered_pps", "duration_s"]
PORT = {"lb-nat": 80, "lb-dsr": 81, "xdp-forward": 82}
BPF_STATS_RUN_TIME = 0


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    common.add_options(p, trials=5, duration=2.0, peers=PROGRAMS, old_peers="--programs")
    p.add_argument("--sizes", default="64,1518", help="frame sizes in bytes with FCS (default %(default)s)")
    p.add_argument("--sender-csum", default=",".join(CSUMS), help="whole and/or partial (default %(default)s)")
    p.add_argument("--rate", type=int, default=100000, help="frames per second (default %(default)s)")


def main(a):
    programs, _ = common.checked_options(a, PROGRAMS, "program")
    sizes = common.parse_list(a.sizes, int, what="size")
    csums = common.parse_list(a.sender_csum, str, CSUMS, "sender checksum")
    if not 1000 <= a.rate <= 1000000:
        raise ValueError(f"--rate must be 1000..1000000 frames/s, not {a.rate}")
    df, path = run(programs, sizes, csums, a.trials, a.duration, a.rate, a.out)
    s = common.summarize(df, ["program", "size", "sender_csum"], ["ns_per_run"])
    print("\nmedian [min..max] ns per run of the program")
    for _, r in s.iterrows():
        print(
            f"  {r['program']:<12} {int(r['size']):>5} B  {r['sender_csum']:<8} {r['ns_per_run_median']:7.0f} "
            f"[{r['ns_per_run_min']:.0f}..{r['ns_per_run_max']:.0f}]"
        )
    print(f"\nwrote {path} and {path.with_suffix('.json').name}")
    return 0


def run_stats(fd):
    """(run_time_ns, run_cnt) of one of our program fds, from its fdinfo."""
    got = {}
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            key, _, value = line.partition(":")
            got[key] = value.strip()
    return int(got.get("run_time_ns", 0)), int(got.get("run_cnt", 0))


class BpfRunStats:
    """The kernel counts programs' run time only while someone holds this fd."""

    def __enter__(self):
        self.fd = libbpf().bpf_enable_stats(ctypes.c_int(BPF_STATS_RUN_TIME))
        if self.fd < 0:
            raise OSError(f"BPF_ENABLE_STATS refused ({-self.fd})")
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        return False


def _programs(tb, names):
    """{name: program}, loaded for the LB host's eth0. An interface holds one XDP
    program, so each is attached only for its own runs."""
    be = f"{tb.backend4(0)}:{tb.backend_port}"
    out = {}
    for name in names:
        if name.startswith("lb-"):
            prog = XdpLoadBalancer(self4=tb.lb4, self6=tb.lb6, mode=name[3:], netns=tb.ns(tb.lb))
            svc = prog.add_service(f"udp:{tb.vip4}:{PORT[name]}")
            prog.set_backends(svc, {be: 1})
        else:
            prog = XdpRedirect([f"udp:{tb.vip4}:{PORT[name]}={be}"], action="forward", netns=tb.ns(tb.lb))
        out[name] = prog
    return out


def run(programs, sizes, csums, trials, duration, rate, out=None, progress=True):
    rows = []
    variants = [(p, c) for p in programs for c in csums]
    bar = common.Progress(trials * len(sizes) * len(variants)) if progress else None
    tb = lb_testbed(backends=1)
    with tb, BpfRunStats(), XdpSink("pass") as sink:
        # the generator's frames enter the switch through the client's port: a
        # veth takes XDP frames only where an XDP program runs
        sink.attach(tb.client, netns=tb.ns(tb.switch))
        progs = _programs(tb, programs)
        gens = {}
        try:
            for trial, size, (name, csum) in common.interleaved(trials, sizes, variants):
                prog = progs[name]
                key = (name, size, csum)
                if key not in gens:
                    frames = common.udp_frames(
                        tb.client4,
                        tb.vip4,
                        tb.topo.mac(tb.client, "eth0"),
                        tb.topo.mac(tb.lb, "eth0"),
                        size,
                        1,
                        dport=PORT[name],
                    )
                    if csum == "partial":
                        frames = [partial(f) for f in frames]
                    gens[key] = GENERATORS["xdp"](tb.ns(tb.client), "eth0", frames, cpu=0).open()
                fd = prog.load_program().fd
                a = prog.attach("eth0")
                try:
                    t0, n0 = run_stats(fd)
                    rep = gens[key].send(seconds=duration, rate_pps=rate)
                    t1, n1 = run_stats(fd)
                finally:
                    prog.detach_xdp(a)
                runs = n1 - n0
                rows.append(
                    {
                        "program": name,
                        "size": size,
                        "sender_csum": csum,
                        "trial": trial,
                        "runs": runs,
                        "ns_per_run": (t1 - t0) / runs if runs else None,
                        "offered_pps": rate,
                        "duration_s": round(rep.seconds, 3),
                        "sent_packets": rep.packets,
                    }
                )
                if bar:
                    bar.step(f"{name} {csum} {size}B trial {trial}")
        finally:
            common.close_all(gens, progs)
    df = common.columns_first(rows, COLUMNS)
    params = {
        "programs": programs,
        "sizes": sizes,
        "sender_csum": csums,
        "trials": trials,
        "duration_s": duration,
        "rate_pps": rate,
        "fcs": common.FCS,
    }
    return df, write_results(df, "xdp_cost", params, out)


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m lab bench xdp-cost")
    add_arguments(p)
    sys.exit(main(p.parse_args()))
