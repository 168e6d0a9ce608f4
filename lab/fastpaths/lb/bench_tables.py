"""`python -m lab bench lb-tables`: the load balancer's control plane as its tables
grow, with no traffic: what one backend change costs (the Maglev table rebuilt in C
and written where it differs, through the API; the pure-Python reference builder
beside it), and what the live table's sweep costs a second with N sessions in the
table (sweep_step() each tick, as `lab lb` runs it, until a whole pass is done).

The LB runs in a namespace of its own (DSR at TC: nothing to send, no LB ports),
its session table pre-filled with N live sessions spread over the hash, in one
BPF_MAP_UPDATE_BATCH. Rows: what (change or sweep), size (backends of the service,
or sessions), trial, and times in ms (CPU time of this process for the sweep)."""

import argparse
import ctypes
import os
import time

import pandas as pd

from ebpf.errors import BpfError
from ebpf.lb.maglev import maglev_table
from ebpf.lb.xdp_lb import XdpLoadBalancer
from ebpf.testrun import libbpf
from lab.bench.common import parse_list, summarize
from lab.metrics import write_results
from lab.topology import Topology

NAME = "lb-tables"
SUMMARY = "the LB's Maglev change and session sweep as backends and sessions grow (no traffic)"
VIP = "198.18.30.100"
EXAMPLES = """\
examples:
  python -m lab bench lb-tables                            # 2..4096 backends, 1k..1M sessions
  python -m lab bench lb-tables --backends 1000 --sessions 1000000 --trials 5
"""


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = (
        __doc__.split("\n\n")[0],
        EXAMPLES,
        argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--backends", default="2,100,1000,4096", help="backends of the changed service (default %(default)s)"
    )
    p.add_argument("--sessions", default="1000,100000,1000000", help="live sessions in the table (default %(default)s)")
    p.add_argument("--trials", type=int, default=3, help="default %(default)s")
    p.add_argument("--reference", action="store_true", help="also time the pure-Python Maglev builder (slow)")
    p.add_argument("--out", help="where the CSV goes (default datasets/results)")


def check(args):
    backends = parse_list(args.backends, int, what="backend count")
    sessions = parse_list(args.sessions, int, what="session count")
    if any(not 2 <= b <= 65535 for b in backends):
        raise ValueError("--backends: 2 to 65535 each (a change removes one)")
    if any(not 1 <= s <= 1 << 24 for s in sessions):
        raise ValueError("--sessions: 1 to 16777216 each")
    if args.trials < 1:
        raise ValueError("--trials must be at least 1")
    return backends, sessions


def names(n, offset=0):
    return [
        f"198.{18 + (offset + i) // 65536}.{(offset + i) // 256 % 256}.{(offset + i) % 256 + 0}:8080" for i in range(n)
    ]


def fill(lb, n):
    """n live established sessions, distinct clients spread over the hash, one batch write."""
    t = lb.table("sessions")
    keys, values = (t.Key * n)(), (t.Leaf * n)()
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    sid = lb._services[lb.services[0]]
    for i in range(n):
        k, v = keys[i], values[i]
        k.client.a[0], k.cport, k.service, k.proto = 0x0A000000 + i // 50000, 1024 + i % 50000, sid, 6
        v.backend, v.state, v.last_seen = 1 + i % 2, 2, now
    count = ctypes.c_uint32(n)
    err = libbpf().bpf_map_update_batch(t.map_fd, keys, values, ctypes.byref(count), None)
    if err or count.value != n:
        raise BpfError(f"filling the session table: {os.strerror(-err) if err else f'{count.value} of {n}'}")


def run(backends, sessions, trials, reference=False, out=None):
    rows = []
    t = Topology("lbtab")
    t.add_host("lb")
    t.add_host("peer")
    t.add_link("lb", "peer", a_addrs=["198.18.30.1/24"], b_addrs=["198.18.30.2/24"])
    with t:
        ns = t.ns("lb")
        for n in sessions:
            # room beyond n: an LRU table evicts before it is full (its free lists are per CPU)
            lb = XdpLoadBalancer(mode="dsr", netns=ns, max_sessions=n + n // 4 + 1024, max_backends=max(backends) + 1)
            lb.compile_in = "child"
            try:
                svc = lb.add_service(f"tcp:{VIP}:80")
                lb.set_backends(svc, dict.fromkeys(names(2), 1))
                lb.load_program()
                fill(lb, n)
                for trial in range(trials):
                    ticks, cpu = 0, 0.0
                    while True:
                        c0 = time.process_time()
                        done = lb.sweep_step()
                        cpu += time.process_time() - c0
                        ticks += 1
                        if done is not None:
                            break
                    if sum(done.values()) != n:  # the pass missed or double-counted some: no time to report
                        raise BpfError(f"the sweep counted {sum(done.values())} of {n} live sessions")
                    rows.append(
                        {"what": "sweep", "size": n, "trial": trial, "ticks": ticks, "ms_per_tick": 1e3 * cpu / ticks}
                    )
            finally:
                lb.close()
        lb = XdpLoadBalancer(mode="dsr", netns=ns, max_backends=max(backends) + 1)
        lb.compile_in = "child"
        try:
            svc = lb.add_service(f"tcp:{VIP}:80")
            lb.load_program()
            for b in backends:
                full = dict.fromkeys(names(b), 1)
                lb.set_backends(svc, full)
                for trial in range(trials):
                    less = dict(list(full.items())[: b - 1 - trial % 2] + list(full.items())[b - trial % 2 :])
                    t0 = time.perf_counter()
                    slots = lb.set_backends(svc, less)
                    ms = 1e3 * (time.perf_counter() - t0)
                    lb.set_backends(svc, full)
                    row = {"what": "change", "size": b, "trial": trial, "ms": ms, "slots_written": slots}
                    if reference:
                        t0 = time.perf_counter()
                        maglev_table({n: 1 for n in less})
                        row["reference_ms"] = 1e3 * (time.perf_counter() - t0)
                    rows.append(row)
        finally:
            lb.close()
    df = pd.DataFrame(rows)
    params = {"backends": backends, "sessions": sessions, "trials": trials, "reference": reference}
    return df, write_results(df, "lb_tables", params, out)


def main(args):
    backends, sessions = check(args)
    df, path = run(backends, sessions, args.trials, args.reference, args.out)
    print("median over trials [min..max]")
    for what, unit, cols in (
        ("change", "ms a change", ["ms", "reference_ms"]),
        ("sweep", "ms a tick", ["ms_per_tick"]),
    ):
        part = df[df["what"] == what]
        if part.empty:
            continue
        s = summarize(part, ["size"], [c for c in cols if c in part])
        print(f"\n{what} ({unit}):")
        print(s.to_string())
    print(f"\nwrote {path} and {path.with_suffix('.json').name}")
    return 0
