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

import socket
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWTFILTER
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from .errors import AttachError

INGRESS, EGRESS = "ingress", "egress"
DIRECTIONS = (INGRESS, EGRESS)
PARENTS = {INGRESS: 0xFFFFFFF2, EGRESS: 0xFFFFFFF3}  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_{INGRESS,EGRESS})
CLSACT_HANDLE = 0xFFFF0000
ETH_P_ALL = 0x0003  # host order: pyroute2 applies htons
CREATED_MARK = "+clsact"
TCA_BPF_FLAG_ACT_DIRECT = 1
TC_ACT_UNSPEC = -1          # an action control of "continue": on to the next filter
TCA_EGRESS_MIRROR = 2       # tc_mirred.h eaction


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
    mirror_ifindex: int = 0  # classifier filters: where the filter's mirred action copies to
    failed_base: int = 0     # the action's failure count at the owner's last counter reset

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


def _bpf_filter(ip, ifindex, parent, prio, handle, prog_fd, name, mirror_ifindex=0, replace=False):
    """Add (or replace) one cls_bpf filter. mirror_ifindex=0: direct-action, the
    program's return value is the verdict. Otherwise the program is a classifier
    (0 = no match, -1 = match) and a match runs a mirred action that copies the
    frame to mirror_ifindex's egress, with control `continue` so that the frame
    then goes on to the next filter, as after a direct-action TC_ACT_UNSPEC.
    Built by hand because pyroute2 fixes a mirror's control to `pipe`, which
    would end classification after our filter."""
    opts = [["TCA_BPF_FD", prog_fd], ["TCA_BPF_NAME", name], ["TCA_BPF_CLASSID", 1]]
    if mirror_ifindex:
        parms = {"index": 0, "capab": 0, "action": TC_ACT_UNSPEC, "refcnt": 0, "bindcnt": 0,
                 "eaction": TCA_EGRESS_MIRROR, "ifindex": mirror_ifindex}
        act = {"attrs": [["TCA_ACT_KIND", "mirred"],
                         ["TCA_ACT_OPTIONS", {"attrs": [["TCA_MIRRED_PARMS", parms]]}]]}
        opts += [["TCA_BPF_FLAGS", 0], ["TCA_BPF_ACT", {"attrs": [["TCA_ACT_PRIO_1", act]]}]]
    else:
        opts.append(["TCA_BPF_FLAGS", TCA_BPF_FLAG_ACT_DIRECT])
    msg = tcmsg()
    msg["family"] = socket.AF_UNSPEC
    msg["index"], msg["handle"], msg["parent"] = ifindex, handle, parent
    msg["info"] = (prio << 16) | socket.htons(ETH_P_ALL)
    msg["attrs"] = [["TCA_KIND", "bpf"], ["TCA_OPTIONS", {"attrs": opts}]]
    flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_REPLACE if replace else NLM_F_CREATE | NLM_F_EXCL)
    # pyroute2 0.9's synchronous nlm_request reads status["nlm_generator"], which
    # its constructor never sets (KeyError): set it to "return a tuple".
    ip.status.setdefault("nlm_generator", False)
    ip.nlm_request(msg, msg_type=RTM_NEWTFILTER, msg_flags=flags)


def attach(netns, ifname, direction, prog_fd, prog_name, owner, mirror_ifindex=0) -> TcFilter:
    """Attach a cls_bpf filter (direct-action, or with a mirred action when
    mirror_ifindex is given, see _bpf_filter) where it sees frames first."""
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
            _bpf_filter(ip, ifindex, parent, prio, handle, prog_fd, name, mirror_ifindex)
        except NetlinkError as e:
            if created and not any(_filters(ip, ifindex, p) for p in PARENTS.values()):
                ip.tc("del", "clsact", index=ifindex)
            raise AttachError(f"attaching {prog_name} to {ifname} {direction}: {e.args[1] if len(e.args) > 1 else e}") from None
    return TcFilter(netns, ifname, ifindex, direction, prio, handle, name, runs_after, mirror_ifindex)


def retarget(f: TcFilter, prog_fd, mirror_ifindex):
    """Point a classifier filter's mirred action at another interface, in place:
    the kernel swaps the filter atomically, so no frame misses the tap."""
    with ipr(f.netns) as ip:
        try:
            _bpf_filter(ip, f.ifindex, PARENTS[f.direction], f.prio, f.handle, prog_fd, f.name,
                        mirror_ifindex, replace=True)
        except NetlinkError as e:
            raise AttachError(f"retargeting the mirror on {f.where}: {e}") from None
    f.mirror_ifindex = mirror_ifindex


NO_ACTION_STATS = {"packets": 0, "bytes": 0, "failed": 0}


def first_action_stats(msg) -> dict | None:
    """Counters of the first action on a dumped filter (cls_bpf or u32): packets
    and bytes it ran on, and failures (overlimits: for mirred, the monitor is
    gone or refused the copy; drops). None when the filter has no action."""
    opts = msg.get_attr("TCA_OPTIONS")
    if opts is None:
        return None
    acts = opts.get_attr("TCA_BPF_ACT") or opts.get_attr("TCA_U32_ACT")
    for act in (acts.get_attrs("TCA_ACT_PRIO_1") if acts else []):
        stats = act.get_attr("TCA_ACT_STATS")
        basic = stats.get_attr("TCA_STATS_BASIC") if stats is not None else None
        queue = stats.get_attr("TCA_STATS_QUEUE") if stats is not None else None
        return {"packets": basic["packets"] if basic else 0, "bytes": basic["bytes"] if basic else 0,
                "failed": (queue["overlimits"] + queue["drops"]) if queue else 0}
    return None


def action_stats(f: TcFilter) -> dict:
    """first_action_stats() of one filter we attached."""
    with ipr(f.netns) as ip:
        for msg in _filter_msgs(ip, f.ifindex, PARENTS[f.direction]):
            if msg["info"] >> 16 == f.prio and msg["handle"] == f.handle:
                return first_action_stats(msg) or NO_ACTION_STATS
    return NO_ACTION_STATS


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

