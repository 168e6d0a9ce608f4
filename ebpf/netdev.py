"""Network devices through netlink (pyroute2): open a namespace, look an interface
up, and follow where a device's transmitted frames go next.

copy_path() answers the question a mirror must ask before it taps anything: which
hooks will our own copies pass? A copy sent out of a monitor leaves through that
monitor's egress, and then, depending on what the monitor is:

    veth               arrives at the peer's ingress (when the peer is in this namespace)
    vlan, macvlan ...  leaves through the lower device
    bridge, bond, team leaves through the ports (slaves)
    vxlan, geneve, gre leaves, encapsulated, through the underlay: the device the
                       route to the remote end (or the tunnel's `dev`) goes through
and a frame arriving at a bridge port is flooded to the bridge's other ports and
delivered up through the bridge device. Tapping any hook on that path in the
direction the copies pass would copy the copies: a loop that runs at full speed.
"""

import ctypes
import errno
import ipaddress
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from ebpf.errors import BpfError, NoSuchInterface, NoSuchNamespace, PrivilegeError
from ebpf.netlink_thread import Netlink

NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000
NETLINK_ROUTE = 0
_libc = ctypes.CDLL(None, use_errno=True)
INGRESS, EGRESS = "ingress", "egress"
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
LOWER_KINDS = {"vlan", "macvlan", "macvtap", "ipvlan", "ipvtap"}
MEMBER_KINDS = {"bridge", "bond", "team"}
# Tunnels: the attribute naming the underlay device (if set), and those naming
# the remote end (pyroute2's names; ip6gre's are its own).
TUNNEL_LINK_ATTRS = {
    "vxlan": "IFLA_VXLAN_LINK",
    "gre": "IFLA_GRE_LINK",
    "gretap": "IFLA_GRE_LINK",
    "erspan": "IFLA_GRE_LINK",
    "ip6gre": "IFLA_IP6GRE_LINK",
    "ip6gretap": "IFLA_IP6GRE_LINK",
    "ip6erspan": "IFLA_IP6GRE_LINK",
    "ipip": "IFLA_IPIP_LINK",
    "sit": "IFLA_IPIP_LINK",
    "ip6tnl": "IFLA_IP6TNL_LINK",
    "vti": "IFLA_VTI_LINK",
    "vti6": "IFLA_VTI_LINK",
    "geneve": None,
}
TUNNEL_REMOTE_ATTRS = (
    "IFLA_VXLAN_GROUP",
    "IFLA_VXLAN_GROUP6",
    "IFLA_GRE_REMOTE",
    "IFLA_IP6GRE_REMOTE",
    "IFLA_GENEVE_REMOTE",
    "IFLA_GENEVE_REMOTE6",
    "IFLA_IPIP_REMOTE",
    "IFLA_IP6TNL_REMOTE",
    "IFLA_VTI_REMOTE",
)
# Tunnels whose copies leave through an interface netlink does not name
# (wireguard's peers live in genetlink, xfrm's in policies): copy_path() cannot
# follow them, and says so through opaque().
OPAQUE_KINDS = {"wireguard", "xfrm"}


def netns_path(netns):
    return netns if "/" in netns else os.path.join(NETNS_DIR, netns)


@contextmanager
def entered(netns):
    """Run the body with this thread inside network namespace `netns` (a name
    under /run/netns or a path). setns() moves only the calling thread, and a
    socket keeps the namespace it was made in, so a socket opened here can be
    used after the block."""
    try:
        target = open(netns_path(netns))
    except FileNotFoundError:
        named = f"at {netns}" if "/" in netns else f"named {netns!r} ({netns_path(netns)} does not exist)"
        raise NoSuchNamespace(f"no network namespace {named}") from None
    with open("/proc/thread-self/ns/net") as home, target:
        if _libc.setns(target.fileno(), CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            if err == errno.EPERM:
                raise PrivilegeError(f"entering network namespace {netns} needs root (CAP_SYS_ADMIN)")
            raise BpfError(f"entering network namespace {netns}: {os.strerror(err)}")
        try:
            yield
        finally:
            if _libc.setns(home.fileno(), CLONE_NEWNET) != 0:  # pragma: no cover - would be fatal
                os.abort()


def ipr(netns=None) -> Netlink:
    """An IPRoute on a netlink socket in `netns` (a name under /run/netns or a
    path; None: the calling thread's namespace). A namespace that does not exist
    is NoSuchNamespace, never created. The socket is opened here, in this thread
    (in the namespace it entered, if any): pyroute2's IPRoute(netns=...) would
    fork a helper that runs on a copy of our stack and signal handlers. Its calls
    run on the lab's netlink thread (ebpf.netlink_thread), so that it works from
    any thread, a notebook cell and a running asyncio loop included."""
    if netns:
        with entered(netns):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
    else:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
    return wrap_socket(sock, lambda fd: IPRoute(fileno=fd))


def wrap_socket(sock, make) -> Netlink:
    """make(fd) on the netlink thread, owning `sock`'s descriptor: closed there
    if make() fails, closed with the object if an interrupt takes it away."""
    fd = sock.detach()

    def made():
        try:
            return make(fd)
        except BaseException:
            os.close(fd)
            raise

    return Netlink(made)


def netlink_reason(e: NetlinkError) -> str:
    """The kernel's own words for a refusal (its extended ack), else the errno's."""
    return e.args[1] if len(e.args) > 1 and e.args[1] else os.strerror(e.code)


def reason(e: BaseException) -> str:
    """An exception in words: the kernel's for a netlink refusal, the system's for
    an OSError (never pyroute2's or Python's tuple), else its own message."""
    if isinstance(e, NetlinkError):
        return netlink_reason(e)
    if isinstance(e, OSError) and e.strerror:
        return e.strerror + (f": {e.filename}" if e.filename else "")
    return str(e)


def where(netns):
    return f"netns {netns}" if netns else "this network namespace"


def ifindex_of(ip, ifname, netns=None) -> int:
    """The index of interface `ifname`, or NoSuchInterface saying where it was looked for."""
    found = ip.link_lookup(ifname=ifname)
    if not found:
        raise NoSuchInterface(f"no interface named {ifname!r} in {where(netns)}")
    return found[0]


@dataclass
class Device:
    index: int
    name: str
    kind: str | None
    up: bool
    carrier: bool  # the link is up too (IFF_LOWER_UP): a veth whose peer is down has none
    mtu: int
    master: int | None
    link: int | None  # IFLA_LINK: veth peer, vlan lower; None when in another namespace
    data: object  # IFLA_INFO_DATA (kind-specific attributes) or None


def devices(ip) -> dict[int, Device]:
    out = {}
    for msg in ip.get_links():
        info = msg.get_attr("IFLA_LINKINFO")
        elsewhere = msg.get_attr("IFLA_LINK_NETNSID") is not None
        out[msg["index"]] = Device(
            msg["index"],
            msg.get_attr("IFLA_IFNAME"),
            info.get_attr("IFLA_INFO_KIND") if info is not None else None,
            bool(msg["flags"] & IFF_UP),
            bool(msg["flags"] & IFF_LOWER_UP),
            msg.get_attr("IFLA_MTU") or 0,
            msg.get_attr("IFLA_MASTER"),
            None if elsewhere else msg.get_attr("IFLA_LINK"),
            info.get_attr("IFLA_INFO_DATA") if info is not None else None,
        )
    return out


def device(ip, ifindex) -> Device | None:
    return devices(ip).get(ifindex)


def _tunnel_underlays(ip, dev: Device) -> dict[int, str]:
    """{ifindex: why} of the devices a tunnel's encapsulated frames leave through."""
    data = dev.data
    link_attr = TUNNEL_LINK_ATTRS.get(dev.kind)
    if link_attr and data is not None and data.get_attr(link_attr):
        return {data.get_attr(link_attr): f"{dev.name}'s underlay device"}
    remotes = set()
    if data is not None:
        for attr in TUNNEL_REMOTE_ATTRS:
            value = data.get_attr(attr)
            if value and not ipaddress.ip_address(value).is_unspecified:
                remotes.add(value)
    if dev.kind == "vxlan":  # unicast remotes may live only in the tunnel's FDB
        try:
            for entry in ip.fdb("dump", ifindex=dev.index):
                if entry["ifindex"] == dev.index and entry.get_attr("NDA_DST"):
                    remotes.add(entry.get_attr("NDA_DST"))
        except NetlinkError:
            pass
    out = {}
    for remote in sorted(remotes):
        try:
            route = ip.route("get", dst=remote)[0]
        except NetlinkError:
            continue  # no route: nothing leaves for this remote
        oif = route.get_attr("RTA_OIF")
        if oif:
            out.setdefault(oif, f"{dev.name}'s underlay: the route to {remote}")
    return out


def opaque(ip, monitor_ifindex) -> str | None:
    """The kind of a monitor whose copies' way out copy_path() cannot follow, or None."""
    dev = device(ip, monitor_ifindex)
    return dev.kind if dev is not None and dev.kind in OPAQUE_KINDS else None


def copy_path(ip, monitor_ifindex, depth=8) -> dict[tuple[int, str], str]:
    """{(ifindex, "ingress"|"egress"): why} of every hook in this namespace that a
    frame transmitted out of the monitor passes (see the module docstring)."""
    devs = devices(ip)
    path = {}

    def members(master):
        return [d for d in devs.values() if d.master == master]

    def egress(idx, why, left):
        dev = devs.get(idx)
        if dev is None or (idx, EGRESS) in path or left < 0:
            return
        path[idx, EGRESS] = why
        if dev.kind == "veth" and dev.link:
            ingress(dev.link, f"the other end of {dev.name}'s veth pair", left - 1)
        elif dev.kind in LOWER_KINDS and dev.link:
            egress(dev.link, f"{dev.name}'s lower device", left - 1)
        elif dev.kind in MEMBER_KINDS:
            for m in members(idx):
                egress(m.index, f"a port of {dev.name}", left - 1)
        elif dev.kind in TUNNEL_LINK_ATTRS:
            for under, reason in _tunnel_underlays(ip, dev).items():
                egress(under, reason, left - 1)

    def ingress(idx, why, left):
        dev = devs.get(idx)
        if dev is None or (idx, INGRESS) in path or left < 0:
            return
        path[idx, INGRESS] = why
        master = devs.get(dev.master) if dev.master else None
        if master is not None and master.kind in MEMBER_KINDS:
            ingress(master.index, f"{master.name}, which {dev.name} belongs to", left - 1)
            if master.kind == "bridge":  # flooded or forwarded to the other ports
                for m in members(master.index):
                    if m.index != idx:
                        egress(m.index, f"a port of {master.name}, which floods what {dev.name} receives", left - 1)

    egress(monitor_ifindex, "the monitor itself", depth)
    return path
