"""Namespaces as hosts: a rack of machines on one, for the hosts commands' tests.

    >>> with NamespaceHosts() as rack:                           # doctest: +SKIP
    ...     rack.inventory                                       # a path: the inventory of lab.hosts.inventory
    ...     rack.run_controller(["python", "-m", "lab", "hosts", "check", "-i", str(rack.inventory)])

Each host is a lab namespace running Debian's own sshd (openssh-server, which
set-up installs with its service disabled: no sshd listens in the machine's root
namespace because of the lab) with a host key of its own, on a management bridge
in a namespace of its own; root logs in with a key made for this rack only, and
the controller, in a namespace of its own on that bridge, knows each host key from
a known_hosts file made for it. Host key checking stays on, as for real hosts.

Each host has a disk of its own at the same path, as machines have: its sshd runs in
a mount namespace of its own where the host's directory (`host_dir`) is mounted on
`disk` (the rack's `host/`), and everything Ansible runs there inherits it; so the
lab_dir is one path on every host, as /opt/vtap-lab is on real ones, and a copy of
one host's set-up is a working set-up on another (`copy_lab`). What the hosts still
share with each other and the machine (the kernel, /run/netns, the process table)
is scoped per host by the inventory: lab_env gives the lab there a namespace prefix
and a run directory of its own, so a run or a cleanup on one host never sees
another's.

Test links (`links`) join the hosts' test interfaces as a cable would: no address,
the kernel's defaults; what a bench needs there, the lab does on the host.
"""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from lab import netns
from lab.netns import LabError
from lab.topology import Topology

SSHD = "/usr/sbin/sshd"
# Testbed 1 on three machines, as docs/hosts.md draws it: alpha sends into beta, which
# taps toward gamma; and delta, beta's way out when beta bridges (Testbed 2: TESTBED2_ROLES)
RACK = {
    "hosts": ["alpha", "beta", "gamma", "delta"],
    "links": [("alpha", "eth1", "beta", "eth1"), ("beta", "eth2", "gamma", "eth1"), ("beta", "eth3", "delta", "eth1")],
    "roles": {
        "sender": {"alpha": {"lab_iface": "eth1"}},
        "tap": {"beta": {"lab_iface": "eth1", "lab_monitor_iface": "eth2"}},
        "receiver": {"beta": {}},
        "monitor": {"gamma": {"lab_iface": "eth1"}},
        "nodes": {"alpha": {}, "beta": {}},
    },
}
TESTBED2_ROLES = {
    "sender": {"alpha": {"lab_iface": "eth1"}},
    "tap": {"beta": {"lab_iface": "eth1", "lab_monitor_iface": "eth2", "lab_out_iface": "eth3"}},
    "receiver": {"delta": {"lab_iface": "eth1"}},
    "monitor": {"gamma": {"lab_iface": "eth1"}},
}


def _yaml(value, indent=0) -> str:
    """A small YAML writer for the inventory (str, int, dict): the lab writes an
    inventory as a user would, and needs no YAML library for it."""
    pad = " " * indent
    out = []
    for key, v in value.items():
        if isinstance(v, dict):
            out.append(f"{pad}{key}:" + (" {}" if not v else ""))
            if v:
                out.append(_yaml(v, indent + 2))
        else:
            text = str(v)
            out.append(f"{pad}{key}: " + (f"'{text}'" if not text.isdigit() else text))
    return "\n".join(out)


class NamespaceHosts:
    """Hosts (namespaces with sshd), a controller namespace, a management bridge,
    test links; and the inventory that names them (layout: RACK's shape)."""

    def __init__(self, layout=None, base=None):
        layout = layout or RACK
        self.names = list(layout["hosts"])
        self.links = list(layout["links"])
        self.role_vars = layout["roles"]
        self.topo = Topology("hosts")
        self._base_given = base is not None
        self.base = Path(base) if base else None
        self.mgmt = {}  # host -> its management address
        self.sshd = {}  # host -> its sshd (whose namespaces, network and mount, are the host's)
        self.prefixes = {}  # host -> the lab's namespace prefix there
        self.inventory = None

    # --- building -----------------------------------------------------------------
    def build(self):
        if self.base is None:
            self.base = Path(tempfile.mkdtemp(prefix="vtl-hosts-"))
        self.base.chmod(0o700)
        t = self.topo
        t.add_host("ctl")
        t.add_host("mgmt")
        v4, _ = t.new_segment()
        ports = []
        for i, name in enumerate(["ctl", *self.names]):
            if name != "ctl":
                t.add_host(name)
            self.mgmt[name] = str(v4[i + 1])
            t.add_link(name, "mgmt", "eth0", f"p{i}", [f"{v4[i + 1]}/24"], [])
            ports.append(f"p{i}")
        t.add_bridge("mgmt", "br0", ports)
        for a, a_if, b, b_if in self.links:
            t.add_link(a, b, a_if, b_if, [], [])
        try:
            self.disk.mkdir(mode=0o700, exist_ok=True)  # the mount point of each host's own disk
            t.build()
            self._keys()
            for i, name in enumerate(self.names):
                # a prefix per host ("vt", 3 of the run id's letters, the host's number): its
                # own runs only, and never one of another rack's hosts or a suite worker's
                self.prefixes[name] = f"vt{t.run_id[:3]}{i}-"
                self._start_sshd(name)
            self.inventory = self.write_inventory()
            self._wait_for_ssh()
        except BaseException:
            self.close()
            raise
        return self

    def _keys(self):
        self.key = self.base / "id_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vtap-lab hosts test", "-f", str(self.key)],
            check=True,
        )
        known = []
        for name in self.names:
            d = self.host_dir(name)
            d.mkdir(mode=0o700)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
            shutil.copy(f"{self.key}.pub", d / "authorized_keys")
            kind, key = (d / "host_key.pub").read_text().split()[:2]
            known.append(f"{self.mgmt[name]} {kind} {key}")
        self.known_hosts = self.base / "known_hosts"
        self.known_hosts.write_text("\n".join(known) + "\n")

    @property
    def disk(self) -> Path:
        """Where each host sees its own directory (in its own mount namespace)."""
        return self.base / "host"

    def host_dir(self, name) -> Path:
        """The host's directory, as the machine (and a test) sees it."""
        return self.base / name

    def lab_dir(self, name) -> Path:
        """The host's lab_dir, as the machine sees it (the host sees it at `disk`/lab)."""
        return self.host_dir(name) / "lab"

    def copy_lab(self, source, *names):
        """A set-up host's lab_dir copied to other hosts, as a machine imaged from another
        is: the same tree, stamps and virtual environment at the same path."""
        for name in names:
            shutil.rmtree(self.lab_dir(name), ignore_errors=True)
            subprocess.run(["cp", "-a", str(self.lab_dir(source)), str(self.lab_dir(name))], check=True)

    def _start_sshd(self, name):
        if not os.access(SSHD, os.X_OK):
            raise LabError(f"{SSHD} is missing: the namespace hosts run Debian's sshd; fix: scripts/setup.sh")
        d = self.host_dir(name)
        (d / "sshd_config").write_text(
            "\n".join(
                [
                    f"ListenAddress {self.mgmt[name]}",
                    f"HostKey {self.disk / 'host_key'}",
                    f"PidFile {self.disk / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.disk / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    # the rack's files live under a temporary directory, whose parents
                    # (/tmp) sshd's strict modes refuse; the directory itself is 0700
                    "StrictModes no",
                    "MaxStartups 100",
                    "MaxSessions 100",
                    "Subsystem sftp internal-sftp",
                    "LogLevel ERROR",
                ]
            )
            + "\n"
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        (d / "lab").mkdir(mode=0o755, exist_ok=True)
        # sshd in a mount namespace of its own (unshare: private propagation), the host's
        # directory mounted on `disk` there, and the cgroup v2 hierarchy on /sys/fs/cgroup
        # as a machine has it (ip netns exec mounts a /sys of the namespace's own, without
        # it: a pods node's socket programs attach there); each exec keeps the pid (ip netns
        # exec, unshare, sh), so the process started is sshd itself
        self.sshd[name] = self.topo.popen(
            name,
            [
                "unshare",
                "--mount",
                "--",
                "sh",
                "-c",
                'mount --bind "$0" "$1" && mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$2" -D -e -f "$3"',
                str(d),
                str(self.disk),
                SSHD,
                str(self.disk / "sshd_config"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(d / "sshd.log", "w"),  # noqa: SIM115 (the process holds it)
        )

    def _wait_for_ssh(self, seconds=10.0):
        deadline = time.monotonic() + seconds
        for name in self.names:
            while True:
                p = netns.run(
                    self.topo.ns("ctl"),
                    ["ssh", *self.ssh_options(), f"root@{self.mgmt[name]}", "true"],
                    check=False,
                    capture_output=True,
                    text=True,
                )
                if p.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise LabError(f"namespace host {name}: sshd does not answer: {p.stderr.strip()}")
                time.sleep(0.1)

    def ssh_options(self) -> list[str]:
        return [
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "IdentitiesOnly=yes",
            "-i",
            str(self.key),
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
        ]

    def host_vars(self, name) -> dict:
        """The host's variables in the inventory: its paths as the host sees them."""
        return {
            "ansible_host": self.mgmt[name],
            "lab_dir": str(self.disk / "lab"),
            "lab_env": {
                "VTL_NETNS_PREFIX": self.prefixes[name],
                "VTL_RUN_DIR": str(self.disk / "run"),
                "VTL_BPF_CACHE": os.environ.get("VTL_BPF_CACHE", str(self.disk / "bpf")),
            },
        }

    def write_inventory(self, path=None, roles=None, extra_vars=None, host_vars=None) -> Path:
        """The rack's inventory in the format of docs/hosts.md (YAML); `roles` and
        `host_vars` change it, for tests of bad inventories."""
        roles = self.role_vars if roles is None else roles
        inv = {
            "all": {
                "vars": {
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": str(self.key),
                    "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts} -o IdentitiesOnly=yes",
                    **(extra_vars or {}),
                },
                "hosts": {n: {**self.host_vars(n), **(host_vars or {}).get(n, {})} for n in self.names},
                "children": {role: {"hosts": members} for role, members in roles.items()},
            }
        }
        path = Path(path) if path else self.base / "hosts.yml"
        path.write_text(_yaml(inv) + "\n")
        return path

    def ns(self, name) -> str:
        return self.topo.ns(name)

    def run_on(self, name, argv, cwd=None, **kw):
        """Run a command on a host as its sshd's sessions run: in its network and mount
        namespaces, its paths (and `cwd`) the inventory's."""
        kw.setdefault("check", False)
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        # (nsenter's --wd opens its directory before it enters the mount namespace)
        wd = ["sh", "-c", 'cd "$0" && exec "$@"', str(cwd)] if cwd else []
        return subprocess.run(["nsenter", "-t", str(self.sshd[name].pid), "-n", "-m", "--", *wd, *map(str, argv)], **kw)

    def run_controller(self, argv, **kw):
        """Run a command in the controller's namespace (where Ansible reaches the hosts)."""
        kw.setdefault("check", False)
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return netns.run(self.topo.ns("ctl"), argv, **kw)

    # --- faults, for the tests --------------------------------------------------------
    def lose(self, name):
        """The host gone as a machine goes: every sshd of it killed, its management link down."""
        for pid in netns.pids(self.ns(name)):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                    os.kill(pid, 9)
            except (OSError, ProcessLookupError):
                pass
        netns.run(self.ns(name), ["ip", "link", "set", "dev", "eth0", "down"])

    def revive(self, name):
        netns.run(self.ns(name), ["ip", "link", "set", "dev", "eth0", "up"])
        self._start_sshd(name)
        self._wait_for_ssh()

    # --- teardown -----------------------------------------------------------------
    def close(self):
        try:
            self.topo.teardown()  # sshd and everything the hosts ran die with their namespaces
        finally:
            if self.base is not None and not self._base_given:
                shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self):
        return self.build()

    def __exit__(self, *exc):
        self.close()
