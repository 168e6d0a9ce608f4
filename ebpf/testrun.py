"""Run a loaded program on frames of our own: BPF_PROG_TEST_RUN through libbpf.

    >>> r = run(prog_fd, frame)              # doctest: +SKIP
    >>> r.verdict, r.data                    # XDP_TX, and the frame as the program left it

run() is the basis of the data-plane fixtures (tests/fixtures/): a frame built
with scapy goes in, the verdict and the output bytes come out, no namespace or
packet on a wire needed. It works for XDP and TC (SCHED_CLS) programs alike;
for XDP, `ingress_ifindex` (resolved in the caller's namespace) is what a
bpf_fib_lookup() or a devmap sees as the receiving device.

LiveFrames drives an XDP program with BPF_F_TEST_XDP_LIVE_FRAMES instead: the
kernel builds real frames from the data in a page pool and really transmits
what the program returns XDP_TX/XDP_REDIRECT for (kernel 5.18+): the lab's
generator.
"""

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

from ebpf.errors import BpfError

BPF_F_TEST_XDP_LIVE_FRAMES = 1 << 1
BPF_F_TEST_SKB_CHECKSUM_COMPLETE = 1 << 2  # 6.11+
XDP_VERDICTS = {0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}
TC_ACTIONS = {-1: "TC_ACT_UNSPEC", 0: "TC_ACT_OK", 2: "TC_ACT_SHOT", 7: "TC_ACT_REDIRECT"}
# what either hook's return does with the frame, in one word (TestRun.action)
ACTIONS = {
    "XDP_TX": "sent",
    "XDP_REDIRECT": "sent",
    "TC_ACT_REDIRECT": "sent",
    "XDP_PASS": "pass",
    "TC_ACT_OK": "pass",
    "TC_ACT_UNSPEC": "pass",
    "XDP_DROP": "drop",
    "TC_ACT_SHOT": "drop",
}
MAX_FRAME = 9216  # room for the output frame: a program may grow it (encapsulation)


class _TestRunOpts(ctypes.Structure):
    """struct bpf_test_run_opts (libbpf 1.x, bpf.h)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


class XdpMd(ctypes.Structure):
    """struct xdp_md, the context an XDP program sees (uapi bpf.h)."""

    _fields_ = [
        (n, ctypes.c_uint32)
        for n in ("data", "data_end", "data_meta", "ingress_ifindex", "rx_queue_index", "egress_ifindex")
    ]


class SkbCtx(ctypes.Structure):
    """The head of struct __sk_buff (uapi bpf.h), up to the fields a test run
    takes from user space that we set; the kernel zero-fills the rest."""

    _fields_ = [
        (n, ctypes.c_uint32)
        for n in (
            "len",
            "pkt_type",
            "mark",
            "queue_mapping",
            "protocol",
            "vlan_present",
            "vlan_tci",
            "vlan_proto",
            "priority",
            "ingress_ifindex",
            "ifindex",
        )
    ]


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
        lib.bpf_map_update_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
        lib.bpf_map_update_elem.restype = ctypes.c_int
        # (type, name, key size, value size, max entries, struct bpf_map_create_opts *)
        lib.bpf_map_create.argtypes = [ctypes.c_int, ctypes.c_char_p, *[ctypes.c_uint32] * 3, ctypes.c_void_p]
        lib.bpf_map_create.restype = ctypes.c_int
        lib.bpf_btf_load.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        lib.bpf_btf_load.restype = ctypes.c_int
        # (type, name, license, insns, insn count, struct bpf_prog_load_opts *)
        lib.bpf_prog_load.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
        lib.bpf_prog_load.argtypes += [ctypes.c_void_p]
        lib.bpf_prog_load.restype = ctypes.c_int
        _libbpf = lib
    return _libbpf


@dataclass
class TestRun:
    retval: int  # the program's return value (an XDP verdict, a TC action)
    data: bytes  # the frame as the program left it
    duration_ns: int  # mean run time per repeat, as the kernel measured it
    xdp: bool = True  # an XDP program's run, else a TC program's

    __test__ = False  # not a test class, whatever pytest thinks of the name

    @property
    def verdict(self):
        """The XDP verdict's name (XDP_PASS ...) or the TC action's (TC_ACT_OK ...), or the number."""
        if self.xdp:
            return XDP_VERDICTS.get(self.retval, self.retval)
        return TC_ACTIONS.get(ctypes.c_int32(self.retval).value, self.retval)  # retval: the u32 the kernel gives

    @property
    def action(self):
        """What the return does with the frame, the same word at either hook: sent (back
        out, or to another interface), pass (on to the stack), drop; else the verdict."""
        return ACTIONS.get(self.verdict, self.verdict)


def run(prog_fd, frame: bytes, ingress_ifindex=0, xdp=True, repeat=1, checksum_complete=False) -> TestRun:
    """Run the program once (or `repeat` times) on `frame`. For a TC program
    (xdp=False), checksum_complete makes the skb CHECKSUM_COMPLETE: the kernel
    sums the frame into skb->csum first, and fails the run (EBADMSG) when the
    program left skb->csum out of step with the bytes."""
    data = ctypes.create_string_buffer(bytes(frame), len(frame))
    out = ctypes.create_string_buffer(MAX_FRAME)
    opts = _TestRunOpts(
        sz=ctypes.sizeof(_TestRunOpts),
        data_in=ctypes.cast(data, ctypes.c_void_p),
        data_size_in=len(frame),
        data_out=ctypes.cast(out, ctypes.c_void_p),
        data_size_out=MAX_FRAME,
        repeat=repeat,
        flags=BPF_F_TEST_SKB_CHECKSUM_COMPLETE if checksum_complete else 0,
    )
    ctx = None
    if xdp:
        ctx = XdpMd(data=0, data_end=len(frame), ingress_ifindex=ingress_ifindex)
    elif ingress_ifindex:
        ctx = SkbCtx(ingress_ifindex=ingress_ifindex, ifindex=ingress_ifindex)
    if ctx is not None:
        opts.ctx_in = ctypes.cast(ctypes.pointer(ctx), ctypes.c_void_p)
        opts.ctx_size_in = ctypes.sizeof(ctx)
    if libbpf().bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts)) != 0:
        raise BpfError(f"BPF_PROG_TEST_RUN: {os.strerror(ctypes.get_errno())}")
    return TestRun(opts.retval, out.raw[: opts.data_size_out], opts.duration, xdp)


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
            data_in=ctypes.cast(self._data, ctypes.c_void_p),
            data_size_in=len(frame),
            ctx_in=ctypes.cast(ctypes.pointer(self._ctx), ctypes.c_void_p),
            ctx_size_in=ctypes.sizeof(XdpMd),
            flags=BPF_F_TEST_XDP_LIVE_FRAMES,
            batch_size=batch_size,
        )
        self._run = libbpf().bpf_prog_test_run_opts

    def run(self, repeat: int):
        """Run the program `repeat` times on the frame. The kernel copies the
        frame into each page of its pool once, not on every run: a program (or
        anyone downstream) that rewrites the frame rewrites later runs' frames
        too (see xdp_gen.bpf.c)."""
        self._opts.repeat = repeat
        if self._run(self.prog_fd, ctypes.byref(self._opts)) != 0:
            err = ctypes.get_errno()
            raise BpfError(f"BPF_PROG_TEST_RUN (live frames): {os.strerror(err)}")


BPF_PROG_TYPE_XDP = 6
# r0 = XDP_DROP; exit: a program that sends nothing, to ask the kernel a question
_DROP_INSNS = bytes.fromhex("b7000000010000009500000000000000")
_live_refusal = ...


def live_frames_refusal():
    """None when the kernel runs XDP programs on live frames here, else why not
    (its error, in words). Asked once per process, with a two-instruction
    XDP_DROP program on the loopback device: nothing is sent. A kernel may refuse
    them to a root that lacks a capability (CAP_SYS_RESOURCE, seen on one VM's
    kernel) while it runs every other test run."""
    global _live_refusal
    if _live_refusal is ...:
        insns = ctypes.create_string_buffer(_DROP_INSNS, len(_DROP_INSNS))
        fd = libbpf().bpf_prog_load(BPF_PROG_TYPE_XDP, b"live_probe", b"GPL", insns, len(_DROP_INSNS) // 8, None)
        if fd < 0:
            raise BpfError(f"loading an XDP program: {os.strerror(-fd)}")
        try:
            LiveFrames(fd, bytes(64), 1).run(1)  # ifindex 1: lo, in every namespace
            _live_refusal = None
        except BpfError as e:
            _live_refusal = str(e).split(": ", 1)[-1]
        finally:
            os.close(fd)
    return _live_refusal
