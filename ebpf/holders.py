"""Which processes hold a BPF program: how a live vTAP is told from a dead one's
leftovers without a state file.

A program stays loaded while a filter or a file descriptor refers to it. A vTAP
keeps the fd of its program open as long as it runs; after `kill -9` only the
filter is left. So a filter whose program no process holds is an orphan.
"""

import os
from pathlib import Path


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


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
