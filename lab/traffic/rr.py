"""Request/response over TCP from a lab namespace: netperf's TCP_RR and TCP_CRR shapes
(rr.c, built with cc on first use), bounded in seconds like every load of the lab.

    with RrServer(server_ns, port=7100):                       # rr serve: one byte back per byte
        r = request_response(client_ns, "198.18.101.1", 7100, seconds=5)             # TCP_RR
        r.tps, r.percentile(50), r.percentile(99)              # transactions/s, microseconds
        c = request_response(client_ns, vip, 80, seconds=5, mode="crr", threads=4)  # TCP_CRR

A transaction is one byte each way (rr: on one held connection per thread; crr: on a
new connection each time, closed with a reset so that no TIME_WAIT piles up). Its
time is measured by the client around the exchange (crr: connect to close).
"""

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import netns
from ..netns import LabError
from .ctools import built
from .http import QUANTILES
from .report import MAX_LOAD_SECONDS

SOURCE = Path(__file__).with_name("rr.c")
MODES = ("rr", "crr")


def rr_binary() -> Path:
    return built(SOURCE, "the request/response client", libs=("-lpthread",))


@dataclass
class RrResult:
    mode: str
    threads: int
    transactions: int
    errors: int
    seconds: float
    quantiles_us: list = field(default_factory=list)  # at http.QUANTILES

    @property
    def tps(self) -> float:
        return self.transactions / self.seconds if self.seconds else 0.0

    def percentile(self, q) -> float:
        return float(np.interp(q, QUANTILES, self.quantiles_us)) if self.quantiles_us else float("nan")


class RrServer:
    """`rr serve PORT` in a namespace, for as long as the object is open."""

    def __init__(self, ns, port=7100, **popen_kw):
        self.ns, self.port, self.kw = ns, port, popen_kw
        self.proc = None

    def __enter__(self):
        self.proc = netns.popen(
            self.ns,
            [str(rr_binary()), "serve", str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **self.kw,
        )
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.close()
            raise LabError(f"rr server in {self.ns}: {line or 'exited'}")
        return self

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __exit__(self, *exc):
        self.close()
        return False


def request_response(ns, addr, port, seconds=5.0, threads=1, mode="rr", **popen_kw) -> RrResult:
    """One bounded run of the client (popen_kw: e.g. preexec_fn, to start it in a cgroup)."""
    if mode not in MODES:
        raise ValueError(f"mode is rr or crr, not {mode!r}")
    if not 0 < seconds <= MAX_LOAD_SECONDS:
        raise ValueError(f"a run lasts 0..{MAX_LOAD_SECONDS} s, not {seconds}")
    with tempfile.NamedTemporaryFile(prefix="vtl-rr-", suffix=".u32") as lat:
        argv = [str(rr_binary()), mode, str(addr), str(port), f"{seconds:g}", str(threads), lat.name]
        r = netns.run(ns, argv, check=False, capture_output=True, text=True, timeout=seconds + 30, **popen_kw)
        if r.returncode != 0 or not r.stdout.strip():
            err = (r.stderr.strip() or f"exit {r.returncode}").splitlines()[-1]
            raise LabError(f"request/response against {addr}:{port} failed: {err}")
        d = json.loads(r.stdout)
        units = np.fromfile(lat.name, dtype=np.uint32)  # 0.1 us each
    qs = [round(float(v) / 10, 2) for v in np.percentile(units, QUANTILES)] if len(units) else []
    return RrResult(mode, threads, d["transactions"], d["errors"], d["seconds"], qs)
