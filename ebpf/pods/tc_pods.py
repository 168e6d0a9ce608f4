"""TcPods: a pod datapath as Cilium's connects pods on a node (tc_pods.bpf.c).

    >>> node = TcPods(mode="native", netns="node-a")                             # doctest: +SKIP
    >>> node.add_pod("lxc1", ["198.18.100.1", "2001:2:100::1"], mac="02:00:00:00:01:01")
    >>> node.add_remote("198.18.101.0/24")      # another node's pods, routed by the FIB
    >>> node.attach_pod("lxc1"); node.attach_node("eth0")
    >>> node.counter_rows()                     # per pod: to pods here, to other nodes, to the host
    >>> node.add_service("198.18.200.10", 80, "tcp", ["198.18.100.1:8080", "198.18.101.1:8080"])
    >>> node.attach_services("/sys/fs/cgroup/unified/pods")   # connect()/sendmsg()/recvmsg() there

A pod is a network namespace whose eth0 is a veth; its other end, in the node's
namespace, is where pods_from_pod runs (TC ingress). pods_from_node runs on the
uplink and, in tunnel mode, on the collect-metadata VXLAN device (tunnel=), whose
frames for a pod here go into it. Each pod gets a row of counters (its slot);
row 0 is the node's: frames for no pod of this node.

Services: an address, port and protocol that stand for backends (any addresses:
pods here, on other nodes, or anywhere routed), each service's backends spread
over a Maglev table (ebpf/lb/maglev.py). A socket in a cgroup that
attach_services() attached to gets a backend at connect() or sendmsg(), once; a
packet from any other socket of a pod is translated on its way out of the pod's
veth, and its replies translated back before they go into the pod.
"""

import collections
import ctypes
import ipaddress
import socket

from ebpf import netdev
from ebpf.abi import defines
from ebpf.errors import InputError
from ebpf.program import BpfProgram

ABI = defines("pods/tc_pods.h")
MODES = {"native": ABI["PODS_MODE_NATIVE"], "tunnel": ABI["PODS_MODE_TUNNEL"]}
SLOTS = ABI["PODS_SLOTS"]
# the defaults of max_services, max_entries (service-backend entries) and max_backends
SVC_MAX, ENTRIES_MAX, BACKENDS_MAX = ABI["PODS_SVC_MAX"], ABI["PODS_SVC_ENTRIES_MAX"], ABI["PODS_BACKENDS_MAX"]
PROTOS = {"tcp": 6, "udp": 17}
# the cgroup programs: (function, its hook)
SOCKET_HOOKS = (
    ("pods_conn4", "CGROUP_INET4_CONNECT"),
    ("pods_conn6", "CGROUP_INET6_CONNECT"),
    ("pods_send4", "CGROUP_UDP4_SENDMSG"),
    ("pods_send6", "CGROUP_UDP6_SENDMSG"),
    ("pods_recv4", "CGROUP_UDP4_RECVMSG"),
    ("pods_recv6", "CGROUP_UDP6_RECVMSG"),
)


def parse_endpoint(text, what="backend"):
    """ "ADDR:PORT" or "[V6ADDR]:PORT" (or an (addr, port) pair) -> (ip_address, port)."""
    if isinstance(text, (tuple, list)):
        addr, port = text
    else:
        s = str(text).strip()
        if s.startswith("["):
            addr, sep, port = s[1:].partition("]:")
        else:
            addr, sep, port = s.rpartition(":")
        if not sep:
            raise InputError(f"bad {what} {text!r}: want ADDR:PORT or [IPV6]:PORT")
    try:
        a = ipaddress.ip_address(str(addr))
        n = int(port)
    except ValueError:
        raise InputError(f"bad {what} {text!r}: want ADDR:PORT or [IPV6]:PORT") from None
    if not 0 < n < 65536:
        raise InputError(f"bad {what} {text!r}: port {n} is outside 1..65535")
    return a, n


def _words(addr) -> list[int]:
    packed = addr.packed + bytes(16 - len(addr.packed))
    return [int.from_bytes(packed[i : i + 4], "little") for i in range(0, 16, 4)]


def _mac(text) -> bytes:
    try:
        raw = bytes.fromhex(str(text).replace(":", ""))
    except ValueError:
        raw = b""
    if len(raw) != 6:
        raise InputError(f"bad MAC address {text!r}: want six bytes, e.g. 02:00:00:00:01:01")
    return raw


def _endpoint_text(b) -> str:
    a, port = b
    return f"[{a}]:{port}" if a.version == 6 else f"{a}:{port}"


def check_services(services, max_services=SVC_MAX, max_entries=ENTRIES_MAX, max_backends=BACKENDS_MAX):
    """InputError when the set `services` [(address, port, proto, backends)] would take
    more services, service-backend entries or backends than maps of these sizes hold."""
    keys, entries, backends = set(), 0, set()
    for address, port, proto, backs in services:
        addr, port = parse_endpoint((address, port), "service")
        bs = {parse_endpoint(b) for b in backs}
        keys.add((addr, port, proto))
        entries += len(bs)
        backends |= bs
    refuse_past_limits(len(keys), entries, len(backends), max_services, max_entries, max_backends)


def refuse_past_limits(services, entries, backends, max_services, max_entries, max_backends):
    for n, top, what, where in (
        (services, max_services, "services", "max_services, --max-services"),
        (entries, max_entries, "service-backend entries", "max_entries, --max-entries"),
        (backends, max_backends, "backends", "max_backends, --max-backends"),
    ):
        if n > top:
            raise InputError(f"{n} {what}, more than {top} ({where}): nothing changed")


class TcPods(BpfProgram):
    SOURCE = "tc_pods.bpf.c"
    FUNCTION = "pods_from_pod"
    ROWS = "pod"
    MAIN_COUNTERS = ("seen", "local_pod", "remote_pod", "tunneled", "unmatched", "redirect", "pass")
    VERDICTS = ("redirect", "pass", "drop")
    REASONS = (
        "local_pod",
        "remote_pod",
        "tunneled",
        "unmatched",
        "ttl_expired",
        "too_big",
        "no_route",
        "not_forwarded",
        "no_backend",
        "vlan",
        "not_ip",
        "malformed",
    )

    def __init__(
        self,
        mode="native",
        tunnel=None,
        vni=1,
        netns=None,
        redirect="peer",
        source=None,
        cflags=(),
        max_services=None,
        max_entries=None,
        max_backends=None,
    ):
        """redirect: "peer" (bpf_redirect_peer(), Cilium's with BPF host routing) or
        "plain" (bpf_redirect() out of the pod's veth: the baseline of the commit that
        added the peer redirect). max_services, max_entries (service-backend entries: a
        service with 3 backends takes 3) and max_backends (distinct backends of all
        services): the sizes of the service maps, fixed when the program is made."""
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r} (native or tunnel)")
        if redirect not in ("peer", "plain"):
            raise InputError(f"redirect is peer or plain, not {redirect!r}")
        if redirect == "plain":
            cflags = [*cflags, "-DPODS_PLAIN_REDIRECT"]
        if (mode == "tunnel") != (tunnel is not None):
            raise InputError("tunnel mode needs the VXLAN device (tunnel=), and only it")
        if not 0 < int(vni) < 2**24:
            raise InputError(f"VNI {vni} is outside 1..16777215")
        self.max_services = max_services or SVC_MAX
        self.max_entries = max_entries or ENTRIES_MAX
        self.max_backends = max_backends or BACKENDS_MAX
        if min(self.max_services, self.max_entries, self.max_backends) < 1:
            raise InputError("service map sizes must be at least 1")
        cflags = [
            f"-DPODS_SVC_MAX={self.max_services}",
            f"-DPODS_SVC_ENTRIES_MAX={self.max_entries}",
            f"-DPODS_BACKENDS_MAX={self.max_backends}",
            *cflags,
        ]
        super().__init__(list(cflags), source)
        self.mode, self.netns, self.vni = mode, netns, int(vni)
        self.tunnel, self.tunnel_ifindex = tunnel, 0
        self._pods = {}  # host-side veth name -> (slot, ifindex, [addresses], pod MAC, its veth's MAC)
        self._retired = {}  # counters of pods removed, so that the totals never go back
        self._remote = {}  # prefix -> node address or None
        self._services = {}  # (address, port, proto number) -> (id, [(backend address, port)])
        # ids and backend indexes: never-used ones first, then freed ones oldest first, so that
        # a packet that read a service or backend just before it went never finds another there
        self._next_sid, self._free_sids = 0, collections.deque()
        self._bindex = {}  # (backend address, port) -> [index, services that name it]
        self._next_bidx, self._free_bidx = 0, collections.deque()
        self._entries = 0  # service-backend entries in all
        with netdev.ipr(netns) as ip:  # a namespace or tunnel device that is not there fails now, in one line
            if tunnel is not None:
                self.tunnel_ifindex = netdev.ifindex_of(ip, tunnel, netns)

    # --- configuration --------------------------------------------------------------------
    @property
    def pods(self) -> dict:
        """{host-side veth: [its pod's addresses]}"""
        return {name: list(p[2]) for name, p in self._pods.items()}

    def pod_ifindex(self, ifname) -> int | None:
        """The ifindex of the veth a pod was added behind (None: no such pod)."""
        p = self._pods.get(ifname)
        return p[1] if p else None

    def maps_created(self):
        c = self.table("conf")[ctypes.c_int(0)]
        c.mode, c.tunnel_ifindex, c.vni = MODES[self.mode], self.tunnel_ifindex, self.vni
        self.table("conf")[ctypes.c_int(0)] = c
        for name in self._pods:
            self._write_pod(name)
        for prefix, node in self._remote.items():
            self._write_remote(prefix, node)
        self._write_services()

    def add_pod(self, ifname, addrs, mac):
        """A pod behind its host-side veth `ifname` (in this object's namespace): its
        addresses (one per family, or more) and its own interface's MAC. Frames to
        them go into the pod from here on; its counters get a row."""
        parsed = []
        for a in [addrs] if isinstance(addrs, str) else addrs:
            try:
                parsed.append(ipaddress.ip_address(str(a)))
            except ValueError:
                raise InputError(f"pod behind {ifname}: bad address {a!r}") from None
        pod_mac = _mac(mac)
        with netdev.ipr(self.netns) as ip:
            ifindex = netdev.ifindex_of(ip, ifname, self.netns)
            link = ip.get_links(ifindex)[0]
            node_mac = _mac(link.get_attr("IFLA_ADDRESS"))
        if ifname in self._pods:  # again: new addresses, or a new veth of the same name
            slot = self._pods[ifname][0]
            if self.bpf is not None:
                self._forget_addresses(ifname)
                self.table("lxc").pop(ctypes.c_uint32(self._pods[ifname][1]), None)
        else:
            used = {p[0] for p in self._pods.values()}
            free = [s for s in range(1, SLOTS) if s not in used]
            if not free:
                raise InputError(f"more than {SLOTS - 1} pods on one node")
            slot = free[0]
        self._pods[ifname] = (slot, ifindex, parsed, pod_mac, node_mac)
        if self.bpf is not None:
            self._write_pod(ifname)
        return slot

    def remove_pod(self, ifname):
        """Forget a pod: no frame goes to its veth from here on (a stale interface
        gets nothing), and its row of counters is zeroed for the next pod."""
        if ifname not in self._pods:
            return
        slot = self._pods[ifname][0]
        if self.bpf is not None:
            self._forget_addresses(ifname)
            self.table("lxc").pop(ctypes.c_uint32(self._pods[ifname][1]), None)
            for k, v in self.percpu_totals("stats", slot).items():
                self._retired[k] = self._retired.get(k, 0) + v
            self.zero_percpu("stats", slot)
        del self._pods[ifname]

    def _addr_key(self, addr):
        k = self.table("endpoints").Key()
        k.a = (ctypes.c_uint32 * 4)(*_words(addr))
        k.family = addr.version
        return k

    def _forget_addresses(self, ifname):
        for addr in self._pods[ifname][2]:
            self.table("endpoints").pop(self._addr_key(addr), None)

    def _write_pod(self, ifname):
        slot, ifindex, addrs, pod_mac, node_mac = self._pods[ifname]
        ep = self.table("endpoints").Leaf()
        ep.ifindex, ep.slot = ifindex, slot
        ep.mac = (ctypes.c_ubyte * 6)(*pod_mac)
        ep.node_mac = (ctypes.c_ubyte * 6)(*node_mac)
        self.table("lxc")[ctypes.c_uint32(ifindex)] = ctypes.c_uint32(slot)
        for addr in addrs:
            self.table("endpoints")[self._addr_key(addr)] = ep

    def add_remote(self, prefix, node=None):
        """Another node's pod prefix. Native mode: the FIB finds the way (node is
        not needed); tunnel mode: `node` is that node's underlay address."""
        try:
            net = ipaddress.ip_network(str(prefix), strict=True)
        except ValueError as e:
            raise InputError(f"bad pod prefix {prefix!r}: {e}") from None
        peer = None
        if self.mode == "tunnel":
            if node is None:
                raise InputError(f"pod prefix {net}: tunnel mode needs the address of the node that holds it")
            try:
                peer = ipaddress.ip_address(str(node))
            except ValueError:
                raise InputError(f"pod prefix {net}: bad node address {node!r}") from None
        self._remote[net] = peer
        if self.bpf is not None:
            self._write_remote(net, peer)

    def remove_remote(self, prefix):
        net = ipaddress.ip_network(str(prefix), strict=True)
        self._remote.pop(net, None)
        if self.bpf is not None:
            self.table("remote").pop(self._prefix_key(net), None)

    def _prefix_key(self, net):
        k = self.table("remote").Key()
        k.prefixlen = 32 + net.prefixlen
        k.family = net.version
        k.a = (ctypes.c_uint32 * 4)(*_words(net.network_address))
        return k

    def _write_remote(self, net, node):
        v = self.table("remote").Leaf()
        if node is not None:
            v.a = (ctypes.c_uint32 * 4)(*_words(node))
            v.family = node.version
        self.table("remote")[self._prefix_key(net)] = v

    # --- services -------------------------------------------------------------------------
    @property
    def services(self) -> dict:
        """{(address, port, "tcp"|"udp"): ["addr:port" of each backend]}"""
        names = {v: k for k, v in PROTOS.items()}
        return {
            (str(a), port, names[proto]): [_endpoint_text(b) for b in backs]
            for (a, port, proto), (_, backs) in self._services.items()
        }

    def add_service(self, address, port, proto="tcp", backends=()):
        """A service (address, port, "tcp" or "udp") and its backends ("ADDR:PORT"
        each, the service's family; none: the service refuses). Again with the same
        service: its backends replaced (flows already translated keep theirs)."""
        if proto not in PROTOS:
            raise InputError(f"service protocol {proto!r}: tcp or udp")
        addr, port = parse_endpoint((address, port), "service")
        backs = sorted({parse_endpoint(b) for b in backends}, key=lambda b: (b[0].version, b[0], b[1]))
        wrong = [_endpoint_text(b) for b in backs if b[0].version != addr.version]
        if wrong:
            raise InputError(
                f"service {_endpoint_text((addr, port))}: backends of the other family ({', '.join(wrong)})"
            )
        key = (addr, port, PROTOS[proto])
        old = self._services.get(key)
        if old is not None and old[1] == backs:
            return  # as it is: nothing written
        self._check_room(key, backs)
        sid = old[0] if old is not None else self._take(self.max_services, "_next_sid", self._free_sids)
        before, kept = (old[1] if old else []), set(backs)
        late = before
        if sum(b not in self._bindex for b in kept) > self.max_backends - self._next_bidx + len(self._free_bidx):
            # at the limit: the ones it drops make room first (their slots, read meanwhile,
            # find a backend of the new set in their place)
            for b in [b for b in before if b not in kept]:
                self._release(b)
            late = [b for b in before if b in kept]
        for b in backs:  # counted before the old ones are let go: one kept is never freed
            if b not in self._bindex:
                self._bindex[b] = [self._take(self.max_backends, "_next_bidx", self._free_bidx), 0]
                if self.bpf is not None:
                    self._write_backend(b)
            self._bindex[b][1] += 1
        self._services[key] = (sid, backs)
        self._entries += len(backs) - (len(old[1]) if old else 0)
        if self.bpf is not None:
            self._write_service(key, before)
        for b in late:
            self._release(b)

    def _take(self, top, counter, freed) -> int:
        """An id or index: one never used while there are (below `top`), else the
        longest freed."""
        n = getattr(self, counter)
        if n < top:
            setattr(self, counter, n + 1)
            return n
        return freed.popleft()

    def _check_room(self, key, backs):
        """InputError, nothing changed, when the service `key` with backends `backs` would
        take more services, service-backend entries or backends than the maps hold."""
        old = self._services[key][1] if key in self._services else []
        services = len(self._services) + (key not in self._services)
        entries = self._entries - len(old) + len(backs)
        kept = set(backs)
        backends = (
            len(self._bindex)
            + sum(b not in self._bindex for b in kept)
            - sum(self._bindex[b][1] == 1 and b not in kept for b in old)
        )
        self._refuse_past_limits(services, entries, backends)

    def check_services(self, services):
        """InputError when the set `services` [(address, port, proto, backends)], as the
        services file gives it, would not fit the maps in place of the services now: checked
        whole before any is changed."""
        check_services(services, self.max_services, self.max_entries, self.max_backends)

    def _refuse_past_limits(self, services, entries, backends):
        refuse_past_limits(services, entries, backends, self.max_services, self.max_entries, self.max_backends)

    def _release(self, b):
        """One service fewer names backend b: at none, its index is free (its entry stays
        until the index is taken again, so a packet that just read it finds it)."""
        entry = self._bindex[b]
        entry[1] -= 1
        if entry[1] == 0:
            del self._bindex[b]
            self._free_bidx.append(entry[0])

    def remove_service(self, address, port, proto="tcp"):
        addr, port = parse_endpoint((address, port), "service")
        key = (addr, port, PROTOS.get(proto))
        gone = self._services.pop(key, None)
        if gone is None:
            return
        sid, backs = gone
        if self.bpf is not None:
            self.table("services").pop(self._svc_key(*key), None)  # first: no new flow finds it
            slots = self.table("svc_slots")
            for i in range(len(backs)):
                slots.pop(self._slot_key(sid, i), None)
        self._free_sids.append(sid)
        self._entries -= len(backs)
        for b in backs:
            self._release(b)

    def _svc_key(self, addr, port, proto):
        k = self.table("services").Key()
        k.a = (ctypes.c_uint32 * 4)(*_words(addr))
        k.port = socket.htons(port)
        k.proto, k.family = proto, addr.version
        return k

    def _slot_key(self, sid, slot):
        k = self.table("svc_slots").Key()
        k.id, k.slot = sid, slot
        return k

    def _write_backend(self, b):
        v = self.table("backends").Leaf()
        v.a = (ctypes.c_uint32 * 4)(*_words(b[0]))
        v.port, v.family = socket.htons(b[1]), b[0].version
        self.table("backends")[ctypes.c_uint32(self._bindex[b][0])] = v

    def _write_service(self, key, before):
        """A service's slots, then its entry (its count), then the slots it no longer
        has: a packet meanwhile finds a backend of the old set or the new one (a slot
        past a shrunk count falls back to slot 0, which stays while it has any)."""
        sid, backs = self._services[key]
        slots = self.table("svc_slots")
        for i, b in enumerate(backs):
            slots[self._slot_key(sid, i)] = ctypes.c_uint32(self._bindex[b][0])
        v = self.table("services").Leaf()
        v.id, v.count = sid, len(backs)
        self.table("services")[self._svc_key(*key)] = v
        for i in range(len(backs), len(before)):
            slots.pop(self._slot_key(sid, i), None)

    def _write_services(self):
        """Every backend, slot and service, as the maps are made (the maps are empty)."""
        for b in self._bindex:
            self._write_backend(b)
        for key in self._services:
            self._write_service(key, [])

    def attach_services(self, cgroup_path):
        """Services at connect(), sendmsg() and recvmsg() for the sockets of the
        processes in the cgroup v2 directory `cgroup_path` (and its children)."""
        return [self.attach_cgroup(f, cgroup_path, hook) for f, hook in SOCKET_HOOKS]

    def service_counters(self) -> dict:
        """connect, sendmsg, recvmsg, refused (the cgroup programs); to_backend,
        to_client (per packet, all pods)."""
        out = self.percpu_totals("sock_stats", 0)
        total = self.counters()
        out["to_backend"], out["to_client"] = total.get("to_backend", 0), total.get("to_client", 0)
        return out

    # --- attach ---------------------------------------------------------------------------
    def load_program(self):
        self.load("pods_from_node", "SCHED_CLS")
        return self.load(self.FUNCTION, "SCHED_CLS")

    def attach_pod(self, ifname):
        """What the pod behind `ifname` sends (TC ingress of its host-side veth)."""
        if ifname not in self._pods:
            raise InputError(f"{ifname}: no pod added behind it (add_pod first)")
        return self.attach_tc(self.FUNCTION, ifname, "ingress", self.netns, owner="pods")

    def attach_node(self, ifname):
        """What reaches the node from outside: the uplink, and the VXLAN device."""
        return self.attach_tc("pods_from_node", ifname, "ingress", self.netns, owner="pods")

    # --- counters -------------------------------------------------------------------------
    def counters(self) -> dict:
        """Every row summed, the rows of pods since removed included."""
        total = dict(self._retired)
        for slot in [0, *(p[0] for p in self._pods.values())]:
            for k, v in self.percpu_totals("stats", slot).items():
                total[k] = total.get(k, 0) + v
        return total

    def counter_rows(self) -> dict:
        """Per pod (its host-side veth), and "node" for frames of no pod here."""
        rows = {"node": self.percpu_totals("stats", 0)}
        for name, p in self._pods.items():
            rows[name] = self.percpu_totals("stats", p[0])
        return rows
