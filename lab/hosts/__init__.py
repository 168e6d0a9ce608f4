"""The lab on the user's own hosts: an Ansible inventory names the machines and the
roles they play, and Ansible (through ansible-runner) does the remote work.

    >>> from lab.hosts import Hosts                               # doctest: +SKIP
    >>> hosts = Hosts("hosts.yml")
    >>> hosts.check("vtap-throughput")                            # a table: per host, its problems and advice
    >>> hosts.setup()                                             # this checkout's commit into each lab_dir, set up
    >>> hosts.facts()                                             # a DataFrame: a row per host and interface
    >>> hosts.cleanup()                                           # the lab's cleanup there, interfaces put back

`python -m lab hosts check|setup|facts|cleanup -i FILE` is the same from a shell
(lab/hosts/command.py). The pieces: inventory.py (roles and interfaces, read by
Ansible), engine.py (plays through ansible-runner, ssh as the user has it),
library/lab_facts.py (what a host reports, changing nothing), check.py (what is
judged of it), source.py (the commit that goes to a host), local.py (what runs on a
host itself: its record of interfaces before the lab changed them), nshosts.py
(namespaces with sshd as hosts, for the tests).
"""

import html
import json
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import check as checks
from . import engine, source
from .inventory import DEFAULT_LAB_DIR, ROLES, Inventory, InventoryError

__all__ = ["Hosts", "InventoryError", "CheckReport", "ROLES"]

FACTS_TASK = "lab facts"


@dataclass
class CheckReport:
    """What `check` found: per host a Verdict (problems, advice), and the hosts that
    could not be asked at all. ok: the bench named can run."""

    bench: str | None
    verdicts: dict = field(default_factory=dict)  # host -> checks.Verdict
    facts: dict = field(default_factory=dict)  # host -> lab_facts
    artifacts: str = ""

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts.values())

    def problems(self) -> list[str]:
        return [f"{h}: {line}" for h, v in self.verdicts.items() for line in v.problems]

    def lines(self) -> list[str]:
        out = []
        for h, v in self.verdicts.items():
            f = self.facts.get(h) or {}
            state = "ok" if v.ok else f"{len(v.problems)} problem{'s' if len(v.problems) > 1 else ''}"
            system = f"{(f.get('os') or {}).get('pretty', '?')}, kernel {f.get('kernel', '?')}" if f else "-"
            out.append(f"{h:<12} {','.join(v.roles) or '-':<24} {state:<12} {system}")
            out += [f"  problem: {line}" for line in v.problems]
            out += [f"  advice:  {line}" for line in v.advice]
        return out

    def to_dict(self) -> dict:
        return {
            "bench": self.bench,
            "ok": self.ok,
            "artifacts": self.artifacts,
            "hosts": {
                h: {
                    "roles": v.roles,
                    "ok": v.ok,
                    "problems": v.problems,
                    "advice": v.advice,
                    "facts": self.facts.get(h),
                }
                for h, v in self.verdicts.items()
            },
        }

    def __repr__(self):
        head = f"hosts check{' for ' + self.bench if self.bench else ''}: {'ok' if self.ok else 'NOT ready'}"
        return "\n".join([head, *self.lines()])

    def _repr_html_(self):
        return "<pre>" + html.escape(repr(self)) + "</pre>"


class Hosts:
    """An inventory's hosts, as the lab sees and changes them."""

    def __init__(self, inventory):
        self.inventory = Inventory(inventory)
        self.last_artifacts = None

    # --- reading ------------------------------------------------------------------
    def _targets(self, bench=None):
        return self.inventory.bench_hosts(bench) if bench else self.inventory.lab_hosts()

    def gather(self, bench=None) -> tuple[dict, dict]:
        """({host: lab_facts}, {host: why it could not be asked}) of the bench's hosts."""
        hosts = self._targets(bench)
        wanted = {
            h.name: {"ifaces": sorted(set(self.inventory.ifaces_of(h, bench).values())), "mgmt": [h.address]}
            for h in hosts
        }
        task = {
            "name": FACTS_TASK,
            "lab_facts": {
                "lab_dir": "{{ lab_dir | default('%s') }}" % DEFAULT_LAB_DIR,
                "ifaces": "{{ lab_check[inventory_hostname].ifaces }}",
                "management_addrs": "{{ lab_check[inventory_hostname].mgmt }}",
            },
            "timeout": 60,
        }
        r = engine.run_play(
            self.inventory.path, [h.name for h in hosts], [task], "facts", extravars={"lab_check": wanted}, timeout=180
        )
        self.last_artifacts = r.artifacts
        facts, failed = {}, {}
        for name, res in r.hosts.items():
            if res.ok and FACTS_TASK in res.results:
                facts[name] = res.results[FACTS_TASK]["lab_facts"]
            else:
                failed[name] = res
        return facts, failed

    def check(self, bench=None, generator="xdp", allow_dirty=True) -> CheckReport:
        """Every host of `bench` (or every host with a role) judged; raises InventoryError
        when the inventory itself does not fit the bench."""
        if bench:
            self.inventory.roles(bench)  # a role with no host or too many: before any host is asked
        tree = source.current(allow_dirty=allow_dirty).tree
        facts, failed = self.gather(bench)
        report = CheckReport(bench, facts=facts, artifacts=self.last_artifacts or "")
        name = shlex.quote(str(self.inventory.path))
        for h in self._targets(bench):
            ifaces = self.inventory.ifaces_of(h, bench)
            if h.name in failed:
                v = checks.Verdict(h.name, sorted({k.split(":")[0] for k in ifaces}))
                v.problems.append(_unreachable_line(h, failed[h.name]))
                report.verdicts[h.name] = v
                continue
            report.verdicts[h.name] = checks.judge(h, facts[h.name], ifaces, tree, bench, generator, name)
        return report

    def facts(self, bench=None, frame=True):
        """What check reads, per host: a DataFrame (a row per host and interface) or,
        frame=False, the record a bench keeps in its sidecar per host."""
        facts, failed = self.gather(bench)
        record = {
            "inventory": self.inventory.resolved(),
            "artifacts": self.last_artifacts,
            "hosts": facts,
            "unreachable": {h: r.line() for h, r in failed.items()},
        }
        return record if not frame else facts_frame(record)

    # --- changing -----------------------------------------------------------------
    def setup(self, allow_dirty=False, progress=None) -> dict:
        """This checkout's tracked files into each host's lab_dir, and scripts/setup.sh
        run there; a host already at this tree and set up is left as it is.
        Returns {host: "set up" | "unchanged" | the failure's line}."""
        src = source.current(allow_dirty=allow_dirty)
        facts, failed = self.gather()
        if failed:
            raise InventoryError("; ".join(_unreachable_line(self.inventory.hosts[h], r) for h, r in failed.items()))
        out = {
            h: "unchanged"
            for h, f in facts.items()
            if f["lab"].get("setup") == src.tree and f["lab"].get("commit") == src.tree and f["lab"].get("python")
        }
        todo = [h for h in facts if h not in out]
        if not todo:
            return out
        with tempfile.TemporaryDirectory(prefix="vtl-setup-") as tmp:
            tar = Path(tmp) / "lab.tar.gz"
            names = source.archive(src, tar)
            listing = Path(tmp) / "files.json"
            listing.write_text(json.dumps(sorted(names)))
            r = engine.run_play(self.inventory.path, todo, _setup_tasks(tar, listing, src.tree), "setup", timeout=3600)
        self.last_artifacts = r.artifacts
        for h, res in r.hosts.items():
            out[h] = "set up" if res.ok else res.line()
        return out

    def cleanup(self, names=None, bench=None, timeout=300) -> dict:
        """The lab's own cleanup on every host (or `names`), and each interface it changed
        put back from the record the host keeps (lab/hosts/local.py); bench: a bench's
        own cleanup, which leaves a host another bench holds alone. {host: [what was
        done] or the error}. A host where a step failed is cleaned once more after every
        host's first pass: on veths between hosts, one side waits on the other (TSO
        comes back only once the peer's XDP program has gone, which is that host's
        cleanup, running beside it)."""
        names = names or [h.name for h in self.inventory.lab_hosts()]
        out = self._cleanup_pass(names, bench, timeout)
        again = [h for h, said in out.items() if not isinstance(said, str) and any(FAILED in ln for ln in said)]
        if again:
            for h, said in self._cleanup_pass(again, bench, timeout).items():
                # what the first pass did, and the second's word on what it could not
                out[h] = [ln for ln in out[h] if FAILED not in ln] + said if not isinstance(said, str) else said
        return out

    def _cleanup_pass(self, names, bench, timeout) -> dict:
        task = cleanup_task(bench, timeout=min(120, timeout // 2))  # the task's own bound within the play's
        r = engine.run_play(self.inventory.path, names, [task], "cleanup", timeout=timeout)
        self.last_artifacts = r.artifacts
        out = {}
        for h, res in r.hosts.items():
            if res.ok:
                said = res.results.get(CLEANUP_TASK, {}).get("stdout", "")
                out[h] = [ln for ln in said.splitlines() if ln.strip()]
            else:
                out[h] = res.line()
        return out


CLEANUP_TASK = "lab cleanup"
FAILED = ": FAILED "  # a restore step that did not take (lab.hosts.local.restore's word)


def cleanup_task(bench=None, timeout=120):
    """The host's own cleanup (lab.hosts.local) as a task: a bench's (`--bench ID`) or all."""
    lab = "{{ lab_dir | default('%s') }}" % DEFAULT_LAB_DIR
    return {
        "name": CLEANUP_TASK,
        "command": {
            "argv": [
                f"{lab}/.venv/bin/python",
                "-m",
                "lab.hosts.local",
                "cleanup",
                *(["--bench", bench] if bench else []),
            ],
            "chdir": lab,
        },
        "environment": "{{ lab_env | default({}) }}",
        "timeout": timeout,
    }


def facts_frame(record):
    """A facts record (Hosts.facts(frame=False)) as a DataFrame: a row per host and interface."""
    import pandas as pd  # noqa: PLC0415 -- a second of import, for the frame only

    facts = record["hosts"]
    rows = []
    for h, f in facts.items():
        base = {
            "host": h,
            "os": f["os"].get("pretty"),
            "kernel": f["kernel"],
            "cpus": f["cpus"],
            "lab_tree": (f["lab"].get("commit") or "")[:12],
            "lab_setup": bool(f["lab"].get("setup")),
            # the versions a host's figures depend on most (all of them: f["packages"])
            "bcc": (f.get("packages") or {}).get("debian", {}).get("python3-bpfcc"),
            "pyroute2": (f.get("packages") or {}).get("python", {}).get("pyroute2"),
        }
        for name, i in (f.get("ifaces") or {"": {}}).items():
            rows.append(
                {
                    **base,
                    "iface": name,
                    "present": i.get("present"),
                    "up": i.get("up"),
                    "driver": i.get("ethtool", {}).get("driver"),
                    "speed_mbps": i.get("speed_mbps"),
                    "mtu": i.get("mtu"),
                    "numa_node": i.get("numa_node"),
                    "xdp_features": ",".join(i.get("xdp_features", [])),
                    "channels": (i.get("channels", {}).get("current") or {}).get("combined"),
                }
            )
    return pd.DataFrame(rows)


def _unreachable_line(host, res) -> str:
    if res.unreachable:
        return (
            f"unreachable at {host.address}: {res.message}; fix: check that `ssh "
            f"{host.vars.get('ansible_user', 'root')}@{host.address}` works from here (its key, its "
            "known_hosts entry, the network)"
        )
    return f"could not be asked ({res.line()})"


_PRUNE = """
import json, os, sys
lab, new = sys.argv[1], set(json.load(open(sys.argv[2])))
try:
    old = open(os.path.join(lab, ".lab-files")).read().split()
except OSError:
    old = []
for name in old:
    if name not in new and not name.startswith(("/", "..")) and "/../" not in name:
        try:
            os.unlink(os.path.join(lab, name))
        except OSError:
            pass
"""


def _setup_tasks(tar, listing, tree):
    lab = "{{ lab_dir | default('%s') }}" % DEFAULT_LAB_DIR
    return [
        {"name": "lab_dir", "file": {"path": lab, "state": "directory", "mode": "0755"}},
        {"name": "the new file list", "copy": {"src": str(listing), "dest": f"{lab}/.lab-files.new", "mode": "0644"}},
        # files of the tree there before that this one no longer has: gone, so that
        # nothing of an older commit is imported by this one
        {
            "name": "files the new tree lacks removed",
            "command": {"argv": ["python3", "-c", _PRUNE, lab, f"{lab}/.lab-files.new"]},
        },
        {"name": "the tree", "unarchive": {"src": str(tar), "dest": lab}},
        {
            "name": "set-up (scripts/setup.sh)",
            "command": {"argv": [f"{lab}/scripts/setup.sh"], "chdir": lab},
            # a bench host runs the lab's runners, not the suite, JupyterLab or Ansible: no extra
            "environment": "{{ {'VTL_SETUP_EXTRAS': 'none'} | combine(lab_env | default({})) "
            "| combine(lab_setup_env | default({})) }}",
            "timeout": 3000,
        },
        {
            "name": "set-up stamped",
            "copy": {"content": tree + "\n", "dest": f"{lab}/{source.SETUP_STAMP}", "mode": "0644"},
        },
    ]
