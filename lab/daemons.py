"""Server daemons in lab namespaces: nginx backends (lab.webservers) and the
proxies the XDP load balancer is measured against (lab.balancers).

Each daemon has its own run directory, RUN_DIR/<ns>.<key><suffix>, holding the
configuration we write, its pid file and logs; it runs in the foreground as our
child, in its own process group, and is stopped with SIGTERM (SIGKILL after a
grace period). It is ready when a socket listens on its port inside the
namespace. A daemon dies with its namespace; `python -m lab cleanup` removes
the run directories whose namespace is gone (cleanup() below).
"""

import os
import resource
import shutil
import subprocess
import time

from . import netns
from .netns import LabError
from .topology import RUN_DIR, orphaned_run_dirs

SUFFIXES = {}  # run-directory suffix -> what it holds, for cleanup()


def require(tool, package):
    path = shutil.which(tool)
    if not path:
        raise LabError(f"{tool} not found (Debian package {package}; run `make setup`)")
    return path


def nofile() -> int:
    """Open files a daemon may hold: our hard limit."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def listen_text(addr, port) -> str:
    return f"[{addr}]:{port}" if ":" in str(addr) else f"{addr}:{port}"


class Daemon:
    suffix = ".daemon"
    what = "daemon"

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        SUFFIXES[cls.suffix] = cls.what

    def __init__(self, ns, key, port, cpu=None):
        self.ns, self.port, self.cpu = ns, port, cpu
        self.dir = RUN_DIR / f"{ns}.{key}{self.suffix}"
        self.proc = None
        self.output = None  # a file in the run directory for its stdout (else discarded)

    # what a subclass provides
    def files(self) -> dict:
        """{relative path: text or bytes} written into the run directory before start."""
        return {}

    def argv(self) -> list:
        raise NotImplementedError

    def start(self, timeout=15.0):
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
        for rel, content in self.files().items():
            path = self.dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        argv = self.argv()
        if self.cpu is not None:
            argv = ["taskset", "-c", str(self.cpu), *argv]
        # stderr to a file: a pipe nobody reads while it runs would stop the daemon once full
        with open(self.dir / self.output, "wb") if self.output else open(os.devnull, "wb") as out, \
                open(self.dir / "stderr.log", "wb") as err:
            self.proc = netns.popen(self.ns, argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True, preexec_fn=self._limits)
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc.poll() is not None:
                text = (self.dir / "stderr.log").read_text(errors="replace")
                err = (text.strip().splitlines() or [f"exit {self.proc.returncode}"])[-1]
                raise LabError(f"{self.what} {self.where()} did not start: {err}")
            if time.monotonic() > deadline:
                raise LabError(f"{self.what} {self.where()} is not ready after {timeout:.0f} s")
            time.sleep(0.02)

    @staticmethod
    def _limits():
        # Proxies hold two descriptors per connection: a shell's soft limit (often
        # 1024) would cap the benchmark's thousands of them. Up to the hard limit:
        # raising that takes CAP_SYS_RESOURCE, which a container may not grant.
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile(), nofile()))

    def where(self) -> str:
        return f"on port {self.port} in {self.ns}"

    def ready(self) -> bool:
        """Doing its job: by default, something listens on its port."""
        out = netns.run(self.ns, ["ss", "-Hltn", f"sport = :{self.port}"], capture_output=True, text=True)
        return bool(out.stdout.strip())

    def pids(self) -> list[int]:
        """The daemon's processes: ours and every process in its process group
        (nginx's master and workers)."""
        if self.proc is None:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getpgid(int(entry)) == self.proc.pid:
                        found.append(int(entry))
                except ProcessLookupError:
                    continue
        return found

    def close(self):
        if self.proc is not None:
            netns.stop(self.proc)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False


def cleanup() -> list[str]:
    """Run directories of daemons whose namespace is gone."""
    removed = []
    for suffix, what in sorted(SUFFIXES.items()):
        for d in orphaned_run_dirs(suffix):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(f"{what} run directory {d}")
    return removed
