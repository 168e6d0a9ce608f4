"""Web servers in lab namespaces: the load balancer's backends (issue 11).

    >>> with NginxServer(ns, "198.18.5.11", 8080) as web:      # doctest: +SKIP
    ...     ...                                               # GET / returns web.body
    ...     web.requests()                                    # how many it served

nginx, one worker, serving one small static file: Python's http.server would
be the bottleneck of every measurement. Each server has its own configuration,
document root, pid file and logs under /run/vtap-lab/<ns>.<port>.nginx, runs in
the foreground as our child, and is stopped with SIGTERM; `python -m lab
cleanup` removes the directories of namespaces that are gone (the process died
with its namespace). The access log (one line per request, the client's address
first) lets a test count who served what.
"""

import shutil
import subprocess
import time

from . import netns
from .netns import LabError
from .topology import RUN_DIR, orphaned_run_dirs

SUFFIX = ".nginx"


def require_nginx():
    path = shutil.which("nginx")
    if not path:
        raise LabError("nginx not found (Debian package nginx; run `make setup`)")
    return path


def page(name: str, size=512) -> bytes:
    """The served file: says who served it, padded to `size` bytes."""
    head = f"served by {name}\n".encode()
    return head + b"." * max(0, size - len(head) - 1) + b"\n"


class NginxServer:
    def __init__(self, ns, addr, port=8080, cpu=None, body_size=512, name=None):
        self.binary = require_nginx()
        self.ns, self.addr, self.port, self.cpu = ns, addr, port, cpu
        self.name = name or f"{addr}:{port}"
        self.body = page(self.name, body_size)
        self.dir = RUN_DIR / f"{ns}.{port}{SUFFIX}"
        self.proc = None

    def config(self) -> str:
        d = self.dir
        listen = f"[{self.addr}]:{self.port}" if ":" in str(self.addr) else f"{self.addr}:{self.port}"
        return f"""# written by lab.webservers for one lab run
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 16384; }}
worker_rlimit_nofile 40000;
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/tmp;
    proxy_temp_path {d}/tmp;
    fastcgi_temp_path {d}/tmp;
    uwsgi_temp_path {d}/tmp;
    scgi_temp_path {d}/tmp;
    keepalive_requests 1000000;
    server {{
        listen {listen} reuseport backlog=16384;
        root {d}/www;
        location / {{ try_files /index.html =404; }}
    }}
}}
"""

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
        (self.dir / "www").mkdir(parents=True)
        (self.dir / "tmp").mkdir()
        (self.dir / "www" / "index.html").write_bytes(self.body)
        (self.dir / "nginx.conf").write_text(self.config())
        argv = [self.binary, "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir), "-e", str(self.dir / "error.log")]
        if self.cpu is not None:
            argv = ["taskset", "-c", str(self.cpu), *argv]
        self.proc = netns.popen(self.ns, argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._listening():
            if self.proc.poll() is not None:
                err = (self.proc.stderr.read().strip().splitlines() or [f"exit {self.proc.returncode}"])[-1]
                raise LabError(f"nginx on {self.addr}:{self.port} in {self.ns} did not start: {err}")
            if time.monotonic() > deadline:
                raise LabError(f"nginx on {self.addr}:{self.port} in {self.ns} is not listening after {timeout:.0f} s")
            time.sleep(0.02)

    def _listening(self):
        out = netns.run(self.ns, ["ss", "-Hltn", f"sport = :{self.port}"], capture_output=True, text=True)
        return bool(out.stdout.strip())

    def requests(self) -> int:
        """Requests served so far (lines of the access log)."""
        try:
            with open(self.dir / "access.log", "rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def clients(self) -> list[str]:
        """The client address of every request served, in order."""
        try:
            with open(self.dir / "access.log") as f:
                return [line.split(" ", 1)[0] for line in f]
        except FileNotFoundError:
            return []

    def close(self):
        if self.proc is not None:
            netns.stop(self.proc)
            if self.proc.stderr:
                self.proc.stderr.close()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False


def cleanup() -> list[str]:
    """Run directories of servers whose namespace is gone."""
    removed = []
    for d in orphaned_run_dirs(SUFFIX):
        shutil.rmtree(d, ignore_errors=True)
        removed.append(f"nginx run directory {d}")
    return removed
