"""Health checks of the load balancer's backends: a TCP connect to each, every
interval, in a thread; a backend leaves after --fall failures in a row and
comes back after --rise passes (python -m lab lb applies the results)."""

import socket
import threading

from lab.netns import entered


class HealthChecker:
    """TCP connects to each backend from this namespace (or lab namespace `ns`),
    in a thread: `healthy` follows rise/fall. A backend starts healthy (so a run
    begins serving at once). `changes` records each turn as (backend, healthy,
    failed probes of it so far)."""

    def __init__(self, backends, interval, rise, fall, timeout=None, ns=None, sources=None):
        self.interval, self.rise, self.fall, self.ns = interval, rise, fall, ns
        # {4: addr, 6: addr}: probes leave from the LB's own address, never from a
        # VIP this host also holds (IPv6 source selection may pick it), to which
        # a DSR backend, holding the VIP itself, would answer locally
        self.sources = {k: v for k, v in (sources or {}).items() if v}
        self.timeout = timeout or min(1.0, interval)
        self.healthy = {b: True for b in backends}
        self._streak = {b: 0 for b in backends}
        self.failed = {b: 0 for b in backends}
        self.changes = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lb-health", daemon=True)
        self.changed = threading.Event()

    def set_backends(self, backends):
        for b in backends:
            self.healthy.setdefault(b, True)
            self._streak.setdefault(b, 0)

    def probe(self, b) -> bool:
        family = socket.AF_INET6 if b.addr.version == 6 else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout)
                if b.addr.version in self.sources:
                    s.bind((str(self.sources[b.addr.version]), 0))
                s.connect((str(b.addr), b.port))
            return True
        except OSError:
            return False

    def _loop(self):
        if self.ns:
            with entered(self.ns):  # this thread's sockets are made in the namespace
                return self._probe_all()
        self._probe_all()

    def _probe_all(self):
        while not self._stop.wait(self.interval):
            for b in list(self.healthy):
                ok = self.probe(b)
                if not ok:
                    self.failed[b] = self.failed.get(b, 0) + 1
                if ok == self.healthy[b]:
                    self._streak[b] = 0
                    continue
                self._streak[b] += 1
                if self._streak[b] >= (self.rise if ok else self.fall):
                    self.healthy[b] = ok
                    self._streak[b] = 0
                    self.changes.append((b, ok, self.failed[b]))
                    self.changed.set()

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
