"""The on-host runner: one role of one bench run, on the host that plays it, with
the lab's own code in that host's lab_dir.

    python -m lab.hosts.runner start DIR SPEC [DIR SPEC ...]   # runners started; returns when all are ready
    python -m lab.hosts.runner go DIR               # the sender: send now; prints its result
    python -m lab.hosts.runner stop DIR...          # the counting sides: stop; prints their results
    python -m lab.hosts.runner run DIR              # (what start starts) one role's whole sequence

DIR holds the run's spec (spec.json, written by the controller) and the runner's
state: `ready`, `go`, `stop`, `result.json`, `error`. `start` runs each runner
in a session of its own (it outlives the ssh connection, as Ansible's async
tasks do, without their polling) and returns once every one is ready; the
controller then touches `go` and `stop` through short Ansible tasks. Nothing is
polled from the controller during the load window, so it takes no CPU from the
hosts while they measure: the waiting is done here, on files of this host. The
commands other than `run` import nothing but Python's standard library: each is a
task of every run, on every host.

A runner enforces its own deadline (spec["deadline_s"] from its start): past it
it stops waiting, stops sending, detaches and leaves its result, whether or not
the controller is still there. Ansible's own async timeout is set longer, so it
never kills a runner before its cleanup has run.

The roles' steps are the bench's (lab.fastpaths.<fast path>.hosts.ROLES), the same
classes a namespace run uses; this module only runs them in the host's own
network namespace (lab.netns.host_mode) and carries their results.
"""

import importlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

BENCHES = {"vtap-throughput": "lab.fastpaths.vtap.hosts", "pods": "lab.fastpaths.pods.hosts"}
POLL = 0.02  # s between looks at a state file


class Signals:
    """A runner's side of the files: says ready, waits for go or stop (or its deadline)."""

    def __init__(self, run_dir: Path, deadline: float):
        self.dir, self.deadline = run_dir, deadline
        self.expired = threading.Event()

    def ready(self):
        (self.dir / "ready").write_text(f"{pid_stamp()}\n")

    def wait(self, name) -> bool:
        """Until DIR/name exists (True), or the deadline passes or the run is aborted
        (`abort`: a cleanup, which must not make a waiting sender send) (False)."""
        while not (self.dir / name).exists():
            if time.monotonic() >= self.deadline or (self.dir / "abort").exists():
                self.expired.set()
                return False
            time.sleep(POLL)
        return True

    def poll(self, name) -> bool:
        """One look: DIR/name is there, or the deadline passed, or the run was aborted."""
        if (self.dir / name).exists():
            return True
        if time.monotonic() >= self.deadline or (self.dir / "abort").exists():
            self.expired.set()
            return True
        return False

    def seconds_left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


def keep_off(spec):
    """The process kept off the cores spec["off_cpus"] names (the DUT's, pinned to its
    NAPI thread), where the host has others: a role's runner, or a `go` or `stop`
    waiting through the load window on the tap's host (Testbed 1's receiver is there),
    or on the one machine of a rack of namespaces, would otherwise take that core's
    time from the device under test (measured on the rack: 1-4 % of it)."""
    off = set(spec.get("off_cpus") or ())
    allowed = os.sched_getaffinity(0)
    if off and allowed - off:
        os.sched_setaffinity(0, allowed - off)


def run(run_dir: Path) -> int:
    from lab import netns  # noqa: PLC0415 -- pyroute2 and the bench: for the runner itself only

    started = time.monotonic()
    spec = json.loads((run_dir / "spec.json").read_text())
    keep_off(spec)  # first: whoever finds the runner by its pid file finds it off that core
    (run_dir / "pid").write_text(f"{pid_stamp()}\n")
    netns.host_mode()  # this host's own namespace, on the interfaces the spec names
    signals = Signals(run_dir, started + float(spec["deadline_s"]))
    try:
        role = importlib.import_module(BENCHES[spec["bench"]]).ROLES[spec["role"]]
        result = role(spec, signals)
        result["expired"] = signals.expired.is_set()
        tmp = run_dir / "result.tmp"
        tmp.write_text(json.dumps(result, default=str))
        os.replace(tmp, run_dir / "result.json")
        return 0
    except BaseException as e:
        line = f"{spec['role']}: {type(e).__name__}: {e}".splitlines()[0]
        (run_dir / "error").write_text(line + "\n" + traceback.format_exc())
        return 1


ZYGOTE_IDLE = 120  # s without a run after which a host's zygote exits by itself


def _zygote_socket() -> Path:
    return Path(os.environ.get("VTL_HOST_STATE") or Path.cwd() / ".lab-state") / "zygote.sock"


def zygote(sock_path: Path) -> int:
    """A process that has imported what runners need (pyroute2, pandas, the benches'
    roles: a second and more of CPU) and forks one runner per run, each a fresh process
    with its own deadline and cleanup, in a session of its own. It exits after
    ZYGOTE_IDLE seconds without a run; a host's cleanup stops it."""
    import signal  # noqa: PLC0415
    import socket  # noqa: PLC0415

    from lab import netns  # noqa: F401,PLC0415 -- imported once here, for every runner forked

    for module in BENCHES.values():
        importlib.import_module(module)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # runners are reaped by the kernel
    sock_path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    mine = os.stat(sock_path).st_ino  # a successor may bind the same path: never unlink its socket
    server.listen(16)
    server.settimeout(ZYGOTE_IDLE)
    (sock_path.parent / "zygote.pid").write_text(f"{pid_stamp()}\n")
    stamp = Path.cwd() / ".lab-commit"  # the tree it imported: another one set up since means stale
    born = _read(stamp)
    try:
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                return 0
            with conn:
                run_dir = Path(conn.recv(4096).decode())
                if _read(stamp) != born:
                    conn.sendall(b"stale")
                    return 0
                if os.fork() == 0:  # the runner: a session of its own, its output to DIR/log
                    server.close()
                    os.setsid()
                    log = os.open(run_dir / "log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    code = 1
                    try:
                        code = run(run_dir)
                    finally:
                        os._exit(code)
                conn.sendall(b"ok")
    finally:
        try:
            if os.stat(sock_path).st_ino == mine:
                sock_path.unlink()
        except FileNotFoundError:
            pass


def _via_zygote(run_dir: Path) -> bool:
    """Ask this host's zygote to fork the runner; start one first if none answers."""
    import socket  # noqa: PLC0415

    path = _zygote_socket()
    for attempt in range(3):
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(10)
                s.connect(str(path))
                s.sendall(str(run_dir.resolve()).encode())
                said = s.recv(16)
            if said == b"ok":
                return True
            path.unlink(missing_ok=True)  # "stale": it imported another tree, and is leaving
        except OSError:
            if attempt == 2:
                return False
            path.unlink(missing_ok=True)  # a socket its dead zygote left
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / "zygote.log", "a") as log:
            subprocess.Popen(
                [sys.executable, "-m", "lab.hosts.runner", "zygote", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # no SIGHUP when the ssh session that started it ends
            )
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(POLL)
    return False


def start(pairs, timeout) -> int:
    """Each (DIR, spec) written and its runner started in a session of its own (forked
    by the host's zygote, warm); then until all are ready (or one failed)."""
    dirs = []
    for d, spec in pairs:
        d.mkdir(parents=True, exist_ok=True)
        (d / "spec.json").write_text(spec)
        if not _via_zygote(d):
            (d / "error").write_text("start: no runner could be started (see .lab-state/zygote.log)\n")
        dirs.append(d)
    return _say(_await(dirs, "ready", timeout), "ready")


def _state(d: Path, want) -> str | None:
    for _ in range(2):  # twice: a runner that said its result and exited is not "died"
        if (d / "error").exists():
            return "error"
        if (d / want).exists():
            return want
        pid = _read(d / "pid")
        if not pid or alive(pid):  # (no pid yet: still starting)
            return None
    return "died"  # killed (by a user, the OOM killer): said now, not at the wait's end


def pid_stamp(pid=None) -> str:
    """What a pid file holds, "PID STARTTIME", so that it names one process and not
    whichever takes its number next (pid_max is 32768 on a small machine: a runner's
    number comes round again within a day of benches, and a cleanup that trusted a
    bare number would kill whatever process has it now)."""
    pid = os.getpid() if pid is None else int(pid)
    return f"{pid} {_stat(pid)[19]}"


def _stat(pid) -> list[str]:
    """/proc/PID/stat's fields after the command (state first, starttime at [19])."""
    return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()


def alive(pid) -> bool:
    """pid (a number, or a pid file's "PID STARTTIME") names a running process: not
    gone, not a zombie, and (given a start time) the very process that wrote the file
    (lab.hosts.local's cleanup asks it of runners and the zygote too)."""
    try:
        number, *started = str(pid).split()
        fields = _stat(number)
    except (OSError, ValueError, IndexError):
        return False
    return fields[0] != "Z" and (not started or fields[19] == started[0])


def pid_of(text) -> int | None:
    """The process number in a pid file's text ("PID" or "PID STARTTIME"), or None."""
    head = (text or "").split()[:1]
    return int(head[0]) if head and head[0].isdigit() else None


def _await(dirs, want, timeout) -> dict:
    """{dir: want | "error" | "died" | "timeout"} once each runner has reached `want` or failed."""
    deadline = time.monotonic() + timeout
    states = {}
    while True:
        for d in dirs:
            states[d] = states.get(d) or _state(d, want)
        if all(states.values()):
            return states
        if time.monotonic() >= deadline:
            return {d: s or "timeout" for d, s in states.items()}
        time.sleep(POLL)


def _say(states, want) -> int:
    """One JSON line per runner; exit 1 when any failed (its error's first line said)."""
    failed = 0
    for d, state in states.items():
        out = {"dir": str(d), "state": state}
        if state == "error":
            out["error"] = (d / "error").read_text().splitlines()[0]
            failed += 1
        elif state == "died":
            pid = pid_of(_read(d / "pid"))
            out["error"] = f"the runner (pid {pid}) ended without a result: killed? its log: {d / 'log'}"
            failed += 1
        elif state == "timeout":
            out["error"] = f"no {want} within the wait (the runner's pid: {pid_of(_read(d / 'pid'))})"
            failed += 1
        elif want == "result.json":
            out["result"] = json.loads((d / "result.json").read_text())
        print(json.dumps(out, default=str))
    return 1 if failed else 0


def _read(path):
    try:
        return path.read_text().strip()
    except OSError:
        return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] not in ("start", "run", "go", "stop", "zygote"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    action, dirs, timeout = argv[0], [], 60.0
    rest = argv[1:]
    while rest:
        arg = rest.pop(0)
        if arg == "--timeout":
            timeout = float(rest.pop(0))
        else:
            dirs.append(arg)
    if action == "run":
        return run(Path(dirs[0]))
    if action == "zygote":
        return zygote(Path(dirs[0]))
    if action == "start":  # DIR SPEC pairs
        return start([(Path(d), s) for d, s in zip(dirs[::2], dirs[1::2], strict=True)], timeout)
    dirs = [Path(d) for d in dirs]
    for d in dirs[:1]:  # the waiting below: off the DUT's core too
        spec = _read(d / "spec.json")
        keep_off(json.loads(spec) if spec else {})
    for d in dirs:  # go, stop: say it, then wait for the results
        if not (d / "error").exists():
            (d / action).write_text("\n")
    return _say(_await(dirs, "result.json", timeout), "result.json")


if __name__ == "__main__":
    sys.exit(main())
