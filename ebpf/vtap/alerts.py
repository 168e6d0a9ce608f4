"""Following an IDS's alerts as it writes them: a Suricata EVE JSON file (one JSON
object per line), read from its end, through rotation and truncation, for the tap
whose watch-list the alerts steer (issue "A tap that keeps the IDS up", part 2).

    >>> f = EveFollower("/var/log/suricata/eve.json")     # doctest: +SKIP
    >>> for alert in f.poll():                              # what was written since the last poll
    ...     alert.src, alert.dst, alert.sid, alert.written

Pure file reading, no kernel: the tap calls poll() as often as it likes (the command
every 0.25 s). What it follows, as `tail -F` does:
- it starts at the file's end (alerts already written are history, not news); a file
  that is not there yet is waited for, and read from its start once it appears;
- rotation: another file at the path (a new inode; logrotate's `create`, Suricata
  reopening on SIGHUP): the old one is read to its end, then the new from its start;
- truncation: the file shorter than what was read (logrotate's `copytruncate`): read
  again from its start (as for `tail -F`, one that has grown past the old end again by
  the next poll is not seen as truncated);
- a line is taken once whole (a writer's half line waits for its newline);
- a line that is not a JSON object is skipped and counted (`malformed`); lines of other
  event types (flow, stats, dns, ...) are counted as `events` and ignored.
`written` is when the line was seen to have been written: the file's modification
time as this poll found it, the best a reader has of when the IDS wrote it (the
alert's own `timestamp` is the packet's time).
"""

import ipaddress
import json
import os
import time
from dataclasses import dataclass, field

MAX_LINE = 1 << 20  # a line longer than this without a newline is dropped (counted malformed)


@dataclass(frozen=True)
class Alert:
    src: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    dst: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    sid: int | None
    signature: str
    timestamp: str  # the alert's own (the packet's time, as Suricata writes it)
    written: float  # the file's mtime when this poll read it (time.time() scale)


def _addr(text):
    try:
        return ipaddress.ip_address(str(text))
    except ValueError:
        return None


@dataclass
class EveFollower:
    path: str
    from_start: bool = False  # read what is there already (a test, a replay), not only what comes
    counters: dict = field(
        default_factory=lambda: dict.fromkeys(("lines", "alerts", "events", "malformed", "rotations", "truncations"), 0)
    )

    def __post_init__(self):
        self._f = None
        self._ino = None
        self._pending = b""
        self._open(at_end=not self.from_start)

    def _open(self, at_end):
        try:
            f = open(self.path, "rb")  # noqa: SIM115 -- kept open between polls, closed in close()
        except FileNotFoundError:
            return False
        self._f, self._ino = f, os.fstat(f.fileno()).st_ino
        if at_end:
            f.seek(0, os.SEEK_END)
        self._pending = b""
        return True

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None

    def poll(self) -> list[Alert]:
        """The alerts written since the last poll, in the order they were written."""
        if self._f is None and not self._open(at_end=False):  # appeared since: all of it is new
            return []
        out = self._read_on()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:  # moved away, the new one not made yet: keep reading the old
            return out
        if st.st_ino != self._ino:  # rotated: the old file to its end (done above), then the new
            self.counters["rotations"] += 1
            self.close()
            if self._open(at_end=False):
                out += self._read_on()
        elif st.st_size < self._f.tell():  # truncated in place (unless it grew past our place again)
            self.counters["truncations"] += 1
            self._f.seek(0)
            self._pending = b""
            out += self._read_on()
        return out

    def _read_on(self) -> list[Alert]:
        data = self._pending + self._f.read()
        *lines, self._pending = data.split(b"\n")
        if len(self._pending) > MAX_LINE:
            self._pending = b""
            self.counters["malformed"] += 1
        try:
            written = os.fstat(self._f.fileno()).st_mtime
        except OSError:
            written = 0.0
        return [a for a in (self._parse(ln, written) for ln in lines if ln.strip()) if a is not None]

    def _parse(self, line: bytes, written: float) -> Alert | None:
        self.counters["lines"] += 1
        try:
            ev = json.loads(line)
        except ValueError:
            ev = None
        if not isinstance(ev, dict):
            self.counters["malformed"] += 1
            return None
        if ev.get("event_type") != "alert":
            self.counters["events"] += 1
            return None
        self.counters["alerts"] += 1
        a = ev.get("alert") if isinstance(ev.get("alert"), dict) else {}
        sid = a.get("signature_id")
        return Alert(
            _addr(ev.get("src_ip")),
            _addr(ev.get("dest_ip")),
            sid if isinstance(sid, int) else None,
            str(a.get("signature", "")),
            str(ev.get("timestamp", "")),
            written,
        )


class Holds:
    """The hosts alerts put on a watch-list: each for `hold` seconds from its latest
    alert (a later alert renews it), at most `cap` of them at once (an alert for a new
    host past the cap is counted in `capped` and changes nothing); `which` says which
    of an alert's addresses (src, dst or both). expire() takes off the hosts whose hold
    has ended. Time is the caller's clock (monotonic seconds by default).

        >>> h = Holds(hold=300, cap=1024)
        >>> h.take(alert)            # the hosts it added (new ones; renewed ones are not news)
        >>> h.networks()             # [IPv4Network('198.18.0.5/32'), ...] for set_watch()
        >>> h.expire()               # the hosts whose hold ended
    """

    def __init__(self, hold=300.0, cap=1024, which="both", clock=None):
        if hold <= 0:
            raise ValueError(f"an alert's hold is more than 0 s, not {hold}")
        if cap < 1:
            raise ValueError(f"the cap on hosts from alerts is at least 1, not {cap}")
        if which not in ("src", "dst", "both"):
            raise ValueError(f"which of an alert's hosts: src, dst or both, not {which!r}")
        self.hold, self.cap, self.which = float(hold), int(cap), which
        self.clock = clock or time.monotonic
        self.until = {}  # address -> when its hold ends
        self.counters = dict.fromkeys(("added", "renewed", "expired", "capped"), 0)

    def take(self, alert: Alert, now=None, hold=None) -> list:
        """hold: this alert's seconds, for its hosts (default: the Holds')."""
        now = self.clock() if now is None else now
        hold = self.hold if hold is None else float(hold)
        hosts = [alert.src, alert.dst] if self.which == "both" else [getattr(alert, self.which)]
        added = []
        for a in hosts:
            if a is None or a in added:
                continue
            if a in self.until:
                self.until[a] = max(self.until[a], now + hold)
                self.counters["renewed"] += 1
            elif len(self.until) >= self.cap:
                self.counters["capped"] += 1
            else:
                self.until[a] = now + hold
                self.counters["added"] += 1
                added.append(a)
        return added

    def expire(self, now=None) -> list:
        now = self.clock() if now is None else now
        gone = [a for a, t in self.until.items() if t <= now]
        for a in gone:
            del self.until[a]
        self.counters["expired"] += len(gone)
        return gone

    def networks(self) -> list:
        return [ipaddress.ip_network(a) for a in sorted(self.until, key=lambda a: (a.version, a))]
