"""Which processes hold a BPF program, and what BPF memory a process holds: how
a live vTAP is told from a dead one's leftovers without a state file, and what
a program's maps cost.

A program stays loaded while a filter or a file descriptor refers to it. A vTAP
keeps the fd of its program open as long as it runs; after `kill -9` only the
filter is left. So a filter whose program no process holds is an orphan.
"""

import ctypes
import os
from pathlib import Path

from ebpf.testrun import libbpf


def prog_id(fd: int) -> int:
    """The kernel's id of the BPF program behind one of our file descriptors."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("prog_id:"):
                return int(line.split()[1])
    raise ValueError(f"fd {fd} is not a BPF program")


def holders(prog_ids) -> dict[int, list[int]]:
    """{program id: [pids holding an fd to it]} for the given ids, ours included.
    Reads /proc/<pid>/fd and fdinfo: only BPF-program fds are opened."""
    want = set(prog_ids)
    found = {i: [] for i in want}
    if not want:
        return found
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = os.listdir(proc / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(proc / "fd" / fd) != "anon_inode:bpf-prog":
                    continue
                with open(proc / "fdinfo" / fd) as f:
                    for line in f:
                        if line.startswith("prog_id:"):
                            pid_prog = int(line.split()[1])
                            if pid_prog in want and int(proc.name) not in found[pid_prog]:
                                found[pid_prog].append(int(proc.name))
                            break
            except OSError:
                continue
    return found


def maps_memlock(pids) -> int:
    """The locked memory of every BPF map the processes hold an fd to, each map
    once (fdinfo's memlock): what a program's maps cost in kernel memory."""
    maps = {}  # map id -> bytes: a map may be open on several fds
    for pid in pids:
        fds = Path(f"/proc/{pid}/fdinfo")
        try:
            entries = list(fds.iterdir())
        except OSError:
            continue
        for fd in entries:
            try:
                info = fd.read_text()
            except OSError:
                continue
            if "map_type:" in info:
                fields = dict(ln.split(":", 1) for ln in info.splitlines() if ":" in ln)
                maps[int(fields["map_id"])] = int(fields["memlock"])
    return sum(maps.values())


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def prog_name(prog_id: int) -> str | None:
    """The name the kernel keeps for a program (its function's name, cut to 15
    characters), or None when no such program is loaded. Asked through libbpf:
    bpf_prog_get_fd_by_id(), then bpf_obj_get_info_by_fd(); struct
    bpf_prog_info keeps the name at offset 64."""
    lib = libbpf()
    fd = lib.bpf_prog_get_fd_by_id(ctypes.c_uint32(prog_id))
    if fd < 0:
        return None
    try:
        info = ctypes.create_string_buffer(256)
        size = ctypes.c_uint32(len(info))
        if lib.bpf_obj_get_info_by_fd(fd, info, ctypes.byref(size)) != 0:
            return None
        return info.raw[64:80].split(b"\0", 1)[0].decode()
    finally:
        os.close(fd)
