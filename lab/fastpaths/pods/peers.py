"""Ways to connect pods on the two-node testbed (lab.fastpaths.pods.testbed), behind
lab.peer.Peer, each built on the testbed the bench hands it:

    host          node to node, no pods between: the limit
    legacy        the kernel routes the pods' traffic (the testbed's routes, forwarding
                  on): Cilium's "legacy host routing"; services by nftables DNAT as
                  kube-proxy's nftables mode writes them
    bridge-vxlan  pods on a Linux bridge (cni0), a kernel VXLAN device (flannel.1)
                  between the nodes: flannel's shape (needs pods_testbed(tunnel=True),
                  whose pods' MTU leaves room for VXLAN's 50 bytes)
    ebpf          ebpf.TcPods, native routing: into a pod by its veth's peer, to another
                  node's pods by the FIB; services at connect() (a client in the
                  testbed's cgroup) or per packet (any other)
    ebpf-redirect ebpf with bpf_redirect() into a pod instead of bpf_redirect_peer():
                  the baseline of the commit that added the peer redirect
    ebpf-vxlan    ebpf.TcPods, tunnel mode: to another node's pods through the
                  testbed's collect-metadata VXLAN device (pods_testbed(tunnel=True))
    iptables-legacy, iptables-nft
                  legacy's routing, services by kube-proxy's iptables mode on Debian's
                  iptables, x_tables or its nftables backend (lab.fastpaths.pods.kubeproxy)

Services: set_services([(address, port, protocol, [backend "ADDR:PORT", ...]), ...])
on legacy and the ebpf peers, on every node (kube-proxy and Cilium run on each).
"""

import ipaddress

from ebpf.pods.tc_pods import TcPods, parse_endpoint
from lab import netns, nft
from lab.fastpaths.pods import kubeproxy
from lab.fastpaths.pods.testbed import GATEWAY4, GATEWAY6, NFT_TABLE
from lab.netns import LabError
from lab.peer import Peer

FLANNEL_PORT = 8472


def vtep_mac(tb, node) -> str:
    """A node's flannel device's MAC: each node knows every other's without asking (as
    flannel reads it from the node's annotation), on a host as in namespaces."""
    return f"02:76:74:6c:01:{tb.nodes.index(node) + 1:02x}"


class PodPeer(Peer):
    name = "legacy"
    kind = "pods"
    colour = "#E69F00"
    serves = False  # has services (set_services)

    def __init__(self, tb, mode=None):
        super().__init__(mode)
        self.tb = tb
        # a lab.cgroups.MemoryCgroup that set_services' tools run in, for the kernel memory
        # their rules hold (bench pods); the eBPF ways' maps are counted by memlock instead
        self.charge = None

    def _joiner(self):
        return self.charge.joiner() if self.charge is not None else None

    def client_kw(self, way) -> dict:
        """subprocess keywords for a client of a service (`connect`: in the cgroup)."""
        return self.tb.in_cgroup() if way == "connect" else {}


class Host(PodPeer):
    name = "host"
    colour = "#555555"  # the limit: no pods at all


class Legacy(PodPeer):
    """Nothing to attach: the testbed's routes are how the kernel carries pod traffic.
    Services: kube-proxy's nftables mode, one table per family on every node:

        table ip kube-proxy {
          map service-ips { type ipv4_addr . inet_proto . inet_service : verdict }
          chain nat-prerouting { type nat hook prerouting priority dstnat (-100); jump services }
          chain nat-output     { type nat hook output priority dstnat (-100); jump services }
          chain services { ip daddr . meta l4proto . th dport vmap @service-ips }
          chain service-N  { numgen random mod B vmap { 0 : goto endpoint-N-0, ... } }
          chain endpoint-N-I { ip saddr BACKEND jump mark-for-masquerade
                               meta l4proto tcp dnat to BACKEND:PORT }
          chain mark-for-masquerade { meta mark set meta mark | 0x4000 }
          chain nat-postrouting { type nat hook postrouting priority srcnat;
                                  meta mark & 0x4000 == 0x4000 masquerade fully-random }
        }
    (a pod that is its own service's backend, hairpin, is masqueraded as kube-proxy does)."""

    serves = True

    def set_services(self, services):
        self.remove_services()
        self.services = [s for s in services if _family(s[0]) == "ip"]  # (add_service: IPv4)
        self._ids = list(range(len(self.services)))  # each one's chain number (ruleset: in order)
        for node in self.tb.local_nodes:
            for family in ("ip", "ip6"):
                text = ruleset(family, [s for s in services if _family(s[0]) == family], self.tb.nft_table)
                if text:
                    nft.run_text(self.tb.ns(node), text, preexec=self._joiner())

    def add_service(self, service):
        """One more service as kube-proxy's nftables mode adds it: its chains and its element
        of the service-ips map, in one transaction (nothing else rewritten)."""
        family = _family(service[0])
        n = max(self._ids, default=-1) + 1
        self.services.append(service)
        self._ids.append(n)
        chains, element = _service_chains(family, n, service)
        table = self.tb.nft_table
        text = "\n".join([f"table {family} {table} {{", *(f"  {c}" for c in chains), "}"])
        text += f"\nadd element {family} {table} service-ips {{ {element} }}\n"
        for node in self.tb.local_nodes:
            nft.run_text(self.tb.ns(node), text)

    def remove_service(self, service):
        """A service gone as kube-proxy's nftables mode removes it: its element, then its
        chains, in one transaction."""
        i = self.services.index(service)
        family, n = _family(service[0]), self._ids[i]
        chains, element = _service_chains(family, n, service)
        table = self.tb.nft_table
        text = f"delete element {family} {table} service-ips {{ {element.rsplit(' : ', 1)[0]} }}\n"
        text += "".join(f"delete chain {family} {table} {c.split()[1]}\n" for c in reversed(chains))
        for node in self.tb.local_nodes:
            nft.run_text(self.tb.ns(node), text)
        del self.services[i], self._ids[i]

    def remove_services(self):
        for node in self.tb.local_nodes:
            for family in ("ip", "ip6"):
                nft.delete_table(self.tb.ns(node), family, self.tb.nft_table)

    def detach(self):
        self.remove_services()
        super().detach()


class KubeProxyIptables(PodPeer):
    """Legacy's routing, services by kube-proxy's iptables mode (lab.fastpaths.pods.kubeproxy),
    loaded as kube-proxy loads them (iptables-restore --noflush, and the jumps from the
    built-in chains one by one) with Debian's iptables on one backend: `legacy` (x_tables,
    a linear walk of KUBE-SERVICES) or `nft` (the same rules as nftables expressions, one
    rule at a time too). IPv4 services only; on this machine's namespaces only (a user's
    host keeps its nat table)."""

    backend = "legacy"
    serves = True

    def _ipt(self, tool=""):
        return f"iptables-{self.backend}{tool}"

    def set_services(self, services):
        if self.tb.local is not None:  # a user's host: its nat table is its own
            raise LabError(f"{self.name}: kube-proxy's iptables rules are written on this machine's namespaces only")
        self.remove_services()
        self.services = [s for s in services if _family(s[0]) == "ip"]
        self.named = kubeproxy.named(self.services)  # names fixed once given: a removal renames no other
        self._restore(kubeproxy.restore_text(self.named, self.tb.cluster_cidr4), preexec=self._joiner())
        for node in self.tb.local_nodes:
            for chain, rule in kubeproxy.JUMPS:  # (legacy: each writes the whole table anew, so charged alike)
                argv = [self._ipt(), "-t", "nat", "-I", chain, *rule]
                netns.run(self.tb.ns(node), argv, capture_output=True, preexec_fn=self._joiner())
        self.loaded = True

    def _restore(self, text, preexec=None):
        for node in self.tb.local_nodes:
            argv = [self._ipt("-restore"), "--noflush"]
            kw = dict(input=text, capture_output=True, text=True, check=False, timeout=900, preexec_fn=preexec)
            r = netns.run(self.tb.ns(node), argv, **kw)
            if r.returncode:
                raise LabError(f"{argv[0]} on {node}: {(r.stderr.strip().splitlines() or ['failed'])[-1]}")

    def add_service(self, service):
        """One more service, as kube-proxy's partial sync writes it (KUBE-SERVICES whole)."""
        n = 1 + max((int(x[0].split("/")[0][2:]) for x in self.named), default=-1)
        self.services.append(service)
        self.named.append(kubeproxy.named([service], first=n)[0])
        self._restore(kubeproxy.add_text(self.named, self.tb.cluster_cidr4))

    def remove_service(self, service):
        """A service gone, as kube-proxy's partial sync writes it: KUBE-SERVICES whole
        without it, its chains flushed and deleted."""
        i = self.services.index(service)
        gone = self.named[i]
        del self.services[i], self.named[i]
        self._restore(kubeproxy.remove_text(self.named, gone, self.tb.cluster_cidr4))

    def remove_services(self):
        if not getattr(self, "loaded", False):
            return
        for node in self.tb.local_nodes:
            ns = self.tb.ns(node)
            for chain, rule in kubeproxy.JUMPS:
                netns.run(ns, [self._ipt(), "-t", "nat", "-D", chain, *rule], capture_output=True, check=False)
            saved = netns.run(ns, [self._ipt("-save"), "-t", "nat"], capture_output=True, text=True, check=False).stdout
            ours = [ln[1:].split()[0] for ln in saved.splitlines() if ln.startswith(":KUBE-")]
            if ours:
                argv = [self._ipt("-restore"), "--noflush"]
                text = kubeproxy.teardown_text(ours)
                netns.run(ns, argv, input=text, capture_output=True, text=True, check=False, timeout=900)
        self.loaded = False

    def detach(self):
        self.remove_services()
        super().detach()


class KubeProxyIptablesLegacy(KubeProxyIptables):
    name = "iptables-legacy"
    colour = "#CC6677"


class KubeProxyIptablesNft(KubeProxyIptables):
    name = "iptables-nft"
    colour = "#882255"
    backend = "nft"


def _family(addr) -> str:
    return "ip6" if ipaddress.ip_address(addr).version == 6 else "ip"


def ruleset(family, services, table=NFT_TABLE) -> str:
    """kube-proxy's nftables-mode table for `services` of one family (see Legacy); on a
    user's host under a name of the lab's (tb.nft_table)."""
    if not services:
        return ""
    addr_type = "ipv6_addr" if family == "ip6" else "ipv4_addr"
    t = [f"table {family} {table} {{"]
    t.append(f"  map service-ips {{ type {addr_type} . inet_proto . inet_service : verdict ; }}")
    t.append("  chain mark-for-masquerade { meta mark set meta mark | 0x4000 ; }")
    t.append("  chain nat-prerouting { type nat hook prerouting priority -100 ; policy accept ; jump services ; }")
    t.append("  chain nat-output { type nat hook output priority -100 ; policy accept ; jump services ; }")
    t.append(
        "  chain nat-postrouting { type nat hook postrouting priority 100 ; policy accept ; "
        "meta mark & 0x4000 == 0x4000 masquerade fully-random ; }"
    )
    t.append(f"  chain services {{ {family} daddr . meta l4proto . th dport vmap @service-ips ; }}")
    elements = []
    for n, service in enumerate(services):
        chains, element = _service_chains(family, n, service)
        t += [f"  {c}" for c in chains]
        elements.append(element)
    t.append("}")
    if elements:
        t.append(f"add element {family} {table} service-ips {{ {', '.join(elements)} }}")
    return "\n".join(t) + "\n"


def _service_chains(family, n, service) -> tuple[list, str]:
    """The chains of the n-th service in kube-proxy's nftables shape, and its element of
    the service-ips map."""
    addr, port, proto, backends = service
    ends = [parse_endpoint(b) for b in backends]
    chains = []
    for i, (a, bport) in enumerate(ends):
        to = f"[{a}]:{bport}" if a.version == 6 else f"{a}:{bport}"
        chains.append(
            f"chain endpoint-{n}-{i} {{ {family} saddr {a} jump mark-for-masquerade ; "
            f"meta l4proto {proto} dnat to {to} ; }}"
        )
    if ends:
        picks = ", ".join(f"{i} : goto endpoint-{n}-{i}" for i in range(len(ends)))
        chains.append(f"chain service-{n} {{ numgen random mod {len(ends)} vmap {{ {picks} }} ; }}")
    else:  # no endpoints: kube-proxy rejects (its no-endpoint-services map)
        chains.append(f"chain service-{n} {{ reject ; }}")
    return chains, f"{addr} . {proto} . {port} : goto service-{n}"


class BridgeVxlan(PodPeer):
    """flannel's vxlan backend on the testbed: each node's pods on a bridge (cni0) that
    holds the gateway addresses, a VXLAN device (flannel.1, VNI 1, port 8472, no
    learning) whose neighbour and FDB entries name the other nodes, and a route to each
    other node's pod prefix through it. Undone on detach: the testbed's routed veths.
    On a user's host, that node's side only, with devices named as no CNI names its
    own (tb.bridge_dev, tb.flannel_dev)."""

    name = "bridge-vxlan"
    colour = "#CC79A7"

    def attach(self):
        tb = self.tb
        if not tb.tunnel:
            raise LabError("bridge-vxlan needs room for VXLAN's headers: pods_testbed(tunnel=True)")
        self.attached = True  # so that a failure half-way is undone by detach()
        bridge, vxlan = tb.bridge_dev, tb.flannel_dev
        try:
            for node in tb.local_nodes:
                r = tb.topo.run
                r(node, ["ip", "link", "add", bridge, "type", "bridge"])
                r(node, ["ip", "link", "set", bridge, "up"])
                r(node, ["ip", "addr", "add", f"{GATEWAY4}/32", "dev", bridge])
                r(node, ["ip", "addr", "add", f"{GATEWAY6}/64", "dev", bridge, "nodad"])
                for pod in tb.pods[node]:
                    lxc = tb.lxc[pod]
                    r(node, ["ip", "addr", "flush", "dev", lxc])
                    r(node, ["ip", "link", "set", lxc, "master", bridge])
                    r(node, ["ip", "route", "replace", f"{tb.pod4(pod)}/32", "dev", bridge])
                    r(node, ["ip", "-6", "route", "replace", f"{tb.pod6(pod)}/128", "dev", bridge])
                    r(pod, ["ip", "neigh", "flush", "dev", "eth0"])
                    # flannel's pods share their node's subnet on the bridge: to each other at
                    # layer 2, not through the node (which would send them ICMP redirects)
                    r(pod, ["ip", "route", "add", tb.prefix4(node), "dev", "eth0"])
                    r(pod, ["ip", "-6", "route", "add", tb.prefix6(node), "dev", "eth0"])
                r(
                    node,
                    ["ip", "link", "add", vxlan, "address", vtep_mac(tb, node), "type", "vxlan", "id", "1"]
                    + ["local", tb.underlay4(node), "dstport", str(FLANNEL_PORT), "nolearning"],
                )
                r(node, ["ip", "link", "set", vxlan, "up"])
                if tb.topo.hosts[node].own:  # a user's host: IPv4 forwarding is per ingress device
                    for dev in (bridge, vxlan):
                        netns.sysctl(None, f"net.ipv4.conf.{dev}.forwarding", 1)
                for other in tb.nodes:
                    if other == node:
                        continue
                    # flannel: the other node's .0 as the gateway on flannel.1, its MAC known,
                    # and where that MAC lives in the underlay
                    mac = vtep_mac(tb, other)
                    gw4 = tb.prefix4(other).split("/")[0]
                    gw6 = f"fe80::1:{tb.nodes.index(other) + 1:x}"  # IPv6: a link-local next hop
                    r(node, ["ip", "neigh", "replace", gw4, "lladdr", mac, "dev", vxlan, "nud", "permanent"])
                    r(node, ["ip", "neigh", "replace", gw6, "lladdr", mac, "dev", vxlan, "nud", "permanent"])
                    r(node, ["bridge", "fdb", "append", mac, "dev", vxlan, "dst", tb.underlay4(other)])
                    r(node, ["ip", "route", "replace", tb.prefix4(other), "via", gw4, "dev", vxlan, "onlink"])
                    r(
                        node,
                        ["ip", "-6", "route", "replace", tb.prefix6(other), "via", gw6, "dev", vxlan, "onlink"],
                    )
        except BaseException:
            self.detach()
            raise

    def detach(self):
        tb = self.tb
        for node in tb.local_nodes:
            r = tb.topo.run
            for pod in tb.pods[node]:
                r(pod, ["ip", "route", "del", tb.prefix4(node), "dev", "eth0"], check=False, capture_output=True)
                r(pod, ["ip", "-6", "route", "del", tb.prefix6(node), "dev", "eth0"], check=False, capture_output=True)
            r(node, ["ip", "link", "del", tb.flannel_dev], check=False, capture_output=True)
            r(node, ["ip", "link", "del", tb.bridge_dev], check=False, capture_output=True)  # its routes go with it
            tb.route_pods(node)  # the testbed's routed veths back, and the routes to the other node
        super().detach()


class Ebpf(PodPeer):
    name = "ebpf"
    colour = "#0072B2"
    tunnel = False
    redirect = "peer"
    serves = True

    def attach(self):
        self.progs = {}
        try:
            for node in self.tb.local_nodes:  # (on a user's host: its own)
                self.progs[node] = self._datapath(node)
        except BaseException:
            self.detach()
            raise
        self.attached = True

    def _datapath(self, node):
        tb = self.tb
        kw = dict(mode="tunnel", tunnel=tb.tunnel_dev, vni=1) if self.tunnel else {}
        p = TcPods(netns=tb.ns(node), redirect=self.redirect, **kw)
        for pod in tb.pods[node]:
            p.add_pod(tb.lxc[pod], [tb.pod4(pod), tb.pod6(pod)], mac=tb.topo.mac(pod, "eth0"))
        for other in tb.nodes:
            if other != node:
                for prefix in (tb.prefix4(other), tb.prefix6(other)):
                    p.add_remote(prefix, tb.underlay4(other) if self.tunnel else None)
        p.load_program()
        for pod in tb.pods[node]:
            p.attach_pod(tb.lxc[pod])
        p.attach_node(tb.underlay_of(node))
        if self.tunnel:
            p.attach_node(tb.tunnel_dev)
        p.attach_services(tb.cgroup.path)
        return p

    def set_services(self, services):
        for p in self.progs.values():
            for s in list(p.services):
                p.remove_service(*s)
            for s in services:
                p.add_service(*s)

    def add_service(self, service):
        """One more service: its map entries through the API, on every node."""
        for p in self.progs.values():
            p.add_service(*service)

    def remove_service(self, service):
        for p in self.progs.values():
            p.remove_service(*service[:3])

    def counters(self):
        out = {}
        for p in getattr(self, "progs", {}).values():
            for k, v in {**p.counters(), **p.service_counters()}.items():
                out[k] = out.get(k, 0) + v
        return out

    def detach(self):
        for p in getattr(self, "progs", {}).values():
            p.close()
        self.progs = {}
        self.attached = False


class EbpfRedirect(Ebpf):
    name = "ebpf-redirect"
    colour = "#009E73"
    redirect = "plain"


class EbpfVxlan(Ebpf):
    name = "ebpf-vxlan"
    colour = "#56B4E9"
    tunnel = True

    def attach(self):
        if not self.tb.tunnel:
            raise LabError(
                "ebpf-vxlan runs on a testbed with a VXLAN device and room for its headers: pods_testbed(tunnel=True)"
            )
        super().attach()


PEERS = {
    cls.name: cls
    for cls in (Host, Legacy, KubeProxyIptablesLegacy, KubeProxyIptablesNft, BridgeVxlan, Ebpf, EbpfRedirect, EbpfVxlan)
}
