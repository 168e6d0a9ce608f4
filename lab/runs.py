"""The run registry: which lab runs exist, which process owns each, which are dead.

A run is one Topology's namespaces, all named "vtl-<run id>-<host>". Its owner
writes RUN_DIR/vtl-<run id>.pid when it builds and removes it when it tears down
(vtl-: the namespace prefix, lab.netns.PREFIX);
a daemon keeps its files in RUN_DIR/<namespace>[.<key>]<suffix>. A notebook
kernel that is restarted, crashes or is killed never runs its teardown: its
namespaces and run file stay, and the owner named there is gone. Everything
that asks which runs are alive or dead asks here: the topology, the daemons,
`python -m lab cleanup`, and the command lifecycle (lab.console), which says
what dead runs left when a command starts, once, with what removes it.
"""

import hashlib
import os
import secrets
import sys
from pathlib import Path

from lab import netns

# VTL_RUN_DIR: a lab instance's own (each namespace host of lab.hosts.nshosts has one,
# under its lab_dir, as it has its own namespace prefix)
RUN_DIR = Path(os.environ.get("VTL_RUN_DIR") or "/run/vtap-lab")
CLEANUP = "python -m lab cleanup (from Python: lab.remove_leftovers())"
LIVE_RUNS: set[str] = set()  # run ids this process has built and not torn down
_said: set[str] = set()  # dead runs already said (notice)


def run_of(namespace) -> str:
    """The run id of a lab namespace: "vtl-<run id>-<host>" -> "<run id>"."""
    return namespace[len(netns.PREFIX) :].split("-", 1)[0]


def new_run_id() -> str:
    """A run id no lab namespace on this host has yet."""
    while True:
        run_id = secrets.token_hex(3)
        if not any(run_of(n) == run_id for n in netns.lab_namespaces()):
            return run_id


def _run_file(run_id) -> Path:
    return RUN_DIR / f"{netns.PREFIX}{run_id}.pid"


def started(run_id):
    """This process owns run `run_id` from now on (its namespaces are about to exist)."""
    LIVE_RUNS.add(run_id)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    _run_file(run_id).write_text(f"{os.getpid()}\n")


def ended(run_id):
    """Run `run_id` is torn down: no owner, no run file."""
    _run_file(run_id).unlink(missing_ok=True)
    LIVE_RUNS.discard(run_id)


def _owner(run_id):
    try:
        return int(_run_file(run_id).read_text())
    except (FileNotFoundError, ValueError):
        return None


def owner_alive(run_id) -> bool:
    """Whether the process that built run `run_id` still runs it. A run file
    naming this very process counts only for a topology it has built and not
    torn down (its pid may be a dead owner's, reused)."""
    pid = _owner(run_id)
    if pid is None:
        return False
    if pid == os.getpid():
        return run_id in LIVE_RUNS
    return netns.alive(pid)


def runs() -> dict[str, list[str]]:
    """{run id: its namespaces} of every lab run on this host."""
    found = {}
    for name in netns.lab_namespaces():
        found.setdefault(run_of(name), []).append(name)
    return found


def dead_runs() -> dict[str, list[str]]:
    """{run id: its namespaces} of lab runs whose owning process is gone."""
    return {run_id: names for run_id, names in runs().items() if not owner_alive(run_id)}


def live_runs(others=True) -> list[str]:
    """Run ids whose owner is still alive; others: not those of this process."""
    return sorted(r for r in runs() if owner_alive(r) and not (others and r in LIVE_RUNS))


def stale_run_files(known) -> list[Path]:
    """Run files of runs that have no namespace left (`known`: the run ids that
    do) and no living owner."""
    if not RUN_DIR.exists():
        return []
    return [
        p
        for p in RUN_DIR.glob(f"{netns.PREFIX}*.pid")
        if run_of(p.stem) not in known and not owner_alive(run_of(p.stem))
    ]


def orphaned_run_dirs(suffix) -> list[Path]:
    """RUN_DIR/<namespace>.<...><suffix> directories (a daemon's run files) whose
    namespace is gone: the daemon died with it, and only its files are left."""
    if not RUN_DIR.exists():
        return []
    return [d for d in RUN_DIR.glob(f"{netns.PREFIX}*{suffix}") if not netns.exists(d.name.split(".", 1)[0])]


def note_cgroup(path) -> Path:
    """A cgroup outside the lab's own (a user's `--cgroup`) that this instance is about
    to attach programs to: noted under its prefix, so that its cleanup looks there after
    a kill, and another instance's never does. Cgroups are the machine's: a cleanup that
    took every cgroup's leftovers took another instance's too (on the hosts tests' rack,
    a host's cleanup took the machine's killed pods run's programs before its own
    cleanup could)."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    note = RUN_DIR / f"{netns.PREFIX}cgroup.{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    note.write_text(f"{path}\n")
    return note


def noted_cgroups() -> dict[str, Path]:
    """{cgroup path: its note} of this instance's noted cgroups."""
    out = {}
    for note in RUN_DIR.glob(f"{netns.PREFIX}cgroup.*") if RUN_DIR.exists() else []:
        try:
            out[note.read_text().strip()] = note
        except OSError:
            continue
    return out


def notice(out=None) -> str | None:
    """Say, once per set of leftovers, what dead runs left and what removes it;
    remove nothing (another run may be starting). Returns the line said (None
    when there was nothing new to say)."""
    try:
        dead = dead_runs()
    except OSError:
        return None
    new = {r: n for r, n in dead.items() if r not in _said}
    if not new:
        return None
    _said.update(new)
    count = sum(len(n) for n in new.values())
    named = ", ".join(f"{netns.PREFIX}{r}-*" for r in sorted(new))
    line = (
        f"lab: leftovers of {len(new)} dead lab run{'s' if len(new) > 1 else ''}: {count} namespace"
        f"{'s' if count > 1 else ''} ({named}) with whatever ran in them; remove them with {CLEANUP}"
    )
    try:
        print(line, file=out or sys.stderr, flush=True)
    except (BrokenPipeError, ValueError):
        pass
    return line
