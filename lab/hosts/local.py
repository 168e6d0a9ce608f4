"""What runs on a host itself (from its lab_dir): the record of each interface as it
was before the lab changed it, and the host's cleanup, which puts them back.

    python -m lab.hosts.local cleanup       # what `python -m lab hosts cleanup` runs on each host
    python -m lab.hosts.local prepare JSON  # a bench's interfaces: recorded, then addressed, up, promiscuous

The record lives on the host (lab_dir/.lab-state/before.json), written before the
first change to an interface and kept until that interface is restored, so that a
host whose controller was lost (a laptop closed mid-run) is still put back by the
next `hosts cleanup`, or by this command run there by hand. A record already there
when a run starts is a crashed run's: it is the true "before" and is kept.

What is recorded and restored: up/down, MTU, addresses, the offloads the lab turns
(ethtool -k), a clsact qdisc the lab added, an XDP program the lab attached,
threaded NAPI, and the per-interface sysctls the lab sets.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from lab.hosts.runner import alive, pid_of
from lab.netns import LAB_ROUTE_PROTO
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


def _features(ifname) -> dict:
    """{short name: (on/off, changeable now)} of the offloads in OFFLOADS. An offload
    is fixed when its line says so, or when every feature under it does: a veth whose
    peer has an XDP program has its TSO held off by the kernel, fixed, until the
    program goes (and then back as it was, by itself)."""
    p = subprocess.run(["ethtool", "-k", ifname], capture_output=True, text=True)
    out, name, subs = {}, None, []

    def close():
        if name is not None:
            value, fixed = out[name]
            out[name] = (value, not fixed and not (subs and all("[fixed]" in s for s in subs)))

    for line in p.stdout.splitlines():
        if line.startswith("\t"):  # a feature under the last one
            subs.append(line)
            continue
        close()
        key, _, value = line.strip().partition(":")
        name, subs = OFFLOADS.get(key), []
        if name is not None:
            out[name] = (value.split()[0] if value.split() else "off", "[fixed]" in value)
    close()
    return out


def _offloads(ifname) -> dict:
    """The offloads one can turn now, as they are: what a record keeps (one fixed at
    the time is the kernel's, not the user's: put "back" later, it would be turned)."""
    return {k: v for k, (v, changeable) in _features(ifname).items() if changeable}


def snapshot(ifname) -> dict:
    """An interface as it is now: what restore() puts back."""
    with IPRoute() as ip:
        idx = ip.link_lookup(ifname=ifname)
        if not idx:
            raise LookupError(f"no interface {ifname} on this host")
        link = ip.get_links(idx[0])[0]
        # link-local IPv6 addresses are the kernel's, made when the link comes up and gone
        # when it goes down: not the lab's to add or remove
        addrs = [
            f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}"
            for a in ip.get_addr(index=idx[0])
            if not a.get_attr("IFA_ADDRESS").lower().startswith("fe80:")
        ]
        qdiscs = [q.get_attr("TCA_KIND") for q in ip.get_qdiscs(index=idx[0])]
        master = link.get_attr("IFLA_MASTER")
        master = ip.get_links(master)[0].get_attr("IFLA_IFNAME") if master else None
    xdp = link.get_attr("IFLA_XDP")
    return {
        "ifname": ifname,
        "up": bool(link["flags"] & 1),
        "promisc": bool(link["flags"] & 0x100),
        "mtu": link.get_attr("IFLA_MTU"),
        "addresses": addrs,
        "master": master,  # a bridge (or bond) it is a port of
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
    if was.get("nft"):  # an nftables table the lab made (a pods node's services): deleted
        family, table = was["nft"]
        gone = subprocess.run(["nft", "delete", "table", family, table], capture_output=True).returncode != 0
        del record[ifname]
        _save(record) if record else RECORD.unlink(missing_ok=True)
        return [f"nftables table {family} {table}: {'gone already' if gone else 'deleted (the lab made it)'}"]
    if was.get("created"):  # a device the lab made (a Testbed 2 tap's bridge): deleted
        with IPRoute() as ip:
            idx = ip.link_lookup(ifname=ifname)
            if idx:
                ip.link("del", index=idx[0])
        del record[ifname]
        _save(record) if record else RECORD.unlink(missing_ok=True)
        return [f"{ifname}: deleted (the lab made it)" if idx else f"{ifname}: gone already"]
    now = snapshot(ifname)
    done, failed = [], []

    def step(what, action):
        # every step is tried; one that fails keeps the record, so a later cleanup tries again
        try:
            action()
            done.append(what)
        except (OSError, NetlinkError, subprocess.CalledProcessError) as e:
            said = (getattr(e, "stderr", None) or b"").decode(errors="replace").strip().splitlines()
            failed.append(f"{what}: {said[-1] if said else getattr(e, 'strerror', None) or e}")

    for family in ("-4", "-6"):  # routes the lab added through it (a pods node's to the other nodes' pods)
        argv = ["ip", family, "route", "flush", "dev", ifname, "proto", str(LAB_ROUTE_PROTO)]
        if subprocess.run(
            ["ip", family, "route", "show", "dev", ifname, "proto", str(LAB_ROUTE_PROTO)],
            capture_output=True,
            text=True,
        ).stdout.strip():
            step(
                f"the lab's IPv{family[1]} routes removed",
                lambda a=argv: subprocess.run(a, check=True, capture_output=True),
            )
    with IPRoute() as ip:
        idx = ip.link_lookup(ifname=ifname)[0]
        if now["xdp"] and not was["xdp"]:
            step("XDP program detached", lambda: ip.link("set", index=idx, xdp_fd=-1))
        if now["clsact"] and not was["clsact"]:
            step("clsact qdisc removed", lambda: ip.tc("del", "clsact", idx))
        for a in sorted(set(now["addresses"]) - set(was["addresses"])):
            address, plen = a.split("/")
            step(
                f"address {a} removed",
                lambda ad=address, pl=plen: ip.addr("del", index=idx, address=ad, prefixlen=int(pl)),
            )
        for a in sorted(set(was["addresses"]) - set(now["addresses"])):
            address, plen = a.split("/")
            step(
                f"address {a} put back",
                lambda ad=address, pl=plen: ip.addr("add", index=idx, address=ad, prefixlen=int(pl)),
            )
        if now.get("master") != was.get("master"):
            if was.get("master"):
                master = ip.link_lookup(ifname=was["master"])
                step(f"port of {was['master']} again", lambda: ip.link("set", index=idx, master=master[0]))
            else:
                step(f"out of {now['master']}", lambda: ip.link("set", index=idx, master=0))
        if now["mtu"] != was["mtu"]:
            step(f"MTU {now['mtu']} -> {was['mtu']}", lambda: ip.link("set", index=idx, mtu=was["mtu"]))
        if now["promisc"] != was.get("promisc", False):
            on = "on" if was["promisc"] else "off"
            step(f"promiscuous {on}", lambda: _ip_link(ifname, "promisc", on))
        if now["up"] != was["up"]:
            state = "up" if was["up"] else "down"
            step(state, lambda: ip.link("set", index=idx, state=state))
    features = _features(ifname)
    turned = {k: v for k, v in was["offloads"].items() if k in features and features[k][0] != v}
    for k in [k for k in turned if not features[k][1]]:
        # held by the kernel, not by the lab (a veth whose peer still has an XDP program:
        # another host's, whose cleanup runs beside this one): kept in the record, and the
        # controller runs this cleanup again once every host's has run
        failed.append(f"offload {k} {turned.pop(k)}: fixed by the kernel for now (on a veth: its peer has XDP)")
    if turned:
        argv = ["ethtool", "-K", ifname, *[x for kv in turned.items() for x in kv]]
        step(
            "offloads " + ", ".join(f"{k} {v}" for k, v in turned.items()),
            lambda: subprocess.run(argv, capture_output=True, check=True),
        )
    if was["threaded"] is not None and now["threaded"] != was["threaded"]:
        # a device with no NAPI left (its XDP program gone) refuses the write, and has
        # nothing running threaded either: as it was
        path = Path(f"/sys/class/net/{ifname}/threaded")
        step(f"threaded NAPI {was['threaded']}", lambda: _write_unless_unsupported(path, was["threaded"]))
    for key, value in was["sysctls"].items():
        if value is not None and now["sysctls"].get(key) != value:
            step(f"{key.replace('/', '.')} {value}", lambda k=key, v=value: Path(f"/proc/sys/{k}").write_text(v))
    if failed:
        return [f"{ifname}: {what}" for what in done] + [f"{ifname}: FAILED {what}" for what in failed]
    del record[ifname]
    if record:
        _save(record)
    else:
        RECORD.unlink(missing_ok=True)
    return [f"{ifname}: {what}" for what in done] or [f"{ifname}: as it was"]


def _ip_link(ifname, *args):
    subprocess.run(["ip", "link", "set", "dev", ifname, *args], check=True, capture_output=True)


def _write_unless_unsupported(path, value):
    try:
        path.write_text(value)
    except OSError as e:
        if e.errno != errno.EOPNOTSUPP:
            raise


def restore_all() -> list[str]:
    done = []
    record = _load()
    # the devices the lab made go first: their ports are then free to be put back
    for ifname in sorted(record, key=lambda n: not record[n].get("created")):
        try:
            done += restore(ifname)
        except (LookupError, IndexError):
            done.append(f"{ifname}: gone from this host; its record dropped")
            record = _load()
            record.pop(ifname, None)
            _save(record) if record else RECORD.unlink(missing_ok=True)
    return done


RUNS = STATE / "runs"  # each bench run's runners' directories (lab.hosts.runner)
OWNER = STATE / "owner.json"  # the bench that holds this host now, from its prepare to its cleanup
KEEP_BENCHES = 20  # bench directories kept in RUNS (their runners' logs and results)


def take(owner) -> None:
    """This host held for one bench (owner: its id, controller, pid, start); another
    bench's prepare is refused until its cleanup (or `hosts cleanup`) lets go. Made
    with O_EXCL: two prepares at one moment, one wins."""
    STATE.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(OWNER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        held = _owner()
        if held.get("bench") == owner.get("bench"):
            return
        raise LabHostError(
            f"in use by bench {held.get('bench')} (from {held.get('controller')}, pid {held.get('pid')}, since "
            f"{held.get('since')}); fix: wait for it to end, or `python -m lab hosts cleanup -i FILE` if it is gone"
        ) from None
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(owner) + "\n")


def _owner() -> dict:
    try:
        return json.loads(OWNER.read_text())
    except (OSError, ValueError):
        return {}


def prepare(items) -> list[str]:
    """A bench's interfaces on this host, each recorded first: [{"iface", "address"
    (or None; or "addresses", a list), "promisc", "sysctls" ({SYSCTLS key: value})}];
    up, the addresses added, promiscuous where asked (a monitor's NIC would drop the
    copies, which carry another host's MAC, before XDP sees them), the sysctls set
    (a pods node's forwarding on its underlay).
    {"bridge": NAME, "ports": [IFACE, ...]}: a bridge made of those (recorded ports),
    as Testbed 2's tap host joins sender and receiver; deleted by cleanup."""
    done = []
    for item in items:
        if "bridge" in item:
            done += _bridge(item["bridge"], item["ports"])
            continue
        name = item["iface"]
        was = remember(name)
        with IPRoute() as ip:
            idx = ip.link_lookup(ifname=name)[0]
            for a in item.get("addresses") or ([item["address"]] if item.get("address") else []):
                if a in was["addresses"]:
                    continue
                address, plen = a.split("/")
                # IPv6 without duplicate address detection: usable at once (the lab's own range)
                nodad = {"flags": 0x02} if ":" in address else {}  # IFA_F_NODAD
                ip.addr("replace", index=idx, address=address, prefixlen=int(plen), **nodad)
                done.append(f"{name}: address {a}")
            ip.link("set", index=idx, state="up")
        if item.get("promisc"):
            subprocess.run(["ip", "link", "set", "dev", name, "promisc", "on"], check=True)
            done.append(f"{name}: promiscuous")
        for key, value in (item.get("sysctls") or {}).items():  # per interface: SYSCTLS, recorded above
            if key.format(name) not in was["sysctls"]:
                raise LabHostError(f"sysctl {key}: not one the lab records and puts back ({', '.join(SYSCTLS)})")
            Path(f"/proc/sys/{key.format(name)}").write_text(f"{value}\n")
            done.append(f"{name}: {key.format(name).replace('/', '.')} {value}")
    return done


def made(name):
    """A device this host's runner is about to make (a pods node's tunnel device):
    recorded first, so that a cleanup deletes it even if the runner dies; refused when
    the host has one of that name that is not the lab's."""
    record = _load()
    with IPRoute() as ip:
        if ip.link_lookup(ifname=name) and not record.get(name, {}).get("created"):
            raise LabHostError(f"{name} exists on this host and is not the lab's; fix: remove it, or rename it")
    record[name] = {"ifname": name, "created": True}
    _save(record)


def made_table(family, table) -> str:
    """An nftables table this host's runner is about to make (a pods node's services):
    recorded first, as made() records a device; refused when the host has a table of
    that name that is not the lab's. Returns its record's key, for unmade()."""
    key = f"nft {family} {table}"
    record = _load()
    listed = subprocess.run(["nft", "list", "table", family, table], capture_output=True).returncode == 0
    if listed and key not in record:
        raise LabHostError(f"nftables table {family} {table} exists on this host and is not the lab's; fix: remove it")
    record[key] = {"nft": [family, table], "created": True}
    _save(record)
    return key


def unmade(name):
    """The runner deleted what made() recorded: the record goes."""
    record = _load()
    if record.pop(name, None) is not None:
        _save(record) if record else RECORD.unlink(missing_ok=True)


def _bridge(name, ports) -> list[str]:
    with IPRoute() as ip:
        if ip.link_lookup(ifname=name):
            mine = _load().get(name, {}).get("created")
            if not mine:  # the host's own device: never taken over, never deleted
                raise LabHostError(f"{name} exists on this host and is not the lab's; fix: remove it, or rename it")
        else:
            record = _load()
            record[name] = {"ifname": name, "created": True}  # recorded before it exists: never left behind
            _save(record)
            ip.link("add", ifname=name, kind="bridge", br_stp_state=0, br_forward_delay=0)
        idx = ip.link_lookup(ifname=name)[0]
        for port in ports:
            remember(port)
            ip.link("set", index=ip.link_lookup(ifname=port)[0], master=idx, state="up")
        ip.link("set", index=idx, state="up")
    return [f"{name}: a bridge of {', '.join(ports)}"]


class LabHostError(RuntimeError):
    pass


def abort_runners(grace=10.0) -> list[str]:
    """Every runner still running on this host stopped: told (`abort`: a sender then
    never sends), given `grace` seconds to detach by itself, then killed."""
    import signal  # noqa: PLC0415 -- cleanup only
    import time  # noqa: PLC0415

    pids = {}  # {pid file's text: run dir}: a number alone could be another process's by now
    for d in RUNS.glob("*/*") if RUNS.exists() else []:
        pid = _read(d / "pid")
        if pid_of(pid) and not (d / "result.json").exists() and not (d / "error").exists() and alive(pid):
            (d / "abort").write_text("\n")
            pids[pid] = d
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = {p: d for p, d in pids.items() if alive(p)}
        time.sleep(0.05)
    for p in pids:
        if alive(p):  # still that runner (checked again just before: its number is not enough)
            try:
                os.kill(pid_of(p), signal.SIGKILL)
            except ProcessLookupError:
                pass
    zygote = _read(STATE / "zygote.pid")  # the runners' warm parent (lab.hosts.runner)
    if pid_of(zygote) and alive(zygote):
        try:
            os.kill(pid_of(zygote), signal.SIGTERM)
        except ProcessLookupError:
            pass
    return [f"runner {d.parent.name}/{d.name} killed (it did not stop within {grace:.0f} s)" for d in pids.values()]


def cleanup(bench=None) -> list[str]:
    """This host's lab cleanup: its runners stopped, every lab run here (its own
    prefix's, live or not: the controller asked), then every interface back as it was.
    bench: a bench's own cleanup, which leaves a host another bench holds alone (its
    prepare was refused there); without it (`hosts cleanup`), whoever holds the host."""
    from lab.cleanup import cleanup as lab_cleanup  # noqa: PLC0415 -- every fast path's modules: for cleanup only

    held = _owner().get("bench")
    if bench and held and held != bench:
        return [f"held by bench {held}: left alone"]
    done = [*abort_runners(), *lab_cleanup(all_runs=True), *restore_all()]
    # free again (what could not be put back stays in the record, which the next bench's
    # prepare keeps as the host's state before the lab, and a later cleanup retries)
    OWNER.unlink(missing_ok=True)
    old = sorted(RUNS.iterdir(), key=lambda d: d.stat().st_mtime) if RUNS.exists() else []
    for d in old[:-KEEP_BENCHES]:
        shutil.rmtree(d, ignore_errors=True)
    return done


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["prepare"] and len(argv) in (2, 4) and argv[2:3] in ([], ["--owner"]):
        try:
            if len(argv) == 4:
                take(json.loads(argv[3]))
            for line in prepare(json.loads(argv[1])):
                print(line)
        except LabHostError as e:
            print(f"lab: error: {e}", file=sys.stderr)
            return 1
        return 0
    if argv[:1] != ["cleanup"] or argv[1:] not in ([], ["--bench", *argv[2:3]]) or len(argv) == 2:
        print("usage: python -m lab.hosts.local cleanup [--bench ID] | prepare JSON [--owner JSON]", file=sys.stderr)
        return 2
    for line in cleanup(argv[2] if len(argv) == 3 else None):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
