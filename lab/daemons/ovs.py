"""Open vSwitch on its userspace (netdev) datapath, in a lab namespace: the
vTAP's port-mirroring peer (lab.fastpaths.vtap.peers.OvsMirror configures it).

This kernel has no openvswitch module, so ovs-vswitchd forwards in user space,
reading and writing the ports through AF_PACKET sockets. ovsdb-server and
ovs-vswitchd run inside the namespace with their own database, sockets and
logs in the run directory (/run/vtap-lab/<namespace>.ovs), pinned to `cpu`:
on a shared core kernel receive work starves them.
"""

import os
import subprocess
from pathlib import Path

from lab import netns
from lab.daemons import Daemon, require
from lab.netns import LabError


class OvsSwitch(Daemon):
    suffix = ".ovs"
    what = "OVS"
    close_grace = 10.0
    SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")

    def __init__(self, ns, cpu=None):
        for tool in ("ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovsdb-tool"):
            require(tool, "openvswitch-switch")
        super().__init__(ns, cpu=cpu)

    def env(self):
        d = str(self.dir)
        return {
            **os.environ,
            "OVS_RUNDIR": d,
            "OVS_DBDIR": d,
            "OVS_LOGDIR": d,
            "OVS_SYSCONFDIR": d,
            "OVS_PKGDATADIR": str(self.SCHEMA.parent),
        }

    def launch(self, timeout):
        """A database of our own, its server, then the switch daemon, each waited for."""
        d = self.dir
        subprocess.run(["ovsdb-tool", "create", str(d / "conf.db"), str(self.SCHEMA)], check=True, capture_output=True)
        self.spawn(
            [
                "ovsdb-server",
                str(d / "conf.db"),
                f"--remote=punix:{d}/db.sock",
                f"--unixctl={d}/ovsdb-server.ctl",
                f"--log-file={d}/ovsdb-server.log",
                "--no-chdir",
            ],
            env=self.env(),
        )
        self.wait_until((d / "db.sock").exists, timeout, "ovsdb-server")
        self.vsctl("--no-wait", "init")
        self.spawn(
            [
                "ovs-vswitchd",
                f"unix:{d}/db.sock",
                f"--unixctl={d}/ovs-vswitchd.ctl",
                f"--log-file={d}/ovs-vswitchd.log",
                "--no-chdir",
            ],
            env=self.env(),
        )
        self.wait_until((d / "ovs-vswitchd.ctl").exists, timeout, "ovs-vswitchd")

    def vsctl(self, *args):
        """ovs-vsctl against this switch's database; LabError with its own words."""
        r = netns.run(
            self.ns,
            ["ovs-vsctl", f"--db=unix:{self.dir}/db.sock", "--timeout=20", *args],
            check=False,
            capture_output=True,
            text=True,
            env=self.env(),
        )
        if r.returncode != 0:
            said = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode
            raise LabError(f"ovs-vsctl {' '.join(args[:3])}: {said}")
        return r.stdout.strip()
