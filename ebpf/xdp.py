"""XDP hooks through netlink (pyroute2). Running a program on frames of our own
(BPF_PROG_TEST_RUN) is in testrun.py.

attach() refuses to replace a program somebody else put on the device
(XDP_FLAGS_UPDATE_IF_NOEXIST), and detach() removes a program only while it is
still ours (XDP_FLAGS_REPLACE), so the lab can never silently unhook a foreign
XDP program. Modes:

    native   the driver's hook, before an skb exists (veth has one)
    generic  the skb hook every device has, after the skb is built: costs more
    offload  the NIC runs the program (Netronome nfp): the program must have been
             loaded for that device (BpfProgram.attach_xdp does so); on any other
             device the kernel refuses, and that is said, never emulated
"""

import contextlib
import errno
import os
import socket
import struct
from dataclasses import dataclass

from pyroute2.netlink.exceptions import NetlinkError

from ebpf import netdev
from ebpf.errors import AttachError, InputError, NoSuchNamespace
from ebpf.holders import holders, prog_id
from ebpf.holders import prog_name as name_of
from ebpf.testrun import libbpf

XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_REPLACE = 1 << 4  # with IFLA_XDP_EXPECTED_FD: change the hook only if that program is on it (5.7+)
MODES = {"generic": 1 << 1, "native": 1 << 2, "offload": 1 << 3}
# IFLA_XDP_ATTACHED, pyroute2's names
ATTACHED_MODE = {"native": "xdp", "generic": "xdpgeneric", "offload": "xdpoffload"}
PROG_ID_ATTR = {"native": "IFLA_XDP_DRV_PROG_ID", "generic": "IFLA_XDP_SKB_PROG_ID", "offload": "IFLA_XDP_HW_PROG_ID"}
OFFLOAD_NEEDS = "offload needs a NIC that runs BPF, such as Netronome nfp"


@dataclass
class XdpAttachment:
    netns: str | None
    ifname: str
    ifindex: int
    mode: str
    prog_fd: int

    @property
    def where(self):
        ns = f" in netns {self.netns}" if self.netns else ""
        return f"{self.ifname} XDP ({self.mode}){ns}"


def attached_mode(ip, ifindex):
    """'xdp', 'xdpgeneric', ... or None when no program is attached."""
    link = ip.get_links(ifindex)[0]
    xdp = link.get_attr("IFLA_XDP")
    return xdp.get_attr("IFLA_XDP_ATTACHED") if xdp else None


def attach(netns, ifname, prog_fd, mode="native", replacing_fd=None) -> XdpAttachment:
    """Attach to a free hook; or, with `replacing_fd`, in place of that very program, in one
    step (the kernel swaps them: no frame meets an empty hook)."""
    if mode not in MODES:
        raise InputError(f"unknown XDP mode {mode!r} (native, generic or offload)")
    with netdev.ipr(netns) as ip:
        ifindex = netdev.ifindex_of(ip, ifname, netns)
        if attached_mode(ip, ifindex) and replacing_fd is None:
            raise AttachError(f"attaching XDP to {ifname}: a program is already attached")
        if replacing_fd is None:
            attrs = [("IFLA_XDP_FD", prog_fd), ("IFLA_XDP_FLAGS", MODES[mode] | XDP_FLAGS_UPDATE_IF_NOEXIST)]
        else:
            attrs = [
                ("IFLA_XDP_FD", prog_fd),
                ("IFLA_XDP_EXPECTED_FD", replacing_fd),
                ("IFLA_XDP_FLAGS", MODES[mode] | XDP_FLAGS_REPLACE),
            ]
        try:
            ip.link("set", index=ifindex, xdp={"attrs": attrs})
        except NetlinkError as e:
            need = f"{OFFLOAD_NEEDS}: " if mode == "offload" else ""
            # a device whose driver has no XDP hook of its own (vxlan, a tunnel, ...): say what works
            hint = (
                " (its driver has no native XDP: use mode generic)"
                if (mode == "native" and e.code == errno.EOPNOTSUPP)
                else ""
            )
            if mode == "native" and e.code == errno.ERANGE:
                # veth: a native XDP frame must fit a page, so its peer's MTU is
                # bounded (3506 with 4 KB pages), and the kernel's ack often
                # does not reach us: only the errno's text would
                hint = (
                    " (a veth's peer MTU must fit a native XDP frame, at most about 3506 bytes: "
                    "lower the MTU of both ends, e.g. ip link set dev PEER mtu 1500, or use mode generic)"
                )
            raise AttachError(f"attaching XDP ({mode}) to {ifname}: {need}{netdev.netlink_reason(e)}{hint}") from None
    return XdpAttachment(netns, ifname, ifindex, mode, prog_fd)


def attached_prog_id(ip, ifindex, mode) -> int:
    """The id of the program on one mode's hook of a device, 0 when none."""
    xdp = ip.get_links(ifindex)[0].get_attr("IFLA_XDP")
    return (xdp.get_attr(PROG_ID_ATTR[mode]) if xdp else None) or 0


def detach(a: XdpAttachment) -> bool:
    """Remove our program, and only ours. Returns True when it removed it.

    The kernel compares and removes in one step (XDP_FLAGS_REPLACE with
    IFLA_XDP_EXPECTED_FD = our program's fd), so a program somebody else put on
    the hook since (after detaching ours, say) stays attached. detach() then
    returns False without a warning: what it promises, that our program is off
    the hook, already holds, and the other program is its owner's to remove.
    Also False, quietly, when the device or its namespace is gone: our program
    went with it.
    """
    try:
        with netdev.ipr(a.netns) as ip:
            if not ip.link_lookup(index=a.ifindex):
                return False  # the device is gone, and our program with it
            try:
                ip.link(
                    "set",
                    index=a.ifindex,
                    xdp={
                        "attrs": [
                            ("IFLA_XDP_FD", -1),
                            ("IFLA_XDP_EXPECTED_FD", a.prog_fd),
                            ("IFLA_XDP_FLAGS", MODES[a.mode] | XDP_FLAGS_REPLACE),
                        ]
                    },
                )
            except NetlinkError as e:
                # EEXIST: another program (or none) is on the hook; EBUSY: a bpf_link
                # holds it. Both also have rarer causes, so look before calling it not ours.
                if e.code in (errno.EEXIST, errno.EBUSY) and attached_prog_id(ip, a.ifindex, a.mode) != prog_id(
                    a.prog_fd
                ):
                    return False
                raise
    except (FileNotFoundError, NoSuchNamespace):
        return False  # the namespace is gone, and everything in it
    except NetlinkError as e:
        raise AttachError(f"detaching XDP from {a.where}: {netdev.netlink_reason(e)}") from None
    return True


def attached(netns=None) -> list[tuple[str, int, str, int]]:
    """(ifname, ifindex, mode, program id) of every XDP program on an interface
    of the namespace."""
    found = []
    with netdev.ipr(netns) as ip:
        for link in ip.get_links():
            x = link.get_attr("IFLA_XDP")
            for mode, attr in PROG_ID_ATTR.items():
                pid = x.get_attr(attr) if x else None
                if pid:
                    found.append((link.get_attr("IFLA_IFNAME"), link["index"], mode, pid))
    return found


def removed_from_outside(attachments) -> list[str]:
    """The interfaces of these attachments whose XDP hook no longer runs their
    program: taken off from outside (ip link set ... xdp off, another tool's
    --cleanup --all). A running tool asks every interval, and stops."""
    gone = []
    for ns in {a.netns for a in attachments}:
        on = {(ifindex, mode, pid) for _, ifindex, mode, pid in attached(ns)}
        gone += [a.ifname for a in attachments if a.netns == ns and (a.ifindex, a.mode, prog_id(a.prog_fd)) not in on]
    return gone


def cleanup(prog_name, netns=None, spare_live=True) -> tuple[list[str], list[str]]:
    """Remove the XDP programs named `prog_name` from the namespace's interfaces
    whose program no process holds any more (what a killed tool left), or all of
    them with spare_live=False. Removal is by program id (XDP_FLAGS_REPLACE with
    an fd of that very program), so nothing else is touched. Returns (what was
    removed, what was spared because a process still holds it)."""
    mine = [a for a in attached(netns) if name_of(a[3]) == prog_name]
    live = holders(a[3] for a in mine)
    removed, spared = [], []
    with netdev.ipr(netns) as ip:
        for ifname, ifindex, mode, pid in mine:
            if live[pid] and spare_live:
                spared.append(f"{prog_name} on {ifname} ({mode}): pid {', '.join(map(str, live[pid]))} holds it")
                continue
            if _remove(ip, ifindex, mode, pid, f"{prog_name} from {ifname}"):
                removed.append(f"{prog_name} on {ifname} ({mode})")
    return removed, spared


def remove(netns, ifindex, mode, prog_id) -> bool:
    """Take the program with this id off a device's hook of that mode, and nothing else."""
    with netdev.ipr(netns) as ip:
        return _remove(ip, ifindex, mode, prog_id, f"program {prog_id} from device {ifindex}")


def _remove(ip, ifindex, mode, prog_id, what) -> bool:
    """By program id: XDP_FLAGS_REPLACE with an fd of that very program, so a program
    put there since stays. False when it went (or was replaced) meanwhile."""
    fd = libbpf().bpf_prog_get_fd_by_id(prog_id)
    if fd < 0:
        return False  # gone in the meantime
    try:
        ip.link(
            "set",
            index=ifindex,
            xdp={
                "attrs": [
                    ("IFLA_XDP_FD", -1),
                    ("IFLA_XDP_EXPECTED_FD", fd),
                    ("IFLA_XDP_FLAGS", MODES[mode] | XDP_FLAGS_REPLACE),
                ]
            },
        )
    except NetlinkError as e:
        if e.code not in (errno.EEXIST, errno.ENODEV):  # replaced or gone meanwhile
            raise AttachError(f"removing {what}: {netdev.netlink_reason(e)}") from None
        return False
    finally:
        os.close(fd)
    return True


# --- what a device can do with XDP frames: the netdev generic netlink family ---------
NETDEV_XDP_ACT_BASIC = 1 << 0  # uapi netdev.h: the driver runs XDP programs (native mode)
NETDEV_XDP_ACT_NDO_XMIT = 1 << 2  # uapi netdev.h: the driver transmits XDP frames (a redirect's target)
_GENL_ID_CTRL, _CTRL_CMD_GETFAMILY, _CTRL_ATTR_FAMILY_ID, _CTRL_ATTR_FAMILY_NAME = 0x10, 3, 1, 2
_NETDEV_CMD_DEV_GET, _NETDEV_A_DEV_IFINDEX, _NETDEV_A_DEV_XDP_FEATURES = 1, 1, 3


def _genl(sock, family, cmd, attrs: bytes) -> dict:
    """One generic netlink request and its reply's attributes {type: bytes}
    (a raw socket and struct: no pyroute2 event loop, so any thread may ask,
    a notebook cell's included). Without NLM_F_ACK: the reply, or an error, is
    the one message that comes back."""
    body = struct.pack("BBH", cmd, 1, 0) + attrs
    sock.send(struct.pack("=IHHII", 16 + len(body), family, 1, 1, 0) + body)  # NLM_F_REQUEST
    data = sock.recv(65536)
    length, kind = struct.unpack_from("=IH", data)
    if kind == 2:  # NLMSG_ERROR
        err = -struct.unpack_from("=i", data, 16)[0]
        raise OSError(err, os.strerror(err))
    out, off = {}, 20
    while off + 4 <= length:
        alen, atype = struct.unpack_from("=HH", data, off)
        out[atype & 0x3FFF] = data[off + 4 : off + alen]
        off += (alen + 3) & ~3
    return out


def _nla(kind, payload: bytes) -> bytes:
    pad = (4 - len(payload) % 4) % 4
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * pad


def features(netns, ifindex) -> int | None:
    """The device's xdp-features (uapi netdev.h's NETDEV_XDP_ACT_* bits), or None when
    the kernel cannot say (before 6.3: no netdev family)."""
    with netdev.entered(netns) if netns else contextlib.nullcontext():
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16)  # NETLINK_GENERIC
    with sock:
        sock.settimeout(5)
        try:
            fam = _genl(sock, _GENL_ID_CTRL, _CTRL_CMD_GETFAMILY, _nla(_CTRL_ATTR_FAMILY_NAME, b"netdev\0"))
        except OSError:
            return None
        family = struct.unpack("=H", fam[_CTRL_ATTR_FAMILY_ID][:2])[0]
        reply = _genl(sock, family, _NETDEV_CMD_DEV_GET, _nla(_NETDEV_A_DEV_IFINDEX, struct.pack("=I", ifindex)))
        found = reply.get(_NETDEV_A_DEV_XDP_FEATURES)
        return struct.unpack("=Q", found[:8])[0] if found else None


def transmits_xdp(netns, ifindex) -> bool | None:
    """Does the kernel say this device takes XDP frames sent to it (NDO_XMIT in
    its xdp-features: a veth only while its peer runs an XDP program or has
    NAPI on)? None when the kernel cannot say (before 6.3: no netdev family)."""
    f = features(netns, ifindex)
    return None if f is None else bool(f & NETDEV_XDP_ACT_NDO_XMIT)


def runs_native(netns, ifindex) -> bool | None:
    """Does the device's driver run XDP programs natively (BASIC in its xdp-features)?
    None when the kernel cannot say."""
    f = features(netns, ifindex)
    return None if f is None else bool(f & NETDEV_XDP_ACT_BASIC)
