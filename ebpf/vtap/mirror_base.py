"""MirrorBase: what both vTAP programs (TcMirror at TC, XdpMirror at XDP) are
told and how they count, so that a watch-list means the same at either hook.

    the watch-list   LPM tries per family (watch_v4, watch_v6), changed live in
                     an order that never unwatches what stays watched
    sampling         1 in N matched frames, decided per frame
    the cutoff       per flow, payload bytes copied in each direction (cutoff.h),
                     in an LRU flow table made only when asked for (cutoff=, flows=)
    the config entry monitor, sampling, flags, the monitor's MTU, the cutoff (vtap.h)
    counters         per interface slot (ifindex & (VTAP_IF_SLOTS - 1)), rows
                     named after the interfaces that share a slot

A subclass declares its C, its counters and how it attaches, and may add config
flags (config_flags()).
"""

import ctypes
import ipaddress
import threading
from collections import defaultdict

from ebpf.abi import defines
from ebpf.errors import BpfError, InputError
from ebpf.program import BpfProgram
from ebpf.vtap.cutoff import FLOW_TIMEOUT_DEFAULT, FLOWS_DEFAULT, FLOWS_MAX, parse_size
from ebpf.vtap.steer import Steered
from ebpf.vtap.watchlist import parse_watch_list, per_family, trie_key

MATCH_MODES = {"src": (1, 0), "dst": (0, 1), "any": (1, 1)}
VTAP = defines("vtap/vtap.h")
VTAP_F_MIRROR_ALL = VTAP["VTAP_F_MIRROR_ALL"]
IF_SLOTS = VTAP["VTAP_IF_SLOTS"]  # per-interface counters, by ifindex & (IF_SLOTS - 1)
SAMPLE_MAX = VTAP["VTAP_SAMPLE_MAX"]
WATCH_MAX_DEFAULT = 1024  # watch-list room per family when the list is shorter


def slot_of(ifindex):
    return ifindex & (IF_SLOTS - 1)


class MirrorBase(Steered, BpfProgram):
    """The watch-list, sampling and config entry of a vTAP program."""

    INLINE = ("watch.h", "cutoff.h")  # the watch-list, its match and the cutoff, the same at both hooks

    ROWS = "interface"

    def __init__(
        self,
        watch=None,
        match="any",
        sample=1,
        watch_max=None,
        source=None,
        cflags=(),
        cutoff=None,
        flows=None,
        flow_timeout=FLOW_TIMEOUT_DEFAULT,
    ):
        # the cutoff: None and no flows, no flow table (a tap without one pays nothing); else
        # a table of `flows` entries, and the cutoff (0: off, set_cutoff() turns it on live)
        self._cutoff = parse_size(cutoff) if cutoff is not None else 0
        if flows is None and cutoff is not None:
            flows = FLOWS_DEFAULT
        if flows is not None and (isinstance(flows, bool) or not isinstance(flows, int) or not 1 <= flows <= FLOWS_MAX):
            raise InputError(f"flows must be a number of flows from 1 to {FLOWS_MAX}, not {flows!r}")
        if isinstance(flow_timeout, bool) or not isinstance(flow_timeout, int | float) or not flow_timeout > 0:
            raise InputError(f"flow_timeout must be a positive number of seconds, not {flow_timeout!r}")
        self.flows = flows
        self.flow_timeout = float(flow_timeout)
        if match not in MATCH_MODES:
            raise InputError(f"unknown match mode {match!r} (src, dst or any)")
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
        table = [f"-DVTAP_FLOWS={flows}"] if flows else []
        super().__init__(
            [f"-DVTAP_MATCH_SRC={src}", f"-DVTAP_MATCH_DST={dst}", f"-DVTAP_WATCH_MAX={watch_max}", *table, *cflags],
            source,
        )
        self.match = match
        self._watch = nets  # what the tries hold
        self._given = nets  # the list given (set_watch); the held hosts go beside it
        self._steer = None  # watch_for(), follow_alerts(): steer.py
        self._watch_lock = threading.RLock()  # set_watch() and the alerts' thread
        self._sample = sample
        self._monitor = None
        self._monitor_ifindex = 0
        self._monitor_mtu = 0
        self._slot_names = defaultdict(list)  # slot -> names of the interfaces tapped since the reset

    def _note_slot(self, ifindex, ifname):
        names = self._slot_names[slot_of(ifindex)]
        if ifname not in names:
            names.append(ifname)

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
        """The monitor's MTU, which the program compares copies with."""
        if mtu != self._monitor_mtu:
            self._monitor_mtu = mtu
            if self.bpf is not None:
                self._write_config()

    @staticmethod
    def _check_sample(n):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= SAMPLE_MAX:
            raise InputError(f"sample rate must be an integer from 1 (every packet) to {SAMPLE_MAX}, not {n!r}")

    def _check_watch_size(self, counts):
        for version, n in counts.items():
            if n > self.watch_max:
                raise InputError(
                    f"the watch-list has {n} IPv{version} entries, more than the {self.watch_max} "
                    f"it has room for (watch_max, vtap --watch-max)"
                )

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
        that moment. The hosts held by watch_for() and alerts stay, beside it."""
        nets = parse_watch_list(cidrs) if cidrs is not None else None
        with self._watch_lock:
            if nets is None and self._steer is not None and self._steer.holds.until:
                raise InputError("cannot mirror everything while hosts are held by alerts: stop_alerts() first")
            self._given = nets
            self._write_watch(self._effective())

    def _effective(self):
        """The list the tries hold: the one given, and the held hosts not in it."""
        if self._given is None:
            return None
        held = [n for n in (self._steer.networks() if self._steer else []) if n not in set(self._given)]
        return [*self._given, *held]

    def _write_watch(self, nets):
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

    def set_cutoff(self, cutoff):
        """Copy each flow until `cutoff` bytes of its L4 payload have been copied in a
        direction, then only its SYN, FIN and RST segments (cutoff.h); 0 turns it off.
        Live: the flow table and what it counted stay (the watch-list's edits leave it too).
        Bytes, or "64K", "1MiB"."""
        n = parse_size(cutoff)
        if not self.flows:
            raise InputError("this tap has no flow table: make it with cutoff= (or flows=) to cut flows")
        self._cutoff = n
        if self.bpf is not None:
            self._write_config()

    @property
    def cutoff(self):
        """Payload bytes per flow and direction (0: no cutoff)."""
        return self._cutoff

    def clear_flows(self):
        """Forget every flow the cutoff counted (a bench's runs each start from zero)."""
        if self.flows and self.bpf is not None:
            self.table("flows").clear()

    def flows_now(self) -> int:
        """Flows the table holds now (0 without a table)."""
        if not self.flows or self.bpf is None:
            return 0
        from ebpf.maps import count_hash  # noqa: PLC0415 -- libbpf through ctypes, only for a table

        t = self.table("flows")
        return count_hash(t.map_fd, ctypes.sizeof(t.Key), ctypes.sizeof(t.Leaf))

    def flow_counters(self, totals) -> dict:
        """What the cutoff's table holds and lost: `flows` now, and `evicted`, the flows
        the full table let go (made, less ended, less those it holds)."""
        now = self.flows_now()
        return {"flows": now, "evicted": max(0, totals["flows_new"] - totals["flows_ended"] - now)}

    # --- hosts held for a while: watch_for(), alerts (steer.py's Steered) -------------
    def _refuse_holding(self, what):
        if self._given is None:
            raise InputError(f"this tap mirrors everything: {what} (give it a watch-list, even [])")

    def apply_held(self):
        with self._watch_lock:
            if self.bpf is not None:
                self._write_watch(self._effective())

    def has_room(self, addr) -> bool:
        nets = self._effective() or []
        return sum(n.version == addr.version for n in nets) < self.watch_max

    def no_room_said(self, addr) -> str:
        return f"no room for {addr} on the watch-list (watch_max {self.watch_max}): not watched"

    def watches_alone(self, addr) -> bool:
        """addr has an entry of its own in the list given (a held entry would be that one)."""
        return ipaddress.ip_network(addr) in set(self._given or [])

    def first_match_ns(self, addr) -> int:
        """When a frame first matched addr's own entry (CLOCK_MONOTONIC ns), 0 if not yet."""
        if self.bpf is None:
            return 0
        net = ipaddress.ip_network(addr)
        trie = self._trie(net)
        try:
            return trie[trie_key(trie, net)].first_ns
        except KeyError:
            return 0

    @property
    def watch(self):
        with self._watch_lock:  # not between a hold taken and its entry written
            return None if self._watch is None else [str(n) for n in self._watch]

    @property
    def sample(self):
        return self._sample

    def _trie(self, net):
        return self.table("watch_v4" if net.version == 4 else "watch_v6")

    def _insert(self, nets):
        held = set(self.held())
        for n in nets:
            trie = self._trie(n)
            v = trie.Leaf()  # not matched yet (watch.h's hit() stamps it)
            if n in held:  # an alert's host: its frames whole, past any cutoff
                v.flags = VTAP["VTAP_W_WHOLE"]
            trie[trie_key(trie, n)] = v

    def _delete(self, nets):
        for n in nets:
            trie = self._trie(n)
            try:
                del trie[trie_key(trie, n)]
            except KeyError:
                pass

    def config_flags(self) -> int:
        """The config entry's flags (vtap.h); a subclass adds its own."""
        return VTAP_F_MIRROR_ALL if self._watch is None else 0

    def _write_config(self):
        table = self.table("config")
        n = self._sample
        value = table.Leaf()
        value.monitor_ifindex = self._monitor_ifindex
        value.sample_rate = n
        value.sample_threshold = (1 << 32) // n if n > 1 else 0xFFFFFFFF
        value.flags = self.config_flags()
        value.monitor_mtu = self._monitor_mtu
        value.cutoff = self._cutoff
        value.flow_idle_ns = int(self.flow_timeout * 1e9)
        table[table.Key(0)] = value

    def maps_created(self):
        """The maps exist from the first compile, whatever caused it (a load, a
        counter read): fill them now, so the program never runs on empty ones.
        After that set_watch()/set_sample()/monitor keep them current."""
        self._insert(self._watch or [])
        self._write_config()

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
        if self.flows:
            d["cutoff"] = (
                f"{self._cutoff} payload bytes per flow and direction, then SYN/FIN/RST only"
                if self._cutoff
                else "off (set_cutoff() turns it on)"
            )
            d["flows"] = f"{self.flows} in an LRU table, idle {self.flow_timeout:g} s"
        if self.netns:
            d["netns"] = self.netns
        return d

    def close(self):
        """Stop following alerts first (its thread writes the tries), then as BpfProgram."""
        if self._steer is not None:
            self._steer.stop()
        super().close()

    def counter_rows(self) -> dict:
        return self.snapshot()[1] or {"total": self.counters()}

    def counters(self) -> dict:
        """Totals over all CPUs and interfaces since load (or the last reset)."""
        return self.snapshot()[0]

    def exits(self, map_name="stats", index=None) -> dict:
        """The program's own tally over every interface it taps (or one counter
        slot): every verdict and reason (BpfProgram.exits), as the kernel
        counted them."""
        slots = list(self._slot_names) if index is None else [index]
        total = {"seen": 0, "verdict": {}, "reason": {}, "dropped": {}}
        for slot in slots:
            e = super().exits(map_name, slot)
            total["seen"] += e["seen"]
            for k in ("verdict", "reason", "dropped"):
                for name, n in e[k].items():
                    total[k][name] = total[k].get(name, 0) + n
        return total
