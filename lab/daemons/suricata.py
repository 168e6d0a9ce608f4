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
`python -m lab cleanup` (lab.daemons.cleanup) does the same for a crashed run,
once its namespace is gone.
"""

import json
import os
import re
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ebpf.errors import BpfError
from ebpf.netdev import ifindex_of
from lab import netns
from lab.cgroups import CpuCgroup, lab_cgroups, remove_cgroup
from lab.daemons import Daemon, require
from lab.netns import LabError

SUFFIX = ".suricata"
CLASSIFICATION = Path("/etc/suricata/classification.config")
REFERENCE = Path("/etc/suricata/reference.config")
START_TIMEOUT = 60.0


def require_suricata():
    """The suricata binary, or a one-line LabError saying how to get it."""
    return require("suricata", "suricata from bookworm-backports")


# --- configuration -----------------------------------------------------------


def config_yaml(run_dir, iface, home_net="any", stats_interval=1, ring_size=2048) -> str:
    """Suricata's configuration for one capture on `iface` (see the module's notes)."""
    home = f"[{home_net}]" if "," in home_net else home_net
    external = "any" if home_net == "any" else "!$HOME_NET"
    return f"""%YAML 1.1
---
# Written by lab.daemons.suricata for one lab run; removed with the run directory.
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


# --- results -----------------------------------------------------------------


@dataclass
class IdsResult:
    """What one Suricata run saw: its capture counters and its alerts."""

    kernel_packets: int = 0
    kernel_drops: int = 0
    decoder_packets: int = 0
    alerts: Counter = field(default_factory=Counter)  # sid -> alerts
    messages: dict = field(default_factory=dict)  # sid -> msg

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


class Suricata(Daemon):
    """One Suricata IDS on one interface of a lab namespace (see the module's notes)."""

    suffix = SUFFIX
    what = "Suricata"
    close_grace = 10.0

    def __init__(self, ns, iface, rules, home_net="any", cpu=None, quota_pct=None, ring_size=2048):
        self.binary = require("suricata", "suricata from bookworm-backports")
        super().__init__(ns, iface, cpu=cpu)
        self.iface = iface
        self.rules = Path(rules)
        if not self.rules.is_file():
            raise LabError(f"rules file {rules} not found")
        self.home_net, self.quota_pct, self.ring_size = home_net, quota_pct, ring_size
        self.cgroup = CpuCgroup(self.dir.name, quota_pct) if quota_pct else None
        self.result = None

    @property
    def log_path(self):
        return self.dir / "suricata.log"

    @property
    def eve_path(self):
        return self.dir / "eve.json"

    def files(self):
        return {"suricata.yaml": config_yaml(self.dir, self.iface, self.home_net, ring_size=self.ring_size)}

    def argv(self):
        argv = [
            self.binary,
            "-c",
            str(self.dir / "suricata.yaml"),
            "-S",
            str(self.rules),
            f"--af-packet={self.iface}",
            "-l",
            str(self.dir),
            "--pidfile",
            str(self.dir / "suricata.pid"),
            "--runmode",
            "workers",
            "-k",
            "all",
            "--init-errors-fatal",
        ]
        return argv

    def where(self):
        return f"on {self.iface} in {self.ns}"

    def start(self, timeout=START_TIMEOUT):
        """Start it and return once its engine has started (capture open, rules
        loaded); a failure raises LabError with Suricata's own error line and
        leaves nothing behind."""
        try:
            with netns.ipr(self.ns) as ip:
                ifindex_of(ip, self.iface, self.ns)  # a wrong name fails here, in one line
        except BpfError as e:
            raise LabError(str(e)) from None
        if self.cgroup:
            self.cgroup.create()
        return super().start(timeout)

    def ready(self):
        return "Engine started" in self._log()

    def error_line(self):
        return first_error(self._log()) or super().error_line()

    def _log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

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
        super().stop(grace)
        self.result = self._final()
        return self.result

    def _final(self) -> IdsResult:
        res = read_eve(self.eve_path)
        # At exit Suricata logs the capture's final counters ("device: eth0:
        # packets: N, drops: M (x%)"); the last eve stats record can be a second old.
        matches = list(_STATS_LINE.finditer(self._log()))
        if matches:
            m = matches[-1]  # the last: the capture's final counters
            res.kernel_packets, res.kernel_drops = int(m["pkts"]), int(m["drop"])
        return res

    def close(self):
        """Stop it if running and remove its run directory and cgroup."""
        super().close()
        if self.cgroup:
            self.cgroup.remove()

    @classmethod
    def leftovers(cls) -> list[str]:
        """Run directories and cgroups of instances whose namespace no longer
        exists (their processes died with it)."""
        removed = super().leftovers()
        for cg in lab_cgroups():
            if cg.name.startswith(netns.PREFIX) and not netns.exists(cg.name.split(".", 1)[0]):
                remove_cgroup(cg)
                removed.append(f"cgroup {cg}")
        return removed


def offline(pcap, rules, home_net="any", timeout=300.0) -> IdsResult:
    """Suricata reading a pcap file (no namespace, no capture): what the rules
    raise on that traffic when nothing is dropped. Same configuration as live."""
    binary = require_suricata()
    with tempfile.TemporaryDirectory(prefix="vtl-suricata-") as d:
        cfg = Path(d) / "suricata.yaml"
        cfg.write_text(config_yaml(d, "default", home_net))
        r = subprocess.run(
            [
                binary,
                "-c",
                str(cfg),
                "-S",
                str(rules),
                "-r",
                str(pcap),
                "-l",
                d,
                "-k",
                "all",
                "--runmode",
                "single",
                "--init-errors-fatal",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        log = (Path(d) / "suricata.log").read_text(errors="replace") if (Path(d) / "suricata.log").exists() else ""
        if r.returncode != 0:
            err = first_error(log) or (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
            raise LabError(f"suricata could not read {pcap} with {rules}: {err}")
        return read_eve(Path(d) / "eve.json")


def check_rules(rules, home_net="any", timeout=120.0):
    """Let Suricata test-load a rules file (-T): a rule it rejects raises a
    LabError with Suricata's own error line, before anything is started."""
    binary = require_suricata()
    if not Path(rules).is_file():
        raise LabError(f"rules file {rules} not found")
    with tempfile.TemporaryDirectory(prefix="vtl-suricata-") as d:
        cfg = Path(d) / "suricata.yaml"
        cfg.write_text(config_yaml(d, "default", home_net))
        r = subprocess.run(
            [binary, "-T", "-c", str(cfg), "-S", str(rules), "-l", d, "--init-errors-fatal"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if r.returncode != 0:
            log = (Path(d) / "suricata.log").read_text(errors="replace") if (Path(d) / "suricata.log").exists() else ""
            err = first_error(log) or first_error(r.stderr) or f"exit status {r.returncode}"
            raise LabError(f"suricata rejects {rules}: {err}")
