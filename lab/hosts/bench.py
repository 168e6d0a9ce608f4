"""A bench on the user's hosts: the controller's side.

    bench vtap-throughput -i hosts.yml      # lab.fastpaths.vtap.bench hands its sweep here

1. check: every host of the bench's roles (lab.hosts.check); nothing starts anywhere
   while any problem stands.
2. prepare (the first play of the one ansible-playbook that runs the whole bench):
   each host is taken for this bench, records its interfaces as they are
   (lab.hosts.local, kept on the host), then gets its test address, up, promiscuous
   where it counts copies.
3. the sweep, in the same playbook, a play per run: start a runner
   per role (async: the runners do the whole run by themselves), wait until all
   are ready, `go` to the sender (which returns when it has sent), `stop` to the
   others (which return their counts). Each run's row is written to the CSV as its
   results arrive; a failure stops the sweep at that run (any_errors_fatal).
4. always (success, failure, Ctrl-C): every host's runners stopped and its
   interfaces put back (local cleanup): the playbook's last play when every run
   went through, else a play of its own after it; the sidecar says what happened.
"""

import ipaddress
import json
import os
import secrets
import socket
import sys
import time
from dataclasses import dataclass, field

from lab.metrics import write_results

from . import CLEANUP_TASK, FAILED, Hosts, cleanup_task, engine
from .inventory import InventoryError

RUNS_DIR = ".lab-state/runs"  # under each host's lab_dir (lab.hosts.local.RUNS)
DEFAULT_NET = "198.19.0.0/24"  # the test link's addresses, unless the inventory gives lab_addresses
DEFAULT_NET6 = "2001:2:0:ff00::/64"  # and IPv6's (a pods node's underlay), unless it gives lab_addresses6
START_MARGIN = 120  # s a runner may take to be ready (a first compile on a slow host) before its run
STOP_MARGIN = 30  # s after the sender for the others to stop and report


class HostsBenchError(InventoryError):
    """A bench on hosts failed: which host, which run, why (one line)."""


@dataclass
class Sweep:
    """What a bench on hosts hands over: its roles and, per run, each role's spec."""

    bench: str
    runs: list  # [(run label, {role: spec})]
    row: callable  # (label, {role: result}) -> a CSV row
    duration: float
    meta: dict = field(default_factory=dict)
    driver: str = "sender"  # the role that is told `go` and returns when its load is done


def _python(lab):
    return f"{lab}/.venv/bin/python"


LAB = "{{ lab_dir | default('/opt/vtap-lab') }}"
PREPARE_TASK = "interfaces recorded and prepared"
ENV = "{{ lab_env | default({}) }}"


def _play(run_no, label, specs, role_hosts, bench_id, duration, driver="sender"):
    """One run as a play: the runners started, ready, go, stop."""
    rid = f"{run_no:04d}"
    runners = {}  # host -> [(role, dir, spec)]
    for role, spec in specs.items():
        host = role_hosts[role]
        d = f"{RUNS_DIR}/{bench_id}/{rid}-{role}"
        runners.setdefault(host, []).append({"role": role, "dir": d, "spec": json.dumps(spec)})
    sender = role_hosts[driver]
    return {
        "name": f"run {rid}: {label}",
        "hosts": ",".join(runners),
        "gather_facts": False,
        "any_errors_fatal": True,
        "vars": {"runners": runners},
        "tasks": [
            # the runners started, each in a session of its own, and waited for until ready
            _raw(
                f"run {rid} start",
                "start {% for r in runners[inventory_hostname] %}" + f"{LAB}/" + "{{ r.dir }} {{ r.spec | quote }} "
                "{% endfor %}",
                START_MARGIN,
            ),
            {
                **_raw(
                    f"run {rid} go",
                    f"go {LAB}/{{{{ runners[inventory_hostname] | selectattr('role', 'equalto', {driver!r}) "
                    "| map(attribute='dir') | first }} ",
                    duration + STOP_MARGIN,
                ),
                "when": f"inventory_hostname == {sender!r}",
            },
            {
                **_raw(
                    f"run {rid} stop",
                    "stop {% for r in runners[inventory_hostname] if r.role != " + repr(driver) + " %}" + f"{LAB}/"
                    "{{ r.dir }} {% endfor %}",
                    STOP_MARGIN,
                ),
                "when": f"runners[inventory_hostname] | rejectattr('role', 'equalto', {driver!r}) | list | length > 0",
            },
        ],
    }


def _raw(name, args, timeout):
    """A runner command as Ansible's `raw` task: the command line straight over the ssh
    connection Ansible keeps open, no module sent and unpacked first (each run has three
    of these on every host: a module's round trip was a second each)."""
    env = "{% for k, v in (lab_env | default({})).items() %}{{ k }}={{ v | string | quote }} {% endfor %}"
    return {
        "name": name,
        "raw": f"cd {LAB} && exec env {env}{_python(LAB)} -m lab.hosts.runner {args}--timeout {int(timeout)}",
        "timeout": int(timeout + 30),
    }


def prepare_play(items_by_host, owner=None):
    """Each host taken for this bench (`owner`: refused where another bench holds it),
    its interfaces recorded and prepared (lab.hosts.local prepare)."""
    held = ["--owner", json.dumps(owner)] if owner else []
    return {
        "name": "prepare",
        "hosts": ",".join(items_by_host),
        "gather_facts": False,
        "any_errors_fatal": True,
        "vars": {"items": {h: json.dumps(v) for h, v in items_by_host.items()}},
        "tasks": [
            {
                "name": PREPARE_TASK,
                "command": {
                    "argv": [
                        _python(LAB),
                        "-m",
                        "lab.hosts.local",
                        "prepare",
                        "{{ items[inventory_hostname] }}",
                        *held,
                    ],
                    "chdir": LAB,
                },
                "environment": ENV,
                "timeout": 60,
            }
        ],
    }


def test_addresses(inventory, host, var="lab_addresses", default=DEFAULT_NET):
    net = host.vars.get(var) or default
    try:
        return ipaddress.ip_network(net)
    except ValueError as e:
        raise InventoryError(f"{host.name}: {var} {net!r}: {e}") from None


def run_sweep(hosts: Hosts, sweep: Sweep, role_hosts, prepare_items, out, params, progress=None):
    """The sweep's plays, then the hosts' cleanup, whatever happened. Returns (rows, path,
    failure or None); raises KeyboardInterrupt after its cleanup when interrupted."""
    inv = hosts.inventory
    bench_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(2)
    names = sorted(set(role_hosts.values()))
    rows, results, failure, path = [], {}, None, None
    started = time.monotonic()
    timing = {"runs": [], "prepare_s": None}
    interrupted = False

    def write():
        nonlocal path
        import pandas as pd  # noqa: PLC0415 -- the bench's own import already holds it

        df = pd.DataFrame(rows)
        extra = {
            "hosts": {
                "inventory": inv.resolved(),
                "roles": role_hosts,
                "facts": sweep.meta.get("facts"),
                "artifacts": hosts.last_artifacts,
                "bench_id": bench_id,
                "failure": failure,
                "orchestration": timing,
            }
        }
        if path is None:
            path = write_results(df, sweep.meta["csv_name"], params, out, extra=extra)
        else:  # the same files, rewritten with every run: a failure later keeps what was measured
            df.to_csv(path, index=False)
            meta = json.loads(path.with_suffix(".json").read_text())
            meta.update({"rows": len(df), "columns": list(df.columns), **extra})
            path.with_suffix(".json").write_text(json.dumps(meta, indent=2, default=str) + "\n")

    run_started = {}
    cleaned = {}  # host -> what its cleanup said (the playbook's last play, else _cleanup's)

    def on_event(ev):
        nonlocal failure
        data = ev.get("event_data", {})
        task = data.get("task", "")
        kind = ev.get("event")
        if task == CLEANUP_TASK:  # the playbook's last play: every run went through
            res = data.get("res") or {}
            if kind == "runner_on_ok":
                cleaned[data.get("host")] = "; ".join((res.get("stdout") or "").splitlines())
            elif kind in ("runner_on_failed", "runner_on_unreachable"):
                cleaned[data.get("host")] = f"not cleaned: {engine._message(res)}"
            return
        if task == PREPARE_TASK:
            if kind in ("runner_on_failed", "runner_on_unreachable") and failure is None:
                res = data.get("res") or {}
                failure = {"run": None, "host": data.get("host"), "task": "prepare", "error": engine._message(res)}
            return
        if not task.startswith("run "):
            return
        if timing["prepare_s"] is None:  # the first run's first event: prepare is behind
            timing["prepare_s"] = round(time.monotonic() - started, 3)
        rid = task.split()[1]
        if task.endswith(" start") and kind == "playbook_on_task_start":
            run_started[rid] = time.monotonic()
        if kind in ("runner_on_failed", "runner_on_unreachable") and failure is None:
            res = data.get("res") or {}
            failure = {
                "run": rid,
                "label": sweep.runs[int(rid)][0],
                "host": data.get("host"),
                "task": task,
                "error": _runner_error(res) or engine._message(res),
            }
            return
        if kind != "runner_on_ok" or not (task.endswith(" go") or task.endswith(" stop")):
            return
        for line in (data.get("res") or {}).get("stdout", "").splitlines():
            said = json.loads(line)
            results.setdefault(rid, {})[said["dir"].rsplit("-", 1)[1]] = said.get("result")
        label, specs = sweep.runs[int(rid)]
        if set(results[rid]) >= set(specs):
            try:
                rows.append(sweep.row(label, results.pop(rid)))
            except Exception as e:  # said, and the sweep stops at this run like any failure
                failure = {"run": rid, "label": label, "host": None, "task": "results", "error": f"{e}"}
                return
            wall = time.monotonic() - run_started.get(rid, started)
            rows[-1]["run_wall_s"] = round(wall, 3)  # as a namespace run's row has it
            timing["runs"].append({"run": rid, "wall_s": round(wall, 3), "duration_s": sweep.duration})
            write()
            if progress:
                progress.step(f"{label}")

    try:
        t0 = time.monotonic()
        owner = {
            "bench": bench_id,
            "controller": socket.gethostname(),
            "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        # one ansible-playbook for the prepare play, every run's and the cleanup (an Ansible
        # process costs seconds of CPU to start): a prepare or run that fails on any host
        # ends it there, before its cleanup play, and _cleanup below runs instead
        plays = [
            prepare_play(prepare_items, owner),
            *(
                _play(i, label, specs, role_hosts, bench_id, sweep.duration, sweep.driver)
                for i, (label, specs) in enumerate(sweep.runs)
            ),
            {"name": "cleanup", "hosts": ",".join(names), "gather_facts": False, "tasks": [cleanup_task(bench_id, 60)]},
        ]
        bound = 600 + len(sweep.runs) * (sweep.duration + START_MARGIN + STOP_MARGIN + 60) + 300
        try:
            r = engine.run_plays(inv.path, names, plays, "sweep", timeout=int(bound), on_event=on_event)
            hosts.last_artifacts = r.artifacts
        except KeyboardInterrupt:
            interrupted = True
        if timing["prepare_s"] is None and failure is None and not interrupted:
            timing["prepare_s"] = round(time.monotonic() - t0, 3)
        if failure is None and not interrupted and not r.ok:
            bad = next(h for h in r.hosts.values() if not h.ok)
            failure = {"run": None, "host": bad.host, "task": bad.failed_task, "error": bad.line()}
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if (
            failure is not None
            or interrupted
            or set(cleaned) != set(names)
            or any(said.startswith("not cleaned") or FAILED in said for said in cleaned.values())
        ):
            cleaned = _cleanup(hosts, names, bench_id)  # (a cleanup twice does nothing more)
        if failure is not None or interrupted or path is None:
            if interrupted and failure is None:
                failure = {"run": None, "host": None, "task": "interrupted", "error": "Ctrl-C"}
            if failure is not None:
                failure["cleanup"] = cleaned
            write()
    for host, said in cleaned.items():  # the bench's own result stands; what was not put back is said
        if said.startswith("not cleaned") or "FAILED" in said:
            print(
                f"lab bench: warning: {host}: {said}; fix: python -m lab hosts cleanup -i {inv.path}", file=sys.stderr
            )
    if interrupted:
        raise KeyboardInterrupt
    return rows, path, failure


def _runner_error(res):
    """A runner's own error line, from the JSON lines a wait/go/stop printed."""
    for line in (res.get("stdout") or "").splitlines():
        try:
            said = json.loads(line)
        except ValueError:
            continue
        if said.get("error"):
            return f"{said['dir'].rsplit('/', 1)[-1]}: {said['error']}"
    return None


def _cleanup(hosts, names, bench_id) -> dict:
    """Every reachable host this bench holds: its runners stopped and interfaces put back
    (a host another bench holds is left to it); {host: what, or why not}."""
    artifacts = hosts.last_artifacts  # the sweep's, which the sidecar names
    try:
        said = hosts.cleanup(names, bench=bench_id, timeout=120)
    except (InventoryError, KeyboardInterrupt) as e:
        return {h: f"not cleaned: {e}" for h in names}
    finally:
        hosts.last_artifacts = artifacts
    return {h: "; ".join(what) if isinstance(what, list) else f"not cleaned: {what}" for h, what in said.items()}
