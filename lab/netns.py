"""Network namespaces the lab owns: create, enter, run in, and remove them.

Every name the lab creates starts with PREFIX ("vtl-"), and the functions that
remove or kill refuse any other name: the lab can never delete a namespace it did
not make, and never works in the root namespace. VTL_NETNS_PREFIX gives a lab
process (and what it starts) a prefix of its own, "vt" and 1-4 letters or digits
and "-": it then sees, and cleans up, only its own runs. The test suite's parallel
workers each have one, so that one's `lab cleanup` never takes the other's runs.

No Python code runs in a forked copy of this process here (commands are started
with subprocess, which execs at once). A namespace is made as `ip netns add` makes
it, in this process: /run/netns a shared mount point, an empty file,
unshare(CLONE_NEWNET) in a short-lived thread, that thread's namespace bind-mounted
onto the file. Netlink sockets are opened in a thread that has entered the
namespace. pyroute2's netns.create() and IPRoute(netns=...) instead fork helpers
that run on a copy of the caller's Python stack and signal handlers, and pyroute2
stops an IPRoute helper with SIGTERM: under a handler that raises (as `python -m
lab` had before df076bb) a helper unwound that copy through our `with` blocks and
teardown, and deleted the namespaces its parent had just built.
"""

import ctypes
import errno
import fcntl
import os
import re
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from ebpf import netdev
from ebpf.errors import BpfError

_PREFIX_FORM = re.compile(r"vt[a-z0-9]{1,4}-")


def _prefix(value) -> str:
    """The lab's namespace prefix: VTL_NETNS_PREFIX if it has the form (no other
    name may start with a lab prefix, nor one lab prefix with another), else "vtl-"."""
    if value is None:
        return "vtl-"
    if not _PREFIX_FORM.fullmatch(value):
        raise SystemExit(
            f'lab: error: VTL_NETNS_PREFIX={value!r}: a lab namespace prefix is "vt", '
            '1-4 lower-case letters or digits and "-" (such as vt1-); unset it for vtl-'
        )
    return value


PREFIX = _prefix(os.environ.get("VTL_NETNS_PREFIX"))


def foreign(name) -> bool:
    """A namespace of another lab instance (another prefix): never this one's to clean."""
    head = name.split("-", 1)[0] + "-"
    return "-" in name and head != PREFIX and (head == "vtl-" or bool(_PREFIX_FORM.fullmatch(head)))


NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = netdev.CLONE_NEWNET
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SHARED = 1 << 20
MNT_DETACH = 0x2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]


class LabError(Exception):
    """A lab operation failed; the message says which and why, in one line."""


# On a host the user named in an inventory (lab.hosts), the lab's runner works in
# the host's own network namespace, on the interfaces the inventory names and no
# other: there, and only in a process that said so (host_mode()), the namespace
# None means "this one". Everywhere else None is refused like any name not ours,
# so no slip can put a lab program or address in a machine's root namespace.
HOST_MODE = False
# The protocol number (`ip route ... proto 250`) of the routes the lab adds in a host's own
# namespace (a pods node's to the other nodes' pods): a host's cleanup flushes exactly these
LAB_ROUTE_PROTO = 250


def host_mode():
    """This process is a lab runner on a user's host (lab.hosts.runner): None names its own namespace."""
    global HOST_MODE
    HOST_MODE = True


def _check_ours(name):
    if name is None:
        if not HOST_MODE:
            raise LabError("refusing to work in this namespace: the lab works in its own namespaces only")
        return
    if not name.startswith(PREFIX) or "/" in name or name in (PREFIX, ".", ".."):
        raise LabError(f"refusing to touch namespace {name!r}: lab namespaces are named {PREFIX}*")


def _errno_text():
    return os.strerror(ctypes.get_errno())


def exists(name) -> bool:
    if name is None:
        return HOST_MODE
    return (NETNS_DIR / name).exists()


def _shared_run_dir():
    """Make NETNS_DIR a shared mount point, as `ip netns add` does, so namespaces
    bound under it propagate into the mount namespaces of running `ip netns exec`
    children (and their removal does too). Serialised by a lock on the directory:
    two first-time callers must not both bind it onto itself."""
    NETNS_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    d = bytes(NETNS_DIR)
    fd = os.open(NETNS_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        made = False
        while _libc.mount(b"", d, b"none", MS_SHARED | MS_REC, None) != 0:
            if ctypes.get_errno() != errno.EINVAL or made:  # EINVAL: not a mount point yet
                raise LabError(f"making {NETNS_DIR} a shared mount point: {_errno_text()}")
            if _libc.mount(d, d, b"none", MS_BIND | MS_REC, None) != 0:
                raise LabError(f"bind-mounting {NETNS_DIR} onto itself: {_errno_text()}")
            made = True
    finally:
        os.close(fd)  # and with it the lock


def _bind_new_netns(path):
    """A new network namespace, bound onto `path` (an existing empty file).

    unshare() runs in a thread of our own that exits right after: it moves only
    that thread, and the bind mount keeps the namespace alive without it."""
    failure = []

    def work():
        if _libc.unshare(CLONE_NEWNET) != 0:
            failure.append(f"unshare(CLONE_NEWNET): {_errno_text()}")
        elif _libc.mount(b"/proc/thread-self/ns/net", bytes(path), b"none", MS_BIND, None) != 0:
            failure.append(f"bind-mounting the new namespace onto {path}: {_errno_text()}")

    worker = threading.Thread(target=work, name=f"netns-create {path.name}")
    worker.start()
    try:
        worker.join()
    except BaseException:
        worker.join()  # it takes milliseconds; finish before anything is undone
        raise
    if failure:
        raise LabError(f"creating namespace {path.name}: {failure[0]}")


def create(name):
    """Create network namespace `name` (bound at /run/netns/<name>), or raise LabError
    with nothing left behind."""
    _check_ours(name)
    path = NETNS_DIR / name
    _shared_run_dir()
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0))
    except FileExistsError:
        raise LabError(f"namespace {name} already exists") from None
    except OSError as e:
        raise LabError(f"creating namespace {name}: {path}: {e.strerror}") from None
    try:
        _bind_new_netns(path)
        if not _is_netns(name):  # pragma: no cover - the kernel said the mount was made
            raise LabError(f"creating namespace {name}: {path} is not a namespace after the bind mount")
    except BaseException:
        try:
            _unbind(path)
        except LabError:
            pass  # what failed first says more; remove() clears what is left
        raise


def _unbind(path):
    """Undo a binding: detach the mount (if any), remove the file (if any)."""
    if _libc.umount2(bytes(path), MNT_DETACH) != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT):
        # EINVAL: not a mount point (an empty file left by a crash); ENOENT: gone
        raise LabError(f"removing namespace {path.name}: unmounting {path}: {_errno_text()}")
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise LabError(f"removing namespace {path.name}: {path}: {e.strerror}") from None


def _is_netns(name):
    """True when /run/netns/<name> is a bound network namespace, not an empty file."""
    try:
        with open(NETNS_DIR / name) as f:
            return os.fstat(f.fileno()).st_dev != os.stat(NETNS_DIR).st_dev
    except FileNotFoundError:
        return False


def lab_namespaces():
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(PREFIX))
    except FileNotFoundError:
        return []


def ipr(name) -> netdev.Netlink:
    """An IPRoute whose netlink socket lives in lab namespace `name` (never creates
    one, forks nothing, works from any thread: see ebpf.netdev.ipr)."""
    _check_ours(name)
    try:
        return netdev.ipr(None if name is None else str(NETNS_DIR / name))
    except BpfError as e:
        raise LabError(str(e)) from None


@contextmanager
def entered(name):
    """Run the body with this thread inside namespace `name` (ebpf.netdev.entered)."""
    _check_ours(name)
    if name is None:  # a host runner, in its host's namespace: already there
        yield
        return
    inside = netdev.entered(str(NETNS_DIR / name))
    try:
        inside.__enter__()
    except BpfError as e:  # missing, or not a namespace (a stale file): say it as the lab does
        raise LabError(f"entering namespace {name}: {e}") from None
    try:
        yield
    finally:
        inside.__exit__(None, None, None)  # back to our own namespace, whatever the body raised


def sysctl(name, key, value):
    """Set a net.* sysctl inside a namespace (never in the root namespace)."""
    with entered(name):
        Path("/proc/sys", key.replace(".", "/")).write_text(f"{value}\n")


def read_sysctl(name, key):
    with entered(name):
        return Path("/proc/sys", key.replace(".", "/")).read_text().strip()


def command(name, argv):
    """argv run inside namespace `name` (ip netns exec also gives it its own /sys)."""
    _check_ours(name)
    if name is None:
        return [*map(str, argv)]
    return ["ip", "netns", "exec", name, *map(str, argv)]


def run(name, argv, check=True, timeout=60, **kw):
    return subprocess.run(command(name, argv), check=check, timeout=timeout, **kw)


def popen(name, argv, **kw):
    return subprocess.Popen(command(name, argv), **kw)


def pids(name):
    """Processes whose network namespace is `name`."""
    try:
        st = os.stat(NETNS_DIR / name)
    except FileNotFoundError:
        return []
    ident = (st.st_dev, st.st_ino)  # an unbound file's inode is no namespace's
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ns = os.stat(proc / "ns/net")
            if (ns.st_dev, ns.st_ino) == ident:
                found.append(int(proc.name))
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return found


def kill_all(name, grace=2.0):
    """SIGTERM every process in the namespace, SIGKILL what is left after `grace`."""
    _check_ours(name)
    me = os.getpid()
    victims = [p for p in pids(name) if p != me]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in victims:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            victims = [p for p in victims if alive(p)]
            if not victims:
                return
            time.sleep(0.05)


def alive(pid) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def stop(proc, grace=5.0):
    """Stop a child we started: SIGTERM (to its whole process group when it leads
    one, so forked helpers go too), SIGKILL after `grace` seconds, then reap it."""

    def send(sig):
        try:
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass

    if proc.poll() is not None:
        return
    send(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait()


def remove(name):
    """Kill what runs in the namespace, then delete it (and so its interfaces): the
    inverse of create(), and also clears an unbound file a crash left behind."""
    _check_ours(name)
    path = NETNS_DIR / name
    if not os.path.lexists(path):
        return
    kill_all(name)
    _unbind(path)
