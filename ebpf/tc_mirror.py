"""TcMirror: the vTAP kernel program (tc_mirror.bpf.c) as a Python object.

    >>> with TcMirror(monitor="mon0", watch=["198.18.0.0/24"], match="any") as tap:  # doctest: +SKIP
    ...     tap.attach("eth0", "ingress")
    ...     tap.set_watch(["2001:2::/48"])      # live: no reload
    ...     tap.counters()
    {'seen': ..., 'matched': ..., 'cloned': ..., ...}

What stays fixed for the life of the object (compiled into the C text): which
address is matched (src, dst or any), the watch-list capacity and who copies the
frame. What can change while attached (written to maps, or for the monitor of
the action path, by swapping the filter in place): the watch-list, the sampling
rate, the monitor.

Who copies (clone=):
  "action"  the program classifies and the filter's tc mirred action copies
            (default: the cheapest copy the kernel has, see tc_mirror.bpf.c)
  "helper"  the program copies with bpf_clone_redirect(), which also un-clones
            the original (a head allocation and copy per frame)

Beside it: what it is told to watch (watchlist.py), which hooks it must not
tap because they carry its copies (mirror_loops.py), what changed around it
while it runs (mirror_health.py), and the mirred action's refused copies
(mirror_ledger.py).
"""

import ctypes
import threading
from collections import defaultdict

from pyroute2.netlink.exceptions import NetlinkError

from . import interrupts, mirror_health, mirror_loops, netdev, tc
from .abi import defines
from .errors import AttachError, BpfError, InputError
from .mirror_ledger import FailureLedger, action_failures
from .program import BpfProgram
from .watchlist import parse_watch_list, per_family, trie_key

MATCH_MODES = {"src": (1, 0), "dst": (0, 1), "any": (1, 1)}
CLONE_MODES = ("action", "helper")
VTAP = defines("vtap.h")
VTAP_F_MIRROR_ALL = VTAP["VTAP_F_MIRROR_ALL"]
IF_SLOTS = VTAP["VTAP_IF_SLOTS"]      # per-interface counters, by ifindex & (IF_SLOTS - 1)
SAMPLE_MAX = VTAP["VTAP_SAMPLE_MAX"]
WATCH_MAX_DEFAULT = 1024  # watch-list room per family when the list is shorter
FILTER_OWNER = "vtap"   # TC filter names start with this; `vtap --cleanup` looks for it
# What counters() says; from the program's: matched = sampled_out + mirrored + clone_failed,
# cloned = mirrored less the mirred action's refusals, failed = those and clone_failed.
COUNTERS = ("seen", "matched", "cloned", "sampled_out", "failed", "not_ip", "malformed", "unmatched",
            "cloned_bytes", "cloned_segs", "oversize", "pass", "mirror")


def slot_of(ifindex):
    return ifindex & (IF_SLOTS - 1)


class TcMirror(BpfProgram):
    """Clone frames whose source/destination is watched to a monitor interface."""

    SOURCE = "tc_mirror.bpf.c"
    FUNCTION = "tc_mirror"
    ROWS = "interface"
    MAIN_COUNTERS = ("seen", "matched", "cloned", "sampled_out", "failed")
    VERDICTS = ("pass", "mirror")
    REASONS = ("not_ip", "malformed", "unmatched", "sampled_out", "mirrored", "clone_failed")

    def __init__(self, monitor, watch=None, match="any", sample=1, netns=None,
                 watch_max=None, clone="action", source=None, cflags=()):
        if match not in MATCH_MODES:
            raise InputError(f"unknown match mode {match!r} (src, dst or any)")
        if clone not in CLONE_MODES:
            raise InputError(f"unknown clone mode {clone!r} (action or helper)")
        self._check_sample(sample)
        nets = parse_watch_list(watch) if watch is not None else None  # None: mirror everything
        counts = per_family(nets or [])
        if watch_max is None:  # room for the list given, and at least the default
            watch_max = max(WATCH_MAX_DEFAULT, *counts.values())
        if not isinstance(watch_max, int) or watch_max < 1:
            raise InputError(f"watch_max must be a positive number of entries, not {watch_max!r}")
        self.watch_max = watch_max
        self._check_watch_size(counts)
        src, dst = MATCH_MODES[match]
        super().__init__([f"-DVTAP_MATCH_SRC={src}", f"-DVTAP_MATCH_DST={dst}",
                          f"-DVTAP_WATCH_MAX={watch_max}",
                          f"-DVTAP_CLONE_BY_ACTION={int(clone == 'action')}", *cflags], source)
        self.netns = netns
        self.match = match
        self.clone = clone
        self._watch = nets
        self._sample = sample
        self._monitor = None
        self._monitor_ifindex = 0
        self._monitor_mtu = 0
        self._snapshot_lock = threading.Lock()
        self._reset_bookkeeping()
        self.monitor = monitor  # resolves the ifindex, so a bad name fails before any compile

    def _reset_bookkeeping(self):
        self._ledger = FailureLedger()        # the mirred action's refusals (action path)
        self._slot_names = defaultdict(list)  # slot -> names of the interfaces tapped since the reset
        for f in self.tc_filters:
            self._note_slot(f)

    def _note_slot(self, f):
        names = self._slot_names[slot_of(f.ifindex)]
        if f.ifname not in names:
            names.append(f.ifname)

    # --- configuration (live) -------------------------------------------------
    @property
    def monitor(self):
        return self._monitor

    @property
    def monitor_ifindex(self):
        return self._monitor_ifindex

    @property
    def monitor_mtu(self):
        return self._monitor_mtu

    @monitor_mtu.setter
    def monitor_mtu(self, mtu):
        """The monitor's MTU, which the program compares copies with (oversize)."""
        if mtu != self._monitor_mtu:
            self._monitor_mtu = mtu
            if self.bpf is not None:
                self._write_config()

    @monitor.setter
    def monitor(self, ifname):
        """Point the copies at another interface. Checked before anything changes,
        and the filters are swapped before the new monitor is recorded: a refused
        monitor, or a swap the kernel refuses, leaves the old one in place."""
        with netdev.ipr(self.netns) as ip:
            ifindex = netdev.ifindex_of(ip, ifname, self.netns)
            path = netdev.copy_path(ip, ifindex)
            mtu = netdev.device(ip, ifindex).mtu
        for f in self.tc_filters:
            why = (f"{ifname} is a tapped interface (its own clones would loop)" if f.ifindex == ifindex else
                   mirror_loops.loops(path, f.ifindex, (f.direction,), ifname))
            if why:
                raise InputError(f"monitor {ifname} refused: {f.ifname} {f.direction}: {why}")
        if self.clone == "action" and self.tc_filters:
            self._retarget_all(ifindex)
        self._monitor, self._monitor_ifindex, self._monitor_mtu = ifname, ifindex, mtu
        if self.bpf is not None:
            self._write_config()

    def _retarget_all(self, ifindex):
        """Swap every filter for one whose mirred action copies to ifindex, all or
        none. A swapped filter brings a new action, counting from 0: the old one's
        failures are kept first."""
        fd = self.load(self.FUNCTION, "SCHED_CLS").fd
        swapped = []
        try:
            for f in self.tc_filters:
                failed, old = action_failures(f), f.mirror_ifindex
                tc.retarget(f, fd, ifindex)
                swapped.append((f, failed, old))
        except AttachError:
            for f, _, old in swapped:
                try:
                    tc.retarget(f, fd, old)
                except AttachError:
                    pass  # it copies to the new monitor; health() and counters still see it
            raise
        finally:
            for f, failed, _ in swapped:
                self._ledger.keep(slot_of(f.ifindex), failed)
                f.failed_base = f.failed_seen = 0

    @staticmethod
    def _check_sample(n):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= SAMPLE_MAX:
            raise InputError(f"sample rate must be an integer from 1 (every packet) to {SAMPLE_MAX}, not {n!r}")

    def _check_watch_size(self, counts):
        for version, n in counts.items():
            if n > self.watch_max:
                raise InputError(f"the watch-list has {n} IPv{version} entries, more than the {self.watch_max} "
                                 f"it has room for (watch_max, vtap --watch-max)")

    def set_sample(self, n: int):
        """Keep 1 in n matched packets (chosen at random per packet)."""
        self._check_sample(n)
        self._sample = n
        if self.bpf is not None:
            self._write_config()

    def set_watch(self, cidrs):
        """Replace the watch-list; None mirrors everything, [] mirrors nothing.
        Ordered so that nothing watched before and after is unwatched for a moment:
        new entries go in before old ones leave, and mirror-all is switched on
        before the entries go (and off only after the new ones are in). When the
        old and the new list together do not fit the trie, the old entries leave
        first: an address covered only by a prefix that changes is unwatched for
        that moment."""
        nets = parse_watch_list(cidrs) if cidrs is not None else None
        self._check_watch_size(per_family(nets or []))
        old = self._watch or []
        if self.bpf is not None:
            keep = set(nets or [])
            leaving = [n for n in old if n not in keep]
            together = per_family(set(old) | keep)
            room = all(n <= self.watch_max for n in together.values())
            try:
                if not room:
                    self._delete(leaving)
                self._insert([n for n in nets or [] if n not in set(old)])
                self._watch = nets
                self._write_config()
                if room:
                    self._delete(leaving)
            except Exception as e:  # BCC raises a bare Exception for a refused map update
                raise BpfError(f"writing the watch-list: {e}") from None
        self._watch = nets

    @property
    def watch(self):
        return None if self._watch is None else [str(n) for n in self._watch]

    @property
    def sample(self):
        return self._sample

    def _trie(self, net):
        return self.table("watch_v4" if net.version == 4 else "watch_v6")

    def _insert(self, nets):
        one = ctypes.c_uint8(1)
        for n in nets:
            trie = self._trie(n)
            trie[trie_key(trie, n)] = one

    def _delete(self, nets):
        for n in nets:
            trie = self._trie(n)
            try:
                del trie[trie_key(trie, n)]
            except KeyError:
                pass

    def _write_config(self):
        table = self.table("config")
        n = self._sample
        value = table.Leaf()
        value.monitor_ifindex = self._monitor_ifindex
        value.sample_rate = n
        value.sample_threshold = (1 << 32) // n if n > 1 else 0xFFFFFFFF
        value.flags = VTAP_F_MIRROR_ALL if self._watch is None else 0
        value.monitor_mtu = self._monitor_mtu
        table[table.Key(0)] = value

    # --- attach / detach --------------------------------------------------------
    def maps_created(self):
        """The maps exist from the first compile, whatever caused it (a load, a
        counter read): fill them now, so the program never runs on empty ones.
        After that set_watch()/set_sample()/monitor keep them current."""
        self._insert(self._watch or [])
        self._write_config()

    def load_program(self):
        """Compile, fill the maps and pass the verifier, before touching any hook."""
        return self.load(self.FUNCTION, "SCHED_CLS")

    def loop_reason(self, ifname, direction="both"):
        """Why tapping ifname would copy the copies (mirror_loops), or None when it is safe."""
        return mirror_loops.loop_reason(self.netns, self._monitor, self._monitor_ifindex, ifname, direction)

    def check_iface(self, ifname, direction="ingress"):
        """Fail now, before anything is attached, if ifname cannot be tapped."""
        if direction not in (*tc.DIRECTIONS, "both"):
            raise InputError(f"unknown direction {direction!r} (ingress, egress or both)")
        if ifname == self._monitor:
            raise InputError(f"monitor {ifname} is also a tapped interface (its own clones would loop)")
        self.refuse_reattach_tc(self.FUNCTION, ifname, tc.DIRECTIONS if direction == "both" else (direction,),
                                self.netns)
        why = self.loop_reason(ifname, direction)
        if why:
            raise InputError(f"cannot tap {ifname} {direction}: {why}")

    def default_interfaces(self, direction="ingress"):
        """What to tap when nobody says (mirror_loops): (names, {skipped name: why})."""
        return mirror_loops.default_interfaces(self.netns, self._monitor, self._monitor_ifindex, direction)

    def attach(self, ifname, direction="ingress"):
        """Tap one interface; direction is ingress, egress or both."""
        self.check_iface(ifname, direction)
        directions = tc.DIRECTIONS if direction == "both" else (direction,)
        self.load_program()
        done = []
        try:
            for d in directions:
                with interrupts.held():  # a filter attached is a filter counted
                    done.append(self.attach_tc(self.FUNCTION, ifname, d, self.netns, FILTER_OWNER,
                                               self._monitor_ifindex if self.clone == "action" else 0))
                    self._note_slot(done[-1])
        except (AttachError, NetlinkError):
            for f in done:
                self.detach_tc(f)
            raise
        for note in self.other_tap_notes({(f.ifindex, f.direction) for f in done}):
            self.warn(note)
        return done

    def attach_many(self, ifnames, direction="ingress"):
        """Tap several interfaces, all or nothing: on any failure, what was
        attached by this call is detached again before the error is raised."""
        for ifname in ifnames:  # every name checked before anything is attached
            self.check_iface(ifname, direction)
        done = []
        try:
            for ifname in ifnames:
                done += self.attach(ifname, direction)
        except Exception:
            for f in done:
                self.detach_tc(f)
            raise
        return done

    def detach_tc(self, f):
        with interrupts.held():
            failed = action_failures(f)  # read while the action is there
            super().detach_tc(f)
            self._ledger.keep(slot_of(f.ifindex), failed)  # only once it is gone: never counted twice

    # --- what a notebook shows ------------------------------------------------------
    def describe(self) -> dict:
        d = super().describe()
        d["monitor"] = self._monitor
        if self._watch is None:
            d["watch"] = "everything"
        else:
            n = per_family(self._watch)
            shown = ", ".join(map(str, self._watch[:4])) + (", ..." if len(self._watch) > 4 else "")
            d["watch"] = f"{n[4]} IPv4 + {n[6]} IPv6 entries ({shown or 'none: mirrors nothing'})"
        d["match"] = self.match
        d["sample"] = f"1 in {self._sample}" if self._sample > 1 else "every matched frame"
        if self.netns:
            d["netns"] = self.netns
        return d

    def counter_rows(self) -> dict:
        return self.snapshot()[1] or {"total": self.counters()}

    # --- what changed outside ------------------------------------------------------
    def health(self) -> mirror_health.Health:
        """Filters of ours that are gone, and the monitor's state (mirror_health)."""
        return mirror_health.health(self)

    def other_tap_notes(self, hooks=None) -> list[str]:
        """One line per other vTAP filter on our hooks (mirror_health)."""
        return mirror_health.other_tap_notes(self, FILTER_OWNER, hooks)

    # --- counters ---------------------------------------------------------------
    def counters(self) -> dict:
        """Totals over all CPUs and interfaces since load (or the last reset)."""
        return self.snapshot()[0]

    def snapshot(self):
        """(totals, {interface: counters}) read together; interfaces whose index
        falls in the same counter slot share a row named "a+b". On the action
        path the mirred action's refusals are moved from cloned to failed
        (mirror_ledger)."""
        with self._snapshot_lock:  # a sampler's thread and the caller may read at once
            return self._snapshot()

    def _snapshot(self):
        if self.clone == "action":
            failed = self._ledger.failed(self.tc_filters, slot_of)
        rows = {}
        for slot, names in self._slot_names.items():
            c = self.percpu_totals("stats", slot)
            c["matched"] = c["sampled_out"] + c["mirrored"] + c["clone_failed"]
            c["cloned"], c["failed"] = c.pop("mirrored"), c.pop("clone_failed")
            if self.clone == "action":
                self._ledger.move(slot, c, failed[slot])
            rows["+".join(names)] = {k: c[k] for k in COUNTERS}
        totals = {k: sum(r[k] for r in rows.values()) for k in COUNTERS}
        return totals, rows

    def exits(self, map_name="stats", index=None) -> dict:
        """The program's own tally over every interface it taps (or one counter
        slot): every verdict and reason (BpfProgram.exits), as the kernel
        counted them, before the mirred action's refusals are moved."""
        slots = list(self._slot_names) if index is None else [index]
        total = {"seen": 0, "verdict": {}, "reason": {}, "dropped": {}}
        for slot in slots:
            e = super().exits(map_name, slot)
            total["seen"] += e["seen"]
            for k in ("verdict", "reason", "dropped"):
                for name, n in e[k].items():
                    total[k][name] = total[k].get(name, 0) + n
        return total

    def reset_counters(self):
        if self.bpf is not None:  # before the first compile, the maps are zero anyway
            for slot in self._slot_names:
                self.zero_percpu("stats", slot)
        for f in self.tc_filters:
            f.failed_base = tc.action_stats(f)["failed"] if f.mirror_ifindex else 0
            f.failed_seen = 0
        self._reset_bookkeeping()
