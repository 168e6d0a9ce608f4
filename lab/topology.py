"""Declarative namespace testbeds, built with pyroute2 and always torn down.

    >>> topo = Topology("demo")                                   # doctest: +SKIP
    >>> topo.add_host("a"); topo.add_host("b")
    >>> topo.add_link("a", "b")                                   # 198.18.1.1/24 <-> .2, 2001:2:0:1::1/64 <-> ::2
    >>> with topo:                                                # build; teardown even on Ctrl-C
    ...     topo.run("a", ["ping", "-c1", topo.addr("b", "eth0")])

Hosts are network namespaces named "vtl-<run id>-<host>"; the run id is fresh for
every Topology, so two runs never collide. Links are veth pairs created directly
between two lab namespaces: no interface, address or route ever exists in the root
namespace, not even for a moment. Addresses default to the benchmarking ranges
198.18.0.0/15 and 2001:2::/48. Neighbour entries are filled in statically for every
address on the same L2 segment, so no ARP/ND traffic disturbs packet counts.
"""

import atexit
import ipaddress
import os
import time
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from pyroute2.netlink.exceptions import NetlinkError

from ebpf import netdev

from . import netns, runs
from .netns import LabError

V4_POOL = ipaddress.ip_network("198.18.0.0/15")
V6_POOL = ipaddress.ip_network("2001:2::/48")
HOST_SYSCTLS = {
    # Quiet IPv6: no DAD delay before addresses work, no router solicitations.
    "net.ipv6.conf.default.accept_dad": 0,
    "net.ipv6.conf.all.accept_dad": 0,
    "net.ipv6.conf.default.router_solicitations": 0,
    "net.ipv6.conf.all.router_solicitations": 0,
    "net.ipv6.conf.default.accept_ra": 0,
    # MLD reports for new addresses go out at a random moment within this many
    # ms (default 1000, repeated): at 1 they leave during the build, not in the
    # middle of a test's exact count. MLDv1, because its repeat is a per-group
    # timer the kernel shows (/proc/net/igmp6), so the build can wait until every
    # report is out; MLDv2's repeats are not shown, and one went out up to 40 ms
    # after the build, into a count (an iperf3 test, 1 run in 15).
    "net.ipv6.conf.default.mldv1_unsolicited_report_interval": 1,
    "net.ipv6.conf.default.mldv2_unsolicited_report_interval": 1,
    "net.ipv6.conf.all.force_mld_version": 1,
    "net.ipv6.conf.default.force_mld_version": 1,
    # The same for IPv4's IGMP: a bridge joins 224.0.0.106 (multicast router discovery,
    # for its snooping) and reported it up to a second after Testbed 2's build, a
    # 54-byte frame out of every port, into the receiver's exact count (19973 of 19972,
    # once the programs no longer took a second to compile). IGMPv2 for the same reason
    # as MLDv1: its repeat is a per-group timer that /proc/net/igmp shows.
    "net.ipv4.conf.all.force_igmp_version": 2,
    "net.ipv4.conf.default.force_igmp_version": 2,
    "net.ipv4.conf.default.igmpv2_unsolicited_report_interval": 1,
    "net.ipv4.conf.default.igmpv3_unsolicited_report_interval": 1,
}
MAF_TIMER_RUNNING = 0x01  # a group of /proc/net/igmp6 whose report is still to be sent


@dataclass
class Iface:
    host: str
    name: str
    addrs: list = field(default_factory=list)  # ipaddress.ip_interface
    mtu: int = 1500
    mac: str | None = None
    ifindex: int | None = None


@dataclass
class Host:
    name: str
    ns: str
    forwarding: bool = False
    sysctls: dict = field(default_factory=dict)
    ifaces: dict = field(default_factory=dict)
    routes: list = field(default_factory=list)  # (dst, via)
    own: bool = False  # this process's namespace (a runner on a user's host): never made, set or removed


@dataclass
class Link:
    a: Iface
    b: Iface


@dataclass
class Bridge:
    iface: Iface
    ports: list


class Topology:
    """Hosts (namespaces), veth links, bridges, addresses and routes, built on
    build() (or `with`) and torn down on teardown().

    By default the lab prepares its hosts for exact, quiet runs: static
    neighbour entries on every segment, IPv6 without duplicate address
    detection, router solicitations or RAs. kernel_defaults=True builds the
    topology as a user does with plain `ip` commands: neighbours resolved on
    demand, DAD as the kernel does it (build() waits until it is done),
    offloads and GRO as a new veth has them; only forwarding follows
    add_host(forwarding=...), as a user who builds a router turns it on."""

    def __init__(self, name="lab", kernel_defaults=False):
        self.name = name
        self.kernel_defaults = kernel_defaults
        self.run_id = runs.new_run_id()
        self.prefix = f"{netns.PREFIX}{self.run_id}-"
        self.hosts: dict[str, Host] = {}
        self.links: list[Link] = []
        self.bridges: list[Bridge] = []
        self._segments = 0
        self._procs = []
        self._built = False

    # --- declaration ---------------------------------------------------------
    def add_host(self, name, forwarding=False, sysctls=None, own=False) -> Host:
        """own=True: the namespace this process is in, on a user's host (a lab runner,
        netns.host_mode()): its end of each link is made there and goes with the link,
        and nothing else of it is touched (its sysctls are the host's: forwarding is
        checked there, not set; it is never removed)."""
        if name in self.hosts:
            raise LabError(f"host {name} declared twice")
        if own and (forwarding or sysctls):
            raise LabError(f"host {name}: the host's own namespace keeps its sysctls (forwarding is checked there)")
        host = Host(name, None if own else self.prefix + name, forwarding, dict(sysctls or {}), own=own)
        self.hosts[name] = host
        return host

    def _iface(self, host, ifname, addrs, mtu):
        h = self.hosts.get(host)
        if h is None:
            raise LabError(f"unknown host {host!r}")
        if ifname in h.ifaces:
            raise LabError(f"{host} already has an interface {ifname}")
        iface = Iface(host, ifname, [ipaddress.ip_interface(a) for a in addrs], mtu)
        h.ifaces[ifname] = iface
        return iface

    def new_segment(self):
        """Next /24 of 198.18.0.0/15 and /64 of 2001:2::/48 (segment 1, 2, ...)."""
        self._segments += 1
        n = self._segments
        if n >= 2 ** (24 - V4_POOL.prefixlen):
            raise LabError(f"out of /24 segments in {V4_POOL}")
        v4 = ipaddress.ip_network(f"{V4_POOL.network_address + (n << 8)}/24")
        v6 = ipaddress.ip_network(f"{V6_POOL.network_address + (n << 64)}/64")
        return v4, v6

    def add_link(self, a, b, a_if="eth0", b_if="eth0", a_addrs=None, b_addrs=None, mtu=1500) -> Link:
        """A veth pair between hosts a and b. Without addresses, both ends get the
        .1/.2 (::1/::2) of a fresh segment; pass [] to leave an end unaddressed."""
        if a_addrs is None and b_addrs is None:
            v4, v6 = self.new_segment()
            a_addrs = [f"{v4[1]}/24", f"{v6[1]}/64"]
            b_addrs = [f"{v4[2]}/24", f"{v6[2]}/64"]
        link = Link(self._iface(a, a_if, a_addrs or [], mtu), self._iface(b, b_if, b_addrs or [], mtu))
        self.links.append(link)
        return link

    def add_bridge(self, host, name, ports, addrs=()):
        for p in ports:
            if p not in self.hosts[host].ifaces:
                raise LabError(f"bridge {name}: {host} has no interface {p}")
        br = Bridge(self._iface(host, name, addrs, 1500), list(ports))
        self.bridges.append(br)
        return br

    def add_address(self, host, ifname, addr):
        """An extra address; on "lo" too (a DSR backend holds the service's
        address there: local, but never answered for on a link)."""
        if ifname == "lo" and "lo" not in self.hosts[host].ifaces:
            self._iface(host, "lo", [], 65536)
        self.hosts[host].ifaces[ifname].addrs.append(ipaddress.ip_interface(addr))

    def add_route(self, host, dst, via):
        self.hosts[host].routes.append((dst, via))

    # --- building ------------------------------------------------------------
    def build(self):
        if self._built:
            return self
        runs.notice()  # before our own namespaces exist: a dead run's are said once, never ours
        self._built = True
        runs.started(self.run_id)
        self._owner_pid = os.getpid()
        atexit.register(self._teardown_at_exit)
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def _build(self):
        for h in self.hosts.values():
            if h.own:
                continue
            netns.create(h.ns)
            sysctls = {} if self.kernel_defaults else dict(HOST_SYSCTLS)
            if h.forwarding:
                sysctls.update({"net.ipv4.ip_forward": 1, "net.ipv6.conf.all.forwarding": 1})
            sysctls.update(h.sysctls)
            for key, value in sysctls.items():
                netns.sysctl(h.ns, key, value)
        for link in self.links:
            a, b = link.a, link.b
            with netns.ipr(self.hosts[a.host].ns) as ip:
                # Created inside a's namespace with the peer placed straight into b's.
                ip.link(
                    "add",
                    ifname=a.name,
                    kind="veth",
                    mtu=a.mtu,
                    peer={"ifname": b.name, "mtu": b.mtu, "net_ns_fd": self.hosts[b.host].ns},
                )
        for br in self.bridges:
            with netns.ipr(self.hosts[br.iface.host].ns) as ip:
                ip.link("add", ifname=br.iface.name, kind="bridge", br_stp_state=0, br_forward_delay=0)
                bidx = ip.link_lookup(ifname=br.iface.name)[0]
                for port in br.ports:
                    ip.link("set", index=ip.link_lookup(ifname=port)[0], master=bidx)
        for h in self.hosts.values():
            with netns.ipr(h.ns) as ip:
                ip.link("set", index=ip.link_lookup(ifname="lo")[0], state="up")
                for iface in h.ifaces.values():
                    idx = ip.link_lookup(ifname=iface.name)[0]
                    for a in iface.addrs:
                        nodad = a.version == 6 and not self.kernel_defaults
                        ip.addr(
                            "add",
                            index=idx,
                            address=str(a.ip),
                            prefixlen=a.network.prefixlen,
                            **({"flags": 0x02} if nodad else {}),
                        )  # IFA_F_NODAD
                    ip.link("set", index=idx, state="up")
                    link = ip.get_links(idx)[0]
                    iface.ifindex, iface.mac = idx, link.get_attr("IFLA_ADDRESS")
        if self.kernel_defaults:
            self._wait_for_dad()
        for h in self.hosts.values():
            with netns.ipr(h.ns) as ip:
                for dst, via in h.routes:
                    ip.route("add", dst=dst, gateway=via)
        if not self.kernel_defaults:
            self._static_neighbours()
            self._wait_for_mld()

    def _wait_for_mld(self, seconds=5.0):
        """Until no host has an MLD report still to send (HOST_SYSCTLS says why):
        on the kernel's state, each group's report timer, not on a quiet spell."""
        deadline = time.monotonic() + seconds
        while True:
            pending = []
            for h in self.hosts.values():
                if h.own:  # the host's own interfaces are its own business
                    continue
                with netdev.entered(h.ns):  # /proc/thread-self/net: this thread's namespace
                    rows = Path("/proc/thread-self/net/igmp6").read_text().split("\n")
                    inet6 = Path("/proc/thread-self/net/if_inet6").read_text().split("\n")
                    igmp = Path("/proc/thread-self/net/igmp").read_text().split("\n")
                # IGMP: a group's line is "GROUP USERS RUNNING:EXPIRES REPORTER", under its device's
                pending += [
                    f"{h.name} IPv4 group {r.split()[0]}"
                    for r in igmp
                    if r.startswith("\t") and len(r.split()) == 4 and r.split()[2].startswith("1:")
                ]
                # An interface whose link came up gets its link-local address from a kernel
                # work item, and joins its groups (and starts their report timers) only then:
                # on a loaded machine that came after this wait had found no timer running,
                # and its reports went into a test's count (the suite, in parallel). So an
                # interface that is up without its link-local address is pending too.
                linked = {r.split()[5] for r in inet6 if len(r.split()) >= 6 and r.split()[3] == "20"}
                pending += [f"{h.name} {i}: no link-local address yet" for i in self._up_v6(h) if i not in linked]
                pending += [
                    f"{h.name} {r.split()[1]} {r.split()[2]}"
                    for r in rows
                    if len(r.split()) >= 6 and int(r.split()[4], 16) & MAF_TIMER_RUNNING
                ]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise LabError(f"MLD reports still pending after {seconds:.0f} s: {', '.join(pending[:4])}")
            time.sleep(0.002)

    @staticmethod
    def _up_v6(h) -> list[str]:
        """The host's interfaces that are up with a carrier and make IPv6 link-local
        addresses (not loopback, IPv6 not disabled, an address generation mode)."""
        out = []
        with netns.ipr(h.ns) as ip:
            for link in ip.get_links():
                name = link.get_attr("IFLA_IFNAME")
                if name == "lo" or not link["flags"] & 0x10000:  # IFF_LOWER_UP
                    continue
                af = link.get_attr("IFLA_AF_SPEC")
                inet6 = af.get_attr("AF_INET6") if af else None
                mode = inet6.get_attr("IFLA_INET6_ADDR_GEN_MODE") if inet6 else None
                conf = inet6.get_attr("IFLA_INET6_CONF") if inet6 else None
                disabled = conf.get("disable_ipv6") if isinstance(conf, dict) else 0
                if inet6 is not None and mode != 1 and not disabled:  # IN6_ADDR_GEN_MODE_NONE
                    out.append(name)
        return out

    def _wait_for_dad(self, seconds=10.0):
        """Until no IPv6 address is tentative (a route via one cannot be added
        before), as a user waits a second or two after `ip addr add`."""
        deadline = time.monotonic() + seconds
        while True:
            tentative = []
            for h in self.hosts.values():
                with netns.ipr(h.ns) as ip:
                    tentative += [
                        f"{h.name}: {m.get_attr('IFA_ADDRESS')}"
                        for m in ip.get_addr(family=10)
                        if (m.get_attr("IFA_FLAGS") or m["flags"]) & 0x40
                    ]  # IFA_F_TENTATIVE
            if not tentative:
                return
            if time.monotonic() > deadline:
                raise LabError(f"IPv6 addresses still tentative after {seconds:.0f} s: {', '.join(tentative)}")
            time.sleep(0.1)

    def _segments_l2(self):
        """Groups of interfaces joined at layer 2 (veth pairs, bridge ports)."""
        parent = {}

        def find(x):
            while parent.setdefault(x, x) != x:
                x = parent[x]
            return x

        def join(x, y):
            parent[find(x)] = find(y)

        for link in self.links:
            join((link.a.host, link.a.name), (link.b.host, link.b.name))
        for br in self.bridges:
            for port in br.ports:
                join((br.iface.host, port), (br.iface.host, br.iface.name))
        groups = {}
        for h in self.hosts.values():
            for iface in h.ifaces.values():
                groups.setdefault(find((h.name, iface.name)), []).append(iface)
        return groups.values()

    def _static_neighbours(self):
        for group in self._segments_l2():
            for me in group:
                if not me.addrs:
                    continue
                with netns.ipr(self.hosts[me.host].ns) as ip:
                    for other in group:
                        if other is me:
                            continue
                        for a in other.addrs:
                            if any(a.ip in mine.network for mine in me.addrs):
                                ip.neigh(
                                    "replace", dst=str(a.ip), lladdr=other.mac, ifindex=me.ifindex, state=0x80
                                )  # NUD_PERMANENT

    # --- use -------------------------------------------------------------------
    def ns(self, host) -> str:
        return self.hosts[host].ns

    def iface(self, host, ifname) -> Iface:
        return self.hosts[host].ifaces[ifname]

    def addr(self, host, ifname, version=4) -> str:
        """First address of that family on the interface, without prefix length."""
        for a in self.iface(host, ifname).addrs:
            if a.version == version:
                return str(a.ip)
        raise LabError(f"{host}/{ifname} has no IPv{version} address")

    def mac(self, host, ifname) -> str:
        return self.iface(host, ifname).mac

    def ifindex(self, host, ifname) -> int:
        return self.iface(host, ifname).ifindex

    def command(self, host, argv):
        return netns.command(self.ns(host), argv)

    def run(self, host, argv, **kw):
        return netns.run(self.ns(host), argv, **kw)

    def popen(self, host, argv, **kw):
        """Start a process in a host; it is stopped at teardown at the latest."""
        p = netns.popen(self.ns(host), argv, **kw)
        self._procs.append(p)
        return p

    # --- teardown ------------------------------------------------------------------
    def _teardown_at_exit(self):
        # A forked child (a library's helper) that exits through the interpreter
        # runs atexit handlers too; only the process that built the lab tears it down.
        if os.getpid() == self._owner_pid:
            self.teardown()

    def teardown(self):
        """Stop our processes, delete our namespaces (and so their links, qdiscs and
        programs). Idempotent; called on exit, on error and by __exit__."""
        if not self._built:
            return
        self._built = False
        errors = []
        for p in self._procs:
            netns.stop(p, grace=3)
        self._procs.clear()
        for h in self.hosts.values():
            if h.own:  # its ends of the links went with the pods' namespaces
                continue
            try:
                netns.remove(h.ns)
            except (LabError, OSError, NetlinkError) as e:
                errors.append(f"{h.ns}: {netdev.reason(e)}")
        runs.ended(self.run_id)
        atexit.unregister(self._teardown_at_exit)
        if errors:
            raise LabError("teardown left: " + "; ".join(errors))

    # --- what a notebook shows -------------------------------------------------
    def _rows(self):
        """(host, namespace, [(interface, what it is, its addresses)])"""
        peer = {}
        for link in self.links:
            peer[link.a.host, link.a.name] = f"veth to {link.b.host}/{link.b.name}"
            peer[link.b.host, link.b.name] = f"veth to {link.a.host}/{link.a.name}"
        for br in self.bridges:
            peer[br.iface.host, br.iface.name] = f"bridge of {', '.join(br.ports)}"
        out = []
        for h in self.hosts.values():
            ifaces = [(i.name, peer.get((h.name, i.name), ""), " ".join(map(str, i.addrs))) for i in h.ifaces.values()]
            out.append((h.name + (" (forwards)" if h.forwarding else ""), h.ns, ifaces))
        return out

    def _state(self):
        return f"built, namespaces {self.prefix}*" if self._built else "not built (build() or `with`)"

    def __repr__(self):
        lines = [f"Topology {self.name!r}: {self._state()}"]
        for host, ns, ifaces in self._rows():
            lines.append(f"  {host} [{ns}]")
            lines += [f"    {name:6} {what:24} {addrs}".rstrip() for name, what, addrs in ifaces]
        return "\n".join(lines)

    def _repr_html_(self):
        rows = []
        for host, ns, ifaces in self._rows():
            for i, (name, what, addrs) in enumerate(ifaces or [("", "", "")]):
                lead = (
                    (
                        f"<td rowspan={max(1, len(ifaces))}>{escape(host)}</td>"
                        f"<td rowspan={max(1, len(ifaces))}><code>{escape(ns)}</code></td>"
                    )
                    if i == 0
                    else ""
                )
                rows.append(f"<tr>{lead}<td>{escape(name)}</td><td>{escape(what)}</td><td>{escape(addrs)}</td></tr>")
        return (
            f"<b>Topology {escape(self.name)}</b>: {escape(self._state())}<table><tr><th>host</th>"
            f"<th>namespace</th><th>interface</th><th>link</th><th>addresses</th></tr>{''.join(rows)}</table>"
        )

    def close(self):
        """teardown(), by the name the other lab objects use."""
        self.teardown()

    def __enter__(self):
        return self.build()

    def __exit__(self, *exc):
        self.teardown()
        return False
