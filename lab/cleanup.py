"""Remove what crashed lab runs left behind: their namespaces (and with them every
link, qdisc, program and process inside, OVS daemons and Suricata included),
their run files, OVS and Suricata run directories, and Suricata's cgroups.

A run whose owning process is still alive is left alone unless all_runs=True, so
`python -m lab cleanup` in one terminal cannot break a run in another.
"""

import os
import shutil

from . import balancers, daemons, ids, netns, webservers  # noqa: F401 (their daemons register for cleanup)
from .leftovers import owner_alive
from .topology import RUN_DIR, orphaned_run_dirs
from .traffic.filetransfer import SPOOL_DIR, SPOOL_PREFIX


def _owner_alive(run_id):
    return owner_alive(run_id)


def cleanup(all_runs=False) -> list[str]:
    removed = []
    runs = {}
    for name in netns.lab_namespaces():
        run_id = name[len(netns.PREFIX):].split("-", 1)[0]
        runs.setdefault(run_id, []).append(name)
    for run_id, names in sorted(runs.items()):
        if not all_runs and _owner_alive(run_id):
            continue
        for name in names:
            netns.remove(name)
            removed.append(f"namespace {name}")
        (RUN_DIR / f"{run_id}.pid").unlink(missing_ok=True)
    if RUN_DIR.exists():
        # OVS run directories (lab.mirrors.OvsMirror) of namespaces that are gone;
        # their daemons ran inside the namespace and died with it.
        for ovs_dir in orphaned_run_dirs(".ovs"):
            shutil.rmtree(ovs_dir, ignore_errors=True)
            removed.append(f"OVS run directory {ovs_dir}")
        for pidfile in RUN_DIR.glob("*.pid"):
            if pidfile.stem not in runs and not _owner_alive(pidfile.stem):
                pidfile.unlink(missing_ok=True)
    # Suricata run directories and CPU-quota cgroups (lab.ids) of namespaces that are gone
    removed += ids.cleanup()
    removed += daemons.cleanup()  # nginx backends' and proxies' run directories (lab.daemons)
    # pass programs a killed `lab lb/redirect --prepare-peer` left on veth peers, in any namespace
    removed += _peer_programs()
    # files a killed file-transfer server was receiving into
    for spool in SPOOL_DIR.glob(f"{SPOOL_PREFIX}*-*"):
        pid = spool.name[len(SPOOL_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not netns.alive(int(pid)):
            spool.unlink(missing_ok=True)
            removed.append(f"file-transfer spool file {spool}")
    return removed


def _peer_programs() -> list[str]:
    from ebpf.xdp_peer_pass import XdpPeerPass
    done, _ = XdpPeerPass.cleanup(None)  # this namespace (a user's veth peer may be here)
    removed = [f"{what} (this namespace)" for what in done]
    for name in sorted(os.listdir(netns.NETNS_DIR)) if os.path.isdir(netns.NETNS_DIR) else []:
        try:
            done, _ = XdpPeerPass.cleanup(name)
        except Exception:  # a namespace going away meanwhile
            continue
        removed += [f"{what} (namespace {name})" for what in done]
    return removed


def live_runs(others=True) -> list[str]:
    """Run ids whose owner is still alive (what cleanup skipped); others: not
    those of this process."""
    from .topology import LIVE_RUNS
    run_ids = {n[len(netns.PREFIX):].split("-", 1)[0] for n in netns.lab_namespaces()}
    return sorted(i for i in run_ids if _owner_alive(i) and not (others and i in LIVE_RUNS))
