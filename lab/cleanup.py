"""Remove what crashed lab runs left behind: their namespaces (and with them every
link, qdisc, program and process inside, the daemons included), their run
files, what their daemons left outside the namespace (lab.daemons.cleanup: run
directories, Suricata's cgroups), and what each fast path's killed command left
in this namespace (its own cleanup(), as its --cleanup: lab.fastpath).

A run whose owning process is still alive is left alone unless all_runs=True, so
`python -m lab cleanup` in one terminal cannot break a run in another.
"""

import os

from ebpf.instruments.xdp_peer_pass import XdpPeerPass
from lab import daemons, netns, runs
from lab.fastpath import fastpaths
from lab.traffic.filetransfer import SPOOL_DIR, SPOOL_PREFIX


def cleanup(all_runs=False, spared=None) -> list[str]:
    """What was removed, one line each; what a live run holds is left, and said
    in `spared` (a list) when given."""
    removed = []
    for fp in fastpaths():
        fp.peer_classes()  # a peer's own daemons register for cleanup too (lab.daemons)
        done, left = fp.command_object().cleanup(all_runs)
        removed += [f"{fp.name}: {what}" for what in done]
        if spared is not None:
            spared += [f"{fp.name}: {what}" for what in left]
    found = runs.runs()
    for run_id, names in sorted(found.items()):
        if not all_runs and runs.owner_alive(run_id):
            continue
        for name in names:
            netns.remove(name)
            removed.append(f"namespace {name}")
        runs.ended(run_id)
    for pidfile in runs.stale_run_files(found):
        pidfile.unlink(missing_ok=True)
    removed += daemons.cleanup()  # every daemon's files of namespaces that are gone
    # pass programs a killed `lab lb/redirect --prepare-peer` left on veth peers, in any namespace
    removed += _peer_programs()
    # files a killed file-transfer server was receiving into
    for spool in SPOOL_DIR.glob(f"{SPOOL_PREFIX}*-*"):
        pid = spool.name[len(SPOOL_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not netns.alive(int(pid)):
            spool.unlink(missing_ok=True)
            removed.append(f"file-transfer spool file {spool}")
    return removed


def _peer_programs() -> list[str]:
    done, _ = XdpPeerPass.cleanup(None)  # this namespace (a user's veth peer may be here)
    removed = [f"{what} (this namespace)" for what in done]
    for name in sorted(os.listdir(netns.NETNS_DIR)) if os.path.isdir(netns.NETNS_DIR) else []:
        if netns.foreign(name):
            continue
        try:
            done, _ = XdpPeerPass.cleanup(name)
        except Exception:  # a namespace going away meanwhile
            continue
        removed += [f"{what} (namespace {name})" for what in done]
    return removed


def remove_leftovers() -> list[str]:
    """Remove what dead lab runs left (as `python -m lab cleanup` does; live runs
    are left alone). Returns what was removed, one string per item."""
    return cleanup(all_runs=False)
