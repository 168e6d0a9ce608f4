"""The pods bench's role on a host (lab.hosts.runner runs one per node per run): the
node's side of the pods testbed, built as a namespace run builds both (pods_testbed,
local=that node: its pods in namespaces of the run, their veths in the host, the
underlay the inventory's lab_iface), the peer's per-node step (PEERS[...].attach on
that node only: the eBPF datapath, or the kernel's routes), the run's server where
the run puts it, and the client on the node that drives the run.

    node    builds, attaches, starts its server (if any), says ready; the driving node
            waits for go and runs the client (iperf3 or rr), the others wait for stop;
            then detaches and tears its side down

Each returns its host's CPU over its own window: the driving node's over its client's
run, the others' from the first to the last tenth of a second in which the node's
lab interfaces moved more than ACTIVE packets (a node with nothing to do in the run,
the other node of a same-node run, has no window). On namespaces as hosts every node
shares the machine's cores, so each node's CPU is the machine's.
"""

import contextlib
import threading
import time

from lab import netns
from lab.counters import iface_counters
from lab.metrics import CpuSampler, host_cpu, read_proc_stat
from lab.traffic.iperf import Iperf3, IperfServer
from lab.traffic.rr import RrServer, request_response

from .bench import IPERF_PORT, RR_PORT, SERVICE_BACKENDS, VIP, cpu_of, latency, services
from .peers import PEERS
from .testbed import HOST_DEVICES, HOST_NFT_TABLE, pods_testbed

ACTIVE = 20  # packets per sample (0.1 s) on the node's lab interfaces: the run, not ARP or LLDP


class ActivitySampler:
    """/proc/stat and the packets of some interfaces every `interval` s, in a thread:
    the CPU over the samples in which those interfaces moved (a serving node's window)."""

    def __init__(self, ifaces, interval=0.1):
        self.ifaces, self.interval = list(ifaces), interval
        self.readings, self.packets = [], []
        self._stop = threading.Event()
        self._thread = None

    def _read(self):
        total = 0
        for name in self.ifaces:
            c = iface_counters(None, name)
            total += c["rx_packets"] + c["tx_packets"]
        self.readings.append((time.monotonic(), read_proc_stat()))
        self.packets.append(total)

    def _loop(self):
        while not self._stop.wait(self.interval):
            self._read()

    def __enter__(self):
        self._read()
        self._thread = threading.Thread(target=self._loop, name="activity-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._read()
        return False

    def window(self):
        """(CpuSampler over the active samples, seconds) or (None, None) when nothing moved."""
        moved = [i for i in range(1, len(self.packets)) if self.packets[i] - self.packets[i - 1] > ACTIVE]
        if not moved:
            return None, None
        first, last = moved[0] - 1, moved[-1]
        readings = self.readings[first : last + 1]
        return CpuSampler.of(readings), readings[-1][0] - readings[0][0]


def _server(tb, spec):
    """The run's server, where this node holds it (None elsewhere); services: the
    service's backend on this node (p01 on the first, p10 on the second)."""
    me, exp, peer = spec["node"], spec["experiment"], spec["peer"]
    if exp == "services":
        mine = [b for b in SERVICE_BACKENDS if tb.node_of(b) == me]
        return RrServer(tb.ns(mine[0]), RR_PORT) if mine else None
    target = spec.get("server")  # "n1" (node to node), or a pod's name
    if target is None or (target if target in tb.nodes else tb.node_of(target)) != me:
        return None
    if exp == "stream":
        fam = spec["family"]
        if peer == "host":
            addr = tb.underlay4(me) if fam == 4 else tb.underlay6(me)
            return IperfServer(None, addr, IPERF_PORT)
        addr = tb.pod4(target) if fam == 4 else tb.pod6(target)
        return IperfServer(tb.ns(target), addr, IPERF_PORT)
    if peer == "host":
        return RrServer(None, RR_PORT + 1)
    return RrServer(tb.ns(target), RR_PORT)


def _client(tb, spec, seconds, peer_obj) -> dict:
    exp, peer, fam = spec["experiment"], spec["peer"], spec["family"]
    target = spec["server"]
    if exp == "services":  # a new connection per transaction, to the service (a node's translation)
        with CpuSampler(0.1) as cpu:
            r = request_response(tb.ns(spec["client"]), VIP, 80, seconds, mode="crr", **peer_obj.client_kw(spec["way"]))
        return latency(r), cpu
    if exp == "stream":
        if peer == "host":
            ns, ifname = None, tb.underlay_of(spec["node"])
            addr = tb.underlay4(target) if fam == 4 else tb.underlay6(target)
        else:
            ns, ifname = tb.ns(spec["client"]), "eth0"
            addr = tb.pod4(target) if fam == 4 else tb.pod6(target)
        with Iperf3(ns, ifname, None, addr, port=IPERF_PORT, parallel=spec["parallel"], serve=False) as gen:
            with CpuSampler(0.1) as cpu:
                rep = gen.send(seconds=seconds)
        secs = rep.extra.get("received_seconds") or rep.seconds
        gbps = rep.extra["received_bytes"] * 8 / secs / 1e9
        return {
            "gbps": round(gbps, 3),
            "retransmits": rep.extra.get("retransmits"),
            "received_bytes": rep.extra["received_bytes"],
            "received_seconds": secs,
        }, cpu
    if peer == "host":
        with CpuSampler(0.1) as cpu:
            r = request_response(None, tb.underlay4(target), RR_PORT + 1, seconds)
    else:
        with CpuSampler(0.1) as cpu:
            r = request_response(tb.ns(spec["client"]), tb.pod4(target), RR_PORT, seconds)
    return latency(r), cpu


def node(spec, signals):
    from lab.hosts import local  # noqa: PLC0415 -- the host's record of what the lab made there

    me = spec["node"]
    for dev in HOST_DEVICES:  # recorded before they exist: a host's cleanup deletes them if this runner dies
        local.made(dev)
    tables = [local.made_table(f, HOST_NFT_TABLE) for f in ("ip", "ip6")] if spec["peer"] == "legacy" else []
    try:
        return _node(spec, signals, me)
    finally:  # deleted with the node's side: their records go (one still there stays, for the cleanup)
        for dev in HOST_DEVICES:
            if netns.run(None, ["ip", "link", "show", dev], check=False, capture_output=True).returncode:
                local.unmade(dev)
        for key in tables:
            family, table = key.split()[1:]
            if netns.run(None, ["nft", "list", "table", family, table], check=False, capture_output=True).returncode:
                local.unmade(key)


def _node(spec, signals, me):
    tb = pods_testbed(
        tunnel=True,
        nodes=len(spec["underlay"]),
        local=me,
        underlay={n: tuple(a) for n, a in spec["underlay"].items()},
        underlay_dev=spec["iface"],
    )
    with tb, contextlib.ExitStack() as held:
        peer = PEERS[spec["peer"]](tb)
        peer.attach()
        held.callback(peer.detach)
        if spec["experiment"] == "services":  # on every node, as kube-proxy and Cilium keep them
            peer.set_services(services(tb, spec["services"]))
        server = _server(tb, spec)
        if server is not None:
            held.enter_context(server)
        ifaces = [tb.underlay_of(me), *(tb.lxc[p] for p in tb.pods[me])]
        out = {"node": me, "report": None}
        if spec.get("driver"):
            signals.ready()
            if not signals.wait("go"):
                return out
            # bounded twice: by the run's seconds, and by what is left of the runner's deadline
            seconds = min(float(spec["duration"]), max(0.1, signals.seconds_left() - 5))
            out["report"], cpu = _client(tb, spec, seconds, peer)
            out["window_s"] = round(cpu.seconds, 3)
        else:
            with ActivitySampler(ifaces) as activity:
                signals.ready()
                signals.wait("stop")
            cpu, window = activity.window()
            out["window_s"] = round(window, 3) if window else None
        if cpu is not None:
            out["cpu"] = cpu_of(cpu)
            out["host_cpu"] = host_cpu(cpu)
        out["datapath"] = peer.counters()  # the eBPF datapath's counters on this node (the kernel's: none)
        return out


ROLES = {"node": node}
