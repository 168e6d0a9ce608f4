"""python -m lab bench xdp-cost: what a program itself costs per packet, read
from the kernel's own BPF run-time statistics (BPF_ENABLE_STATS: run_time_ns
and run_cnt of the program), and what the LB's interface costs per packet in all
(its NAPI thread's time), for frames whose TCP/UDP checksums are whole or
partial (as a sender with TX checksum offload leaves them, which the program
must finish before XDP_TX / XDP_REDIRECT), beside the floor: a program that only
swaps the MAC addresses and sends the frame back (XDP_TX); the load balancer at
TC beside its own floor (the same at TC: bpf_redirect to its own interface).
Interleaved trials."""

import argparse
import ctypes
import os
import sys
import time

from ebpf import TcLoadBalancer, TcSwap, XdpLoadBalancer, XdpRedirect, XdpSink
from ebpf.testrun import libbpf

from .. import netns, nft
from ..fastpaths.lb.testbed import lb_testbed
from ..metrics import LOSSES, losses_between, on_cpu_ns, path_losses, threaded_napi, where_lost, write_results
from ..traffic import GENERATORS
from ..traffic.partial import partial
from . import common

NAME = "xdp-cost"
SUMMARY = "a program's own ns per packet (kernel BPF statistics), whole vs partial sender checksums"
DESCRIPTION = """\
What a fast path's program costs per packet, on the load balancer's testbed: the
generator sends one UDP flow (an established session, for the LB) to a service of
each program, as fast as it can or at --rate, with whole checksums or with partial
ones, as a sender with TX checksum offload (every veth's default) leaves them.
Two costs per packet: the program's own run, from the kernel's BPF run-time
statistics (run_time_ns / run_cnt while BPF_ENABLE_STATS is held), and the LB
interface's in all (driver, program, the frame's way back out), from the
schedstat of its NAPI kthread (threaded NAPI, pinned apart from the generator).
Beside them the floor: a program that only swaps the MAC addresses and returns
XDP_TX (xdp-bench tx -m swap's), the least a frame that leaves the way it came
costs; the summary gives each program's ratio to it. The LB at TC (tc-lb-nat,
tc-lb-dsr) against tc-floor, its twin at TC (a MAC swap and bpf_redirect out of
the interface the frame came in on): after GRO, on the skb the kernel built. And
nft-nat: no program, the kernel's forward path with an nftables DNAT rule (what
nft-lb does per packet), on the same interface's thread. Runs interleave."""
EXAMPLES = """\
examples:
  python -m lab bench xdp-cost                  # lb-nat, lb-dsr, xdp-forward, floor at 64 and 1518 B,
                                                # at the generator's ceiling, 5 trials
  python -m lab bench xdp-cost --rate 100000    # paced: the program's cost on a quiet path
  python -m lab bench xdp-cost --peers lb-nat,floor --sizes 64 --trials 1 --duration 1   # a smoke test
"""
PROGRAMS = ("lb-nat", "lb-dsr", "xdp-forward", "floor", "tc-lb-nat", "tc-lb-dsr", "tc-floor", "nft-nat")
FLOOR = "floor"
TC_FLOOR = "tc-floor"  # the TC programs' floor
KERNEL = "nft-nat"  # no program: the kernel's forward path and an nftables DNAT
SETTLE_S = 1.0  # at most this long after a send for its last frames to run or be counted lost
CSUMS = ("whole", "partial")
COLUMNS = [
    "program",
    "size",
    "sender_csum",
    "trial",
    "runs",
    "ns_per_run",
    "node_ns_per_packet",
    "returned",
    "offered_pps",
    "duration_s",
]
PORT = {"lb-nat": 80, "lb-dsr": 81, "xdp-forward": 82, FLOOR: 83, KERNEL: 84, "tc-lb-nat": 85, "tc-lb-dsr": 86}
PORT[TC_FLOOR] = 87
BPF_STATS_RUN_TIME = 0


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    common.add_options(p, trials=5, duration=2.0, peers=PROGRAMS, old_peers="--programs")
    p.add_argument("--sizes", default="64,1518", help="frame sizes in bytes with FCS (default %(default)s)")
    p.add_argument("--sender-csum", default=",".join(CSUMS), help="whole and/or partial (default %(default)s)")
    p.add_argument(
        "--rate",
        default="max",
        help="frames per second, or max: as fast as the generator sends (default %(default)s)",
    )


def main(a):
    programs, _ = common.checked_options(a, PROGRAMS, "program")
    sizes = common.parse_list(a.sizes, int, what="size")
    csums = common.parse_list(a.sender_csum, str, CSUMS, "sender checksum")
    rate = None if a.rate == "max" else int(a.rate) if str(a.rate).isdigit() else -1
    if rate is not None and not 1000 <= rate <= 1000000:
        raise ValueError(f"--rate must be max or 1000..1000000 frames/s, not {a.rate}")
    df, path = run(programs, sizes, csums, a.trials, a.duration, rate, a.out)
    print_summary(df)
    print(f"\nwrote {path} and {path.with_suffix('.json').name}")
    return 0


def print_summary(df, stream=sys.stdout):
    """Median [min..max] of both costs, and each program's ratio to its floor's medians (a TC
    program's to tc-floor's, the others' to floor's)."""
    s = common.summarize(df, ["program", "size", "sender_csum"], ["ns_per_run", "node_ns_per_packet"])
    floors = {f: s[s["program"] == f].set_index(["size", "sender_csum"]) for f in (FLOOR, TC_FLOOR)}
    stream.write(
        "\nmedian [min..max] ns per packet: the program's own run, and the LB interface's in all\n"
        f"(its NAPI thread); x{FLOOR}: the ratio of the medians to its floor's ({TC_FLOOR} for tc-*)\n"
    )
    for _, r in s.iterrows():
        key = (r["size"], r["sender_csum"])
        name = floor_of(r["program"])
        floor, ratio = floors[name], ""
        if r["program"] not in (FLOOR, TC_FLOOR) and key in floor.index:
            f = floor.loc[key]
            ratio = (
                f"  x{name} {r['ns_per_run_median'] / f['ns_per_run_median']:.2f} (program) "
                f"{r['node_ns_per_packet_median'] / f['node_ns_per_packet_median']:.2f} (interface)"
            )
        stream.write(
            f"  {r['program']:<12} {int(r['size']):>5} B  {r['sender_csum']:<8} "
            f"{common.span(r, 'ns_per_run'):>16} {common.span(r, 'node_ns_per_packet'):>18}{ratio}\n"
        )


def floor_of(program) -> str:
    return TC_FLOOR if program.startswith("tc-") else FLOOR


def at_tc(prog) -> bool:
    return isinstance(prog, (TcLoadBalancer, TcSwap))


def permanent_neighbour(tb):
    """The backend's neighbour entry made permanent on the LB host: what leaves ends at the
    switch's drop program, an ARP request included, so the kernel could never resolve it
    itself (NftNat, and bpf_redirect_neigh() at TC, need it)."""
    mac = tb.topo.mac(tb.backends[0], "eth0")
    netns.run(
        tb.ns(tb.lb), ["ip", "neigh", "replace", tb.backend4(0), "lladdr", mac, "dev", "eth0", "nud", "permanent"]
    )


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


class NftNat:
    """The kernel's NAT for the same flow, as nft-lb does it per packet: an nftables DNAT
    rule on the LB host (conntrack, the forward path), no XDP program. GRO keeps the
    interface on NAPI, so its thread does this work too and its time is comparable. The
    backend's neighbour entry is made permanent while it runs: what leaves ends at the
    switch's drop program, an ARP probe included, and an entry that failed its probes
    would hold the frames back."""

    TABLE = "vtl_cost"
    SYSCTLS = ("net.ipv4.conf.all.send_redirects", "net.ipv4.conf.eth0.send_redirects")

    def __init__(self, tb, port, backend):
        self.tb, self.port, self.backend = tb, port, backend
        self.ns, self.attached, self.saved = tb.ns(tb.lb), False, {}

    def attach(self):
        addr, bport = self.backend
        t = {"family": "ip", "table": self.TABLE}
        match = [
            {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": self.tb.vip4}},
            {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": self.port}},
        ]
        self.attached = True
        nft.run(
            self.ns,
            [
                {"add": {"table": {"family": "ip", "name": self.TABLE}}},
                {"add": {"chain": {**t, "name": "pre", "type": "nat", "hook": "prerouting", "prio": -100}}},
                {"add": {"rule": {**t, "chain": "pre", "expr": [*match, {"dnat": {"addr": addr, "port": bport}}]}}},
            ],
        )
        # it forwards out of the interface the frame came in on: no ICMP redirects to the sender
        self.saved = {k: netns.read_sysctl(self.ns, k) for k in self.SYSCTLS}
        for k in self.SYSCTLS:
            netns.run(self.ns, ["sysctl", "-qw", f"{k}=0"])
        permanent_neighbour(self.tb)

    def detach(self):
        if self.attached:
            self.attached = False
            nft.delete_table(self.ns, "ip", self.TABLE)
            for k, v in self.saved.items():
                netns.run(self.ns, ["sysctl", "-qw", f"{k}={v}"])

    def close(self):
        self.detach()


def _programs(tb, names):
    """{name: program}, loaded for the LB host's eth0. An interface holds one XDP
    program, so each is attached only for its own runs."""
    be = f"{tb.backend4(0)}:{tb.backend_port}"
    out = {}
    for name in names:
        if name == KERNEL:
            prog = NftNat(tb, PORT[name], (tb.backend4(0), tb.backend_port))
        elif name == FLOOR:
            prog = XdpSink("swap")
        elif name == TC_FLOOR:
            prog = TcSwap()
        elif name.startswith(("lb-", "tc-lb-")):
            kind = TcLoadBalancer if name.startswith("tc-") else XdpLoadBalancer
            prog = kind(self4=tb.lb4, self6=tb.lb6, mode=name.rsplit("-", 1)[1], netns=tb.ns(tb.lb))
            svc = prog.add_service(f"udp:{tb.vip4}:{PORT[name]}")
            prog.set_backends(svc, {be: 1})
        else:
            prog = XdpRedirect([f"udp:{tb.vip4}:{PORT[name]}={be}"], action="forward", netns=tb.ns(tb.lb))
        out[name] = prog
    return out


def _attach(prog, tb):
    if isinstance(prog, NftNat):
        return prog.attach()
    if isinstance(prog, (XdpSink, TcSwap)):
        return prog.attach("eth0", netns=tb.ns(tb.lb))
    if isinstance(prog, TcLoadBalancer):
        permanent_neighbour(tb)
    return prog.attach("eth0")


def lb_napi(tb) -> int:
    """The LB interface's NAPI in a kthread of its own, pinned to a CPU the generator
    (on CPU 0) does not use: its time is what the interface costs. GRO keeps veth's NAPI
    when no XDP program is attached (with TSO off on the sending side: veth takes only a
    frame that needs no segmenting onto its NAPI ring), so one thread serves every
    program's runs, and the kernel's own forwarding (nft-nat) too."""
    netns.run(tb.ns(tb.lb), ["ethtool", "-K", "eth0", "gro", "on"], capture_output=True)
    netns.run(tb.ns(tb.switch), ["ethtool", "-K", tb.lb, "tso", "off"], capture_output=True)
    cpus = sorted(os.sched_getaffinity(0))
    got = threaded_napi(tb.ns(tb.lb), "eth0", cpu=cpus[-1] if len(cpus) > 1 else None)
    if len(got) != 1:
        raise netns.LabError(f"threaded NAPI on the LB's eth0: expected one kthread, found {len(got)}")
    return got[0]


def before_and_after(lost: dict, lb_ns: str, switch_ns: str, lb_port: str) -> tuple[int, int]:
    """Frames lost on the way to the LB's interface (before a program ran on them) and
    on their way back out (after), each counted once: from the interfaces' own rx/tx
    drop counts (what path_losses() keys "IFNAME rx_dropped"), not the sums beside
    them, where veth counts one loss on both ends of a pair. veth counts a frame its
    peer could not take on the sender's tx (a ring full: the LB's NAPI thread held
    up by the machine's other work), one XDP_TX or xdp_xmit could not pass on both
    the sender's tx and the peer's rx: so the switch's port to the LB has its rx
    left out (it is the LB's tx again), and the LB's eth0 tx is what was lost after."""
    before = after = 0
    for ns, counts in lost.items():
        for key, n in counts.items():
            ifname, _, field = key.partition(" ")
            if field not in ("rx_dropped", "tx_dropped"):
                continue
            if ns == lb_ns and ifname == "eth0" and field == "tx_dropped":
                after += n
            elif not (ns == switch_ns and ifname == lb_port and field == "rx_dropped"):
                before += n
    return before, after


def run(programs, sizes, csums, trials, duration, rate, out=None, progress=True):
    """rate: frames per second, or None for the generator's ceiling."""
    rows = []
    # a frame whose checksum is partial reaches the kernel here as one with a bad checksum
    # (the generator's frames are bytes, not the sender's own skb marked partial): conntrack
    # would drop it, so the kernel's NAT runs on whole checksums only
    variants = [(p, c) for p in programs for c in csums if not (p == KERNEL and c == "partial")]
    bar = common.Progress(trials * len(sizes) * len(variants)) if progress else None
    tb = lb_testbed(backends=1)
    with tb, BpfRunStats(), XdpSink("pass") as sink, XdpSink("drop") as back:
        # the generator's frames enter the switch through the client's port: a
        # veth takes XDP frames only where an XDP program runs; what the programs
        # send back out ends at the switch's port towards the LB, the same for all
        sink.attach(tb.client, netns=tb.ns(tb.switch))
        back.attach(tb.lb, netns=tb.ns(tb.switch))
        napi = lb_napi(tb)
        spaces = [tb.ns(tb.lb), tb.ns(tb.switch)]
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
                kernel = isinstance(prog, NftNat)
                fd = None if kernel else prog.load(type(prog).FUNCTION, "SCHED_CLS" if at_tc(prog) else "XDP").fd
                a = _attach(prog, tb)
                try:
                    l0 = path_losses(spaces)
                    b0 = back.counters()["packets"]
                    t0, n0 = run_stats(fd) if fd else (0, 0)
                    c0 = on_cpu_ns([napi])
                    rep = gens[key].send(seconds=duration, rate_pps=rate)
                    # the last frames sent may still be in the rings on their way to the LB's
                    # NAPI thread and back (20 of 10000 once, on a loaded machine): counted
                    # once every frame sent has run or been lost, or after SETTLE_S
                    settle = time.monotonic() + SETTLE_S
                    while True:
                        t1, n1 = run_stats(fd) if fd else (0, 0)
                        lost = losses_between(l0, path_losses(spaces))
                        returned = back.counters()["packets"] - b0
                        before, after = before_and_after(lost, tb.ns(tb.lb), tb.ns(tb.switch), tb.lb)
                        runs = returned + after if kernel else n1 - n0  # the kernel's: the frames it sent on
                        if (runs + before >= rep.packets and returned + after >= runs) or time.monotonic() > settle:
                            break
                        time.sleep(0.01)
                    c1 = on_cpu_ns([napi])
                finally:
                    prog.detach() if kernel else prog.detach_tc(a) if at_tc(prog) else prog.detach_xdp(a)
                rows.append(
                    {
                        "program": name,
                        "size": size,
                        "sender_csum": csum,
                        "trial": trial,
                        "runs": runs,
                        "ns_per_run": (t1 - t0) / runs if runs and not kernel else None,
                        "node_ns_per_packet": (c1 - c0) / runs if runs else None,
                        "offered_pps": rate if rate else "max",
                        "duration_s": round(rep.seconds, 3),
                        "sent_packets": rep.packets,
                        "returned": returned,  # what came back out of the LB's interface: each program's every frame
                        # sent = runs + lost_before, returned = runs - lost_after, exactly; a
                        # loaded machine loses some (where: lost_at)
                        "lost_before": before,
                        "lost_after": after,
                        **{k: sum(c[k] for c in lost.values()) for k in LOSSES},
                        "lost_at": where_lost(lost, {v: k for k, v in zip(("lb", "switch"), spaces, strict=True)}),
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
        "rate_pps": rate if rate else "max",
        "fcs": common.FCS,
        "node_cost": "the LB eth0's threaded NAPI kthread's schedstat time / the program's run count",
    }
    return df, write_results(df, "xdp_cost", params, out)


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m lab bench xdp-cost")
    add_arguments(p)
    sys.exit(main(p.parse_args()))
