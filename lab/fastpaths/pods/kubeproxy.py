"""kube-proxy's iptables mode, as kube-proxy writes it (pkg/proxy/iptables/proxier.go),
for the services of bench pods: the rules a node loads with `iptables-restore
--noflush`, on Debian's iptables with either backend (iptables-legacy-restore, the
kernel's x_tables; iptables-nft-restore, the same rules as nftables expressions).

    *nat
    :KUBE-SERVICES - [0:0]              one rule per service port: its cluster IP, protocol
    :KUBE-SVC-<hash> - [0:0]            and port -> its KUBE-SVC chain (walked in order:
    :KUBE-SEP-<hash> - [0:0]            the service kube-proxy writes last is found last)
    -A KUBE-SVC-... -m statistic --mode random --probability 1/n ... -j KUBE-SEP-...
    -A KUBE-SEP-... -s ENDPOINT -j KUBE-MARK-MASQ      (hairpin)
    -A KUBE-SEP-... -m tcp -p tcp -j DNAT --to-destination ENDPOINT

Chain names are kube-proxy's: "KUBE-SVC-" + base32(sha256(service port name +
protocol))[:16], "KUBE-SEP-" + the same of name + protocol + endpoint; a service port
name is "NAMESPACE/NAME:PORTNAME" (here "ns<i>/svc<i>:p<port>"). The tests hold the
text to the expectations of kube-proxy's own proxier_test.go, line for line.
(kube-proxy's filter-table rules, NodePorts, external IPs and session affinity are
left out: bench pods' services are cluster IPs.)"""

import base64
import hashlib
import ipaddress

MASQ_MARK = "0x4000"


def port_proto_hash(text: str) -> str:
    """kube-proxy's portProtoHash: base32 of sha256, its first 16 characters."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]


def svc_chain(name: str, proto: str) -> str:
    return "KUBE-SVC-" + port_proto_hash(name + proto)


def sep_chain(name: str, proto: str, endpoint: str) -> str:
    return "KUBE-SEP-" + port_proto_hash(name + proto + endpoint)


def probability(n: int) -> str:
    """kube-proxy's computeProbability: 1/n to ten decimals."""
    return f"{1.0 / n:0.10f}"


def _quoted(comment: str) -> str:
    """A comment as iptables-save prints it (and kube-proxy writes it): quoted when it has a space."""
    return f'"{comment}"' if " " in comment else comment


NODEPORTS_RULE = (
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule '
    'in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS'
)


def service_rule(name, cluster_ip, port, proto) -> str:
    """A service port's rule in KUBE-SERVICES: its cluster IP, protocol and port -> its KUBE-SVC chain."""
    match = f"-m {proto} -p {proto} -d {cluster_ip} --dport {port}"
    return f"-A KUBE-SERVICES -m comment --comment {_quoted(name + ' cluster IP')} {match} -j {svc_chain(name, proto)}"


def service_rules(name, cluster_ip, port, proto, endpoints, cluster_cidr) -> tuple[list, list]:
    """(chains, rules) of one service port: its KUBE-SERVICES rule, its KUBE-SVC chain (the
    masquerade of traffic from outside the cluster CIDR, then the endpoints by probability)
    and a KUBE-SEP chain per endpoint ("ADDR:PORT"), as kube-proxy writes them."""
    svc = svc_chain(name, proto)
    match = f"-m {proto} -p {proto} -d {cluster_ip} --dport {port}"
    chains = [svc]
    rules = [
        service_rule(name, cluster_ip, port, proto),
        f"-A {svc} -m comment --comment {_quoted(name + ' cluster IP')} {match} ! -s {cluster_cidr} -j KUBE-MARK-MASQ",
    ]
    seps = [sep_chain(name, proto, e) for e in endpoints]
    for i, (e, sep) in enumerate(zip(endpoints, seps, strict=True)):
        left = len(endpoints) - i  # 1/n, then 1/(n-1) of what is left, ..., the last one always
        chance = f" -m statistic --mode random --probability {probability(left)}" if left > 1 else ""
        rules.append(f"-A {svc} -m comment --comment {_quoted(f'{name} -> {e}')}{chance} -j {sep}")
    for e, sep in zip(endpoints, seps, strict=True):
        chains.append(sep)
        addr = e.rsplit(":", 1)[0].strip("[]")
        rules += [
            f"-A {sep} -m comment --comment {_quoted(name)} -s {addr} -j KUBE-MARK-MASQ",
            f"-A {sep} -m comment --comment {_quoted(name)} -m {proto} -p {proto} -j DNAT --to-destination {e}",
        ]
    return chains, rules


# the jumps from the built-in chains, which kube-proxy ensures one by one (iptables -C, then
# -I) rather than in its iptables-restore --noflush input: (chain, the rule's arguments)
JUMPS = (
    ("PREROUTING", ["-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"]),
    ("OUTPUT", ["-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"]),
    ("POSTROUTING", ["-m", "comment", "--comment", "kubernetes postrouting rules", "-j", "KUBE-POSTROUTING"]),
)


def restore_text(services, cluster_cidr) -> str:
    """What kube-proxy hands `iptables-restore --noflush` for `services` [(name, cluster IP,
    port, proto, [endpoint "ADDR:PORT"])] of one family: its nat-table chains (each
    declared, so flushed and written whole) and the masquerade of marked traffic."""
    chains = ["KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"]
    rules = [
        f"-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN",
        f"-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE',
        f"-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}",
    ]
    for name, ip, port, proto, endpoints in services:
        if not endpoints:
            continue  # kube-proxy rejects these in the filter table: not written here
        c, r = service_rules(name, ip, port, proto, endpoints, cluster_cidr)
        chains += c
        rules += r
    rules.append(NODEPORTS_RULE)
    return "\n".join(["*nat", *(f":{c} - [0:0]" for c in chains), *rules, "COMMIT"]) + "\n"


def add_text(services, cluster_cidr) -> str:
    """What kube-proxy's partial sync hands iptables-restore --noflush when the last of
    `services` is new: KUBE-SERVICES written whole (a rule per service, so its cost grows
    with them), and the new service's own chains."""
    name, ip, port, proto, endpoints = services[-1]
    chains, rules = service_rules(name, ip, port, proto, endpoints, cluster_cidr)
    keep = [service_rule(*s[:4]) for s in services if s[4]] + [NODEPORTS_RULE]
    own = [r for r in rules if not r.startswith("-A KUBE-SERVICES ")]
    head = ["*nat", ":KUBE-SERVICES - [0:0]", *(f":{c} - [0:0]" for c in chains)]
    return "\n".join([*head, *keep, *own, "COMMIT"]) + "\n"


def remove_text(services, gone, cluster_cidr) -> str:
    """What kube-proxy's partial sync hands iptables-restore --noflush when `gone` (one of
    its services, as named() gives it) is deleted and `services` remain: KUBE-SERVICES
    written whole without it, and its chains declared (so flushed) and deleted (-X)."""
    name, _, _, proto, endpoints = gone
    stale = [svc_chain(name, proto), *(sep_chain(name, proto, e) for e in endpoints)]
    keep = [service_rule(*s[:4]) for s in services if s[4]] + [NODEPORTS_RULE]
    head = ["*nat", ":KUBE-SERVICES - [0:0]", *(f":{c} - [0:0]" for c in stale)]
    return "\n".join([*head, *keep, *(f"-X {c}" for c in stale), "COMMIT"]) + "\n"


def teardown_text(chains) -> str:
    """One iptables-restore --noflush input that empties and deletes `chains` (the KUBE-
    ones of a nat table): one pass over the table, where an iptables -F and -X per chain
    would each read and write the whole table back (10,000 services: hours)."""
    return "\n".join(["*nat", *(f":{c} - [0:0]" for c in chains), *(f"-X {c}" for c in chains), "COMMIT"]) + "\n"


def named(services, first=0) -> list:
    """bench pods' services [(address, port, proto, backends)] as kube-proxy's: each its
    service port name "ns<i>/svc<i>:p<port>", i from `first` in the order given."""
    return [
        (f"ns{i}/svc{i}:p{port}", str(ipaddress.ip_address(a)), port, proto, list(b))
        for i, (a, port, proto, b) in enumerate(services, start=first)
    ]
