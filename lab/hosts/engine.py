"""The engine: plays run on the user's hosts by Ansible, through ansible-runner.

ssh is the controller user's own (keys, agent, jump hosts, ~/.ssh/config and
known_hosts): the lab adds only what finds a dead host within seconds
(ConnectTimeout, ServerAliveInterval x ServerAliveCountMax) and keeps a
connection per host open across commands (ControlPersist, with pipelining).
Host key checking stays on. The lab writes no password anywhere and reads none.

Every run keeps ansible-runner's artifacts (each task's events and output) in a
directory of its own under ARTIFACTS; its path is in every result, facts and
sidecar, and the newest KEEP are kept.
"""

import hashlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from .inventory import InventoryError, ansible_bin

LIBRARY = Path(__file__).resolve().parent / "library"  # the lab's own modules (lab_facts)
KEEP = 50
CONNECT_TIMEOUT = 5  # s: a host that does not answer ssh
ALIVE_INTERVAL, ALIVE_COUNT = 2, 3  # a connection that stops answering: dead after 6 s


def artifacts_root() -> Path:
    base = os.environ.get("VTL_HOSTS_STATE") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "ebpf-vtap-lab"
    )
    return Path(base) / "ansible"


def _control_dir() -> str:
    """ssh's control sockets, one directory per network namespace: a master opened
    from one namespace must never carry another namespace's connection to an
    address they share (the hosts tests' controllers all reach 198.18.x.y)."""
    netns = os.stat("/proc/self/ns/net").st_ino
    return os.path.expanduser(f"~/.ansible/cp-vtl-{hashlib.sha256(str(netns).encode()).hexdigest()[:8]}")


def environment() -> dict:
    """What Ansible is told, beside what the user's own ansible.cfg and ssh config say."""
    return {
        "ANSIBLE_LIBRARY": str(LIBRARY),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_TIMEOUT": str(CONNECT_TIMEOUT),
        "ANSIBLE_SSH_ARGS": (
            "-o ControlMaster=auto -o ControlPersist=120s "
            f"-o ConnectTimeout={CONNECT_TIMEOUT} -o ServerAliveInterval={ALIVE_INTERVAL} "
            f"-o ServerAliveCountMax={ALIVE_COUNT} -o BatchMode=yes"
        ),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": _control_dir(),
        # Debian's own Python, where the lab's set-up puts everything (bcc is Debian's):
        # discovery takes the first python3.X on the login PATH, and a pyenv shim there
        # ("pyenv: python3.13: command not found") fails every module. An inventory's
        # ansible_python_interpreter still wins.
        "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_LOCALHOST_WARNING": "False",
    }


@dataclass
class HostResult:
    """What one play did on one host."""

    host: str
    ok: bool = True
    unreachable: bool = False
    changed: bool = False
    failed_task: str | None = None
    message: str = ""
    results: dict = field(default_factory=dict)  # task name -> the module's result

    def line(self) -> str:
        if self.unreachable:
            return f"unreachable: {self.message}"
        if not self.ok:
            return f"{self.failed_task}: {self.message}"
        return "ok"


@dataclass
class PlayResult:
    hosts: dict  # name -> HostResult
    artifacts: str
    status: str
    seconds: float

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts.values())


def _message(res) -> str:
    """One line from a failed task's result: its msg, else stderr's last line."""
    msg = res.get("msg") or ""
    if isinstance(msg, list):
        msg = " ".join(map(str, msg))
    lines = [ln for ln in (res.get("stderr") or "").splitlines() if ln.strip()]
    if lines and (not msg or msg.startswith("non-zero return code")):
        msg = lines[-1]
    msg = " ".join(str(msg).split())
    return msg[:400] if msg else "failed"


def _prune(root: Path):
    old = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name)[:-KEEP]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)


def run_play(inventory, hosts, tasks, name, extravars=None, timeout=600, become=None) -> PlayResult:
    """Run one play of `tasks` on `hosts` (names) of `inventory` (a path). Returns per-host
    results; raises InventoryError only when Ansible itself cannot run."""
    play = {"name": name, "hosts": ",".join(hosts), "gather_facts": False, "tasks": tasks}
    if become is not None:
        play["become"] = become
    return run_plays(inventory, hosts, [play], name, extravars, timeout)


def run_plays(inventory, hosts, plays, name, extravars=None, timeout=600, on_event=None, cancel=None) -> PlayResult:
    """Run `plays` (one ansible-playbook) on `hosts` of `inventory`. on_event(event) sees
    each of Ansible's events as it happens (a bench writes each run's rows from them);
    cancel() -> True stops Ansible (Ctrl-C)."""
    import ansible_runner  # noqa: PLC0415 -- its import takes a second: only for the commands that reach hosts

    playbook = ansible_bin("ansible-playbook")  # says the fix when the extra is not installed
    root = artifacts_root()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    _prune(root)
    private = root / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{name}-{os.getpid()}"
    private.mkdir(mode=0o700)
    os.makedirs(environment()["ANSIBLE_SSH_CONTROL_PATH_DIR"], mode=0o700, exist_ok=True)
    started = time.monotonic()
    r = ansible_runner.run(
        private_data_dir=str(private),
        playbook=plays,
        inventory=str(inventory),
        # ansible-runner finds ansible-playbook on PATH: this Python's first (the project's .venv)
        envvars={**environment(), "PATH": f"{os.path.dirname(playbook)}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
        extravars=extravars or {},
        quiet=True,
        timeout=timeout,
        forks=max(5, len(hosts)),
        **({"event_handler": lambda ev: (on_event(ev), True)[1]} if on_event else {}),
        **({"cancel_callback": cancel} if cancel else {}),
    )
    out = {h: HostResult(h) for h in hosts}
    for ev in r.events:
        data = ev.get("event_data", {})
        host, kind = data.get("host"), ev.get("event")
        if host not in out:
            continue
        res, task = data.get("res") or {}, data.get("task", "")
        if kind == "runner_on_ok":
            out[host].results[task] = res
            out[host].changed |= bool(res.get("changed"))
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            out[host].ok, out[host].failed_task, out[host].message = False, task, _message(res)
            out[host].results[task] = res
        elif kind == "runner_on_unreachable":
            out[host].ok, out[host].unreachable, out[host].message = False, True, _message(res)
    if r.status == "canceled":
        raise KeyboardInterrupt
    if r.status in ("timeout", "error") or (r.status == "failed" and all(h.ok for h in out.values())):
        # Ansible failed before any host said anything: its own words, from its output
        lines = [ln.strip() for ln in (r.stdout.read() if r.stdout else "").splitlines() if ln.strip()]
        said = [ln for ln in lines if "ERROR" in ln] or lines[-1:]
        raise InventoryError(f"ansible-playbook {r.status}: {' '.join(said)[:400]} (its record: {private})")
    return PlayResult(out, str(private / "artifacts"), r.status, time.monotonic() - started)
