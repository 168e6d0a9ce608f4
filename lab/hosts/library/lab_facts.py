#!/usr/bin/python3
"""lab_facts: an Ansible module that reads, on one host, what `python -m lab hosts
check` judges: the system, the kernel's BPF, the lab in lab_dir, the clock, and
each interface the inventory names. It changes nothing.

It runs before the lab is on the host (that is what `check` finds out), so it
imports only Python's standard library and Ansible's module_utils, and asks the
kernel and the usual tools (ethtool, ip) directly. The parsers are pure functions
of a tool's text, tested with real NICs' output (tests/fixtures/hosts/).

Native XDP is read from the netdev's `xdp_features` (the netdev generic-netlink
family, Linux 6.3+), never by attaching a program: a trial attach resets the link
on some drivers (mlx5, ixgbe), which a host in a rack must not see from a check.
"""

import glob
import json
import os
import re
import shutil
import socket
import struct
import subprocess

# Ansible copies this file alone to the host; its own module_utils come with it.
try:
    from ansible.module_utils.basic import AnsibleModule
except ImportError:  # imported by the lab's tests for its parsers
    AnsibleModule = None

# include/uapi/linux/netdev.h: enum netdev_xdp_act
XDP_FEATURES = {
    "basic": 1 << 0,  # XDP_PASS/DROP/ABORTED/TX in the driver: native XDP
    "redirect": 1 << 1,  # XDP_REDIRECT out of this device's program
    "ndo-xmit": 1 << 2,  # frames redirected *into* this device (the XDP generator's live frames)
    "xsk-zerocopy": 1 << 3,
    "hw-offload": 1 << 4,
    "rx-sg": 1 << 5,
    "ndo-xmit-sg": 1 << 6,
}
OFFLOADS = (
    "rx-checksumming",
    "tx-checksumming",
    "scatter-gather",
    "tcp-segmentation-offload",
    "generic-segmentation-offload",
    "generic-receive-offload",
    "large-receive-offload",
    "rx-vlan-offload",
    "rx-gro-hw",
)


# --- parsers: a tool's text in, a dict out -------------------------------------------
def parse_ethtool_i(text):
    """`ethtool -i IFACE`: driver, version, firmware-version, bus-info ("" -> None)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("driver", "version", "firmware-version", "bus-info"):
            out[key.strip()] = value.strip() or None
    return out


def parse_ethtool_k(text):
    """`ethtool -k IFACE`: {feature: True/False} of OFFLOADS ("[fixed]" kept as fixed)."""
    out, fixed = {}, []
    for line in text.splitlines():
        m = re.match(r"^([a-z0-9-]+):\s+(on|off)(\s+\[fixed\])?", line.strip())
        if m and m.group(1) in OFFLOADS:
            out[m.group(1)] = m.group(2) == "on"
            if m.group(3):
                fixed.append(m.group(1))
    return {"features": out, "fixed": fixed}


def parse_ethtool_l(text):
    """`ethtool -l IFACE`: {"max": {rx, tx, other, combined}, "current": {...}}."""
    out, section = {"max": {}, "current": {}}, None
    for line in text.splitlines():
        if line.startswith("Pre-set maximums"):
            section = "max"
        elif line.startswith("Current hardware settings"):
            section = "current"
        elif section and ":" in line:
            key, _, value = line.partition(":")
            key, value = key.strip().lower(), value.strip()
            if key in ("rx", "tx", "other", "combined"):
                out[section][key] = int(value) if value.isdigit() else None
    return out


def parse_ethtool_a(text):
    """`ethtool -a IFACE`: pause frames {autonegotiate, rx, tx}."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and key in ("autonegotiate", "rx", "tx"):
            out[key] = value.strip() == "on"
    return out


def parse_os_release(text):
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


def sysfs_int(text):
    """A sysfs number, or None where the device has none (a veth's speed reads as
    EINVAL, -1 means unknown; numa_node -1: no NUMA node)."""
    try:
        value = int(text.strip())
    except (AttributeError, ValueError):
        return None
    return None if value < 0 else value


def features_of(mask):
    return [name for name, bit in XDP_FEATURES.items() if mask is not None and mask & bit]


# --- the kernel: xdp_features over generic netlink ---------------------------------------
NLMSG_ERROR, NLM_F_REQUEST = 2, 1
GENL_ID_CTRL, CTRL_CMD_GETFAMILY, CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 0x10, 3, 1, 2
NETDEV_CMD_DEV_GET, NETDEV_A_DEV_IFINDEX, NETDEV_A_DEV_XDP_FEATURES = 1, 1, 3


def _attrs(data):
    out, i = {}, 0
    while i + 4 <= len(data):
        length, kind = struct.unpack_from("HH", data, i)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[i + 4 : i + length]
        i += (length + 3) & ~3
    return out


def _attr(kind, payload):
    body = struct.pack("HH", 4 + len(payload), kind) + payload
    return body + b"\0" * (-len(body) % 4)


def _genl(sock, family, cmd, attrs):
    payload = struct.pack("BBH", cmd, 1, 0) + attrs
    sock.send(struct.pack("IHHII", 16 + len(payload), family, NLM_F_REQUEST, 1, 0) + payload)
    data = sock.recv(65536)
    length, kind = struct.unpack_from("IH", data, 0)
    if kind == NLMSG_ERROR:
        (err,) = struct.unpack_from("i", data, 16)
        raise OSError(-err, os.strerror(-err))
    return _attrs(data[20:length])


def xdp_features(ifindex):
    """The device's xdp_features bit mask; None where the kernel has no netdev family (< 6.3)."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 16) as sock:  # NETLINK_GENERIC
            sock.settimeout(2)
            family = _genl(sock, GENL_ID_CTRL, CTRL_CMD_GETFAMILY, _attr(CTRL_ATTR_FAMILY_NAME, b"netdev\0"))
            (family_id,) = struct.unpack("H", family[CTRL_ATTR_FAMILY_ID][:2])
            dev = _genl(sock, family_id, NETDEV_CMD_DEV_GET, _attr(NETDEV_A_DEV_IFINDEX, struct.pack("I", ifindex)))
            (mask,) = struct.unpack("Q", dev[NETDEV_A_DEV_XDP_FEATURES][:8])
            return mask
    except (OSError, KeyError, struct.error):
        return None


# --- reading this host ---------------------------------------------------------------
def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _run(argv, timeout=10):
    if not shutil.which(argv[0]):
        return None
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def _addresses():
    """{ifname: [address/prefix, ...]} of this host (its namespace), from `ip -j addr`."""
    out = {}
    text = _run(["ip", "-j", "addr", "show"])
    for link in json.loads(text) if text else []:
        out[link["ifname"]] = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])]
    return out


def _manager(ifname):
    """Who configures the interface besides the lab: NetworkManager, systemd-networkd, or None."""
    nm = _run(["nmcli", "-t", "-f", "DEVICE,STATE", "device"])
    for line in (nm or "").splitlines():
        dev, _, state = line.partition(":")
        if dev == ifname and state not in ("unmanaged", ""):
            return "NetworkManager"
    nd = _run(["networkctl", "list", "--no-legend", "--no-pager", ifname])
    if nd and nd.split() and len(nd.split()) >= 5 and nd.split()[4] not in ("unmanaged", "-"):
        return "systemd-networkd"
    return None


def _firewall(ifname, ruleset):
    """Whether an nftables rule names the interface (iifname/oifname "X")."""
    return bool(ruleset) and re.search(rf'[io]ifname "?{re.escape(ifname)}"?[\s;}}]', ruleset) is not None


def interface(ifname, addresses, ruleset):
    base = f"/sys/class/net/{ifname}"
    if not os.path.isdir(base):
        return {"name": ifname, "present": False}
    ifindex = sysfs_int(_read(f"{base}/ifindex"))
    flags = int(_read(f"{base}/flags") or "0", 16)  # "0x1003"
    mask = xdp_features(ifindex) if ifindex else None
    return {
        "name": ifname,
        "present": True,
        "ifindex": ifindex,
        "up": bool(flags & 1),
        "operstate": (_read(f"{base}/operstate") or "").strip() or None,
        "speed_mbps": sysfs_int(_read(f"{base}/speed")),
        "mtu": sysfs_int(_read(f"{base}/mtu")),
        "mac": (_read(f"{base}/address") or "").strip() or None,
        "numa_node": sysfs_int(_read(f"{base}/device/numa_node")),
        "ethtool": parse_ethtool_i(_run(["ethtool", "-i", ifname]) or ""),
        "offloads": parse_ethtool_k(_run(["ethtool", "-k", ifname]) or ""),
        "channels": parse_ethtool_l(_run(["ethtool", "-l", ifname]) or ""),
        "pause": parse_ethtool_a(_run(["ethtool", "-a", ifname]) or ""),
        "xdp_features": features_of(mask),
        "xdp_features_known": mask is not None,
        "addresses": addresses.get(ifname, []),
        "forwarding": sysfs_int(_read(f"/proc/sys/net/ipv4/conf/{ifname}/forwarding")) == 1,
        "managed_by": _manager(ifname),
        "firewall": _firewall(ifname, ruleset),
    }


def _clock():
    """Whether the clock is synchronised, and its offset where chrony says it."""
    tracking = _run(["chronyc", "-c", "tracking"])
    if tracking:
        fields = tracking.strip().split(",")
        try:
            return {"source": "chrony", "synchronized": fields[0] != "0.0.0.0", "offset_s": float(fields[4])}
        except (IndexError, ValueError):
            pass
    shown = _run(["timedatectl", "show", "-p", "NTPSynchronized", "--value"])
    if shown:
        return {"source": "timedatectl", "synchronized": shown.strip() == "yes", "offset_s": None}
    return {"source": None, "synchronized": None, "offset_s": None}


def _lab(lab_dir):
    stamp = _read(os.path.join(lab_dir, ".lab-commit"))
    setup = _read(os.path.join(lab_dir, ".lab-setup"))
    return {
        "dir": lab_dir,
        "present": os.path.isfile(os.path.join(lab_dir, "pyproject.toml")),
        "commit": stamp.strip() if stamp else None,
        "setup": setup.strip() if setup else None,  # the commit whose set-up last succeeded here
        "python": os.access(os.path.join(lab_dir, ".venv/bin/python"), os.X_OK),
        "held_by": _json(_read(os.path.join(lab_dir, ".lab-state/owner.json"))),  # a bench under way (lab.hosts.local)
    }


def _json(text):
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


# What a bench's figures depend on, from Debian: BCC and its compiler, libbpf, the
# plumbing, the generators and the peers (a record says which versions measured it)
DEBIAN_PACKAGES = (
    "python3-bpfcc",
    "libbpf1",
    "libclang-cpp14",
    "iproute2",
    "ethtool",
    "nftables",
    "netsniff-ng",
    "iperf3",
    "openvswitch-switch",
    "suricata",
)


def parse_dpkg_query(text):
    """`dpkg-query -W -f '${Package} ${db:Status-Abbrev} ${Version}\\n'` as
    {package: version}; a package known but not installed (status other than ii) is None."""
    out = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            out[fields[0]] = fields[2] if fields[1] == "ii" else None
    return out


def _packages(lab_dir):
    """Versions: the Debian packages above (None: not installed) and every Python
    distribution in the lab's virtual environment (its *.dist-info names, nothing run)."""
    listed = ""
    if shutil.which("dpkg-query"):  # (exit 1 when any is unknown to dpkg; the others are still listed)
        fmt = "${Package} ${db:Status-Abbrev} ${Version}\n"
        listed = subprocess.run(
            ["dpkg-query", "-W", "-f", fmt, *DEBIAN_PACKAGES], capture_output=True, text=True
        ).stdout
    debian = parse_dpkg_query(listed)
    python = {}
    for site in glob.glob(os.path.join(lab_dir, ".venv/lib/python3*/site-packages")):
        for entry in os.listdir(site):
            if entry.endswith(".dist-info") and "-" in entry:
                name, version = entry[: -len(".dist-info")].rsplit("-", 1)
                python[name.lower().replace("_", "-")] = version
    return {"debian": {p: debian.get(p) for p in DEBIAN_PACKAGES}, "python": dict(sorted(python.items()))}


def _management():
    """The address and interface this ssh connection came in on (SSH_CONNECTION:
    client, client port, server address, server port)."""
    conn = os.environ.get("SSH_CONNECTION", "").split()
    return conn[2] if len(conn) == 4 else None


def _cgroup2(mounts):
    """The first cgroup v2 hierarchy's mount point in /proc/mounts' text, or None."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return fields[1]
    return None


def gather(lab_dir, ifaces, management_addrs=()):
    osr = parse_os_release(_read("/etc/os-release") or "")
    addresses = _addresses()
    ruleset = _run(["nft", "list", "ruleset"]) or ""
    seen = [a for a in [_management(), *management_addrs] if a]
    mgmt_ifaces = sorted(
        {name for name, addrs in addresses.items() for a in addrs if a.split("/")[0] in seen and name != "lo"}
    )
    governor = (_read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") or "").strip() or None
    return {
        "hostname": socket.gethostname(),
        "uid": os.geteuid(),
        "os": {"id": osr.get("ID"), "version_id": osr.get("VERSION_ID"), "pretty": osr.get("PRETTY_NAME")},
        "kernel": os.uname().release,
        "arch": os.uname().machine,
        "cpus": os.cpu_count(),
        "btf": os.path.exists("/sys/kernel/btf/vmlinux"),
        "bpf_jit": sysfs_int(_read("/proc/sys/net/core/bpf_jit_enable")),
        "bpffs": "/sys/fs/bpf bpf" in (_read("/proc/mounts") or ""),
        "cgroup2": _cgroup2(_read("/proc/mounts") or ""),  # where socket programs attach (a pods node's)
        # IPv6 forwards only where it is on for all interfaces (per interface: 6.17's
        # force_forwarding): the pods' IPv6 through a node needs it, and the lab leaves it as it is
        "ipv6_forwarding": sysfs_int(_read("/proc/sys/net/ipv6/conf/all/forwarding")) == 1,
        "python": shutil.which("python3"),
        "tools": {t: bool(shutil.which(t)) for t in ("ethtool", "ip", "tc", "nft", "git")},
        "clock": _clock(),
        "governor": governor,
        "irqbalance": any(
            (_read(f"/proc/{p}/comm") or "").strip() == "irqbalance" for p in os.listdir("/proc") if p.isdigit()
        ),
        "management": {"addresses": seen, "ifaces": mgmt_ifaces},
        "lab": _lab(lab_dir),
        "packages": _packages(lab_dir),
        "ifaces": {name: interface(name, addresses, ruleset) for name in ifaces},
    }


def main():
    module = AnsibleModule(
        argument_spec={
            "lab_dir": {"type": "str", "required": True},
            "ifaces": {"type": "list", "elements": "str", "default": []},
            "management_addrs": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    module.exit_json(changed=False, lab_facts=gather(p["lab_dir"], p["ifaces"], p["management_addrs"]))


if __name__ == "__main__":
    main()
