"""python -m lab bench pods: the Cilium/SmartNIC note's first experiment (pods on two
nodes sending to each other, CPU against traffic) on two nodes of namespaces, with
the ways of connecting pods the lab compares (lab.fastpaths.pods.peers), and the
request/response and service measurements a pod datapath is judged by."""

import argparse
import contextlib
import os
import sys
import time

from ebpf.holders import maps_memlock
from lab.bench import common
from lab.cgroups import MemoryCgroup
from lab.fastpaths.pods.peers import PEERS
from lab.fastpaths.pods.testbed import pods_testbed
from lab.metrics import CpuSampler, write_results
from lab.netns import LabError
from lab.traffic.iperf import Iperf3
from lab.traffic.rr import RrServer, request_response

NAME = "pods"
SUMMARY = "pod to pod: Gbit/s and CPU per Gbit/s, TCP_RR latency, service connections/s"
DESCRIPTION = """\
Two nodes of pods (network namespaces on veths, a host route each, the nodes joined
by a veth underlay), connected each way the lab compares, in interleaved trials:
  stream    iperf3 TCP from a pod to a pod, 1 stream and 10 in parallel (the note ran 10
            netperf instances), same node and across, IPv4 and IPv6: Gbit/s, and the
            machine's CPU (%usr, %sys, %soft, over both nodes: they share one kernel)
            per Gbit/s. `host` runs node to node with no pods: the limit
  rr        TCP_RR across nodes: one byte each way on one connection (rr.c): transactions
            per second and latency percentiles, beside the peer redirect's commit
            (bpf_redirect() 122 us, bpf_redirect_peer() 44 us)
  services  TCP_CRR (a new connection per transaction) from a pod to a service with
            backends on both nodes, with 1 and 100 services: translated at connect()
            (the eBPF datapath's cgroup programs), per packet at the pod's veth (eBPF),
            by kube-proxy's nftables rules (legacy) and by its iptables rules (both of
            Debian's backends); to the service kube-proxy writes last (its worst case)
            and to the one it writes first. Each way's services are built once per
            size (build_s, memory_kib), then its trials run; after each, one service
            is added and removed again as that way does it (add_one_ms, remove_one_ms)
Every pod runs on the tunnel-ready testbed (pods' MTU 1450) so that all ways see the
same pods; `host` is the underlay's 1500."""
EXAMPLES = """\
examples:
  python -m lab bench pods                                  # everything, 3 trials (about 20 minutes)
  python -m lab bench pods --experiments rr --peers legacy,ebpf,ebpf-redirect
  python -m lab bench pods --experiments stream --parallel 1 --families 4 --trials 1 --duration 1   # a smoke test
  python -m lab bench pods -i hosts.yml --experiments stream,rr   # on your own machines (group nodes, docs/hosts.md)
"""
EXPERIMENTS = ("stream", "rr", "services")
STREAM_PEERS = ("host", "legacy", "bridge-vxlan", "ebpf", "ebpf-vxlan")
RR_PEERS = ("host", "legacy", "bridge-vxlan", "ebpf-redirect", "ebpf", "ebpf-vxlan")
# a service's translation -> its peer
WAYS = {
    "connect": "ebpf",
    "per-packet": "ebpf",
    "nft": "legacy",
    "iptables-legacy": "iptables-legacy",
    "iptables-nft": "iptables-nft",
}
HOSTS_REFUSE = ("iptables-legacy", "iptables-nft")  # ways -i runs refuse: they write the host's nat table
RR_PORT, IPERF_PORT = 7100, 5201
VIP, VIP6 = "198.18.200.10", "2001:2:200::10"
VIP_FIRST = "198.18.200.11"  # the service kube-proxy writes first (VIP: the one it writes last)
COLUMNS = ["experiment", "peer", "way", "path", "family", "parallel", "services", "position", "trial", "gbps", "tps"]
# of an eBPF peer's counters, each node's in a hosts run's rows (all of them: its runner's
# result.json there); connect and to_backend: where a service was translated
DATAPATH_COUNTERS = ("seen", "redirect", "pass", "drop", "local_pod", "remote_pod", "tunneled", "connect", "to_backend")


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    common.add_options(p, trials=3, duration=3.0, peers=tuple(PEERS))
    p.add_argument("--experiments", default=",".join(EXPERIMENTS), help="any of %(default)s")
    p.add_argument("--parallel", default="1,10", help="stream: parallel TCP streams (default %(default)s)")
    p.add_argument("--families", default="4,6", help="stream: IP versions (default %(default)s)")
    p.add_argument("--paths", default="same-node,across", help="stream: where the receiving pod is")
    p.add_argument("--services", default="1,100", help="services: how many services exist (default %(default)s)")
    p.add_argument(
        "--ways",
        help="services: how a service is translated, any of " + ",".join(WAYS) + " (default: all; with -i, "
        "all but the iptables ones, which write a host's own nat table)",
    )
    p.add_argument(
        "-i",
        "--inventory",
        metavar="FILE",
        help="run on the hosts an Ansible inventory names (group nodes: two or more, each with its lab_iface; "
        "docs/hosts.md; every experiment and peer, under device and table names no CNI or kube-proxy uses) "
        "(default: namespaces on this machine)",
    )


def main(a):
    peers, _ = common.checked_options(a, tuple(PEERS))
    experiments = common.parse_list(a.experiments, str, EXPERIMENTS, "experiment")
    parallel = common.parse_list(a.parallel, int, what="stream count")
    families = common.parse_list(a.families, int, (4, 6), "family")
    paths = common.parse_list(a.paths, str, ("same-node", "across"), "path")
    counts = common.parse_list(a.services, int, what="service count")
    host_ways = tuple(w for w in WAYS if w not in HOSTS_REFUSE)
    ways = common.parse_list(a.ways or ",".join(host_ways if a.inventory else WAYS), str, tuple(WAYS), "way")
    if a.inventory and (refused := [w for w in ways if w in HOSTS_REFUSE]):
        raise ValueError(
            f"--ways {','.join(refused)}: on this machine's namespaces only (kube-proxy's iptables rules would "
            "go into the hosts' own nat tables)"
        )
    if any(not 1 <= n <= 64 for n in parallel):
        raise ValueError("--parallel: 1..64 streams")
    if any(not 1 <= n <= 16384 for n in counts):
        raise ValueError("--services: 1..16384 services")
    df, path = run(
        peers, experiments, parallel, families, paths, counts, ways, a.trials, a.duration, a.out, inventory=a.inventory
    )
    print_summary(df)
    print(f"\nwrote {path} and {path.with_suffix('.json').name}")
    return 0


def cpu_of(sampler, gbps=None) -> dict:
    """A run's CPU: percent of all cores by kind, busy cores, and Gbit/s per busy core."""
    s = sampler.summary().loc["all"]
    busy_cores = s["busy_ns"] / 1e9 / sampler.seconds if sampler.seconds else 0.0
    return {
        "usr_pct": round(s["usr"], 2),
        "sys_pct": round(s["sys"], 2),
        "soft_pct": round(s["soft"], 2),
        "busy_cores": round(busy_cores, 3),
        "gbps_per_core": round(gbps / busy_cores, 3) if busy_cores and gbps is not None else None,
    }


SERVICE_BACKENDS = ("p01", "p10")  # a service's backends: one pod on each node


def services(tb, n):
    """n services: VIP_FIRST first (when n > 1) and VIP last, the two measured; the others'
    addresses are decoys, as a cluster's other services are to these ones' lookup."""
    backends = [f"{tb.pod4(b)}:{RR_PORT}" for b in SERVICE_BACKENDS]
    first = [(VIP_FIRST, 80, "tcp", backends)] if n > 1 else []
    out = [(f"198.19.{i // 250}.{i % 250 + 1}", 80, "tcp", backends) for i in range(n - 1 - len(first))]
    return first + out + [(VIP, 80, "tcp", backends)]


def _keys(variant, trial) -> dict:
    """A row's first columns: what the run was (a variant of _variants) and its trial."""
    keys = ("experiment", "peer", "way", "path", "family", "parallel", "services")
    return {**dict(zip(keys, variant, strict=True)), "trial": trial}


def _variants(peers, experiments, parallel, families, paths, counts, ways) -> list:
    variants = []
    if "stream" in experiments:
        variants += [
            ("stream", p, None, path, fam, par, None)
            for p in peers
            if p in STREAM_PEERS
            for path in paths
            if not (p == "host" and path == "same-node")  # no pods: node to node only
            for fam in families
            for par in parallel
        ]
    if "rr" in experiments:
        variants += [("rr", p, None, "across", 4, 1, None) for p in peers if p in RR_PEERS]
    if "services" in experiments:
        variants += [("services", WAYS[w], w, "mixed", 4, 1, n) for w in ways if WAYS[w] in peers for n in counts]
    if not variants:
        raise ValueError("nothing to run: no peer of --peers takes part in --experiments")
    return variants


def run(
    peers,
    experiments,
    parallel,
    families,
    paths,
    counts,
    ways,
    trials,
    duration,
    out=None,
    progress=True,
    inventory=None,
):
    """The sweep; returns (DataFrame, CSV path). inventory: an Ansible inventory's path,
    the sweep on the nodes it names (run_on_hosts)."""
    if inventory is not None:
        return run_on_hosts(
            inventory, peers, experiments, parallel, families, paths, trials, duration, out, progress, counts, ways
        )
    variants = _variants(peers, experiments, parallel, families, paths, counts, ways)
    plain = [v for v in variants if v[0] != "services"]
    tb = pods_testbed(tunnel=True)
    bar = common.Progress(trials * len(variants)) if progress else None
    rows = []
    with tb, contextlib.ExitStack() as servers:
        # the request-response servers: each closed whatever fails after it started (one
        # that could not start leaves the others to this stack, not to the namespaces' end)
        for ns in (tb.ns(b) for b in SERVICE_BACKENDS):
            servers.enter_context(RrServer(ns, RR_PORT))
        servers.enter_context(RrServer(tb.ns(tb.nodes[1]), RR_PORT + 1))  # host: node to node
        for trial, _, v in common.interleaved(trials, [0], plain):
            experiment, name, way, path, fam, par, n = v
            peer = PEERS[name](tb)
            peer.attach()
            try:
                row = _keys(v, trial)
                if experiment == "stream":
                    row.update(_stream(tb, name, path, fam, par, duration))
                else:
                    row.update(_rr(tb, name, duration))
                rows.append(row)
            finally:
                peer.detach()
            if bar:
                bar.step(f"{experiment} {name} {way or ''} {path} v{fam} x{par} t{trial}")
        rows += service_blocks(tb, [v for v in variants if v[0] == "services"], trials, duration, bar)
    df = common.columns_first(rows, COLUMNS)
    params = {
        "peers": peers,
        "experiments": experiments,
        "parallel": parallel,
        "families": families,
        "paths": paths,
        "services": counts,
        "ways": ways,
        "trials": trials,
        "duration_s": duration,
        "pod_mtu": 1450,
        "services_order": "per size, each way's services built once and its trials run in a block; "
        "the ways of a size one after another, starting with another way at each size",
        "cpu": "the whole machine's /proc/stat over the run: both nodes and every pod share one kernel",
    }
    return df, write_results(df, "pods", params, out)


def run_on_hosts(
    inventory,
    peers,
    experiments,
    parallel,
    families,
    paths,
    trials,
    duration,
    out=None,
    progress=True,
    counts=(1, 100),
    ways=tuple(WAYS),
):
    """The sweep on the nodes an Ansible inventory names (group nodes, two or more; the
    first drives each run): each node's side built by its runner for the run
    (lab.fastpaths.pods.hosts), on its lab_iface as the underlay, with the addresses
    the inventory gives (lab_addresses, lab_addresses6) or the lab's. Returns
    (DataFrame, CSV path); a host's failure raises after the rows of every finished run
    are written (lab.hosts.bench)."""
    from lab.hosts import Hosts  # noqa: PLC0415 -- Ansible: only for a bench on hosts
    from lab.hosts import bench as hosts_bench  # noqa: PLC0415
    from lab.hosts.inventory import InventoryError  # noqa: PLC0415

    variants = _variants(peers, experiments, parallel, families, paths, counts, ways)
    hosts = Hosts(inventory)
    inv = hosts.inventory
    nodes = inv.roles(NAME)["nodes"]
    report = hosts.check(NAME)
    if not report.ok:
        raise InventoryError("the hosts are not ready (nothing was started): " + " | ".join(report.problems()))
    if 6 in families:
        off = [h.name for h in nodes if not report.facts[h.name].get("ipv6_forwarding")]
        if off:
            raise InventoryError(
                f"{', '.join(off)}: IPv6 forwarding is off (net.ipv6.conf.all.forwarding=0), and the pods' IPv6 "
                "crosses each node as a router (the lab leaves the host's forwarding as it is); fix: sysctl -w "
                "net.ipv6.conf.all.forwarding=1 there (a Kubernetes node has it on), or --families 4"
            )
    net4 = hosts_bench.test_addresses(inv, nodes[0])
    net6 = hosts_bench.test_addresses(inv, nodes[0], "lab_addresses6", hosts_bench.DEFAULT_NET6)
    names = [f"n{i}" for i in range(len(nodes))]
    host_of = dict(zip(names, (h.name for h in nodes), strict=True))
    underlay = {n: [str(net4[i + 1]), str(net6[i + 1])] for i, n in enumerate(names)}
    iface = {n: h.iface("nodes") for n, h in zip(names, nodes, strict=True)}
    deadline = hosts_bench.START_MARGIN + duration + hosts_bench.STOP_MARGIN + 30
    runs, variant_of = [], {}
    for trial, _, v in common.interleaved(trials, [0], variants):
        experiment, name, way, path, fam, par, n = v
        label = f"{experiment} {name} {way + ' ' if way else ''}{path} v{fam} x{par} t{trial}"
        if experiment == "services":  # p00 to the service; its backends, one on each node, serve
            client, server = "p00", None
        elif name == "host":
            client, server = "n0", "n1"
        else:
            client, server = "p00", ("p01" if path == "same-node" else "p10")
        base = {
            "bench": NAME,
            "role": "node",
            "deadline_s": deadline,
            "underlay": underlay,
            "peer": name,
            "experiment": experiment,
            "family": fam,
            "parallel": par,
            "duration": duration,
            "client": client,
            "server": server,
            "way": way,
            "services": n,
        }
        specs = {n: {**base, "node": n, "iface": iface[n], "driver": n == "n0"} for n in names}
        runs.append((label, specs))
        variant_of[label] = (trial, v)

    def make_row(label, results):
        trial, variant = variant_of[label]
        experiment = variant[0]
        drove = results["n0"]
        if drove.get("report") is None:
            raise ValueError(f"{label}: the client never ran (its runner's deadline passed)")
        row = {
            **_keys(variant, trial),
            **{k: v for k, v in drove["report"].items() if k not in ("received_bytes", "received_seconds")},
            "place": "hosts",
        }
        busy, kinds, cores = 0.0, dict.fromkeys(("usr", "sys", "soft"), 0.0), 0
        for node, said in sorted(results.items()):  # each node's CPU over its own window
            row[f"{node}_host"] = host_of[node]
            row[f"{node}_window_s"] = said.get("window_s")
            for k, v in (said.get("cpu") or {}).items():
                if k != "gbps_per_core":
                    row[f"{node}_{k}"] = v
            busy += (said.get("cpu") or {}).get("busy_cores") or 0.0
            n_cpus = report.facts[host_of[node]].get("cpus") or 0
            cores += n_cpus
            for k in kinds:  # cores of each kind on this node
                kinds[k] += ((said.get("cpu") or {}).get(f"{k}_pct") or 0.0) / 100.0 * n_cpus
            datapath = said.get("datapath") or {}
            for k in DATAPATH_COUNTERS if datapath else ():  # what the eBPF datapath did there
                row[f"{node}_{k}"] = datapath.get(k)
        row["busy_cores"] = round(busy, 3)  # the nodes' together: each its own cores (here: the one machine's)
        for k, used in kinds.items():  # percent of all the nodes' cores, as a namespace run's of the machine's
            row[f"{k}_pct"] = round(100.0 * used / cores, 2) if cores else None
        if experiment == "stream":
            row["gbps_per_core"] = round(row["gbps"] / busy, 3) if busy else None
        return row

    prepare = {
        host_of[n]: [
            {
                "iface": iface[n],
                "addresses": [f"{underlay[n][0]}/{net4.prefixlen}", f"{underlay[n][1]}/{net6.prefixlen}"],
                # the pods' IPv4 from the other nodes is forwarded where it comes in (per device)
                "sysctls": {"net/ipv4/conf/{}/forwarding": 1},
            }
        ]
        for n in names
    }
    sweep = hosts_bench.Sweep(NAME, runs, make_row, duration, meta={"csv_name": "pods", "facts": report.facts})
    sweep.driver = "n0"
    params = {
        "peers": list(peers),
        "experiments": list(experiments),
        "parallel": parallel,
        "families": families,
        "paths": paths,
        "services": list(counts),
        "ways": list(ways),
        "trials": trials,
        "duration_s": duration,
        "pod_mtu": 1450,
        "services_order": "per size, each way's services built once and its trials run in a block; "
        "the ways of a size one after another, starting with another way at each size",
        "inventory": str(inv.path),
        "nodes": host_of,
        "underlay": underlay,
        "cpu": "each node's own /proc/stat over its own window (n*_ columns); busy_cores: the nodes' sum. "
        "On namespaces as hosts every node is the one machine, whose CPU each then reports",
    }
    bar = common.Progress(len(runs)) if progress else None
    rows, path, failure = hosts_bench.run_sweep(hosts, sweep, host_of, prepare, out, params, bar)
    if failure:
        raise LabError(
            f"host {failure['host']}, run {failure['run']} ({failure.get('label', '')}): {failure['error']} "
            f"(every finished run's row: {path})"
        )
    return common.columns_first(rows, COLUMNS + ["place", *(f"{n}_host" for n in names)]), path


def _stream(tb, name, path, fam, par, duration) -> dict:
    if name == "host":
        client, server = tb.nodes
        addr = tb.underlay4(server) if fam == 4 else tb.underlay6(server)
    else:
        client, server = "p00", "p01" if path == "same-node" else "p10"
        addr = tb.pod4(server) if fam == 4 else tb.pod6(server)
    with Iperf3(tb.ns(client), "eth0", tb.ns(server), addr, port=IPERF_PORT, parallel=par) as gen:
        with CpuSampler(0.5) as cpu:
            rep = gen.send(seconds=duration)
    secs = rep.extra.get("received_seconds") or rep.seconds
    gbps = rep.extra["received_bytes"] * 8 / secs / 1e9
    return {"gbps": round(gbps, 3), "retransmits": rep.extra.get("retransmits"), **cpu_of(cpu, gbps)}


def _rr(tb, name, duration) -> dict:
    if name == "host":
        r = request_response(tb.ns(tb.nodes[0]), tb.underlay4(tb.nodes[1]), RR_PORT + 1, duration)
    else:
        r = request_response(tb.ns("p00"), tb.pod4("p10"), RR_PORT, duration)
    return latency(r)


def service_blocks(tb, variants, trials, duration, bar=None) -> list:
    """The services experiment, a block per way and size: the services built once (build_s;
    memory_kib: the kernel memory they hold, maps' memlock or the rules' charge), then the
    trials, each a run to the last service and one to the first (in turn), and one service
    added and removed again as the way does it. The ways of a size run one after another,
    starting with another at each size: a rule set of 10,000 takes minutes to build, so
    it is built once for all its runs, not once per run."""
    rows = []
    for k, n in enumerate(sorted({v[6] for v in variants})):
        of_n = [v for v in variants if v[6] == n]
        for v in of_n[k % len(of_n) :] + of_n[: k % len(of_n)]:
            rows += _block(tb, v, trials, duration, bar)
    return rows


def _block(tb, v, trials, duration, bar) -> list:
    _, name, way, *_, n = v
    peer = PEERS[name](tb)
    charge = MemoryCgroup(f"{tb.ns(tb.nodes[0])}.rules")
    held = maps_memlock([os.getpid()])  # maps this process holds before the way's own
    rows = []
    try:
        peer.attach()
        peer.charge = charge.create()
        t0 = time.perf_counter()
        peer.set_services(services(tb, n))
        built = {"build_s": time.perf_counter() - t0}  # (a few services through the API: under a millisecond)
        peer.charge = None
        # both nodes': every tool that built the rules ran in the cgroup, every map is this process's
        kib = (maps_memlock([os.getpid()]) - held + charge.kernel_bytes()) / 1024
        built["memory_kib"] = round(kib, 1)
        for trial in range(trials):
            positions = ["last", "first"][: 2 if n > 1 else 1]
            for pos in positions if trial % 2 == 0 else positions[::-1]:
                r = request_response(
                    tb.ns("p00"), VIP if pos == "last" else VIP_FIRST, 80, duration, mode="crr", **peer.client_kw(way)
                )
                row = {**_keys(v, trial), "position": pos, **latency(r), **built}
                if pos == "last":
                    last = row
                rows.append(row)
            last.update(_add_remove(tb, peer, n))
            if bar:
                bar.step(f"services {way} x{n} t{trial}")
    finally:
        peer.detach()
        charge.remove()
    return rows


def _add_remove(tb, peer, n) -> dict:
    """One service more, as the way adds one (map writes, nft's transaction, kube-proxy's
    partial iptables-restore), on every node, then the same one removed: their times,
    after a run, never in it."""
    backends = [f"{tb.pod4(b)}:{RR_PORT}" for b in SERVICE_BACKENDS]
    one = (f"198.19.{n // 250 + 100}.{n % 250 + 1}", 80, "tcp", backends)
    t0 = time.perf_counter()
    peer.add_service(one)
    t1 = time.perf_counter()
    peer.remove_service(one)
    t2 = time.perf_counter()
    return {"add_one_ms": round(1e3 * (t1 - t0), 3), "remove_one_ms": round(1e3 * (t2 - t1), 3)}


def latency(r) -> dict:
    return {
        "tps": round(r.tps, 1),
        "transactions": r.transactions,
        "errors": r.errors,
        "p50_us": r.percentile(50),
        "p90_us": r.percentile(90),
        "p99_us": r.percentile(99),
    }


def print_summary(df, stream=sys.stdout):
    """Medians [min..max] per setting, then the issue's targets, met or not."""
    for exp, values in (
        ("stream", ["gbps", "gbps_per_core"]),
        ("rr", ["tps", "p50_us"]),
        ("services", ["tps", "p50_us"]),
    ):
        d = df[df["experiment"] == exp]
        if d.empty:
            continue
        keys = ["peer", "way", "path", "family", "parallel", "services", "position"]
        if "position" not in d:
            d = d.assign(position="")
        d = d.fillna({"way": "", "services": 0, "position": ""}).astype({"services": int})
        s = common.summarize(d, keys, values)
        stream.write(f"\n{exp}: median [min..max]\n")
        for _, r in s.iterrows():
            label = " ".join(str(r[k]) for k in keys if r[k] not in ("", 0) or k == "peer")
            cells = "  ".join(f"{v} {common.span(r, v, fmt='{:.2f}' if 'gbps' in v else '{:.0f}')}" for v in values)
            stream.write(f"  {label:<42} {cells}\n")
    for line in targets(df):
        stream.write(line + "\n")


def targets(df) -> list[str]:
    """The issue's targets, each number with whether it was met."""
    out = ["\ntargets (medians):"]

    def med(col, **where):
        d = df
        for k, v in where.items():
            d = d[d[k] == v]
        return None if d.empty or d[col].isna().all() else float(d[col].median())

    def line(what, got, want, ok_if_ge=True):
        if got is None or want is None:
            return f"  {what}: not measured in this run"
        ok = got >= want if ok_if_ge else got <= want
        return f"  {what}: {got:.2f} (target {'>=' if ok_if_ge else '<='} {want:.2f}) {'met' if ok else 'MISSED'}"

    e, h = (
        med("gbps", experiment="stream", peer="ebpf", path="across", family=4, parallel=1),
        med("gbps", experiment="stream", peer="host", path="across", family=4, parallel=1),
    )
    out.append(line("ebpf / host Gbit/s across nodes, 1 stream", e / h if e and h else None, 0.9))
    e = med("gbps_per_core", experiment="stream", peer="ebpf", path="across", family=4, parallel=1)
    lg = med("gbps_per_core", experiment="stream", peer="legacy", path="across", family=4, parallel=1)
    out.append(line("ebpf / legacy Gbit/s per CPU core across nodes", e / lg if e and lg else None, 1.2))
    e, lg = med("p50_us", experiment="rr", peer="ebpf"), med("p50_us", experiment="rr", peer="legacy")
    out.append(line("ebpf / legacy request/response latency (p50)", e / lg if e and lg else None, 0.6, False))
    n = df[df["experiment"] == "services"]["services"].max() if "services" in df else None
    n = None if n is None or n != n else int(n)
    last = {"position": "last"} if "position" in df else {}
    c = med("tps", experiment="services", way="connect", services=n, **last) if n else None
    f = med("tps", experiment="services", way="nft", services=n, **last) if n else None
    out.append(line(f"connect() / nftables DNAT connections/s at {n} services", c / f if c and f else None, 1.3))
    out.append(
        line(f"connect() / nftables mode's connections/s at {n} services (at 10,000)", c / f if c and f else None, 1.0)
    )
    i = med("tps", experiment="services", way="iptables-legacy", services=n, **last) if n else None
    out.append(
        line(f"connect() / iptables (legacy) connections/s to the last at {n} services", c / i if c and i else None, 2)
    )
    a = med("add_one_ms", experiment="services", way="connect", services=n) if n and "add_one_ms" in df else None
    out.append(line(f"adding one service through the API at {n} services, ms", a, 5, False))
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m lab bench pods")
    add_arguments(p)
    sys.exit(main(p.parse_args()))
