"""The copies a vTAP's mirred action refused, kept exactly.

On the action path (the default) the program counts what it hands to the
filter's mirred action as cloned, and the action counts its own refusals
(monitor gone or down). User space moves those from `cloned` to `failed`, and
their bytes and wire packets out of cloned_bytes and cloned_segs: exactly when
every copy handed over between two reads failed (or none did), and at that
interval's mean size when only some did. A filter that is detached or swapped
(a new monitor) takes its action's count with it, so that count is kept here
first; a filter removed from outside keeps the count it had when last read."""

from collections import defaultdict

from ebpf import tc


def action_failures(f):
    """Copies the filter's mirred action refused since the last reset."""
    if not f.mirror_ifindex:
        return 0
    entry = tc.find(f)
    if entry is not None:
        f.failed_seen = max(0, (tc.first_action_stats(entry.msg) or tc.NO_ACTION_STATS)["failed"] - f.failed_base)
    return f.failed_seen


class FailureLedger:
    """Per counter slot: the failures of filters no longer there, and what the
    failures moved so far took from cloned_bytes and cloned_segs."""

    def __init__(self):
        self.kept = defaultdict(int)  # slot -> failures of filters detached or swapped since the reset
        self.moved = {}  # slot -> what moving them has taken so far

    def keep(self, slot, failed):
        self.kept[slot] += failed

    def failed(self, filters, slot_of):
        """{slot: failures}, the kept ones and the live filters' (read before the
        program's counters: a failure never runs ahead of its copy)."""
        out = defaultdict(int, self.kept)
        for f in filters:
            out[slot_of(f.ifindex)] += action_failures(f)
        return out

    def move(self, slot, c, failed):
        """Move `failed` of slot's counters `c` (as the program counts them) from
        cloned to failed, in place."""
        led = self.moved.setdefault(
            slot, {"handed": 0, "bytes": 0, "segs": 0, "failed": 0, "failed_bytes": 0, "failed_segs": 0}
        )
        new_failed, handed = failed - led["failed"], c["cloned"] - led["handed"]
        if new_failed > 0 and c["cloned"]:
            if handed > 0:  # the failures came from this interval's copies
                share = min(new_failed, handed) / handed
                led["failed_bytes"] += round((c["cloned_bytes"] - led["bytes"]) * share)
                led["failed_segs"] += round((c["cloned_segs"] - led["segs"]) * share)
            else:  # copies handed before the last read: at the mean size so far
                led["failed_bytes"] += round(c["cloned_bytes"] / c["cloned"] * new_failed)
                led["failed_segs"] += round(c["cloned_segs"] / c["cloned"] * new_failed)
        led.update(handed=c["cloned"], bytes=c["cloned_bytes"], segs=c["cloned_segs"], failed=failed)
        c["cloned"] -= failed
        c["failed"] += failed
        c["cloned_bytes"] = max(0, c["cloned_bytes"] - led["failed_bytes"])
        c["cloned_segs"] = max(0, c["cloned_segs"] - led["failed_segs"])
