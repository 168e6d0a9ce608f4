"""TC clsact hooks through netlink (pyroute2): attach and detach cls_bpf filters
without disturbing anything that was there before.

Rules, so that attach/detach and a later cleanup after SIGKILL agree:
- A filter we add is named "<owner>:<prog>", or "<owner>+clsact:<prog>" when the
  clsact qdisc on that device was created by us. The kernel keeps the name, so
  the marker survives the process that set it; no state file is needed.
- An observer must see frames before other filters act on them, so we go first:
  at a priority below every existing one when there is room; else, when the
  first priority holds cls_bpf filters for all protocols, inside it (the kernel
  runs a newly added cls_bpf program before the older ones of its priority, and
  our TC_ACT_UNSPEC hands the frame on to them). Otherwise we go last and say so
  (TcFilter.runs_after).
- Detach removes only our filter; the clsact qdisc goes too only if we created it
  and no filter (ours or anybody's) is left on either of its hooks.
"""

from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from .errors import AttachError

INGRESS, EGRESS = "ingress", "egress"
DIRECTIONS = (INGRESS, EGRESS)
PARENTS = {INGRESS: 0xFFFFFFF2, EGRESS: 0xFFFFFFF3}  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_{INGRESS,EGRESS})
CLSACT_HANDLE = 0xFFFF0000
ETH_P_ALL = 0x0003  # host order: pyroute2 applies htons
CREATED_MARK = "+clsact"


@dataclass
class TcFilter:
    netns: str | None
    ifname: str
    ifindex: int
    direction: str
    prio: int
    handle: int
    name: str
    runs_after: int = 0   # priorities of other filters that see frames before ours (and may stop them)

    @property
    def where(self):
        ns = f" in netns {self.netns}" if self.netns else ""
        return f"{self.ifname} {self.direction}{ns}"


def ipr(netns=None):
    """A netlink socket in `netns` (None: this process's namespace). flags=0: never
    create a namespace that does not exist (pyroute2's default would)."""
    return IPRoute(netns=netns, flags=0) if netns else IPRoute()


def ifindex_of(ip, ifname, netns=None):
    found = ip.link_lookup(ifname=ifname)
    if not found:
        where = f"netns {netns}" if netns else "this network namespace"
        raise AttachError(f"no interface named {ifname!r} in {where}")
    return found[0]


def _filter_msgs(ip, ifindex, parent):
    for msg in ip.get_filters(index=ifindex, parent=parent):
        if msg["handle"]:  # handle 0: the per-priority header entry, not a filter
            yield msg


def _filters(ip, ifindex, parent):
    """(prio, handle, name) of every filter on one clsact hook."""
    out = []
    for msg in _filter_msgs(ip, ifindex, parent):
        opts = msg.get_attr("TCA_OPTIONS")
        name = opts.get_attr("TCA_BPF_NAME") if opts is not None and msg.get_attr("TCA_KIND") == "bpf" else None
        out.append((msg["info"] >> 16, msg["handle"], name or ""))
    return out


def _place(ip, ifindex, parent):
    """(prio, handle, runs_after) for a new filter that should see frames first."""
    msgs = list(_filter_msgs(ip, ifindex, parent))
    if not msgs:
        return 1, 1, 0
    prios = {m["info"] >> 16 for m in msgs}
    lowest = min(prios)
    if lowest > 1:
        return lowest - 1, 1, 0
    first = [m for m in msgs if m["info"] >> 16 == lowest]
    all_protocols = (ETH_P_ALL << 8) & 0xFFFF  # htons(ETH_P_ALL), as it sits in tcm_info
    if all(m.get_attr("TCA_KIND") == "bpf" and m["info"] & 0xFFFF == all_protocols for m in first):
        return lowest, max(m["handle"] for m in first) + 1, 0
    prio = next(p for p in range(1, 0xFFFF) if p not in prios)
    return prio, 1, sum(1 for p in prios if p < prio)  # priorities, not entries: u32 lists its hash table too


def has_clsact(ip, ifindex):
    return any(q.get_attr("TCA_KIND") == "clsact" for q in ip.get_qdiscs(index=ifindex))


def _ours(name, owner):
    return name.startswith(owner + ":") or name.startswith(owner + CREATED_MARK + ":")


def attach(netns, ifname, direction, prog_fd, prog_name, owner) -> TcFilter:
    if direction not in DIRECTIONS:
        raise AttachError(f"unknown direction {direction!r} (ingress or egress)")
    parent = PARENTS[direction]
    with ipr(netns) as ip:
        ifindex = ifindex_of(ip, ifname, netns)
        created = False
        try:
            if not has_clsact(ip, ifindex):
                ip.tc("add", "clsact", index=ifindex)
                created = True
            else:
                # A sibling attach of ours may have created it: inherit its mark so
                # whichever of our filters goes last also removes the qdisc.
                created = any(_ours(n, owner) and CREATED_MARK in n
                              for p in PARENTS.values() for _, _, n in _filters(ip, ifindex, p))
            prio, handle, runs_after = _place(ip, ifindex, parent)
            name = f"{owner}{CREATED_MARK if created else ''}:{prog_name}"
            ip.tc("add-filter", "bpf", index=ifindex, handle=handle, parent=parent, prio=prio,
                  protocol=ETH_P_ALL, fd=prog_fd, name=name, classid=1, direct_action=True)
        except NetlinkError as e:
            if created and not any(_filters(ip, ifindex, p) for p in PARENTS.values()):
                ip.tc("del", "clsact", index=ifindex)
            raise AttachError(f"attaching {prog_name} to {ifname} {direction}: {e.args[1] if len(e.args) > 1 else e}") from None
    return TcFilter(netns, ifname, ifindex, direction, prio, handle, name, runs_after)


def _delete(ip, ifindex, parent, prio, handle):
    ip.tc("del-filter", "bpf", index=ifindex, parent=parent, prio=prio, handle=handle,
          protocol=ETH_P_ALL)


def drop_clsact_if_unused(ip, ifindex) -> bool:
    if has_clsact(ip, ifindex) and not any(_filters(ip, ifindex, p) for p in PARENTS.values()):
        ip.tc("del", "clsact", index=ifindex)
        return True
    return False


def detach(f: TcFilter):
    """Remove one filter we attached. Quietly done if the device or filter is gone
    (a namespace torn down first, an interface deleted)."""
    try:
        with ipr(f.netns) as ip:
            if not ip.link_lookup(index=f.ifindex):
                return
            parent = PARENTS[f.direction]
            if any(p == f.prio and h == f.handle and n == f.name for p, h, n in _filters(ip, f.ifindex, parent)):
                _delete(ip, f.ifindex, parent, f.prio, f.handle)
            if CREATED_MARK in f.name:
                drop_clsact_if_unused(ip, f.ifindex)
    except FileNotFoundError:
        return  # the namespace itself is gone, and everything in it
    except NetlinkError as e:
        raise AttachError(f"detaching from {f.where}: {e}") from None


def cleanup(owner, netns=None) -> list[str]:
    """Remove every filter named for `owner` in a namespace (what a killed process
    left behind), and the clsact qdiscs it created that are now empty. Returns a
    description of each thing removed. Touches nothing else."""
    removed = []
    with ipr(netns) as ip:
        for link in ip.get_links():
            ifindex, ifname = link["index"], link.get_attr("IFLA_IFNAME")
            if not has_clsact(ip, ifindex):
                continue
            we_created = False
            for direction, parent in PARENTS.items():
                for prio, handle, name in _filters(ip, ifindex, parent):
                    if _ours(name, owner):
                        _delete(ip, ifindex, parent, prio, handle)
                        we_created |= CREATED_MARK in name
                        removed.append(f"filter {name} on {ifname} {direction}")
            if we_created and drop_clsact_if_unused(ip, ifindex):
                removed.append(f"clsact qdisc on {ifname}")
    return removed


def hook_snapshot(netns=None):
    """{ifname: (has_clsact, sorted filters)} of a namespace, for tests and for
    showing what an attach changed."""
    snap = {}
    with ipr(netns) as ip:
        for link in ip.get_links():
            ifindex = link["index"]
            has = has_clsact(ip, ifindex)
            filters = sorted((d, p, h, n) for d, par in PARENTS.items() for p, h, n in _filters(ip, ifindex, par)) \
                if has else []
            snap[link.get_attr("IFLA_IFNAME")] = (has, filters)
    return snap

