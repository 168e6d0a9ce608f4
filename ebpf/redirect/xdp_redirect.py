"""XdpRedirect: the destination rewrite at the XDP hook (xdp_redirect.bpf.c).

    >>> with XdpRedirect(["udp:198.18.1.17:8080=198.18.2.2:8083"], action="forward") as r:  # doctest: +SKIP
    ...     r.attach("eth0")                   # where the clients' datagrams arrive
    ...     r.attach("eth1")                   # where the backend's replies arrive
    ...     r.add_rule("tcp:[2001:2::17]:80=[2001:2:0:2::2]:8080")   # live: no reload
    ...     r.counters(), r.rule_counters()

A rule maps a service (protocol, address, port) to a backend (address, port);
the backend's replies leave with the service's address and port as their source,
so a client's connected socket accepts them. Rules live in BPF maps and change
while attached. The action (pass: the kernel routes the rewritten packet;
forward: the program does, see the C file) is compiled in.
"""

import contextlib
import ctypes
import ipaddress
import re
import socket
from dataclasses import dataclass

from pyroute2.netlink.exceptions import NetlinkError

from ebpf import endpoints, netdev
from ebpf.abi import defines
from ebpf.errors import InputError
from ebpf.program import BpfProgram

ABI = defines("redirect/xdp_redirect.h")
MAX_RULES = ABI["REDIRECT_MAX_RULES"]
EGRESS_SLOTS = ABI["REDIRECT_EGRESS_SLOTS"]
ACTIONS = {"pass": ABI["REDIRECT_ACTION_PASS"], "forward": ABI["REDIRECT_ACTION_FORWARD"]}
PROTOS = {"udp": socket.IPPROTO_UDP, "tcp": socket.IPPROTO_TCP}


@dataclass(frozen=True)
class Rule:
    proto: str  # "udp" or "tcp"
    vip: ipaddress._BaseAddress  # the service's address
    vport: int
    backend: ipaddress._BaseAddress
    bport: int

    def __str__(self):
        return f"{self.proto}:{endpoints.text(self.vip, self.vport)}={endpoints.text(self.backend, self.bport)}"

    @classmethod
    def parse(cls, text):
        """PROTO:VIP:PORT=BACKEND:PORT, IPv6 addresses in brackets.

        >>> str(Rule.parse("udp:[2001:2::17]:8080=[2001:2:0:1::2]:8083"))
        'udp:[2001:2::17]:8080=[2001:2:0:1::2]:8083'
        """
        if isinstance(text, Rule):
            return text
        m = re.fullmatch(rf"{endpoints.SERVICE}={endpoints.ENDPOINT}", text.strip())
        if not m:
            raise InputError(
                f"bad rule {text!r}: want PROTO:VIP:PORT=BACKEND:PORT, PROTO udp or tcp, IPv6 addresses "
                "in brackets (udp:[2001:2::17]:8080=[2001:2:0:1::2]:8083)"
            )
        proto, vip, vport, backend, bport = m.groups()
        vip, vport = endpoints.checked(vip, vport, "rule", text)
        addr, bport = endpoints.checked(backend, bport, "rule", text)
        if vip.version != addr.version:
            raise InputError(
                f"bad rule {text!r}: an IPv{vip.version} service cannot have an "
                f"IPv{addr.version} backend (the program rewrites addresses, not families)"
            )
        return cls(proto, vip, vport, addr, bport)

    @property
    def family(self):
        return self.vip.version


def check_rules(rules):
    """Refuse what the maps cannot hold: one service twice (which backend?), one
    backend twice (its replies would match two services)."""
    services, backends = {}, {}
    for r in rules:
        s, b = (r.proto, r.vip, r.vport), (r.proto, r.backend, r.bport)
        if s in services:
            raise InputError(f"two rules for {r.proto}:{r.vip}:{r.vport} ({services[s]} and {r})")
        if b in backends:
            raise InputError(
                f"two rules send to backend {r.proto}:{r.backend}:{r.bport} ({backends[b]} and {r}): "
                "its replies could not be given back to the right service"
            )
        services[s], backends[b] = r, r
    if len(services) > MAX_RULES:
        raise InputError(f"{len(services)} rules, more than the {MAX_RULES} the maps hold")


class XdpRedirect(BpfProgram):
    """Rewrite datagrams to a service so that they reach its backend, and back."""

    SOURCE = "xdp_redirect.bpf.c"
    FUNCTION = "xdp_redirect"
    ROWS = "rule"
    MAIN_COUNTERS = ("seen", "to_backend", "to_client", "unmatched", "malformed")
    VERDICTS = ("pass", "redirect", "drop", "aborted")
    REASONS = ("to_backend", "to_client", "not_ip", "unmatched", "fragment", "malformed")
    DROPS = ("malformed",)  # the segment the IP header claims is not all in the frame

    def __init__(self, rules=(), action="pass", netns=None, source=None, cflags=()):
        if action not in ACTIONS:
            raise InputError(f"unknown action {action!r} (pass or forward)")
        self._rules = {}  # Rule -> its index in rule_stats
        parsed = [Rule.parse(r) for r in rules]
        check_rules(parsed)
        super().__init__([f"-DREDIRECT_ACTION={ACTIONS[action]}", *cflags], source)
        self.action, self.netns = action, netns
        # rules whose replies this program leaves alone: another hook gives them
        # the service's address (lab/fastpaths/redirect/command.py: after routing, at TC egress)
        self.replies_elsewhere = set()
        if netns:
            with netdev.ipr(netns):  # a namespace that does not exist fails now, in one line
                pass
        for r in parsed:
            self._rules[r] = len(self._rules)

    # --- rules (live) ----------------------------------------------------------------
    @property
    def rules(self):
        return list(self._rules)

    def add_rule(self, rule):
        r = Rule.parse(rule)
        check_rules([*self._rules, r])
        index = min(set(range(MAX_RULES)) - set(self._rules.values()))
        self._rules[r] = index
        if self.bpf is not None:
            self.zero_percpu("rule_stats", index)
            self._write(r, index)
        return r

    def remove_rule(self, rule):
        r = Rule.parse(rule)
        if r not in self._rules:
            raise InputError(f"no rule {r}")
        index = self._rules.pop(r)
        if self.bpf is not None:
            for table, key in (("rules", self._key(r, r.vip, r.vport)), ("replies", self._key(r, r.backend, r.bport))):
                try:
                    del self.table(table)[key]
                except KeyError:
                    pass
            self.zero_percpu("rule_stats", index)

    def _key(self, rule, addr, port):
        key = self.table("rules").Key()
        packed = addr.packed
        key.addr = (ctypes.c_uint32 * 4)(
            *[int.from_bytes(packed[i : i + 4], "little") for i in range(0, len(packed), 4)]
        )
        key.port = socket.htons(port)
        key.proto = PROTOS[rule.proto]
        key.family = rule.family
        return key

    def _target(self, rule, addr, port, index):
        leaf = self.table("rules").Leaf()
        packed = addr.packed
        leaf.addr = (ctypes.c_uint32 * 4)(
            *[int.from_bytes(packed[i : i + 4], "little") for i in range(0, len(packed), 4)]
        )
        leaf.port = socket.htons(port)
        leaf.rule = index
        return leaf

    def _write(self, r, index):
        """Reply mapping first: a backend's reply to the first rewritten datagram
        must find it."""
        if r not in self.replies_elsewhere:
            self.table("replies")[self._key(r, r.backend, r.bport)] = self._target(r, r.vip, r.vport, index)
        self.table("rules")[self._key(r, r.vip, r.vport)] = self._target(r, r.backend, r.bport, index)

    def leave_replies(self, rule):
        """Leave this rule's replies untouched here (another hook translates
        them); before the program is loaded, or live."""
        r = Rule.parse(rule)
        if r not in self._rules:
            raise InputError(f"no rule {r}")
        self.replies_elsewhere.add(r)
        if self.bpf is not None:
            try:
                del self.table("replies")[self._key(r, r.backend, r.bport)]
            except KeyError:
                pass

    def maps_created(self):
        for r, index in self._rules.items():
            self._write(r, index)

    # --- attach ------------------------------------------------------------------
    def load_program(self):
        """Compile, fill the maps and pass the verifier, before touching any hook."""
        return self.load(self.FUNCTION, "XDP")

    def attach(self, ifname, mode="native"):
        """Attach where clients' datagrams or backends' replies arrive. With
        forward, also let the program send out of every interface the namespace
        has (the egress devmap)."""
        a = self.attach_xdp(self.FUNCTION, ifname, self.netns, mode)
        if self.action == "forward":
            self._fill_egress()
        return a

    def _fill_egress(self):
        """The kernel resolves a devmap entry's ifindex in the namespace of the
        process that writes it: written from elsewhere, index 3 would be some
        other namespace's device (seen: every redirect failed, EOPNOTSUPP, into a
        root-namespace interface). So the entries are written from inside."""
        egress = self.table("egress")
        with netdev.ipr(self.netns) as ip:
            indexes = [d.index for d in netdev.devices(ip).values() if d.name != "lo" and d.index < EGRESS_SLOTS]
        with netdev.entered(self.netns) if self.netns else contextlib.nullcontext():
            for index in indexes:
                egress[ctypes.c_int(index)] = ctypes.c_int(index)

    def reply_interfaces(self):
        """The interfaces the backends are reached through (a route lookup per
        backend): where their replies arrive, and so where the program must be
        attached too. {ifname: [backends]}"""
        found = {}
        with netdev.ipr(self.netns) as ip:
            devs = netdev.devices(ip)
            for r in self._rules:
                try:
                    oif = ip.route("get", dst=str(r.backend))[0].get_attr("RTA_OIF")
                except NetlinkError as e:  # its str() is a tuple: (101, 'Network is unreachable')
                    raise InputError(f"no route to backend {r.backend} ({netdev.netlink_reason(e)})") from None
                found.setdefault(devs[oif].name, []).append(str(r.backend))
        return found

    # --- counters --------------------------------------------------------------------
    def counters(self) -> dict:
        """Verdicts and reasons, over all CPUs, since load (or the last reset)."""
        return self.percpu_totals("stats")

    def rule_counters(self) -> dict:
        """{rule text: packets, bytes, reply_packets, reply_bytes}."""
        return {str(r): self.percpu_totals("rule_stats", i) for r, i in self._rules.items()}

    def counter_rows(self) -> dict:
        """Per rule: packets and bytes rewritten each way."""
        return self.rule_counters() or {"total": self.counters()}

    def reset_counters(self):
        self.zero_percpu("stats")
        for i in self._rules.values():
            self.zero_percpu("rule_stats", i)
