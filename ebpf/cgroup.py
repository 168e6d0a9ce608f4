"""Cgroup programs: attach a loaded program to a cgroup v2 directory, detach it, and
find what a killed process left attached (through libbpf.so.1, as ebpf.maps does).

    a = attach(fn.fd, "/sys/fs/cgroup/unified/pods", "CGROUP_INET4_CONNECT")
    detach(a)
    cleanup("pods_")        # programs named pods_* on any cgroup that no process holds

A path is the host's: a process started by `ip netns exec` has a mount namespace and
a /sys of its own, with no cgroup hierarchy mounted, so the hierarchy is reached
through the nearest ancestor process that has it mounted (/proc/PID/root: the
shell that ran `ip netns exec`). An attachment keeps its cgroup open, to detach
whatever became of that process.

Programs are attached with BPF_F_ALLOW_MULTI: beside whatever else is there (a
Cilium or systemd program on the same cgroup), never in its place. An attachment
outlives the process that made it (the kernel holds the program), so an orphan is
told as tc's are (ebpf.holders): a program on a cgroup that no process holds an fd
to any more.
"""

import ctypes
import errno
import os
from dataclasses import dataclass
from pathlib import Path

from ebpf.errors import AttachError, InputError
from ebpf.holders import holders, prog_id, prog_name
from ebpf.testrun import libbpf

# enum bpf_attach_type (uapi bpf.h), the socket-address hooks the lab uses
ATTACH_TYPES = {
    "CGROUP_INET4_CONNECT": 10,
    "CGROUP_INET6_CONNECT": 11,
    "CGROUP_UDP4_SENDMSG": 14,
    "CGROUP_UDP6_SENDMSG": 15,
    "CGROUP_UDP4_RECVMSG": 19,
    "CGROUP_UDP6_RECVMSG": 20,
}
BPF_F_ALLOW_MULTI = 2
CGROUP2_MAGIC = 0x63677270


@dataclass
class Attachment:
    path: str
    attach_type: str
    prog_fd: int  # our own duplicate: detaching needs the program, whatever closed its fd since
    name: str
    cg_fd: int = -1  # the cgroup, kept open (see the top)

    @property
    def where(self) -> str:
        return f"{self.name} on cgroup {self.path} ({self.attach_type.lower()})"


def v2_mounts(mounts="/proc/self/mounts") -> list[Path]:
    """Where cgroup v2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host)."""
    out = []
    with open(mounts) as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                out.append(Path(parts[1].replace("\\040", " ")))
    return out


def _in(p: Path, mounts) -> bool:
    return any(p == m or m in p.parents for m in mounts)


def _ancestors():
    pid = os.getppid()
    while pid > 1:
        yield pid
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return
    yield 1


def _roots() -> list[tuple[Path, list[Path]]]:
    """[(how to reach a host path, the cgroup v2 mounts there)]: this mount namespace's,
    else the nearest ancestor's that has one mounted and lets us in (see the top)."""
    here = v2_mounts()
    if here:
        return [(Path("/"), here)]
    for pid in _ancestors():
        try:
            mounts = v2_mounts(f"/proc/{pid}/mounts")
            reach = Path(f"/proc/{pid}/root")
            if mounts and os.listdir(reach / mounts[0].relative_to("/")) is not None:
                return [(reach, mounts)]
        except OSError:
            continue
    return [(Path("/"), [])]


def _open_cgroup(path) -> int:
    p = Path(os.path.abspath(path))
    reach, mounts = _roots()[0]
    real = reach / p.relative_to("/")
    if not real.is_dir():
        raise InputError(f"{path}: no such cgroup directory")
    if not _in(p.resolve() if reach == Path("/") else p, mounts):
        names = ", ".join(map(str, mounts)) or "none mounted"
        raise InputError(f"{path} is not in a cgroup v2 hierarchy ({names}): socket programs attach only there")
    return os.open(real, os.O_RDONLY | os.O_DIRECTORY)


def check_dir(path):
    """InputError, in one line, unless `path` is a cgroup v2 directory."""
    os.close(_open_cgroup(path))


def attach(prog_fd: int, path, attach_type: str, name="") -> Attachment:
    """Attach a loaded program (its fd) to the cgroup at `path`, beside what is there."""
    kind = ATTACH_TYPES[attach_type]
    cg = _open_cgroup(path)
    if libbpf().bpf_prog_attach(prog_fd, cg, kind, BPF_F_ALLOW_MULTI) != 0:
        err = ctypes.get_errno()
        os.close(cg)
        raise AttachError(f"attaching {name or 'a program'} to cgroup {path}: {os.strerror(err)}")
    return Attachment(str(path), attach_type, os.dup(prog_fd), name, cg)


def detach(a: Attachment):
    """Off its cgroup (a cgroup removed since took the attachment with it: nothing to do)."""
    if a.prog_fd < 0:
        return
    try:
        if libbpf().bpf_prog_detach2(a.prog_fd, a.cg_fd, ATTACH_TYPES[a.attach_type]) != 0:
            err = ctypes.get_errno()
            if err != errno.ENOENT:  # the cgroup was removed since, the attachment with it
                raise AttachError(f"detaching {a.where}: {os.strerror(err)}")
    finally:
        os.close(a.prog_fd)
        os.close(a.cg_fd)
        a.prog_fd = a.cg_fd = -1


def attached(path, attach_type: str) -> list[int]:
    """The ids of the programs attached to one cgroup at one hook."""
    cg = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ids = (ctypes.c_uint32 * 64)()
        count = ctypes.c_uint32(len(ids))
        flags = ctypes.c_uint32(0)
        if libbpf().bpf_prog_query(cg, ATTACH_TYPES[attach_type], 0, ctypes.byref(flags), ids, ctypes.byref(count)):
            return []
        return list(ids[: count.value])
    finally:
        os.close(cg)


def find(prefix: str, within=None) -> list[tuple[str, str, int, str]]:
    """(cgroup path, attach type, program id, name) of every program whose name starts with
    `prefix`, attached anywhere in the cgroup v2 hierarchies, or (within: cgroup paths)
    on those cgroups alone."""
    out = []
    reach, mounts = _roots()[0]
    if within is not None:
        places = [(reach / Path(os.path.abspath(p)).relative_to("/"), str(p)) for p in within]
    else:
        places = [
            (real, "/" + str(Path(real).relative_to(reach)))
            for root in mounts
            for real, _, _ in os.walk(reach / root.relative_to("/"))
        ]
    for real, d in places:
        for kind in ATTACH_TYPES:
            try:
                ids = attached(real, kind)
            except OSError:
                continue
            for i in ids:
                name = prog_name(i) or ""
                if name.startswith(prefix):
                    out.append((d, kind, i, name))
    return out


def _netns_of(pid) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def cleanup(prefix: str, spare_live=True, within=None) -> tuple[list[str], list[str]]:
    """Detach the programs named `prefix`* that no process holds (a killed run's); with
    spare_live=False, live ones too, of processes in this network namespace only;
    within: on those cgroups alone (find()), as a caller that knows where its own are.
    Cgroups are the machine's, not a namespace's: where hosts are namespaces of one
    machine (the hosts tests' rack), a host's cleanup of every run of its own would
    otherwise detach another host's live programs, or a run of the machine's own, as
    the tc filters it removes are only those of its own namespace. Returns (what was
    removed, what was spared)."""
    found = find(prefix, within)
    held = holders([i for _, _, i, _ in found])
    here = _netns_of("self")
    removed, spared = [], []
    for path, kind, i, name in found:
        elsewhere = [p for p in held[i] if _netns_of(p) != here]
        if held[i] and (spare_live or elsewhere):
            where = " in another network namespace" if elsewhere and not spare_live else ""
            spared.append(f"{name} on cgroup {path} (pid {', '.join(map(str, held[i]))}{where})")
            continue
        fd = libbpf().bpf_prog_get_fd_by_id(ctypes.c_uint32(i))
        if fd < 0:
            continue
        try:
            cg = _open_cgroup(path)
        except (InputError, OSError):
            os.close(fd)
            continue
        try:
            detach(Attachment(path, kind, fd, name, cg))
        except AttachError as e:
            spared.append(str(e))
            continue
        removed.append(f"{name} on cgroup {path} ({kind.lower()})")
    return removed, spared


__all__ = ["ATTACH_TYPES", "Attachment", "attach", "attached", "check_dir", "cleanup", "detach", "find", "prog_id"]
