"""XdpMirror: the XDP vTAP (xdp_mirror.bpf.c) as a Python object.

    >>> with XdpMirror(monitor="mon0", watch=["198.18.0.0/24"]) as tap:  # doctest: +SKIP
    ...     tap.attach("eth0")                  # where the watched traffic comes in
    ...     tap.set_watch(["2001:2::/48"])      # live: no reload
    ...     tap.counters()
    {'seen': ..., 'matched': ..., 'cloned': ..., ...}

On a node that forwards, each watched frame goes out of its egress and to the
monitor from the XDP hook, before an skb exists (the C file says how). The
watch-list, --match and sampling mean what they mean for TcMirror (MirrorBase).

What the program can send frames to is the kernel's to say: an interface whose
driver transmits XDP frames (the netdev family's xdp-features, NDO_XMIT; a veth
only while its peer runs an XDP program). User space keeps, per such egress, a
devmap that holds it and the monitor (`pairs`); refresh_egresses() rereads
them, and the command line calls it every interval. A frame routed out of any
other interface goes to the kernel, counted as no_xdp_egress.

forward= what the fast path sends out:
  "watched"  the watched frames, to their egress and the monitor; the rest go
             to the kernel untouched (its netfilter, routes and counters)
  "all"      also the frames it does not copy, to their egress alone
"""

import contextlib
import ctypes
import os
import threading

from ebpf import interrupts, netdev, tracepoints, xdp
from ebpf.abi import defines
from ebpf.errors import BpfError, InputError
from ebpf.holders import holders, prog_id, prog_name
from ebpf.testrun import libbpf
from ebpf.vtap import mirror_health, mirror_loops
from ebpf.vtap.cutoff import CUT_COUNTERS, FLOW_TIMEOUT_DEFAULT
from ebpf.vtap.mirror_base import MirrorBase, slot_of

FORWARD_MODES = ("watched", "all")
XDP_MIRROR = defines("vtap/xdp_mirror.h")
VTAP_F_FORWARD_ALL, VTAP_F_MONITOR_NO_XDP = XDP_MIRROR["VTAP_F_FORWARD_ALL"], XDP_MIRROR["VTAP_F_MONITOR_NO_XDP"]
BPF_MAP_TYPE_DEVMAP = 14
# The tracepoints' fields the program reads, by the -D name it reads them under.
TP_FIELDS = {
    "xdp_devmap_xmit": {
        "TP_XMIT_FROM": "from_ifindex",
        "TP_XMIT_TO": "to_ifindex",
        "TP_XMIT_DROPS": "drops",
        "TP_XMIT_SENT": "sent",
    },
    "xdp_redirect_err": {"TP_ERR_PROG": "prog_id", "TP_ERR_IFINDEX": "ifindex", "TP_ERR_ERR": "err"},
}
# Why a watched frame went to the kernel instead of out on the fast path.
SLOW_REASONS = (
    "no_neigh",
    "ttl_expired",
    "too_big",
    "no_route",
    "not_forwarded",
    "no_xdp_egress",
    "ip_options",
    "vlan",
)
# What counters() says; from the program's: matched = mirrored + clone_failed + sampled_out + cut + the
# slow reasons, cloned = mirrored less what the monitor refused or the kernel skipped and the
# refused redirects, failed = those and clone_failed (the monitor took no XDP frames).
COUNTERS = (
    "seen",
    "matched",
    "cloned",
    "sampled_out",
    "failed",
    "to_kernel",
    *SLOW_REASONS,
    "not_ip",
    "malformed",
    "unmatched",
    "cloned_bytes",
    "forwarded",
    "csum_finished",
    "egress_dropped",
    "redirect_errors",
    "pass",
    "mirror",
    "redirect",
)


def tracepoint_offsets() -> list[str]:
    """-D flags with the offsets of the fields the program reads, from the events'
    format files, so the program reads them right on any kernel."""
    flags = []
    for event, wanted in TP_FIELDS.items():
        offsets = tracepoints.fields("xdp", event)
        for define, field in wanted.items():
            if field not in offsets:
                raise BpfError(f"the trace event xdp:{event} has no field {field} on this kernel")
            flags.append(f"-D{define}={offsets[field]}")
    return flags


can_transmit_xdp = xdp.transmits_xdp  # the kernel's word (xdp.py)


class XdpMirror(MirrorBase):
    """Send watched frames to their egress and to a monitor, from the XDP hook."""

    SOURCE = "xdp_mirror.bpf.c"
    FUNCTION = "xdp_mirror"
    MAIN_COUNTERS = ("seen", "matched", "cloned", "sampled_out", "failed")
    VERDICTS = ("pass", "mirror", "redirect", "drop")
    REASONS = ("not_ip", "malformed", "unmatched", "sampled_out", "mirrored", "clone_failed", "cut", *SLOW_REASONS)
    DROPS = ("malformed",)  # a partial checksum it could not finish (a frame over 4 KB: not on veth)

    def __init__(
        self,
        monitor,
        watch=None,
        match="any",
        sample=1,
        netns=None,
        watch_max=None,
        forward="watched",
        source=None,
        cflags=(),
        cutoff=None,
        flows=None,
        flow_timeout=FLOW_TIMEOUT_DEFAULT,
    ):
        if forward not in FORWARD_MODES:
            raise InputError(f"unknown forward mode {forward!r} (watched or all)")
        super().__init__(
            watch, match, sample, watch_max, source, [*tracepoint_offsets(), *cflags], cutoff, flows, flow_timeout
        )
        self.netns = netns
        self.forward = forward
        self._inner = {}  # egress ifindex -> fd of its devmap {egress, monitor}
        self._egress_names = {}  # egress ifindex -> name
        self.not_egresses = {}  # name -> why the fast path cannot send out of it
        self._lock = threading.Lock()
        self._trace_fds = []  # perf events that run the tracepoint programs
        self.monitor_takes_xdp = True  # as the kernel last said (refresh_egresses)
        if netns:
            with netdev.ipr(netns):  # a namespace that does not exist fails now, in one line
                pass
        self.monitor = monitor  # resolves the ifindex, so a bad name fails before any compile

    def config_flags(self) -> int:
        return (
            super().config_flags()
            | (VTAP_F_FORWARD_ALL if self.forward == "all" else 0)
            | (0 if self.monitor_takes_xdp else VTAP_F_MONITOR_NO_XDP)
        )

    # --- the monitor -------------------------------------------------------------
    @MirrorBase.monitor.setter
    def monitor(self, ifname):
        """Point the copies at another interface; checked before anything changes."""
        with netdev.ipr(self.netns) as ip:
            ifindex = netdev.ifindex_of(ip, ifname, self.netns)
            mtu = netdev.device(ip, ifindex).mtu
        for a in self.xdp_attachments:
            if a.ifindex == ifindex:
                raise InputError(f"monitor {ifname} refused: it is a tapped interface (its own copies would loop)")
        self._monitor, self._monitor_ifindex, self._monitor_mtu = ifname, ifindex, mtu
        if self.bpf is not None:
            self._write_config()
            if self._inner:
                self.refresh_egresses(rewrite=True)

    # --- attach / detach ---------------------------------------------------------
    def load_program(self):
        """Compile, fill the maps and pass the verifier, before touching any hook."""
        fn = self.load(self.FUNCTION, "XDP")
        prog_self = self.table("prog_self")
        prog_self[prog_self.Key(0)] = prog_self.Leaf(prog_id(fn.fd))
        return fn

    def check_iface(self, ifname, mode="native"):
        """Fail now, before anything is attached, if ifname cannot be tapped."""
        if mode not in xdp.MODES or mode == "offload":
            raise InputError(f"unknown XDP mode {mode!r} for the XDP vTAP (native or generic)")
        if ifname == self._monitor:
            raise InputError(f"monitor {ifname} is also a tapped interface (its own copies would loop)")
        with netdev.ipr(self.netns) as ip:
            netdev.ifindex_of(ip, ifname, self.netns)
        why = mirror_loops.loop_reason(self.netns, self._monitor, self._monitor_ifindex, ifname, "ingress")
        if why:
            raise InputError(f"cannot tap {ifname}: {why}")
        for name, _, hook_mode, pid in xdp.attached(self.netns):
            if name == ifname and not any(a.ifname == ifname for a in self.xdp_attachments):
                raise InputError(f"cannot tap {ifname}: " + self._occupant(pid, hook_mode))

    def _occupant(self, prog, hook_mode):
        """Who holds the XDP hook an interface already has a program on."""
        pids = holders([prog])[prog]
        held = f"pid {', '.join(map(str, pids))}" if pids else "no process: a killed run left it"
        if prog_name(prog) == self.FUNCTION:
            fix = "stop it first" if pids else "vtap --cleanup removes it"
            return f"another XDP vTAP is on its hook ({hook_mode}; {held}): one program per hook, {fix}"
        return (
            f"its XDP hook ({hook_mode}) runs another program, {prog_name(prog) or prog} ({held}); the XDP "
            "vTAP needs the hook to itself"
        )

    def attach(self, ifname, mode="native"):
        """Tap the frames that come in on one interface, in XDP mode native or generic."""
        self.check_iface(ifname, mode)
        self.load_program()
        self._trace()
        with interrupts.held():  # an attachment made is an attachment recorded and counted
            a = self.attach_xdp(self.FUNCTION, ifname, self.netns, mode)
            self._note_slot(a.ifindex, a.ifname)
        try:
            self.refresh_egresses()
        except BaseException:
            self.detach_xdp(a)
            raise
        return a

    def _trace(self):
        """The tracepoint programs that read what became of the frames (global:
        they count only frames of this program, see the C file)."""
        if self._trace_fds:
            return
        try:
            for fn, event in (("on_devmap_xmit", "xdp_devmap_xmit"), ("on_redirect_err", "xdp_redirect_err")):
                self._trace_fds.append(tracepoints.attach(self.load(fn, "TRACEPOINT").fd, "xdp", event))
        except BaseException:
            self._untrace()
            raise

    def _untrace(self):
        for fd in self._trace_fds:
            os.close(fd)
        self._trace_fds.clear()

    def default_interfaces(self):
        """What to tap when nobody says: every UP interface where traffic may come
        in, but lo and those that carry the copies (mirror_loops): (names,
        {skipped name: why})."""
        return mirror_loops.default_interfaces(self.netns, self._monitor, self._monitor_ifindex, "ingress")

    # --- where the fast path can send ---------------------------------------------
    def refresh_egresses(self, rewrite=False) -> dict:
        """Reread which interfaces the fast path can send out of and keep `pairs`
        current: a devmap {egress, monitor} per interface whose driver transmits
        XDP frames, none for the others (their frames go to the kernel). Returns
        {name: why not} of the others. rewrite=True writes every devmap again
        (the monitor changed)."""
        with self._lock:
            with netdev.ipr(self.netns) as ip:
                devs = netdev.devices(ip)
            # generic XDP sends each frame as an skb, which any device takes
            native = not any(a.mode == "generic" for a in self.xdp_attachments)
            able, why_not = {}, {}
            for d in devs.values():
                if d.name == "lo" or d.index == self._monitor_ifindex:
                    continue
                if slot_of(d.index) == slot_of(self._monitor_ifindex):
                    why_not[d.name] = f"its counter slot is the monitor's (ifindex {d.index})"
                    continue
                if native and can_transmit_xdp(self.netns, d.index) is False:
                    why_not[d.name] = (
                        "its veth peer runs no XDP program"
                        if d.kind == "veth"
                        else f"its driver ({d.kind or 'a device'}) does not transmit XDP frames"
                    )
                    continue
                able[d.index] = d.name
            pairs = self.table("pairs")
            for index in [i for i in self._inner if i not in able]:
                try:
                    del pairs[ctypes.c_int(index)]
                except KeyError:
                    pass
                os.close(self._inner.pop(index))
            for index in able:
                if index not in self._inner or rewrite:
                    self._write_pair(index)
            self._egress_names = able
            self.not_egresses = why_not
            takes = not native or can_transmit_xdp(self.netns, self._monitor_ifindex) is not False
            if takes != self.monitor_takes_xdp:
                self.monitor_takes_xdp = takes
                self._write_config()
            return dict(why_not)

    def _write_pair(self, egress):
        """The devmap {0: egress, 1: monitor}, made or rewritten, and its place
        in `pairs`. Written from inside the namespace: the kernel resolves a
        devmap entry's ifindex in the writer's namespace (xdp_redirect.py)."""
        lib = libbpf()
        fd = self._inner.get(egress)
        if fd is None:
            fd = lib.bpf_map_create(BPF_MAP_TYPE_DEVMAP, b"vtap_pair", 4, 4, 2, None)
            if fd < 0:
                raise BpfError(f"creating a devmap: {os.strerror(-fd)}")
            self._inner[egress] = fd
        with netdev.entered(self.netns) if self.netns else contextlib.nullcontext():
            for key, ifindex in ((0, egress), (1, self._monitor_ifindex)):
                k, v = ctypes.c_uint32(key), ctypes.c_uint32(ifindex)
                rc = lib.bpf_map_update_elem(fd, ctypes.byref(k), ctypes.byref(v), 0)
                if rc < 0:
                    raise BpfError(f"writing the devmap of egress {egress}: {os.strerror(-rc)}")
        self.table("pairs")[ctypes.c_int(egress)] = ctypes.c_int(fd)

    @property
    def egresses(self) -> list[str]:
        """The interfaces the fast path can send out of now."""
        return sorted(self._egress_names.values())

    # --- what changed outside -------------------------------------------------------
    def health(self) -> mirror_health.Health:
        """What changed outside since it attached, in the TC vTAP's shape
        (TcMirror.health()): the hooks whose XDP program is no longer this one,
        and the monitor's state: "up", "down", "no-carrier", "gone", or "no-xdp"
        (up, but its driver takes no XDP frames now: every copy is refused,
        counted as failed). Rereads the egresses too."""
        gone = set(xdp.removed_from_outside(self.xdp_attachments))
        missing = [
            (a, "its program was removed from outside (vtap --hook xdp --cleanup --all, ip link set ... xdp off)")
            for a in self.xdp_attachments
            if a.ifname in gone
        ]
        return mirror_health.Health(missing, self._monitor_state(), self.monitor_mtu)

    def _monitor_state(self) -> str:
        with netdev.ipr(self.netns) as ip:
            mon = netdev.device(ip, self._monitor_ifindex)
        if mon is None or mon.name != self._monitor:
            return "gone"
        self.monitor_mtu = mon.mtu
        if not mon.up:
            return "down"
        if not mon.carrier:
            return "no-carrier"
        self.refresh_egresses()  # and the program told, when that changed
        return "up" if self.monitor_takes_xdp else "no-xdp"

    # --- counters ---------------------------------------------------------------
    def snapshot(self):
        """(totals, {interface: counters}) read together; interfaces whose index
        falls in the same counter slot share a row named "a+b"."""
        rows = {}
        for slot, names in self._slot_names.items():
            c = self.percpu_totals("stats", slot)
            # still pending when read: a copy the kernel skipped (the monitor took no
            # XDP frames), or one in a queue this very moment (the poll's, microseconds)
            lost = c["monitor_dropped"] + c["monitor_pending"] + c["redirect_errors"]
            c["egress_dropped"] += c["egress_pending"]
            c["matched"] = (
                c["mirrored"] + c["clone_failed"] + c["sampled_out"] + c["cut"] + sum(c[r] for r in SLOW_REASONS)
            )
            c["cloned"] = c.pop("mirrored") - lost
            c["failed"] = lost + c["clone_failed"]
            c["to_kernel"] = sum(c[r] for r in SLOW_REASONS)
            rows["+".join(names)] = {k: c[k] for k in self.counter_names()}
        totals = {k: sum(r[k] for r in rows.values()) for k in self.counter_names()}
        if self.flows:
            totals.update(self.flow_counters(totals))  # the table's: one for every interface
        return totals, rows

    def counter_names(self):
        """counters()' names: the cutoff's too when the tap has a flow table."""
        return COUNTERS + CUT_COUNTERS if self.flows else COUNTERS

    def last_redirect_error(self) -> str | None:
        """The errno of the last redirect the kernel refused, as words."""
        table = self.table("last_err")
        err = table[table.Key(0)].value
        return os.strerror(-err) if err < 0 else None

    def reset_counters(self):
        if self.bpf is not None:
            for slot in self._slot_names:
                self.zero_percpu("stats", slot)

    def describe(self) -> dict:
        d = super().describe()
        d["forward"] = "watched frames (the rest: the kernel)" if self.forward == "watched" else "every frame it can"
        return d

    # --- lifecycle ----------------------------------------------------------------
    def _close(self):
        self._untrace()
        try:
            super()._close()
        finally:
            for fd in self._inner.values():
                os.close(fd)
            self._inner.clear()
            self._egress_names = {}
