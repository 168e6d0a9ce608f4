"""lab.netns makes and removes real namespaces, forks no helper to do it, and a
namespace it made stays made (issue 8: the demo once in five found a namespace
missing right after creation).

The cause: pyroute2's netns.create() and IPRoute(netns=...) fork helpers that run
on a copy of the caller's Python stack and signal handlers. pyroute2 stops an
IPRoute helper with SIGTERM; where the caller's SIGTERM handler raises (as
`python -m lab` did), a helper not yet at its os._exit() unwound that copy through
the topology's `with` blocks and teardown, and deleted its parent's namespaces.
"""

import os
import secrets
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lab import netns
from lab.netns import LabError

ROOT = Path(__file__).resolve().parents[1]


def fresh_prefix():
    while True:
        prefix = f"{netns.PREFIX}{secrets.token_hex(3)}-"
        if not any(n.startswith(prefix) for n in netns.lab_namespaces()):
            return prefix


def bound_ns(name):
    """(st_dev, st_ino) of the namespace bound at /run/netns/<name>; fails if the
    file is missing or is a plain file (not a bound namespace)."""
    path = netns.NETNS_DIR / name
    st = os.stat(path)
    assert st.st_dev != os.stat(netns.NETNS_DIR).st_dev, f"{path} is a plain file, not a bound namespace"
    assert st.st_ino != os.stat("/proc/self/ns/net").st_ino, f"{path} is our own namespace"
    return st.st_dev, st.st_ino


def mounted(path):
    return any(line.split()[4] == str(path) for line in open("/proc/self/mountinfo"))


def only_loopback(name):
    with netns.ipr(name) as ip:
        return [link.get_attr("IFLA_IFNAME") for link in ip.get_links()] == ["lo"]


def cycles(prefix, n, seen):
    for i in range(n):
        name = f"{prefix}{i}"
        netns.create(name)
        try:
            ident = bound_ns(name)
            assert ident not in seen, f"{name} is the same namespace as another live one"
            seen.add(ident)
            assert only_loopback(name)
            assert netns.read_sysctl(name, "net.ipv4.ip_forward") == "0"
        finally:
            netns.remove(name)
        seen.discard(ident)
        assert not os.path.lexists(netns.NETNS_DIR / name)
        assert not mounted(netns.NETNS_DIR / name)


def test_create_remove_cycles_each_leave_a_bound_namespace():
    cycles(fresh_prefix(), 100, set())


def test_concurrent_creation_from_two_threads():
    prefix = fresh_prefix()
    seen, errors = set(), []
    start = threading.Barrier(2)

    def worker(tag):
        try:
            start.wait()
            cycles(f"{prefix}{tag}", 40, seen)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {tag}: {e!r}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not [n for n in netns.lab_namespaces() if n.startswith(prefix)]


def test_no_helper_process_is_forked(monkeypatch):
    """create, ipr, sysctl and remove work with fork forbidden: no forked helper
    can run a copy of our stack (pyroute2's create() and IPRoute(netns=) fork)."""

    def no_fork():
        raise AssertionError("lab.netns forked a helper process")

    monkeypatch.setattr(os, "fork", no_fork)
    name = fresh_prefix() + "nofork"
    netns.create(name)
    try:
        bound_ns(name)
        with netns.ipr(name) as ip:
            ip.link("set", index=ip.link_lookup(ifname="lo")[0], state="up")
        netns.sysctl(name, "net.ipv4.ip_forward", 1)
        assert netns.read_sysctl(name, "net.ipv4.ip_forward") == "1"
    finally:
        netns.remove(name)
    assert not netns.exists(name)


# A process whose SIGTERM handler raises SystemExit, as `python -m lab` had before
# df076bb (and lab.traffic.filetransfer has), builds a testbed and opens 400 netlink
# sockets in its namespaces while two busy loops load the CPUs (a helper is then
# often still running Python when pyroute2 sends it SIGTERM). A forked helper that
# unwinds our stack is caught in the inner `finally`; the namespaces must stay bound.
UNWIND_CHECK = r"""
import os, signal, subprocess, sys
sys.path.insert(0, sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
from lab import netns
from lab.topology import Topology

me = os.getpid()
BUSY = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"  # bounded, even if we are killed
burners = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
t = Topology("unwind")
t.add_host("a")
t.add_host("b")
t.add_link("a", "b")
verdict = "ok"
try:
    try:
        t.build()
        for i in range(200):
            for host in ("a", "b"):
                with netns.ipr(t.ns(host)) as ip:
                    assert ip.link_lookup(ifname="eth0"), f"round {i}: no eth0 in {host}"
            gone = [h for h in ("a", "b") if not netns._is_netns(t.ns(h))]
            if gone:
                verdict = f"round {i}: namespace(s) {gone} missing"
                break
    finally:
        if os.getpid() != me:
            print(f"helper {os.getpid()} of {me} unwound our stack", flush=True)
            os._exit(3)
finally:
    for b in burners:
        b.kill()
        b.wait()
    t.teardown()
print(verdict, flush=True)
"""


def test_namespaces_survive_a_sigterm_handler_that_raises():
    r = subprocess.run([sys.executable, "-c", UNWIND_CHECK, str(ROOT)], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok") and "unwound" not in r.stdout, (
        r.stdout + r.stderr[-2000:]
    )


def test_run_dir_is_shared_and_new_namespaces_reach_running_ip_netns_exec():
    """As with `ip netns add`: a namespace made (and removed) after an `ip netns
    exec` child started, in its own mount namespace, is seen by that child."""
    prefix = fresh_prefix()
    a, b = prefix + "a", prefix + "b"
    netns.create(a)
    try:
        line = [ln.split() for ln in open("/proc/self/mountinfo") if ln.split()[4] == str(netns.NETNS_DIR)]
        assert line, f"{netns.NETNS_DIR} is not a mount point"
        # the topmost mount (listed last) is what paths resolve to; a host may
        # have stacked more under it before we came (pyroute2 takes no lock)
        assert any(f.startswith("shared:") for f in line[-1][6 : line[-1].index("-")]), line[-1]
        probe = (
            "import os, sys\n"
            "p, d = sys.argv[1], os.path.dirname(sys.argv[1])\n"
            "for _ in range(2):\n"
            "    sys.stdin.readline()\n"
            "    if not os.path.lexists(p): print('absent', flush=True); continue\n"
            "    print('bound' if os.stat(p).st_dev != os.stat(d).st_dev else 'plain', flush=True)\n"
        )
        child = netns.popen(
            a,
            [sys.executable, "-c", probe, str(netns.NETNS_DIR / b)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            own_mnt = os.stat("/proc/self/ns/mnt").st_ino
            netns.create(b)
            try:
                child.stdin.write("\n")
                child.stdin.flush()
                assert child.stdout.readline().strip() == "bound"
                assert child.pid in netns.pids(a) and child.pid not in netns.pids(b)
                assert os.stat(f"/proc/{child.pid}/ns/mnt").st_ino != own_mnt  # it is in its own mount ns
            finally:
                netns.remove(b)
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "absent"
        finally:
            netns.stop(child)
    finally:
        netns.remove(a)


def test_create_refuses_an_existing_name_and_leaves_it_alone():
    name = fresh_prefix() + "dup"
    netns.create(name)
    try:
        ident = bound_ns(name)
        with pytest.raises(LabError, match="already exists"):
            netns.create(name)
        assert bound_ns(name) == ident
    finally:
        netns.remove(name)


def test_failed_create_leaves_nothing_behind(monkeypatch):
    name = fresh_prefix() + "fail"

    def fail(path):
        raise LabError(f"creating namespace {path.name}: unshare(CLONE_NEWNET): Operation not permitted")

    monkeypatch.setattr(netns, "_bind_new_netns", fail)
    with pytest.raises(LabError, match="unshare"):
        netns.create(name)
    assert not os.path.lexists(netns.NETNS_DIR / name)


def test_remove_clears_an_unbound_file_left_by_a_crash():
    name = fresh_prefix() + "stale"
    path = netns.NETNS_DIR / name
    path.touch(mode=0)
    try:
        assert netns.exists(name) and netns.pids(name) == []
        netns.remove(name)
        assert not os.path.lexists(path)
    finally:
        path.unlink(missing_ok=True)


def test_ipr_never_creates_a_namespace():
    name = fresh_prefix() + "absent"
    with pytest.raises(LabError, match=f"no network namespace at /run/netns/{name}"):
        netns.ipr(name)
    assert not os.path.lexists(netns.NETNS_DIR / name)
