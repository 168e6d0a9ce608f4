"""The user's machines and the roles they play, from an Ansible inventory.

The inventory is read by Ansible itself (`ansible-inventory --list`), never by a
parser of the lab's own: YAML, INI, a directory, a dynamic script or one exported
from FABRIC or CloudLab works as Ansible reads it, with its group and host
variables merged as Ansible merges them.

Groups are a bench's roles (ROLES). Host variables the lab reads:

    lab_iface          the host's test interface
    lab_monitor_iface  the tap's interface toward the monitor
    lab_out_iface      a bridging tap's interface toward the receiver (Testbed 2)
    lab_ifaces         {ROLE: IFACE}: a host that plays two roles on different interfaces
    lab_dir            where the lab lives on that host (default /opt/vtap-lab)
    lab_env            environment for every lab command there ({NAME: value})
    lab_addresses      the test addresses to use instead of 198.18.0.0/15 / 2001:2::/48

Everything else (ansible_host, ansible_user, ansible_become, ...) is Ansible's,
passed through unchanged.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_LAB_DIR = "/opt/vtap-lab"

# bench -> {role: (fewest hosts, most hosts or None)}
ROLES = {
    "vtap-throughput": {"sender": (1, 1), "tap": (1, 1), "receiver": (1, 1), "monitor": (1, 1)},
    "pods": {"nodes": (2, None)},
}
ALL_ROLES = sorted({r for roles in ROLES.values() for r in roles})
# the interfaces a role uses: "test" (lab_iface or lab_ifaces[ROLE]), "monitor" (lab_monitor_iface)
# and "out" (lab_out_iface, a bridging tap's, when given)
ROLE_IFACES = {
    "sender": ["test"],
    "tap": ["test", "monitor"],
    "receiver": ["test"],
    "monitor": ["test"],
    "nodes": ["test"],
}
# values no record of the lab keeps (sidecars, facts, logs)
_SECRET = re.compile(r"(pass|secret|token|private_key|vault|credential)", re.I)


class InventoryError(ValueError):
    """The inventory cannot be read, or does not fit the bench: one line, with the fix."""


def ansible_bin(name) -> str:
    """An Ansible command: beside this Python (the project's .venv), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if not found:
        raise InventoryError(
            f"{name} is not installed: the lab's hosts commands use Ansible; fix: scripts/setup.sh "
            "(it installs the project's extra 'hosts': ansible-core and ansible-runner)"
        )
    return found


def redacted(value):
    """`value` (host variables, nested) with every secret-looking key's value removed."""
    if isinstance(value, dict):
        if "__ansible_vault" in value:
            return "<removed: vault>"
        return {k: "<removed>" if _SECRET.search(str(k)) else redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v) for v in value]
    return value


@dataclass
class Host:
    name: str
    vars: dict = field(default_factory=dict)
    groups: list = field(default_factory=list)

    @property
    def address(self) -> str:
        """Where Ansible reaches it (ansible_host, else its name)."""
        return str(self.vars.get("ansible_host", self.name))

    @property
    def lab_dir(self) -> str:
        return str(self.vars.get("lab_dir", DEFAULT_LAB_DIR))

    @property
    def env(self) -> dict:
        env = self.vars.get("lab_env") or {}
        return {str(k): str(v) for k, v in env.items()}

    def iface(self, role, purpose="test") -> str | None:
        """The interface this host uses for `role` (purpose: test, monitor or out):
        lab_ifaces[ROLE] first (a host playing two roles on different interfaces), then
        the role's own variable (Ansible merged it across the host's groups)."""
        per_role = self.vars.get("lab_ifaces") or {}
        if purpose == "test" and role in per_role:
            return str(per_role[role])
        var = {"test": "lab_iface", "monitor": "lab_monitor_iface", "out": "lab_out_iface"}[purpose]
        value = self.vars.get(var)
        return str(value) if value else None


class Inventory:
    """An inventory as Ansible resolves it: hosts, their merged variables, groups."""

    def __init__(self, path):
        self.path = Path(path).resolve()
        if not self.path.exists():
            raise InventoryError(f"inventory {path}: no such file or directory")
        self.data = self._read()
        meta = self.data.get("_meta", {}).get("hostvars", {})
        self.hosts = {name: Host(name, dict(v)) for name, v in meta.items()}
        for group in self.data:
            if group == "_meta":
                continue
            for name in self.members(group):
                self.hosts.setdefault(name, Host(name)).groups.append(group)

    def _read(self):
        try:
            p = subprocess.run(
                [ansible_bin("ansible-inventory"), "-i", str(self.path), "--list"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True", "ANSIBLE_NOCOLOR": "1"},
            )
        except subprocess.TimeoutExpired:
            raise InventoryError(f"inventory {self.path}: ansible-inventory took over 60 s") from None
        if p.returncode != 0:
            said = [ln.strip() for ln in p.stderr.splitlines() if ln.strip() and "WARNING" not in ln]
            raise InventoryError(f"inventory {self.path}: Ansible cannot read it: {' '.join(said)[:400]}")
        return json.loads(p.stdout)

    def members(self, group, seen=None) -> list[str]:
        """The hosts of `group` and of its child groups, in the inventory's order."""
        seen = seen if seen is not None else set()
        if group in seen:
            return []
        seen.add(group)
        node = self.data.get(group, {})
        out = list(node.get("hosts", []))
        for child in node.get("children", []):
            out += [h for h in self.members(child, seen) if h not in out]
        return out

    def role(self, role) -> list[Host]:
        return [self.hosts[h] for h in self.members(role)]

    def roles(self, bench) -> dict[str, list[Host]]:
        """{role: its hosts} for `bench`; InventoryError when a role has too few or too many."""
        if bench not in ROLES:
            raise InventoryError(f"no bench {bench!r} runs on hosts (only {', '.join(ROLES)})")
        out = {}
        for role, (least, most) in ROLES[bench].items():
            hosts = self.role(role)
            if len(hosts) < least:
                raise InventoryError(
                    f"bench {bench}: the role {role!r} has {'no host' if not hosts else f'{len(hosts)} hosts'} "
                    f"(it needs {least}{' or more' if most is None else ''}); fix: a group {role!r} in "
                    f"{self.path.name} with {'its host' if least == most == 1 else f'{least} hosts'}"
                )
            if most is not None and len(hosts) > most:
                raise InventoryError(
                    f"bench {bench}: the role {role!r} has {len(hosts)} hosts ({', '.join(h.name for h in hosts)}), "
                    f"it takes {most}; fix: leave one in the group {role!r}"
                )
            out[role] = hosts
        return out

    def bench_hosts(self, bench) -> list[Host]:
        seen = []
        for hosts in self.roles(bench).values():
            seen += [h for h in hosts if h not in seen]
        return seen

    def lab_hosts(self) -> list[Host]:
        """Every host that plays any role (the hosts setup, facts and cleanup go to)."""
        seen = []
        for role in ALL_ROLES:
            seen += [h for h in self.role(role) if h not in seen]
        # as the inventory has them (its groups' order: Ansible's --list sorts hostvars by
        # name), so that a table of hosts reads as the file does
        order = self.members("all")
        seen.sort(key=lambda h: order.index(h.name) if h.name in order else len(order))
        return seen or list(self.hosts.values())

    def ifaces_of(self, host, bench=None) -> dict[str, str]:
        """{"ROLE" or "ROLE:purpose": iface} the host uses, for `bench` or for every role it plays."""
        roles = ROLES[bench] if bench else ALL_ROLES
        out = {}
        for role in roles:
            if host.name not in self.members(role):
                continue
            for purpose in ROLE_IFACES[role] + (["out"] if role == "tap" else []):
                name = host.iface(role, purpose)
                if name:
                    out[role if purpose == "test" else f"{role}:{purpose}"] = name
        return out

    def resolved(self) -> dict:
        """The inventory as Ansible resolved it, secrets removed: for sidecars and facts."""
        return {
            "path": str(self.path),
            "hosts": {h.name: {"groups": sorted(h.groups), "vars": redacted(h.vars)} for h in self.hosts.values()},
        }
