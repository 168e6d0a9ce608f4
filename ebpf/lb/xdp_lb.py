"""XdpLoadBalancer: a layer-4 load balancer at the XDP hook (xdp_lb.bpf.c).

    >>> lb = XdpLoadBalancer(self4="198.18.5.2", netns=ns)                        # doctest: +SKIP
    >>> svc = lb.add_service("tcp:198.18.5.100:80")
    >>> lb.set_backends(svc, {"198.18.5.11:8080": 1, "198.18.5.12:8080": 2})
    >>> lb.attach("eth0")                      # one-armed: clients and backends on this interface
    >>> lb.counters(), lb.sessions()

A service (protocol, VIP, port) spreads its new sessions over its backends by a
Maglev table (ebpf/lb/maglev.py) that user space builds and writes, slot by slot,
only where it changed: setting a backend's weight to 0 drains it (no new
sessions; its sessions go on), removing one moves only its own flows. In NAT
mode the backends see the LB's own address (self4/self6) and an LB port from
[port_min, port_min + port_count); in DSR mode they see the client and must hold
the VIP themselves. See the C file for sessions, their states and timeouts.
"""

import contextlib
import ctypes
import ipaddress
import os
import re
import socket
import time
from dataclasses import dataclass

from ebpf import endpoints, interrupts, maps, netdev, objinfo, tc, xdp
from ebpf.abi import defines
from ebpf.errors import InputError
from ebpf.lb import native
from ebpf.lb.maglev import maglev_slots
from ebpf.program import BpfProgram, refuse_live
from ebpf.testrun import libbpf

ABI = defines("lb/xdp_lb.h")
MAX_SERVICES = ABI["LB_MAX_SERVICES"]  # the defaults of max_services and (less "no backend") max_backends
MAX_BACKENDS = ABI["LB_MAX_BACKENDS"] - 1
SESSIONS, HALF_OPEN = ABI["LB_MAX_SESSIONS"], ABI["LB_MAX_HALF_OPEN"]  # the defaults of max_sessions, max_half_open
RING_SIZE = ABI["LB_RING_SIZE"]
MODES = {"nat": ABI["LB_MODE_NAT"], "dsr": ABI["LB_MODE_DSR"]}
PROTOS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}
STATES = {ABI["LB_ST_SYN"]: "syn", ABI["LB_ST_EST"]: "established", ABI["LB_ST_UDP"]: "udp"}
TIMEOUTS = {"syn": 10.0, "established": 300.0, "fin": 10.0, "udp": 30.0}  # seconds, as conntrack's order


TC_OWNER, TC_FUNCTION = "lab-lb", "tc_lb"  # the LB at TC (tc_lb.py): its filters' name, which cleanup finds


def _words(addr) -> list[int]:
    """An address as the four __u32 of struct lb_addr (network byte order in memory)."""
    packed = addr.packed + bytes(16 - len(addr.packed))
    return [int.from_bytes(packed[i : i + 4], "little") for i in range(0, 16, 4)]


def _addr(words, version, zero_ok=False):
    """struct lb_addr's four __u32 as an address of that IP version; None for all zero (unset)."""
    raw = b"".join(int(w).to_bytes(4, "little") for w in words)[: 4 if version == 4 else 16]
    if not any(raw) and not zero_ok:
        return None
    return ipaddress.ip_address(raw)


def _fin(v) -> int:
    """Who of a session has sent a FIN: LB_FIN_CLIENT | LB_FIN_BACKEND, from its closing bytes."""
    fin = ABI["LB_CL_FIN"]
    return (ABI["LB_FIN_CLIENT"] if v.closing[0] & fin else 0) | (ABI["LB_FIN_BACKEND"] if v.closing[1] & fin else 0)


def _sysctl(ns, path):
    """A /proc/sys value as the namespace sees it, or None (no such interface)."""
    try:
        with netdev.entered(ns) if ns else contextlib.nullcontext():
            with open(f"/proc/sys/{path}") as f:
                return f.read().strip()
    except FileNotFoundError:
        return None


def nat_ports(netns=None) -> tuple[int, int]:
    """(port_min, port_count) of the LB ports NAT sessions take towards their
    backends: the larger span of 1024..65535 that the host's own ephemeral
    ports (net.ipv4.ip_local_port_range, for IPv6 too) leave free. The program
    takes a backend's packet to an LB port for a reply to its session; a port
    the host's kernel also gave one of its own connections to that backend (a
    health check, any program on the LB host) would make two connections of
    one, and the program would hand the host's packets to a client."""
    lo, hi = (int(x) for x in (_sysctl(netns, "net/ipv4/ip_local_port_range") or "32768 60999").split())
    below, above = (1024, lo - 1024), (hi + 1, 65535 - hi)
    port_min, count = max(below, above, key=lambda r: r[1])
    if count < 1024:
        raise InputError(
            f"the host's ephemeral ports ({lo}-{hi}) leave fewer than 1024 ports for the LB's NAT "
            f"sessions; fix: sysctl -w net.ipv4.ip_local_port_range='32768 60999'"
        )
    return port_min, count


@dataclass(frozen=True)
class Service:
    proto: str
    vip: ipaddress._BaseAddress
    port: int

    @classmethod
    def parse(cls, text):
        """PROTO:VIP:PORT, IPv6 in brackets: tcp:198.18.5.100:80, udp:[2001:2::100]:53."""
        if isinstance(text, Service):
            return text
        return cls(*endpoints.service(text, "service", "PROTO:VIP:PORT"))

    def __str__(self):
        return f"{self.proto}:{endpoints.text(self.vip, self.port)}"


@dataclass(frozen=True)
class Backend:
    addr: ipaddress._BaseAddress
    port: int

    @classmethod
    def parse(cls, text):
        """ADDR:PORT, IPv6 in brackets: 198.18.5.11:8080, [2001:2:0:5::11]:8080."""
        if isinstance(text, Backend):
            return text
        return cls(*endpoints.endpoint(str(text), "backend"))

    def __str__(self):
        return endpoints.text(self.addr, self.port)


@dataclass(frozen=True)
class WeightedBackend:
    """A backend and its weight, as a command line or a backends file gives them."""

    backend: Backend
    weight: int = 1

    @classmethod
    def parse(cls, text):
        """ADDR:PORT[@WEIGHT], weight 1 unless given: 198.18.5.12:8080@2, [2001:2:0:5::11]:8080."""
        if isinstance(text, WeightedBackend):
            return text
        m = re.fullmatch(rf"{endpoints.ENDPOINT}(?:@(\d+))?", text.strip())
        if not m:
            raise InputError(f"bad backend {text!r}: want ADDR:PORT[@WEIGHT] (IPv6 in brackets)")
        addr, port, weight = m.groups()
        backend = Backend(*endpoints.checked(addr, port, "backend", text))
        return cls(backend, int(weight) if weight is not None else 1)

    def __str__(self):
        return f"{self.backend}@{self.weight}"


def forwarding_problem(ifname, families, netns=None) -> str | None:
    """Why the LB cannot run on `ifname` as it is, with the line that fixes it, or None:
    bpf_fib_lookup(), which finds the backends' MACs, answers only where forwarding
    is on (for each family of `families`, the services' IP versions)."""
    off = [
        f"net.ipv{v}.conf.{ifname}.forwarding"
        for v in sorted(families or {4})
        if _sysctl(netns, f"net/ipv{v}/conf/{ifname}/forwarding") == "0"
    ]
    if not off:
        return None
    where = f"ip netns exec {netns} " if netns and "/" not in netns else ""
    return (
        f"forwarding is off on {ifname} ({', '.join(off)} = 0): the program finds backends' "
        "MAC addresses with bpf_fib_lookup(), which needs it on; for this interface only: "
        f"{where}sysctl -w {' '.join(f'{n}=1' for n in off)}"
    )


class XdpLoadBalancer(BpfProgram):
    SOURCE = "xdp_lb.bpf.c"
    FUNCTION = "xdp_lb"
    INLINE = ("lb_sessions.h",)  # the sessions, the same at both hooks (its map calls are BCC's)
    ROWS = "backend"
    MAIN_COUNTERS = ("seen", "to_backend", "to_client", "new_sessions", "tx", "pass", "drop")
    VERDICTS = ("tx", "pass", "drop")
    REASONS = (
        "to_backend",
        "to_client",
        "not_ip",
        "malformed",
        "unmatched",
        "fragment",
        "ip_options",
        "no_backend",
        "no_port",
        "no_session",
        "no_neigh",
        "stale",
    )
    DROPS = ("malformed", "fragment", "ip_options", "no_backend", "no_port", "no_session", "no_neigh", "stale")

    def __init__(
        self,
        self4=None,
        self6=None,
        mode="nat",
        port_min=None,
        port_count=None,
        timeouts=None,
        netns=None,
        source=None,
        cflags=(),
        max_sessions=None,
        max_half_open=None,
        max_services=None,
        max_backends=None,
    ):
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r} (nat or dsr)")
        self.max_services = max_services or MAX_SERVICES
        self.max_backends = max_backends or MAX_BACKENDS
        if not 1 <= self.max_services <= 65536 or not 1 <= self.max_backends <= 65535:
            raise InputError("services: 1 to 65536; backends: 1 to 65535")
        cflags = [f"-DLB_MAX_SERVICES={self.max_services}", f"-DLB_MAX_BACKENDS={self.max_backends + 1}", *cflags]
        self.max_sessions = max_sessions or SESSIONS
        self.max_half_open = max_half_open or HALF_OPEN
        if self.max_sessions < 1 or self.max_half_open < 1:
            raise InputError("session tables need at least one entry")
        cflags = [f"-DLB_MAX_SESSIONS={self.max_sessions}", f"-DLB_MAX_HALF_OPEN={self.max_half_open}", *cflags]
        if mode == "dsr":  # no LB ports: the reverse tables go unused
            cflags += ["-DLB_MAX_REVERSE=1", "-DLB_MAX_REVERSE_HALF=1"]
        if port_min is None and port_count is None:
            port_min, port_count = nat_ports(netns)
        if not (1024 <= port_min and port_count >= 1 and port_min + port_count <= 65536):
            raise InputError(f"LB ports {port_min}..{port_min + port_count - 1} are outside 1024..65535")
        # lb_hook_new_session(), which lb_sessions.h declares, left out of a program: an error,
        # not a warning and then a load that fails without saying why
        super().__init__([f"-DLB_MODE={MODES[mode]}", "-Werror=undefined-internal", *cflags], source)
        self.mode, self.netns = mode, netns
        self.self4 = ipaddress.IPv4Address(self4) if self4 else None
        self.self6 = ipaddress.IPv6Address(self6) if self6 else None
        self.port_min, self.port_count = port_min, port_count
        self.timeouts = {**TIMEOUTS, **(timeouts or {})}
        self._services = {}  # Service -> id
        self._backends = {}  # Backend -> index (1..)
        self._weights = {}  # Service -> {Backend: weight}
        self._walks, self._gone = None, 0  # sweep_step()'s walk over the session tables; sessions it deleted
        if netns:
            with netdev.ipr(netns):  # a namespace that does not exist fails now, in one line
                pass

    # --- configuration ------------------------------------------------------------
    @property
    def services(self) -> tuple[Service, ...]:
        """Its services, in the order add_service() added them."""
        return tuple(self._services)

    @property
    def backends(self) -> tuple[Backend, ...]:
        """Every backend set_backends() gave it, in the order first given (one no service has any
        more keeps its slot and its counters)."""
        return tuple(self._backends)

    def maps_created(self):
        self._write_conf()
        for svc, sid in self._services.items():
            self._write_service(svc, sid)
        for be, idx in self._backends.items():
            self._write_backend(be, idx)
        for svc in self._weights:
            self._write_ring(svc, fresh=True)

    def _write_conf(self):
        c = self.table("conf")[ctypes.c_int(0)]
        for name, addr in (("self4", self.self4), ("self6", self.self6)):
            if addr is not None:
                getattr(c, name).a = (ctypes.c_uint32 * 4)(*_words(addr))
        c.port_min, c.port_count = self.port_min, self.port_count
        for i, k in enumerate(("syn", "established", "fin", "udp")):
            c.timeout_ns[i] = int(self.timeouts[k] * 1e9)
        self.table("conf")[ctypes.c_int(0)] = c

    def add_service(self, service) -> Service:
        svc = Service.parse(service)
        if svc in self._services:
            return svc
        if len(self._services) >= self.max_services:
            raise InputError(f"service {svc}: more than {self.max_services} services (max_services, --max-services)")
        self_addr = self.self4 if svc.vip.version == 4 else self.self6
        if self.mode == "nat" and self_addr is None:
            raise InputError(f"service {svc}: NAT mode needs the LB's own IPv{svc.vip.version} address")
        sid = min(set(range(self.max_services)) - set(self._services.values()))
        self._services[svc] = sid
        self._weights.setdefault(svc, {})
        if self.bpf is not None:
            self._write_service(svc, sid)
        return svc

    def set_backends(self, service, weights: dict) -> int | None:
        """The service's backends and weights ({"ADDR:PORT" or Backend: weight});
        0 drains one. Only the table's changed slots are written: how many (None
        before the program's maps exist)."""
        svc = Service.parse(service)
        if svc not in self._services:
            raise InputError(f"no service {svc}")
        parsed = {}
        for b, w in weights.items():
            be = Backend.parse(b)
            if be.addr.version != svc.vip.version:
                raise InputError(f"backend {be} of {svc}: families differ")
            if not isinstance(w, int) or w < 0:
                raise InputError(f"backend {be}: weight {w!r} must be an integer 0 or more")
            parsed[be] = w
        new = [be for be in parsed if be not in self._backends]
        if len(self._backends) + len(new) > self.max_backends:
            # refused whole: no backend written, the service's table as it was
            raise InputError(
                f"service {svc}: {len(self._backends) + len(new)} backends in all, more than "
                f"{self.max_backends} (max_backends, --max-backends)"
            )
        used, idx = set(self._backends.values()), 0
        for be in new:  # each the lowest index (1..max_backends) no backend holds
            idx += 1
            while idx in used:
                idx += 1
            self._backends[be] = idx
            if self.bpf is not None:
                self._write_backend(be, idx)
        self._weights[svc] = parsed
        return self._write_ring(svc) if self.bpf is not None else None

    def _service_key(self, svc):
        k = self.table("services").Key()
        k.vip.a = (ctypes.c_uint32 * 4)(*_words(svc.vip))
        k.port, k.proto, k.family = socket.htons(svc.port), PROTOS[svc.proto], svc.vip.version
        return k

    def _write_service(self, svc, sid):
        k = self._service_key(svc)
        v = self.table("services").Leaf()
        v.id = sid
        info = self.table("service_info").Leaf()
        info.vip.a = (ctypes.c_uint32 * 4)(*_words(svc.vip))
        info.port, info.proto, info.family = socket.htons(svc.port), PROTOS[svc.proto], svc.vip.version
        self.table("service_info")[ctypes.c_int(sid)] = info
        a = self.table("vip_addrs").Key()
        a.a = (ctypes.c_uint32 * 4)(*_words(svc.vip))
        self.table("vip_addrs")[a] = ctypes.c_uint8(1)
        self.table("services")[k] = v

    def _write_backend(self, be, idx):
        v = self.table("backends").Leaf()
        v.addr.a = (ctypes.c_uint32 * 4)(*_words(be.addr))
        v.port, v.family, v.live = socket.htons(be.port), be.addr.version, 1
        self.table("backends")[ctypes.c_int(idx)] = v

    def ring(self, service) -> list:
        """The service's Maglev table as backend names (None: empty slot)."""
        svc = Service.parse(service)
        weights = {str(b): w for b, w in self._weights.get(svc, {}).items()}
        names = sorted(n for n, w in weights.items() if w > 0)
        slots = maglev_slots(weights, RING_SIZE)
        return [names[i] for i in slots] if slots is not None else [None] * RING_SIZE

    def _write_ring(self, svc, fresh=False):
        """Write the service's table where it differs from the map's, in one batch
        (BPF_MAP_UPDATE_BATCH), slot after slot: a new flow meanwhile finds the old
        backend or the new one, never an empty slot (both are live: a backend's entry
        is written before any slot names it, and stays while sessions use it). No
        second table, so no memory beyond the table itself. Returns how many slots.
        fresh: the map was just made (all slots 0), so it is not read first."""
        weights = {str(b): w for b, w in self._weights.get(svc, {}).items()}
        index = {str(b): self._backends[b] for b in self._weights.get(svc, {})}
        new = maglev_slots(weights, RING_SIZE, index) or (ctypes.c_uint32 * RING_SIZE)()
        fd, base = self.table("rings").map_fd, self._services[svc] * RING_SIZE
        old = (ctypes.c_uint32 * RING_SIZE)() if fresh else maps.array_slice(fd, base, RING_SIZE, as_list=False)
        keys, values, changed = native.ring_diff(old, new, base)
        if changed:
            maps.array_write(fd, keys, values, changed)
        return changed

    # --- attach -------------------------------------------------------------------------
    def load_program(self):
        return self.load(self.FUNCTION, "XDP")

    def attach(self, ifname, mode="native", kept="adopt"):
        """Attach where clients and backends both are (one-armed). The kernel's
        bpf_fib_lookup() answers only on an interface that forwards, so that is
        checked first: an LB is a router for its VIPs.

        A load balancer left serving on ifname (keep_attached, `lab lb --keep`, or a
        killed run) is, with kept="adopt", taken over when it is this same program
        with the same own addresses and LB ports: its sessions, LB ports and counters
        go on, and this object's services, backends and weights replace its own, the
        Maglev tables written where they differ (established flows stay on their
        backends; a backend no longer given keeps its sessions, with no new ones).
        Else KeptDatapathMismatch, nothing changed. kept="replace" swaps it for this
        one in one step (its sessions are lost); kept="refuse" says it is there.
        self.adopted says which happened."""
        problem = forwarding_problem(ifname, {s.vip.version for s in self._services}, self.netns)
        if problem:
            raise InputError(problem)
        self.adopted, self.replaced = False, None  # replaced: the hook of a kept LB this one replaced
        at_tc = self.kept_tc(TC_FUNCTION, ifname, TC_OWNER, self.netns)
        if at_tc is not None:
            if kept != "replace":
                raise InputError(
                    f"{ifname} runs a load balancer at the TC hook left serving (kept, or its process "
                    "killed); this one would run at XDP and cannot take its sessions over: replace it "
                    "(--replace: its sessions are lost), run this one with --hook tc, or remove it "
                    "(python -m lab lb --cleanup)"
                )
            refuse_live(ifname, TC_FUNCTION, at_tc.pids)
            a = self.attach_xdp(self.FUNCTION, ifname, self.netns, mode)
            tc.cleanup_one(self.netns, at_tc)
            self.replaced = "tc"
            return a
        found = self.kept_xdp(self.FUNCTION, ifname, self.netns)
        if found is None:
            return self.attach_xdp(self.FUNCTION, ifname, self.netns, mode)
        if kept not in ("adopt", "replace"):
            raise InputError(
                f"{ifname} runs a load balancer left serving (kept, or its process killed): "
                "adopt it, replace it, or remove it (python -m lab lb --cleanup)"
            )
        if kept == "adopt":
            a = self.take_over_xdp(self.FUNCTION, ifname, self.netns, mode, check=self._can_serve_on)
            self._take_over_state()
            self.adopted = True
            return a
        self.replaced = "xdp"
        return self._replace(ifname, mode, found)

    def _replace(self, ifname, mode, found):
        """This program in place of the kept one: in one step when both run in one mode."""
        ifindex, their_mode, pid, live = found
        refuse_live(ifname, "xdp_lb", live)
        fn = self.load_program()
        self._tell_skb_mode(mode)
        if their_mode != mode:
            xdp.remove(self.netns, ifindex, their_mode, pid)
            return self.attach_xdp(self.FUNCTION, ifname, self.netns, mode)
        theirs = objinfo.prog_fd(pid)
        try:
            with interrupts.held():
                a = xdp.attach(self.netns, ifname, fn.fd, mode, replacing_fd=theirs)
                self._xdp.append(a)
        finally:
            os.close(theirs)
        return a

    def _can_serve_on(self, t) -> str | None:
        """Why this object cannot go on with the kept maps `t`, or None: NAT sessions
        are to the LB's own address and an LB port of its range, which replies come
        back to; another address or range would strand them."""
        if self.mode != "nat":
            return None
        c = t["conf"][ctypes.c_int(0)]
        for v, ours in ((4, self.self4), (6, self.self6)):
            theirs = _addr(getattr(c, f"self{v}").a, v)
            if theirs is not None and ours is not None and theirs != ours:
                return f"its NAT sessions are to its own address {theirs}, this one's is {ours} (--self)"
        if (c.port_min, c.port_count) != (self.port_min, self.port_count):
            return (
                f"its LB ports are {c.port_min}-{c.port_min + c.port_count - 1}, this one's "
                f"{self.port_min}-{self.port_min + self.port_count - 1} (the host's ephemeral ports changed?)"
            )
        return None

    def _take_over_state(self):
        """After take_over_xdp(): the kept services, backends and Maglev tables read back,
        each kept service and backend keeping its id and index (its sessions name them),
        then this object's configuration written over them where it differs."""
        theirs_svc = {}
        for k, v in self.table("services").items():
            proto = next(n for n, p in PROTOS.items() if p == k.proto)
            theirs_svc[Service(proto, _addr(k.vip.a, k.family, zero_ok=True), socket.ntohs(k.port))] = v.id
        theirs_be = {}
        table = self.table("backends")
        for i in range(1, self.max_backends + 1):
            v = table[ctypes.c_int(i)]
            if v.live:
                theirs_be[Backend(_addr(v.addr.a, v.family, zero_ok=True), socket.ntohs(v.port))] = i
        # services: a kept one keeps its id; a new one takes an id no kept one had (a
        # removed service's sessions name its id: they must not become a new one's)
        ids = {svc: theirs_svc[svc] for svc in self._services if svc in theirs_svc}
        free = [i for i in range(self.max_services) if i not in theirs_svc.values()]
        free += [i for i in range(self.max_services) if i in theirs_svc.values() and i not in ids.values()]
        for svc in self._services:
            if svc not in ids:
                ids[svc] = free.pop(0)
        self._services = {svc: ids[svc] for svc in self._services}
        for svc in theirs_svc:
            if svc not in self._services:
                self._delete_service(svc)
        # backends: a kept one keeps its index; one no longer given stays, serving its sessions
        index = {be: theirs_be[be] for be in self._backends if be in theirs_be}
        spare = [i for i in range(1, self.max_backends + 1) if i not in theirs_be.values()]
        for be in self._backends:
            if be not in index:
                if not spare:
                    raise InputError(f"more than {self.max_backends} backends, the kept ones included")
                index[be] = spare.pop(0)
        for be, i in theirs_be.items():
            index.setdefault(be, i)
        self._backends = index
        self._write_conf()
        for be, i in self._backends.items():
            if be not in theirs_be:
                self._write_backend(be, i)
        for svc, sid in self._services.items():
            self._write_service(svc, sid)
            self._write_ring(svc)  # where the kept table differs

    def _delete_service(self, svc):
        self.table("services").pop(self._service_key(svc), None)
        if not any(s.vip == svc.vip for s in self._services):
            a = self.table("vip_addrs").Key()
            a.a = (ctypes.c_uint32 * 4)(*_words(svc.vip))
            self.table("vip_addrs").pop(a, None)

    # --- state ----------------------------------------------------------------------------
    def counters(self) -> dict:
        return self.percpu_totals("stats")

    def counter_rows(self) -> dict:
        """Per backend: packets and bytes sent to each."""
        return self.backend_counters() or {"total": self.counters()}

    def backend_counters(self) -> dict:
        return {str(b): self.percpu_totals("backend_stats", i) for b, i in self._backends.items()}

    def sweep(self) -> int:
        """Delete the sessions idle past their state's timeout, both directions
        (the program expires a session only when it next sees it), in one whole
        pass over the tables. Returns how many. A command line sweeps a part of
        the tables each second instead (sweep_step)."""
        gone = self._gone
        self.sweep_pass()
        return self._gone - gone

    def sweep_pass(self) -> dict:
        """A whole pass of sweep_step() from the tables' start: {backend: live sessions}."""
        if self._walks is not None and self._walks[0].fd == self.table("sessions").map_fd:
            for w in self._walks:
                w.restart()
            self._walk_at = 0
            ctypes.memset(self._walk_live, 0, ctypes.sizeof(self._walk_live))
        while (live := self.sweep_step()) is None:
            pass
        return live

    # entries a command's tick reads at most: 1M sessions in 16 ticks, 4 MB a tick
    SWEEP_BUDGET = 65536

    def sweep_step(self, budget=SWEEP_BUDGET) -> dict | None:
        """One part of a walk over the session tables: about `budget` entries read in
        batches (BPF_MAP_LOOKUP_BATCH) and looked at in C (native.c): the ones idle
        past their timeout deleted as sweep() does, the others counted per backend.
        Returns {"ADDR:PORT": live sessions} when this step ended a pass over both
        tables (the next step starts another), else None. What it costs a second
        grows with the budget, not with the sessions: idle sessions in a table of a
        million cost no core, and are seen within a pass."""
        if self._walks is None or self._walks[0].fd != self.table("sessions").map_fd:  # new maps: a new walk
            self._walks = [
                maps.HashWalk(self.table(t).map_fd, ctypes.sizeof(self.table(t).Key), ctypes.sizeof(self.table(t).Leaf))
                for t in ("sessions", "half_open")
            ]
            self._walk_at, self._walk_live = 0, (ctypes.c_uint64 * (self.max_backends + 1))()
        t = self.table(("sessions", "half_open")[self._walk_at])
        keys, values, n, end = self._walks[self._walk_at].step(budget)
        if n:
            expired = (ctypes.c_uint32 * n)()
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            gone = native.sessions_scan(self._scan_conf(t), values, n, now, self.max_backends, self._walk_live, expired)
            ks, vs = ctypes.sizeof(t.Key), ctypes.sizeof(t.Leaf)
            by_index = {i: b for b, i in self._backends.items()} if gone else {}
            for i in expired[:gone]:
                self._expire(t, t.Key.from_buffer_copy(keys, i * ks), t.Leaf.from_buffer_copy(values, i * vs), by_index)
        if not end:
            return None
        self._walk_at ^= 1
        if self._walk_at:  # the established table done: on to the half-open one
            return None
        live, self._walk_live = self._walk_live, (ctypes.c_uint64 * (self.max_backends + 1))()
        return {str(b): live[i] for b, i in self._backends.items() if live[i]}

    def _scan_conf(self, t) -> native.ScanConf:
        leaf = t.Leaf
        c = native.ScanConf(
            size=ctypes.sizeof(leaf),
            last_seen=leaf.last_seen.offset,
            backend=leaf.backend.offset,
            state=leaf.state.offset,
            closing=leaf.closing.offset,
            st_syn=ABI["LB_ST_SYN"],
            st_udp=ABI["LB_ST_UDP"],
            cl_fin=ABI["LB_CL_FIN"],
        )
        for i, k in enumerate(("syn", "established", "fin", "udp")):
            c.timeout[i] = int(self.timeouts[k] * 1e9)
        return c

    def _expire(self, t, k, v, by_index):
        """Delete one idle session (and, NAT, the reverse entries of its LB port)."""
        be = by_index.get(v.backend)
        if be is not None and self.mode == "nat":
            rk = self.table("reverse").Key()
            rk.backend.a = (ctypes.c_uint32 * 4)(*_words(be.addr))
            rk.bport, rk.lb_port, rk.proto, rk.family = (socket.htons(be.port), v.lb_port, k.proto, be.addr.version)
            for rt in ("reverse", "reverse_half"):
                try:
                    del self.table(rt)[rk]
                except KeyError:
                    pass
        try:
            del t[k]
            self._gone += 1
        except KeyError:
            pass

    def fill_sessions(self, n, service=None, batch=65536) -> int:
        """For benchmarks: n established sessions of `service` (the first by default) as a busy
        LB holds them, each of a distinct client (addresses in the key only: no packet carries
        them), spread over the hash and over the service's backends, last seen now, written in
        batches: what the tables cost at that size. DSR only (a NAT session holds an LB port
        and its reverse). Returns n; InputError, nothing written, when they do not fit."""
        if self.mode != "dsr":
            raise InputError("filling the session table: DSR only (a NAT session holds an LB port)")
        if not 0 <= n <= self.max_sessions:
            raise InputError(f"{n} sessions: more than the table holds (max_sessions {self.max_sessions})")
        svc = Service.parse(service) if service is not None else self.services[0]
        backs = sorted(self._backends[b] for b, w in self._weights.get(svc, {}).items() if w > 0)
        if not backs:
            raise InputError(f"filling the session table: service {svc} has no backend")
        t = self.table("sessions")
        sid, proto, now = self._services[svc], PROTOS[svc.proto], time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        size = min(batch, n) or 1
        keys, values = (t.Key * size)(), (t.Leaf * size)()
        for start in range(0, n, size):
            m = min(size, n - start)
            for j in range(m):
                i = start + j
                k, v = keys[j], values[j]
                # 50,000 ports a client address, the address's words as they are (not an
                # address of any lab: nothing is sent to it)
                k.client.a[0], k.cport, k.service, k.proto = 0x0A000000 + i // 50000, 1024 + i % 50000, sid, proto
                v.backend, v.state, v.last_seen = backs[i % len(backs)], 2, now
            count = ctypes.c_uint32(m)
            err = libbpf().bpf_map_update_batch(t.map_fd, keys, values, ctypes.byref(count), None)
            if err or count.value != m:
                raise InputError(f"filling the session table: {os.strerror(-err) if err else f'{count.value} of {m}'}")
        return n

    def session_count(self) -> int:
        """How many sessions the tables hold, half-open ones included, read in batches."""
        return sum(
            maps.count_hash(self.table(t).map_fd, ctypes.sizeof(self.table(t).Key), ctypes.sizeof(self.table(t).Leaf))
            for t in ("sessions", "half_open")
        )

    def sessions(self) -> list[dict]:
        """Every session in the tables, half-open ones included."""
        by_index = {i: b for b, i in self._backends.items()}
        by_id = {i: s for s, i in self._services.items()}
        out = []
        for table, half in (("sessions", False), ("half_open", True)):
            for k, v in self.table(table).items():
                fam = by_id[k.service].vip.version if k.service in by_id else 4
                raw = b"".join(int(w).to_bytes(4, "little") for w in k.client.a)
                client = ipaddress.ip_address(raw[:4] if fam == 4 else raw)
                out.append(
                    {
                        "service": str(by_id.get(k.service, k.service)),
                        "client": str(client),
                        "client_port": socket.ntohs(k.cport),
                        "backend": str(by_index.get(v.backend, v.backend)),
                        "lb_port": socket.ntohs(v.lb_port),
                        "state": STATES.get(v.state & 0x0F, v.state),
                        "fin": _fin(v),
                        "half_open": half,
                        "idle_s": max(0.0, time.clock_gettime(time.CLOCK_MONOTONIC) - v.last_seen / 1e9),
                    }
                )
        return out
