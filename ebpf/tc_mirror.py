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
"""

import ctypes
import ipaddress

from pyroute2.netlink.exceptions import NetlinkError

from .errors import AttachError, BpfError
from .program import BpfProgram
from . import tc

MATCH_MODES = {"src": (1, 0), "dst": (0, 1), "any": (1, 1)}
CLONE_MODES = ("action", "helper")
VTAP_F_MIRROR_ALL = 1  # vtap.h
FILTER_OWNER = "vtap"  # TC filter names start with this; `vtap --cleanup` looks for it


def parse_watch_list(cidrs):
    """CIDR strings -> ip_network objects; a clear error for the first bad one.

    >>> parse_watch_list(["198.18.0.0/24", "2001:2::1"])
    [IPv4Network('198.18.0.0/24'), IPv6Network('2001:2::1/128')]
    """
    nets = []
    for text in cidrs:
        try:
            nets.append(ipaddress.ip_network(text.strip(), strict=True))
        except ValueError as e:
            if "has host bits set" in str(e):
                fixed = ipaddress.ip_network(text.strip(), strict=False)
                raise BpfError(f"bad CIDR {text!r}: host bits set (did you mean {fixed}?)") from None
            raise BpfError(f"bad CIDR {text!r}: not an IPv4 or IPv6 address or network") from None
    return nets


class TcMirror(BpfProgram):
    """Clone frames whose source/destination is watched to a monitor interface."""

    SOURCE = "tc_mirror.bpf.c"
    FUNCTION = "tc_mirror"

    def __init__(self, monitor, watch=None, match="any", sample=1, netns=None,
                 watch_max=1024, clone="action", source=None, cflags=()):
        if match not in MATCH_MODES:
            raise BpfError(f"unknown match mode {match!r} (src, dst or any)")
        if clone not in CLONE_MODES:
            raise BpfError(f"unknown clone mode {clone!r} (action or helper)")
        src, dst = MATCH_MODES[match]
        super().__init__([f"-DVTAP_MATCH_SRC={src}", f"-DVTAP_MATCH_DST={dst}",
                          f"-DVTAP_WATCH_MAX={watch_max}",
                          f"-DVTAP_CLONE_BY_ACTION={int(clone == 'action')}", *cflags], source)
        self.netns = netns
        self.match = match
        self.clone = clone
        self._action_failed = 0  # mirred failures of filters detached since the last reset
        self.watch_max = watch_max
        self._watch = parse_watch_list(watch) if watch is not None else None  # None: mirror everything
        self._check_sample(sample)
        self._sample = sample
        self._monitor = None
        self._monitor_ifindex = 0
        self.monitor = monitor  # resolves the ifindex, so a bad name fails before any compile

    # --- configuration (live) -------------------------------------------------
    @property
    def monitor(self):
        return self._monitor

    @monitor.setter
    def monitor(self, ifname):
        with tc.ipr(self.netns) as ip:
            self._monitor_ifindex = tc.ifindex_of(ip, ifname, self.netns)
        if any(f.ifname == ifname for f in self.tc_filters):
            raise BpfError(f"monitor {ifname} is also a tapped interface (its own clones would loop)")
        self._monitor = ifname
        if self.bpf is not None:
            self._write_config()
        if self.clone == "action":
            fd = self.load(self.FUNCTION, "SCHED_CLS").fd if self.tc_filters else None
            for f in self.tc_filters:
                self._keep_action_failures(f)  # the replaced filter brings a new action, counting from 0
                tc.retarget(f, fd, self._monitor_ifindex)

    @staticmethod
    def _check_sample(n):
        if not isinstance(n, int) or n < 1:
            raise BpfError(f"sample rate must be an integer >= 1 (1 = every packet), not {n!r}")

    def set_sample(self, n: int):
        """Keep 1 in n matched packets (chosen at random per packet)."""
        self._check_sample(n)
        self._sample = n
        if self.bpf is not None:
            self._write_config()

    def set_watch(self, cidrs):
        """Replace the watch-list; None mirrors everything, [] mirrors nothing.
        New entries go in before old ones leave, so a prefix kept across the change
        is never unwatched for a moment."""
        nets = parse_watch_list(cidrs) if cidrs is not None else None
        for version in (4, 6):
            if nets is not None and sum(n.version == version for n in nets) > self.watch_max:
                raise BpfError(f"watch-list has more than {self.watch_max} IPv{version} entries")
        old = self._watch or []
        self._watch = nets
        if self.bpf is None:
            return
        for n in nets or []:
            self._trie(n)[self._key(n)] = ctypes.c_uint8(1)
        for n in old:
            if nets is None or n not in nets:
                try:
                    del self._trie(n)[self._key(n)]
                except KeyError:
                    pass
        self._write_config()

    @property
    def watch(self):
        return None if self._watch is None else [str(n) for n in self._watch]

    @property
    def sample(self):
        return self._sample

    def _trie(self, net):
        return self.table("watch_v4" if net.version == 4 else "watch_v6")

    def _key(self, net):
        table = self._trie(net)
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
        table[table.Key(0)] = value

    # --- attach / detach --------------------------------------------------------
    def load_program(self):
        """Compile, fill the maps and pass the verifier, before touching any hook.
        The maps are filled once, when the program is first compiled; after that
        set_watch()/set_sample()/monitor keep them current."""
        if self.bpf is None:
            self.compile()
            for n in self._watch or []:
                self._trie(n)[self._key(n)] = ctypes.c_uint8(1)
            self._write_config()
        return self.load(self.FUNCTION, "SCHED_CLS")

    def loop_peers(self):
        """Interfaces whose traffic includes our own clones: the far end of the
        monitor's veth pair when it is in this namespace too. Tapping it would clone
        the clones, a loop that runs at full speed until detached."""
        with tc.ipr(self.netns) as ip:
            return self._loop_peers(ip)

    def _loop_peers(self, ip):
        link = ip.get_links(self._monitor_ifindex)[0]
        info = link.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
        peer = link.get_attr("IFLA_LINK")
        if kind != "veth" or not peer or link.get_attr("IFLA_LINK_NETNSID") is not None:
            return set()
        found = ip.get_links(peer)
        return {found[0].get_attr("IFLA_IFNAME")} if found else set()

    def monitor_is_up(self):
        with tc.ipr(self.netns) as ip:
            found = ip.get_links(self._monitor_ifindex)
            return bool(found) and bool(found[0]["flags"] & 1)  # IFF_UP

    def check_iface(self, ifname):
        """Fail now, before anything is attached, if ifname cannot be tapped."""
        if ifname == self._monitor:
            raise BpfError(f"monitor {ifname} is also a tapped interface (its own clones would loop)")
        with tc.ipr(self.netns) as ip:
            tc.ifindex_of(ip, ifname, self.netns)
            looping = ifname in self._loop_peers(ip)
        if looping:
            raise BpfError(f"{ifname} is the other end of monitor {self._monitor}'s veth pair: "
                           "the clones would come back in and be cloned again")

    def attach(self, ifname, direction="ingress"):
        """Tap one interface; direction is ingress, egress or both."""
        self.check_iface(ifname)
        directions = tc.DIRECTIONS if direction == "both" else (direction,)
        for d in directions:
            if d not in tc.DIRECTIONS:
                raise BpfError(f"unknown direction {direction!r} (ingress, egress or both)")
        self.load_program()
        done = []
        try:
            for d in directions:
                done.append(self.attach_tc(self.FUNCTION, ifname, d, self.netns, FILTER_OWNER,
                                           self._monitor_ifindex if self.clone == "action" else 0))
        except (AttachError, NetlinkError):
            for f in done:
                self.detach_tc(f)
            raise
        return done

    def attach_many(self, ifnames, direction="ingress"):
        """Tap several interfaces, all or nothing: on any failure, what was
        attached by this call is detached again before the error is raised."""
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
        self._keep_action_failures(f)
        super().detach_tc(f)

    def _keep_action_failures(self, f):
        """Before a filter's mirred action goes away, keep what it failed to copy."""
        if f.mirror_ifindex:
            self._action_failed += tc.action_stats(f)["failed"] - f.failed_base
            f.failed_base = 0

    # --- counters ---------------------------------------------------------------
    def counters(self) -> dict:
        """Totals over all CPUs since load (or the last reset). On the action
        path the program counts what it handed to mirred as cloned; the copies
        mirred could not send are moved to failed here."""
        c = self.percpu_totals("stats")
        if self.clone == "action":
            failed = self._action_failed + sum(tc.action_stats(f)["failed"] - f.failed_base
                                               for f in self.tc_filters)
            c["cloned"] -= failed
            c["failed"] += failed
        return c

    def reset_counters(self):
        self.zero_percpu("stats")
        self._action_failed = 0
        for f in self.tc_filters:
            f.failed_base = tc.action_stats(f)["failed"] if f.mirror_ifindex else 0
