"""The load balancer's loops over whole tables in C (native.c), through ctypes:
Maglev's table population, the slots a new table changes, and the sweep's look
at a batch of sessions. Built with cc on first use (ebpf.ctools)."""

import ctypes
import functools
from pathlib import Path

from ebpf import ctools
from ebpf.errors import BpfError

U32P = ctypes.POINTER(ctypes.c_uint32)


class ScanConf(ctypes.Structure):
    """struct scan_conf (native.c): where sessions_scan() finds a session's fields."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("last_seen", ctypes.c_uint32),
        ("backend", ctypes.c_uint32),
        ("state", ctypes.c_uint32),
        ("closing", ctypes.c_uint32),
        ("st_syn", ctypes.c_uint32),
        ("st_udp", ctypes.c_uint32),
        ("cl_fin", ctypes.c_uint32),
        ("timeout", ctypes.c_uint64 * 4),
    ]


@functools.cache
def lib():
    so = ctypes.CDLL(str(ctools.build(Path(__file__).with_name("native.c"), "the LB's native helpers", shared=True)))
    so.maglev_fill.argtypes = [ctypes.c_uint32, ctypes.c_uint32, *[ctypes.c_void_p] * 5]
    so.maglev_fill.restype = ctypes.c_int
    so.ring_diff.argtypes = [ctypes.c_uint32, ctypes.c_uint32, *[ctypes.c_void_p] * 4]
    so.ring_diff.restype = ctypes.c_uint32
    so.sessions_scan.argtypes = [
        ctypes.POINTER(ScanConf),
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_uint64,
        ctypes.c_uint32,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    so.sessions_scan.restype = ctypes.c_uint32
    return so


def maglev_fill(size, walks, weights, index):
    """A table of `size` u32 (a ctypes array): walks [(offset, skip)], weights and
    index (what a slot of each backend holds) in the backends' sorted order."""
    n = len(walks)
    offset = (ctypes.c_uint32 * n)(*(o for o, _ in walks))
    skip = (ctypes.c_uint32 * n)(*(s for _, s in walks))
    weight = (ctypes.c_uint64 * n)(*weights)
    idx = (ctypes.c_uint32 * n)(*index)
    table = (ctypes.c_uint32 * size)()
    if lib().maglev_fill(size, n, offset, skip, weight, idx, table) != 0:
        raise BpfError("the Maglev builder ran out of memory")
    return table


def ring_diff(old, new, base=0):
    """Where two tables (ctypes u32 arrays of one size) differ, in order: (keys, values, n),
    keys the slots plus `base` and values new's there, ctypes arrays of which n are used."""
    keys, values = (ctypes.c_uint32 * len(new))(), (ctypes.c_uint32 * len(new))()
    return keys, values, lib().ring_diff(len(new), base, old, new, keys, values)


def sessions_scan(conf, values, n, now, max_backend, live, expired) -> int:
    """Look at n sessions packed in `values` (a buffer): the idle ones' positions
    into `expired` (returns how many), the live ones counted into live[backend]."""
    buf = (ctypes.c_char * len(values)).from_buffer(values) if n else None
    return lib().sessions_scan(ctypes.byref(conf), buf, n, now, max_backend, live, expired)
