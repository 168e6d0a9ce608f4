"""python -m lab bench ids-loop: the closed loop of a tap that keeps the IDS up. The
monitor's vTAP cuts every flow after its first bytes (--cutoff), and follows the
monitor's Suricata alerts: a host an alert names is copied whole from then on, so the
IDS sees the rest of what that host does.

    sender eth0 ---- eth0 receiver mon0 ---- eth0 monitor
      tcpreplay        vTAP (cutoff)  <---- alerts ---- Suricata

The workload (lab.traffic.elephants.paced): --attackers + --benign TCP transfers of
--size bytes from outside hosts, each paced at --mbps, one starting every --every
seconds, replayed at their recorded pace. An attacker's transfer carries two markers:
one 32 KiB in (sid 9100040, within the cutoff: it raises the alert), one 512 KiB in
(sid 9100041, beyond it: the monitor sees it only if the loop had the attacker's
traffic copied whole in time). A benign transfer carries none.

Three modes, interleaved within each trial, each with a fresh tap and a fresh Suricata:
  cutoff   the cut alone: the 512 KiB marker never reaches the monitor
  alerts   the cut, and alerts steering it (follow_alerts, the attacker's address, held)
  whole    nothing cut: every marker, and every byte, at the monitor

Per run: frames and Mbps at the monitor, Suricata's drops, alerts of each marker against
the attackers, hosts held, and per held host two waits: from the alert's line being
written to the host's first whole copy (what the tap measures), and from the packet
that raised it (the alert's timestamp) to that copy. The per-host waits go to a second
CSV."""

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from ebpf import TcMirror
from ebpf.errors import InputError
from ebpf.vtap.cutoff import parse_size
from ebpf.vtap.steer import INTERVAL
from lab import testbeds
from lab.bench.common import Progress, add_options, checked_options, columns_first, interleaved, parse_list
from lab.daemons import suricata
from lab.metrics import write_results
from lab.traffic import attacks, elephants
from lab.traffic.replay import Tcpreplay
from lab.traffic.report import MAX_LOAD_SECONDS

NAME = "ids-loop"
SUMMARY = "alerts steer the cutoff tap: each attacker copied whole after its alert, time from alert to copy"
DESCRIPTION = __doc__.split("\n\n", 1)[1]
EXAMPLES = """\
examples:
  python -m lab bench ids-loop                               # 20 attackers, 20 benign, 3 trials
  python -m lab bench ids-loop --modes alerts --trials 1     # the loop alone
  python -m lab bench ids-loop --attackers 4 --benign 2 --size 600K --mbps 1 --trials 1
                                                             # a small run (the test's)
"""
MODES = ("cutoff", "alerts", "whole")
EARLY, LATE = elephants.MARKS[32 << 10], elephants.MARKS[512 << 10]  # within, beyond the cutoff
COLUMNS = [
    "mode",
    "trial",
    "cutoff",
    "attackers",
    "benign",
    "held",
    "first_copies",
    "wait_median_s",
    "wait_max_s",
    "wait_from_packet_median_s",
    "wait_from_packet_max_s",
    "early_alerts",
    "late_alerts",
    "late_expected",
    "correct",
    "mirrored",
    "monitor_mbps",
    "sent_mbps",
    "monitor_drops",
    "monitor_drop_rate",
    "cut",
    "duration_s",
    "packets_sent",
    "alerts_read",
]
WAIT_COLUMNS = ["mode", "trial", "host", "wait_s", "wait_from_packet_s"]


def add_arguments(p):
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("--modes", default=",".join(MODES), help="which of cutoff,alerts,whole (default %(default)s)")
    add_options(p, trials=3, cpus="sender,monitor's Suricata")
    p.add_argument("--attackers", type=int, default=20, help="transfers that raise alerts (default %(default)s)")
    p.add_argument("--benign", type=int, default=20, help="transfers that raise none (default %(default)s)")
    p.add_argument("--size", default="1M", help="bytes of each transfer, at least 513K (default %(default)s)")
    p.add_argument("--mbps", type=float, default=2.0, help="each transfer's pace in Mbps (default %(default)s)")
    p.add_argument(
        "--every", type=float, default=0.5, help="seconds between two transfers' starts (default %(default)s)"
    )
    p.add_argument(
        "--cutoff", default="64K", help="the tap's cutoff in the cutoff and alerts modes (default %(default)s)"
    )
    p.add_argument("--hold", type=float, default=60.0, help="seconds an alert holds its host (default %(default)s)")
    p.add_argument(
        "--cpu-quota",
        default="none",
        metavar="PCT|none",
        help="CPU quota of the monitor's Suricata, percent of one core (default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the transfers' sequence numbers (default %(default)s)")


class Plan:
    """The options, checked (a ValueError in one line), and the workload they make."""

    def __init__(self, args):
        self.modes = parse_list(args.modes, str, MODES, "mode")
        if not 1 <= args.attackers <= 100 or not 0 <= args.benign <= 100:
            raise ValueError("--attackers must be 1..100 and --benign 0..100")
        self.attackers, self.benign = args.attackers, args.benign
        try:
            self.size = parse_size(args.size, "--size")
            self.cutoff = parse_size(args.cutoff, "--cutoff")
        except InputError as e:
            raise ValueError(str(e)) from None
        late_end = (512 << 10) + len(elephants.MARK_TEXT[512 << 10])
        if not late_end <= self.size <= 64 << 20:
            raise ValueError(f"--size must hold the 512 KiB marker ({late_end} bytes) and be at most 64M")
        if not (32 << 10) + 32 <= self.cutoff < 512 << 10:
            raise ValueError("--cutoff must keep the 32 KiB marker and cut before the 512 KiB one (33K..511K)")
        if not 0.05 <= args.mbps <= 1000 or not 0.01 <= args.every <= 60:
            raise ValueError("--mbps must be 0.05..1000 and --every 0.01..60 s")
        if not 1 <= args.hold <= 86400:
            raise ValueError("--hold must be 1..86400 s")
        self.mbps, self.every, self.hold, self.seed = args.mbps, args.every, args.hold, args.seed
        q = str(args.cpu_quota)
        if q in ("none", "0"):
            self.quota = None
        elif q.isdigit() and 1 <= int(q) <= 100:
            self.quota = int(q)
        else:
            raise ValueError(f"--cpu-quota must be a percent of a core (1..100) or none, not {q!r}")
        self.length = (self.attackers + self.benign - 1) * self.every + self.size * 8 * 1.06 / (self.mbps * 1e6)
        if self.length > MAX_LOAD_SECONDS - 20:
            raise ValueError(f"the transfers would last {self.length:.0f} s, more than a load run may")
        # held hosts at once: every attacker, and room for the others' families (v4 only here)
        self.watch_max = max(64, 2 * self.attackers)

    def write(self, pcap):
        timed, self.bad = elephants.paced(self.attackers, self.benign, self.size, self.mbps, self.every, seed=self.seed)
        self.frames, self.bytes = elephants.write_timed_pcap(pcap, timed)
        self.pcap = pcap
        return self


def main(args):
    _, cpus = checked_options(args, cpus="sender,monitor's Suricata")
    df, waits, path = measure(args, args.trials, cpus, args.out)
    print_summary(df)
    print(f"\nwrote {path}, {waits_path(path).name} and {path.with_suffix('.json').name}")
    return 0


def options(**kw):
    """The bench's options with their defaults, for measure() from Python (a notebook)."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args([], argparse.Namespace(**kw))


def waits_path(path: Path) -> Path:
    return path.with_name(path.stem + "-waits.csv")


def measure(args, trials, cpus=(0, 1), out=None, progress=True):
    """The whole bench for options `args` (see options()). -> (df, waits_df, path)"""
    plan = Plan(args)
    suricata.check_rules(attacks.RULES, attacks.HOME_NET)
    with tempfile.TemporaryDirectory(prefix="vtl-loop-") as tmp:
        plan.write(Path(tmp) / "paced.pcap")
        rows, waits = [], []
        bar = Progress(trials * len(plan.modes)) if progress else None
        with testbeds.testbed1() as tb:
            for trial, _, mode in interleaved(trials, [None], plan.modes):
                row, w = one_run(plan, tb, mode, cpus)
                rows.append({"trial": trial, **row})
                waits += [{"mode": mode, "trial": trial, **x} for x in w]
                if bar:
                    bar.step(f"{mode} trial {trial}")
    df = columns_first(rows, COLUMNS)
    waits_df = columns_first(waits, WAIT_COLUMNS)
    params = {
        "modes": plan.modes,
        "trials": trials,
        "cpus": list(cpus),
        "attackers": plan.attackers,
        "benign": plan.benign,
        "size": plan.size,
        "mbps_each": plan.mbps,
        "every_s": plan.every,
        "cutoff": plan.cutoff,
        "hold_s": plan.hold,
        "cpu_quota_pct": plan.quota,
        "seed": plan.seed,
        "pcap_frames": plan.frames,
        "pcap_bytes": plan.bytes,
        "poll_interval_s": INTERVAL,
    }
    path = write_results(df, "ids_loop", params, out)
    waits_df.to_csv(waits_path(path), index=False)
    return df, waits_df, path


def _tap(plan, tb, mode):
    """A fresh tap for one run: every frame watched, cut unless `whole`; in `alerts`,
    the attackers it hears of are held whole."""
    kw = {"cutoff": plan.cutoff} if mode != "whole" else {}
    return TcMirror(
        tb.monitor_iface,
        watch=["0.0.0.0/0", "::/0"],
        netns=tb.ns(tb.tap_host),
        watch_max=plan.watch_max,
        **kw,
    )


def one_run(plan, tb, mode, cpus):
    send_cpu, ids_cpu = cpus
    mon = suricata.Suricata(
        tb.ns(tb.monitor),
        tb.monitor_capture_iface,
        rules=attacks.RULES,
        home_net=attacks.HOME_NET,
        cpu=ids_cpu,
        quota_pct=plan.quota,
    )
    tap = _tap(plan, tb, mode)
    first_wall = {}
    try:
        tap.attach(tb.tap_iface, "ingress")
        mon.start()
        if mode == "alerts":
            tap.follow_alerts(mon.eve_path, watch="src", hold=plan.hold)
        with Tcpreplay(tb.ns(tb.sender), tb.sender_iface, plan.pcap, cpu=send_cpu, as_recorded=True) as replay:
            rep = replay.send(seconds=plan.length + 10)
        c = tap.counters()
        mon.wait_idle(c["cloned"])
        time.sleep(2 * INTERVAL)  # the alerts file read once more: the last alerts counted
        alert = tap.alert_counters()
        waits = tap.alert_waits()
        offset = time.time() - time.monotonic()  # first_match_ns is CLOCK_MONOTONIC
        for host in plan.bad:
            ns = tap.first_match_ns(host) if mode == "alerts" else 0
            if ns:
                first_wall[host] = ns / 1e9 + offset
        res = mon.stop()
        raised = alert_times(mon.eve_path)  # before close(), which removes the directory
    finally:
        tap.close()
        mon.close()
    from_packet = {h: max(0.0, first_wall[h] - raised[h]) for h in first_wall if h in raised}
    seconds = [w for _, w in waits]
    late_expected = plan.attackers if mode != "cutoff" else 0
    early, late = res.alerts.get(EARLY, 0), res.alerts.get(LATE, 0)
    row = {
        "mode": mode,
        "cutoff": plan.cutoff if mode != "whole" else 0,
        "attackers": plan.attackers,
        "benign": plan.benign,
        "held": alert.get("alert_added", 0),
        "first_copies": alert.get("alert_first_copies", 0),
        "wait_median_s": statistics.median(seconds) if seconds else None,
        "wait_max_s": max(seconds) if seconds else None,
        "wait_from_packet_median_s": statistics.median(from_packet.values()) if from_packet else None,
        "wait_from_packet_max_s": max(from_packet.values()) if from_packet else None,
        "early_alerts": early,
        "late_alerts": late,
        "late_expected": late_expected,
        # every attacker's early marker, and the late one as the mode allows; nothing else
        "correct": early == plan.attackers and late == late_expected and res.total_alerts == early + late,
        "mirrored": c["cloned"],
        # the copies, in Mbps of frames with FCS (as tcpreplay counts what it sends)
        "monitor_mbps": (c["cloned_bytes"] + 4 * c["cloned"]) * 8 / rep.seconds / 1e6 if rep.seconds else None,
        "sent_mbps": rep.mbps,
        "monitor_drops": res.kernel_drops,
        "monitor_drop_rate": res.drop_rate,
        "cut": c.get("cut", 0),
        "duration_s": round(rep.seconds, 3),
        "packets_sent": rep.packets,
        "alerts_read": alert.get("alerts", 0),
    }
    per_host = [{"host": str(h), "wait_s": w, "wait_from_packet_s": from_packet.get(str(h))} for h, w in waits]
    return row, per_host


def alert_times(eve) -> dict:
    """{src address: when its earliest alert's packet was seen (time.time() scale)} from
    an EVE file: Suricata stamps an alert with its packet's capture time."""
    out = {}
    try:
        lines = Path(eve).read_text(errors="replace").splitlines()
    except OSError:
        return out
    for ln in lines:
        try:
            ev = json.loads(ln)
        except ValueError:
            continue
        if not isinstance(ev, dict) or ev.get("event_type") != "alert":
            continue
        try:
            t = datetime.strptime(ev["timestamp"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
        except (KeyError, ValueError):
            continue
        src = ev.get("src_ip")
        if src and (src not in out or t < out[src]):
            out[src] = t
    return out


def print_summary(df, stream=sys.stdout):
    """Per mode, medians over trials [min..max]."""
    stream.write(
        "\nmedian over trials [min..max]; wait: from an alert's line written to its host's first whole copy;\n"
        "late: the 512 KiB marker, beyond the cutoff (the monitor sees it only through the loop)\n"
        f"  {'mode':>7} {'held':>5} {'wait s':>18} {'from packet s':>18} {'early':>6} {'late':>9} "
        f"{'correct':>7} {'mon Mbps':>16} {'drop %':>6}\n"
    )

    def span(g, col, fmt):
        v = g[col].dropna()
        if v.empty:
            return "-"
        return f"{v.median():{fmt}} [{v.min():{fmt}}..{v.max():{fmt}}]"

    for mode, g in df.groupby("mode", sort=False):
        ok = g["correct"].astype(bool)
        stream.write(
            f"  {mode:>7} {g['held'].median():5.0f} {span(g, 'wait_median_s', '.2f'):>18} "
            f"{span(g, 'wait_from_packet_median_s', '.2f'):>18} {g['early_alerts'].median():6.0f} "
            f"{g['late_alerts'].median():4.0f}/{g['late_expected'].iloc[0]:<4.0f} {f'{ok.sum()}/{len(ok)}':>7} "
            f"{span(g, 'monitor_mbps', '.1f'):>16} {100 * g['monitor_drop_rate'].median():6.2f}\n"
        )
