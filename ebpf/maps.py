"""Map calls through libbpf.so.1 (ctypes), for what BCC's table API does one
syscall per entry: reading a large array in one or a few batches.

    >>> ring = array_slice(fd, start=65537, count=65537)     # doctest: +SKIP
"""

import ctypes
import os

from ebpf.errors import BpfError
from ebpf.testrun import libbpf


class _BatchOpts(ctypes.Structure):
    """struct bpf_map_batch_opts (libbpf bpf.h)."""

    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


def array_slice(fd, start, count, value_type=ctypes.c_uint32) -> list:
    """Values [start, start + count) of an array map (u32 keys), with BPF_MAP_LOOKUP_BATCH:
    a batch resumes after the key its token names, so one that starts at `start` is given
    start - 1 (none for 0)."""
    keys = (ctypes.c_uint32 * count)()
    values = (value_type * count)()
    got = 0
    token_in, token_out = ctypes.c_uint32(start - 1), ctypes.c_uint32()
    opts = _BatchOpts(sz=ctypes.sizeof(_BatchOpts))
    while got < count:
        n = ctypes.c_uint32(count - got)
        err = libbpf().bpf_map_lookup_batch(
            fd,
            ctypes.byref(token_in) if start + got > 0 else None,
            ctypes.byref(token_out),
            ctypes.byref(keys, got * 4),
            ctypes.byref(values, got * ctypes.sizeof(value_type)),
            ctypes.byref(n),
            ctypes.byref(opts),
        )
        got += n.value
        if err == -2 or n.value == 0:  # ENOENT: the map's end
            break
        if err:
            raise BpfError(f"reading map fd {fd} in batches: {os.strerror(-err)}")
        token_in.value = token_out.value
    if got != count:
        raise BpfError(f"map fd {fd}: {got} of {count} entries from {start}")
    return values[:got]  # a simple type's array slices to Python ints
