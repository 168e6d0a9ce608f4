"""HTTP load from a lab namespace, bounded in seconds, as the LB benchmark needs it.

    closed_loop(ns, addr, port, connections=100, seconds=10)      wrk: each connection sends its
                                          next request when the last is answered (the articles' method)
    open_loop(ns, addr, port, rate=20000, connections=100, seconds=10)
                                          openloop.c: requests due at fixed times whatever the
                                          server does, latency counted from the due time
    spread(load, ns, targets, connections, rate=None, ...)
                                          either of them over several servers at once, the
                                          connections (and rate) split evenly: one open-loop
                                          generator for all, or a wrk each and results merged

Both return an HttpResult: requests answered, errors, seconds, rate and a
latency distribution (milliseconds at the QUANTILES, for percentiles and CDFs).
wrk reports latency from when a request was sent, so a server that stalls
slows the load down and hides the stall (coordinated omission); the open
loop's numbers include the wait. openloop.c is built with cc on first use and
cached by the hash of its source.
"""

import json
import os
import selectors
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import netns
from ..netns import LabError
from . import ctools
from .ctools import built
from .report import MAX_LOAD_SECONDS

# percent points of the latency distribution kept per run: every percent, then the tail
QUANTILES = [float(q) for q in range(1, 100)] + [99.5, 99.9, 99.95, 99.99]
SOURCE = Path(__file__).with_name("openloop.c")
CACHE = ctools.CACHE

# wrk's Lua hook at the end of a run: its own latency histogram, as JSON on stdout
WRK_SCRIPT = """
done = function(summary, latency, requests)
  local e = summary.errors
  local q = {}
  for _, p in ipairs({%s}) do q[#q + 1] = string.format("%%.3f", latency:percentile(p) / 1000) end
  io.write(string.format('{"requests": %%d, "errors": %%d, "connect": %%d, "read": %%d, "write": %%d, ' ..
    '"status": %%d, "timeout": %%d, "seconds": %%.6f, "quantiles_ms": [%%s]}\\n',
    summary.requests, e.connect + e.read + e.write + e.status + e.timeout, e.connect, e.read, e.write,
    e.status, e.timeout, summary.duration / 1e6, table.concat(q, ", ")))
end
""" % ", ".join(str(q) for q in QUANTILES)


@dataclass
class HttpResult:
    tool: str
    connections: int
    offered_rps: float | None  # open loop: the schedule's rate; closed loop: None
    requests: int  # answered with a 2xx/3xx
    errors: int  # failed, non-2xx/3xx or unanswered within the timeout
    seconds: float
    quantiles_ms: list = field(default_factory=list)  # latency at each of QUANTILES
    detail: dict = field(default_factory=dict)

    @property
    def rps(self):
        """Answered per second; for the open loop, those answered while the schedule ran."""
        done = self.detail.get("in_schedule", self.requests)
        return done / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q) -> float:
        return self.quantiles_ms[QUANTILES.index(float(q))] if self.quantiles_ms else float("nan")


def _bound(seconds):
    if not 0 < seconds <= MAX_LOAD_SECONDS:
        raise ValueError(f"a load run lasts between 0 and {MAX_LOAD_SECONDS:g} s, not {seconds}")


class Loads:
    """The load processes of one spread() (or one call), so that an interrupted spread
    stops them all at once: its threads would otherwise each wait out its process's
    whole run, and wrk ignores SIGINT until its threads are up (a Ctrl-C in that moment
    held a bench for its 60-s run). A load that would start after stop() does not."""

    def __init__(self):
        self.lock = threading.Lock()
        self.procs = []
        self.stopped = False

    def run(self, ns, argv, timeout) -> subprocess.CompletedProcess:
        """argv in namespace ns, its output captured, killed at `timeout` or when stopped."""
        with self.lock:
            if self.stopped:
                raise LabError("the load was stopped before it started")
            proc = netns.popen(ns, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.procs.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def stop(self):
        with self.lock:
            self.stopped = True
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()


def closed_loop(
    ns, addr, port, connections=100, seconds=10.0, threads=2, timeout=2.0, path="/", loads=None
) -> HttpResult:
    """wrk -t threads -c connections -d seconds against http://addr:port/path
    (loads: the Loads it runs in, a spread()'s)."""
    _bound(seconds)
    wrk = shutil.which("wrk")
    if not wrk:
        raise LabError("wrk not found (Debian package wrk; run `make setup`)")
    host = f"[{addr}]" if ":" in str(addr) else addr
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="vtl-wrk-") as script:
        script.write(WRK_SCRIPT)
        script.flush()
        argv = [
            wrk,
            "-t",
            str(threads),
            "-c",
            str(connections),
            "-d",
            f"{seconds:g}s",
            "--timeout",
            f"{timeout:g}s",
            "-s",
            script.name,
            f"http://{host}:{port}{path}",
        ]
        r = (loads or Loads()).run(ns, argv, timeout=seconds + 60)
    out = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not out:
        err = (r.stderr.strip() or r.stdout.strip() or f"exit {r.returncode}").splitlines()[-1]
        raise LabError(f"wrk against {host}:{port} failed: {err}")
    d = json.loads(out[-1])
    return HttpResult(
        "wrk",
        connections,
        None,
        d["requests"] - d["status"],
        d["errors"],
        d["seconds"],
        d["quantiles_ms"],
        {k: d[k] for k in ("connect", "read", "write", "status", "timeout")},
    )


def openloop_binary() -> Path:
    """openloop.c compiled once per version of its source."""
    return built(SOURCE, "the open-loop generator")


def open_loop(ns, addr, port, rate, connections=100, seconds=10.0, timeout=5.0, path="/", loads=None) -> HttpResult:
    """`rate` requests per second over `connections` keep-alive connections for
    `seconds`; a request not answered `timeout` s after the schedule ends is an
    error. addr may be a list: connection c goes to the (c mod n)-th address."""
    addr = ",".join(map(str, addr)) if isinstance(addr, (list, tuple)) else str(addr)
    _bound(seconds)
    if rate <= 0:
        raise ValueError(f"rate must be positive, not {rate}")
    binary = openloop_binary()
    with tempfile.NamedTemporaryFile(prefix="vtl-openloop-", suffix=".u32") as lat:
        argv = [
            str(binary),
            str(addr),
            str(port),
            path,
            str(connections),
            f"{rate:.3f}",
            f"{seconds:g}",
            f"{timeout:g}",
            lat.name,
        ]
        r = (loads or Loads()).run(ns, argv, timeout=seconds + 2 * timeout + 30)
        if r.returncode != 0 or not r.stdout.strip():
            err = (r.stderr.strip() or f"exit {r.returncode}").splitlines()[-1]
            raise LabError(f"open-loop load against {addr}:{port} failed: {err}")
        d = json.loads(r.stdout)
        us = np.fromfile(lat.name, dtype=np.uint32)
    qs = [round(float(v) / 1000, 3) for v in np.percentile(us, QUANTILES)] if len(us) else []
    # the rate is what was answered while the schedule ran, over its length: an LB past its
    # capacity answers at its capacity, and one late answer in the drain after it cannot halve it
    return HttpResult(
        "openloop",
        connections,
        rate,
        d["requests"],
        d["errors"],
        seconds,
        qs,
        {
            **{
                k: d[k]
                for k in ("scheduled", "in_schedule", "timeouts", "status_errors", "connect_errors", "reconnects")
            },
            "elapsed_s": d["seconds"],
        },
    )


def merge(results: list) -> HttpResult:
    """One result for runs against several servers at the same time: counts add
    up, and the latency distribution is the mixture of theirs (each weighted
    by its requests), read back at the QUANTILES."""
    if len(results) == 1:
        return results[0]
    first = results[0]
    done = [r for r in results if r.quantiles_ms and r.requests]
    qs = []
    if done:
        grid = np.unique(np.concatenate([r.quantiles_ms for r in done]))
        weights = np.array([r.requests for r in done], dtype=float)
        cdf = (
            sum(
                w * np.interp(grid, r.quantiles_ms, QUANTILES, left=0.0, right=100.0)
                for w, r in zip(weights, done, strict=True)
            )
            / weights.sum()
        )
        cdf = np.maximum.accumulate(cdf)
        qs = [round(float(v), 3) for v in np.interp(QUANTILES, cdf, grid)]
    detail = {k: sum(r.detail.get(k, 0) for r in results) for k in first.detail}
    return HttpResult(
        first.tool,
        sum(r.connections for r in results),
        None if first.offered_rps is None else sum(r.offered_rps for r in results),
        sum(r.requests for r in results),
        sum(r.errors for r in results),
        max(r.seconds for r in results),
        qs,
        {**detail, "servers": len(results)},
    )


def spread(load, ns, targets, connections, rate=None, **kw) -> HttpResult:
    """closed_loop or open_loop (`load`) against every (addr, port) of
    `targets` at once, connections and rate split evenly between them (for wrk,
    one process per server, each with its share of the threads)."""
    n = len(targets)
    if load is open_loop and len({p for _, p in targets}) == 1:
        # one generator for all, as for a VIP: the same process, clock and CPU either way
        return open_loop(ns, [a for a, _ in targets], targets[0][1], rate, connections=connections, **kw)
    if connections < n:
        raise ValueError(f"{connections} connections cannot spread over {n} servers")
    if load is closed_loop and "threads" in kw:
        kw["threads"] = max(1, kw["threads"] // n)  # the same wrk threads in all
    loads = Loads()
    with ThreadPoolExecutor(n) as pool:
        jobs = []
        for i, (addr, port) in enumerate(targets):
            c = connections // n + (i < connections % n)
            args = (ns, addr, port) + ((rate / n,) if rate is not None else ())
            jobs.append(pool.submit(load, *args, connections=c, loads=loads, **kw))
        try:
            return merge([j.result() for j in jobs])
        except BaseException:  # Ctrl-C, or one load failed: the others stopped now, not at their end
            loads.stop()
            raise


class Connections:
    """`n` keep-alive HTTP/1.1 connections from a lab namespace to addr:port, held
    open for as long as a test or an experiment needs (10,000 of them through
    the load balancer): open(), request() on all or some of them, close().

    request() sends one GET on each chosen connection and reads each whole
    response; it returns, per connection, the first line of the body (the lab's
    backends say who served it), "" for a status other than 2xx, or None where
    the connection failed (reset, closed, timed out), as it does for every
    later request on that connection. One thread and a selector: thousands at once."""

    def __init__(self, ns, addr, port, n, timeout=20.0, batch=1000, source_ports=None):
        self.ns, self.addr, self.port, self.n = ns, str(addr), port, n
        self.timeout, self.batch, self.source_ports = timeout, batch, source_ports
        self.socks = []
        self.dead = set()  # connections that failed or left a request unanswered: never read again

    def open(self):
        family = socket.AF_INET6 if ":" in self.addr else socket.AF_INET
        try:
            for start in range(0, self.n, self.batch):  # in batches: a burst of SYNs overflows listen queues
                new = []
                with netns.entered(self.ns):
                    for i in range(start, min(self.n, start + self.batch)):
                        s = socket.socket(family, socket.SOCK_STREAM)
                        self.socks.append(s)
                        if self.source_ports:
                            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                            s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", self.source_ports[i]))
                        s.setblocking(False)
                        s.connect_ex((self.addr, self.port))
                        new.append(s)
                with selectors.DefaultSelector() as sel:
                    for s in new:
                        sel.register(s, selectors.EVENT_WRITE)
                    pending = len(new)
                    deadline = time.monotonic() + self.timeout
                    while pending:
                        events = sel.select(timeout=max(0.0, deadline - time.monotonic()))
                        if not events:
                            raise LabError(
                                f"{pending} of {len(new)} connections to {self.addr}:{self.port} "
                                f"not established within {self.timeout:g} s"
                            )
                        for key, _ in events:
                            err = key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                            if err:
                                raise LabError(f"connecting to {self.addr}:{self.port}: {os.strerror(err)}")
                            sel.unregister(key.fileobj)
                            pending -= 1
        except BaseException:
            self.close()
            raise
        return self

    def request(self, which=None, close=False, path="/") -> list:
        which = range(len(self.socks)) if which is None else list(which)
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        req = (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n"
        ).encode()
        out = {i: None for i in which}
        bufs = {}
        sel = selectors.DefaultSelector()
        for i in which:
            if i in self.dead:
                continue
            try:
                self.socks[i].send(req)
            except OSError:
                self.dead.add(i)
                continue
            bufs[i] = b""
            sel.register(self.socks[i], selectors.EVENT_READ, i)
        deadline = time.monotonic() + self.timeout
        while bufs and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                i = key.data
                try:
                    chunk = key.fileobj.recv(65536)
                except OSError:
                    chunk = b""
                if chunk:
                    bufs[i] += chunk
                    body = _whole_body(bufs[i])
                    if body is None:
                        continue
                    out[i] = body.split(b"\n", 1)[0].decode(errors="replace")
                else:
                    self.dead.add(i)  # closed or reset
                sel.unregister(key.fileobj)
                del bufs[i]
        sel.close()
        self.dead.update(bufs)  # unanswered in time: a late answer must not pass for the next one's
        return [out[i] for i in which]

    def close(self):
        for s in self.socks:
            s.close()
        self.socks = []
        self.dead = set()

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
        return False


def _whole_body(buf: bytes):
    """The body of a complete 2xx response in buf, b"" for another status, None if incomplete."""
    head, sep, rest = buf.partition(b"\r\n\r\n")
    if not sep:
        return None
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if len(rest) < length:
        return None
    return rest[:length] if head[9:10] == b"2" else b""
