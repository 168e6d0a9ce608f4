"""TrafgenGenerator: the same frames sent by netsniff-ng's trafgen (packet mmap).

    >>> with TrafgenGenerator(ns, "eth0", frames) as gen:    # doctest: +SKIP
    ...     gen.send(count=1_000_000, seconds=10)

trafgen gets the frames as a byte-array config, one worker (-P 1), and is told
not to retune socket memory or IRQ affinity (--no-sock-mem --notouch-irq): those
are machine-wide settings outside the lab's namespaces. Its worker binds itself
to CPU 0, whatever affinity it was started with, so the generator's CPU is 0.
The seconds bound is enforced by SIGINT, after which trafgen prints its totals.
"""

import re
import shutil
import signal
import tempfile
from pathlib import Path

from .. import netns
from .generator import Generator, run_bounded


def trafgen_config(frames) -> str:
    return "".join("{ " + ", ".join(f"0x{b:02x}" for b in f) + " }\n" for f in frames)


class TrafgenGenerator(Generator):
    name = "trafgen"

    def __init__(self, ns, ifname, frames, cpu=0):
        if not shutil.which("trafgen"):
            raise netns.LabError("trafgen not found (Debian package netsniff-ng; run `make setup`)")
        if cpu not in (None, 0):
            raise ValueError("trafgen binds its single worker to CPU 0; use cpu=0")
        super().__init__(ns, ifname, frames, 0)
        self._dir = None

    def _open(self):
        self._dir = tempfile.TemporaryDirectory(prefix="vtl-trafgen-")
        self.config = Path(self._dir.name) / "frames.cfg"
        self.config.write_text(trafgen_config(self.frames))

    def _close(self):
        if self._dir:
            self._dir.cleanup()
            self._dir = None

    def _send(self, limit, seconds, rate_pps):
        argv = [
            "trafgen",
            "--dev",
            self.ifname,
            "--in",
            str(self.config),
            "--num",
            str(limit),
            "--cpus",
            "1",
            "--no-sock-mem",
            "--notouch-irq",
        ]
        if rate_pps:
            argv += ["--rate", f"{int(rate_pps)}pps"]
        # Its own process group (run_bounded): trafgen forks a worker, and SIGINT
        # must reach both (signalled alone, the parent exits and the worker sends on).
        rc, out, elapsed = run_bounded(self.ns, argv, seconds)
        packets = re.search(r"(\d+) packets outgoing", out)
        nbytes = re.search(r"(\d+) bytes outgoing", out)
        if rc not in (0, -signal.SIGINT, 130) or not packets:
            last = out.strip().splitlines()[-1] if out.strip() else f"exit {rc}"
            raise netns.LabError(f"trafgen failed: {last}")
        # trafgen's own "N sec, M usec on CPU0" is CPU time, not wall time; the
        # wall time includes its start-up (tens of ms), so short runs look slower.
        return int(packets.group(1)), int(nbytes.group(1)), elapsed
