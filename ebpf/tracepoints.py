"""Kernel trace events for BPF programs: where a tracepoint's fields are, and
attaching a program to one, without relying on tracefs being mounted where BCC
looks.

`ip netns exec` mounts a fresh sysfs for the namespace, so /sys/kernel/tracing
(tracefs, mounted on sysfs) is not there inside it. What is needed of tracefs
(an event's id and its format) is the same kernel-wide: where it is not
mounted, a child process mounts it in a mount namespace of its own and reads
it there, leaving the host's mounts as they are. A program is attached with
perf_event_open() and PERF_EVENT_IOC_SET_BPF, as BCC does; closing the returned
fd detaches it (so does the process's exit, a kill -9 included).
"""

import ctypes
import fcntl
import functools
import os
import subprocess
from pathlib import Path

from ebpf.errors import AttachError, BpfError

TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
PERF_TYPE_TRACEPOINT = 2
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_SET_BPF = 0x40042408
SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine, 298)


class _PerfEventAttr(ctypes.Structure):
    """The head of struct perf_event_attr (uapi perf_event.h), up to what we set;
    `size` tells the kernel how much of it we give."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
    ]


@functools.lru_cache(maxsize=None)
def _read(category, event, name) -> str:
    """One file of the event's tracefs directory (id, format)."""
    for t in TRACEFS:
        path = Path(t, "events", category, event, name)
        if path.is_file():
            return path.read_text()
    script = f"mount -t tracefs nodev /sys/kernel/tracing && cat /sys/kernel/tracing/events/{category}/{event}/{name}"
    try:
        out = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        out = None
        why = str(e)
    if out is not None and out.returncode == 0:
        return out.stdout
    why = out.stderr.strip() if out is not None else why
    raise BpfError(
        f"cannot read the trace event {category}:{event} (tracefs is not mounted here, and mounting "
        f"it privately failed: {why}); fix: mount -t tracefs nodev /sys/kernel/tracing"
    )


def fields(category, event) -> dict[str, int]:
    """{field name: offset in the event's record}, from its format file."""
    out = {}
    for line in _read(category, event, "format").splitlines():
        # field:int to_ifindex;	offset:16;	size:4;	signed:1;
        parts = [p.strip() for p in line.strip().split(";")]
        if parts[0].startswith("field:") and len(parts) > 1 and parts[1].startswith("offset:"):
            out[parts[0].split()[-1]] = int(parts[1].split(":")[1])
    return out


def attach(prog_fd, category, event) -> int:
    """Run the (BPF_PROG_TYPE_TRACEPOINT) program on every hit of the event;
    returns the perf event's fd: close it to detach."""
    tp_id = int(_read(category, event, "id"))
    attr = _PerfEventAttr(
        type=PERF_TYPE_TRACEPOINT, size=ctypes.sizeof(_PerfEventAttr), config=tp_id, sample_period=1, wakeup_events=1
    )
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(SYS_PERF_EVENT_OPEN, ctypes.byref(attr), -1, 0, -1, 0)  # any process, CPU 0: every CPU
    if fd < 0:
        raise AttachError(f"opening the trace event {category}:{event}: {os.strerror(ctypes.get_errno())}")
    try:
        fcntl.ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog_fd)
        fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
    except OSError as e:
        os.close(fd)
        raise AttachError(f"attaching to the trace event {category}:{event}: {e.strerror}") from None
    return fd
