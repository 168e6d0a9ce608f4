"""python -m lab bench vtap-throughput: the vTAP paper's experiment (its
Tables 1-2, Figures 5-6) against every mirror we have.

For each testbed x mirror x frame size x trial: the generator offers its ceiling
for `duration` seconds from the sender; the rig counts what arrived at the
receiver and at the monitor, and samples the CPUs. Runs of different mirrors
interleave (see common.interleaved). One CSV row per run.
"""

import argparse
import contextlib
import sys
import time
import types

import pandas as pd

from ebpf.vtap.cutoff import parse_size
from lab import testbeds
from lab.bench import common
from lab.bench.xdp_cost import BpfRunStats, run_stats
from lab.metrics import CPU_COLUMNS, write_results
from lab.netns import LabError
from lab.traffic import GENERATORS

from .peers import MIRRORS, EbpfSessionsMirror
from .rig import ThroughputRig

NAME = "vtap-throughput"
MIRROR_ORDER = list(MIRRORS)
COLUMNS = [
    "testbed",
    "mirror",
    "size",
    "trial",
    "duration_s",
    "sender_pps",
    "receiver_pps",
    "monitor_pps",
    "receiver_mbps",
    "monitor_mbps",
    "receiver_loss",
    "monitor_loss",
    "cpu_usr",
    "cpu_sys",
    "cpu_soft",
    "cpu_steal",
    "cpu_idle",
    "dut_ns_per_pkt",
    "rules",
    "target",
    "truncate",
    "tap_ns_per_run",
    "sender_ns_per_run",
    "cutoff",
]
CUTOFF = "ebpf"  # the mirror with a cutoff dimension: --cutoff
SESSIONS = "ebpf-sessions"  # the mirror with a session dimension: --rules x --targets x --truncate


SUMMARY = "vTAP paper Tables 1-2: PPS, Mbps and CPU per mirror"
DESCRIPTION = """\
The vTAP paper's experiment (Tables 1-2, Figures 5-6) against every mirror we
have. For each testbed, mirror, frame size and trial, the generator sends from
the sender for --duration seconds; the rig counts what reaches the receiver and
the monitor, and samples the CPUs. Runs of different mirrors interleave. Writes
one CSV row per run and a JSON sidecar, and prints a table of medians."""
EXAMPLES = """\
examples:
  python -m lab bench vtap-throughput       # testbed 1: every size and mirror, 210 runs of 5 s
  python -m lab bench vtap-throughput --testbed 1,2 --out datasets/reference
                                            # the README's reference sweep: 420 runs of 5 s
  python -m lab bench vtap-throughput --testbed 2 --sizes 64 --peers ebpf,tc-mirred --trials 20
                                            # two mirrors at one size, closely
  python -m lab bench vtap-throughput --testbed 3 --peers none,ebpf,ebpf-xdp,tc-mirred,nft-dup
                                            # a node that routes: the XDP vTAP against the others
  python -m lab bench vtap-throughput --sizes 64 --peers none,ebpf,tc-mirred --rate 250000
                                            # an equal offered load, below every mirror's ceiling
  python -m lab bench vtap-throughput --generator trafgen --sizes 64,1518
                                            # netsniff-ng's trafgen as the packet source
  python -m lab bench vtap-throughput --testbed 3 --sizes 64 --peers ebpf-sessions --rules 1,16,64,256
                                            # vTAP sessions: what the rules cost, per packet
  python -m lab bench vtap-throughput --testbed 3 --sizes 1518 --peers ebpf-sessions \
      --targets local,vxlan,erspan --truncate 0,128
                                            # copies to the monitor or tunnelled, whole or cut at 128 B
  python -m lab bench vtap-throughput --sizes 64,1518 --peers ebpf --cutoff 0,64K,1G
                                            # the cutoff's cost: off, cutting, on but never reached
  python -m lab bench vtap-throughput --sizes 64 --peers none,ebpf --trials 1 --duration 1
                                            # a smoke test: 2 runs of 1 s
  python -m lab bench vtap-throughput -i hosts.yml --sizes 64,1518 --peers none,ebpf,tc-mirred
                                            # on your own machines (python -m lab hosts check first)
"""


def add_arguments(p):
    # Defaults are shown with %(default)s, so the text cannot drift from the value.
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "--testbed",
        default=None,
        help="1, 2, 3 or a list, 1,2,3 (default 1; with -i, the inventory's: 1 when the tap host is the "
        "receiver, 2 when it bridges to one); 3 routes, where the XDP vTAP (ebpf-xdp) runs",
    )
    p.add_argument(
        "--sizes",
        default=",".join(map(str, common.SIZES)),
        help="frame sizes in bytes with FCS (default: the paper's, %(default)s)",
    )
    common.add_options(p, trials=5, duration=5.0, peers=MIRROR_ORDER, old_peers="--mirrors", cpus="generator,DUT")
    p.add_argument(
        "--generator",
        default="xdp",
        choices=sorted(GENERATORS),
        help="packet source: our XDP generator or netsniff-ng's trafgen (default %(default)s)",
    )
    p.add_argument("--flows", type=int, default=4, help="UDP flows in the mix (default %(default)s)")
    p.add_argument(
        "--rate", type=int, metavar="PPS", help="offered load in packets/s (default: the generator's ceiling)"
    )
    p.add_argument(
        "--rules",
        default="1",
        help=f"{SESSIONS}: rules in its session, a list (default %(default)s); the load matches the last",
    )
    p.add_argument(
        "--targets",
        default="local",
        help=f"{SESSIONS}: local (the monitor), vxlan, erspan (to Testbed 3's collector), a list (default %(default)s)",
    )
    p.add_argument(
        "--truncate", default="0", help=f"{SESSIONS}: bytes a copy keeps, 0 for whole, a list (default %(default)s)"
    )
    p.add_argument(
        "-i",
        "--inventory",
        metavar="FILE",
        help="run on the hosts an Ansible inventory names (roles sender, tap, receiver, monitor; "
        f"docs/hosts.md); mirrors there: {', '.join(HOSTS_MIRRORS)} (default: namespaces on this machine)",
    )
    p.add_argument(
        "--cutoff",
        default="0",
        help=f"{CUTOFF}: the per-flow cutoff, bytes of payload per flow and direction (64K, 1MiB), a list; "
        "0: no flow table at all (default %(default)s). The tap's own ns per packet is in tap_ns_per_run",
    )


def main(args):
    tbs = common.parse_list(args.testbed or "1", int, [1, 2, 3], "testbed")
    if args.inventory and args.testbed is None:
        tbs = None  # the inventory's shape says which
    sizes = common.parse_list(args.sizes, int, what="size")
    mirrors, cpus = common.checked_options(args, MIRROR_ORDER, "mirror", cpus="generator,DUT")
    if args.inventory and args.peers == ",".join(MIRROR_ORDER):  # not chosen: those that run on hosts
        mirrors = list(HOSTS_MIRRORS)
    if args.peers != ",".join(MIRROR_ORDER) and not args.inventory:  # chosen: each must apply to every testbed
        for name in mirrors:
            missing = [t for t in tbs or [] if t not in MIRRORS[name].testbeds]
            if missing:
                raise ValueError(
                    f"mirror {name} does not apply to testbed {missing[0]} (only to "
                    f"{', '.join(map(str, MIRRORS[name].testbeds))})"
                )
    if args.rate is not None and args.rate <= 0:
        raise ValueError(f"--rate must be a positive number of packets/s, not {args.rate}")
    sessions = {
        "rules": common.parse_list(args.rules, int, what="rule count"),
        "targets": common.parse_list(args.targets, str, EbpfSessionsMirror.TARGETS, "target"),
        "truncate": common.parse_list(args.truncate, int, what="truncation"),
        "cutoffs": [parse_size(c, "--cutoff") for c in args.cutoff.split(",")],
    }
    if not all(1 <= n <= 256 for n in sessions["rules"]):
        raise ValueError("--rules: 1 to 256 rules")
    if not all(t == 0 or 64 <= t <= 9000 for t in sessions["truncate"]):
        raise ValueError("--truncate: 0 (whole) or 64 to 9000 bytes")
    df, path = run(
        tbs,
        sizes,
        mirrors,
        args.trials,
        args.duration,
        args.generator,
        args.flows,
        cpus,
        args.out,
        rate_pps=args.rate,
        sessions=sessions,
        inventory=args.inventory,  # on hosts: a host's failure is an error naming it, after its rows are written
    )
    print_summary(df)
    print(f"\nwrote {path} and {path.with_suffix('.json').name}")
    return 0


# what runs on hosts (lab.hosts): the mirrors that need no namespace of the lab's own (OVS
# runs daemons of its own; the XDP vTAP and sessions need Testbed 3's router)
HOSTS_MIRRORS = ("none", "ebpf", "ebpf-helper", "tc-mirred", "nft-dup")


class _HostCpu:
    """A DUT host's CPU summary, as its runner sent it: what row() reads of a CpuSampler."""

    def __init__(self, records):
        self.records = records

    def summary(self):
        return pd.DataFrame(self.records).set_index("cpu")


def run_hosts(
    inventory,
    sizes,
    mirrors,
    trials,
    duration,
    generator="xdp",
    flows=4,
    cpus=(0, 1),
    out=None,
    rate_pps=None,
    progress=True,
    allow_dirty=True,
    testbed=None,
):
    """The sweep on the hosts an Ansible inventory names: Testbed 1 (the receiver is the
    tap host) or 2 (the tap host bridges lab_iface and lab_out_iface to a receiver of its
    own), as its roles say (`testbed`, when given, must agree). Returns (DataFrame, CSV
    path, failure or None); rows of every finished run are in the CSV whatever happened
    after them (lab.hosts.bench)."""
    from lab.hosts import Hosts  # noqa: PLC0415 -- Ansible: only for a bench on hosts
    from lab.hosts import bench as hosts_bench  # noqa: PLC0415
    from lab.hosts.check import sink_mode  # noqa: PLC0415
    from lab.hosts.inventory import InventoryError  # noqa: PLC0415
    from lab.traffic.report import SendReport  # noqa: PLC0415

    others = [m for m in mirrors if m not in HOSTS_MIRRORS]
    if others:
        raise ValueError(f"mirror {others[0]} does not run on hosts yet (there: {', '.join(HOSTS_MIRRORS)})")
    gen_cpu, dut_cpu = cpus
    hosts = Hosts(inventory)
    inv = hosts.inventory
    roles = inv.roles(NAME)
    s, t, r, m = (roles[k][0] for k in ("sender", "tap", "receiver", "monitor"))
    tb_no = hosts_testbed(s, t, r, m)
    if testbed is not None and testbed != tb_no:
        raise InventoryError(
            f"--testbed {testbed}: the inventory is Testbed {tb_no}'s shape ("
            + ("the tap host is the receiver" if tb_no == 1 else f"tap {t.name} bridges to receiver {r.name}")
            + "); fix: --testbed {tb_no}, or an inventory of Testbed {testbed}'s shape (docs/hosts.md)"
        )
    others = [v for v in mirrors if tb_no not in MIRRORS[v].testbeds]
    if others:
        raise ValueError(f"mirror {others[0]} does not apply to testbed {tb_no}")
    report = hosts.check(NAME, generator=generator, allow_dirty=allow_dirty)
    if not report.ok:
        raise InventoryError("the hosts are not ready (nothing was started): " + " | ".join(report.problems()))
    ceiling = generator_ceiling(generator, report.facts[s.name]["ifaces"][s.iface("sender")], sizes)
    for size, pps in ceiling["line_rate_pps"].items():
        if rate_pps and pps and rate_pps > pps:
            raise InventoryError(
                f"--rate {rate_pps:g}: above {s.name}'s line rate for {size} B frames ({pps:,.0f} frames/s at "
                f"{ceiling['speed_mbps']} Mbit/s); fix: --rate {int(pps)} or less, or no --rate (the "
                "generator's ceiling)"
            )
    s_if, t_if, t_mon, m_if = s.iface("sender"), t.iface("tap"), t.iface("tap", "monitor"), m.iface("monitor")
    t_out = t.iface("tap", "out") if tb_no == 2 else None
    r_if = r.iface("receiver") if tb_no == 2 else t_if
    net = hosts_bench.test_addresses(inv, s)
    src4, dst4 = str(net[1]), str(net[2])
    plen = net.prefixlen
    port = 5001
    mac = {h.name: report.facts[h.name]["ifaces"] for h in (s, r)}
    sinks = {"monitor": sink_mode(report.facts[m.name]["ifaces"][m_if])}  # generic on a tunnel (check said)
    if tb_no == 2:
        sinks["receiver"] = sink_mode(report.facts[r.name]["ifaces"][r_if])
    deadline = hosts_bench.START_MARGIN + duration + hosts_bench.STOP_MARGIN + 30
    # off_cpus: every runner and waiting command of the run stays off the DUT's core
    base = {"bench": NAME, "deadline_s": deadline, "src4": src4, "port": port, "off_cpus": [dut_cpu]}
    runs = []
    for trial, size, name in common.interleaved(trials, sizes, list(mirrors)):
        specs = {
            "sender": {
                **base,
                "role": "sender",
                "iface": s_if,
                "dst4": dst4,
                "src_mac": mac[s.name][s_if]["mac"],
                "dst_mac": mac[r.name][r_if]["mac"],  # Testbed 2: through the tap's bridge
                "size": size,
                "flows": flows,
                "generator": generator,
                "gen_cpu": gen_cpu,
                "duration": duration,
                "rate_pps": rate_pps,
            },
            "tap": {
                **base,
                "role": "tap",
                "iface": t_if,
                "monitor_iface": t_mon,
                "out_iface": t_out,
                "dut_cpu": dut_cpu,
                "gen_cpu": gen_cpu,
                "receiver_here": tb_no == 1,
                "mirror": name,
                "kw": {},
            },
            "monitor": {**base, "role": "monitor", "iface": m_if, "xdp_mode": sinks["monitor"]},
        }
        if tb_no == 2:
            specs["receiver"] = {**base, "role": "receiver", "iface": r_if, "xdp_mode": sinks["receiver"]}
        runs.append((f"{name} {size}B trial {trial}", specs))

    def make_row(label, results):
        name, size, _, trial = label.replace("B", "").split()
        rep = results["sender"]["report"]
        if rep is None:
            raise HostsRunError(f"{label}: the sender never sent (its runner's deadline passed)")
        counts = {**results["tap"]["counts"], "monitor": results["monitor"]["counts"]["monitor"]}
        if "receiver" in results:  # Testbed 2: the receiver is a host of its own
            counts["receiver"] = results["receiver"]["counts"]["receiver"]
        m_ = {
            "report": SendReport(**rep),
            "counts": counts,
            "cpu": _HostCpu(results["tap"]["cpu"]),
            "mirrored": results["tap"]["mirrored"],
        }
        # row() reads a mirror's name (and the cutoff's setting: none on hosts)
        out_row = row(tb_no, types.SimpleNamespace(name=name, cutoff=0), int(size), int(trial), m_, dut_cpu, rate_pps)
        # rates over each host's own window (from its first counted frame to its last)
        at_receiver = results.get("receiver", results["tap"])
        for col, counted, window in (
            ("receiver", counts.get("receiver", counts["dut"]), at_receiver["window_s"]),
            ("monitor", m_["counts"]["monitor"], results["monitor"]["window_s"]),
        ):
            out_row[f"{col}_pps"] = counted["packets"] / window if window else 0.0
            out_row[f"{col}_mbps"] = (
                (counted["bytes"] + common.FCS * counted["packets"]) * 8 / window / 1e6 if window else 0.0
            )
        out_row.update(
            place="hosts",
            sender_host=s.name,
            tap_host=t.name,
            receiver_host=r.name,
            monitor_host=m.name,
            tap_window_s=results["tap"]["window_s"],
            receiver_window_s=at_receiver["window_s"],
            monitor_window_s=results["monitor"]["window_s"],
        )
        # each host's CPU over its own window, percent of all its cores (lab.fastpaths.vtap.hosts)
        for role, said in (
            ("sender", results["sender"]),
            ("tap", results["tap"]),
            ("receiver", at_receiver),
            ("monitor", results["monitor"]),
        ):
            for k, v in (said.get("host_cpu") or {}).items():
                out_row[f"{role}_host_{k}"] = v
        return out_row

    prepare = {}
    steps = [(s, {"iface": s_if, "address": f"{src4}/{plen}"})]
    if tb_no == 1:
        steps += [(t, {"iface": t_if, "address": f"{dst4}/{plen}"})]
    else:  # the tap host bridges its two test interfaces; the receiver holds the address
        steps += [
            (t, {"iface": t_if}),
            (t, {"iface": t_out}),
            (t, {"bridge": HOSTS_BRIDGE, "ports": [t_if, t_out]}),
            (r, {"iface": r_if, "address": f"{dst4}/{plen}"}),
        ]
    steps += [(t, {"iface": t_mon}), (m, {"iface": m_if, "promisc": True})]
    for host, item in steps:
        prepare.setdefault(host.name, []).append(item)
    sweep = hosts_bench.Sweep(
        NAME, runs, make_row, duration, meta={"csv_name": "vtap_throughput", "facts": report.facts}
    )
    params = {
        "testbeds": [tb_no],
        "sizes": sizes,
        "mirrors": list(mirrors),
        "trials": trials,
        "duration_s": duration,
        "generator": generator,
        "flows": flows,
        "gen_cpu": gen_cpu,
        "dut_cpu": dut_cpu,
        "rate_pps": rate_pps,
        "inventory": str(inv.path),
        "generator_ceiling": ceiling,
        "sink_modes": sinks,  # the counting sinks' XDP mode per role (generic: a tunnel, no native XDP)
    }
    bar = common.Progress(len(runs)) if progress else None
    role_hosts = {"sender": s.name, "tap": t.name, "monitor": m.name}
    if tb_no == 2:
        role_hosts["receiver"] = r.name
    rows, path, failure = hosts_bench.run_sweep(hosts, sweep, role_hosts, prepare, out, params, bar)
    return (
        common.columns_first(rows, COLUMNS + ["place", "sender_host", "tap_host", "receiver_host", "monitor_host"]),
        path,
        failure,
    )


class HostsRunError(ValueError):
    pass


WIRE_OVERHEAD = 20  # bytes each frame takes on the wire beyond its size with FCS: preamble, SFD, gap


def generator_ceiling(generator, iface, sizes) -> dict:
    """What bounds the sender's rate on its NIC: the generator (the XDP generator's live
    frames go out through the driver's ndo_xdp_xmit, which check requires; trafgen sends
    through the stack's packet socket, slower per frame), and the line rate per frame
    size at the link's speed (none for a veth, whose reported speed is nominal)."""
    driver = (iface.get("ethtool") or {}).get("driver")
    speed = iface.get("speed_mbps") if driver != "veth" else None
    speed = speed if speed and speed > 0 else None
    line = {size: (speed * 1e6 / ((size + WIRE_OVERHEAD) * 8) if speed else None) for size in sizes}
    how = {
        "xdp": "the XDP generator: live frames through the driver's ndo_xdp_xmit",
        "trafgen": "trafgen: a packet socket's ring through the stack's transmit path",
    }.get(generator, generator)
    return {
        "generator": generator,
        "how": how,
        "driver": driver,
        "ndo_xdp_xmit": "ndo-xmit" in iface.get("xdp_features", []),
        "speed_mbps": speed,
        "line_rate_pps": line,
    }


HOSTS_BRIDGE = "vtl-br0"  # the bridge a Testbed 2 tap host gets (lab.hosts.local: made, recorded, deleted)


def hosts_testbed(s, t, r, m) -> int:
    """The testbed an inventory's roles make: 1 when the tap host is the receiver, 2
    when it bridges (lab_out_iface) to a receiver of its own; else InventoryError."""
    from lab.hosts.inventory import InventoryError  # noqa: PLC0415

    if r.name == t.name:
        return 1
    if not t.iface("tap", "out"):
        raise InventoryError(
            f"receiver {r.name} is not the tap host {t.name}, which has no lab_out_iface: Testbed 2's tap bridges "
            f"its lab_iface to the receiver through lab_out_iface; fix: lab_out_iface on {t.name} (or the tap host "
            "as the receiver: Testbed 1)"
        )
    if len({s.name, t.name, r.name, m.name}) < 4:
        raise InventoryError("Testbed 2 takes four hosts (sender, tap, receiver, monitor); fix: a host each")
    return 2


def row(tb_no, mirror, size, trial, m, dut_cpu, rate_pps=None):
    rep, counts, cpu = m["report"], m["counts"], m["cpu"]
    secs = rep.seconds
    rx = counts["receiver"] if "receiver" in counts else counts["dut"]
    tunnelled = getattr(mirror, "target", "local") != "local"
    mon = counts["collector"] if tunnelled else counts["monitor"]  # where the copies go
    core = cpu.summary().loc[dut_cpu]
    busy = float(core["busy_ns"])
    r = {
        "testbed": tb_no,
        "mirror": mirror.name,
        "size": size,
        "trial": trial,
        "duration_s": round(secs, 3),
        "sender_pps": rep.pps,
        "receiver_pps": rx["packets"] / secs,
        "monitor_pps": mon["packets"] / secs,
        # Mbps of frames with FCS, as the sizes are given
        "receiver_mbps": (rx["bytes"] + common.FCS * rx["packets"]) * 8 / secs / 1e6,
        "monitor_mbps": (mon["bytes"] + common.FCS * mon["packets"]) * 8 / secs / 1e6,
        "receiver_loss": 1 - rx["packets"] / rep.packets if rep.packets else 0.0,
        "monitor_loss": (
            (1 - mon["packets"] / rx["packets"] if rx["packets"] else 0.0) if mirror.name != "none" else None
        ),
        **{f"cpu_{c}": float(core[c]) for c in CPU_COLUMNS},
        "dut_ns_per_pkt": busy / rx["packets"] if rx["packets"] else None,
        "dut_ns_per_mirrored_pkt": busy / mon["packets"] if mon["packets"] else None,
        "dut_cpu": dut_cpu,
        "offered_pps": rate_pps or 0,
        "generator": rep.generator,
        "sent_packets": rep.packets,
        # arrivals at the DUT: its pass sink's count, or the XDP vTAP's own (it owns that hook)
        "sender_dropped": rep.dropped,
        "dut_packets": counts["dut"]["packets"] if "dut" in counts else m["mirrored"].get("seen"),
        "receiver_packets": rx["packets"],
        "monitor_packets": mon["packets"],
        "mirrored_by_peer": m["mirrored"].get("mirrored"),
    }
    for k in ("seen", "matched", "cloned", "failed"):
        if k in m["mirrored"]:
            r[f"vtap_{k}"] = m["mirrored"][k]
    if mirror.name == SESSIONS:
        r.update(rules=mirror.rules, target=mirror.target, truncate=mirror.truncate)
    if mirror.name == CUTOFF:
        r["cutoff"] = mirror.cutoff
        r["vtap_cut"] = m["mirrored"].get("cut", 0)
    for prog, (ns, runs) in m.get("bpf_stats", {}).items():
        r[f"{prog}_ns_per_run"] = ns / runs if runs else None
        r[f"{prog}_runs"] = runs
    return r


def variants(mirrors, sessions):
    """(label, mirror name, its keyword arguments): the session mirror once per
    rules x target x truncation, every other mirror once."""
    out = []
    for name in mirrors:
        if name == CUTOFF and sessions.get("cutoffs", [0]) != [0]:
            for c in sessions["cutoffs"]:
                out.append((f"{name} cutoff {c}" if c else name, name, {"cutoff": c} if c else {}))
            continue
        if name != SESSIONS:
            out.append((name, name, {}))
            continue
        for n in sessions["rules"]:
            for target in sessions["targets"]:
                for cut in sessions["truncate"]:
                    out.append((f"{name} {n} {target} {cut}", name, dict(rules=n, target=target, truncate=cut)))
    return out


def run(
    testbed_nos,
    sizes,
    mirrors,
    trials,
    duration,
    generator="xdp",
    flows=4,
    cpus=(0, 1),
    out=None,
    progress=True,
    stream=sys.stdout,
    rate_pps=None,
    sessions=None,
    inventory=None,
):
    """The sweep; returns (DataFrame, CSV path). Small arguments make it a smoke test.
    inventory: an Ansible inventory's path: the sweep on the hosts it names (Testbed 1 or 2;
    run_hosts()), which raises after writing what it measured when a host failed."""
    if inventory is not None:
        if testbed_nos is not None and len(testbed_nos) != 1:
            raise ValueError("--testbed with -i: one testbed, the inventory's (1 or 2)")
        df, path, failure = run_hosts(
            inventory,
            sizes,
            mirrors,
            trials,
            duration,
            generator,
            flows,
            cpus,
            out,
            rate_pps,
            progress,
            testbed=testbed_nos[0] if testbed_nos else None,
        )
        if failure:
            raise LabError(
                f"host {failure['host']}, run {failure['run']} ({failure.get('label', '')}): {failure['error']} "
                f"(every finished run's row: {path})"
            )
        return df, path
    sessions = sessions or {"rules": [1], "targets": ["local"], "truncate": [0], "cutoffs": [0]}
    gen_cpu, dut_cpu = cpus
    rows = []
    todo = variants(mirrors, sessions)
    total = sum(trials * len(sizes) * len([v for v in todo if t in MIRRORS[v[1]].testbeds]) for t in testbed_nos)
    bar = common.Progress(total) if progress else None
    for tb_no in testbed_nos:
        here = [v for v in todo if tb_no in MIRRORS[v[1]].testbeds]
        tunnels = any(kw.get("target", "local") != "local" for _, _, kw in here)
        cutting = any("cutoff" in kw for _, _, kw in here)  # then the vTAP's runs are timed, cut or not
        # an underlay to the collector whose MTU takes whole 1518-byte copies in a tunnel
        # (3000: still within what a veth takes natively at XDP, where the sink counts them)
        tb = (
            testbeds.testbed3(collector=True, collector_mtu=3000)
            if tb_no == 3 and tunnels
            else testbeds.TESTBEDS[tb_no]()
        )
        with (
            ThroughputRig(tb, gen_cpu, dut_cpu) as rig,
            # the programs' own time (BPF_ENABLE_STATS) where a dimension asks what a program costs
            BpfRunStats() if any(n == SESSIONS or "cutoff" in kw for _, n, kw in here) else contextlib.nullcontext(),
        ):
            dut_ns = tb.ns(tb.tap_host)
            bridge = tb.bridge
            peers, gens = {}, {}
            try:
                for label, name, kw in here:
                    peers[label] = MIRRORS[name](
                        dut_ns, tb.tap_iface, tb.monitor_iface, bridge=bridge, cpu=dut_cpu, **kw
                    )
                for trial, size, label in common.interleaved(trials, sizes, [v[0] for v in here]):
                    if size not in gens:
                        frames = common.udp_frames(
                            tb.src4, tb.dst4, tb.sender_mac, tb.next_hop_mac, size, flows, dport=rig.udp_port
                        )  # the port of the receiving DUT's socket
                        gens[size] = GENERATORS[generator](tb.ns(tb.sender), tb.sender_iface, frames, cpu=gen_cpu)
                        gens[size].open()
                    peer = peers[label]
                    stats = label.startswith(SESSIONS) or (label.startswith(CUTOFF) and cutting)
                    fds = peer.program_fds() if stats and hasattr(peer, "program_fds") else {}
                    before = {k: run_stats(fd) for k, fd in fds.items()}
                    started = time.monotonic()
                    m = rig.run(gens[size], peer, seconds=duration, rate_pps=rate_pps)
                    m["bpf_stats"] = {
                        k: tuple(b - a for a, b in zip(before[k], run_stats(fd), strict=True)) for k, fd in fds.items()
                    }
                    rows.append(row(tb_no, peer, size, trial, m, dut_cpu, rate_pps))
                    # the run's wall time, attach to detach (on hosts: start to results)
                    rows[-1]["run_wall_s"] = round(time.monotonic() - started, 3)
                    if bar:
                        bar.step(f"tb{tb_no} {label} {size}B trial {trial}")
            finally:
                common.close_all(gens, peers)
    df = common.columns_first(rows, COLUMNS)
    params = {
        "testbeds": testbed_nos,
        "sizes": sizes,
        "mirrors": mirrors,
        "trials": trials,
        "duration_s": duration,
        "generator": generator,
        "flows": flows,
        "gen_cpu": gen_cpu,
        "dut_cpu": dut_cpu,
        "rate_pps": rate_pps,
        "sessions": sessions,
    }
    path = write_results(df, "vtap_throughput", params, out)
    return df, path


def with_variant(df: pd.DataFrame) -> pd.DataFrame:
    """A `variant` column: the mirror, and for sessions its rules, target and truncation."""
    df = df.copy()

    def name(r):
        if r["mirror"] == CUTOFF and r.get("cutoff") and not pd.isna(r.get("cutoff")):
            return f"{CUTOFF} cutoff {int(r['cutoff'])}"
        if r["mirror"] != SESSIONS or pd.isna(r.get("rules")):
            return r["mirror"]
        cut = f" cut {int(r['truncate'])}" if r.get("truncate") else ""
        return f"sessions {int(r['rules'])}r {r['target']}{cut}"

    df["variant"] = df.apply(name, axis=1) if len(df) else []
    return df


def summary(df: pd.DataFrame) -> pd.DataFrame:
    df = with_variant(df)
    timed = ["tap_ns_per_run"] if "tap_ns_per_run" in df and df["tap_ns_per_run"].notna().any() else []
    s = common.summarize(
        df,
        ["testbed", "size", "mirror", "variant"],
        ["receiver_pps", "monitor_pps", "monitor_mbps", "dut_ns_per_pkt", "cpu_steal", *timed],
    )
    s["order"] = s["mirror"].map({m: i for i, m in enumerate(MIRROR_ORDER)})
    return s.sort_values(["testbed", "size", "order", "variant"]).drop(columns="order").reset_index(drop=True)


def print_summary(df, stream=sys.stdout):
    s = summary(df)
    stream.write("\nmedian [min..max] over trials; kpps; ns of DUT CPU per received packet\n")
    width = max(11, *(len(v) for v in s["variant"])) if len(s) else 11
    timed = "tap_ns_per_run_median" in s  # the programs' own time: the sessions' and the cutoff's runs
    stream.write(
        f"{'tb':>2} {'size':>5} {'mirror':<{width}} {'receiver kpps':>22} {'monitor kpps':>22} "
        f"{'monitor Mbps':>13} {'DUT ns/pkt':>18}" + (f" {'tap ns/run':>18}" if timed else "") + "\n"
    )
    for _, r in s.iterrows():
        own = ""
        if timed:
            own = f" {common.span(r, 'tap_ns_per_run'):>18}" if pd.notna(r["tap_ns_per_run_median"]) else f" {'-':>18}"
        stream.write(
            f"{r['testbed']:>2} {r['size']:>5} {r['variant']:<{width}} {common.span(r, 'receiver_pps', 1e3):>22} "
            f"{common.span(r, 'monitor_pps', 1e3):>22} {r['monitor_mbps_median']:>13.0f} "
            f"{common.span(r, 'dut_ns_per_pkt'):>18}{own}\n"
        )
