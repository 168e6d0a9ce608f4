"""What the kernel says of a BPF program or map behind a file descriptor, and
descriptors from ids: how a datapath left attached (`lab lb --keep`, or a
killed run) is recognised and taken over. libbpf.so.1 through ctypes, as
testrun.py uses it.

    >>> p = prog(fd)                             # doctest: +SKIP
    >>> p.tag, p.name, [map_(m).name for m in ...]

A program's tag is the kernel's hash of its instructions with map references
zeroed: two loads of the same C text, compiled with the same flags for the same
kernel, have the same tag; anything that changes the code changes it.
"""

import ctypes
import os
from dataclasses import dataclass

from ebpf.errors import BpfError
from ebpf.testrun import libbpf


class _ProgInfo(ctypes.Structure):
    """The head of struct bpf_prog_info (uapi bpf.h), up to its name: the kernel
    fills as much as the size we pass."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("tag", ctypes.c_uint8 * 8),
        ("jited_prog_len", ctypes.c_uint32),
        ("xlated_prog_len", ctypes.c_uint32),
        ("jited_prog_insns", ctypes.c_uint64),
        ("xlated_prog_insns", ctypes.c_uint64),
        ("load_time", ctypes.c_uint64),
        ("created_by_uid", ctypes.c_uint32),
        ("nr_map_ids", ctypes.c_uint32),
        ("map_ids", ctypes.c_uint64),
        ("name", ctypes.c_char * 16),
    ]


class MapInfo(ctypes.Structure):
    """struct bpf_map_info (uapi bpf.h), up to map_extra."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
        ("ifindex", ctypes.c_uint32),
        ("btf_vmlinux_value_type_id", ctypes.c_uint32),
        ("netns_dev", ctypes.c_uint64),
        ("netns_ino", ctypes.c_uint64),
        ("btf_id", ctypes.c_uint32),
        ("btf_key_type_id", ctypes.c_uint32),
        ("btf_value_type_id", ctypes.c_uint32),
        ("_pad", ctypes.c_uint32),
        ("map_extra", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class Prog:
    id: int
    tag: str  # hex, as bpftool prints it
    name: str
    map_ids: tuple


@dataclass(frozen=True)
class Map:
    """A map's shape: what a program compiled against it expects (its id apart)."""

    name: str
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int


def _info(fd, info):
    size = ctypes.c_uint32(ctypes.sizeof(info))
    err = libbpf().bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size))
    if err:  # libbpf 1.x: -errno
        raise BpfError(f"reading BPF object info of fd {fd}: {os.strerror(-err)}")
    return info


def prog(fd) -> Prog:
    """The program behind `fd`: its id, tag, name and the ids of the maps it uses."""
    first = _info(fd, _ProgInfo())
    ids = (ctypes.c_uint32 * max(1, first.nr_map_ids))()
    again = _ProgInfo(nr_map_ids=first.nr_map_ids, map_ids=ctypes.addressof(ids))
    info = _info(fd, again)
    n = min(first.nr_map_ids, info.nr_map_ids)
    return Prog(info.id, bytes(info.tag).hex(), info.name.decode(), tuple(ids[:n]))


def map_info(fd) -> MapInfo:
    """All the kernel says of the map behind `fd` (its BTF ids, flags, ...)."""
    return _info(fd, MapInfo())


def map_(fd) -> Map:
    info = map_info(fd)
    return Map(info.name.decode(), info.type, info.key_size, info.value_size, info.max_entries, info.map_flags)


def _fd_by_id(call, kind, id_) -> int:
    fd = call(id_)
    if fd < 0:  # -errno
        raise BpfError(f"BPF {kind} {id_}: {os.strerror(-fd)}")
    return fd


def prog_fd(id_) -> int:
    """A new file descriptor of the program with this id (the caller closes it)."""
    return _fd_by_id(libbpf().bpf_prog_get_fd_by_id, "program", id_)


def map_fd(id_) -> int:
    return _fd_by_id(libbpf().bpf_map_get_fd_by_id, "map", id_)


def maps_of(prog_fd_) -> dict[str, tuple[int, Map]]:
    """{name: (a new fd, its shape)} of every map the program uses (the caller closes the fds)."""
    out = {}
    try:
        for id_ in prog(prog_fd_).map_ids:
            fd = map_fd(id_)
            m = map_(fd)
            out[m.name] = (fd, m)
    except BaseException:
        for fd, _ in out.values():
            os.close(fd)
        raise
    return out
