"""`python -m lab bench lb-tables`: the load balancer as its tables grow, with no
traffic: what one backend change costs (the Maglev table rebuilt in C and written
where it differs, through the API; the pure-Python reference builder beside it),
what the live table's sweep costs a second with N sessions in the table
(sweep_step() each tick, as `lab lb` runs it, until a whole pass is done), and what
the program costs a packet with S services and N sessions in its tables.

The LB runs in a namespace of its own (DSR: nothing to send, no LB ports), its
session table pre-filled with N live sessions spread over the hash, in one
BPF_MAP_UPDATE_BATCH. Rows: what (change, sweep or packet), size (backends of the
service, or sessions), trial, and times in ms (CPU time of this process for the
sweep). A packet row: the program (at XDP) run by BPF_PROG_TEST_RUN on PACKETS
frames, each once, the kernel timing each run: `established` frames of sessions
drawn at random from the N (a lookup that misses the cache as a busy LB's does),
`syn` frames of new clients (a Maglev pick and a new half-open session); with
`services` services in the tables (the one measured with 2 backends, the others 8
each: 512 services hold 4090 backends), ns per packet as median, mean and p99."""

import argparse
import random
import socket
import struct
import time

import pandas as pd

from ebpf.errors import BpfError
from ebpf.lb.maglev import maglev_table
from ebpf.lb.xdp_lb import XdpLoadBalancer
from ebpf.testrun import run as test_run
from lab import netns
from lab.bench.common import parse_list, run_times, summarize
from lab.metrics import write_results
from lab.topology import Topology
from lab.traffic.frames import tcp_frame

NAME = "lb-tables"
SUMMARY = "the LB's Maglev change and session sweep as backends and sessions grow (no traffic)"
VIP = "198.18.30.100"
EXAMPLES = """\
examples:
  python -m lab bench lb-tables                            # 2..4096 backends, 1k..1M sessions
  python -m lab bench lb-tables --backends 1000 --sessions 1000000 --trials 5
  python -m lab bench lb-tables --backends 2 --services 1,512 --sessions 1000,1000000   # per packet
"""
PACKETS = 20000  # frames a packet row times, each run once
DECOY_BACKENDS = 8  # each other service's


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
    p.add_argument(
        "--services", default="1,512", help="services in the tables for the per-packet rows (default %(default)s)"
    )
    p.add_argument("--packets", type=int, default=PACKETS, help="frames a per-packet row times (default %(default)s)")
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
    services = parse_list(args.services, int, what="service count")
    if any(not 1 <= n <= 4096 for n in services):
        raise ValueError("--services: 1 to 4096 each")
    if args.trials < 1:
        raise ValueError("--trials must be at least 1")
    if not 100 <= args.packets <= 1_000_000:
        raise ValueError("--packets: 100 to 1000000")
    return backends, sessions, services


def names(n, offset=0):
    return [
        f"198.{18 + (offset + i) // 65536}.{(offset + i) // 256 % 256}.{(offset + i) % 256 + 0}:8080" for i in range(n)
    ]


def fill(lb, n):
    """n live established sessions, distinct clients spread over the hash (the API's, for benchmarks)."""
    lb.fill_sessions(n)


def run(backends, sessions, trials, reference=False, out=None, services=(1,), packets=PACKETS):
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
        for n in sessions:
            for s in services:
                rows += packet_rows(t, n, s, trials, packets)
    df = pd.DataFrame(rows)
    params = {
        "backends": backends,
        "sessions": sessions,
        "services": services,
        "trials": trials,
        "reference": reference,
        "packets": packets,
        "packet_hook": "XDP (BPF_PROG_TEST_RUN, each frame run once, the kernel's time per run)",
    }
    return df, write_results(df, "lb_tables", params, out)


def session_client(i):
    """The client address and port of fill()'s i-th session, as the packet carries them."""
    a, cport = 0x0A000000 + i // 50000, 1024 + i % 50000  # fill() writes them into the key as they are
    return socket.inet_ntoa(struct.pack("<I", a)), struct.unpack("!H", struct.pack("<H", cport))[0]


def packet_rows(t, n, services, trials, packets=PACKETS) -> list:
    """The program's time a packet with `services` services and n sessions in its tables."""
    ns = t.ns("lb")
    with netns.ipr(ns) as ip:
        ifindex = ip.link_lookup(ifname="eth0")[0]
    total = 2 + DECOY_BACKENDS * (services - 1)
    lb = XdpLoadBalancer(
        mode="dsr",
        netns=ns,
        max_services=max(64, services),
        max_sessions=n + n // 4 + 1024 + trials * packets,
        max_half_open=trials * packets + 1024,
        max_backends=total + 1,
    )
    lb.compile_in = "child"
    rows = []
    # the measured service's two backends on the LB's segment, their neighbours known (DSR
    # sends a frame to its backend's MAC: one it had to resolve would leave to the kernel),
    # and forwarding on, as `lab lb` at XDP asks of a host (bpf_fib_lookup() wants it)
    measured = [f"198.18.30.{10 + i}:80" for i in range(2)]
    netns.sysctl(ns, "net.ipv4.conf.eth0.forwarding", 1)
    for i in range(2):
        mac = f"02:00:00:00:30:{10 + i:02x}"
        t.run("lb", ["ip", "neigh", "replace", f"198.18.30.{10 + i}", "lladdr", mac, "dev", "eth0", "nud", "permanent"])
    try:
        svc = lb.add_service(f"tcp:{VIP}:80")
        lb.set_backends(svc, dict.fromkeys(measured, 1))
        for k in range(1, services):
            decoy = lb.add_service(f"tcp:198.18.{32 + k // 250}.{k % 250 + 1}:80")
            lb.set_backends(decoy, dict.fromkeys(names(DECOY_BACKENDS, offset=2 + DECOY_BACKENDS * (k - 1)), 1))
        fd = lb.load_program().fd
        fill(lb, n)
        dst, src = (
            bytes.fromhex(t.mac("lb", "eth0").replace(":", "")),
            bytes.fromhex(t.mac("peer", "eth0").replace(":", "")),
        )
        rng = random.Random(n * 7919 + services)
        for trial in range(trials):
            for kind in ("established", "syn"):
                frames = []
                for j in range(packets):
                    if kind == "established":
                        client, cport = session_client(rng.randrange(n))
                        flags = 0x10  # ACK
                    else:  # a client of 10.200.0.0/16 and up: no session of fill()'s
                        k = trial * packets + j
                        client, cport = f"10.{200 + k // 65536 % 50}.{k // 256 % 256}.{k % 256}", 40000 + k % 20000
                        flags = 0x02  # SYN
                    frames.append(tcp_frame(dst, src, client, cport, VIP, 80, flags))
                before = lb.counters()
                times = []
                with netns.entered(ns):
                    for f in frames:
                        r = test_run(fd, f, ingress_ifindex=ifindex)
                        if r.verdict != "XDP_TX":
                            c = {k: v for k, v in lb.counters().items() if v and k.startswith("dropped")}
                            raise BpfError(f"a {kind} frame came back {r.verdict}, not sent to its backend {c}")
                        times.append(r.duration_ns)
                after = lb.counters()
                key = "established" if kind == "established" else "new_sessions"
                if kind == "syn" and after[key] - before[key] != packets:
                    raise BpfError(f"{after[key] - before[key]} new sessions for {packets} SYNs")
                rows.append(
                    {
                        "what": "packet",
                        "size": n,
                        "services": services,
                        "backends": total,
                        "kind": kind,
                        "trial": trial,
                        **run_times(times),
                    }
                )
    finally:
        lb.close()
    return rows


def main(args):
    backends, sessions, services = check(args)
    df, path = run(backends, sessions, args.trials, args.reference, args.out, services, args.packets)
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
    part = df[df["what"] == "packet"]
    if not part.empty:
        s = summarize(part, ["kind", "services", "size"], ["ns_median", "ns_p99"])
        print("\npacket (ns, the program's run; size: sessions):")
        print(s.to_string())
        for kind in ("established", "syn"):
            k = part[part["kind"] == kind].groupby(["services", "size"])["ns_median"].median()
            small, large = k.iloc[0], k.loc[(k.index.get_level_values(0).max(), k.index.get_level_values(1).max())]
            ok = "met" if large <= 1.2 * small else "MISSED"
            print(
                f"  {kind}: largest {large:.0f} ns / smallest {small:.0f} ns = "
                f"{large / small:.2f} (target <= 1.20) {ok}"
            )
    print(f"\nwrote {path} and {path.with_suffix('.json').name}")
    return 0
