"""`python -m lab bench pods-tables`: the pods datapath's time a packet to a service as the
services grow, with no traffic: the program a pod's packets meet (at its host-side veth,
TC) run by BPF_PROG_TEST_RUN on frames from a pod to services drawn at random from the N
on the node, each frame once, the kernel timing each run.

One node's namespace as a CNI leaves it (a pod behind its host-side veth with a host
route, an uplink to another node that holds the other pods' prefix, its neighbour
known), N services of two backends each on the other node. Per size and trial two
rows: `new` (a flow's first packet: the service's lookup, a backend picked by the flow's
hash, the flow's NAT entry and its reverse written) and `established` (the same flows'
next packets: the NAT entry found). A frame not redirected to its backend fails the row."""

import argparse
import ctypes
import random

import pandas as pd

from ebpf import maps, testrun
from ebpf.errors import BpfError
from ebpf.pods.tc_pods import TcPods
from lab import netns
from lab.bench.common import parse_list, run_times, summarize
from lab.metrics import write_results
from lab.topology import Topology
from lab.traffic.frames import tcp_frame

NAME = "pods-tables"
SUMMARY = "the pods datapath's time a packet to a service as the services grow (no traffic)"
EXAMPLES = """\
examples:
  python -m lab bench pods-tables                             # 1..16384 services, 3 trials
  python -m lab bench pods-tables --services 1,10000 --packets 50000
"""
POD, UP, PEER = "198.18.100.1", "198.18.99.1", "198.18.99.2"
BACKENDS = ("198.18.101.5:8080", "198.18.101.6:8080")  # the other node's pods
PACKETS = 20000  # flows a row times, each frame run once
TC_ACT_REDIRECT = 7


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = (
        __doc__.split("\n\n")[0],
        EXAMPLES,
        argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--services", default="1,100,1000,10000,16384", help="services on the node (default %(default)s)")
    p.add_argument("--packets", type=int, default=PACKETS, help="flows a row times (default %(default)s)")
    p.add_argument("--trials", type=int, default=3, help="default %(default)s")
    p.add_argument("--out", help="where the CSV goes (default datasets/results)")


def check(args):
    services = parse_list(args.services, int, what="service count")
    if any(not 1 <= n <= 16384 for n in services):
        raise ValueError("--services: 1 to 16384 each (the datapath's default --max-services)")
    if not 100 <= args.packets <= 60000:
        raise ValueError("--packets: 100 to 60000 (a flow each: the NAT table holds 65536)")
    if args.trials < 1:
        raise ValueError("--trials must be at least 1")
    return services


def vip(k) -> str:
    return f"198.19.{k // 250}.{k % 250 + 1}"


def node():
    t = Topology("podtab")
    t.add_host("node", forwarding=True)  # bpf_fib_lookup() answers only where forwarding is on
    t.add_host("pod1")
    t.add_host("peer")
    t.add_link("node", "pod1", a_if="lxc1", a_addrs=[], b_addrs=[f"{POD}/32"])
    t.add_link("node", "peer", a_addrs=[f"{UP}/24"], b_addrs=[f"{PEER}/24"])
    return t


def rows_at(t, n, trial, packets, rng) -> list:
    p = TcPods(netns=t.ns("node"))
    p.add_pod("lxc1", [POD], mac=t.mac("pod1", "eth0"))
    p.add_remote("198.18.101.0/24")
    try:
        for k in range(n):
            p.add_service(vip(k), 80, "tcp", list(BACKENDS))
        p.load_program()
        src, dst = (
            bytes.fromhex(t.mac("pod1", "eth0").replace(":", "")),
            bytes.fromhex(t.mac("node", "lxc1").replace(":", "")),
        )
        to = [vip(rng.randrange(n)) for _ in range(packets)]  # flow j's service, the same for both its packets
        frames = [
            tcp_frame(dst, src, POD, 1024 + j, to[j], 80, flags) for flags in (0x02, 0x10) for j in range(packets)
        ]
        ifindex = t.ifindex("node", "lxc1")
        rows = []
        nat, flows = p.table("nat"), None
        with netns.entered(t.ns("node")):
            fd = p.load("pods_from_pod", "SCHED_CLS").fd
            for kind, part in (("new", frames[:packets]), ("established", frames[packets:])):
                before = p.service_counters()
                times = []
                for f in part:
                    r = testrun.run(fd, f, ingress_ifindex=ifindex, xdp=False)
                    if r.retval != TC_ACT_REDIRECT:
                        raise BpfError(f"a {kind} frame came back {r.verdict}, not redirected to its backend")
                    times.append(r.duration_ns)
                sent = p.service_counters()["to_backend"] - before["to_backend"]
                if sent != packets:
                    raise BpfError(f"{sent} frames translated of {packets}")
                entries = maps.count_hash(nat.map_fd, ctypes.sizeof(nat.Key), ctypes.sizeof(nat.Leaf))
                if kind == "established" and entries != flows:  # each its flow's: no entry new
                    raise BpfError(f"the established frames left {entries} NAT entries, not {flows}")
                flows = entries
                rows.append(
                    {
                        "services": n,
                        "kind": kind,
                        "trial": trial,
                        **run_times(times),
                    }
                )
        return rows
    finally:
        p.close()


def run(services, trials, packets=PACKETS, out=None):
    rows = []
    rng = random.Random(1)
    with node() as t:
        t.run("peer", ["ip", "route", "add", "198.18.101.0/24", "dev", "lo"])
        t.run("node", ["ip", "route", "add", f"{POD}/32", "dev", "lxc1"])
        t.run("node", ["ip", "route", "add", "198.18.101.0/24", "via", PEER])
        for trial in range(trials):
            for n in services if trial % 2 == 0 else services[::-1]:  # sizes in turn, each trial's order reversed
                rows += rows_at(t, n, trial, packets, rng)
    df = pd.DataFrame(rows)
    params = {
        "services": services,
        "trials": trials,
        "packets": packets,
        "how": "BPF_PROG_TEST_RUN of pods_from_pod (TC) on a node's namespace, each frame once, the kernel's time",
    }
    return df, write_results(df, "pods_tables", params, out)


def target_lines(df) -> list[str]:
    out = []
    for kind in ("new", "established"):
        k = df[df["kind"] == kind].groupby("services")["ns_median"].median()
        small, large = k.iloc[0], k.iloc[-1]
        ok = "met" if large <= 1.2 * small else "MISSED"
        out.append(
            f"  {kind}: at {k.index[-1]} services {large:.0f} ns / at {k.index[0]} {small:.0f} ns = "
            f"{large / small:.2f} (target <= 1.20) {ok}"
        )
    return out


def main(args):
    services = check(args)
    df, path = run(services, args.trials, args.packets, args.out)
    print("median over trials [min..max], ns a packet (the program's run)")
    print(summarize(df, ["kind", "services"], ["ns_median", "ns_p99"]).to_string())
    print("\n".join(["", "targets (medians):", *target_lines(df)]))
    print(f"\nwrote {path} and {path.with_suffix('.json').name}")
    return 0
