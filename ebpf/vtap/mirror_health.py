"""What changed around a running vTAP, from outside: its filters removed, the
monitor down, without carrier, deleted or made again, and other vTAPs on the
hooks it taps. The command line asks every interval (TcMirror.health()) and
says each change once, when it happens."""

import os
from dataclasses import dataclass

from ebpf import netdev, tc
from ebpf.errors import AttachError, InputError


@dataclass
class Health:
    """What changed outside the vTAP since it attached."""

    missing: list  # [(TcFilter, why)] of our filters that are gone
    monitor_state: str  # "up", "down", "no-carrier" (mirred refuses copies to it too), "gone",
    # or "renewed" (deleted and made again, and now followed)
    monitor_mtu: int
    note: str = ""  # why a monitor made again is not followed


def health(tap) -> Health:
    """Filters of `tap` (a TcMirror) that are gone, and its monitor's state.
    Keeps the program's copy of the monitor's MTU current, and follows a
    monitor that was deleted and made again under the same name ("renewed")."""
    with netdev.ipr(tap.netns) as ip:
        devs = netdev.devices(ip)
    missing = []
    for f in tap.tc_filters:
        if tc.find(f) is None:
            why = (
                f"{f.ifname} was deleted"
                if f.ifindex not in devs
                else "its filter was removed from outside (vtap --cleanup --all, tc filter del)"
            )
            missing.append((f, why))
    mon = devs.get(tap.monitor_ifindex)
    if mon is None:
        if missing or not any(d.name == tap.monitor for d in devs.values()):
            return Health(missing, "gone", tap.monitor_mtu)
        try:
            tap.monitor = tap.monitor  # the new device of that name: retarget to it
        except (InputError, AttachError) as e:
            return Health(missing, "gone", tap.monitor_mtu, note=f"the new {tap.monitor} is refused: {e}")
        return Health(missing, "renewed", tap.monitor_mtu)
    tap.monitor_mtu = mon.mtu
    state = "down" if not mon.up else "no-carrier" if not mon.carrier else "up"
    return Health(missing, state, mon.mtu)


def other_taps(tap, owner):
    """vTAP filters (named for `owner`) of other instances on the hooks `tap`
    taps, live or left by a killed one: each copies what it matches once more
    (tc.Found; .live, .pids, .entry.mirror_ifindex)."""
    ours = {f.prog_id for f in tap.tc_filters}
    hooks = {(f.ifindex, f.direction) for f in tap.tc_filters}
    found = []
    for ifindex in sorted({i for i, _ in hooks}):
        found += [
            o
            for o in tc.filters_of(owner, tap.netns, ifindex)
            if (o.ifindex, o.direction) in hooks and o.entry.prog_id not in ours
        ]
    return found


def interface_name(netns, ifindex):
    """The name of interface `ifindex` in the namespace (None for 0)."""
    if not ifindex:
        return None
    with netdev.ipr(netns) as ip:
        dev = netdev.device(ip, ifindex)
    return dev.name if dev else f"ifindex {ifindex}"


def other_tap_notes(tap, owner, hooks=None) -> list[str]:
    """One line per other vTAP filter on the hooks of `tap` (or on `hooks`, a
    set of (ifindex, direction)): who runs it, and what it does to the copies."""
    notes = []
    for o in other_taps(tap, owner):
        if hooks is not None and (o.ifindex, o.direction) not in hooks:
            continue
        who = (
            f"vtap pid {', '.join(map(str, o.pids))} runs it"
            if o.live
            else "left by a killed vtap: `vtap --cleanup` removes it"
        )
        if os.getpid() in o.pids:
            who = "another TcMirror of this process runs it: close() that one"
        mon = interface_name(tap.netns, o.entry.mirror_ifindex)
        to = (
            f"to the same monitor {mon}: frames both match arrive there twice"
            if mon == tap.monitor
            else f"to {mon}: frames both match are copied twice"
            if mon
            else "(with --clone helper): frames both match are copied twice"
        )
        notes.append(f"{o.where} already has another vTAP filter ({who}) copying {to}")
    return notes
