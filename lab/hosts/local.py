"""What runs on a host itself (from its lab_dir): the record of each interface as it
was before the lab changed it, and the host's cleanup, which puts them back.

    python -m lab.hosts.local cleanup       # what `python -m lab hosts cleanup` runs on each host

The record lives on the host (lab_dir/.lab-state/before.json), written before the
first change to an interface and kept until that interface is restored, so that a
host whose controller was lost (a laptop closed mid-run) is still put back by the
next `hosts cleanup`, or by this command run there by hand. A record already there
when a run starts is a crashed run's: it is the true "before" and is kept.

What is recorded and restored: up/down, MTU, addresses, the offloads the lab turns
(ethtool -k), a clsact qdisc the lab added, an XDP program the lab attached,
threaded NAPI, and the per-interface sysctls the lab sets.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from pyroute2 import IPRoute

from lab.paths import REPO

STATE = Path(os.environ.get("VTL_HOST_STATE") or REPO / ".lab-state")
RECORD = STATE / "before.json"
OFFLOADS = {  # ethtool -k name -> ethtool -K name
    "tcp-segmentation-offload": "tso",
    "generic-segmentation-offload": "gso",
    "generic-receive-offload": "gro",
    "large-receive-offload": "lro",
    "rx-checksumming": "rx",
    "tx-checksumming": "tx",
}
SYSCTLS = ("net/ipv4/conf/{}/forwarding", "net/ipv6/conf/{}/forwarding", "net/ipv4/conf/{}/rp_filter")


def _read(path):
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _offloads(ifname) -> dict:
    p = subprocess.run(["ethtool", "-k", ifname], capture_output=True, text=True)
    out = {}
    for line in p.stdout.splitlines():
        name, _, value = line.strip().partition(":")
        if name in OFFLOADS and "[fixed]" not in value:
            out[OFFLOADS[name]] = value.split()[0] if value.split() else "off"
    return out


def snapshot(ifname) -> dict:
    """An interface as it is now: what restore() puts back."""
    with IPRoute() as ip:
        idx = ip.link_lookup(ifname=ifname)
        if not idx:
            raise LookupError(f"no interface {ifname} on this host")
        link = ip.get_links(idx[0])[0]
        addrs = [f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in ip.get_addr(index=idx[0])]
        qdiscs = [q.get_attr("TCA_KIND") for q in ip.get_qdiscs(index=idx[0])]
    xdp = link.get_attr("IFLA_XDP")
    return {
        "ifname": ifname,
        "up": bool(link["flags"] & 1),
        "mtu": link.get_attr("IFLA_MTU"),
        "addresses": addrs,
        "clsact": "clsact" in qdiscs,
        "xdp": bool(xdp and xdp.get_attr("IFLA_XDP_PROG_ID")),
        "threaded": _read(f"/sys/class/net/{ifname}/threaded"),
        "offloads": _offloads(ifname),
        "sysctls": {k.format(ifname): _read(f"/proc/sys/{k.format(ifname)}") for k in SYSCTLS},
    }


def _load() -> dict:
    try:
        return json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return {}


def _save(record):
    STATE.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = RECORD.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, RECORD)


def remember(ifname) -> dict:
    """Record `ifname` as it is, before the lab changes it; a record already there is a
    crashed run's, of the interface before that run, and is kept."""
    record = _load()
    if ifname not in record:
        record[ifname] = snapshot(ifname)
        _save(record)
    return record[ifname]


def restore(ifname) -> list[str]:
    """Put `ifname` back as its record says; the record's entry goes. What was done, one line each."""
    record = _load()
    was = record.get(ifname)
    if was is None:
        return []
    now = snapshot(ifname)
    done = []
    with IPRoute() as ip:
        idx = ip.link_lookup(ifname=ifname)[0]
        if now["xdp"] and not was["xdp"]:
            ip.link("set", index=idx, xdp_fd=-1)
            done.append("XDP program detached")
        if now["clsact"] and not was["clsact"]:
            ip.tc("del", "clsact", idx)
            done.append("clsact qdisc removed")
        for a in set(now["addresses"]) - set(was["addresses"]):
            address, plen = a.split("/")
            ip.addr("del", index=idx, address=address, prefixlen=int(plen))
            done.append(f"address {a} removed")
        for a in set(was["addresses"]) - set(now["addresses"]):
            address, plen = a.split("/")
            ip.addr("add", index=idx, address=address, prefixlen=int(plen))
            done.append(f"address {a} put back")
        if now["mtu"] != was["mtu"]:
            ip.link("set", index=idx, mtu=was["mtu"])
            done.append(f"MTU {now['mtu']} -> {was['mtu']}")
        if now["up"] != was["up"]:
            ip.link("set", index=idx, state="up" if was["up"] else "down")
            done.append("up" if was["up"] else "down")
    turned = {k: v for k, v in was["offloads"].items() if now["offloads"].get(k) != v}
    if turned:
        subprocess.run(["ethtool", "-K", ifname, *[x for kv in turned.items() for x in kv]], capture_output=True)
        done.append("offloads " + ", ".join(f"{k} {v}" for k, v in turned.items()))
    if was["threaded"] is not None and now["threaded"] != was["threaded"]:
        Path(f"/sys/class/net/{ifname}/threaded").write_text(was["threaded"])
        done.append(f"threaded NAPI {was['threaded']}")
    for key, value in was["sysctls"].items():
        if value is not None and now["sysctls"].get(key) != value:
            Path(f"/proc/sys/{key}").write_text(value)
            done.append(f"{key.replace('/', '.')} {value}")
    del record[ifname]
    if record:
        _save(record)
    else:
        RECORD.unlink(missing_ok=True)
    return [f"{ifname}: {what}" for what in done] or [f"{ifname}: as it was"]


def restore_all() -> list[str]:
    done = []
    for ifname in list(_load()):
        try:
            done += restore(ifname)
        except (LookupError, IndexError):
            done.append(f"{ifname}: gone from this host; its record dropped")
            record = _load()
            record.pop(ifname, None)
            _save(record) if record else RECORD.unlink(missing_ok=True)
    return done


def cleanup() -> list[str]:
    """This host's lab cleanup: every lab run here (its own prefix's, live or not:
    the controller asked), then every interface back as it was."""
    from lab.cleanup import cleanup as lab_cleanup  # noqa: PLC0415 -- every fast path's modules: for cleanup only

    return [*lab_cleanup(all_runs=True), *restore_all()]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["cleanup"]:
        print("usage: python -m lab.hosts.local cleanup", file=sys.stderr)
        return 2
    for line in cleanup():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
