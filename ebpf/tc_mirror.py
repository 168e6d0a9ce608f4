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

Nothing is tapped whose hooks carry the copies themselves (netdev.copy_path):
the monitor, its veth peer, a tunnel monitor's underlay, a bridge monitor's ports.
"""

import ctypes
import os
import threading
import ipaddress
from collections import defaultdict
from dataclasses import dataclass

from pyroute2.netlink.exceptions import NetlinkError

from .abi import VTAP
from .errors import AttachError, BpfError, InputError
from .program import BpfProgram
from . import interrupts, netdev, tc

MATCH_MODES = {"src": (1, 0), "dst": (0, 1), "any": (1, 1)}
CLONE_MODES = ("action", "helper")
VTAP_F_MIRROR_ALL = VTAP["VTAP_F_MIRROR_ALL"]
IF_SLOTS = VTAP["VTAP_IF_SLOTS"]      # per-interface counters, by ifindex & (IF_SLOTS - 1)
SAMPLE_MAX = VTAP["VTAP_SAMPLE_MAX"]
WATCH_MAX_DEFAULT = 1024  # watch-list room per family when the list is shorter
FILTER_OWNER = "vtap"   # TC filter names start with this; `vtap --cleanup` looks for it
COUNTERS = ("seen", "matched", "cloned", "sampled_out", "failed", "non_ip", "malformed", "cloned_bytes",
            "cloned_segs", "oversize")


def parse_watch_list(cidrs, where=None):
    """CIDR strings -> ip_network objects, duplicates dropped; a clear error for
    the first bad one (`where(i)` names entry i, e.g. a file and line).

    >>> parse_watch_list(["198.18.0.0/24", "2001:2::1", "198.18.0.0/24"])
    [IPv4Network('198.18.0.0/24'), IPv6Network('2001:2::1/128')]
    """
    nets = {}
    for i, text in enumerate(cidrs):
        if isinstance(text, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
            nets.setdefault(text, None)  # parsed already (read_watch_file)
            continue
        at = f"{where(i)}: " if where else ""
        try:
            net = ipaddress.ip_network(text.strip(), strict=True)
        except ValueError as e:
            if "has host bits set" in str(e):
                fixed = ipaddress.ip_network(text.strip(), strict=False)
                raise InputError(f"{at}bad CIDR {text!r}: host bits set (did you mean {fixed}?)") from None
            raise InputError(f"{at}bad CIDR {text!r}: not an IPv4 or IPv6 address or network") from None
        nets.setdefault(net, None)
    return list(nets)


def read_watch_file(path):
    """A watch-list file: one CIDR per line; `#` starts a comment; blank lines are
    skipped. "-" reads standard input."""
    import sys
    try:
        f = sys.stdin if path == "-" else open(path)
    except OSError as e:
        raise InputError(f"cannot read watch-list file {path}: {e.strerror}") from None
    with f:
        entries, lines = [], []
        for n, line in enumerate(f, 1):
            text = line.split("#", 1)[0].strip()
            if text:
                entries.append(text)
                lines.append(n)
    name = "standard input" if path == "-" else path
    return parse_watch_list(entries, where=lambda i: f"{name} line {lines[i]}")


def per_family(nets):
    return {v: sum(n.version == v for n in nets) for v in (4, 6)}


def slot_of(ifindex):
    return ifindex & (IF_SLOTS - 1)


@dataclass
class Health:
    """What changed outside the vTAP since it attached (TcMirror.health())."""
    missing: list          # [(TcFilter, why)] of our filters that are gone
    monitor_state: str     # "up", "down", "no-carrier" (mirred refuses copies to it too), "gone",
                           # or "renewed" (deleted and made again, and now followed)
    monitor_mtu: int
    note: str = ""         # why a monitor made again is not followed


class TcMirror(BpfProgram):
    """Clone frames whose source/destination is watched to a monitor interface."""

    SOURCE = "tc_mirror.bpf.c"
    FUNCTION = "tc_mirror"
    ROWS = "interface"
    MAIN_COUNTERS = ("seen", "matched", "cloned", "sampled_out", "failed")

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
        self._kept_failed = defaultdict(int)  # slot -> mirred failures of filters detached since the reset
        self._ledger = {}                     # slot -> what the failures took from cloned_bytes/_segs
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
                   self._loops(f.ifindex, (f.direction,), path, ifname))
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
                failed, old = self._action_failures(f), f.mirror_ifindex
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
                self._kept_failed[slot_of(f.ifindex)] += failed
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
        tries = {4: self.table("watch_v4"), 6: self.table("watch_v6")}
        one = ctypes.c_uint8(1)
        for n in nets:
            tries[n.version][self._key(n, tries[n.version])] = one

    def _delete(self, nets):
        for n in nets:
            try:
                del self._trie(n)[self._key(n)]
            except KeyError:
                pass

    def _key(self, net, table=None):
        table = self._trie(net) if table is None else table
        key = table.Key()
        key.prefixlen = net.prefixlen
        packed = net.network_address.packed
        if net.version == 4:
            key.addr = ctypes.c_uint32.from_buffer_copy(packed).value  # keep network byte order
        else:
            key.addr = (ctypes.c_uint8 * 16)(*packed)
        return key

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

    def _loops(self, ifindex, directions, path, monitor):
        """Why tapping ifindex in these directions would copy our own copies, or None."""
        for d in directions:
            why = path.get((ifindex, d))
            if why:
                return f"{'it' if why == 'the monitor itself' else 'its ' + d} carries the copies to monitor " \
                       f"{monitor} ({why}): they would be copied again"
        return None

    def loop_reason(self, ifname, direction="both"):
        """Why tapping ifname would copy the copies (its hook is on their way out
        of the monitor, see netdev.copy_path), or None when it is safe. The
        monitor itself is refused in any direction."""
        directions = tc.DIRECTIONS if direction == "both" else (direction,)
        with netdev.ipr(self.netns) as ip:
            ifindex = netdev.ifindex_of(ip, ifname, self.netns)
            path = netdev.copy_path(ip, self._monitor_ifindex)
        if ifindex == self._monitor_ifindex:
            return f"it is the monitor {self._monitor}: its own copies would loop"
        return self._loops(ifindex, directions, path, self._monitor)

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
        """What to tap when nobody says: every UP interface of the namespace but
        lo and those whose hooks carry the copies. Returns (names, {skipped name: why})."""
        directions = tc.DIRECTIONS if direction == "both" else (direction,)
        with netdev.ipr(self.netns) as ip:
            path = netdev.copy_path(ip, self._monitor_ifindex)
            devs = netdev.devices(ip)
        chosen, skipped = [], {}
        for dev in sorted(devs.values(), key=lambda d: d.name):
            if not dev.up or dev.name == "lo" or dev.index == self._monitor_ifindex:
                continue
            why = self._loops(dev.index, directions, path, self._monitor)
            if why:
                skipped[dev.name] = why
            else:
                chosen.append(dev.name)
        return chosen, skipped

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
            failed = self._action_failures(f)  # read while the action is there
            super().detach_tc(f)
            self._kept_failed[slot_of(f.ifindex)] += failed  # only once it is gone: never counted twice

    def _action_failures(self, f):
        """Copies the filter's mirred action refused since the last reset. A filter
        that is gone (removed from outside) keeps the count it had when last read."""
        if not f.mirror_ifindex:
            return 0
        entry = tc.find(f)
        if entry is not None:
            f.failed_seen = max(0, (tc.first_action_stats(entry.msg) or tc.NO_ACTION_STATS)["failed"]
                                - f.failed_base)
        return f.failed_seen

    def other_taps(self):
        """vTAP filters of other instances on the hooks we tapped, live or left by
        a killed one: each copies what it matches once more (tc.Found; .live, .pids,
        .entry.mirror_ifindex)."""
        ours = {f.prog_id for f in self.tc_filters}
        hooks = {(f.ifindex, f.direction) for f in self.tc_filters}
        found = []
        for ifindex in sorted({i for i, _ in hooks}):
            found += [o for o in tc.filters_of(FILTER_OWNER, self.netns, ifindex)
                      if (o.ifindex, o.direction) in hooks and o.entry.prog_id not in ours]
        return found

    def monitor_name(self, ifindex):
        """The name of interface `ifindex` in our namespace (None for 0)."""
        if not ifindex:
            return None
        with netdev.ipr(self.netns) as ip:
            dev = netdev.device(ip, ifindex)
        return dev.name if dev else f"ifindex {ifindex}"

    def other_tap_notes(self, hooks=None) -> list[str]:
        """One line per other vTAP filter on our hooks (or on `hooks`, a set of
        (ifindex, direction)): who runs it, and what it does to the copies."""
        notes = []
        for o in self.other_taps():
            if hooks is not None and (o.ifindex, o.direction) not in hooks:
                continue
            who = (f"vtap pid {', '.join(map(str, o.pids))} runs it" if o.live else
                   "left by a killed vtap: `vtap --cleanup` removes it")
            if os.getpid() in o.pids:
                who = "another TcMirror of this process runs it: close() that one"
            mon = self.monitor_name(o.entry.mirror_ifindex)
            to = (f"to the same monitor {mon}: frames both match arrive there twice" if mon == self.monitor else
                  f"to {mon}: frames both match are copied twice" if mon else
                  "(with --clone helper): frames both match are copied twice")
            notes.append(f"{o.where} already has another vTAP filter ({who}) copying {to}")
        return notes

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
        return self.counters_by_interface() or {"total": self.counters()}

    # --- what changed outside ------------------------------------------------------
    def health(self) -> Health:
        """Filters of ours that are gone, and the monitor's state. Keeps the
        program's copy of the monitor's MTU current, and follows a monitor that was
        deleted and made again under the same name (state "renewed")."""
        with netdev.ipr(self.netns) as ip:
            devs = netdev.devices(ip)
        missing = []
        for f in self.tc_filters:
            if tc.find(f) is None:
                why = (f"{f.ifname} was deleted" if f.ifindex not in devs else
                       "its filter was removed from outside (vtap --cleanup --all, tc filter del)")
                missing.append((f, why))
        mon = devs.get(self._monitor_ifindex)
        if mon is None:
            if missing or not any(d.name == self._monitor for d in devs.values()):
                return Health(missing, "gone", self._monitor_mtu)
            try:
                self.monitor = self._monitor  # the new device of that name: retarget to it
            except (InputError, AttachError) as e:
                return Health(missing, "gone", self._monitor_mtu, note=f"the new {self._monitor} is refused: {e}")
            return Health(missing, "renewed", self._monitor_mtu)
        if mon.mtu != self._monitor_mtu:
            self._monitor_mtu = mon.mtu
            self._write_config()
        state = "down" if not mon.up else "no-carrier" if not mon.carrier else "up"
        return Health(missing, state, mon.mtu)

    # --- counters ---------------------------------------------------------------
    def counters(self) -> dict:
        """Totals over all CPUs and interfaces since load (or the last reset)."""
        return self.snapshot()[0]

    def counters_by_interface(self) -> dict:
        """{interface name: counters}; interfaces whose index falls in the same
        counter slot share a row named "a+b"."""
        return self.snapshot()[1]

    def snapshot(self):
        """(totals, {interface: counters}) read together.

        On the action path the program counts what it hands to mirred as cloned,
        and each filter's mirred action counts its refusals; those are moved from
        cloned to failed here. Their bytes and wire packets leave cloned_bytes and
        cloned_segs too: exactly when every copy handed over between two reads
        failed (or none did), and at that interval's mean size when only some did."""
        with self._snapshot_lock:  # a sampler's thread and the caller may read at once
            return self._snapshot()

    def _snapshot(self):
        failed = defaultdict(int, self._kept_failed)
        if self.clone == "action":  # read before the program's counters: a failure never runs ahead of its copy
            for f in self.tc_filters:
                failed[slot_of(f.ifindex)] += self._action_failures(f)
        rows = {}
        for slot, names in self._slot_names.items():
            c = self.percpu_totals("stats", slot)
            if self.clone == "action":
                self._move_failures(slot, c, failed[slot])
            rows["+".join(names)] = c
        totals = {k: sum(r[k] for r in rows.values()) for k in COUNTERS}
        return totals, rows

    def _move_failures(self, slot, c, failed):
        led = self._ledger.setdefault(slot, {"handed": 0, "bytes": 0, "segs": 0, "failed": 0,
                                             "failed_bytes": 0, "failed_segs": 0})
        new_failed, handed = failed - led["failed"], c["cloned"] - led["handed"]
        if new_failed > 0 and c["cloned"]:
            if handed > 0:  # the failures came from this interval's copies
                share = min(new_failed, handed) / handed
                led["failed_bytes"] += round((c["cloned_bytes"] - led["bytes"]) * share)
                led["failed_segs"] += round((c["cloned_segs"] - led["segs"]) * share)
            else:           # copies handed before the last read: at the mean size so far
                led["failed_bytes"] += round(c["cloned_bytes"] / c["cloned"] * new_failed)
                led["failed_segs"] += round(c["cloned_segs"] / c["cloned"] * new_failed)
        led.update(handed=c["cloned"], bytes=c["cloned_bytes"], segs=c["cloned_segs"], failed=failed)
        c["cloned"] -= failed
        c["failed"] += failed
        c["cloned_bytes"] = max(0, c["cloned_bytes"] - led["failed_bytes"])
        c["cloned_segs"] = max(0, c["cloned_segs"] - led["failed_segs"])

    def reset_counters(self):
        if self.bpf is not None:  # before the first compile, the maps are zero anyway
            for slot in self._slot_names:
                self.zero_percpu("stats", slot)
        for f in self.tc_filters:
            f.failed_base = tc.action_stats(f)["failed"] if f.mirror_ifindex else 0
            f.failed_seen = 0
        self._reset_bookkeeping()
