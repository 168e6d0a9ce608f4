"""Tcpreplay: a recorded pcap sent out of a lab interface at a given rate.

    >>> with Tcpreplay(ns, "eth0", "attacks.pcap", mbps=10) as replay:   # doctest: +SKIP
    ...     report = replay.send(seconds=60)          # the whole file once, or 60 s

The frames go out unchanged (addresses, MACs, checksums: a bad checksum in the
file stays bad). tcpreplay preloads the file into memory (-K, unless
preload=False) so that disk reads never pace the replay, and its --loop repeats the file: identical sessions
again, which an IDS takes for retransmissions (see lab.traffic.attacks for
repetitions an IDS takes for new traffic). The seconds bound is enforced by
SIGINT, after which tcpreplay prints its totals.
"""

import re
import shutil
from pathlib import Path

from .. import netns
from .generator import Generator, run_bounded
from .report import MAX_LOAD_PACKETS

MAX_MBPS = 100_000


def check_pcap(path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"pcap file {path} not found")
    return p


class Tcpreplay(Generator):
    name = "tcpreplay"
    needs_frames = False

    def __init__(self, ns, ifname, pcap, mbps=None, loop=1, cpu=None, preload=True, as_recorded=False):
        if not shutil.which("tcpreplay"):
            raise netns.LabError("tcpreplay not found (Debian package tcpreplay; run `make setup`)")
        if mbps is not None and not 0 < mbps <= MAX_MBPS:
            raise ValueError(f"replay rate {mbps} Mbps is outside (0, {MAX_MBPS}]")
        if not 1 <= loop <= 1_000_000:
            raise ValueError(f"replay loop count {loop} is outside 1..1000000")
        super().__init__(ns, ifname, cpu=cpu)
        if as_recorded and mbps is not None:
            raise ValueError("a replay goes at a rate (mbps=) or as recorded, not both")
        self.pcap, self.mbps, self.loop, self.preload = check_pcap(pcap), mbps, loop, preload
        self.as_recorded = as_recorded  # the file's own timestamps pace it (a workload with timing)
        # nanosleep between packets: gtod (the default) spins a whole core, and
        # the sender shares its core with a monitor in the IDS bench; at 30 Mbps
        # nano kept the rate (7.19 s for 7.19 s of traffic) with 17 % of a core
        self.timer = "nano"

    def _open(self):
        pass

    def _close(self):
        pass

    def argv(self, limit=None):
        argv = ["tcpreplay", f"--intf1={self.ifname}", f"--loop={self.loop}", f"--timer={self.timer}"]
        if self.preload:
            argv.append("--preload-pcap")
        if self.as_recorded:
            argv.append("--multiplier=1")
        else:
            argv += [f"--mbps={self.mbps:g}"] if self.mbps else ["--topspeed"]
        if limit:
            argv.append(f"--limit={limit}")
        if self.cpu is not None:
            argv = ["taskset", "-c", str(self.cpu), *argv]
        return argv + [str(self.pcap)]

    def _send(self, limit, seconds, rate_pps):
        if rate_pps:
            raise ValueError("tcpreplay is paced in Mbps (mbps=...), not packets per second")
        rc, out, elapsed = run_bounded(self.ns, self.argv(limit if limit < MAX_LOAD_PACKETS else None), seconds)
        m = re.search(r"Actual: (\d+) packets \((\d+) bytes\) sent in ([\d.]+) seconds", out)
        failed = re.search(r"Failed packets:\s+(\d+)", out)
        if not m:
            lines = [ln for ln in out.strip().splitlines() if ln.strip()]
            raise netns.LabError(f"tcpreplay failed: {lines[-1] if lines else f'exit status {rc}'}")
        packets, nbytes, secs = int(m[1]), int(m[2]), float(m[3])
        return packets, nbytes, secs or elapsed, {"failed": int(failed[1]) if failed else 0}
