"""What the XDP fast paths need of the hosts around them, checked at start.

The lab's testbeds prepare their hosts; a user's hosts are as the kernel made
them. Each check here looks at what it can see from the namespace the tool runs
in and returns findings: one line each, saying what will fail and the command
that fixes it. The tools print them as warnings (or refuse, where nothing could
work), so a topology built with plain `ip` commands fails loudly, not silently.

    forwarding   bpf_fib_lookup() answers only on an interface that forwards, and
                 the kernel routes a rewritten packet on only where it does
    veth peer    a frame sent with XDP_TX or redirected into a veth reaches the
                 far end only when the peer has NAPI on, which a native XDP
                 program there turns on (with GRO instead, frames wait for other
                 traffic to wake the peer: seen as one-second stalls). The lab can
                 attach a pass program itself (--prepare-peer) where it can enter
                 the peer's namespace.
    GRO          in generic mode the program runs after GRO: it sees (and
                 counts) merged packets of up to 64 KB, not the wire's
    MTU          native XDP on a veth takes frames that fit a page (the attach
                 error says so: ebpf/xdp.py)
"""

import contextlib
import ipaddress
import os
import socket
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pyroute2.netlink.exceptions import NetlinkError

from ebpf import netdev, xdp
from ebpf.holders import holders
from ebpf.instruments.xdp_peer_pass import XdpPeerPass

NETNS_DIR = "/run/netns"


@dataclass
class Finding:
    what: str  # what will fail, and why
    fix: str = ""  # the command (or option) that fixes it

    def __str__(self):
        return f"{self.what}; fix: {self.fix}" if self.fix else self.what


@dataclass
class VethPeer:
    ifname: str
    ifindex: int
    netns: str | None  # where it lives, as netdev.entered() takes it; None: not found
    label: str  # for people: "namespace sw", "this namespace", ...
    native_xdp: bool  # a native XDP program is on it (its NAPI is on)


def _in(netns):
    """What a shell command needs in front to run in `netns` (a name, or a path
    under /run/netns; "" for this namespace and for paths `ip netns` cannot name)."""
    path = netdev.netns_path(netns) if netns else ""
    return f"ip netns exec {Path(path).name} " if path.startswith(NETNS_DIR + "/") else ""


def _sysctl(netns, path):
    """A /proc/sys value as the namespace sees it, or None (no such entry)."""
    try:
        with netdev.entered(netns) if netns else contextlib.nullcontext():
            return Path("/proc/sys", path).read_text().strip()
    except FileNotFoundError:
        return None


def forwarding_off(ifname, families, netns=None) -> list[str]:
    """The forwarding sysctls of `ifname` that are 0, for the IP versions given."""
    return [
        f"net.ipv{v}.conf.{ifname}.forwarding"
        for v in sorted(families)
        if _sysctl(netns, f"net/ipv{v}/conf/{ifname}/forwarding") == "0"
    ]


def forwarding_fix(names, netns=None) -> str:
    return f"{_in(netns)}sysctl -w " + " ".join(f"{n}=1" for n in names)


def check_forwarding(ifname, families, netns=None, why="") -> list[Finding]:
    off = forwarding_off(ifname, families, netns)
    if not off:
        return []
    return [Finding(f"forwarding is off on {ifname} ({', '.join(off)} = 0){why}", forwarding_fix(off, netns))]


def _candidate_namespaces():
    """Namespaces a veth peer may be in: the named ones, and the root."""
    out = [os.path.join(NETNS_DIR, n) for n in sorted(os.listdir(NETNS_DIR))] if os.path.isdir(NETNS_DIR) else []
    return out + ["/proc/1/ns/net"]


def veth_peer(ifname, netns=None) -> VethPeer | None:
    """The far end of a veth, found by the namespace id the kernel gives it; None
    when `ifname` is not a veth. netns is None in the result when the peer's
    namespace cannot be entered from here (not named, or not ours to open)."""
    with netdev.ipr(netns) as ip:
        link = ip.get_links(netdev.ifindex_of(ip, ifname, netns))[0]
        info = link.get_attr("IFLA_LINKINFO")
        if not info or info.get_attr("IFLA_INFO_KIND") != "veth":
            return None
        peer_index = link.get_attr("IFLA_LINK")
        nsid = link.get_attr("IFLA_LINK_NETNSID")
        if nsid is None:  # the peer is in this namespace
            where = netns
        else:
            where = None
            for path in _candidate_namespaces():
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    got = ip.get_netnsid(fd=fd).get("nsid")
                except Exception:
                    got = None
                finally:
                    os.close(fd)
                if got == nsid:
                    where = path
                    break
    if nsid is not None and where is None:
        return VethPeer("?", peer_index, None, f"namespace id {nsid}, not one this host names", False)
    with netdev.ipr(where) as ip:
        peer = ip.get_links(peer_index)[0]
        xdp = peer.get_attr("IFLA_XDP")
        native = bool(xdp and xdp.get_attr("IFLA_XDP_DRV_PROG_ID"))
        name = peer.get_attr("IFLA_IFNAME")
    if nsid is None:
        label = "this namespace"
    elif where == "/proc/1/ns/net":
        label = "the root namespace"
    else:
        label = f"namespace {Path(where).name}"
    return VethPeer(name, peer_index, where, label, native)


def check_veth_peer(ifname, netns=None, sends="XDP_TX", option="--prepare-peer") -> list[Finding]:
    """A veth that the program sends frames into (XDP_TX, XDP_REDIRECT) must have
    a peer with a native XDP program."""
    try:
        peer = veth_peer(ifname, netns)
    except Exception as e:  # cannot look: say so rather than guess
        why = netdev.netlink_reason(e) if isinstance(e, NetlinkError) else str(e)  # not the tuple NetlinkError prints
        return [
            Finding(
                f"cannot check {ifname}'s veth peer ({why}): frames sent with {sends} reach it only when "
                "it runs a native XDP program"
            )
        ]
    if peer is None or peer.native_xdp:
        return []
    what = (
        f"frames sent with {sends} out of {ifname} will be lost: its veth peer {peer.ifname} "
        f"({peer.label}) runs no native XDP program, which a veth needs to take them"
    )
    if peer.netns is None:
        return [Finding(what, "attach a native XDP pass program to the peer where it lives")]
    return [Finding(what, f"{option} (attaches a pass program to {peer.ifname} while this runs)")]


def check_gro(ifname, mode, netns=None) -> list[Finding]:
    """Generic XDP runs after GRO: merged packets, fewer and larger than the wire's."""
    if mode != "generic":
        return []
    with netdev.entered(netns) if netns else contextlib.nullcontext():
        # a child forked from this thread starts in the namespace it is in
        out = subprocess.run(["ethtool", "-k", ifname], capture_output=True, text=True).stdout
    if "generic-receive-offload: on" not in out:
        return []
    return [
        Finding(
            f"GRO is on on {ifname}: in generic mode the program runs after it and sees merged packets "
            "(up to 64 KB), so its counters count those, not the wire's frames",
            f"{_in(netns)}ethtool -K {ifname} gro off",
        )
    ]


class ReplyWatch:
    """Per destination (a backend, a rule): packets sent towards it and replies
    back, sample by sample. When packets keep going out and nothing comes back
    for `after` seconds, `silent()` says so: the live tables print a hint instead
    of a quiet zero."""

    HINT = (
        "no replies: frames may be lost on the way out (a veth peer without a native XDP program: "
        "--prepare-peer), dropped by the receiver (nstat -az TcpInCsumErrors UdpInCsumErrors there), "
        "or nothing listens there"
    )

    def __init__(self, after=3.0):
        self.after = after
        self._state = {}  # key -> (replies seen, packets at the last reply, time of the first unanswered packet)

    def update(self, key, packets, replies, now):
        """Returns the packets sent since the last reply, and whether that has
        gone on for `after` seconds."""
        seen, base, since = self._state.get(key, (0, 0, None))
        if replies > seen:
            seen, base, since = replies, packets, None
        elif packets > base and since is None:
            since = now
        self._state[key] = (seen, base, since)
        unanswered = packets - base
        return unanswered, since is not None and now - since >= self.after


class PreparedPeers:
    """Native XDP pass programs on veth peers, for as long as a tool runs
    (--prepare-peer): attached on prepare(), removed on close(); one a killed
    run left is removed by `python -m lab cleanup` or the tool's --cleanup."""

    def __init__(self, compile_in="process"):
        self.compile_in = compile_in  # BpfProgram.compile_in of the pass programs
        self.programs = []
        self.kept = []  # (netns, ifindex, mode, program id): a kept run's, taken over
        self.keep = False  # close() leaves them all attached (lab lb --keep)

    def prepare(self, ifname, netns=None) -> VethPeer | None:
        """Attach to ifname's veth peer if it needs it; the peer, or None if not."""
        peer = veth_peer(ifname, netns)
        if peer is None or peer.native_xdp or peer.netns is None:
            return None
        prog = XdpPeerPass()
        prog.compile_in = self.compile_in
        try:
            prog.attach(peer.ifname, peer.netns)
        except BaseException:
            prog.close()
            raise
        self.programs.append(prog)
        return peer

    def take_over_kept(self, ifname, netns=None):
        """A pass program a kept run (lab lb --keep) left on ifname's veth peer, no process
        holding it: this run's to remove on close(), as if it had attached it."""
        peer = veth_peer(ifname, netns)
        if peer is None or peer.netns is None:
            return
        for name, ifindex, mode, pid in xdp.attached(peer.netns):
            if name == peer.ifname and xdp.name_of(pid) == XdpPeerPass.FUNCTION and not holders([pid])[pid]:
                self.kept.append((peer.netns, ifindex, mode, pid))

    def close(self):
        for prog in self.programs:
            prog.keep_attached = self.keep
            prog.close()
        self.programs.clear()
        if not self.keep:
            for netns, ifindex, mode, pid in self.kept:
                xdp.remove(netns, ifindex, mode, pid)
        self.kept.clear()


def cleanup_peer_programs(netns=None) -> list[str]:
    """Peer pass programs no process holds, on the veth peers of this
    namespace's interfaces (the ones a killed tool prepared)."""
    removed, seen = [], set()
    with netdev.ipr(netns) as ip:
        names = [d.name for d in netdev.devices(ip).values()]
    for name in names:
        try:
            peer = veth_peer(name, netns)
        except Exception:
            continue
        if peer is None or peer.netns is None or peer.netns in seen:
            continue
        seen.add(peer.netns)
        done, _ = XdpPeerPass.cleanup(peer.netns)
        removed += [f"{what} ({peer.label})" for what in done]
    return removed


NUD_VALID = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80  # reachable, stale, delay, probe, noarp, permanent


def _echo_request(addr, source=None):
    """One ICMP echo request: the kernel resolves the next hop's MAC to send it.
    (bpf_fib_lookup() only reads the neighbour table; it never asks.)"""
    ip = ipaddress.ip_address(addr)
    if ip.version == 6:
        s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)  # the kernel sums ICMPv6
        msg = struct.pack("!BBHHH", 128, 0, 0, 0x7674, 1)
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        body = struct.pack("!BBHHH", 8, 0, 0, 0x7674, 1)
        csum = 0xFFFF - (sum(struct.unpack("!4H", body)) % 0xFFFF)
        msg = struct.pack("!BBHHH", 8, 0, csum, 0x7674, 1)
    with s:
        if source:
            s.bind((str(source), 0))
        try:
            s.sendto(msg, (str(ip), 0))
        except OSError:
            pass  # no route: the caller reports it as unresolved


def next_hops(ip, addrs):
    """{address: (ifindex, next hop)}: the neighbour entry each one's traffic needs."""
    out = {}
    for addr in addrs:
        try:
            r = ip.route("get", dst=str(addr))[0]
        except Exception:
            continue
        out[addr] = (r.get_attr("RTA_OIF"), r.get_attr("RTA_GATEWAY") or str(addr))
    return out


def resolve_neighbours(addrs, sources=None, netns=None, seconds=2.0) -> list:
    """Make the kernel resolve the MAC of each address's next hop (an echo
    request to it), and wait until every entry is usable or `seconds` pass.
    Returns the addresses still unresolved."""
    sources = sources or {}
    with netdev.entered(netns) if netns else contextlib.nullcontext(), netdev.ipr(None) as ip:
        hops = next_hops(ip, addrs)
        deadline = time.monotonic() + seconds
        asked = False
        while True:
            missing = []
            for addr in addrs:
                if addr not in hops:
                    missing.append(addr)
                    continue
                ifindex, hop = hops[addr]
                entries = ip.get_neighbours(ifindex=ifindex, dst=hop)
                if not any(e["state"] & NUD_VALID for e in entries):
                    missing.append(addr)
            if not missing:
                return missing
            if not asked:
                for addr in missing:
                    _echo_request(addr, sources.get(6 if ":" in str(addr) else 4))
                asked = True
            if time.monotonic() > deadline:
                return missing
            time.sleep(0.05)
