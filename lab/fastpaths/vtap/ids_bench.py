"""python -m lab bench ids: the vTAP paper's IDS experiment (its Table 3,
Figure 7) on Testbed 3: Suricata on the receiver, which gets the original
traffic, and on the monitor, which gets the vTAP's copies.

    sender eth0 ---- eth0 receiver mon0 ---- eth0 monitor
      tcpreplay        vTAP + Suricata          Suricata
                              eth2 ---- router ---- collector   (--at remote)
                                                    Suricata

With --at remote, the monitor's Suricata runs on a collector two hops away
instead, the copies reaching it in VXLAN from vTAP sessions (a session taking
what the watch-list would); local and remote runs interleave, and the CSV's
monitor_* columns are the collector's in remote runs (monitor_at says which).

Attack traffic with ground truth (lab.traffic.attacks, the project's ruleset
lab/rules/vtap-lab.rules), or a pcap and rules of the user's, is replayed at each
rate; both IDSes start fresh for every run and are stopped once they have read
what they were sent. Rates and quota settings interleave within each trial.

The paper's VMs had one vCPU each, so its receiver's IDS competed with the
receiver's own packet processing. Here that is emulated, not reproduced: the
receiver's receive work (backlog, vTAP, the copy's transmission) is steered by
RPS onto the core its Suricata is pinned to; the monitor's receive work and its
Suricata share the other core, with tcpreplay; and both Suricatas run under the
same CFS quota (--cpu-quota, percent of a core). `none` runs them unlimited,
which shows where this machine's own knee is. The two sides swap cores every
other trial (the cores of this VM are not alike).

Per run: achieved rate, packets sent and mirrored, and for each IDS the packets
offered to its socket (capture.kernel_packets, drops included), kernel drops,
drop rate (drops / packets, as Suricata reports it), packets that never reached
the socket (missed), alerts, CPU seconds, and whether its alerts equal the
expected ones signature by signature. Alerts per signature go to a second CSV.
"""

import argparse
import ipaddress
import math
import sys
import tempfile
from pathlib import Path

import pandas as pd

from ebpf.errors import InputError
from ebpf.vtap.cutoff import parse_size
from ebpf.vtap.sessions.config import Rule, Session
from ebpf.vtap.sessions.tc_sessions import SessionMirror
from lab import testbeds
from lab.bench.common import Progress, add_options, checked_options, columns_first, interleaved, parse_list
from lab.bench.xdp_cost import BpfRunStats, run_stats
from lab.daemons import suricata
from lab.metrics import steer_receive, write_results
from lab.traffic import attacks, elephants
from lab.traffic.replay import Tcpreplay, check_pcap
from lab.traffic.report import MAX_LOAD_SECONDS

from .peers import EbpfMirror

NAME = "ids"
SUMMARY = "the vTAP paper's Table 3: Suricata at the receiver and at the monitor, alerts and drops per rate"
DESCRIPTION = __doc__.split("\n\n", 1)[1]
EXAMPLES = """\
examples:
  python -m lab bench ids                                  # 10..30 Mbps, quota 5 % and none, 3 trials
  python -m lab bench ids --rates 1 --trials 1 --cpu-quota none --loop 2
                                                           # the exactness check: every alert, no drop
  python -m lab bench ids --rates 10,30,top --cpu-quota 5,10,20,none
  python -m lab bench ids --at local,remote --rates 1,10,20,30 --cpu-quota 5
                                                           # the monitor's IDS local, or remote behind VXLAN
  python -m lab bench ids --pcap my.pcap --rules my.rules --home-net 10.0.0.0/8 --watch 10.0.0.5/32
                                                           # your traffic and signatures, unchanged
  python -m lab bench ids --elephants 4x16M --cutoff 0,64K,1M --rates 10,30,60,100 --cpu-quota 5
                                                           # long transfers, and the monitor's tap
                                                           # cutting each flow after its first bytes
  python -m lab bench ids --elephants 4x16M --cutoff 0,64K,1M --rates 100,150,200 --elephant-starts together,staggered
                                                           # the transfers begun together, or apart
"""
RATES = [10, 15, 20, 25, 30]
DEFAULT_QUOTAS = "5,none"
TARGET_SECONDS = 8.0  # default repetitions: the mix lasts this long at the highest rate
TOP_REPETITIONS = 400  # and this many repetitions when the only rate is `top`
MAX_PCAP_BYTES = 1 << 30  # the project's traffic is at most this big; a bigger pcap of yours is not preloaded
AT = ("local", "remote")
COLUMNS = [
    "rate_mbps",
    "trial",
    "cpu_quota_pct",
    "monitor_at",
    "cutoff",
    "achieved_mbps",
    "achieved_kpps",
    "packets_sent",
    "receiver_packets",
    "receiver_drops",
    "receiver_drop_rate",
    "receiver_alerts",
    "monitor_packets",
    "monitor_drops",
    "monitor_drop_rate",
    "monitor_alerts",
    "expected_alerts",
    "rate",
    "duration_s",
    "mirrored",
    "receiver_missed",
    "monitor_missed",
    "receiver_cpu_s",
    "monitor_cpu_s",
    "receiver_correct",
    "monitor_correct",
    "receiver_cpu",
    "monitor_cpu",
    "packets_failed",
]
SIG_COLUMNS = [
    "rate_mbps",
    "trial",
    "cpu_quota_pct",
    "monitor_at",
    "cutoff",
    "beyond_cutoff",
    "ids",
    "sid",
    "alerts",
    "expected",
    "msg",
    "rate",
]


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "--rates",
        default=",".join(map(str, RATES)),
        help="replay rates in Mbps, or `top` for as fast as tcpreplay goes (default %(default)s)",
    )
    add_options(p, trials=3, cpus="sender+monitor,receiver in even trials, swapped in odd ones")
    p.add_argument(
        "--cpu-quota",
        default=DEFAULT_QUOTAS,
        metavar="PCT[,PCT|none...]",
        help="CPU quota of each Suricata, percent of one core; `none` for unlimited (default %(default)s)",
    )
    p.add_argument(
        "--loop",
        type=int,
        metavar="N",
        help="the project's traffic: repetitions of the attack mix, each with fresh sessions "
        f"(default: enough for {TARGET_SECONDS:.0f} s at the highest rate); a --pcap: "
        "tcpreplay's loop count (default 1; identical sessions again, which Suricata "
        "takes for retransmissions)",
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the project's traffic (default %(default)s)")
    p.add_argument("--pcap", metavar="FILE", help="replay this pcap unchanged instead of the project's traffic")
    p.add_argument("--rules", metavar="FILE", help="Suricata rules (default: the project's, lab/rules/vtap-lab.rules)")
    p.add_argument(
        "--truth",
        metavar="FILE",
        help="expected alerts per signature (sid,expected[,msg]); default: the generator's for "
        "the project's traffic, Suricata reading --pcap offline for yours",
    )
    p.add_argument(
        "--home-net",
        metavar="CIDR[,CIDR]",
        help=f"Suricata's $HOME_NET (default {attacks.HOME_NET} for the project's traffic, any for --pcap)",
    )
    p.add_argument("--watch", metavar="CIDR[,CIDR]", help="the vTAP's watch-list (default: mirror every frame)")
    p.add_argument(
        "--cutoff",
        default="0",
        metavar="BYTES[,BYTES...]",
        help="the monitor's vTAP cuts each flow after BYTES of payload per direction (64K, 1M), a list "
        "that interleaves with the rates; 0: no cutoff (default %(default)s)",
    )
    p.add_argument(
        "--elephants",
        default="0",
        metavar="NxSIZE",
        help="mix N long TCP transfers of SIZE bytes into the project's traffic (4x16M), each with "
        "signatures 32 KiB and 512 KiB in (lab.traffic.elephants); 0: none (default %(default)s)",
    )
    p.add_argument(
        "--elephant-starts",
        default="together",
        metavar="together[,staggered]",
        help="the elephants all start with the replay (their first bytes arrive at once), or one "
        "every 1/N of it; a list interleaves, each with its own pcap (default %(default)s)",
    )
    p.add_argument(
        "--at",
        default="local",
        metavar="local[,remote]",
        help="where the monitor's Suricata runs: local (on mon0, the paper's) and/or remote (a "
        "collector two hops away, the copies in VXLAN from vTAP sessions) (default %(default)s)",
    )


# --- parsing ------------------------------------------------------------------------


def parse_rates(text):
    def conv(x):
        if x == "top":
            return "top"
        try:
            v = float(x)
        except ValueError:
            raise ValueError(f"unknown rate {x!r} (Mbps, e.g. 10,15,20, or top)") from None
        if not 0 < v <= 10_000:
            raise ValueError(f"rate {x} Mbps is outside (0, 10000]")
        return int(v) if v == int(v) else v

    return parse_list(text, conv, what="rate")


def parse_quotas(text):
    def conv(x):
        if x in ("none", "0"):
            return None
        try:
            v = int(x)
        except ValueError:
            raise ValueError(f"unknown CPU quota {x!r} (percent of a core, e.g. 10, or none)") from None
        if not 1 <= v <= 100:
            raise ValueError(f"CPU quota {v} % is outside 1..100 (one core)")
        return v

    return list(dict.fromkeys(parse_list(text, conv, what="CPU quota")))


def parse_nets(text, what):
    if text == "any":
        return "any"
    nets = [x.strip() for x in text.split(",") if x.strip()]
    if not nets:
        raise ValueError(f"empty {what}")
    for n in nets:
        try:
            ipaddress.ip_network(n, strict=False)
        except ValueError:
            raise ValueError(f"{what}: {n!r} is not an address or CIDR") from None
    return ",".join(nets)


def parse_cutoffs(text):
    def conv(x):
        try:
            return parse_size(x, "--cutoff")
        except InputError as e:
            raise ValueError(str(e)) from None

    return list(dict.fromkeys(parse_list(text, conv, what="cutoff")))


STARTS = ("together", "staggered")


def parse_starts(text):
    return list(dict.fromkeys(parse_list(text, str, STARTS, "--elephant-starts mode")))


def parse_elephants(text):
    """(flows, bytes each) from "4x16M"; (0, 0) for "0"."""
    if str(text).strip() in ("0", ""):
        return 0, 0
    text = str(text).strip()
    at = text.lower().find("x")
    n, sep, size = (text[:at], "x", text[at + 1 :]) if at >= 0 else (text, "", "")
    if not sep or not n.isdigit() or not 1 <= int(n) <= 64:
        raise ValueError(f"--elephants must be N x SIZE, N from 1 to 64 (4x16M), not {text!r}")
    try:
        nbytes = parse_size(size, "--elephants size")
    except InputError as e:
        raise ValueError(str(e)) from None
    if not 64 << 10 <= nbytes <= 256 << 20:
        raise ValueError(f"--elephants: each transfer from 64K to 256M, not {size}")
    return int(n), nbytes


# --- the traffic --------------------------------------------------------------------


class Workload:
    """What is replayed and what it should raise: the project's generated mix
    (pcap written to the bench's temporary directory), or a user's pcap."""

    def __init__(self, args, rates, tmpdir):
        self.elephants = parse_elephants(getattr(args, "elephants", "0"))
        # the elephants' start modes: each a pcap of its own (the same frames, other order)
        starts = parse_starts(getattr(args, "elephant_starts", "together"))
        if not self.elephants[0] and starts != ["together"]:
            raise ValueError("--elephant-starts goes with --elephants N x SIZE")
        self.starts = starts if self.elephants[0] else ["together"]
        if self.elephants[0] and args.pcap is not None:
            raise ValueError("--elephants goes with the project's traffic, not --pcap")
        self.rules = Path(args.rules) if args.rules else attacks.RULES
        if not self.rules.is_file():
            raise ValueError(f"rules file {args.rules} not found")
        self.truth_file = args.truth
        if args.truth and not Path(args.truth).is_file():
            raise ValueError(f"truth file {args.truth} not found")
        if args.loop is not None and not 1 <= args.loop <= attacks.MAX_REPETITIONS:
            raise ValueError(f"--loop {args.loop} is outside 1..{attacks.MAX_REPETITIONS}")
        self.own = args.pcap is None
        self.loop_given = args.loop  # for the sidecar: --loop as the user gave it (None: the default)
        self.home_net = parse_nets(args.home_net or (attacks.HOME_NET if self.own else "any"), "--home-net")
        self.watch = parse_nets(args.watch, "--watch").split(",") if args.watch else None
        if self.own:
            self.seed = args.seed
            self.repetitions = args.loop or self._repetitions_for(rates)
            self.loop = 1
            self.pcaps = {m: Path(tmpdir) / f"attacks-{m}.pcap" for m in self.starts}
            self.pcap = self.pcaps[self.starts[0]]
        else:
            self.pcap = check_pcap(args.pcap)
            self.pcaps = {"together": self.pcap}
            self.loop = args.loop or 1
            self.repetitions = None
            self.seed = None
        self.truth = None
        self.messages = attacks.rule_messages(self.rules)

    def _per_rep_bytes(self):
        """Mean bytes of one repetition: derived repetitions cycle through the
        crafted ones, so the crafted ones' mean is the mean."""
        if not hasattr(self, "_per_rep"):
            crafted = attacks.generate(seed=self.seed, repetitions=attacks.CRAFTED)
            self._per_rep = sum(len(f) for f in crafted.frames) / attacks.CRAFTED
        return self._per_rep

    def _repetitions_for(self, rates):
        numeric = [r for r in rates if r != "top"]
        if not numeric:
            return TOP_REPETITIONS
        return max(1, math.ceil(TARGET_SECONDS * max(numeric) * 1e6 / 8 / self._per_rep_bytes()))

    def prepare(self, rates, say=print):
        """Check everything that can be checked before a namespace exists (the
        rules with Suricata, each replay's length), then write the pcap (own
        traffic) and settle the truth."""
        suricata.check_rules(self.rules, self.home_net)
        if self.own:
            estimate = self._per_rep_bytes() * self.repetitions
            if estimate > MAX_PCAP_BYTES:
                raise ValueError(
                    f"--loop {self.repetitions} would make a {estimate / 1e9:.1f} GB pcap; the most "
                    f"is {MAX_PCAP_BYTES / 1e9:.1f} GB (tcpreplay holds it in memory)"
                )
            self._check_lengths(rates, estimate)
            say(f"lab bench ids: generating {self.repetitions} repetitions of the attack mix (seed {self.seed})")
            frames, self.truth = attacks.stream(seed=self.seed, repetitions=self.repetitions)
            n, size = self.elephants
            if n:  # spread over the mix, as concurrent transfers would be
                frames = list(frames)
                self.truth = self.truth + elephants.truth(n, size)
            for m in self.starts:  # the same frames in each pcap, the elephants' starts apart
                if n and m == "together":
                    say(f"lab bench ids: and {n} elephants of {size} bytes, starting together")
                    out = elephants.mix(frames, elephants.elephants(n, size, seed=self.seed)[0])
                elif n:
                    say(f"lab bench ids: and {n} elephants of {size} bytes, starting one every 1/{n} of the replay")
                    out = elephants.staggered(frames, n, size, seed=self.seed)
                else:
                    out = frames
                self.frames, self.bytes = attacks.write_pcap(self.pcaps[m], out)
                del out
            self.longest = 1514
        else:
            self.frames, self.bytes, self.longest = attacks.pcap_stats(self.pcap)
            if self.frames == 0:
                raise ValueError(f"pcap file {self.pcap} holds no frames")
            self._check_lengths(rates, self.bytes)
        if self.truth_file:
            self.truth = attacks.read_truth(self.truth_file)
            if not self.own and self.loop > 1:
                say(
                    "lab bench ids: note: --truth counts one pass of the pcap; with --loop the repeated "
                    "sessions are retransmissions to Suricata, so expected is left empty"
                )
                self.truth = None
        elif not self.own and self.loop == 1:
            say(f"lab bench ids: reading {self.pcap} offline with Suricata for the expected alerts")
            self.truth = suricata.offline(self.pcap, self.rules, self.home_net).alerts
        return self

    def truth_at(self, cutoff):
        """What the monitor must raise behind a cutoff: the mix's alerts (its sessions are
        short: every one lies within any cutoff the bench takes) and the elephants' markers
        that lie within it."""
        if self.truth is None or not cutoff or not self.elephants[0]:
            return self.truth
        n, size = self.elephants
        beyond = elephants.truth(n, size) - elephants.truth_within(n, size, cutoff)
        return self.truth - beyond

    @property
    def truth_source(self):
        """Where the expected alerts came from, for the sidecar."""
        if self.truth is None:
            return None
        return str(self.truth_file) if self.truth_file else ("generator" if self.own else "suricata offline")

    def _check_lengths(self, rates, nbytes):
        for rate in rates:
            if rate != "top":
                need = nbytes * 8 * self.loop / (rate * 1e6)
                if need > MAX_LOAD_SECONDS - 10:
                    raise ValueError(
                        f"one replay at {rate} Mbps would take {need:.0f} s, more than a load run "
                        f"may ({MAX_LOAD_SECONDS:.0f} s): use a higher rate or a smaller --loop"
                    )

    @property
    def mtu(self):
        """The testbed's MTU: 1500, or what the pcap's longest frame needs (a
        tunnel's frames are longer), so that every frame is replayed unchanged."""
        return max(1500, self.longest - 14)

    @property
    def preload(self):
        return self.bytes <= MAX_PCAP_BYTES

    def seconds_at(self, rate):
        """A bound on one replay: its length at the rate, plus room (top: the most any load may take)."""
        if rate == "top":
            return MAX_LOAD_SECONDS
        return min(MAX_LOAD_SECONDS, self.bytes * 8 * self.loop / (rate * 1e6) * 1.5 + 10)


# --- the runs ------------------------------------------------------------------------


def main(args):
    rates = parse_rates(args.rates)
    quotas = parse_quotas(args.cpu_quota)
    parse_list(args.at, str, AT, "--at place")
    parse_cutoffs(args.cutoff)
    parse_elephants(args.elephants)
    parse_starts(args.elephant_starts)
    _, cpus = checked_options(args, cpus="sender+monitor,receiver")
    df, _, path = measure(args, rates, quotas, args.trials, cpus, args.out)
    print_summary(df)
    print(f"\nwrote {path}, {signatures_path(path).name} and {path.with_suffix('.json').name}")
    return 0


def measure(args, rates, quotas, trials, cpus=(0, 1), out=None, progress=True):
    """The whole bench for options `args` (an argparse namespace, or see options()):
    prepare the traffic in a temporary directory, run, write. -> (df, sigs, path)"""
    with tempfile.TemporaryDirectory(prefix="vtl-ids-") as tmp:
        work = Workload(args, rates, tmp).prepare(rates, say=lambda m: print(m, file=sys.stderr))
        at = tuple(parse_list(getattr(args, "at", "local"), str, AT, "--at place"))
        cutoffs = tuple(parse_cutoffs(getattr(args, "cutoff", "0")))
        return run(work, rates, quotas, trials, cpus, out, progress, at=at, cutoffs=cutoffs)


def options(**kw):
    """The bench's options with their defaults, for measure() from Python (a notebook)."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args([], argparse.Namespace(**kw))


def signatures_path(path: Path) -> Path:
    return path.with_name(path.stem + "-signatures.csv")


def cores(cpus, trial):
    """(sender+monitor core, receiver core) of a trial: swapped every other
    trial, so that a core's own load (this VM's interrupts, steal) is not
    credited to one side. On this VM the same IDS dropped 54 % of packets on
    core 0 and 37 % on core 1 (5 % quota, 30 Mbps)."""
    return cpus if trial % 2 == 0 else cpus[::-1]


class RemoteTap:
    """vTAP sessions taking what the watch-list would (everything without one),
    to the collector in VXLAN: attached for the remote runs only."""

    def __init__(self, tb, watch, cutoff=0):
        rules = (
            [Rule("accept", **{side: net}) for net in watch for side in ("source", "destination")]
            if watch
            else [Rule("accept")]
        )
        self.tb = tb
        self.prog = SessionMirror(
            [Session(target=f"vxlan://{testbeds.COLLECTOR_V4}/1", rules=rules, cutoff=cutoff)],
            netns=tb.ns(tb.tap_host),
        )
        self.prog.load_program()
        self.filters = []

    def program_fds(self):
        return {"tap": self.prog.load("tap_ingress", "SCHED_CLS").fd}

    def attach(self):
        self.filters = self.prog.attach(self.tb.tap_iface, "ingress")
        if self.prog.flows:  # each run's flows from zero
            self.prog.table("flows").clear()

    def detach(self):
        for f in self.filters:
            self.prog.detach_tc(f)
        self.filters = []

    def counters(self):
        s = self.prog.session_counters().values()
        return {
            "mirrored": sum(c["sent"] for c in s),
            "mirrored_bytes": sum(c["frame_bytes"] for c in s),  # the frames, before the tunnel
            "cut": sum(c["cut"] for c in s),
        }

    def close(self):
        self.prog.close()


def run(work, rates, quotas, trials, cpus, out=None, progress=True, at=("local",), cutoffs=(0,)):
    rows, sig_rows = [], []
    variants = [(q, where, c, m) for q in quotas for where in at for c in cutoffs for m in work.starts]
    bar = Progress(max(1, trials * len(rates) * len(variants))) if progress else None
    tb = testbeds.testbed1(mtu=work.mtu, collector="remote" in at)
    with tb, BpfRunStats():
        # a tap per cutoff (0: the vTAP without a flow table), each compiled once
        local = {
            c: EbpfMirror(tb.ns(tb.tap_host), tb.tap_iface, tb.monitor_iface, watch=work.watch, cutoff=c)
            for c in cutoffs
        }
        remote = {c: RemoteTap(tb, work.watch, c) for c in cutoffs} if "remote" in at else {}
        try:
            for trial, rate, (quota, where, cutoff, starts) in interleaved(trials, rates, variants):
                tap = (remote if where == "remote" else local)[cutoff]
                tap.attach()
                try:
                    r, sigs = one_run(work, tb, tap, rate, quota, cores(cpus, trial), where, cutoff, starts)
                finally:
                    tap.detach()
                rows.append({"trial": trial, **r})
                sig_rows += [{"trial": trial, **s} for s in sigs]
                if bar:  # the trial as the CSV numbers it, from 0
                    cut = f" cutoff {cutoff}" if cutoff else ""
                    cut += f" {starts}" if len(work.starts) > 1 else ""
                    bar.step(f"{rate} Mbps quota {quota or 'none'} {where}{cut} trial {trial}")
        finally:
            for t in [*local.values(), *remote.values()]:
                t.close()
    df = columns_first(rows, COLUMNS)
    sig_df = columns_first(sig_rows, SIG_COLUMNS)
    params = {
        "rates": rates,
        "trials": trials,
        "cpu_quotas": quotas,
        "cpus": list(cpus),
        "pcap": None if work.own else str(work.pcap),
        "rules": str(work.rules),
        "home_net": work.home_net,
        # loop: --loop as given (own traffic: repetitions of the mix; a pcap: tcpreplay's
        # loop count); tcpreplay_loop: what tcpreplay was told (1 for own traffic)
        "watch": work.watch,
        "loop": work.loop_given,
        "tcpreplay_loop": work.loop,
        "repetitions": work.repetitions,
        "seed": work.seed,
        "pcap_frames": work.frames,
        "pcap_bytes": work.bytes,
        "mtu": work.mtu,
        "truth": work.truth_source,
        "at": list(at),
        "cutoffs": list(cutoffs),
        "elephants": {"flows": work.elephants[0], "bytes": work.elephants[1]},
        "elephant_starts": work.starts,
    }
    path = write_results(df, "ids", params, out)
    sig_df.to_csv(signatures_path(path), index=False)
    return df, sig_df, path


def one_run(work, tb, tap, rate, quota, cpus, where="local", cutoff=0, starts="together"):
    mon_cpu, rx_cpu = cpus
    # the monitor's IDS: on the monitor, or on the collector the tunnel goes to
    mon_ns, mon_iface = (
        (tb.ns("collector"), "eth0") if where == "remote" else (tb.ns(tb.monitor), tb.monitor_capture_iface)
    )
    steer_receive(tb.ns(tb.receiver), tb.receiver_iface, rx_cpu)
    steer_receive(mon_ns, mon_iface, mon_cpu)
    kw = {"rules": work.rules, "home_net": work.home_net, "quota_pct": quota}
    rx = suricata.Suricata(tb.ns(tb.receiver), tb.receiver_iface, cpu=rx_cpu, **kw)
    mon = suricata.Suricata(mon_ns, mon_iface, cpu=mon_cpu, **kw)
    try:
        rx.start()
        mon.start()
        before = tap.counters()
        fds = tap.program_fds()
        ran = {k: run_stats(fd) for k, fd in fds.items()}
        with Tcpreplay(
            tb.ns(tb.sender),
            tb.sender_iface,
            work.pcaps[starts],
            mbps=None if rate == "top" else rate,
            loop=work.loop,
            cpu=mon_cpu,
            preload=work.preload,
        ) as replay:
            rep = replay.send(seconds=work.seconds_at(rate))
        after = tap.counters()
        ran = {k: tuple(b - a for a, b in zip(ran[k], run_stats(fd), strict=True)) for k, fd in fds.items()}
        mirrored = after["mirrored"] - before["mirrored"]
        copied_bytes = after.get("mirrored_bytes", 0) - before.get("mirrored_bytes", 0)
        cut = after.get("cut", 0) - before.get("cut", 0)
        rx.wait_idle(rep.packets)
        mon.wait_idle(mirrored)
        cpu = {"receiver": rx.cpu_seconds(), "monitor": mon.cpu_seconds()}
        res = {"receiver": rx.stop(), "monitor": mon.stop()}
    finally:
        rx.close()
        mon.close()
    truths = {"receiver": work.truth, "monitor": work.truth_at(cutoff)}
    expected = sum(work.truth.values()) if work.truth is not None else None
    tap_ns, tap_runs = ran.get("tap", (0, 0))
    row = {
        "rate_mbps": None if rate == "top" else rate,
        "rate": str(rate),
        "cpu_quota_pct": quota,
        "monitor_at": where,
        "cutoff": cutoff,
        "elephant_starts": starts if work.elephants[0] else None,
        "achieved_mbps": rep.mbps,
        "achieved_kpps": rep.pps / 1e3,
        "packets_sent": rep.packets,
        "duration_s": round(rep.seconds, 3),
        "mirrored": mirrored,
        "cut": cut,
        # what reached the monitor's side, in Mbps of the frames copied (FCS included, as tcpreplay's)
        "monitor_mbps": (copied_bytes + 4 * mirrored) * 8 / rep.seconds / 1e6 if rep.seconds else None,
        "tap_ns_per_run": tap_ns / tap_runs if tap_runs else None,
        "expected_alerts": expected,
        "monitor_expected_alerts": sum(truths["monitor"].values()) if truths["monitor"] is not None else None,
        "packets_failed": rep.extra.get("failed", 0),
        "receiver_cpu": rx_cpu,
        "monitor_cpu": mon_cpu,
    }
    sigs = []
    for who, r in res.items():
        truth = truths[who]
        sent = rep.packets if who == "receiver" else mirrored
        row.update(
            {
                f"{who}_packets": r.kernel_packets,
                f"{who}_drops": r.kernel_drops,
                f"{who}_drop_rate": r.drop_rate,
                f"{who}_alerts": r.total_alerts,
                f"{who}_missed": max(0, sent - r.kernel_packets),
                f"{who}_cpu_s": cpu[who],
                f"{who}_correct": (dict(+r.alerts) == dict(+truth)) if truth is not None else None,
            }
        )
        # every signature of the whole truth, the monitor's too: one its cutoff keeps from it
        # is a row (expected 0, beyond_cutoff), not missing
        for sid in sorted(set(r.alerts) | set(truth or {}) | set(work.truth or {})):
            sigs.append(
                {
                    "rate_mbps": row["rate_mbps"],
                    "rate": row["rate"],
                    "cpu_quota_pct": quota,
                    "monitor_at": where,
                    "cutoff": cutoff,
                    "elephant_starts": row["elephant_starts"],
                    # a signature the cutoff keeps from the monitor (its bytes lie beyond it)
                    "beyond_cutoff": bool(work.truth and truth is not None and work.truth[sid] > truth[sid]),
                    "ids": who,
                    "sid": sid,
                    "alerts": r.alerts.get(sid, 0),
                    "expected": truth.get(sid, 0) if truth is not None else None,
                    "msg": r.messages.get(sid) or work.messages.get(sid, ""),
                }
            )
    return row, sigs


def print_summary(df, stream=sys.stdout):
    """Medians over trials per quota and rate, as the paper's Table 3."""
    failed = int(df["packets_failed"].fillna(0).sum()) if "packets_failed" in df else 0
    if failed:
        stream.write(
            f"\nwarning: tcpreplay could not send {failed} frames (packets_failed in the CSV): "
            "what the IDSes saw is less than the pcap\n"
        )
    stream.write(
        "\nmedian over trials [min..max]; drop rate = kernel drops / packets offered to Suricata;\n"
        "correct = trials whose alerts equal the expected ones, signature by signature\n"
    )
    if "monitor_at" not in df:
        df = df.assign(monitor_at="local")
    if "cutoff" not in df:  # a CSV from before the cutoff
        df = df.assign(cutoff=0, monitor_expected_alerts=df["expected_alerts"], monitor_mbps=float("nan"))
    cuts = df["cutoff"].nunique() > 1 or df["cutoff"].max() > 0
    if "elephant_starts" not in df:  # a CSV from before the staggered starts
        df = df.assign(elephant_starts=None)
    starts = df["elephant_starts"].nunique() > 1  # a column of its own only when it varies
    stream.write(
        f"  {'quota':>6} {'rate':>6} {'at':>6}"
        + (f" {'cutoff':>8}" if cuts else "")
        + (f" {'starts':>9}" if starts else "")
        + f" {'Mbps':>6} | {'receiver alerts':>22} {'drop %':>6} "
        f"{'correct':>7} | {'monitor alerts':>22} {'drop %':>6} {'correct':>7}"
        + (f" {'mon Mbps':>8}" if cuts else "")
        + f" | {'expected':>8}\n"
    )
    df = df.assign(q=df["cpu_quota_pct"].map(lambda q: "none" if pd.isna(q) else f"{int(q)} %"))
    keys = ["q", "rate", "monitor_at", "cutoff", "elephant_starts"]
    for (q, rate, where, cutoff, start), g in df.groupby(keys, sort=False, dropna=False):

        def span(col, *, g=g):  # this group, bound now
            return f"{g[col].median():8.0f} [{g[col].min():.0f}..{g[col].max():.0f}]"

        exp, mexp = g["expected_alerts"].iloc[0], g["monitor_expected_alerts"].iloc[0]
        expected = "" if pd.isna(exp) else str(int(exp)) if exp == mexp or pd.isna(mexp) else f"{int(exp)}/{int(mexp)}"
        stream.write(
            f"  {q:>6} {rate:>6} {where:>6}"
            + (f" {_size(cutoff):>8}" if cuts else "")
            + (f" {start:>9}" if starts else "")
            + f" {g['achieved_mbps'].median():6.1f} | "
            f"{span('receiver_alerts'):>22} "
            f"{100 * g['receiver_drop_rate'].median():6.2f} {correct(g['receiver_correct']):>7} | "
            f"{span('monitor_alerts'):>22} {100 * g['monitor_drop_rate'].median():6.2f} "
            f"{correct(g['monitor_correct']):>7}"
            + (f" {g['monitor_mbps'].median():8.1f}" if cuts else "")
            + f" | {expected:>8}\n"
        )
    if cuts:
        stream.write("  expected: the receiver's / the monitor's behind its cutoff, when they differ\n")


def _size(n):
    n = int(n)
    return "none" if not n else f"{n >> 20}M" if not n % (1 << 20) else f"{n >> 10}K" if not n % 1024 else str(n)


def correct(column):
    """Trials correct of those judged, as "2/3"; empty without expected alerts
    (a pcap of the user's with --loop, where nothing is known to expect)."""
    judged = column.dropna()
    return f"{int(judged.astype(bool).sum())}/{len(judged)}" if len(judged) else ""
