"""--metrics ADDR:PORT: a running tool's live table as Prometheus metrics,
served over HTTP by the Python client library (prometheus_client) from a
registry of the tool's own.

Every interval the live table publishes what it shows (the sample its --json
twin prints); a scrape gets that sample: each counter of the totals as
`<tool>_<name>_total`, each counter of a row with the row's label
(`vtap_seen_total{interface="eth0"}`, `lb_packets_total{backend="..."}`), and
the few values that go up and down (a backend's weight, its active sessions)
as gauges, without `_total`. Rates are left out: Prometheus computes them
(`rate(vtap_sent_total[1m])`). HELP says what each one counts.

    $ vtap --sessions s.toml --metrics 127.0.0.1:9464 &
    $ curl -s 127.0.0.1:9464/metrics | grep vtap_session_sent_total
"""

import contextlib
import ipaddress
import threading
from dataclasses import dataclass

from ebpf.errors import InputError

# What each name counts: shared names mean the same in every tool (verdict.h).
HELP = {
    "seen": "frames the program saw",
    "matched": "frames the watch-list matched",
    "cloned": "copies handed to the kernel for the monitor",
    "sampled_out": "frames matched but not the one in N sampled",
    "failed": "copies the kernel refused or could not send",
    "not_ip": "frames that are not IPv4 or IPv6",
    "malformed": "frames with a header cut short or invalid",
    "unmatched": "frames no rule, watch-list entry or service matched",
    "oversize": "copies longer than the path's MTU allows",
    "cloned_bytes": "bytes of the copies handed over",
    "cloned_segs": "copies in wire packets (a GSO frame counts its segments)",
    "pass": "frames passed on to the kernel",
    "mirror": "frames copied",
    "drop": "frames dropped",
    "tx": "frames sent back out of the interface they came in on",
    "redirect": "frames sent out of another interface",
    "aborted": "frames the program failed on",
    "to_kernel": "watched frames the fast path left to the kernel",
    "forwarded": "frames the fast path sent out of their egress",
    "mirrored": "frames copied by at least one session",
    "not_taken": "frames a session rule matched but no session copied (rejected, sampled out, given way)",
    "own_copies": "copies of this program seen again on a tapped hook (never copied again)",
    "accepted": "frames the session's rules accepted",
    "rejected": "frames a reject rule of the session decided",
    "shadowed": "frames an earlier session with the same target copied instead",
    "handed": "copies handed to the sender",
    "sent": "copies sent to the session's target",
    "sent_bytes": "bytes sent to the target, encapsulation included",
    "frame_bytes": "bytes of the copied frames before truncation",
    "truncated": "copies cut to the session's length (or to fit the path)",
    "matches": "frames this rule decided for its session",
    "packets": "packets rewritten towards the backend",
    "bytes": "bytes rewritten towards the backend",
    "reply_packets": "replies rewritten back to the client",
    "reply_bytes": "bytes of the replies rewritten back",
    "new_sessions": "sessions the load balancer opened to the backend",
    "active_sessions": "sessions open to the backend now",
    "weight": "the backend's weight",
    "healthy": "1 when the backend passes its health check",
    "unanswered": "packets sent to it since its last reply",
    "csum_finished": "partial checksums the program finished",
    "egress_dropped": "frames the egress device dropped",
    "redirect_errors": "redirects the kernel refused",
    # the vTAP's per-flow cutoff (ebpf/vtap/cutoff.h)
    "cut": "watched frames not copied: their flow is past the cutoff in that direction",
    "cut_bytes": "bytes of the frames the cutoff did not copy",
    "ends_copied": "SYN, FIN or RST segments copied after their flow's cut",
    "flows_new": "flows the cutoff's table took in",
    "flows_ended": "TCP flows forgotten after FINs from both sides or a RST",
    "flows_restarted": "flows started again from zero (idle past the timeout, or a new SYN)",
    "flows": "flows in the cutoff's table now",
    "evicted": "flows the full table let go",
    "uncut_fragment": "IP fragments copied without a flow",
    "uncut_no_ports": "IP packets without ports copied without a flow",
    "uncut_malformed": "frames with a TCP/UDP header cut short copied without a flow",
    # alerts that steer the watch-list (ebpf/vtap/steer.py)
    "alerts": "alerts read from the IDS's EVE file",
    "alert_hosts": "hosts on the watch-list by alerts now",
    "alert_added": "hosts alerts put on the watch-list",
    "alert_renewed": "alerts that renewed a host's hold",
    "alert_expired": "hosts whose hold ended",
    "alert_capped": "hosts not held: the cap was reached",
    "alert_no_room": "hosts not held: no room on the watch-list",
    "alert_malformed": "lines of the EVE file that were not JSON objects",
    "alert_first_copies": "held hosts whose first copy came",
    "alert_first_copy_median_s": "median seconds from an alert's line to its host's first copy",
    "alert_first_copy_max_s": "most seconds from an alert's line to its host's first copy",
}
PREFIXED_HELP = {
    "dropped_": "frames dropped because: ",
    "slow_": "frames left to the kernel because: ",
    "monitor_": "at the monitor: ",
}


def parse_listen(text) -> tuple[str, int]:
    """ "ADDR:PORT" or "[ADDR6]:PORT" or ":PORT" (all addresses)."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InputError(f"--metrics {text}: expected ADDR:PORT (127.0.0.1:9464, [::1]:9464 or :9464)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InputError(f"--metrics {text}: {host!r} is not an IP address") from None
    return host or "0.0.0.0", int(port)


def _help(name):
    if name in HELP:
        return HELP[name]
    for prefix, said in PREFIXED_HELP.items():
        if name.startswith(prefix):
            return said + name[len(prefix) :].replace("_", " ")
    return name.replace("_", " ")


@dataclass
class Rows:
    """How a group of rows of a sample is exported: its label (or labels, for
    rows keyed "a\\x1fb"), and a prefix for its metrics' names."""

    label: str | tuple
    prefix: str = ""


class Exporter:
    """Serves the latest published sample of one tool.

    rows: {key of the sample: label name, or Rows}; gauges: names that go up
    and down; skip: names left out. A total whose name a row group also has is
    left out: it is the rows' sum, Prometheus's to compute."""

    def __init__(self, tool, listen, rows=None, gauges=(), skip=()):
        from prometheus_client import CollectorRegistry  # noqa: PLC0415 -- slow; only --metrics needs it

        self.tool = tool
        self.host, self.port = parse_listen(listen)
        self.rows = {k: v if isinstance(v, Rows) else Rows(v) for k, v in (rows or {}).items()}
        self.gauges, self.skip = set(gauges), set(skip)
        self._sample = {}
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._server = None

    def start(self):
        from prometheus_client import start_http_server  # noqa: PLC0415 -- slow; only --metrics needs it

        try:
            self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        except OSError as e:
            raise InputError(f"--metrics {self.host}:{self.port}: cannot listen: {e.strerror}") from None
        return self

    def publish(self, sample: dict):
        with self._lock:
            self._sample = dict(sample)

    def close(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False

    # --- prometheus_client's Collector interface --------------------------------------
    def _family(self, families, name, prefix, labels):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: PLC0415 -- for --metrics only

        full = f"{self.tool}_{prefix}{name}"
        if full not in families:
            kind = GaugeMetricFamily if name in self.gauges else CounterMetricFamily
            families[full] = kind(full, _help(name), labels=labels)
        return families[full]

    def collect(self):
        with self._lock:
            sample = self._sample
        families, in_rows = {}, set()
        for key, spec in self.rows.items():
            labels = list(spec.label) if isinstance(spec.label, tuple) else [spec.label]
            for row, counters in (sample.get(key) or {}).items():
                values = row.split("\x1f") if len(labels) > 1 else [row]
                for name, v in counters.items() if isinstance(counters, dict) else ():
                    if self._wanted(name, v):
                        in_rows.add(spec.prefix + name)
                        self._family(families, name, spec.prefix, labels).add_metric(values, float(v))
        for key, value in sample.items():
            if key not in self.rows and key not in in_rows and self._wanted(key, value):
                self._family(families, key, "", []).add_metric([], float(value))
        yield from families.values()

    def _wanted(self, name, value):
        if name in self.skip or name.endswith("_pps") or name in ("time", "seconds", "event"):
            return False
        return (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            or (isinstance(value, bool) and name in self.gauges)
        )


def serving(table, a, tool, **kw):
    """Start what --metrics asks for (if anything) and give it the live table's
    samples; returns a context manager that stops it. Called before anything
    is attached: a port that cannot be had stops the command with nothing done."""
    listen = getattr(a, "metrics", None)
    if not listen:
        return contextlib.nullcontext()
    table.exporter = Exporter(tool, listen, **kw).start()
    return contextlib.closing(table.exporter)
