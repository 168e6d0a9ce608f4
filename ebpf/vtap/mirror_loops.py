"""Which hooks a vTAP must not tap: those its own copies pass on their way out
of the monitor. A copy leaves through the monitor; a tap on a hook it then
passes (the monitor itself, its veth peer, a tunnel monitor's underlay, a
bridge monitor's ports: netdev.copy_path) would copy the copies again, without
end. TcMirror asks here before it attaches, and before it changes monitor."""

from ebpf import netdev, tc


def directions_of(direction):
    return tc.DIRECTIONS if direction == "both" else (direction,)


def loops(path, ifindex, directions, monitor):
    """Why tapping ifindex in these directions would copy the copies that
    leave through `monitor` (path: its netdev.copy_path), or None."""
    for d in directions:
        why = path.get((ifindex, d))
        if why:
            return (
                f"{'it' if why == 'the monitor itself' else 'its ' + d} carries the copies to monitor "
                f"{monitor} ({why}): they would be copied again"
            )
    return None


def loop_reason(netns, monitor, monitor_ifindex, ifname, direction="both"):
    """Why tapping ifname would copy the copies, or None when it is safe. The
    monitor itself is refused in any direction."""
    with netdev.ipr(netns) as ip:
        ifindex = netdev.ifindex_of(ip, ifname, netns)
        path = netdev.copy_path(ip, monitor_ifindex)
    if ifindex == monitor_ifindex:
        return f"it is the monitor {monitor}: its own copies would loop"
    return loops(path, ifindex, directions_of(direction), monitor)


def default_interfaces(netns, monitor, monitor_ifindex, direction="ingress"):
    """What to tap when nobody says: every UP interface of the namespace but lo
    and those whose hooks carry the copies. Returns (names, {skipped name: why})."""
    with netdev.ipr(netns) as ip:
        path = netdev.copy_path(ip, monitor_ifindex)
        devs = netdev.devices(ip)
    chosen, skipped = [], {}
    for dev in sorted(devs.values(), key=lambda d: d.name):
        if not dev.up or dev.name == "lo" or dev.index == monitor_ifindex:
            continue
        why = loops(path, dev.index, directions_of(direction), monitor)
        if why:
            skipped[dev.name] = why
        else:
            chosen.append(dev.name)
    return chosen, skipped
