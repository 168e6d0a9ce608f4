"""Shared fixtures. Every test runs for real, as root: real namespaces, real BPF
programs, real packets. Outside CI a test may skip for a missing kernel feature or
tool; under CI=true that is a failure (see require())."""

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The suite runs in parallel processes (pytest-xdist, pyproject's addopts). Each is a lab
# instance of its own, with its own namespace prefix (lab.netns): its runs, dead
# ones, daemons and `lab cleanup` are its own, and the other's are never seen as
# its leftovers. Set before lab is imported, and inherited by every command,
# bench and notebook kernel a test starts.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw"):
    os.environ["VTL_NETNS_PREFIX"] = f"vt{_WORKER[2:]}-"

# Tests send SIGINT to the commands they start, as Ctrl-C at a terminal would. A
# suite started in the background of a script (`make test &`) inherits SIGINT
# ignored, and so would every command it starts: Python then installs no
# KeyboardInterrupt for it, and an interrupted bench ran to its end (exit 0).
# The commands get the terminal's default, however the suite was started.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from lab import cgroups, daemons, netns, runs  # noqa: E402
from lab.cleanup import remove_leftovers  # noqa: E402
from lab.fastpaths.lb import peers as balancers  # noqa: E402,F401 (its daemons register their run directories)
from lab.runs import RUN_DIR, dead_runs  # noqa: E402
from lab.testbeds import testbed1, testbed2, testbed3  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition, what):
    """Skip when `what` is missing, except under CI, where it fails the test."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{what} is missing, and under CI=true nothing may be skipped")
    pytest.skip(f"{what} is missing")


def require_tool(name):
    require(shutil.which(name), f"tool {name!r}")


def pytest_configure(config):
    """Programs compiled once per run of the suite (ebpf/images.py), in a directory of this
    run's own that its workers share: a run starts from no image, whatever a user's cache
    holds, and leaves none behind. A VTL_BPF_CACHE given is used as given."""
    if _WORKER or os.environ.get("VTL_BPF_CACHE"):
        return
    config._vtl_images = tempfile.mkdtemp(prefix="vtl-images-")
    os.environ["VTL_BPF_CACHE"] = config._vtl_images


def pytest_unconfigure(config):
    made = getattr(config, "_vtl_images", None)
    if made:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop("VTL_BPF_CACHE", None)


def pytest_sessionstart(session):
    if os.geteuid() != 0:
        pytest.exit("the test suite runs real namespaces and BPF programs: run it as root (make test)", returncode=4)
    # What dead lab runs left (a killed demo, a crashed notebook kernel) is said by
    # every testbed and command that starts, and `lab cleanup` in the tests removes
    # it: either would fail tests that have nothing to do with it (a CI run did,
    # after two killed runs of Testbed 1). Removed first, as `make cleanup` would;
    # live runs (a second suite, a bench, a notebook) are left alone.
    removed = remove_leftovers()
    if removed:
        print(f"\ntests: removed what dead lab runs left before starting: {', '.join(removed)}", flush=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """VTL_TEST_CPU=FILE: each test's wall time and CPU (its process's own, and that of
    the processes it started and waited for: commands, notebook kernels, daemons), one
    tab-separated line each, appended from every worker. The suite is CPU-bound on two
    cores: wall time alone does not say which tests cost the others their time."""
    out = os.environ.get("VTL_TEST_CPU")
    if not out:
        yield
        return
    import resource  # noqa: PLC0415
    import time  # noqa: PLC0415

    def now():
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.monotonic(), me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime

    t0, me0, kids0 = now()
    yield
    t1, me1, kids1 = now()
    with open(out, "a") as f:
        f.write(f"{item.nodeid}\t{t1 - t0:.2f}\t{me1 - me0:.2f}\t{kids1 - kids0:.2f}\n")


def _daemon_leftovers():
    """Daemons' run directories and cgroups, but another live process's (named
    for a namespace of its runs): a second suite or a bench is no test's leftover."""
    dirs = {d for suffix in daemons.kinds() for d in RUN_DIR.glob(f"{netns.PREFIX}*{suffix}")}
    found = dirs | {c for c in cgroups.lab_cgroups() if c.name.startswith(netns.PREFIX)}
    return {d for d in found if not _another_live_owner(d.name.split(".")[0])}


def _another_live_owner(name):
    run_id = runs.run_of(name)
    return run_id not in runs.LIVE_RUNS and runs.owner_alive(run_id)


@pytest.fixture(autouse=True)
def no_leftovers():
    """Every test must leave no lab namespace behind (its own teardown's job),
    nor a daemon's run directory (Suricata, nginx, proxies, the LB's command
    line) or a Suricata cgroup."""
    before, daemon_files = set(netns.lab_namespaces()), _daemon_leftovers()
    dead_before = set(dead_runs())
    yield
    # A run whose owner (a subprocess, a notebook kernel) was still alive when its
    # test ended, and then exited without its teardown, is dead now: said here, at
    # the latest one test late, rather than by every program that starts after it.
    dead = {r: n for r, n in dead_runs().items() if r not in dead_before}
    for run_id, names in dead.items():
        for name in names:
            netns.remove(name)
        (RUN_DIR / f"{netns.PREFIX}{run_id}.pid").unlink(missing_ok=True)
    assert not dead, f"a lab run's owner exited without its teardown, leaving {sorted(sum(dead.values(), []))}"
    # another live process's runs are its own (a second suite, a bench, a notebook): never ours to remove
    left = {n for n in set(netns.lab_namespaces()) - before if not _another_live_owner(n)}
    for name in left:
        netns.remove(name)
    assert not left, f"test left namespaces behind: {sorted(left)}"
    left = _daemon_leftovers() - daemon_files
    daemons.cleanup()
    assert not left, f"test left daemon run directories or cgroups behind: {sorted(map(str, left))}"


@pytest.fixture
def tb1():
    with testbed1() as tb:
        yield tb


@pytest.fixture
def tb2():
    with testbed2() as tb:
        yield tb


@pytest.fixture
def tb3():
    with testbed3() as tb:
        yield tb
