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

import threading
from collections import defaultdict

from pyroute2.netlink.exceptions import NetlinkError

from ebpf import interrupts, netdev, tc
from ebpf.errors import AttachError, InputError
from ebpf.vtap import mirror_health, mirror_loops
from ebpf.vtap.cutoff import CUT_COUNTERS, FLOW_TIMEOUT_DEFAULT
from ebpf.vtap.mirror_base import MirrorBase, slot_of
from ebpf.vtap.mirror_ledger import FailureLedger, action_failures

CLONE_MODES = ("action", "helper")
FILTER_OWNER = "vtap"  # TC filter names start with this; `vtap --cleanup` looks for it
# What counters() says; from the program's: matched = sampled_out + mirrored + clone_failed + cut,
# cloned = mirrored less the mirred action's refusals, failed = those and clone_failed.
COUNTERS = (
    "seen",
    "matched",
    "cloned",
    "sampled_out",
    "failed",
    "not_ip",
    "malformed",
    "unmatched",
    "cloned_bytes",
    "cloned_segs",
    "oversize",
    "pass",
    "mirror",
)


class TcMirror(MirrorBase):
    """Clone frames whose source/destination is watched to a monitor interface."""

    SOURCE = "tc_mirror.bpf.c"
    FUNCTION = "tc_mirror"
    MAIN_COUNTERS = ("seen", "matched", "cloned", "sampled_out", "failed")
    VERDICTS = ("pass", "mirror")
    REASONS = ("not_ip", "malformed", "unmatched", "sampled_out", "mirrored", "clone_failed", "cut")

    def __init__(
        self,
        monitor,
        watch=None,
        match="any",
        sample=1,
        netns=None,
        watch_max=None,
        clone="action",
        source=None,
        cflags=(),
        cutoff=None,
        flows=None,
        flow_timeout=FLOW_TIMEOUT_DEFAULT,
    ):
        if clone not in CLONE_MODES:
            raise InputError(f"unknown clone mode {clone!r} (action or helper)")
        super().__init__(
            watch,
            match,
            sample,
            watch_max,
            source,
            [f"-DVTAP_CLONE_BY_ACTION={int(clone == 'action')}", *cflags],
            cutoff,
            flows,
            flow_timeout,
        )
        self.netns = netns
        self.clone = clone
        self._snapshot_lock = threading.Lock()
        self._reset_bookkeeping()
        self.monitor = monitor  # resolves the ifindex, so a bad name fails before any compile

    def _reset_bookkeeping(self):
        self._ledger = FailureLedger()  # the mirred action's refusals (action path)
        self._slot_names = defaultdict(list)  # slot -> names of the interfaces tapped since the reset
        for f in self.tc_filters:
            self._note_slot(f.ifindex, f.ifname)

    # --- configuration (live) -------------------------------------------------
    @MirrorBase.monitor.setter
    def monitor(self, ifname):
        """Point the copies at another interface. Checked before anything changes,
        and the filters are swapped before the new monitor is recorded: a refused
        monitor, or a swap the kernel refuses, leaves the old one in place."""
        with netdev.ipr(self.netns) as ip:
            ifindex = netdev.ifindex_of(ip, ifname, self.netns)
            path = netdev.copy_path(ip, ifindex)
            mtu = netdev.device(ip, ifindex).mtu
        for f in self.tc_filters:
            why = (
                f"{ifname} is a tapped interface (its own clones would loop)"
                if f.ifindex == ifindex
                else mirror_loops.loops(path, f.ifindex, (f.direction,), ifname)
            )
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

    # --- attach / detach --------------------------------------------------------
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
        self.refuse_reattach_tc(
            self.FUNCTION, ifname, tc.DIRECTIONS if direction == "both" else (direction,), self.netns
        )
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
                    done.append(
                        self.attach_tc(
                            self.FUNCTION,
                            ifname,
                            d,
                            self.netns,
                            FILTER_OWNER,
                            self._monitor_ifindex if self.clone == "action" else 0,
                        )
                    )
                    self._note_slot(done[-1].ifindex, done[-1].ifname)
        except (AttachError, NetlinkError):
            for f in done:
                self.detach_tc(f)
            raise
        for note in self.other_tap_notes({(f.ifindex, f.direction) for f in done}):
            self.warn(note)
        return done

    def detach_tc(self, f):
        with interrupts.held():
            failed = action_failures(f)  # read while the action is there
            super().detach_tc(f)
            self._ledger.keep(slot_of(f.ifindex), failed)  # only once it is gone: never counted twice

    # --- what changed outside ------------------------------------------------------
    def health(self) -> mirror_health.Health:
        """Filters of ours that are gone, and the monitor's state (mirror_health)."""
        return mirror_health.health(self)

    def other_tap_notes(self, hooks=None) -> list[str]:
        """One line per other vTAP filter on our hooks (mirror_health)."""
        return mirror_health.other_tap_notes(self, FILTER_OWNER, hooks)

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
            c["matched"] = c["sampled_out"] + c["mirrored"] + c["clone_failed"] + c["cut"]
            c["cloned"], c["failed"] = c.pop("mirrored"), c.pop("clone_failed")
            if self.clone == "action":
                self._ledger.move(slot, c, failed[slot])
            rows["+".join(names)] = {k: c[k] for k in self.counter_names()}
        totals = {k: sum(r[k] for r in rows.values()) for k in self.counter_names()}
        if self.flows:
            totals.update(self.flow_counters(totals))  # the table's: one for every interface
        return totals, rows

    def counter_names(self):
        """counters()' names: the cutoff's too when the tap has a flow table."""
        return COUNTERS + CUT_COUNTERS if self.flows else COUNTERS

    def reset_counters(self):
        if self.bpf is not None:  # before the first compile, the maps are zero anyway
            for slot in self._slot_names:
                self.zero_percpu("stats", slot)
        for f in self.tc_filters:
            f.failed_base = tc.action_stats(f)["failed"] if f.mirror_ifindex else 0
            f.failed_seen = 0
        self._reset_bookkeeping()
