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
- A program that acts on frames (a load balancer) goes last instead (first=False):
  after every filter there, so that observers see its frames before it sends them
  on; it hands what is not its own on with TC_ACT_UNSPEC, to the filters after it.
  On an empty hook it takes tc's own first priority (49152), which leaves an
  observer room to go before it.
- Detach removes only our filter: the one at our priority and handle that runs
  our program (by the kernel's program id, which no other load can share), so a
  later instance that reused the slot is never touched. The clsact qdisc goes too
  only if we created it and no filter (ours or anybody's) is left on its hooks.
- A filter whose program no process holds any more is an orphan (its owner was
  killed): cleanup removes orphans and spares live instances (see holders.py).
"""

import errno
import socket
from dataclasses import dataclass

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWTFILTER
from pyroute2.netlink.rtnl.tcmsg import sched_bpf, tcmsg

from ebpf.errors import AttachError, NoSuchNamespace
from ebpf.holders import holders
from ebpf.holders import prog_id as program_id
from ebpf.netdev import EGRESS, INGRESS, ifindex_of, ipr, netlink_reason

DIRECTIONS = (INGRESS, EGRESS)
PARENTS = {INGRESS: 0xFFFFFFF2, EGRESS: 0xFFFFFFF3}  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_{INGRESS,EGRESS})
CLSACT_HANDLE = 0xFFFF0000
ETH_P_ALL = 0x0003  # host order: pyroute2 applies htons
CREATED_MARK = "+clsact"
TCA_BPF_FLAG_ACT_DIRECT = 1
TC_ACT_UNSPEC = -1  # an action control of "continue": on to the next filter
TCA_EGRESS_MIRROR = 2  # tc_mirred.h eaction


def _decode_program_ids():
    """pyroute2 0.9 stops decoding cls_bpf options at TCA_BPF_FLAGS; the kernel
    also reports TCA_BPF_FLAGS_GEN, TCA_BPF_TAG and TCA_BPF_ID (the program's id),
    which is how we recognise our own filter. Extend its table once, before use."""
    o = sched_bpf.options
    if not any(name == "TCA_BPF_ID" for name, _ in o.nla_map):
        o.nla_map = o.nla_map + (("TCA_BPF_FLAGS_GEN", "uint32"), ("TCA_BPF_TAG", "hex"), ("TCA_BPF_ID", "uint32"))
        o._nlmsg_base__compiled_nla = False  # recompiled from the new table at next use


_decode_program_ids()


@dataclass
class TcFilter:
    netns: str | None
    ifname: str
    ifindex: int
    direction: str
    prio: int
    handle: int
    name: str
    runs_after: int = 0  # priorities of other filters that see frames before ours (and may stop them)
    mirror_ifindex: int = 0  # classifier filters: where the filter's mirred action copies to
    failed_base: int = 0  # the action's failure count at the owner's last counter reset
    failed_seen: int = 0  # failures since then, as last read (kept if the filter vanishes)
    prog_id: int = 0  # the kernel's id of the program: what makes this filter ours

    @property
    def where(self):
        ns = f" in netns {self.netns}" if self.netns else ""
        return f"{self.ifname} {self.direction}{ns}"


@dataclass
class Entry:
    """One filter as the kernel dumps it."""

    prio: int
    handle: int
    name: str  # cls_bpf's name ("" for other kinds)
    prog_id: int  # cls_bpf's program id (0 for other kinds)
    msg: object  # the dumped message (actions and their counters)

    @property
    def mirror_ifindex(self):
        """Where this filter's mirred action copies to, or 0."""
        act = first_action(self.msg)
        opts = act.get_attr("TCA_ACT_OPTIONS") if act is not None else None
        parms = opts.get_attr("TCA_MIRRED_PARMS") if opts is not None else None
        return parms["ifindex"] if parms else 0


def _filter_msgs(ip, ifindex, parent):
    for msg in ip.get_filters(index=ifindex, parent=parent):
        if msg["handle"]:  # handle 0: the per-priority header entry, not a filter
            yield msg


def entries(ip, ifindex, parent) -> list[Entry]:
    """Every filter on one clsact hook."""
    out = []
    for msg in _filter_msgs(ip, ifindex, parent):
        opts = msg.get_attr("TCA_OPTIONS")
        bpf = opts is not None and msg.get_attr("TCA_KIND") == "bpf"
        out.append(
            Entry(
                msg["info"] >> 16,
                msg["handle"],
                (opts.get_attr("TCA_BPF_NAME") if bpf else None) or "",
                (opts.get_attr("TCA_BPF_ID") if bpf else None) or 0,
                msg,
            )
        )
    return out


def _filters(ip, ifindex, parent):
    """(prio, handle, name) of every filter on one clsact hook."""
    return [(e.prio, e.handle, e.name) for e in entries(ip, ifindex, parent)]


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


LAST_BASE = 0xC000  # tc's first automatic priority: a filter added last on an empty hook takes it


def _place_last(ip, ifindex, parent):
    """(prio, handle, runs_after) for a new filter that should see frames after every other."""
    prios = {m["info"] >> 16 for m in _filter_msgs(ip, ifindex, parent)}
    if not prios:
        return LAST_BASE, 1, 0
    prio = max(prios) + 1 if max(prios) < 0xFFFF else next(p for p in range(0xFFFF, 0, -1) if p not in prios)
    return prio, 1, sum(1 for p in prios if p < prio)


def has_clsact(ip, ifindex):
    return any(q.get_attr("TCA_KIND") == "clsact" for q in ip.get_qdiscs(index=ifindex))


def owned_by(name, owner):
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
        parms = {
            "index": 0,
            "capab": 0,
            "action": TC_ACT_UNSPEC,
            "refcnt": 0,
            "bindcnt": 0,
            "eaction": TCA_EGRESS_MIRROR,
            "ifindex": mirror_ifindex,
        }
        act = {"attrs": [["TCA_ACT_KIND", "mirred"], ["TCA_ACT_OPTIONS", {"attrs": [["TCA_MIRRED_PARMS", parms]]}]]}
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


def attach(netns, ifname, direction, prog_fd, prog_name, owner, mirror_ifindex=0, first=True) -> TcFilter:
    """Attach a cls_bpf filter (direct-action, or with a mirred action when
    mirror_ifindex is given, see _bpf_filter) where it sees frames first, or with
    first=False after every other filter (see the module's rules)."""
    if direction not in DIRECTIONS:
        raise AttachError(f"unknown direction {direction!r} (ingress or egress)")
    parent = PARENTS[direction]
    prog_id = program_id(prog_fd)
    with ipr(netns) as ip:
        ifindex = ifindex_of(ip, ifname, netns)
        created = False
        try:
            if not has_clsact(ip, ifindex):
                try:
                    ip.tc("add", "clsact", index=ifindex)
                    created = True
                except NetlinkError as e:
                    if e.code != errno.EEXIST:  # EEXIST: another instance made it since we looked
                        raise
            if not created:
                # A sibling attach of ours may have created it: inherit its mark so
                # whichever of our filters goes last also removes the qdisc.
                created = any(
                    owned_by(n, owner) and CREATED_MARK in n
                    for p in PARENTS.values()
                    for _, _, n in _filters(ip, ifindex, p)
                )
            name = f"{owner}{CREATED_MARK if created else ''}:{prog_name}"
            for attempt in range(3):
                prio, handle, runs_after = (_place if first else _place_last)(ip, ifindex, parent)
                try:
                    _bpf_filter(ip, ifindex, parent, prio, handle, prog_fd, name, mirror_ifindex)
                    break
                except NetlinkError as e:
                    # Another instance took the same slot between our dump and our
                    # add (two vTAPs started at once): place again.
                    if e.code != errno.EEXIST or attempt == 2:
                        raise
        except NetlinkError as e:
            if created and not any(_filters(ip, ifindex, p) for p in PARENTS.values()):
                ip.tc("del", "clsact", index=ifindex)
            raise AttachError(f"attaching {prog_name} to {ifname} {direction}: {netlink_reason(e)}") from None
    return TcFilter(netns, ifname, ifindex, direction, prio, handle, name, runs_after, mirror_ifindex, prog_id=prog_id)


def retarget(f: TcFilter, prog_fd, mirror_ifindex):
    """Point a classifier filter's mirred action at another interface, in place:
    the kernel swaps the filter atomically, so no frame misses the tap."""
    with ipr(f.netns) as ip:
        try:
            _bpf_filter(
                ip, f.ifindex, PARENTS[f.direction], f.prio, f.handle, prog_fd, f.name, mirror_ifindex, replace=True
            )
        except NetlinkError as e:
            raise AttachError(f"retargeting the mirror on {f.where}: {netlink_reason(e)}") from None
    f.mirror_ifindex = mirror_ifindex


def replace(netns, found: "Found", prog_fd, prog_name, owner) -> TcFilter:
    """Put a direct-action program in place of a filter found on a hook (its priority
    and handle, in one step: every frame meets one program or the other). Keeps the
    found filter's mark of a clsact qdisc we created."""
    created = CREATED_MARK in found.entry.name
    name = f"{owner}{CREATED_MARK if created else ''}:{prog_name}"
    with ipr(netns) as ip:
        try:
            _bpf_filter(
                ip,
                found.ifindex,
                PARENTS[found.direction],
                found.entry.prio,
                found.entry.handle,
                prog_fd,
                name,
                replace=True,
            )
        except NetlinkError as e:
            raise AttachError(f"replacing {found.entry.name} on {found.where}: {netlink_reason(e)}") from None
    return adopt(netns, found, program_id(prog_fd), name)


def adopt(netns, found: "Found", prog_id, name=None) -> TcFilter:
    """A filter found on a hook, as one of ours (to detach it later, or keep it); name: the
    one it carries now, if not the found one's."""
    with ipr(netns) as ip:
        prios = {m["info"] >> 16 for m in _filter_msgs(ip, found.ifindex, PARENTS[found.direction])}
    e = found.entry
    return TcFilter(
        netns,
        found.ifname,
        found.ifindex,
        found.direction,
        e.prio,
        e.handle,
        name or e.name,
        sum(1 for p in prios if p < e.prio),
        prog_id=prog_id,
    )


NO_ACTION_STATS = {"packets": 0, "bytes": 0, "failed": 0}


def first_action(msg):
    """The first action of a dumped filter (cls_bpf or u32), or None."""
    opts = msg.get_attr("TCA_OPTIONS")
    acts = (opts.get_attr("TCA_BPF_ACT") or opts.get_attr("TCA_U32_ACT")) if opts is not None else None
    return next(iter(acts.get_attrs("TCA_ACT_PRIO_1")), None) if acts else None


def first_action_stats(msg) -> dict | None:
    """Counters of the first action on a dumped filter (cls_bpf or u32): packets
    and bytes it ran on, and failures (overlimits: for mirred, the monitor is
    gone, down or refused the copy; drops). None when the filter has no action."""
    act = first_action(msg)
    if act is None:
        return None
    stats = act.get_attr("TCA_ACT_STATS")
    basic = stats.get_attr("TCA_STATS_BASIC") if stats is not None else None
    queue = stats.get_attr("TCA_STATS_QUEUE") if stats is not None else None
    return {
        "packets": basic["packets"] if basic else 0,
        "bytes": basic["bytes"] if basic else 0,
        "failed": (queue["overlimits"] + queue["drops"]) if queue else 0,
    }


def _is_ours(f: TcFilter, e: Entry):
    return (e.prio, e.handle, e.name, e.prog_id) == (f.prio, f.handle, f.name, f.prog_id)


def find(f: TcFilter) -> Entry | None:
    """The kernel's view of one filter we attached, or None when it is gone
    (removed from outside, or its interface or namespace deleted)."""
    try:
        with ipr(f.netns) as ip:
            if not ip.link_lookup(index=f.ifindex):
                return None
            return next((e for e in entries(ip, f.ifindex, PARENTS[f.direction]) if _is_ours(f, e)), None)
    except (FileNotFoundError, NoSuchNamespace):
        return None


def action_stats(f: TcFilter) -> dict:
    """first_action_stats() of one filter we attached."""
    e = find(f)
    return (first_action_stats(e.msg) if e else None) or NO_ACTION_STATS


def _delete(ip, ifindex, parent, prio, handle):
    ip.tc("del-filter", "bpf", index=ifindex, parent=parent, prio=prio, handle=handle, protocol=ETH_P_ALL)


def drop_clsact_if_unused(ip, ifindex) -> bool:
    if has_clsact(ip, ifindex) and not any(_filters(ip, ifindex, p) for p in PARENTS.values()):
        ip.tc("del", "clsact", index=ifindex)
        return True
    return False


def detach(f: TcFilter) -> bool:
    """Remove one filter we attached: only if it still runs our program, so a
    filter somebody else put in the same slot since is left alone. Quietly done if
    the device or filter is gone (a namespace torn down first, an interface
    deleted, a cleanup). Returns whether it removed our filter."""
    if find(f) is None:
        return False
    try:
        with ipr(f.netns) as ip:
            _delete(ip, f.ifindex, PARENTS[f.direction], f.prio, f.handle)
            if CREATED_MARK in f.name:
                drop_clsact_if_unused(ip, f.ifindex)
            return True
    except (FileNotFoundError, NoSuchNamespace):
        return False  # the namespace went in the meantime, and everything in it
    except NetlinkError as e:
        if e.code == errno.ENOENT:  # the filter or its device went in the meantime
            return False
        raise AttachError(f"detaching from {f.where}: {netlink_reason(e)}") from None


@dataclass
class Found:
    """A filter named for an owner, as found on some hook of a namespace."""

    ifname: str
    ifindex: int
    direction: str
    entry: Entry
    pids: list  # processes holding its program: empty for an orphan

    @property
    def where(self):
        return f"{self.ifname} {self.direction}"

    @property
    def live(self):
        return bool(self.pids)


def filters_of(owner, netns=None, ifindex=None, direction=None) -> list[Found]:
    """Every filter named for `owner` in a namespace (or on one interface or hook),
    with the processes that hold its program."""
    found = []
    with ipr(netns) as ip:
        for link in ip.get_links(*([ifindex] if ifindex else [])):
            idx, ifname = link["index"], link.get_attr("IFLA_IFNAME")
            if not has_clsact(ip, idx):
                continue
            for d, parent in PARENTS.items():
                if direction in (None, d):
                    found += [Found(ifname, idx, d, e, []) for e in entries(ip, idx, parent) if owned_by(e.name, owner)]
    pids = holders(f.entry.prog_id for f in found if f.entry.prog_id)
    for f in found:
        f.pids = pids.get(f.entry.prog_id, [])
    return found


def cleanup(owner, netns=None, spare_live=True) -> tuple[list[str], list[Found]]:
    """Remove the filters named for `owner` in a namespace whose program no
    process holds any more (what a killed process left behind), and the clsact
    qdiscs it created that are now empty. With spare_live=False, remove the
    filters of running instances too. Returns (a description of each thing
    removed, the live filters left alone). Touches nothing else."""
    removed, spared = [], []
    found = filters_of(owner, netns)
    with ipr(netns) as ip:
        for f in found:
            if f.live and spare_live:
                spared.append(f)
                continue
            try:
                _delete(ip, f.ifindex, PARENTS[f.direction], f.entry.prio, f.entry.handle)
            except NetlinkError as e:
                raise AttachError(f"removing filter {f.entry.name} on {f.where}: {netlink_reason(e)}") from None
            removed.append(
                f"filter {f.entry.name} on {f.where}"
                + (f" (live: pid {', '.join(map(str, f.pids))})" if f.live else "")
            )
        for ifindex in sorted({f.ifindex for f in found if CREATED_MARK in f.entry.name}):
            if drop_clsact_if_unused(ip, ifindex):
                removed.append(f"clsact qdisc on {next(f.ifname for f in found if f.ifindex == ifindex)}")
    return removed, spared


def cleanup_one(netns, f: Found) -> None:
    """Remove one filter filters_of() found (a kept program another one replaces), and
    the clsact qdisc with it when we created that and nothing else is left on it."""
    with ipr(netns) as ip:
        try:
            _delete(ip, f.ifindex, PARENTS[f.direction], f.entry.prio, f.entry.handle)
        except NetlinkError as e:
            if e.code != errno.ENOENT:
                raise AttachError(f"removing filter {f.entry.name} on {f.where}: {netlink_reason(e)}") from None
        if CREATED_MARK in f.entry.name:
            drop_clsact_if_unused(ip, f.ifindex)


def hook_snapshot(netns=None):
    """{ifname: (has_clsact, sorted filters)} of a namespace, for tests and for
    showing what an attach changed."""
    snap = {}
    with ipr(netns) as ip:
        for link in ip.get_links():
            ifindex = link["index"]
            has = has_clsact(ip, ifindex)
            filters = (
                sorted((d, p, h, n) for d, par in PARENTS.items() for p, h, n in _filters(ip, ifindex, par))
                if has
                else []
            )
            snap[link.get_attr("IFLA_IFNAME")] = (has, filters)
    return snap
