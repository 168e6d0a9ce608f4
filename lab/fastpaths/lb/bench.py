"""python -m lab bench lb: after the two load-balancer articles, the lab's load
balancer (at XDP, in XDP's generic mode and at TC) against nginx, HAProxy and
nftables on the LB testbed (lab.fastpaths.lb.testbed.lb_testbed): a client, the LB
and two nginx backends (one worker each, access log off) on a bridge.

    client --- [br0] --- lb (the balancer under test, VIP 198.18.5.100:80)
                    +--- be1, be2 (nginx :8080)

Closed loop, the articles' method: wrk with C connections, each sending its next
request when the last is answered, for --duration seconds. Open loop: the
lab's generator (lab/traffic/openloop.c; Debian has no wrk2) sends requests
at fixed times, at each --loads percent of `direct`'s capacity (its best
closed-loop median here, or --capacity), and counts latency from each
request's due time, so a stall is not hidden (coordinated omission).

What the LB costs in CPU depends on where its work runs. Its processes'
threads (a proxy's workers, the XDP or TC LB's command line) are read from their
schedstat. The kernel's receive work for it runs in softirq (the LB's program
too, at XDP and at TC, as nft-lb's rules), which Linux
charges to whatever task it interrupted, so by default (--napi softirq, how
the kernel runs unless told otherwise) the LB's CPU is what it adds to the
whole machine's (user, system, irq and softirq time, steal excluded) over
`direct` at the same offered load: the open loop's rows, against the median of
direct's at that load. With --napi threaded the LB interface's NAPI gets a
kernel thread of its own (the articles' "time of its NAPI", read from the
thread's schedstat), in every row; but a NAPI thread is scheduled like any
task, so while it waits the 256-frame veth ring before it overflows, and under
closed-loop load those drops cost retransmissions (P99 of hundreds of ms at
1000 connections here, against 20 ms in softirq). Memory is the processes'
PSS plus, for the XDP LB, the locked memory of its BPF maps. `direct` has no
LB: its CPU and memory are empty. Every balancer starts fresh for each run,
runs interleave within a trial, and the summary gives medians with min/max.
Latency percentiles per run (every percent, then the tail) go to a second CSV,
for CDFs.
"""

import argparse
import math
import sys
import threading
import time

import pandas as pd

from ebpf.lb.xdp_lb import SESSIONS
from lab import metrics, netns
from lab.bench import xdp_cost
from lab.bench.common import Progress, add_options, checked_options, columns_first, interleaved, parse_list
from lab.daemons.nginx import NginxServer
from lab.metrics import (
    LOSSES,
    USER_HZ,
    busy_ticks,
    losses_between,
    on_cpu_ns,
    path_losses,
    pss_bytes,
    where_lost,
    write_results,
)
from lab.netns import LabError
from lab.rig import Rig
from lab.traffic.http import QUANTILES, closed_loop, open_loop, spread
from lab.traffic.report import MAX_LOAD_SECONDS

from .peers import BALANCERS, SERVES_SERVICES
from .testbed import lb_testbed

NAME = "lb"
SUMMARY = "the load-balancer articles: the LB at XDP and TC against nginx, HAProxy, nftables (RPS, latency, CPU)"
DESCRIPTION = __doc__.split("\n\n", 1)[1]
EXAMPLES = """\
examples:
  python -m lab bench lb                        # every LB, closed loop at 100/500/1000 connections and
                                                # open loop at 25/50/75 % of direct's capacity, 3 trials
  python -m lab bench lb --peers direct,xdp,nginx-l4 --loops closed --connections 1000 --trials 5
  python -m lab bench lb --loops open --capacity 60000 --loads 50
  python -m lab bench lb --peers direct,xdp --connections 100 --loads 50 --trials 1 --duration 2
                                                # a smoke test: 4 runs of 2 s
"""
COLUMNS = [
    "lb",
    "mode",
    "loop",
    "connections",
    "services",
    "sessions",
    "offered_rps",
    "trial",
    "duration_s",
    "requests",
    "errors",
    "rps",
    "p50_ms",
    "p75_ms",
    "p90_ms",
    "p99_ms",
    "p999_ms",
    "lb_cpu_cores",
    "lb_mem_mb",
    "lb_proc_cores",
    "lb_napi_cores",
    "machine_cores",
    "steal_cores",
    "lb_pss_mb",
    "lb_maps_mb",
    "veth_ring_drops",
    "xdp_tx_errors",
    "if_dropped",
    "client_retrans",
    "lb_retrans",
    "backend_retrans",
    "lb_program_drops",
    "lost_at",
    "load_pct",
    "napi",
    "tool",
]
MODES = {
    "direct": "none",
    "xdp": "nat",
    "xdp-generic": "nat",
    "tc": "nat",
    "tc-dsr": "dsr",
    "nginx-l4": "stream",
    "nginx-l7": "http",
    "haproxy-l4": "tcp",
    "haproxy-l7": "http",
    "nft-lb": "dnat",
}
PERCENTILES = {"p50_ms": 50, "p75_ms": 75, "p90_ms": 90, "p99_ms": 99, "p999_ms": 99.9}


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    add_options(p, trials=3, duration=10.0, peers=list(BALANCERS), old_peers="--lbs")
    p.add_argument("--loops", default="closed,open", help="closed, open or both (default %(default)s)")
    p.add_argument("--connections", default="100,500,1000", help="closed loop: wrk connections (default %(default)s)")
    p.add_argument("--loads", default="25,50,75", help="open loop: percent of direct's capacity (default %(default)s)")
    p.add_argument(
        "--open-connections",
        type=int,
        default=100,
        help="open loop: keep-alive connections the schedule spreads over (default %(default)s)",
    )
    p.add_argument(
        "--capacity",
        type=float,
        metavar="RPS",
        help="direct's capacity for the open loop's loads (default: measured, closed loop)",
    )
    p.add_argument(
        "--napi",
        default="softirq",
        choices=("softirq", "threaded"),
        help="where the LB interface's receive work runs, and so how its CPU is read (default %(default)s)",
    )
    p.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the LB's cost per packet against its floor (bench xdp-cost's lb-nat and floor, 64 B, "
        "measured first when xdp is among the peers; tc-lb-nat and tc-floor when tc is)",
    )
    p.add_argument("--backends", type=int, default=2, help="nginx backends (default %(default)s, as the articles)")
    p.add_argument(
        "--services",
        default="1",
        help="the LBs that hold services (xdp, xdp-generic, tc, tc-dsr, nft-lb): run with each of these numbers "
        "of services, the measured one and the rest on the VIP's other ports with the same backends, which "
        "no client addresses (nft-lb: every service in one verdict map), e.g. 1,512 (default %(default)s)",
    )
    p.add_argument(
        "--sessions",
        default="0",
        help="the DSR peers (tc-dsr): their session table filled with each of these numbers of live sessions "
        "of made-up clients before a run (lab lb --fill-sessions), e.g. 1000,1000000; the other peers run "
        "unfilled (default %(default)s: none)",
    )
    p.add_argument("--threads", type=int, default=2, help="wrk threads (default %(default)s)")


def check(args):
    lbs, _ = checked_options(args, list(BALANCERS), "balancer", duration=(0.1, MAX_LOAD_SECONDS))
    loops = parse_list(args.loops, str, ["closed", "open"], "loop")
    conns = parse_list(args.connections, int, what="connection count")
    loads = parse_list(args.loads, float, what="load")
    if any(c < 1 for c in conns) or args.open_connections < 1:
        raise ValueError("connections must be at least 1")
    if any(not 0 < x <= 200 for x in loads):
        raise ValueError("loads are percent of direct's capacity, in (0, 200]")
    if not 1 <= args.backends <= 8:
        raise ValueError("--backends must be 1 to 8")
    if args.capacity is not None and args.capacity <= 0:
        raise ValueError("--capacity must be positive")
    sessions = parse_list(args.sessions, int, what="session count")
    if any(not 0 <= n <= 1 << 24 for n in sessions):
        raise ValueError("--sessions: 0 to 16777216 each")
    if any(sessions) and not any(MODES[lb] == "dsr" for lb in lbs):
        raise ValueError("--sessions fills the DSR peers' tables (tc-dsr): none in --peers")
    args.sessions_list = sessions
    services = parse_list(args.services, int, what="service count")
    if any(not 1 <= n <= 4096 for n in services):
        raise ValueError("--services: 1 to 4096 each")
    if any(n > 1 for n in services) and not any(lb in SERVES_SERVICES for lb in lbs):
        raise ValueError(f"--services: for the LBs that hold services ({', '.join(SERVES_SERVICES)}): none in --peers")
    args.services_list = services
    return lbs, loops, conns, loads


FLOOR_SECONDS = 2.0


def measure_floor(trials, out=None, progress=True, hook="xdp") -> dict:
    """The LB's cost per packet against its floor, as bench xdp-cost measures it: NAT mode
    and the floor of its hook (XDP: the MAC-swapping XDP_TX program; TC: the MAC swap and
    bpf_redirect), 64 B, whole checksums, the generator's ceiling, `trials` interleaved
    trials; the ratio of the medians, for the LB interface's cost in all (its NAPI thread)
    and for the program's own run."""
    name = "tc-lb-nat" if hook == "tc" else "lb-nat"
    floor_name = xdp_cost.floor_of(name)
    df, path = xdp_cost.run([name, floor_name], [64], ["whole"], trials, FLOOR_SECONDS, None, out, progress)
    med = df.groupby("program")[["ns_per_run", "node_ns_per_packet"]].median()
    lb, floor = med.loc[name], med.loc[floor_name]
    return {
        "hook": hook,
        "floor_ratio": round(lb["node_ns_per_packet"] / floor["node_ns_per_packet"], 3),
        "floor_program_ratio": round(lb["ns_per_run"] / floor["ns_per_run"], 3),
        "lb_ns_per_packet": round(lb["node_ns_per_packet"], 1),
        "floor_ns_per_packet": round(floor["node_ns_per_packet"], 1),
        "lb_ns_per_run": round(lb["ns_per_run"], 1),
        "floor_ns_per_run": round(floor["ns_per_run"], 1),
        "floor_csv": path.name,
    }


def floor_line(f) -> str:
    what = (
        "the LB at TC against its floor (a MAC swap and bpf_redirect)"
        if f["hook"] == "tc"
        else ("the XDP LB against its floor (a MAC swap and XDP_TX)")
    )
    return (
        f"\n{what}, 64 B, per packet: the LB's interface "
        f"{f['lb_ns_per_packet']:.0f} ns, {f['floor_ratio']:.2f}x the floor's {f['floor_ns_per_packet']:.0f}; "
        f"the program's own run {f['lb_ns_per_run']:.0f} ns, {f['floor_program_ratio']:.2f}x ({f['floor_csv']})\n"
    )


def main(args):
    lbs, loops, conns, loads = check(args)  # a ValueError: `lab bench: error: ...`, in one line
    floors = [measure_floor(args.trials, args.out, hook=h) for h in ("xdp", "tc") if args.floor and h in lbs]
    df, path = run(
        lbs,
        loops,
        conns,
        loads,
        args.trials,
        args.duration,
        args.capacity,
        args.open_connections,
        args.threads,
        args.out,
        backends=args.backends,
        napi=args.napi,
        floor=floors,
        sessions=args.sessions_list,
        services=args.services_list,
    )
    print_summary(df)
    for f in floors:
        sys.stdout.write(floor_line(f))
    print(f"\nwrote {path}, {path.with_suffix('.json').name} and {path.name.replace('lb-', 'lb_latency-', 1)}")
    return 0


# -- what the LB costs ----------------------------------------------------------------------------


class LbRig(Rig):
    """The LB testbed made ready for the runs (a lab.rig.Rig): nginx backends
    started, and with --napi threaded the LB interface's NAPI in a kernel thread
    of its own (`napi_tid`). The XDP LB's runs attach a pass program to the
    switch's port to the LB (veth drops XDP_TX frames unless the peer runs XDP)
    as its users do, `lab lb --prepare-peer`, for their own runs only: on a veth
    it moves the port's receiving onto a 256-frame ring that a proxy's bursts
    overrun (retransmissions the proxy would not otherwise have). The balancer
    under test is started fresh for each run (measure()); nothing is pinned:
    the LB's CPU is read from its processes and threads, or from the machine
    against direct's (see the module's notes)."""

    def __init__(self, backends=2, napi="softirq", dsr=False):
        # dsr: the backends hold the VIP on their loopback and serve it on the service's port
        # too (tc-dsr's requests arrive unchanged); the other peers never address it there
        super().__init__(lb_testbed(backends, dsr=dsr), gen_cpu=None, dut_cpu=None)
        self.napi, self.napi_tid, self.dsr = napi, None, dsr
        self.webs = []

    def set_up(self):
        tb = self.tb
        self.webs = [
            NginxServer(tb.ns(be), tb.backend4(i), tb.backend_port, name=be, log=False)
            for i, be in enumerate(tb.backends)
        ]
        if self.dsr:
            self.webs += [
                NginxServer(tb.ns(be), tb.vip4, tb.service_port, name=be, log=False) for i, be in enumerate(tb.backends)
            ]
        for w in self.webs:
            w.start()
        if self.napi == "threaded":
            self.napi_tid = threaded_napi(tb)

    def tear_down(self):
        failed = []
        for thing in self.webs:
            try:
                thing.close()
            except Exception as e:
                failed.append(str(e))
        return failed

    def run(self, name, loop, connections, rate, duration, threads, sessions=0, services=1):
        return measure(self.tb, self.napi_tid, name, loop, connections, rate, duration, threads, sessions, services)


def threaded_napi(tb) -> int:
    """Give the LB interface's NAPI its own kernel thread, so that the LB's
    receive work (and the XDP program) is time of one thread we can read, and
    return the thread's id. veth delivers through NAPI while the receiver runs
    XDP; for the others it needs GRO on the receiver and no TSO on the sender
    (the switch's port), else it hands packets to the sending CPU's backlog."""
    netns.run(tb.ns(tb.switch), ["ethtool", "-K", tb.lb, "tso", "off"], capture_output=True)
    netns.run(tb.ns(tb.lb), ["ethtool", "-K", "eth0", "gro", "on"], capture_output=True)
    new = metrics.threaded_napi(tb.ns(tb.lb), "eth0")
    if len(new) != 1:
        raise LabError(f"threaded NAPI on eth0 in {tb.ns(tb.lb)}: expected one new kernel thread, found {len(new)}")
    return new[0]


class Usage:
    """CPU of the LB's processes (and NAPI thread, when it has one) and of the
    whole machine over a run; its memory sampled every half second, the peak kept."""

    def __init__(self, peer, napi_tid=None):
        self.peer, self.napi = peer, napi_tid
        self.peak_pss = self.peak_maps = 0
        self._stop = threading.Event()

    def __enter__(self):
        self.pids = self.peer.pids()
        self.t0 = time.monotonic_ns()
        self.busy0 = busy_ticks()
        self.proc0, self.napi0 = on_cpu_ns(self.pids), on_cpu_ns([self.napi] if self.napi else [])
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while True:
            self.peak_pss = max(self.peak_pss, pss_bytes(self.pids))
            self.peak_maps = max(self.peak_maps, self.peer.maps_bytes())
            if self._stop.wait(0.5):
                return

    def __exit__(self, *exc):
        el = time.monotonic_ns() - self.t0
        self.proc = (on_cpu_ns(self.pids) - self.proc0) / el
        self.napi_cores = (on_cpu_ns([self.napi]) - self.napi0) / el if self.napi else math.nan
        busy, steal = busy_ticks()
        self.machine = (busy - self.busy0[0]) * 1e9 / USER_HZ / el
        # a run the hypervisor stole from shows it (this VM's steal swings by tens of percent)
        self.steal = (steal - self.busy0[1]) * 1e9 / USER_HZ / el
        self._stop.set()
        self.thread.join()
        return False


# -- the runs -------------------------------------------------------------------------------------


def fill_options(sessions) -> tuple:
    """A DSR LB's options for a table filled with `sessions` live sessions, with room for the
    run's own (an LRU table evicts before it is full: its free lists are per CPU)."""
    return ("--fill-sessions", str(sessions), "--max-sessions", str(max(SESSIONS, sessions + sessions // 4 + 65536)))


def measure(tb, napi, name, loop, connections, rate, duration, threads, sessions=0, services=1):
    """One run; napi: the NAPI thread's id (--napi threaded) or None; sessions: a DSR
    LB's table filled with that many live sessions first; services: how many it holds."""
    peer = BALANCERS[name](tb, services=services)
    if sessions:
        peer.options = (*peer.options, *fill_options(sessions))
    spaces = {h: tb.ns(h) for h in (tb.client, tb.lb, tb.switch, *tb.backends)}
    with peer:
        before = path_losses(spaces.values())
        with Usage(peer, napi) as use:
            if loop == "closed":
                r = spread(
                    closed_loop, tb.ns(tb.client), peer.targets(), connections, seconds=duration, threads=threads
                )
            else:
                r = spread(open_loop, tb.ns(tb.client), peer.targets(), connections, rate, seconds=duration)
        lost = losses_between(before, path_losses(spaces.values()))
        program = peer.counters()  # the XDP LB's: what its program dropped, by reason
    has_lb = name != "direct"
    row = {
        "lb": name,
        "mode": MODES[name],
        "loop": loop,
        "connections": connections,
        "services": services,
        "sessions": sessions,
        "offered_rps": rate,
        "duration_s": r.seconds,
        "requests": r.requests,
        "errors": r.errors,
        "rps": r.rps,
        **{k: r.percentile(q) for k, q in PERCENTILES.items()},
        "tool": r.tool,
        "lb_proc_cores": use.proc if has_lb else math.nan,
        "lb_napi_cores": use.napi_cores if has_lb else math.nan,
        "machine_cores": use.machine,
        "steal_cores": use.steal,
        "napi": "threaded" if napi else "softirq",
        "lb_pss_mb": use.peak_pss / 2**20 if has_lb and use.pids else math.nan,
        "lb_maps_mb": use.peak_maps / 2**20 if has_lb and use.peak_maps else math.nan,
        # where frames were lost, over the run: every namespace's veths, and what TCP resent
        **{k: sum(c[k] for c in lost.values()) for k in LOSSES},
        "client_retrans": lost[spaces[tb.client]]["tcp_retrans"],
        "lb_retrans": lost[spaces[tb.lb]]["tcp_retrans"],
        "backend_retrans": sum(lost[spaces[b]]["tcp_retrans"] for b in tb.backends),
        "lb_program_drops": program.get("drop", math.nan),
        "lost_at": where_lost(lost, {ns: h for h, ns in spaces.items()}),
    }
    # threaded: the processes and the NAPI thread; softirq: filled in by lb_cpu() once direct has run
    row["lb_cpu_cores"] = row["lb_proc_cores"] + row["lb_napi_cores"] if napi else math.nan
    # nft-lb has neither process nor maps we can read: its memory (conntrack entries) stays empty
    row["lb_mem_mb"] = (
        math.nan
        if math.isnan(row["lb_pss_mb"]) and math.isnan(row["lb_maps_mb"])
        else sum(v for v in (row["lb_pss_mb"], row["lb_maps_mb"]) if not math.isnan(v))
    )
    return row, r.quantiles_ms


def lb_cpu(df):
    """--napi softirq: each LB's CPU in the open loop is the machine's busy
    cores over direct's at the same offered load (the median of direct's runs
    at that load): what the LB adds, wherever the kernel ran it."""
    soft = (df["napi"] == "softirq") & (df["loop"] == "open") & (df["lb"] != "direct")
    base = df[(df["lb"] == "direct") & (df["loop"] == "open")].groupby("load_pct")["machine_cores"].median()
    df.loc[soft, "lb_cpu_cores"] = df.loc[soft, "machine_cores"] - df.loc[soft, "load_pct"].map(base)
    return df


def run(
    lbs,
    loops,
    conns,
    loads,
    trials,
    duration,
    capacity=None,
    open_conns=100,
    threads=2,
    out=None,
    progress=True,
    backends=2,
    napi="softirq",
    floor=None,
    sessions=(0,),
    services=(1,),
):
    """floor: measure_floor()'s, recorded in the sidecar. sessions: the DSR peers' tables filled
    with each of these numbers of live sessions (a variant each; the other peers' tables empty).
    services: the LBs that hold services run with each of these numbers (the others with one)."""
    rows, lat = [], []
    variants = [
        (n, s, k)
        for n in lbs
        for k in (services if n in SERVES_SERVICES else [1])
        for s in (sessions if MODES[n] == "dsr" else [0])
    ]
    need_capacity = "open" in loops and capacity is None
    calibrate = need_capacity and not ("closed" in loops and "direct" in lbs)
    total = trials * len(variants) * (len(conns) * ("closed" in loops) + len(loads) * ("open" in loops))
    bar = Progress(total + calibrate) if progress else None
    rig = LbRig(backends, napi, dsr="tc-dsr" in lbs)

    def one(variant, loop, c, rate, trial, load=None):
        name, filled, held = variant
        row, qs = rig.run(name, loop, c, rate, duration, threads, filled, held)
        row.update(trial=trial, load_pct=load)
        rows.append(row)
        # qs: one latency per QUANTILES, or none when nothing was answered
        lat.extend(
            {
                "lb": name,
                "loop": loop,
                "connections": c,
                "services": held,
                "sessions": filled,
                "offered_rps": rate,
                "load_pct": load,
                "trial": trial,
                "percentile": q,
                "latency_ms": v,
            }
            for q, v in zip(QUANTILES, qs, strict=False)
        )
        if bar:
            what = f"{c} conns" if loop == "closed" else f"{load:g} %"
            more = (f" {held} services" if held > 1 else "") + (f" {filled:,} sessions" if filled else "")
            bar.step(f"{name}{more} {loop} {what} trial {trial}")

    with rig:
        if "closed" in loops:
            for trial, c, v in interleaved(trials, conns, variants):
                one(v, "closed", c, math.nan, trial)
        if need_capacity:
            if calibrate:
                row, _ = rig.run("direct", "closed", max(conns), math.nan, duration, threads)
                capacity = row["rps"]
                if bar:
                    bar.step("direct: capacity")
            else:
                d = pd.DataFrame(rows)
                capacity = d[d["lb"] == "direct"].groupby("connections")["rps"].median().max()
        if "open" in loops:
            for trial, load, v in interleaved(trials, loads, variants):
                one(v, "open", open_conns, capacity * load / 100, trial, load)
    df = lb_cpu(columns_first(rows, COLUMNS))
    params = {
        "lbs": lbs,
        "loops": loops,
        "connections": conns,
        "loads_pct": loads,
        "open_connections": open_conns,
        "capacity_rps": capacity,
        "capacity_measured": need_capacity,
        "trials": trials,
        "duration_s": duration,
        "wrk_threads": threads,
        "backends": len(rig.tb.backends),
        "sessions": list(sessions),
        "services": list(services),
        "closed_loop_tool": "wrk",
        "open_loop_tool": "lab/traffic/openloop.c",
        "napi": napi,
        "cpu": (
            "processes' threads + the LB interface's threaded NAPI kthread, schedstat"
            if napi == "threaded"
            else "open loop: machine busy cores (/proc/stat, steal excluded) minus direct's at that load"
        ),
        "memory": "peak PSS of the processes (0.5 s samples); BPF maps' memlock apart",
        "losses": "per run, every namespace: veth ring drops, XDP_TX errors, interface drops, TCP retransmissions",
        "floor": floor,
    }
    path = write_results(df, "lb", params, out)
    write_results(pd.DataFrame(lat), "lb_latency", params, out, companion_of=path)
    return df, path


def print_summary(df, stream=sys.stdout):
    stream.write(
        "\nmedian over trials [min..max]; CPU in cores; memory in MB: the processes' (PSS) and the\n"
        "BPF maps'; lost: frames veths or other links dropped (a frame may show at both ends),\n"
        "retx: TCP retransmissions (both summed over trials)\n"
    )
    for loop, g in df.groupby("loop", sort=False):
        key = "connections" if loop == "closed" else "load_pct"
        stream.write(
            f"\n{loop} loop\n  {'lb':<11} {key[:5]:>5} {'RPS':>22} {'P50 ms':>7} {'P99 ms':>8} "
            f"{'P99.9 ms':>8} {'errors':>6} {'CPU':>6} {'proc':>5} {'maps':>5} {'lost':>6} {'retx':>6}\n"
        )
        for col, none in (("sessions", 0), ("services", 1)):
            if col not in g:
                g = g.assign(**{col: none})
        for (k, lb, n, held), h in g.groupby([key, "lb", "sessions", "services"], sort=True):
            rps = f"{h['rps'].median():.0f} [{h['rps'].min():.0f}..{h['rps'].max():.0f}]"
            lb = f"{lb} {n / 1e6:g}M" if n >= 1e6 else (f"{lb} {n / 1e3:g}k" if n else lb)
            lb += f" {held}svc" if held > 1 else ""
            lost = int((h["veth_ring_drops"] + h["if_dropped"]).sum())  # xdp_tx_errors: a part of the first
            retx = int((h["client_retrans"] + h["backend_retrans"] + h["lb_retrans"]).sum())
            stream.write(
                f"  {lb:<11} {k:>5g} {rps:>22} {h['p50_ms'].median():7.2f} {h['p99_ms'].median():8.2f} "
                f"{h['p999_ms'].median():8.2f} {int(h['errors'].sum()):>6} "
                f"{h['lb_cpu_cores'].median():6.3f} {h['lb_pss_mb'].median():5.1f} {h['lb_maps_mb'].median():5.1f} "
                f"{lost:>6} {retx:>6}\n"
            )
    d = df[(df["loop"] == "closed") & (df["mode"] == "dsr")] if "sessions" in df else df.iloc[0:0]
    if "sessions" in d and d["sessions"].nunique() > 1:
        for (lb, c), h in d.groupby(["lb", "connections"]):
            med = h.groupby("sessions")["rps"].median()
            small, large = med.index.min(), med.index.max()
            r = med[large] / med[small]
            stream.write(
                f"\n{lb} at {large:,} live sessions / at {small:,}, {c} connections: {r:.2f} of the requests/s "
                f"(target >= 0.90) {'met' if r >= 0.9 else 'MISSED'}\n"
            )
    d = df[df["loop"] == "closed"] if "services" in df else df.iloc[0:0]
    for (lb, c), h in d.groupby(["lb", "connections"]) if "services" in d else ():
        med = h.groupby("services")["rps"].median()
        if len(med) > 1:
            r = med[med.index.max()] / med[med.index.min()]
            stream.write(
                f"{lb} with {med.index.max()} services / with {med.index.min()}, {c} connections: "
                f"{r:.2f} of the requests/s\n"
            )
