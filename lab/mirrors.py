"""Ways to mirror a tapped interface's ingress traffic to a monitor interface,
all driven the same way, so experiments can swap them:

    >>> m = MIRRORS["tc-mirred"](ns, "eth0", "mon0")     # doctest: +SKIP
    >>> m.attach(); ...; m.counters(); m.detach()

    none       nothing: the ceiling every mirror is compared with
    ebpf       the vTAP (ebpf.TcMirror) on the clsact ingress hook: the program
               classifies, the filter's mirred action copies (the vTAP's default)
    ebpf-helper  the vTAP copying with bpf_clone_redirect() instead (`vtap --clone helper`)
    tc-mirred  tc u32 match-all filter with a mirred egress mirror action (pyroute2)
    nft-dup    nftables netdev-family ingress chain with `dup to` (nftables' JSON API)
    ovs        Open vSwitch port mirroring, userspace (netdev) datapath, daemons of our own

counters() returns at least "mirrored" and "mirrored_bytes", each peer from its
own statistics (vTAP counters, tc action stats, nft rule counter); OVS updates
its mirror statistics only every few seconds, so for it they are the monitor
port's transmit counters.

Every attach is undone by detach(), and the namespace's removal undoes it too if
the process dies. `bridge`, for a tap node that forwards with a Linux bridge
(testbed 2), names the bridge and its ports: OVS must take those ports over for
the run, and gives them back on detach.
"""

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path

from pyroute2.netlink.exceptions import NetlinkError

from ebpf import TcMirror
from ebpf import tc as ebpf_tc
from ebpf.netdev import ifindex_of, netlink_reason

from . import netns, nft
from .metrics import iface_counters
from .netns import LabError
from .peers import Peer
from .topology import RUN_DIR


class Mirror(Peer):
    """A peer whose job is copying the tapped interface's ingress to the monitor."""
    name = "none"

    def __init__(self, ns, tap_iface, monitor_iface, bridge=None, cpu=None):
        super().__init__()
        self.ns, self.tap_iface, self.monitor_iface = ns, tap_iface, monitor_iface
        self.bridge = bridge  # (bridge name, [ports]) when the tap node bridges
        self.cpu = cpu        # where a userspace datapath should run
        self._base = None

    def _ifindex(self, ifname):
        with netns.ipr(self.ns) as ip:
            return ifindex_of(ip, ifname, self.ns)

    def attach(self):
        self._base = iface_counters(self.ns, self.monitor_iface)
        self.attached = True

    def detach(self):
        self.attached = False

    def counters(self) -> dict:
        now = iface_counters(self.ns, self.monitor_iface)
        return {"mirrored": now["tx_packets"] - self._base["tx_packets"],
                "mirrored_bytes": now["tx_bytes"] - self._base["tx_bytes"]}


class NoMirror(Mirror):
    name = "none"


class EbpfMirror(Mirror):
    """The vTAP. Compiled once; attach/detach only add and remove the filter."""
    name = "ebpf"
    clone = "action"

    def __init__(self, *a, watch=None, **kw):
        super().__init__(*a, **kw)
        self.tap = TcMirror(self.monitor_iface, watch=watch, netns=self.ns, clone=self.clone)
        self._filters = []

    def attach(self):
        self._filters = self.tap.attach(self.tap_iface, "ingress")
        self.tap.reset_counters()
        self.attached = True

    def detach(self):
        for f in self._filters:
            self.tap.detach_tc(f)
        self._filters = []
        self.attached = False

    def counters(self) -> dict:
        c = self.tap.counters()
        return {"mirrored": c["cloned"], "mirrored_bytes": c["cloned_bytes"], **c}

    def close(self):
        super().close()
        self.tap.close()


class EbpfHelperMirror(EbpfMirror):
    """The vTAP with bpf_clone_redirect(): what the copy costs when BPF makes it."""
    name = "ebpf-helper"
    clone = "helper"


class TcMirred(Mirror):
    """tc filter add dev <tap> ingress prio 1 u32 match u32 0 0 action mirred egress mirror dev <mon>
    (u32 because this kernel has neither matchall nor flower)."""
    name = "tc-mirred"
    PRIO = 1

    def attach(self):
        ifindex, mon = self._ifindex(self.tap_iface), self._ifindex(self.monitor_iface)
        with netns.ipr(self.ns) as ip:
            self._created = not ebpf_tc.has_clsact(ip, ifindex)
            if self._created:
                ip.tc("add", "clsact", index=ifindex)
            try:
                ip.tc("add-filter", "u32", index=ifindex, parent=ebpf_tc.PARENTS["ingress"], prio=self.PRIO,
                      protocol=ebpf_tc.ETH_P_ALL, keys=["0x0/0x0+0"], target=0x10001,
                      action={"kind": "mirred", "direction": "egress", "action": "mirror", "ifindex": mon})
            except NetlinkError as e:
                if self._created:
                    ip.tc("del", "clsact", index=ifindex)
                raise LabError(f"tc mirred on {self.tap_iface}: {netlink_reason(e)}") from None
        self._ifidx = ifindex
        self.attached = True

    def _action_stats(self):
        with netns.ipr(self.ns) as ip:
            for msg in ip.get_filters(index=self._ifidx, parent=ebpf_tc.PARENTS["ingress"]):
                s = ebpf_tc.first_action_stats(msg)
                if s is not None:
                    return {"mirrored": s["packets"], "mirrored_bytes": s["bytes"]}
        return {"mirrored": 0, "mirrored_bytes": 0}

    def counters(self):
        return self._action_stats()

    def detach(self):
        """Remove the filter, and the clsact qdisc if attach() created it. Quietly
        done if the namespace, the device, the qdisc or the filter is gone already;
        any other refusal is a LabError, and the mirror counts as still attached."""
        if netns.exists(self.ns):
            with netns.ipr(self.ns) as ip:
                if ip.link_lookup(index=self._ifidx) and ebpf_tc.has_clsact(ip, self._ifidx):
                    try:
                        ip.tc("del-filter", "u32", index=self._ifidx, parent=ebpf_tc.PARENTS["ingress"],
                              prio=self.PRIO, protocol=ebpf_tc.ETH_P_ALL, target=0x10001)
                    except NetlinkError as e:
                        if e.code != errno.ENOENT:  # ENOENT: no such filter, it is gone already
                            raise LabError(f"removing tc mirred from {self.tap_iface} in {self.ns}: "
                                           f"{netlink_reason(e)}") from None
                    if self._created:
                        try:
                            ebpf_tc.drop_clsact_if_unused(ip, self._ifidx)
                        except NetlinkError as e:
                            raise LabError(f"removing the clsact qdisc of {self.tap_iface} in {self.ns}: "
                                           f"{netlink_reason(e)}") from None
        self.attached = False


class NftDup(Mirror):
    """table netdev vtl_dup { chain ingress { type filter hook ingress device <tap> priority 0;
    counter dup to <mon> } }, through libnftables' JSON API inside the namespace."""
    name = "nft-dup"
    TABLE = "vtl_dup"

    def attach(self):
        self._ifindex(self.tap_iface), self._ifindex(self.monitor_iface)
        t = {"family": "netdev", "table": self.TABLE}
        nft.run(self.ns, [
            {"add": {"table": {"family": "netdev", "name": self.TABLE}}},
            {"add": {"chain": {**t, "name": "ingress", "type": "filter", "hook": "ingress",
                               "dev": self.tap_iface, "prio": 0, "policy": "accept"}}},
            {"add": {"rule": {**t, "chain": "ingress", "expr": [
                {"counter": None}, {"dup": {"addr": self.monitor_iface}}]}}},
        ])
        self.attached = True

    def counters(self):
        (packets, nbytes), = nft.counters(self.ns, "netdev", self.TABLE) or [(0, 0)]
        return {"mirrored": packets, "mirrored_bytes": nbytes}

    def tables(self):
        return nft.tables(self.ns, "netdev")

    def detach(self):
        nft.delete_table(self.ns, "netdev", self.TABLE)
        self.attached = False


class OvsMirror(Mirror):
    """Open vSwitch port mirroring on the userspace (netdev) datapath.

    This kernel has no openvswitch module, so ovs-vswitchd forwards in user space,
    reading and writing the ports through AF_PACKET sockets. ovsdb-server and
    ovs-vswitchd run inside the tap node's namespace with their own database,
    sockets and logs under /run/vtap-lab/<namespace>.ovs, pinned to `cpu`: on a
    shared core kernel receive work starves them.
    """
    name = "ovs"
    takes_dut_core = True  # its datapath is a process: give it the DUT core (see lab.peers)
    BRIDGE = "vtlovs"
    SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        for tool in ("ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovsdb-tool"):
            if not shutil.which(tool):
                raise LabError(f"{tool} not found (Debian package openvswitch-switch; run `make setup`)")
        self.dir = RUN_DIR / f"{self.ns}.ovs"
        self.procs = []

    def _env(self):
        d = str(self.dir)
        return {**os.environ, "OVS_RUNDIR": d, "OVS_DBDIR": d, "OVS_LOGDIR": d, "OVS_SYSCONFDIR": d,
                "OVS_PKGDATADIR": str(self.SCHEMA.parent)}

    def vsctl(self, *args):
        r = netns.run(self.ns, ["ovs-vsctl", f"--db=unix:{self.dir}/db.sock", "--timeout=20", *args],
                      check=False, capture_output=True, text=True, env=self._env())
        if r.returncode != 0:
            raise LabError(f"ovs-vsctl {' '.join(args[:3])}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
        return r.stdout.strip()

    def _start(self, argv):
        if self.cpu is not None:
            argv = ["taskset", "-c", str(self.cpu), *argv]
        p = netns.popen(self.ns, argv, env=self._env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        start_new_session=True)
        self.procs.append(p)
        return p

    def _wait_for(self, path, proc, what, timeout=15):
        deadline = time.monotonic() + timeout
        while not path.exists():
            if proc.poll() is not None:
                raise LabError(f"{what} exited: {proc.stderr.read().decode(errors='replace').strip()[-200:]}")
            if time.monotonic() > deadline:
                raise LabError(f"{what} did not start within {timeout} s")
            time.sleep(0.05)

    def attach(self):
        try:
            self._attach()
        except BaseException:
            self.detach()
            raise

    def _attach(self):
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self.attached = True
        subprocess.run(["ovsdb-tool", "create", str(self.dir / "conf.db"), str(self.SCHEMA)], check=True,
                       capture_output=True)
        d = self.dir
        db = self._start(["ovsdb-server", str(d / "conf.db"), f"--remote=punix:{d}/db.sock",
                          f"--unixctl={d}/ovsdb-server.ctl", f"--log-file={d}/ovsdb-server.log", "--no-chdir"])
        self._wait_for(d / "db.sock", db, "ovsdb-server")
        self.vsctl("--no-wait", "init")
        sw = self._start(["ovs-vswitchd", f"unix:{d}/db.sock", f"--unixctl={d}/ovs-vswitchd.ctl",
                          f"--log-file={d}/ovs-vswitchd.log", "--no-chdir"])
        self._wait_for(d / "ovs-vswitchd.ctl", sw, "ovs-vswitchd")
        ports = [self.tap_iface, self.monitor_iface]
        if self.bridge:
            name, bports = self.bridge
            with netns.ipr(self.ns) as ip:
                for p in bports:
                    ip.link("set", index=self._ifindex(p), master=0)
            ports = list(dict.fromkeys([*bports, self.monitor_iface]))
        self.vsctl("add-br", self.BRIDGE, "--", "set", "bridge", self.BRIDGE, "datapath_type=netdev")
        for p in ports:
            self.vsctl("add-port", self.BRIDGE, p)
        self._ports = ports
        self.vsctl("--", "--id=@p", "get", "port", self.tap_iface,
                   "--", "--id=@m", "get", "port", self.monitor_iface,
                   "--", "--id=@mir", "create", "mirror", "name=vtl", "select-src-port=@p", "output-port=@m",
                   "--", "set", "bridge", self.BRIDGE, "mirrors=@mir")
        self._base = iface_counters(self.ns, self.monitor_iface)

    def ready(self, timeout=15.0):
        """ovs-vsctl returns when ovs-vswitchd has taken the configuration; a port
        is open (its AF_PACKET socket bound) once it has an OpenFlow port number."""
        deadline = time.monotonic() + timeout
        while True:
            ofports = {p: self.vsctl("get", "interface", p, "ofport") for p in self._ports}
            if all(n.isdigit() and int(n) > 0 for n in ofports.values()):
                return
            if time.monotonic() > deadline:
                raise LabError(f"OVS ports not open after {timeout:.0f} s: {ofports}")
            time.sleep(0.05)

    def detach(self):
        if self.attached and netns.exists(self.ns):
            for p in reversed(self.procs):  # ovs-vswitchd before its database
                netns.stop(p, grace=10)
            with netns.ipr(self.ns) as ip:
                # the bridge's and the datapath's internal ports (tap devices)
                # outlive ovs-vswitchd
                for name in (self.BRIDGE, "ovs-netdev"):
                    for dev in ip.link_lookup(ifname=name):
                        ip.link("del", index=dev)
                if self.bridge:
                    name, bports = self.bridge
                    master = self._ifindex(name)
                    for p in bports:
                        ip.link("set", index=self._ifindex(p), master=master)
        for p in self.procs:
            if p.stderr:
                p.stderr.close()
        self.procs = []
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        self.attached = False

    def daemons_running(self):
        return [p.pid for p in self.procs if p.poll() is None]


MIRRORS = {m.name: m for m in (NoMirror, EbpfMirror, EbpfHelperMirror, TcMirred, NftDup, OvsMirror)}
