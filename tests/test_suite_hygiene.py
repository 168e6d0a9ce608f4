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
        r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q", "--rootdir",
                            str(tmp_path), str(tmp_path / "test_inner.py")],
                           cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        out = r.stdout
        assert f"tests: removed what dead lab runs left before starting: namespace vtl-{dead}-" in out, out
        assert not [n for n in netns.lab_namespaces() if n.startswith(f"vtl-{dead}-")]
        late = re.findall(r"RUN ([0-9a-f]{6})", out)
        assert len(late) == 1, out
        # both tests pass (the first one's run had a live owner when it ended); the
        # second's teardown fails, naming what the dead owner left, and removes it
        assert "2 passed, 1 error" in out, out
        assert "a lab run's owner exited without its teardown" in out and f"vtl-{late[0]}-receiver" in out, out
        assert not [n for n in netns.lab_namespaces() if n.startswith(f"vtl-{late[0]}-")]
    finally:
        for name in netns.lab_namespaces():
            if name.startswith(f"vtl-{dead}-"):
                netns.remove(name)
