"""Every daemon the lab starts in its namespaces, with one lifecycle:

    nginx.py      nginx: the load balancer's backends, and its L4/L7 proxy peers
    haproxy.py    HAProxy: the load balancer's L4/L7 proxy peers
    suricata.py   Suricata: the IDS at the receiver and at the vTAP's monitor
    ovs.py        Open vSwitch (ovsdb-server and ovs-vswitchd): the port-mirroring peer

(and `python -m lab lb` itself, run by the LB's `xdp` peer: lab.fastpaths.lb.peers.)

A daemon has its own run directory, RUN_DIR/<ns>[.<key>]<suffix>, holding the
configuration we write, its pid files and logs. Its processes run as our
children in the namespace, each in its own process group, stderr to a file (a
pipe nobody reads while it runs would stop it once full). start() writes the
files, starts the processes and returns once ready() says the job is being
done, or raises LabError with the daemon's own last error line, leaving
nothing behind; close() stops the processes (SIGTERM, then SIGKILL after a
grace period), newest first, and removes the run directory.

A daemon dies with its namespace. `python -m lab cleanup` calls cleanup() here,
which asks every kind of daemon for its leftovers (leftovers(): the run
directories whose namespace is gone, and whatever else a kind makes, such as
Suricata's cgroups), so cleanup has no special case for any of them.
"""

import importlib
import os
import resource
import shutil
import subprocess
import time

from lab import netns
from lab.netns import LabError
from lab.runs import RUN_DIR, orphaned_run_dirs

KINDS = {}  # run-directory suffix -> the Daemon class, for cleanup()
# the modules whose classes register here, imported by cleanup()
MODULES = ("lab.daemons.nginx", "lab.daemons.haproxy", "lab.daemons.suricata", "lab.daemons.ovs")


def require(tool, package):
    """The tool's path, or a one-line LabError saying which package has it."""
    path = shutil.which(tool)
    if not path:
        raise LabError(f"{tool} not found (Debian package {package}; run `make setup`)")
    return path


def nofile() -> int:
    """Open files a daemon may hold: our hard limit."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


class Daemon:
    suffix = ".daemon"
    what = "daemon"  # how errors and cleanup name it
    output = None  # a file in the run directory for the first process's stdout (else discarded)
    close_grace = 5.0  # seconds between SIGTERM and SIGKILL when closed

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        KINDS[cls.suffix] = cls

    def __init__(self, ns, key=None, port=None, cpu=None):
        self.ns, self.port, self.cpu = ns, port, cpu
        self.dir = RUN_DIR / (f"{ns}.{key}{self.suffix}" if key is not None else f"{ns}{self.suffix}")
        self.procs = []
        self.cgroup = None  # a lab.cgroups.CpuCgroup, made before start, that its processes join

    @property
    def proc(self):
        """The first process (the daemon, for a one-process daemon)."""
        return self.procs[0] if self.procs else None

    # --- what a kind of daemon says ----------------------------------------------
    def files(self) -> dict:
        """{relative path: text or bytes} written into the run directory before start."""
        return {}

    def argv(self) -> list:
        raise NotImplementedError

    def launch(self, timeout):
        """Start the processes and wait until ready(): one process by default;
        a daemon of several (OVS) starts each with spawn() and waits for it."""
        self.spawn(self.argv(), output=self.output)
        self.wait_until(self.ready, timeout)

    def ready(self) -> bool:
        """Doing its job: by default, something listens on its port."""
        out = netns.run(self.ns, ["ss", "-Hltn", f"sport = :{self.port}"], capture_output=True, text=True)
        return bool(out.stdout.strip())

    def error_line(self) -> str:
        """Why it stopped, in its own words: the last line of its stderr."""
        lines = []
        for log in sorted(self.dir.glob("stderr*.log")):
            lines += log.read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""

    def where(self) -> str:
        return f"on port {self.port} in {self.ns}" if self.port else f"in {self.ns}"

    @classmethod
    def leftovers(cls) -> list[str]:
        """Remove what crashed runs of this kind left (their namespaces gone);
        say what, one line each."""
        removed = []
        for d in orphaned_run_dirs(cls.suffix):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(f"{cls.what} run directory {d}")
        return removed

    # --- the lifecycle -----------------------------------------------------------
    def start(self, timeout=15.0):
        try:
            if self.dir.exists():
                shutil.rmtree(self.dir)
            self.dir.mkdir(parents=True)
            for rel, content in self.files().items():
                path = self.dir / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
            self.launch(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def spawn(self, argv, output=None, env=None):
        """One process of the daemon, in its namespace and process group, on
        `cpu` if given; stdout to `output` (a file in the run directory)."""
        if self.cpu is not None:
            argv = ["taskset", "-c", str(self.cpu), *argv]
        err = self.dir / f"stderr{len(self.procs) or ''}.log"
        with open(self.dir / output, "wb") if output else open(os.devnull, "wb") as out, open(err, "wb") as e:
            p = netns.popen(
                self.ns,
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=e,
                env=env,
                start_new_session=True,
                preexec_fn=self._in_child,
            )
        self.procs.append(p)
        return p

    def wait_until(self, check, timeout, what=None):
        """Wait for check() to be true while the processes run; LabError with the
        daemon's own last error line if one exits, or at the deadline."""
        deadline = time.monotonic() + timeout
        while not check():
            for p in self.procs:
                if p.poll() is not None:
                    raise LabError(
                        f"{what or self.what} {self.where()} did not start: "
                        f"{self.error_line() or f'exit status {p.returncode}'}"
                    )
            if time.monotonic() > deadline:
                raise LabError(f"{what or self.what} {self.where()} is not ready after {timeout:.0f} s")
            time.sleep(0.02)

    def _in_child(self):
        # Proxies hold two descriptors per connection: a shell's soft limit (often
        # 1024) would cap the benchmark's thousands of them. Up to the hard limit:
        # raising that takes CAP_SYS_RESOURCE, which a container may not grant.
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile(), nofile()))
        # The child joins its cgroup here, before it execs `ip netns exec`: the
        # daemon is limited from its first instruction on, and inside the command
        # /sys is the namespace's own sysfs, where no cgroup hierarchy is mounted.
        if self.cgroup is not None:
            self.cgroup.procs_file.write_text(f"{os.getpid()}\n")

    @property
    def running(self):
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def pids(self) -> list[int]:
        """The daemon's processes: ours and every process in their process
        groups (nginx's master and workers)."""
        groups = {p.pid for p in self.procs}
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getpgid(int(entry)) in groups:
                        found.append(int(entry))
                except ProcessLookupError:
                    continue
        return found

    def stop(self, grace=5.0):
        """SIGTERM to each process, newest first (ovs-vswitchd before its
        database), SIGKILL after `grace` seconds; the run directory stays."""
        for p in reversed(self.procs):
            if p.poll() is None:
                netns.stop(p, grace=grace)
        self.procs = []

    def close(self):
        """Stop it and remove its run directory."""
        Daemon.stop(self, grace=self.close_grace)  # (a subclass's stop() may read results: not wanted here)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False


class Proxy(Daemon):
    """A proxy daemon in the LB namespace (run directory <ns>.<name>.proxy)."""

    suffix = ".proxy"
    what = "proxy"

    def __init__(self, ns, name, vip, port, backends):
        super().__init__(ns, name, port)
        self.vip, self.backends = vip, backends


def kinds() -> dict:
    """{run-directory suffix: Daemon class} of every kind of daemon: the lab's
    own, and any other module's imported so far (a fast path's peers')."""
    for module in MODULES:  # each kind registers itself when its module is imported
        importlib.import_module(module)
    return dict(sorted(KINDS.items()))


def cleanup() -> list[str]:
    """What crashed runs left of every kind of daemon (their namespaces gone)."""
    removed = []
    for cls in kinds().values():
        removed += cls.leftovers()
    return removed
