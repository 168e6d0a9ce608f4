"""Network namespaces the lab owns: create, enter, run in, and remove them.

Every name the lab creates starts with PREFIX ("vtl-"), and the functions that
remove or kill refuse any other name: the lab can never delete a namespace it did
not make, and never works in the root namespace.
"""

import ctypes
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from pyroute2 import IPRoute, netns as _netns

PREFIX = "vtl-"
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class LabError(Exception):
    """A lab operation failed; the message says which and why, in one line."""


def _check_ours(name):
    if not name.startswith(PREFIX):
        raise LabError(f"refusing to touch namespace {name!r}: lab namespaces are named {PREFIX}*")


def exists(name) -> bool:
    return (NETNS_DIR / name).exists()


def create(name):
    _check_ours(name)
    if exists(name):
        raise LabError(f"namespace {name} already exists")
    # pyroute2 makes the namespace in a forked helper; on a loaded machine it has
    # been seen to return with nothing in place, so check, and try again.
    for _ in range(3):
        _netns.create(name)
        if _is_netns(name):
            return
        time.sleep(0.1)
    raise LabError(f"creating namespace {name}: {NETNS_DIR / name} did not appear")


def _is_netns(name):
    """True when /run/netns/<name> is a bound network namespace, not an empty file."""
    try:
        with open(NETNS_DIR / name) as f:
            return os.fstat(f.fileno()).st_dev != os.stat(NETNS_DIR).st_dev
    except FileNotFoundError:
        return False


def lab_namespaces():
    return sorted(n for n in _netns.listnetns() if n.startswith(PREFIX))


def ipr(name) -> IPRoute:
    """A netlink socket inside a lab namespace (never creates one: flags=0)."""
    _check_ours(name)
    return IPRoute(netns=name, flags=0)


@contextmanager
def entered(name):
    """Run the body with this thread inside namespace `name`.

    setns() changes only the calling thread, and sockets keep the namespace they
    were made in, so a socket opened here can be used after the block ends.
    """
    _check_ours(name)
    with open("/proc/thread-self/ns/net") as home, open(NETNS_DIR / name) as target:
        if _libc.setns(target.fileno(), CLONE_NEWNET) != 0:
            raise LabError(f"entering namespace {name}: {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            if _libc.setns(home.fileno(), CLONE_NEWNET) != 0:  # pragma: no cover - would be fatal
                os.abort()


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
    return ["ip", "netns", "exec", name, *map(str, argv)]


def run(name, argv, check=True, timeout=60, **kw):
    return subprocess.run(command(name, argv), check=check, timeout=timeout, **kw)


def popen(name, argv, **kw):
    return subprocess.Popen(command(name, argv), **kw)


def pids(name):
    """Processes whose network namespace is `name`."""
    try:
        ino = os.stat(NETNS_DIR / name).st_ino
    except FileNotFoundError:
        return []
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.stat(proc / "ns/net").st_ino == ino:
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
    """Kill what runs in the namespace, then delete it (and so its interfaces)."""
    _check_ours(name)
    if not exists(name):
        return
    kill_all(name)
    _netns.remove(name)
