"""What dead runs of the lab left behind, said once when something new starts.

A notebook kernel that is restarted, crashes or is killed never runs its
teardown: its namespaces (and every link, filter and program in them) and its
run file stay. The next testbed or program to start says so in one line, with
what removes them; it removes nothing itself (another run may be starting).
"""

import os
import sys

from . import netns

CLEANUP = "python -m lab cleanup (from Python: lab.remove_leftovers())"
_said = set()


def _owner(run_id):
    from .topology import RUN_DIR
    try:
        return int((RUN_DIR / f"{run_id}.pid").read_text())
    except (FileNotFoundError, ValueError):
        return None


def owner_alive(run_id) -> bool:
    """Whether the process that built run `run_id` still runs it. A run file
    naming this very process counts only for a topology it has built and not
    torn down (its pid may be a dead owner's, reused)."""
    from .topology import LIVE_RUNS
    pid = _owner(run_id)
    if pid is None:
        return False
    if pid == os.getpid():
        return run_id in LIVE_RUNS
    return netns.alive(pid)


def dead_runs() -> dict[str, list[str]]:
    """{run id: its namespaces} of lab runs whose owning process is gone."""
    runs = {}
    for name in netns.lab_namespaces():
        runs.setdefault(name[len(netns.PREFIX):].split("-", 1)[0], []).append(name)
    return {run_id: names for run_id, names in runs.items() if not owner_alive(run_id)}


def notice(out=None) -> str | None:
    """Say, once per set of leftovers, what dead runs left and what removes it.
    Returns the line said (None when there was nothing new to say)."""
    try:
        dead = dead_runs()
    except OSError:
        return None
    new = {r: n for r, n in dead.items() if r not in _said}
    if not new:
        return None
    _said.update(new)
    count = sum(len(n) for n in new.values())
    runs = ", ".join(f"{netns.PREFIX}{r}-*" for r in sorted(new))
    line = (f"lab: leftovers of {len(new)} dead lab run{'s' if len(new) > 1 else ''}: {count} namespace"
            f"{'s' if count > 1 else ''} ({runs}) with whatever ran in them; remove them with {CLEANUP}")
    try:
        print(line, file=out or sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass
    return line


def remove_leftovers() -> list[str]:
    """Remove what dead lab runs left (as `python -m lab cleanup` does; live runs
    are left alone). Returns what was removed, one string per item."""
    from .cleanup import cleanup
    return cleanup(all_runs=False)
