"""CPU quotas for the lab's daemons: a cgroup of our own per instance, with a
CFS bandwidth limit (`pct` percent of one core), made before the daemon starts
so that it starts inside it. cgroup v2 (cpu.max) where its cpu controller is
enabled, else v1's cpu hierarchy (cpu.cfs_quota_us). Every lab cgroup lives
under one parent, CGROUP_NAME, so that cleanup finds them all."""

import os
import signal
import time
from pathlib import Path

from ebpf.cgroup import v2_mounts
from lab.netns import LabError

CGROUP_NAME = "vtap-lab"


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
        raise LabError(
            "no cgroup cpu controller (neither cgroup v2 cpu.max nor v1 cpu.cfs_quota_us): CPU quotas need one"
        )

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

    def remove(self):
        remove_cgroup(self.path)


class SocketCgroup:
    """A cgroup v2 directory of our own with no controllers: a place for processes
    whose sockets cgroup programs see (the pods' services at connect()). Made under
    CGROUP_NAME in the cgroup v2 hierarchy (/sys/fs/cgroup, or .../unified on a
    hybrid host), so that cleanup finds it."""

    def __init__(self, name):
        mounts = v2_mounts()
        if not mounts:
            raise LabError(
                "no cgroup v2 hierarchy mounted: socket programs attach only there; fix: "
                "mount -t cgroup2 none /sys/fs/cgroup/unified"
            )
        self.path = mounts[0] / CGROUP_NAME / name

    def create(self):
        self.path.parent.mkdir(exist_ok=True)
        self.path.mkdir(exist_ok=True)
        return self

    def joiner(self):
        """A preexec_fn for subprocess: the child joins this cgroup before it execs
        `ip netns exec` (inside, /sys is the namespace's own, with no cgroup mounted)."""
        procs = str(self.path / "cgroup.procs")

        def join():
            with open(procs, "w") as f:
                f.write(f"{os.getpid()}\n")

        return join

    def remove(self):
        remove_cgroup(self.path)


class MemoryCgroup:
    """A memory cgroup of our own, for what the processes run in it leave in the kernel:
    the kernel charges a rule, a chain or a set element to the cgroup of the task that
    made it, and the charge stays after the task exits (kernel_bytes()). cgroup v2 where
    its memory controller is (memory.stat's `kernel`), else v1's memory hierarchy
    (memory.kmem.usage_in_bytes). Under CGROUP_NAME, so that cleanup finds it."""

    V1_MEMORY = Path("/sys/fs/cgroup/memory")

    def __init__(self, name):
        self.root = None
        for root in (CpuCgroup.V2_ROOT, CpuCgroup.V2_HYBRID):
            try:
                if "memory" in (root / "cgroup.controllers").read_text().split():
                    self.root = root
                    break
            except OSError:
                continue
        if self.root is None and (self.V1_MEMORY / "memory.kmem.usage_in_bytes").exists():
            self.root = self.V1_MEMORY
        if self.root is None:
            raise LabError("no cgroup memory controller with kernel memory (v2 memory, or v1 memory.kmem)")
        self.path = self.root / CGROUP_NAME / name

    def create(self):
        self.path.parent.mkdir(exist_ok=True)
        if self.root != self.V1_MEMORY:  # a v2 parent must hand the controller down
            for d in (self.root, self.path.parent):
                ctl = d / "cgroup.subtree_control"
                if "memory" not in ctl.read_text().split():
                    ctl.write_text("+memory")
        self.path.mkdir(exist_ok=True)
        return self

    def joiner(self):
        """A preexec_fn for subprocess: the child joins this cgroup before it execs."""
        procs = str(self.path / "cgroup.procs")

        def join():
            with open(procs, "w") as f:
                f.write(f"{os.getpid()}\n")

        return join

    def kernel_bytes(self) -> int:
        if self.root == self.V1_MEMORY:
            return int((self.path / "memory.kmem.usage_in_bytes").read_text())
        stat = dict(ln.split() for ln in (self.path / "memory.stat").read_text().splitlines())
        return int(stat["kernel"])

    def remove(self):
        remove_cgroup(self.path)  # its charges go to the parent: a memory cgroup removes with them


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
    """The per-instance cgroups the lab made, in whichever hierarchy has cpu or memory."""
    found = []
    for root in (CpuCgroup.V2_ROOT, CpuCgroup.V2_HYBRID, CpuCgroup.V1_CPU, MemoryCgroup.V1_MEMORY):
        d = root / CGROUP_NAME
        if d.is_dir():
            found += sorted(p for p in d.iterdir() if p.is_dir())
    return found
