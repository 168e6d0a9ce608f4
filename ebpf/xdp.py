"""XDP hooks through netlink (pyroute2), and BPF_PROG_TEST_RUN through libbpf.

attach() refuses to replace a program somebody else put on the device
(XDP_FLAGS_UPDATE_IF_NOEXIST), and detach() removes a program only while it is
still ours (XDP_FLAGS_REPLACE), so the lab can never silently unhook a foreign
XDP program. Modes: "native" (the driver hook; veth has one) or "generic" (the
skb hook every device has, after the skb is built, so it costs more).

test_run_live() drives a loaded XDP program with BPF_F_TEST_XDP_LIVE_FRAMES: the
kernel builds real frames from the given data in a page pool and really
transmits what the program returns XDP_TX/XDP_REDIRECT for (kernel 5.18+). It
resolves the context's ingress ifindex in the calling thread's network
namespace, so callers enter the namespace first.
"""

import ctypes
import ctypes.util
import errno
import os
from dataclasses import dataclass

from pyroute2.netlink.exceptions import NetlinkError

from .errors import AttachError, BpfError, NoSuchNamespace
from .holders import prog_id
from . import netdev

XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_REPLACE = 1 << 4  # with IFLA_XDP_EXPECTED_FD: change the hook only if that program is on it (5.7+)
MODES = {"generic": 1 << 1, "native": 1 << 2}
ATTACHED_MODE = {"native": "xdp", "generic": "xdpgeneric"}  # IFLA_XDP_ATTACHED as pyroute2 names it
PROG_ID_ATTR = {"native": "IFLA_XDP_DRV_PROG_ID", "generic": "IFLA_XDP_SKB_PROG_ID"}
BPF_F_TEST_XDP_LIVE_FRAMES = 1 << 1


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


def attach(netns, ifname, prog_fd, mode="native") -> XdpAttachment:
    if mode not in MODES:
        raise AttachError(f"unknown XDP mode {mode!r} (native or generic)")
    with netdev.ipr(netns) as ip:
        ifindex = netdev.ifindex_of(ip, ifname, netns)
        if attached_mode(ip, ifindex):
            raise AttachError(f"attaching XDP to {ifname}: a program is already attached")
        try:
            ip.link("set", index=ifindex, xdp={"attrs": [
                ("IFLA_XDP_FD", prog_fd),
                ("IFLA_XDP_FLAGS", MODES[mode] | XDP_FLAGS_UPDATE_IF_NOEXIST)]})
        except NetlinkError as e:
            raise AttachError(f"attaching XDP ({mode}) to {ifname}: {os.strerror(e.code)}") from None
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
                ip.link("set", index=a.ifindex, xdp={"attrs": [
                    ("IFLA_XDP_FD", -1), ("IFLA_XDP_EXPECTED_FD", a.prog_fd),
                    ("IFLA_XDP_FLAGS", MODES[a.mode] | XDP_FLAGS_REPLACE)]})
            except NetlinkError as e:
                # EEXIST: another program (or none) is on the hook; EBUSY: a bpf_link
                # holds it. Both also have rarer causes, so look before calling it not ours.
                if e.code in (errno.EEXIST, errno.EBUSY) and \
                        attached_prog_id(ip, a.ifindex, a.mode) != prog_id(a.prog_fd):
                    return False
                raise
    except (FileNotFoundError, NoSuchNamespace):
        return False  # the namespace is gone, and everything in it
    except NetlinkError as e:
        raise AttachError(f"detaching XDP from {a.where}: {netdev.netlink_reason(e)}") from None
    return True


# --- BPF_PROG_TEST_RUN ------------------------------------------------------

class _TestRunOpts(ctypes.Structure):
    """struct bpf_test_run_opts (libbpf 1.x, bpf.h)."""
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p), ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32), ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32),
    ]


class XdpMd(ctypes.Structure):
    """struct xdp_md, the context an XDP program sees (uapi bpf.h)."""
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("data", "data_end", "data_meta", "ingress_ifindex", "rx_queue_index", "egress_ifindex")]


_libbpf = None


def libbpf():
    global _libbpf
    if _libbpf is None:
        name = ctypes.util.find_library("bpf") or "libbpf.so.1"
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError:
            raise BpfError("libbpf.so.1 not found (Debian package libbpf1; run `make setup`)") from None
        lib.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.POINTER(_TestRunOpts)]
        lib.bpf_prog_test_run_opts.restype = ctypes.c_int
        _libbpf = lib
    return _libbpf


class LiveFrames:
    """One frame, ready to be pushed through an XDP program N times per call.

    The ctypes buffers are built once, so a paced sender can call run() in a loop
    without allocating; the syscall releases the GIL.
    """

    def __init__(self, prog_fd, frame: bytes, ingress_ifindex, batch_size=0):
        self.prog_fd = prog_fd
        self.frame = frame
        self._data = ctypes.create_string_buffer(frame, len(frame))
        self._ctx = XdpMd(data=0, data_end=len(frame), ingress_ifindex=ingress_ifindex)
        self._opts = _TestRunOpts(
            sz=ctypes.sizeof(_TestRunOpts),
            data_in=ctypes.cast(self._data, ctypes.c_void_p), data_size_in=len(frame),
            ctx_in=ctypes.cast(ctypes.pointer(self._ctx), ctypes.c_void_p),
            ctx_size_in=ctypes.sizeof(XdpMd),
            flags=BPF_F_TEST_XDP_LIVE_FRAMES, batch_size=batch_size)
        self._run = libbpf().bpf_prog_test_run_opts

    def run(self, repeat: int):
        """Run the program `repeat` times on fresh copies of the frame."""
        self._opts.repeat = repeat
        if self._run(self.prog_fd, ctypes.byref(self._opts)) != 0:
            err = ctypes.get_errno()
            raise BpfError(f"BPF_PROG_TEST_RUN (live frames): {os.strerror(err)}")
