"""What `hosts check` says of each host: problems (the bench cannot run, one line
each with its fix) and advice (it runs, but a fair measurement wants otherwise).

Judged from lab_facts (lab/hosts/library/lab_facts.py), which a host reports
without changing anything. Nothing starts on any host while any problem stands.
"""

from dataclasses import dataclass, field

from .inventory import ROLE_IFACES, ROLES, Host

OS_ID, OS_VERSION = "debian", "12"  # what the README's set-up is written for
MIN_KERNEL = (6, 1)  # the lab's programs: bpf_redirect_neigh, BTF spin locks, xdp_features (6.3 says native XDP)
# per bench and role: what each interface must do (an xdp_features name), why, and
# whether generic XDP will do where the driver has no native XDP
NEEDS_XDP = {
    "vtap-throughput": {
        # the tap's receiving side is the DUT: its sink native (which also gives it
        # threaded NAPI), or its figures are not the driver's. The receiver and the monitor
        # only count: on a device without native XDP (a VXLAN or GRE tunnel, a bond, a
        # Wi-Fi card) their sink runs as generic XDP, which counts every frame as well
        "tap": ("basic", "the tap's counting sink is a native XDP program", False),
        "receiver": ("basic", "the receiver's counting sink is a native XDP program", True),
        "monitor": ("basic", "the monitor's counting sink is a native XDP program", True),
    },
    "pods": {},
}


def sink_mode(iface_facts) -> str:
    """The XDP mode a counting sink takes on an interface (its lab_facts): native where
    its driver says it runs XDP (or says nothing: a kernel before 6.3), else generic."""
    if not iface_facts.get("xdp_features_known") or "basic" in iface_facts.get("xdp_features", []):
        return "native"
    return "generic"


@dataclass
class Verdict:
    host: str
    roles: list
    problems: list = field(default_factory=list)
    advice: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _kernel(release) -> tuple:
    parts = release.split("-")[0].split(".")
    try:
        return tuple(int(p) for p in parts[:2])
    except ValueError:
        return (0, 0)


def judge(host: Host, facts: dict, ifaces: dict, tree: str, bench=None, generator="xdp", inventory="FILE") -> Verdict:
    """`ifaces`: {"ROLE" or "ROLE:purpose": iface} (Inventory.ifaces_of); `tree`: the controller's."""
    roles = sorted({k.split(":")[0] for k in ifaces} | set(host.groups) & set(ROLES[bench] if bench else ROLE_IFACES))
    v = Verdict(host.name, roles)
    p, a = v.problems, v.advice
    if facts.get("uid") != 0:
        p.append(
            f"not root (uid {facts.get('uid')}): the lab attaches BPF programs and changes interfaces; "
            "fix: ansible_user: root, or ansible_become: true with a sudo rule for that user"
        )
    osr = facts.get("os", {})
    if (osr.get("id"), osr.get("version_id")) != (OS_ID, OS_VERSION):
        p.append(
            f"operating system {osr.get('pretty') or osr.get('id')!s}: the lab's set-up is written for Debian 12 "
            "(its package names, bookworm-backports); fix: a Debian 12 host"
        )
    if _kernel(facts.get("kernel", "")) < MIN_KERNEL:
        p.append(
            f"kernel {facts.get('kernel')}: the lab needs {MIN_KERNEL[0]}.{MIN_KERNEL[1]} or later; fix: "
            "Debian 12's linux-image-amd64 from bookworm-backports"
        )
    if not facts.get("btf"):
        p.append(
            "no BTF (/sys/kernel/btf/vmlinux): the kernel was built without CONFIG_DEBUG_INFO_BTF; fix: "
            "Debian's own kernel (linux-image-amd64)"
        )
    if facts.get("bpf_jit") == 0:
        p.append(
            "the BPF JIT is off: every program would be interpreted, and measured so; "
            "fix: sysctl -w net.core.bpf_jit_enable=1"
        )
    if bench == "pods" and not facts.get("cgroup2"):
        p.append(
            "no cgroup v2 hierarchy mounted: the eBPF datapath's socket programs (services at connect()) "
            "attach there; fix: mount -t cgroup2 none /sys/fs/cgroup (systemd mounts it at boot)"
        )
    lab = facts.get("lab", {})
    setup = f"python -m lab hosts setup -i {inventory}"
    if not lab.get("present"):
        p.append(f"the lab is not in {lab.get('dir')}: fix: {setup}")
    elif lab.get("commit") != tree:
        p.append(
            f"the lab in {lab.get('dir')} is another tree ({(lab.get('commit') or 'none')[:12]}, here "
            f"{tree[:12]}): results would not be this checkout's; fix: {setup}"
        )
    elif lab.get("setup") != tree or not lab.get("python"):
        p.append(f"the lab in {lab.get('dir')} is not set up (scripts/setup.sh has not finished there); fix: {setup}")
    held = lab.get("held_by")
    if held:
        p.append(
            f"in use by bench {held.get('bench')} (from {held.get('controller')}, pid {held.get('pid')}, since "
            f"{held.get('since')}); fix: wait for it to end, or `python -m lab hosts cleanup -i {inventory}` if it "
            "is gone"
        )
    mgmt = set(facts.get("management", {}).get("ifaces", []))
    uses = {}  # iface -> the roles (and purposes) it serves here: one line per interface
    for key, name in sorted(ifaces.items()):
        uses.setdefault(name, []).append(key)
    for name, keys in uses.items():
        i = facts.get("ifaces", {}).get(name, {})
        what = f"{name} ({', '.join(keys)})"
        if not i.get("present"):
            p.append(f"interface {what} is missing; fix: the host's interface name in lab_iface (ip -br link there)")
            continue
        if name in mgmt:
            p.append(
                f"interface {what} holds the address Ansible reaches this host on "
                f"({', '.join(facts['management']['addresses'])}): a bench would cut the lab off its own host; "
                "fix: name a test interface that is not the management one"
            )
            continue
        if not i.get("up"):  # not a problem: prepare brings it up (recorded first) and cleanup down again
            a.append(f"interface {what} is down: a bench brings it up for its runs and down again after")
        elif i.get("operstate") == "down":  # up, and no carrier: nothing would arrive
            p.append(
                f"interface {what} is up but has no link (no carrier); fix: its cable or the far end's interface "
                f"(ip link show {name} on {host.name}, and on the host it is cabled to)"
            )
        roles_here = {k for k in keys if ":" not in k}
        driver = i.get("ethtool", {}).get("driver")
        needs = {NEEDS_XDP.get(bench or "", {}).get(r) for r in roles_here} - {None}
        for need in sorted(needs):
            if i.get("xdp_features_known") and need[0] not in i.get("xdp_features", []):
                if all(n[2] for n in needs):  # a counting side only: generic XDP counts as well
                    a.append(
                        f"interface {what}: its driver ({driver}) has no native XDP: the counting sink runs "
                        "there as generic XDP (after the kernel has made each frame's skb), which counts every "
                        "frame and takes that host more CPU per frame"
                    )
                    break
                p.append(
                    f"interface {what}: its driver ({driver}) has no native XDP, and {need[1]}; "
                    "fix: a NIC whose driver runs XDP natively"
                )
        # a veth takes redirected frames once its peer runs XDP (its NAPI on), which the
        # lab's counting sink there does: its xdp_features say ndo-xmit only from then on
        if bench == "vtap-throughput" and "sender" in roles_here and generator == "xdp" and driver != "veth":
            if i.get("xdp_features_known") and "ndo-xmit" not in i.get("xdp_features", []):
                p.append(
                    f"interface {what}: its driver ({driver}) takes no redirected XDP frames (ndo_xdp_xmit), "
                    "which the XDP generator sends; fix: --generator trafgen"
                )
        if i.get("managed_by"):
            a.append(
                f"interface {what} is managed by {i['managed_by']}, which may change it during a run; "
                f"better: leave it unmanaged there"
            )
        if i.get("firewall"):
            a.append(f"interface {what} has nftables rules of its own: every frame pays for them")
        if i.get("pause", {}).get("rx") or i.get("pause", {}).get("tx"):
            a.append(
                f"interface {what}: pause frames are on, which can hide loss as back-pressure; "
                f"better: ethtool -A {name} rx off tx off"
            )
    if facts.get("irqbalance"):
        a.append("irqbalance runs: it may move the DUT's interrupts during a run; better: stop it for the bench")
    if facts.get("governor") not in (None, "performance"):
        a.append(f"CPU frequency governor {facts['governor']}: rates vary with the clock; better: performance")
    clock = facts.get("clock", {})
    if clock.get("synchronized") is False:
        a.append("the clock is not synchronised (rates are per host and need none, but logs compare times)")
    return v
