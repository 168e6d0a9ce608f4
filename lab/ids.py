"""Suricata in a lab namespace, listening on one interface: the IDS of the vTAP
paper's Testbed 3 (Table 3).

    >>> with Suricata(ns, "eth0", rules="lab/rules/vtap-lab.rules", cpu=1, quota_pct=50) as ids:  # doctest: +SKIP
    ...     ...                                # replay traffic
    ...     result = ids.stop()                # SIGTERM, then read what it saw
    >>> result.alerts, result.kernel_packets, result.kernel_drops

Each instance has its own configuration, written here rather than taken from
/etc/suricata (whose defaults change between releases and whose unix socket is
one shared path), and its own run directory /run/vtap-lab/<ns>.<iface>.suricata
with the log, pid file and eve.json. What the configuration must say, measured
on this machine:

- af-packet `defrag: no`: with `yes` (PACKET_FANOUT_FLAG_DEFRAG) and more than
  one thread the kernel drops overlapping fragments before Suricata sees them,
  and fragment rules go blind. Suricata's own defrag engine still reassembles.
- `checksum-checks: yes`: on `kernel` (the default) Suricata trusts the veth's
  checksum state and the bad-checksum rules never fire on replayed frames.
- the unix command socket off; statistics every second (eve `stats` records).
- `workers` run mode, one thread: capture and detection on the core we pin.

Readiness is the log's "Engine started" line: the pid file appears before the
rules are loaded and the capture is open, and frames sent then are never seen.

A CPU quota (`quota_pct` of one core, CFS bandwidth) goes on a cgroup of the
instance's own, made before Suricata starts: the process starts inside it, so
not even its rule loading runs unlimited. cgroup v2 (cpu.max) is used where its
cpu controller is enabled, else v1's cpu hierarchy (cpu.cfs_quota_us).

Teardown stops the process, removes the run directory and the cgroup;
`python -m lab cleanup` (lab.cleanup) does the same for a crashed run, once its
namespace is gone.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ebpf.errors import BpfError
from ebpf.netdev import ifindex_of

from . import netns
from .netns import LabError
from .topology import RUN_DIR, orphaned_run_dirs

SUFFIX = ".suricata"
CLASSIFICATION = Path("/etc/suricata/classification.config")
REFERENCE = Path("/etc/suricata/reference.config")
CGROUP_NAME = "vtap-lab"
START_TIMEOUT = 60.0


def require_suricata():
    """The suricata binary, or a one-line LabError saying how to get it."""
    path = shutil.which("suricata")
    if not path:
        raise LabError("suricata not found (Debian bookworm-backports package suricata; run `make setup`)")
    return path


# --- configuration -----------------------------------------------------------

def config_yaml(run_dir, iface, home_net="any", stats_interval=1, ring_size=2048) -> str:
    """Suricata's configuration for one capture on `iface` (see the module's notes)."""
    home = f"[{home_net}]" if "," in home_net else home_net
    external = "any" if home_net == "any" else "!$HOME_NET"
    return f"""%YAML 1.1
---
# Written by lab.ids for one lab run; removed with the run directory.
vars:
  address-groups:
    HOME_NET: "{home}"
    EXTERNAL_NET: "{external}"
    HTTP_SERVERS: "$HOME_NET"
    DNS_SERVERS: "$HOME_NET"
    SMTP_SERVERS: "$HOME_NET"
    SQL_SERVERS: "$HOME_NET"
    TELNET_SERVERS: "$HOME_NET"
  port-groups:
    HTTP_PORTS: "80"
    SHELLCODE_PORTS: "!80"
    ORACLE_PORTS: 1521
    SSH_PORTS: 22
    FTP_PORTS: 21
    FILE_DATA_PORTS: "[$HTTP_PORTS,110,143]"

default-log-dir: {run_dir}
classification-file: {CLASSIFICATION}
reference-config-file: {REFERENCE}

stats:
  enabled: yes
  interval: {stats_interval}

outputs:
  - eve-log:
      enabled: yes
      filetype: regular
      filename: eve.json
      types:
        - alert
        - stats:
            totals: yes
            threads: no
            deltas: no

logging:
  default-log-level: info
  outputs:
    - console:
        enabled: no
    - file:
        enabled: yes
        level: info
        filename: {run_dir}/suricata.log

af-packet:
  - interface: {iface}
    threads: 1
    cluster-id: 99
    cluster-type: cluster_flow
    defrag: no
    checksum-checks: yes
    ring-size: {ring_size}
    use-mmap: yes
    tpacket-v3: yes
  - interface: default

pcap-file:
  checksum-checks: yes

unix-command:
  enabled: no

runmode: workers
host-mode: sniffer-only
max-pending-packets: 1024

app-layer:
  protocols:
    http:
      enabled: yes
    dns:
      tcp:
        enabled: yes
      udp:
        enabled: yes
    ftp:
      enabled: yes
    tls:
      enabled: yes
    smtp:
      enabled: yes
    ssh:
      enabled: yes

stream:
  memcap: 64mb
  checksum-validation: yes
  reassembly:
    memcap: 256mb
    depth: 1mb

defrag:
  memcap: 32mb
  timeout: 60

flow:
  memcap: 128mb

detect:
  profile: medium
"""


# --- CPU quota ---------------------------------------------------------------

class CpuCgroup:
    """A cgroup of our own with a CFS bandwidth limit: `pct` percent of one core."""
    PERIOD_US = 100_000
    V2_ROOT = Path("/sys/fs/cgroup")
    V2_HYBRID = Path("/sys/fs/cgroup/unified")
    V1_CPU = Path("/sys/fs/cgroup/cpu")

    def __init__(self, name, pct):
        if not 1 <= pct <= 100 * (os.cpu_count() or 1):
            raise ValueError(f"CPU quota {pct} % is outside 1..{100 * (os.cpu_count() or 1)}")
        self.pct = pct
        self.root = self.hierarchy()
        self.path = self.root / CGROUP_NAME / name

    @classmethod
    def hierarchy(cls) -> Path:
        """Where the cpu controller is: cgroup v2 (cpu in cgroup.controllers) or v1."""
        for root in (cls.V2_ROOT, cls.V2_HYBRID):
            try:
                if "cpu" in (root / "cgroup.controllers").read_text().split():
                    return root
            except OSError:
                continue
        if (cls.V1_CPU / "cpu.cfs_quota_us").exists():
            return cls.V1_CPU
        raise LabError("no cgroup cpu controller (neither cgroup v2 cpu.max nor v1 cpu.cfs_quota_us): "
                       "CPU quotas need one")

    @property
    def v2(self):
        return self.root != self.V1_CPU

    def create(self):
        parent = self.path.parent
        if not parent.exists():
            parent.mkdir()
        if self.v2:  # a v2 parent must hand the cpu controller down to its children
            for d in (self.root, parent):
                ctl = d / "cgroup.subtree_control"
                if "cpu" not in ctl.read_text().split():
                    ctl.write_text("+cpu")
        self.path.mkdir(exist_ok=True)
        quota = int(self.PERIOD_US * self.pct / 100)
        if self.v2:
            (self.path / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        return self

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def throttled(self) -> dict:
        """cpu.stat: how often and how long the quota held the group back."""
        out = {}
        try:
            for line in (self.path / "cpu.stat").read_text().splitlines():
                k, v = line.split()
                out[k] = int(v)
        except (OSError, ValueError):
            pass
        return out

    def remove(self):
        remove_cgroup(self.path)


def remove_cgroup(path: Path):
    """Remove a cgroup: kill what is still in it, then rmdir (a cgroup with tasks is busy)."""
    if not path.exists():
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _cgroup_pids(path)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while _cgroup_pids(path) and time.monotonic() < deadline:
            time.sleep(0.05)
    try:
        path.rmdir()
    except FileNotFoundError:
        pass


def _cgroup_pids(path):
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def lab_cgroups() -> list[Path]:
    """The per-instance cgroups the lab made, in whichever hierarchy has cpu."""
    found = []
    for root in (CpuCgroup.V2_ROOT, CpuCgroup.V2_HYBRID, CpuCgroup.V1_CPU):
        d = root / CGROUP_NAME
        if d.is_dir():
            found += sorted(p for p in d.iterdir() if p.is_dir())
    return found


# --- results -----------------------------------------------------------------

@dataclass
class IdsResult:
    """What one Suricata run saw: its capture counters and its alerts."""
    kernel_packets: int = 0
    kernel_drops: int = 0
    decoder_packets: int = 0
    alerts: Counter = field(default_factory=Counter)  # sid -> alerts
    messages: dict = field(default_factory=dict)       # sid -> msg

    @property
    def total_alerts(self):
        return sum(self.alerts.values())

    @property
    def drop_rate(self):
        """Drops as a share of what reached the socket (Suricata's own "drop (x%)")."""
        seen = self.kernel_packets
        return self.kernel_drops / seen if seen else 0.0


_STATS_LINE = re.compile(r"device: (?P<iface>\S+): packets: (?P<pkts>\d+), drops: (?P<drop>\d+)")


def read_eve(path: Path) -> IdsResult:
    """Alerts per signature and the last stats record's capture counters."""
    res = IdsResult()
    last_stats = None
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return res
    with f:
        for line in f:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            kind = ev.get("event_type")
            if kind == "alert":
                sid = ev["alert"]["signature_id"]
                res.alerts[sid] += 1
                res.messages[sid] = ev["alert"].get("signature", "")
            elif kind == "stats":
                last_stats = ev["stats"]
    if last_stats:
        cap = last_stats.get("capture", {})
        res.kernel_packets = cap.get("kernel_packets", 0)
        res.kernel_drops = cap.get("kernel_drops", 0)
        res.decoder_packets = last_stats.get("decoder", {}).get("pkts", 0)
    return res


def first_error(log_text: str) -> str:
    """Suricata's own first error line, without its timestamp and thread prefix."""
    for line in log_text.splitlines():
        if "<Error>" in line or "Error:" in line or "[ERRCODE" in line:
            return re.sub(r"^.*?(<Error>|Error:)\s*-?\s*", "", line).strip()
    return ""


# --- the instance --------------------------------------------------------------

class Suricata:
    """One Suricata IDS on one interface of a lab namespace (see the module's notes)."""

    def __init__(self, ns, iface, rules, home_net="any", cpu=None, quota_pct=None, ring_size=2048):
        self.binary = require_suricata()
        self.ns, self.iface = ns, iface
        self.rules = Path(rules)
        if not self.rules.is_file():
            raise LabError(f"rules file {rules} not found")
        self.home_net, self.cpu, self.quota_pct, self.ring_size = home_net, cpu, quota_pct, ring_size
        self.dir = RUN_DIR / f"{ns}.{iface}{SUFFIX}"
        self.cgroup = CpuCgroup(self.dir.name, quota_pct) if quota_pct else None
        self.proc = None
        self.result = None

    @property
    def log_path(self):
        return self.dir / "suricata.log"

    @property
    def eve_path(self):
        return self.dir / "eve.json"

    def argv(self):
        argv = [self.binary, "-c", str(self.dir / "suricata.yaml"), "-S", str(self.rules),
                f"--af-packet={self.iface}", "-l", str(self.dir), "--pidfile", str(self.dir / "suricata.pid"),
                "--runmode", "workers", "-k", "all", "--init-errors-fatal"]
        if self.cpu is not None:
            argv = ["taskset", "-c", str(self.cpu), *argv]
        return argv

    def start(self, timeout=START_TIMEOUT):
        """Start it and return once its engine has started (capture open, rules
        loaded); a failure raises LabError with Suricata's own error line and
        leaves nothing behind."""
        try:
            with netns.ipr(self.ns) as ip:
                ifindex_of(ip, self.iface, self.ns)  # a wrong name fails here, in one line
        except BpfError as e:
            raise LabError(str(e)) from None
        try:
            self._start(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _start(self, timeout):
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        (self.dir / "suricata.yaml").write_text(
            config_yaml(self.dir, self.iface, self.home_net, ring_size=self.ring_size))
        cmd = netns.command(self.ns, self.argv())
        if self.cgroup:
            self.cgroup.create()
            # The shell joins the cgroup, then becomes the command: Suricata is
            # limited from its first instruction on.
            cmd = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.cgroup.procs_file), *cmd]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            log = self._log()
            if "Engine started" in log:
                return
            if self.proc.poll() is not None:
                err = first_error(log) or self._stderr_tail() or f"exit status {self.proc.returncode}"
                raise LabError(f"suricata on {self.iface} in {self.ns} did not start: {err}")
            if time.monotonic() > deadline:
                raise LabError(f"suricata on {self.iface} in {self.ns} did not start within {timeout:.0f} s")
            time.sleep(0.05)

    def _log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _stderr_tail(self):
        if self.proc and self.proc.stderr and self.proc.poll() is not None:
            lines = self.proc.stderr.read().decode(errors="replace").strip().splitlines()
            return lines[-1] if lines else ""
        return ""

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stats(self) -> IdsResult:
        """What it has reported so far (stats records come once a second)."""
        return read_eve(self.eve_path)

    def wait_idle(self, packets, timeout=30.0):
        """Wait until it has decoded or dropped `packets` (what was sent to it),
        or its count has not moved for 2.5 s: a busy IDS is still reading its
        ring after the replay ends, and stopping it then would lose that backlog."""
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            seen = self.stats()
            got = seen.decoder_packets + seen.kernel_drops  # read, or lost before it could be
            if got >= packets:
                return seen
            if got != last:
                last, since = got, time.monotonic()
            elif time.monotonic() - since > 2.5:
                return seen
            time.sleep(0.2)
        return self.stats()

    def cpu_seconds(self) -> float:
        """CPU time Suricata has used (user + system, all its threads)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (AttributeError, FileNotFoundError):
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, grace=30.0) -> IdsResult:
        """SIGTERM, wait for it to write its last records, and read them."""
        if self.proc is not None:
            netns.stop(self.proc, grace=grace)
            if self.proc.stderr:
                self.proc.stderr.close()
        self.result = self._final()
        return self.result

    def _final(self) -> IdsResult:
        res = read_eve(self.eve_path)
        # At exit Suricata logs the capture's final counters ("device: eth0:
        # packets: N, drops: M (x%)"); the last eve stats record can be a second old.
        m = None
        for m in _STATS_LINE.finditer(self._log()):
            pass
        if m:
            res.kernel_packets, res.kernel_drops = int(m["pkts"]), int(m["drop"])
        return res

    def close(self):
        """Stop it if running and remove its run directory and cgroup."""
        if self.proc is not None and self.proc.poll() is None:
            netns.stop(self.proc, grace=10)
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()
        if self.cgroup:
            self.cgroup.remove()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False


def cleanup() -> list[str]:
    """Remove what crashed runs left: run directories and cgroups of instances
    whose namespace no longer exists (their processes died with it)."""
    removed = []
    for d in orphaned_run_dirs(SUFFIX):
        shutil.rmtree(d, ignore_errors=True)
        removed.append(f"Suricata run directory {d}")
    for cg in lab_cgroups():
        if not netns.exists(cg.name.split(".", 1)[0]):
            remove_cgroup(cg)
            removed.append(f"cgroup {cg}")
    return removed


def offline(pcap, rules, home_net="any", timeout=300.0) -> IdsResult:
    """Suricata reading a pcap file (no namespace, no capture): what the rules
    raise on that traffic when nothing is dropped. Same configuration as live."""
    import tempfile
    binary = require_suricata()
    with tempfile.TemporaryDirectory(prefix="vtl-suricata-") as d:
        cfg = Path(d) / "suricata.yaml"
        cfg.write_text(config_yaml(d, "default", home_net))
        r = subprocess.run([binary, "-c", str(cfg), "-S", str(rules), "-r", str(pcap), "-l", d, "-k", "all",
                            "--runmode", "single", "--init-errors-fatal"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        log = (Path(d) / "suricata.log").read_text(errors="replace") if (Path(d) / "suricata.log").exists() else ""
        if r.returncode != 0:
            err = first_error(log) or (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
            raise LabError(f"suricata could not read {pcap} with {rules}: {err}")
        return read_eve(Path(d) / "eve.json")


def check_rules(rules, home_net="any", timeout=120.0):
    """Let Suricata test-load a rules file (-T): a rule it rejects raises a
    LabError with Suricata's own error line, before anything is started."""
    import tempfile
    binary = require_suricata()
    if not Path(rules).is_file():
        raise LabError(f"rules file {rules} not found")
    with tempfile.TemporaryDirectory(prefix="vtl-suricata-") as d:
        cfg = Path(d) / "suricata.yaml"
        cfg.write_text(config_yaml(d, "default", home_net))
        r = subprocess.run([binary, "-T", "-c", str(cfg), "-S", str(rules), "-l", d, "--init-errors-fatal"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            log = (Path(d) / "suricata.log").read_text(errors="replace") if (Path(d) / "suricata.log").exists() else ""
            err = first_error(log) or first_error(r.stderr) or f"exit status {r.returncode}"
            raise LabError(f"suricata rejects {rules}: {err}")
