"""SessionMirror: vTAP sessions (tc_sessions.bpf.c) as a Python object.

    >>> from ebpf.vtap.sessions.config import Session, Rule
    >>> s = Session(target="vxlan://198.18.9.2/100", truncate=128,
    ...             rules=[Rule("accept", protocol="tcp", destination_ports="80")])
    >>> with SessionMirror([s], netns="dut") as tap:          # doctest: +SKIP
    ...     tap.attach("eth0", "both")
    ...     tap.set_sessions(load_sessions("sessions.toml"))  # live: no reload
    ...     tap.counters(), tap.session_counters(), tap.rule_counters()

Each session is a target (an interface, or a tunnel to a collector:
ebpf/vtap/sessions/encap.py), its ordered rules (first match decides, per session), a
truncation length and a sampling rate (ebpf/vtap/sessions/config.py). A frame may go to
several sessions, one copy each; two sessions with the same target send it
once, by the earlier session (its number is lower), the later one counts it
`shadowed`: a collector does not get the same frame twice from one tap.

The copies go through a sender device the object creates in the namespace (an
ifb named vtaps<pid>x<n>, removed on close(), and by `vtap --cleanup` when its
process is gone). Rules and sessions change live: both generations of the
tables (sessions.h) let a change land whole, between two frames.
"""

import ctypes
import dataclasses
import ipaddress
import itertools
import os
import threading
import time
from pathlib import Path

from pyroute2.netlink.exceptions import NetlinkError

from ebpf import interrupts, netdev, tc
from ebpf.abi import defines
from ebpf.errors import AttachError, BpfError, InputError
from ebpf.program import BpfProgram
from ebpf.vtap import mirror_loops
from ebpf.vtap.cutoff import FLOW_TIMEOUT_DEFAULT, FLOWS_DEFAULT, FLOWS_MAX
from ebpf.vtap.sessions import encap
from ebpf.vtap.sessions.config import KINDS, Rule, ordered
from ebpf.vtap.sessions.tables import field_bits, write_array, write_array_u64, write_tries
from ebpf.vtap.steer import Steered

SESSIONS_H = defines("vtap/sessions/sessions.h")
SESS_MAX = SESSIONS_H["SESS_MAX"]
RULES_MAX = SESSIONS_H["SESS_RULES_MAX"]
IF_SLOTS = SESSIONS_H["SESS_IF_SLOTS"]
PORT_SLOTS = SESSIONS_H["SESS_PORT_SLOTS"]
F_OUTER_V6, F_FIT = SESSIONS_H["SESS_F_OUTER_V6"], SESSIONS_H["SESS_F_FIT"]
FILTER_OWNER = "vtap"
SENDER_PREFIX = "vtaps"
CUT_SESSION_COUNTERS = ("cut", "cut_bytes")  # a session's, beside the table's (CUT_TABLE)
CUT_TABLE = ("flows_new", "flows_ended", "flows_restarted", "uncut_fragment", "uncut_no_ports", "uncut_malformed")
SESSION_COUNTERS = (
    "accepted",
    "rejected",
    "sampled_out",
    "shadowed",
    "handed",
    "sent",
    "sent_bytes",
    "frame_bytes",
    "truncated",
    "oversize",
    "failed",
    *CUT_SESSION_COUNTERS,
)
COUNTERS = ("seen", "mirrored", "unmatched", "not_ip", "malformed", "not_taken", "own_copies", "pass", "mirror")
_serial = itertools.count(1)


def sender_name(pid=None, n=None):
    return f"{SENDER_PREFIX}{pid or os.getpid()}x{n if n is not None else next(_serial)}"


def sender_pid(name):
    """The pid in a sender device's name, or None when it is not one."""
    if not name.startswith(SENDER_PREFIX) or "x" not in name[len(SENDER_PREFIX) :]:
        return None
    pid = name[len(SENDER_PREFIX) :].split("x", 1)[0]
    return int(pid) if pid.isdigit() else None


class SessionMirror(Steered, BpfProgram):
    """Copy what each session's rules accept to its target."""

    SOURCE = "tc_sessions.bpf.c"
    ROWS = "session"
    MAIN_COUNTERS = ("seen", "mirrored", "unmatched")
    VERDICTS = ("pass", "mirror")
    REASONS = ("not_ip", "malformed", "unmatched", "sampled_out", "mirrored")

    INLINE = ("../cutoff.h",)  # the vTAP's per-flow cutoff, beside it (its map calls are BCC's)

    def __init__(self, sessions, netns=None, source=None, cflags=(), flows=None, flow_timeout=FLOW_TIMEOUT_DEFAULT):
        sessions = ordered(sessions)
        # the flow table: made when a session has a cutoff, or room asked for (flows=) so
        # that a later set_sessions() may give one a cutoff; a tap without one pays nothing
        if flows is None and any(s.cutoff for s in sessions):
            flows = FLOWS_DEFAULT
        if flows is not None and (isinstance(flows, bool) or not isinstance(flows, int) or not 1 <= flows <= FLOWS_MAX):
            raise InputError(f"flows must be a number of flows from 1 to {FLOWS_MAX}, not {flows!r}")
        if isinstance(flow_timeout, bool) or not isinstance(flow_timeout, int | float) or not flow_timeout > 0:
            raise InputError(f"flow_timeout must be a positive number of seconds, not {flow_timeout!r}")
        self.flows, self.flow_timeout = flows, float(flow_timeout)
        vtap_dir = f"-I{Path(__file__).resolve().parents[1]}"  # vtap.h (struct cut_counts), cutoff.h
        table = [f"-DVTAP_FLOWS={flows}"] if flows else []
        super().__init__([vtap_dir, *table, *cflags], source)
        self.netns = netns
        self._sessions = sessions
        self._cut = [0, 0]  # per generation: the largest cutoff of its sessions
        self._gen = 0
        self._bases = {}  # (session number, counter) -> folded counts of retired generations
        self._rule_bases = {}  # (session number, rule position) -> folded hits
        self._gen_sessions = [[], []]  # which sessions each generation's slots hold
        self._lock = threading.Lock()
        self._sender = None  # (name, ifindex) of the sender device once made
        self._slot_names = {}
        self._resolved = self._resolve(self._sessions)  # a bad target fails before anything is made
        # hosts held in one session (watch_for(), follow_alerts(): steer.py): two whole rules
        # each, first in that session, so all of the host's frames go there, past its cutoff
        self._steer = None
        self._watch_lock = threading.RLock()
        self._alert_session = None  # its name or number, as given
        self._held_since = {}  # network -> time.monotonic_ns() its hold began
        self._stamps = {}  # network -> first-frame stamps of retired generations (ns)
        self._said_gone = False

    # --- targets --------------------------------------------------------------------
    def _resolve(self, sessions):
        """Per session: (ifindex, mtu, flags, header) from the namespace's links and routes."""
        out = []
        with netdev.ipr(self.netns) as ip:
            for s in sessions:
                t = s.target
                flags = F_FIT if s.fit else 0
                if t.kind == "local":
                    ifindex = netdev.ifindex_of(ip, t.ifname, self.netns)
                    dev = netdev.device(ip, ifindex)
                    if not dev.up:
                        raise InputError(f"{s.label}: target {t.ifname} is down (ip link set {t.ifname} up)")
                    out.append((ifindex, dev.mtu, flags, b"", t.ifname))
                else:
                    p = encap.path(self.netns, t.address)
                    if t.address.version == 6:
                        flags |= F_OUTER_V6
                    out.append((p.ifindex, p.mtu, flags, encap.header(t, p.source), p.ifname))
        return out

    def _shadows(self, sessions):
        """For each session, the later ones with the same target, as a slot mask."""
        masks = []
        for i, s in enumerate(sessions):
            masks.append(sum(1 << j for j in range(i + 1, len(sessions)) if str(sessions[j].target) == str(s.target)))
        return masks

    # --- the maps -------------------------------------------------------------------
    def maps_created(self):
        with self._watch_lock:  # a host held before the load goes in with it
            self._write_generation(0, self._effective(self._sessions), self._resolved)
        self._write_config()

    def _write_config(self):
        t = self.table("config")
        v = t.Leaf()
        v.gen = self._gen
        v.sender_ifindex = self._sender[1] if self._sender else 0
        for gen, most in enumerate(self._cut):
            v.cut_max[gen] = most
        v.flow_idle_ns = int(self.flow_timeout * 1e9)
        t[t.Key(0)] = v

    def _write_generation(self, gen, sessions, resolved):
        """Everything generation gen classifies and sends with; gen is not live."""
        bits = field_bits(sessions)
        t = self.table
        write_array(t("dir_bits"), gen * 2, bits["direction"])
        write_array(t("proto_bits"), gen * 256, bits["proto"])
        write_array(t("sport_bits"), gen * PORT_SLOTS, bits["sport"])
        write_array(t("dport_bits"), gen * PORT_SLOTS, bits["dport"])
        write_tries(t, gen, bits["tries"])
        rules = t("rules")
        for i in range(RULES_MAX):
            v = rules.Leaf()
            if i < len(bits["rules"]):
                slot, r = bits["rules"][i]
                v.session, v.accept, v.whole = slot, int(r.action == "accept"), int(r.whole)
            rules[rules.Key(gen * RULES_MAX + i)] = v
        table = t("sessions")
        shadows = self._shadows(sessions)
        first = 0
        for slot in range(SESS_MAX):
            v = table.Leaf()
            if slot < len(sessions):
                s = sessions[slot]
                ifindex, mtu, flags, hdr, _ = resolved[slot]
                n = len(s.rules)
                mine = ((1 << n) - 1) << first
                for w in range(len(v.rules.w)):
                    v.rules.w[w] = (mine >> (64 * w)) & 0xFFFFFFFFFFFFFFFF
                first += n
                v.shadow = shadows[slot]
                v.sample_rate = s.sample
                v.sample_threshold = (1 << 32) // s.sample if s.sample > 1 else 0xFFFFFFFF
                v.truncate = s.truncate
                v.cutoff = s.cutoff
                v.ifindex, v.mtu, v.flags = ifindex, mtu, flags
                v.kind = KINDS[s.target.kind]
                v.hdr_len = len(hdr)
                for i, byte in enumerate(hdr):
                    v.hdr[i] = byte
            table[table.Key(gen * SESS_MAX + slot)] = v
        self._gen_sessions[gen] = list(sessions)
        self._cut[gen] = max((s.cutoff for s in sessions), default=0)
        # no stamp of this generation's past rules is left for its new ones (_fold kept them)
        write_array_u64(t("rule_first"), gen * RULES_MAX, [0] * RULES_MAX)
        if self.flows:  # the rules of the sessions with a cutoff: a frame that matches one is counted
            bits, first = 0, 0
            for s in sessions:
                if s.cutoff:
                    bits |= ((1 << len(s.rules)) - 1) << first
                first += len(s.rules)
            cut = t("cut_bits")
            v = cut.Leaf()
            for w in range(len(v.w)):
                v.w[w] = (bits >> (64 * w)) & 0xFFFFFFFFFFFFFFFF
            cut[cut.Key(gen)] = v

    def _fold(self, gen):
        """Add generation gen's counters to the bases and zero them (before reuse); keep
        its held hosts' first-frame stamps."""
        for slot, s in enumerate(self._gen_sessions[gen]):
            c = self.percpu_totals("sess_stats", gen * SESS_MAX + slot)
            for k in SESSION_COUNTERS:
                self._bases[(s.number, k)] = self._bases.get((s.number, k), 0) + c[k]
            self.zero_percpu("sess_stats", gen * SESS_MAX + slot)
        hits, first = self.table("rule_hits"), self.table("rule_first")
        for bit, (s, r, i) in enumerate(self._rule_keys(gen)):
            k = hits.Key(gen * RULES_MAX + bit)
            if r.whole:  # a held host's: its stamp, not the file's rule counts
                stamp = first[first.Key(gen * RULES_MAX + bit)].value
                net = r.src or r.dst
                if stamp and net in self._held_since:  # a host let go: its stamps go with it
                    self._stamps.setdefault(net, []).append(stamp)
            else:
                n = sum(hits[k])
                self._rule_bases[(s.number, i)] = self._rule_bases.get((s.number, i), 0) + n
            hits[k] = hits.Leaf(*([0] * len(hits[k])))

    def _rule_keys(self, gen):
        """Generation gen's rules in bit order: (session, rule, position among the file's
        rules of that session, None for a held host's)."""
        out = []
        for s in self._gen_sessions[gen]:
            pos = itertools.count()
            out += [(s, r, None if r.whole else next(pos)) for r in s.rules]
        return out

    def set_sessions(self, sessions):
        """Replace every session, live: checked and resolved first, written to the
        generation not in use, then switched to in one write. Counters of a
        session carry on under its number."""
        sessions = ordered(sessions)
        if not self.flows and any(s.cutoff for s in sessions):
            cut = next(s for s in sessions if s.cutoff)
            raise InputError(
                f"{cut.label}: a cutoff needs the flow table, which this tap was made without "
                "(make it with flows=, vtap --flows N, or a cutoff in the sessions it starts with)"
            )
        resolved = self._resolve(sessions)
        with self._watch_lock:  # the held hosts go into the new sessions as they are now
            if self.bpf is not None:
                self._write(sessions, resolved)
            self._sessions, self._resolved = sessions, resolved

    def _write(self, sessions, resolved):
        """Write the sessions, with the held hosts, to the generation not in use, then switch."""
        effective = self._effective(sessions)
        n = sum(len(s.rules) for s in effective)
        if n > RULES_MAX:  # a file that fits alone, not with the hosts held now
            held = len(self.held())
            raise InputError(f"{n} rules with the {held} held hosts' (two each): the program takes at most {RULES_MAX}")
        with self._lock, interrupts.held():
            nxt = 1 - self._gen
            self._fold(nxt)
            try:
                self._write_generation(nxt, effective, resolved)
            except Exception as e:
                raise BpfError(f"writing the sessions: {e}") from None
            self._gen = nxt
            self._write_config()

    def refresh(self) -> bool:
        """Look the targets up again (routes, MTUs, sources); rewrite when they
        changed. Returns whether they did."""
        resolved = self._resolve(self._sessions)
        if resolved == self._resolved:
            return False
        self.set_sessions(self._sessions)
        return True

    @property
    def sessions(self):
        return list(self._sessions)

    # --- the sender device ------------------------------------------------------------
    def _make_sender(self):
        if self._sender:
            return
        name = sender_name()
        with netdev.ipr(self.netns) as ip:
            try:
                ip.link("add", ifname=name, kind="ifb")
            except NetlinkError as e:
                raise AttachError(f"creating the sender device {name}: {netdev.netlink_reason(e)}") from None
            try:
                ifindex = netdev.ifindex_of(ip, name, self.netns)
                ip.link("set", index=ifindex, ifalias=f"vtap sessions sender (pid {os.getpid()})", state="up")
            except Exception:
                ip.link("del", ifname=name)
                raise
        self._sender = (name, ifindex)
        if self.bpf is not None:
            self._write_config()
        try:
            self.attach_tc("sender", name, "egress", self.netns, FILTER_OWNER)
        except Exception:
            self._drop_sender()
            raise

    def _drop_sender(self):
        if not self._sender:
            return
        name, _ = self._sender
        self._sender = None
        try:
            with netdev.ipr(self.netns) as ip:
                ip.link("del", ifname=name)
        except Exception:
            pass  # gone with its namespace

    @property
    def sender(self):
        return self._sender[0] if self._sender else None

    def missing(self) -> str | None:
        """What was removed from outside that stops the copies: a tap filter of
        ours, or the sender device (None when all is in place)."""
        if self._sender:  # first: its own filter goes with it
            with netdev.ipr(self.netns) as ip:
                if not ip.link_lookup(ifname=self._sender[0]):
                    return f"the sender device {self._sender[0]} is gone (deleted from outside)"
        for f in self.tc_filters:
            if tc.find(f) is None:
                return f"the vTAP filter on {f.ifname} {f.direction} is gone (removed from outside)"
        return None

    # --- attach ---------------------------------------------------------------------
    def load_program(self):
        self.load("tap_ingress", "SCHED_CLS")
        self.load("tap_egress", "SCHED_CLS")
        return self.load("sender", "SCHED_CLS")

    def check_iface(self, ifname, direction="ingress"):
        if direction not in (*tc.DIRECTIONS, "both"):
            raise InputError(f"unknown direction {direction!r} (ingress, egress or both)")
        dirs = tc.DIRECTIONS if direction == "both" else (direction,)
        for d in dirs:
            self.refuse_reattach_tc(f"tap_{d}", ifname, (d,), self.netns)
        for s, (ifindex, _, _, _, name) in zip(self._sessions, self._resolved, strict=True):
            if s.target.kind == "local":
                if name == ifname:
                    raise InputError(
                        f"{s.label}: target {ifname} is also a tapped interface (its own copies would loop)"
                    )
                why = mirror_loops.loop_reason(self.netns, name, ifindex, ifname, direction)
                if why:
                    raise InputError(f"cannot tap {ifname} {direction}: {why}")

    def default_interfaces(self, direction="ingress"):
        """What to tap when nobody says: every UP interface but lo, sender
        devices, and the hooks the local targets' copies pass (mirror_loops).
        Returns (names, {skipped name: why})."""
        with netdev.ipr(self.netns) as ip:
            devs = netdev.devices(ip)
            paths = [
                (name, ifindex, netdev.copy_path(ip, ifindex))
                for s, (ifindex, _, _, _, name) in zip(self._sessions, self._resolved, strict=True)
                if s.target.kind == "local"
            ]
        chosen, skipped = [], {}
        for dev in sorted(devs.values(), key=lambda d: d.name):
            if not dev.up or dev.name == "lo" or sender_pid(dev.name or "") is not None:
                continue
            why = None
            for name, ifindex, path in paths:
                why = (
                    f"it is the target {name} of a session"
                    if dev.index == ifindex
                    else mirror_loops.loops(path, dev.index, mirror_loops.directions_of(direction), name)
                )
                if why:
                    break
            if why:
                skipped[dev.name] = why
            else:
                chosen.append(dev.name)
        return chosen, skipped

    def attach(self, ifname, direction="ingress"):
        """Tap one interface: ingress, egress or both."""
        self.check_iface(ifname, direction)
        self.load_program()
        self._make_sender()
        dirs = tc.DIRECTIONS if direction == "both" else (direction,)
        done = []
        try:
            for d in dirs:
                with interrupts.held():
                    f = self.attach_tc(f"tap_{d}", ifname, d, self.netns, FILTER_OWNER, self._sender[1])
                    done.append(f)
                    self._slot_names.setdefault(f.ifindex & (IF_SLOTS - 1), [])
                    if ifname not in self._slot_names[f.ifindex & (IF_SLOTS - 1)]:
                        self._slot_names[f.ifindex & (IF_SLOTS - 1)].append(ifname)
        except (AttachError, NetlinkError):
            for f in done:
                self.detach_tc(f)
            raise
        return done

    def _close(self):
        try:
            super()._close()
        finally:
            self._drop_sender()

    # --- counters -------------------------------------------------------------------
    def snapshot(self):
        """(totals, {interface: counters}) of what the taps saw."""
        rows = {}
        for slot, names in self._slot_names.items():
            c = self.percpu_totals("stats", slot)
            row = {
                "seen": c["seen"],
                "mirrored": c["mirrored"],
                "unmatched": c["unmatched"],
                "not_ip": c["not_ip"],
                "malformed": c["malformed"],
                "not_taken": c["sampled_out"],
                "own_copies": c["own_copies"],
                "pass": c["pass"],
                "mirror": c["mirror"],
            }
            if self.flows:  # the flow table's (what each session cut: its own counters)
                row.update({k: c[k] for k in CUT_TABLE})
            rows["+".join(names)] = row
        names = (*COUNTERS, *CUT_TABLE) if self.flows else COUNTERS
        totals = {k: sum(r[k] for r in rows.values()) for k in names}
        if self.flows:
            now = self.flows_now()
            totals.update(flows=now, evicted=max(0, totals["flows_new"] - totals["flows_ended"] - now))
        return totals, rows

    def flows_now(self) -> int:
        """Flows the cutoff's table holds now (0 without a table)."""
        if not self.flows or self.bpf is None:
            return 0
        from ebpf.maps import count_hash  # noqa: PLC0415 -- libbpf through ctypes, only for a table

        t = self.table("flows")
        return count_hash(t.map_fd, ctypes.sizeof(t.Key), ctypes.sizeof(t.Leaf))

    def counters(self) -> dict:
        return self.snapshot()[0]

    def counter_rows(self) -> dict:
        return self.session_counters()

    def session_counters(self) -> dict:
        """{session label: counters} over every generation the session lived in."""
        with self._lock:
            out = {}
            for s in self._sessions:
                out[s.label] = {k: self._bases.get((s.number, k), 0) for k in SESSION_COUNTERS}
            if self.bpf is None:
                return out
            for gen in (0, 1):
                for slot, s in enumerate(self._gen_sessions[gen]):
                    if s.label not in out:
                        continue
                    c = self.percpu_totals("sess_stats", gen * SESS_MAX + slot)
                    for k in SESSION_COUNTERS:
                        out[s.label][k] += c[k]
            return out

    def rule_counters(self) -> dict:
        """{(session label, rule position from 1, rule text): frames it decided}."""
        with self._lock:
            out = {}
            for s in self._sessions:
                for i, r in enumerate(s.rules):
                    out[(s.label, i + 1, str(r))] = self._rule_bases.get((s.number, i), 0)
            if self.bpf is None:
                return out
            hits = self.table("rule_hits")
            for gen in (0, 1):
                for bit, (s, r, i) in enumerate(self._rule_keys(gen)):
                    key = (s.label, i + 1, str(r)) if i is not None else None
                    if key in out:
                        out[key] += sum(hits[hits.Key(gen * RULES_MAX + bit)])
            return out

    # --- hosts held in a session: watch_for(), follow_alerts() (steer.py) ---------------
    def set_alert_session(self, session):
        """The session held hosts go into (its name or number): all of a held host's
        frames, both ways, are copied to that session's target, past its cutoff."""
        keys = {session, int(session)} if isinstance(session, str) and session.isdigit() else {session}
        found = [s for s in self._sessions if keys & {s.name, s.number, s.label}]
        if not found:
            names = ", ".join(s.label for s in self._sessions)
            raise InputError(f"no session {session!r} to hold hosts in (sessions: {names})")
        if self._alert_session is not None and self._alert_target(self._sessions) is not found[0]:
            raise InputError("held hosts go into one session: it was chosen already")
        # kept as given (a name, or a number), and looked up again at each write: an edit of
        # the file that renumbers the sessions does not move the held hosts elsewhere
        self._alert_session = int(session) if isinstance(session, str) and session.isdigit() else session

    def watch_for(self, addr, seconds, session=None):
        """Hold one host in `session` (name or number; set_alert_session()) for `seconds`."""
        if session is not None:
            self.set_alert_session(session)
        super().watch_for(addr, seconds)

    def follow_alerts(self, path, session=None, **kw):
        """As the vTAP's (steer.Steered), each alert's hosts held in `session` (name or
        number; set_alert_session())."""
        if session is not None:
            self.set_alert_session(session)
        super().follow_alerts(path, **kw)

    def _refuse_holding(self, what):
        if self._alert_session is None:
            raise InputError(f"no session takes held hosts: {what} (name one: session=, vtap --alert-session)")

    def _alert_target(self, sessions):
        """The session held hosts go into, among `sessions` (None: not there)."""
        key = self._alert_session
        return next((s for s in sessions if key in (s.name, s.label, s.number)), None)

    def _effective(self, sessions):
        """The sessions with the held hosts' rules first in the alert session: one from the
        host and one to it, whole."""
        held = self._steer.networks() if self._steer else []
        if not held:
            return sessions
        target = self._alert_target(sessions)
        if target is None:  # the file's edit took the session away: said once, until it is back
            if not self._said_gone:
                self._said_gone = True
                self.warn(
                    f"session {self._alert_session!r} is gone from the sessions: the held hosts are copied nowhere"
                )
            return sessions
        self._said_gone = False
        extra = [Rule("accept", **{side: str(n)}, whole=True) for n in held for side in ("source", "destination")]
        return [dataclasses.replace(s, rules=extra + list(s.rules)) if s is target else s for s in sessions]

    def apply_held(self):
        with self._watch_lock:
            now = time.monotonic_ns()
            held = set(self.held())
            for n in held - set(self._held_since):
                self._held_since[n] = now
            for n in set(self._held_since) - held:  # its hold is over: a later one starts afresh
                del self._held_since[n]
                self._stamps.pop(n, None)
            if self.bpf is not None:
                self._write(self._sessions, self._resolved)

    def has_room(self, addr) -> bool:
        # the held hosts counted already include those this alert just added
        return sum(len(s.rules) for s in self._effective(self._sessions)) <= RULES_MAX

    def no_room_said(self, addr) -> str:
        return f"no room for {addr} in the sessions: the program takes {RULES_MAX} rules in all, two a held host"

    def watches_alone(self, addr) -> bool:
        return False  # no rule of the file's is a held host's: each has its own

    def first_match_ns(self, addr) -> int:
        """When a frame of addr's hold was first taken (CLOCK_MONOTONIC ns), 0 if not yet."""
        net = ipaddress.ip_network(addr)
        since = self._held_since.get(net)
        if since is None or self.bpf is None:
            return 0
        with self._lock:
            got = [t for t in self._stamps.get(net, []) if t >= since]
            first = self.table("rule_first")
            for gen in (0, 1):
                for bit, (_, r, _) in enumerate(self._rule_keys(gen)):
                    if r.whole and (r.src or r.dst) == net:
                        t = first[first.Key(gen * RULES_MAX + bit)].value
                        if t >= since:
                            got.append(t)
        return min(got, default=0)

    def close(self):
        """Stop following alerts first (its thread writes the tables), then as BpfProgram."""
        if self._steer is not None:
            self._steer.stop()
        super().close()

    def describe(self) -> dict:
        d = super().describe()
        d["sessions"] = (
            "; ".join(
                f"{s.label} -> {s.target} ({len(s.rules)} rules{', truncate ' + str(s.truncate) if s.truncate else ''})"
                for s in self._sessions
            )
            or "none"
        )
        if self.netns:
            d["netns"] = self.netns
        return d
