"""The suite's own bookkeeping, run as an inner pytest with this suite's conftest:
it starts from a host that dead lab runs left things on, and it names a run whose
owner outlived its test and then exited without its teardown."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from lab import netns
from lab.runs import dead_runs

ROOT = Path(__file__).resolve().parents[1]

# A process that builds Testbed 1, says its run id and waits to be killed.
OWNER = """
import time
from lab import testbed1
tb = testbed1().build()
print(tb.topo.run_id, flush=True)
time.sleep(120)
"""

CONFTEST = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("suite_conftest", {str(ROOT / "tests" / "conftest.py")!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_sessionstart = suite.pytest_sessionstart
no_leftovers = suite.no_leftovers
"""

INNER = f"""
import subprocess, sys
OWNER = {OWNER!r}
started = []

def test_starts_a_run_that_outlives_it():
    proc = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    started.append((proc, proc.stdout.readline().strip()))
    assert started[0][1]

def test_its_owner_exits_without_teardown():
    proc, run_id = started[0]
    print("RUN", run_id)
    proc.kill()
    proc.wait()
"""


def _killed_run():
    proc = subprocess.Popen([sys.executable, "-c", OWNER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        run_id = proc.stdout.readline().strip()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert run_id in dead_runs()
    return run_id


def test_a_dead_runs_leftovers_are_removed_first_and_a_run_left_late_is_named(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(INNER)
    dead = _killed_run()
    try:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-s",
                "-q",
                "--rootdir",
                str(tmp_path),
                str(tmp_path / "test_inner.py"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        out = r.stdout
        assert f"tests: removed what dead lab runs left before starting: namespace {netns.PREFIX}{dead}-" in out, out
        assert not [n for n in netns.lab_namespaces() if n.startswith(f"{netns.PREFIX}{dead}-")]
        late = re.findall(r"RUN ([0-9a-f]{6})", out)
        assert len(late) == 1, out
        # both tests pass (the first one's run had a live owner when it ended); the
        # second's teardown fails, naming what the dead owner left, and removes it
        assert "2 passed, 1 error" in out, out
        assert "a lab run's owner exited without its teardown" in out, out
        assert f"{netns.PREFIX}{late[0]}-receiver" in out, out
        assert not [n for n in netns.lab_namespaces() if n.startswith(f"{netns.PREFIX}{late[0]}-")]
    finally:
        for name in netns.lab_namespaces():
            if name.startswith(f"{netns.PREFIX}{dead}-"):
                netns.remove(name)


def test_a_lab_instance_with_a_prefix_of_its_own_neither_sees_nor_cleans_anothers():
    """The suite's workers are lab instances of their own (VTL_NETNS_PREFIX): one's dead
    run is not the other's leftover, and the other's `lab cleanup` leaves it; the
    owning instance's cleanup removes it. A prefix of another form is refused."""
    other = {**os.environ, "VTL_NETNS_PREFIX": "vt9z-"}
    proc = subprocess.Popen([sys.executable, "-c", OWNER], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=other)
    try:
        run_id = proc.stdout.readline().strip()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    theirs = [f"vt9z-{run_id}-{h}" for h in ("monitor", "receiver", "sender")]
    try:
        assert run_id and all(netns.exists(n) for n in theirs)
        assert run_id not in dead_runs() and not set(theirs) & set(netns.lab_namespaces())
        mine = subprocess.run([sys.executable, "-m", "lab", "cleanup"], cwd=ROOT, capture_output=True, text=True)
        assert mine.returncode == 0 and "vt9z-" not in mine.stdout, mine.stdout
        assert all(netns.exists(n) for n in theirs)
        own = subprocess.run(
            [sys.executable, "-m", "lab", "cleanup"], cwd=ROOT, capture_output=True, text=True, env=other
        )
        assert own.returncode == 0 and all(f"lab: removed namespace {n}" in own.stdout for n in theirs), own.stdout
        assert not any(netns.exists(n) for n in theirs)
    finally:
        subprocess.run([sys.executable, "-m", "lab", "cleanup"], cwd=ROOT, capture_output=True, env=other)
    for bad in ("", "vtl", "tmp-", "vt-", "vtabcde-", "VT1-"):
        r = subprocess.run(
            [sys.executable, "-m", "lab", "cleanup"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "VTL_NETNS_PREFIX": bad},
        )
        assert r.returncode != 0 and r.stdout == "", (bad, r)
        assert r.stderr.strip().splitlines() == [
            f'lab: error: VTL_NETNS_PREFIX={bad!r}: a lab namespace prefix is "vt", 1-4 lower-case letters or '
            'digits and "-" (such as vt1-); unset it for vtl-'
        ], (bad, r.stderr)
