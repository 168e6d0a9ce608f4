"""What a run measured: CPU per core (mpstat's columns), interface and BPF
counters, and results written as CSV with a JSON sidecar saying where they came from.

    >>> with CpuSampler(interval=1.0) as cpu:              # doctest: +SKIP
    ...     run_the_load()
    >>> cpu.summary()                 # one row per core and "all": %usr ... %idle, busy_ns
    >>> cpu.busy_ns(core=1) / packets # the DUT's CPU cost per packet

Why busy time rather than %soft: threaded NAPI, which the lab uses to keep the
device under test on its own core, is accounted as %sys, and on this VM packets
per second move with steal time far more than nanoseconds of busy CPU per
packet do.

Why busy time is wall time minus idle, not the sum of the busy columns: /proc/stat's
user/system/softirq/... are sampled by the timer tick, and a tickless kernel stops
the tick while a core idles. A load that comes in bursts (a paced generator sends
one every millisecond) then aliases with the tick: at 300 kpps the DUT's busy
columns summed to anything from 170 to 2010 ms per 2.3 s, while its NAPI thread
ran 690 ms. Idle and iowait are measured exactly on entry and exit of idle, so
busy = elapsed - idle - iowait is right (to /proc/stat's 10 ms) at any load. The
mpstat columns keep the tick's split of that busy time.
"""

from __future__ import annotations  # pd.DataFrame in signatures, pandas imported where used

import errno
import json
import os
import platform
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from ebpf.netdev import ifindex_of

from . import netns
from .counters import IFACE_FIELDS, IfaceCounters, iface_counters  # noqa: F401 (their old home)
from .paths import IN_CHECKOUT, REPO

if TYPE_CHECKING:
    import pandas as pd

# pandas (0.7 s of CPU to import) only where a DataFrame is made: most importers of this
# module want counters or a sampler's numbers (every command that attaches a mirror, a
# host's cleanup), and each of them is a process of its own.

# mpstat's columns, from /proc/stat's fields (user and nice include guest time).
CPU_COLUMNS = ["usr", "nice", "sys", "iowait", "irq", "soft", "steal", "guest", "gnice", "idle"]
_STAT_FIELDS = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice"]
USER_HZ = os.sysconf("SC_CLK_TCK")
RESULTS_DIR = REPO / "datasets" / "results"
PAPER_DIR = REPO / "datasets" / "paper"  # the source documents' tables (datasets/paper/README.md)


def results_dir() -> Path:
    """Where results go without --out: the checkout's datasets/results, or, for an
    installed package, datasets/results under the current directory."""
    return RESULTS_DIR if IN_CHECKOUT else Path.cwd() / "datasets" / "results"


def read_proc_stat(path="/proc/stat") -> dict:
    """{"all": fields, 0: fields, 1: fields, ...}, each a dict of jiffies."""
    cpus = {}
    with open(path) as f:
        for line in f:
            if not line.startswith("cpu"):
                break
            name, *vals = line.split()
            vals = [int(v) for v in vals[: len(_STAT_FIELDS)]]
            vals += [0] * (len(_STAT_FIELDS) - len(vals))
            key = "all" if name == "cpu" else int(name[3:])
            cpus[key] = dict(zip(_STAT_FIELDS, vals, strict=True))  # vals: cut or padded to the fields
    return cpus


def _interval_ns(before: dict, after: dict, elapsed_ns=None) -> dict:
    """Nanoseconds of each mpstat column between two readings of one CPU, and total_ns."""
    d = {k: after[k] - before[k] for k in _STAT_FIELDS}
    cols = {
        "usr": d["user"] - d["guest"],
        "nice": d["nice"] - d["guest_nice"],
        "sys": d["system"],
        "iowait": d["iowait"],
        "irq": d["irq"],
        "soft": d["softirq"],
        "steal": d["steal"],
        "guest": d["guest"],
        "gnice": d["guest_nice"],
        "idle": d["idle"],
    }
    ticks = sum(d[k] for k in _STAT_FIELDS if k not in ("guest", "guest_nice"))
    tick_ns = 1e9 / USER_HZ
    if elapsed_ns is None:
        ns = {k: v * tick_ns for k, v in cols.items()}
        ns["total_ns"] = ticks * tick_ns
        return ns
    total_ns = max(elapsed_ns, (d["idle"] + d["iowait"]) * tick_ns)
    busy = total_ns - (d["idle"] + d["iowait"]) * tick_ns
    sampled = ticks - d["idle"] - d["iowait"]
    ns = {k: (v / sampled * busy if sampled else 0.0) for k, v in cols.items()}
    if not sampled:
        ns["sys"] = busy  # busy between ticks only: kernel work, the tick never saw it
    ns["idle"], ns["iowait"] = d["idle"] * tick_ns, d["iowait"] * tick_ns
    ns["total_ns"] = total_ns
    return ns


def _percent(ns: dict) -> dict:
    total_ns = ns["total_ns"]
    pct = {k: (100.0 * ns[k] / total_ns if total_ns else 0.0) for k in CPU_COLUMNS}
    pct["busy_ns"] = total_ns - ns["idle"] - ns["iowait"]
    pct["total_ns"] = total_ns
    return pct


def cpu_percent(before: dict, after: dict, elapsed_ns=None) -> dict:
    """mpstat's columns (percent) between two readings of one CPU, plus busy_ns:
    the time it was neither idle nor waiting for I/O. With elapsed_ns (the wall
    time between the readings, times the cores for "all"), busy is elapsed minus
    idle and iowait, and the busy columns share it in the tick's proportions (see
    the module's docstring); without, everything comes from the tick's counts."""
    return _percent(_interval_ns(before, after, elapsed_ns))


class CpuSampler:
    """Reads /proc/stat every `interval` seconds in a thread until stopped.

    samples() gives one row per core per interval (like `mpstat -P ALL 1`);
    summary() one row per core over the whole window.
    """

    def __init__(self, interval=1.0):
        self.interval = interval
        self._readings = []  # (monotonic time, read_proc_stat())
        self._stop = threading.Event()
        self._thread = None

    @classmethod
    def of(cls, readings):
        """A sampler over readings taken elsewhere: [(monotonic time, read_proc_stat()), ...]
        (a host's runner reads at the first and the last frame of its own window)."""
        sampler = cls()
        sampler._readings = list(readings)
        return sampler

    def within(self, start, end):
        """The sampler over the fewest readings that span [start, end] (time.monotonic()
        seconds; bpf_ktime_get_ns() is the same clock): a host's CPU over its own window."""
        times = [t for t, _ in self._readings]
        first = max([i for i, t in enumerate(times) if t <= start], default=0)
        last = min([i for i, t in enumerate(times) if t >= end], default=len(times) - 1)
        return CpuSampler.of(self._readings[first : last + 1])

    def start(self):
        self._readings = [(time.monotonic(), read_proc_stat())]
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(self.interval):
            self._readings.append((time.monotonic(), read_proc_stat()))

    def stop(self):
        self._stop.set()
        if self._thread:
            self._thread.join()
            self._thread = None
        self._readings.append((time.monotonic(), read_proc_stat()))
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    @property
    def seconds(self):
        return self._readings[-1][0] - self._readings[0][0] if len(self._readings) > 1 else 0.0

    def _intervals(self):
        """{cpu: ns} for each pair of consecutive readings."""
        out = []
        for (t0, a), (t1, b) in zip(self._readings, self._readings[1:], strict=False):
            cores = len(b) - 1  # every key but "all"
            out.append(
                (t1, {cpu: _interval_ns(a[cpu], b[cpu], (t1 - t0) * 1e9 * (cores if cpu == "all" else 1)) for cpu in b})
            )
        return out

    def samples(self) -> pd.DataFrame:
        import pandas as pd  # noqa: PLC0415

        rows = []
        for t1, per_cpu in self._intervals():
            rows += [
                {"t": round(t1 - self._readings[0][0], 3), "cpu": cpu, **_percent(ns)} for cpu, ns in per_cpu.items()
            ]
        return pd.DataFrame(rows)

    def summary(self) -> pd.DataFrame:
        """The window's sums of the samples' nanoseconds: computed over the whole window
        at once, the clamp of total to idle (an interval whose idle ticks outrun its
        wall time, the tick and the reading not lining up) would fall differently, and
        the window's busy time would not be the sum of its seconds' busy times."""
        import pandas as pd  # noqa: PLC0415

        totals = {}
        for _, per_cpu in self._intervals():
            for cpu, ns in per_cpu.items():
                acc = totals.setdefault(cpu, dict.fromkeys(ns, 0.0))
                for k, v in ns.items():
                    acc[k] += v
        return pd.DataFrame([{"cpu": cpu, **_percent(ns)} for cpu, ns in totals.items()]).set_index("cpu")

    def busy_ns(self, core) -> float:
        """Busy nanoseconds of one core (or "all") over the whole window."""
        return float(self.summary().loc[core, "busy_ns"])


def host_cpu(cpu) -> dict:
    """The whole host's CPU over a sampler's window, as percent of all its cores (on
    namespaces as hosts, the machine's: every host shares its cores)."""
    s = cpu.summary().loc["all"]
    busy = 100.0 - float(s["idle"]) - float(s["iowait"])
    return {"busy_pct": round(busy, 2), "sys_pct": round(float(s["sys"]), 2), "soft_pct": round(float(s["soft"]), 2)}


# --- results ---------------------------------------------------------------


def _version(argv, pattern=r"(\d+(?:\.\d+)+)"):
    if not shutil.which(argv[0]):
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(pattern, out.stdout + out.stderr)
    return m.group(1) if m else None


def _module_version(name):
    try:
        mod = __import__(name)
    except ImportError:
        return None
    return getattr(mod, "__version__", None)


def git_commit():
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except OSError:
        return None
    return (rev + ("-dirty" if dirty else "")) or None


# The commit of the code this process runs: read once, when the lab is imported,
# so that a long sweep is not credited to commits made while it ran.
RUN_COMMIT = git_commit()


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _generator_path():
    """How the XDP generator sends here (live frames, or AF_PACKET where the kernel
    refuses them): its rates are comparable only with rates sent the same way."""
    from .traffic.xdpgen import generator_path  # noqa: PLC0415 (BPF and ctypes only when a result is written)

    try:
        return generator_path()
    except Exception as e:  # noqa: BLE001 (metadata: say what was wrong, never fail the result)
        return f"unknown ({e})"


def machine_metadata() -> dict:
    """Where a result came from: kernel, CPU, commit, date and tool versions."""
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "kernel": platform.release(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "commit": RUN_COMMIT,
        "host": platform.node(),
        "xdp_generator": _generator_path(),
        "tools": {
            "python": platform.python_version(),
            "bcc": _module_version("bcc"),
            "pyroute2": _module_version("pyroute2"),
            "scapy": _module_version("scapy"),
            "pandas": _module_version("pandas"),
            "trafgen": _version(["trafgen", "-v"]),
            "iperf3": _version(["iperf3", "--version"]),
            "nft": _version(["nft", "--version"]),
            "ovs-vswitchd": _version(["ovs-vswitchd", "--version"]),
            "suricata": _version(["suricata", "-V"]),
            "tcpreplay": _version(["tcpreplay", "-V"]),
        },
    }


def write_results(df: pd.DataFrame, name: str, params: dict, out_dir=None, extra=None, companion_of=None) -> Path:
    """Write df as <out_dir>/<name>-<UTC time>.csv beside a .json sidecar holding
    the machine metadata and the exact parameters. Returns the CSV path.
    companion_of: a CSV this one belongs with (`redirect_transfer_cpu-` beside
    `redirect_transfer-`): it takes that one's time, so one name gives the other,
    even when the second is written a second later."""
    out = Path(out_dir) if out_dir else results_dir()
    out.mkdir(parents=True, exist_ok=True)
    if companion_of is not None:
        stamp = re.search(r"\d{8}T\d{6}Z(-\d+)?$", Path(companion_of).stem).group(0)
    else:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"{name}-{stamp}.csv"
    n = 1
    while path.exists():
        n += 1
        path = out / f"{name}-{stamp}-{n}.csv"
    df.to_csv(path, index=False)
    meta = {
        "name": name,
        "csv": path.name,
        "rows": len(df),
        "columns": list(df.columns),
        "parameters": params,
        **machine_metadata(),
        **(extra or {}),
    }
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return path


def read_results(path) -> tuple[pd.DataFrame, dict]:
    """A results CSV and its sidecar."""
    import pandas as pd  # noqa: PLC0415

    path = Path(path)
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return pd.read_csv(path), meta


# --- where the receive work runs ------------------------------------------------------------


def napi_threads(ifname=None):
    """{pid: comm} of every threaded-NAPI kthread ("napi/<dev>-<id>"), or of one
    interface's. (NAPI: the kernel's polled receive path of a device; threaded,
    it runs in a kernel thread of its own instead of softirq, so its time can be
    read and pinned.)"""
    prefix = f"napi/{ifname}-" if ifname else "napi/"
    found = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                comm = (p / "comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith(prefix):
                found[int(p.name)] = comm
    return found


# Generic netlink by hand (pyroute2 0.9 has no netdev family). lab/hosts/library/lab_facts.py
# has its own copy: an Ansible module is sent to a host alone, before the lab is there.
_NETDEV_CMD_NAPI_GET, _NAPI_IFINDEX, _NAPI_PID = 11, 1, 4  # include/uapi/linux/netdev.h


def _genl_family(sock, name) -> int:
    payload = struct.pack("BBH", 3, 1, 0) + _nlattr(2, name.encode() + b"\0")  # CTRL_CMD_GETFAMILY, _NAME
    sock.send(struct.pack("IHHII", 16 + len(payload), 0x10, 1, 1, 0) + payload)
    data = sock.recv(65536)
    if struct.unpack_from("H", data, 4)[0] == 2:  # NLMSG_ERROR: no such family (a kernel before 6.3)
        raise OSError(errno.ENOENT, f"no {name} netlink family")
    return struct.unpack("H", _nlattrs(data[20:])[1][:2])[0]  # CTRL_ATTR_FAMILY_ID


def _nlattr(kind, payload):
    body = struct.pack("HH", 4 + len(payload), kind) + payload
    return body + b"\0" * (-len(body) % 4)


def _nlattrs(data):
    out, i = {}, 0
    while i + 4 <= len(data):
        length, kind = struct.unpack_from("HH", data, i)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[i + 4 : i + length]
        i += (length + 3) & ~3
    return out


def napi_kthreads(ns, ifname) -> list[int]:
    """The pids of the interface's threaded-NAPI kthreads, from the kernel's netdev
    netlink family (NAPI_GET, 6.8+): by the device itself, not by a kthread's name,
    which names only the device ("napi/eth1-8195"), and every host of lab.hosts.nshosts
    has an eth1. A kthread the kernel keeps when threading is turned off and on again
    is found too."""
    with netns.ipr(ns) as ip:
        ifindex = ifindex_of(ip, ifname, ns)
    with netns.entered(ns):  # (not /sys/class/net: setns() leaves /sys the caller's)
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16)  # NETLINK_GENERIC
    with sock:
        sock.settimeout(2)
        family = _genl_family(sock, "netdev")
        payload = struct.pack("BBH", _NETDEV_CMD_NAPI_GET, 1, 0) + _nlattr(_NAPI_IFINDEX, struct.pack("I", ifindex))
        sock.send(struct.pack("IHHII", 16 + len(payload), family, 0x301, 2, 0) + payload)  # REQUEST | DUMP
        pids = []
        while True:
            data, i = sock.recv(65536), 0
            while i + 16 <= len(data):
                length, kind = struct.unpack_from("IH", data, i)
                if kind in (2, 3):  # NLMSG_ERROR, NLMSG_DONE
                    return sorted(pids)
                attrs = _nlattrs(data[i + 20 : i + length])
                if _NAPI_PID in attrs and struct.unpack("I", attrs[_NAPI_IFINDEX][:4])[0] == ifindex:
                    pids.append(struct.unpack("I", attrs[_NAPI_PID][:4])[0])
                i += (length + 3) & ~3


def threaded_napi(ns, ifname, cpu=None) -> list[int]:
    """Switch the interface's NAPI to a kthread of its own and pin that to `cpu`
    (if given), so that its receive work runs there and is counted there. The
    interface must have NAPI (on veth: an XDP program, or GRO). Returns the
    kthreads' pids."""
    netns.run(ns, ["sh", "-c", f"echo 1 > /sys/class/net/{ifname}/threaded"])
    deadline = time.monotonic() + 5
    pids = []
    while not pids and time.monotonic() < deadline:
        pids = napi_kthreads(ns, ifname)
        time.sleep(0.02)
    if not pids:
        raise netns.LabError(f"threaded NAPI on {ifname} in {ns}: no napi kthread appeared")
    for pid in pids if cpu is not None else ():
        os.sched_setaffinity(pid, {cpu})
    return pids


def steer_receive(ns, ifname, cpu):
    """RPS: the receive work of every packet arriving on the interface (from the
    backlog on: taps, tc, the stack) runs on `cpu`, whichever core the sender
    used. On veth without NAPI, the sender's core would otherwise do it."""
    mask = format(1 << cpu, "x")
    netns.run(ns, ["sh", "-c", f"for q in /sys/class/net/{ifname}/queues/rx-*; do echo {mask} > $q/rps_cpus; done"])


# --- what a process costs ------------------------------------------------------------------


def on_cpu_ns(pids) -> int:
    """Time on CPU of every thread of the processes, in ns (schedstat)."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                total += int(task.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total


def pss_bytes(pids) -> int:
    """Proportional set size of the processes: their memory, shared pages split
    among those that share them."""
    total = 0
    for pid in pids:
        try:
            for line in open(f"/proc/{pid}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def busy_ticks() -> tuple[int, int]:
    """The machine's time doing anything (user, nice, system, irq, softirq) and
    its time stolen by the hypervisor, in USER_HZ ticks, all CPUs."""
    c = read_proc_stat()["all"]
    return sum(c[k] for k in ("user", "nice", "system", "irq", "softirq")), c["steal"]


# --- where frames are lost: per run, read before and after ---------------------------------------
# A veth that cannot hand a frame to its peer counts it in its own tx_dropped: the peer's
# NAPI ring or its CPU's backlog was full (an skb sender), or an XDP_TX or redirect into
# it was refused (veth_get_stats64 adds those in). Its receiver counts what its NAPI
# dropped in rx_queue_N_drops. ethtool says the XDP part apart (rx_queue_N_xdp_tx_errors,
# tx_queue_N_xdp_xmit_errors: already in tx_dropped). Everything else a link dropped
# (a bridge, a VXLAN device, a veth's rx_dropped) is if_dropped. One lost frame may show
# at two counters (a refused XDP_TX: the sender's tx_dropped and the peer's rx_dropped),
# so the sums say whether and where frames were lost, not exactly how many; TCP says
# what a loss cost: its retransmitted segments.
LOSSES = ("veth_ring_drops", "xdp_tx_errors", "if_dropped")


def path_losses(namespaces) -> dict:
    """{namespace: {"veth_ring_drops", "xdp_tx_errors", "if_dropped", "tcp_retrans", and
    "IFNAME COUNTER" for each interface's own}}: the kernel's counts now (subtract two
    readings, losses_between())."""
    out = {}
    for ns in namespaces:
        links = json.loads(netns.run(ns, ["ip", "-d", "-s", "-j", "link"], capture_output=True, text=True).stdout)
        got = dict.fromkeys(LOSSES, 0)
        for link in links:
            s, name = link.get("stats64", {}), link["ifname"]
            veth = link.get("linkinfo", {}).get("info_kind") == "veth"
            for way in ("rx", "tx"):  # where, too: say which interface lost them
                n = s.get(way, {}).get("dropped", 0)
                got["veth_ring_drops" if veth and way == "tx" else "if_dropped"] += n
                got[f"{name} {way}_dropped"] = n
            if not veth:
                continue
            stats = netns.run(ns, ["ethtool", "-S", name], capture_output=True, text=True).stdout
            for line in stats.splitlines():
                field, _, value = line.strip().partition(": ")
                kind = (
                    "veth_ring_drops"
                    if re.fullmatch(r"rx_queue_\d+_drops", field)
                    else "xdp_tx_errors"
                    if re.fullmatch(r"rx_queue_\d+_xdp_tx_errors|tx_queue_\d+_xdp_xmit_errors", field)
                    else None
                )
                if kind:
                    got[kind] += int(value)
                    got[f"{name} {field}"] = int(value)
        snmp = netns.run(ns, ["cat", "/proc/net/snmp"], capture_output=True, text=True).stdout.splitlines()
        tcp = [ln.split()[1:] for ln in snmp if ln.startswith("Tcp:")]
        got["tcp_retrans"] = int(dict(zip(tcp[0], tcp[1], strict=True))["RetransSegs"]) if len(tcp) == 2 else 0
        out[ns] = got
    return out


def losses_between(before: dict, after: dict) -> dict:
    """What path_losses() counted between two readings (an interface's own counts by
    "IFNAME COUNTER" beside the totals)."""
    return {ns: {k: after[ns].get(k, v) - v for k, v in counts.items()} for ns, counts in before.items()}


def where_lost(losses: dict, names: dict) -> str:
    """The interfaces that lost frames, by counter: "be1 eth0 rx_dropped 40; ..." (names:
    {namespace: what to call it}); empty when none did."""
    return "; ".join(
        f"{names.get(ns, ns)} {k} {v}" for ns, counts in losses.items() for k, v in counts.items() if " " in k and v
    )
