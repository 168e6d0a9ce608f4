"""Ways to mirror a tapped interface's ingress traffic to a monitor interface,
all driven the same way, so experiments can swap them:

    >>> m = MIRRORS["tc-mirred"](ns, "eth0", "mon0")     # doctest: +SKIP
    >>> m.attach(); ...; m.counters(); m.detach()

    none       nothing: the ceiling every mirror is compared with
    ebpf       the vTAP (ebpf.TcMirror) on the clsact ingress hook: the program
               classifies, the filter's mirred action copies (the vTAP's default)
    ebpf-helper  the vTAP copying with bpf_clone_redirect() instead (`vtap --clone helper`)
    ebpf-xdp   the XDP vTAP (ebpf.XdpMirror, `vtap --hook xdp`): on a node that routes
               (Testbed 3), each watched frame to its egress and the monitor from XDP
    ebpf-sessions  vTAP sessions (ebpf.SessionMirror, `vtap --sessions`): N ordered rules, the
               load matching the last; copies to the monitor or tunnelled to Testbed 3's
               collector, whole or cut (its `rules`, `target` and `truncate`)
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

`testbeds`: the testbeds a mirror applies to (the XDP vTAP needs a node that
routes; OVS here bridges or copies at a receiver, it does not route).
"""

import errno
import time

from pyroute2.netlink.exceptions import NetlinkError

from ebpf import TcMirror
from ebpf import tc as ebpf_tc
from ebpf.netdev import ifindex_of, netlink_reason
from ebpf.vtap.sessions.config import Rule, Session
from ebpf.vtap.sessions.tc_sessions import SessionMirror
from ebpf.vtap.xdp_mirror import XdpMirror
from lab import netns, nft
from lab.daemons.ovs import OvsSwitch
from lab.hostcheck import PreparedPeers
from lab.metrics import iface_counters
from lab.netns import LabError
from lab.peer import Peer
from lab.testbeds import COLLECTOR_V4


class Mirror(Peer):
    """A peer whose job is copying the tapped interface's ingress to the monitor."""

    name = "none"
    kind = "vtap"
    testbeds = (1, 2, 3)

    def __init__(self, ns, tap_iface, monitor_iface, bridge=None, cpu=None):
        super().__init__()
        self.ns, self.tap_iface, self.monitor_iface = ns, tap_iface, monitor_iface
        self.bridge = bridge  # (bridge name, [ports]) when the tap node bridges
        self.cpu = cpu  # where a userspace datapath should run
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
        return {
            "mirrored": now["tx_packets"] - self._base["tx_packets"],
            "mirrored_bytes": now["tx_bytes"] - self._base["tx_bytes"],
        }


class NoMirror(Mirror):
    name = "none"
    colour, marker = "#555555", "s"  # the ceiling: grey, dashed


class VtapMirror(Mirror):
    """A vTAP program of ours as a peer (`self.tap`, a MirrorBase): its own counters,
    and freed with the peer."""

    def counters(self) -> dict:
        c = self.tap.counters()
        return {"mirrored": c["cloned"], "mirrored_bytes": c["cloned_bytes"], **c}

    def close(self):
        super().close()
        self.tap.close()


class EbpfMirror(VtapMirror):
    """The vTAP. Compiled once; attach/detach only add and remove the filter."""

    name = "ebpf"
    colour, marker = "#0072B2", "o"  # the vTAP's two copy paths are the palette's two blues
    clone = "action"

    def __init__(self, *a, watch=None, cutoff=0, **kw):
        super().__init__(*a, **kw)
        # cutoff: 0 is the vTAP without a flow table at all (what it costs when not asked for)
        self.cutoff = cutoff
        table = {"cutoff": cutoff} if cutoff else {}
        self.tap = TcMirror(self.monitor_iface, watch=watch, netns=self.ns, clone=self.clone, **table)
        self._filters = []

    def program_fds(self) -> dict:
        """{tap: fd}: for the kernel's run-time statistics (the tap's own ns per packet)."""
        return {"tap": self.tap.load_program().fd}

    def attach(self):
        self._filters = self.tap.attach(self.tap_iface, "ingress")
        self.tap.reset_counters()
        self.tap.clear_flows()  # each run's flows start from zero, as a fresh tap's would
        self.attached = True

    def detach(self):
        for f in self._filters:
            self.tap.detach_tc(f)
        self._filters = []
        self.attached = False


class EbpfHelperMirror(EbpfMirror):
    """The vTAP with bpf_clone_redirect(): what the copy costs when BPF makes it."""

    name = "ebpf-helper"
    colour, marker = "#56B4E9", "v"
    clone = "helper"


class EbpfXdpMirror(VtapMirror):
    """The XDP vTAP, native: it sends each frame out itself (to the egress and
    the monitor), so it owns the DUT's XDP hook and counts arrivals there."""

    name = "ebpf-xdp"
    colour, marker = "#CC79A7", "P"
    testbeds = (3,)
    owns_dut_xdp = True

    def __init__(self, *a, watch=None, **kw):
        super().__init__(*a, **kw)
        self.tap = XdpMirror(self.monitor_iface, watch=watch, netns=self.ns)
        self.peers = PreparedPeers()

    def attach(self):
        self.attached = True
        try:
            # what `vtap --hook xdp --prepare-peer` does: a veth peer without XDP (where
            # a bench's sinks are not) gets a pass program, so the copies arrive
            for name in (self.monitor_iface, *self._egresses()):
                self.peers.prepare(name, self.ns)
            self.tap.attach(self.tap_iface, "native")
            self.tap.reset_counters()
        except BaseException:
            self.detach()
            raise

    def _egresses(self):
        with netns.ipr(self.ns) as ip:
            return [
                link.get_attr("IFLA_IFNAME")
                for link in ip.get_links()
                if link.get_attr("IFLA_IFNAME") not in ("lo", self.tap_iface, self.monitor_iface)
            ]

    def detach(self):
        for a in self.tap.xdp_attachments:
            self.tap.detach_xdp(a)
        self.peers.close()
        self.attached = False


class TcMirred(Mirror):
    """tc filter add dev <tap> ingress prio 1 u32 match u32 0 0 action mirred egress mirror dev <mon>
    (u32 because this kernel has neither matchall nor flower)."""

    name = "tc-mirred"
    colour, marker = "#E69F00", "D"
    PRIO = 1

    def attach(self):
        ifindex, mon = self._ifindex(self.tap_iface), self._ifindex(self.monitor_iface)
        with netns.ipr(self.ns) as ip:
            self._created = not ebpf_tc.has_clsact(ip, ifindex)
            if self._created:
                ip.tc("add", "clsact", index=ifindex)
            try:
                ip.tc(
                    "add-filter",
                    "u32",
                    index=ifindex,
                    parent=ebpf_tc.PARENTS["ingress"],
                    prio=self.PRIO,
                    protocol=ebpf_tc.ETH_P_ALL,
                    keys=["0x0/0x0+0"],
                    target=0x10001,
                    action={"kind": "mirred", "direction": "egress", "action": "mirror", "ifindex": mon},
                )
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
                        ip.tc(
                            "del-filter",
                            "u32",
                            index=self._ifidx,
                            parent=ebpf_tc.PARENTS["ingress"],
                            prio=self.PRIO,
                            protocol=ebpf_tc.ETH_P_ALL,
                            target=0x10001,
                        )
                    except NetlinkError as e:
                        if e.code != errno.ENOENT:  # ENOENT: no such filter, it is gone already
                            raise LabError(
                                f"removing tc mirred from {self.tap_iface} in {self.ns}: {netlink_reason(e)}"
                            ) from None
                    if self._created:
                        try:
                            ebpf_tc.drop_clsact_if_unused(ip, self._ifidx)
                        except NetlinkError as e:
                            raise LabError(
                                f"removing the clsact qdisc of {self.tap_iface} in {self.ns}: {netlink_reason(e)}"
                            ) from None
        self.attached = False


class NftDup(Mirror):
    """table netdev vtl_dup { chain ingress { type filter hook ingress device <tap> priority 0;
    counter dup to <mon> } }, through libnftables' JSON API inside the namespace."""

    name = "nft-dup"
    colour, marker = "#009E73", "^"
    TABLE = "vtl_dup"

    def attach(self):
        self._ifindex(self.tap_iface), self._ifindex(self.monitor_iface)
        t = {"family": "netdev", "table": self.TABLE}
        nft.run(
            self.ns,
            [
                {"add": {"table": {"family": "netdev", "name": self.TABLE}}},
                {
                    "add": {
                        "chain": {
                            **t,
                            "name": "ingress",
                            "type": "filter",
                            "hook": "ingress",
                            "dev": self.tap_iface,
                            "prio": 0,
                            "policy": "accept",
                        }
                    }
                },
                {
                    "add": {
                        "rule": {
                            **t,
                            "chain": "ingress",
                            "expr": [{"counter": None}, {"dup": {"addr": self.monitor_iface}}],
                        }
                    }
                },
            ],
        )
        self.attached = True

    def counters(self):
        ((packets, nbytes),) = nft.counters(self.ns, "netdev", self.TABLE) or [(0, 0)]
        return {"mirrored": packets, "mirrored_bytes": nbytes}

    def tables(self):
        return nft.tables(self.ns, "netdev")

    def detach(self):
        nft.delete_table(self.ns, "netdev", self.TABLE)
        self.attached = False


class OvsMirror(Mirror):
    """Open vSwitch port mirroring on the userspace (netdev) datapath: an OVS
    bridge of the tap node's ports (lab.daemons.ovs) whose mirror copies what
    arrives on the tapped port to the monitor's."""

    name = "ovs"
    colour, marker = "#D55E00", "X"
    takes_dut_core = True  # its datapath is a process: give it the DUT core (see lab.peer)
    testbeds = (1, 2)
    BRIDGE = "vtlovs"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.switch = OvsSwitch(self.ns, cpu=self.cpu)  # checks that OVS is installed

    def attach(self):
        self.attached = True
        try:
            self._attach()
        except BaseException:
            self.detach()
            raise

    def _attach(self):
        sw = self.switch.start()
        ports = [self.tap_iface, self.monitor_iface]
        if self.bridge:
            name, bports = self.bridge
            with netns.ipr(self.ns) as ip:
                for p in bports:
                    ip.link("set", index=self._ifindex(p), master=0)
            ports = list(dict.fromkeys([*bports, self.monitor_iface]))
        sw.vsctl("add-br", self.BRIDGE, "--", "set", "bridge", self.BRIDGE, "datapath_type=netdev")
        for p in ports:
            sw.vsctl("add-port", self.BRIDGE, p)
        self._ports = ports
        sw.vsctl(
            "--",
            "--id=@p",
            "get",
            "port",
            self.tap_iface,
            "--",
            "--id=@m",
            "get",
            "port",
            self.monitor_iface,
            "--",
            "--id=@mir",
            "create",
            "mirror",
            "name=vtl",
            "select-src-port=@p",
            "output-port=@m",
            "--",
            "set",
            "bridge",
            self.BRIDGE,
            "mirrors=@mir",
        )
        self._base = iface_counters(self.ns, self.monitor_iface)

    def ready(self, timeout=15.0):
        """ovs-vsctl returns when ovs-vswitchd has taken the configuration; a port
        is open (its AF_PACKET socket bound) once it has an OpenFlow port number."""
        deadline = time.monotonic() + timeout
        while True:
            ofports = {p: self.switch.vsctl("get", "interface", p, "ofport") for p in self._ports}
            if all(n.isdigit() and int(n) > 0 for n in ofports.values()):
                return
            if time.monotonic() > deadline:
                raise LabError(f"OVS ports not open after {timeout:.0f} s: {ofports}")
            time.sleep(0.05)

    def detach(self):
        if self.attached and netns.exists(self.ns):
            self.switch.stop(grace=10)  # ovs-vswitchd before its database
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
        self.switch.close()
        self.attached = False

    def daemons_running(self):
        return [p.pid for p in self.switch.procs if p.poll() is None]


def bench_rules(n, src):
    """n rules whose last accepts the load (UDP from src); the others, each a
    different kind of rule the load does not match, fill the tables as a real
    rule set would: ports, ranges, prefixes of both families, protocols."""
    rules = []
    for i in range(n - 1):
        kind = i % 4
        if kind == 0:
            rules.append(Rule("accept", protocol="tcp", destination_ports=str(20000 + i)))
        elif kind == 1:
            rules.append(Rule("reject", protocol="udp", source_ports=f"{30000 + i}-{30000 + i + 7}"))
        elif kind == 2:
            rules.append(Rule("accept", source=f"203.0.{i % 256}.0/24"))
        else:
            rules.append(Rule("accept", destination=f"2001:db8:{i:x}::/48"))
    rules.append(Rule("accept", protocol="udp", source=f"{src}/32"))
    return rules


class EbpfSessionsMirror(VtapMirror):
    """vTAP sessions: one session of `rules` rules (the load matches the last),
    to the monitor (target local) or tunnelled to Testbed 3's collector (vxlan,
    erspan), whole or cut to `truncate` bytes. Compiled once per variant."""

    name = "ebpf-sessions"
    colour, marker = "#000000", "*"
    testbeds = (3,)
    TARGETS = ("local", "vxlan", "erspan")

    def __init__(self, *a, rules=1, target="local", truncate=0, src="198.18.1.10", **kw):
        super().__init__(*a, **kw)
        if target not in self.TARGETS:
            raise ValueError(f"target {target!r}: one of {', '.join(self.TARGETS)}")
        self.rules, self.target, self.truncate = rules, target, truncate
        url = {
            "local": self.monitor_iface,
            "vxlan": f"vxlan://{COLLECTOR_V4}/100",
            "erspan": f"erspan://{COLLECTOR_V4}/1",
        }[target]
        self.tap = SessionMirror([Session(target=url, truncate=truncate, rules=bench_rules(rules, src))], netns=self.ns)
        self.tap.load_program()
        self._filters = []

    def attach(self):
        self._filters = self.tap.attach(self.tap_iface, "ingress")
        self.attached = True

    def detach(self):
        for f in self._filters:
            self.tap.detach_tc(f)
        self._filters = []
        self.attached = False

    def counters(self) -> dict:
        s = next(iter(self.tap.session_counters().values()))
        return {
            "mirrored": s["sent"],
            "mirrored_bytes": s["sent_bytes"],
            "seen": self.tap.counters()["seen"],
            "matched": s["accepted"],
            "cloned": s["sent"],
            "failed": s["failed"] + s["oversize"],
        }

    def program_fds(self) -> dict:
        """{tap, sender: fd}: for the kernel's run-time statistics."""
        return {"tap": self.tap.load("tap_ingress", "SCHED_CLS").fd, "sender": self.tap.load("sender", "SCHED_CLS").fd}


PEERS = {
    m.name: m
    for m in (NoMirror, EbpfMirror, EbpfHelperMirror, EbpfXdpMirror, EbpfSessionsMirror, TcMirred, NftDup, OvsMirror)
}
MIRRORS = PEERS
