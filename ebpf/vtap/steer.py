"""Hosts put on a vTAP's watch-list for a while: by hand (`tap.watch_for(addr, seconds)`)
or by an IDS's alerts (`tap.follow_alerts(path)`, `vtap --alerts FILE`), each taken off
when its hold ends, and how long each waited from its alert to its first copy.

    >>> tap.follow_alerts("/var/log/suricata/eve.json", watch="both", hold=300, max_hosts=1024)  # doctest: +SKIP
    >>> tap.alert_counters()     # alerts read, hosts held, added, renewed, expired, capped, ...

Zeek's NetControl turns a finding into a rule with an expiry; CrowdSec's bouncer polls
every 10 s into an nftables set with timeouts. Here the alerts are read as they are
written (alerts.EveFollower, every `interval`, 0.2 s by default) in a thread of the
tap's process, and a host's /32 (/128) entry goes into the watch-list's trie beside the
list the tap was given, which stays as it is. The program stamps an entry the first
time a frame matches it (watch.h's hit()): that stamp, less the time the alert's line
was written (the file's modification time as the poll found it), is the host's wait.
"""

import ipaddress
import statistics
import threading
import time

from ebpf.errors import InputError
from ebpf.vtap.alerts import Alert, EveFollower, Holds

INTERVAL = 0.2  # seconds between two reads of the alerts file
HOLD_DEFAULT = 300.0
MAX_HOSTS_DEFAULT = 1024


def _host(addr):
    try:
        a = ipaddress.ip_address(str(addr))
    except ValueError:
        raise InputError(f"{addr!r} is not an IP address") from None
    return a


class Steer:
    """The held hosts of one tap, the alerts that put them there, and their waits.
    apply() writes the watch-list through the tap; poll() is one round: read the alerts,
    take them, end the holds that are over, read the first copies. A hold taken or ended
    and the trie's write happen under the tap's watch lock, the one its readers take, so
    the held hosts, the counters and the watch-list never disagree."""

    def __init__(self, tap, hold=HOLD_DEFAULT, max_hosts=MAX_HOSTS_DEFAULT, which="both"):
        try:
            self.holds = Holds(hold, max_hosts, which)
        except ValueError as e:
            raise InputError(str(e)) from None
        self.tap = tap
        self.follower = None
        self.waiting = {}  # host -> when its alert was written (time.time()), until its first copy
        self.waits = []  # (host, seconds from an alert's line written to its first copy)
        self.counters = dict.fromkeys(("alerts", "no_room"), 0)
        self._said = set()  # what was said once
        self._thread = None
        self._stop = threading.Event()

    # --- hosts --------------------------------------------------------------------
    def hold(self, addr, seconds, written=None):
        """Watch addr for `seconds` from now (a host held already: renewed, to the later end)."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
            raise InputError(f"seconds must be a positive number, not {seconds!r}")
        a = _host(addr)
        with self.tap.watch_lock:
            if self._take(Alert(a, a, None, "watch_for", "", written or time.time()), seconds):
                self.tap.apply_held()
        self.start()  # the thread that ends the hold

    def _take(self, alert, hold=None):
        added = self.holds.take(alert, hold=hold)
        room = [a for a in added if self.tap.has_room(a)]
        for a in added:
            if a not in room:  # its family's trie is full: not held (said once)
                del self.holds.until[a]
                self.holds.counters["added"] -= 1
                self.counters["no_room"] += 1
                self._once("room", self.tap.no_room_said(a))
            elif not self.tap.watches_alone(a):
                self.waiting[a] = alert.written
        if self.holds.counters["capped"]:
            self._once("cap", f"{self.holds.cap} hosts are held from alerts (the cap): alerts for more are counted")
        return room

    def _once(self, key, msg):
        if key not in self._said:
            self._said.add(key)
            self.tap.warn(msg)

    def networks(self):
        return self.holds.networks()

    # --- one round ------------------------------------------------------------------
    def poll(self):
        alerts = []
        if self.follower is not None:  # the file is read outside the lock
            bad = self.follower.counters["malformed"]
            alerts = self.follower.poll()
            if self.follower.counters["malformed"] > bad:
                self._once("malformed", f"{self.follower.path}: a line that is not a JSON object was skipped (counted)")
        with self.tap.watch_lock:
            changed = False
            for alert in alerts:
                self.counters["alerts"] += 1
                changed |= bool(self._take(alert))
            # renewals change nothing in the trie; an ended hold does
            for a in self.holds.expire():
                self.waiting.pop(a, None)
                changed = True
            if changed:
                self.tap.apply_held()
            self.first_copies()

    def first_copies(self):
        """Each waiting host whose first frame the program stamped: its wait, counted."""
        if not self.waiting:
            return
        offset = time.time() - time.monotonic()  # bpf_ktime_get_ns() is CLOCK_MONOTONIC
        for a, written in list(self.waiting.items()):
            first_ns = self.tap.first_match_ns(a)
            if first_ns:
                self.waits.append((a, max(0.0, first_ns / 1e9 + offset - written)))
                del self.waiting[a]

    # --- the thread ---------------------------------------------------------------------
    def follow(self, path, from_start=False, interval=INTERVAL):
        if self.follower is not None:
            raise InputError(f"already following {self.follower.path}")
        self.follower = EveFollower(str(path), from_start=from_start)
        self.start(interval)

    def start(self, interval=INTERVAL):
        if self._thread is not None:
            return
        self._stop.clear()

        def loop():
            while not self._stop.wait(interval):
                try:
                    self.poll()
                except Exception as e:  # the tap closed under it, a map write refused: said, and on
                    self._once(f"error {type(e).__name__}", f"following alerts: {e}")

        self._thread = threading.Thread(target=loop, name="vtap-alerts", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self.follower is not None:
            self.follower.close()

    # --- what it says -----------------------------------------------------------------
    def counters_now(self) -> dict:
        h = self.holds.counters
        waits = sorted(w for _, w in self.waits)
        out = {
            "alerts": self.counters["alerts"],
            "alert_hosts": len(self.holds.until),
            "alert_added": h["added"],
            "alert_renewed": h["renewed"],
            "alert_expired": h["expired"],
            "alert_capped": h["capped"],
            "alert_no_room": self.counters["no_room"],
            "alert_malformed": self.follower.counters["malformed"] if self.follower else 0,
            "alert_first_copies": len(waits),
            "alert_first_copy_median_s": round(statistics.median(waits), 4) if waits else None,
            "alert_first_copy_max_s": round(waits[-1], 4) if waits else None,
        }
        return out


class Steered:
    """What a tap that holds hosts offers its users (MirrorBase: beside its watch-list;
    SessionMirror: in one of its sessions). The tap sets `_steer = None` and `_watch_lock`
    (an RLock) and gives Steer what it asks: _refuse_holding(what), apply_held(),
    has_room(addr), no_room_said(addr), watches_alone(addr), first_match_ns(addr) and
    warn(msg)."""

    def watch_for(self, addr, seconds):
        """Hold one host for `seconds` (a later call renews it, to the later end); let go
        when the time is up."""
        self._steering().hold(addr, seconds)

    def follow_alerts(self, path, watch="both", hold=HOLD_DEFAULT, max_hosts=MAX_HOSTS_DEFAULT, from_start=False):
        """Follow a Suricata EVE JSON file as it is written (from its end; rotation and
        truncation followed): each alert holds the hosts it names (watch: src, dst or
        both) for `hold` seconds, renewed by later alerts, at most max_hosts at once.
        In a thread of this process until stop_alerts() or close()."""
        self._refuse_holding("alerts can add nothing")
        steer = self._steering(hold, max_hosts, watch)
        steer.follow(path, from_start)

    def stop_alerts(self):
        """Stop following; the held hosts are let go."""
        if self._steer is not None:
            self._steer.stop()
            with self._watch_lock:
                self._steer.first_copies()  # a copy made since the thread's last round counts
                self._steer.holds.until.clear()
                self.apply_held()

    def alert_counters(self) -> dict:
        """Alerts read, hosts held now, added, renewed, expired, capped, and the waits
        from an alert's line to its host's first copy ({} before any steering). The
        first copies are looked at now, not at the thread's last round: a summary taken
        as the tap stops counts a copy made since."""
        with self._watch_lock:
            if self._steer is None:
                return {}
            self._steer.first_copies()
            return self._steer.counters_now()

    def alert_waits(self) -> list:
        """[(host, seconds)]: each held host's wait from its alert's line being written
        to its first copy, in the order they were seen (a host held again: again)."""
        with self._watch_lock:
            return list(self._steer.waits) if self._steer else []

    def held(self) -> list:
        """The hosts held now, as networks."""
        with self._watch_lock:
            return self._steer.networks() if self._steer else []

    @property
    def watch_lock(self):
        """Held while a hold changes and the program's tables are written; readers take it."""
        return self._watch_lock

    def _steering(self, hold=HOLD_DEFAULT, max_hosts=MAX_HOSTS_DEFAULT, which="both"):
        self._refuse_holding("a held host adds nothing")
        if self._steer is None:
            self._steer = Steer(self, hold, max_hosts, which)
        return self._steer
