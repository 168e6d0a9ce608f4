"""BpfProgram: the base of every kernel program class in this package.

A subclass names its C file (kept beside it) and the functions it loads; the base
compiles the C with BCC (once: ebpf/images.py keeps the result), turns clang and verifier failures into one-line
exceptions that keep the log, attaches to TC clsact and XDP hooks, sums per-CPU counters,
and detaches everything on close() or at the end of a `with` block.

    >>> with SomeProgram(...) as prog:          # doctest: +SKIP
    ...     prog.attach(...)
    ...     print(prog.counters())
"""

import contextlib
import ctypes
import inspect
import os
import sys
from pathlib import Path

from ebpf import cgroup, images, interrupts, loader, netdev, objinfo, privileges, tc, xdp
from ebpf.abi import defines
from ebpf.compiler import _BCC_LOCK, import_bcc, stderr_to
from ebpf.display import Shown
from ebpf.errors import (
    AttachError,
    BpfError,
    InputError,
    KeptDatapathMismatch,
    PrivilegeError,
)
from ebpf.holders import holders

HERE = Path(__file__).resolve().parent
INCLUDE = HERE / "include"  # headers every program may use: parsing, checksums, rewriting, the one exit


def _names(prefix):
    """The verdicts (V_) or reasons (R_) of include/verdict.h, lowercase, by index."""
    found = sorted(
        (v, n)
        for n, v in defines("include/verdict.h").items()
        if n.startswith(prefix) and n not in (prefix + "COUNT", prefix + "SLOTS")
    )
    return [n[len(prefix) :].lower() for _, n in found]


VERDICTS = _names("V_")  # what a program did with a frame: pass, drop, tx, redirect, mirror, aborted
REASONS = _names("R_")  # why: not_ip, malformed, fragment, unmatched, ...


def refuse_live(ifname, function, pids):
    """A program on the hook that a live process holds (another controller, or another
    object of this one) is that process's: refused, nothing changed."""
    if pids:
        raise AttachError(
            f"{ifname} already runs {function} (pid {', '.join(map(str, pids))}): stop that one first; nothing changed"
        )


def _inline(text, source, header, header_text) -> str:
    """`text` with its line `#include "header"` replaced by the header's text
    (see BpfProgram.INLINE)."""
    lines = text.split("\n")
    at = [i for i, ln in enumerate(lines) if ln.startswith(f'#include "{header}"')]
    if len(at) != 1:
        raise BpfError(f"{source} must include {header} once, on a line of its own (it includes it {len(at)} times)")
    i = at[0]
    lines[i : i + 1] = [f'#line 1 "{header}"', header_text.rstrip("\n"), f'#line {i + 2} "{source}"']
    return "\n".join(lines)


def _exits(fps) -> dict:
    """A struct fp_counts per CPU, summed and named."""
    return {
        "seen": sum(f.seen for f in fps),
        "verdict": {n: sum(f.verdict[i] for f in fps) for i, n in enumerate(VERDICTS)},
        "reason": {n: sum(f.reason[i] for f in fps) for i, n in enumerate(REASONS)},
        "dropped": {n: sum(f.dropped[i] for f in fps) for i, n in enumerate(REASONS)},
    }


class BpfProgram(Shown):
    """Base class: compile, load, attach, read counters, detach.

    Subclasses set SOURCE (a file name beside the subclass's module, wherever
    that module lives) and pass -D parameters to __init__. `source` overrides the
    C file, for developing an extension of a program without editing the
    package. The C text sees two include directories: the class's own (for the
    program's header, e.g. vtap.h) and ebpf/include (the shared headers).
    """

    SOURCE: str = ""
    ROWS = "total"  # what counter_rows() is per: "interface", "backend", "rule", ...
    MAIN_COUNTERS: tuple = ()  # the counters repr() shows (all of them when empty)
    # Which of verdict.h's verdicts and reasons the program gives, in the order
    # its counters show them; DROPS: the reasons it drops for, each also counted
    # as dropped_<reason>. exits() has them all, for checking these lists.
    VERDICTS: tuple = ()
    REASONS: tuple = ()
    DROPS: tuple = ()
    # Headers beside the class that share code using BCC's map syntax
    # (`map.lookup()`): BCC turns that into a helper call only in the text it
    # compiles, not in an included file (there it stays an indirect call, which
    # BPF has not: the verifier's "unknown opcode 8d"). So their text is pasted
    # where the source includes them, with #line marks that keep compiler
    # errors pointing at the header's own lines.
    INLINE: tuple = ()
    # Where compile() runs BCC when the compile is not kept yet (ebpf/images.py):
    # "process" (here), or "child": a short-lived child compiles, and this process never
    # maps the compiler (ebpf/loader.py): a long-running controller's choice (lab lb),
    # 60-160 MB less resident. Either way the maps are created and the functions
    # loaded here, from the compile's image, through libbpf (ebpf/maps.py's tables).
    compile_in = "process"

    def __init__(self, cflags=(), source=None):
        here = Path(inspect.getfile(type(self))).resolve().parent
        self.source_path = Path(source) if source else here / self.SOURCE
        self.cflags = [f"-I{here}", f"-I{INCLUDE}", *cflags]
        self.bpf = None
        self._functions = {}
        self._tc_filters = []
        self._xdp = []
        self._cgroups = []  # ebpf.cgroup attachments
        self._offloaded = {}  # ifname -> (BPF object loaded for that device, its function)

    # --- building -----------------------------------------------------------
    def c_text(self) -> str:
        """The C text as BCC compiles it: the source, with each header of INLINE
        pasted where the source includes it."""
        try:
            text = self.source_path.read_text()
            for name in self.INLINE:
                text = _inline(text, self.source_path.name, name, self._inline_path(name).read_text())
        except OSError as e:
            raise BpfError(f"cannot read {e.filename}: {e.strerror}") from None
        return text

    def _inline_path(self, name) -> Path:
        """An INLINE header lives beside the class that names it (a subclass
        elsewhere, or `source=`, still finds it)."""
        for cls in type(self).__mro__:
            if name in vars(cls).get("INLINE", ()):
                return Path(inspect.getfile(cls)).resolve().parent / name
        raise BpfError(f"{name} is named by no INLINE of {type(self).__name__}")

    def compile(self):
        """Compile the C text with BCC, or take the image a compile of the same inputs
        left (ebpf/images.py); create the maps (programs not loaded yet), then let the
        subclass fill them (maps_created)."""
        if self.bpf is not None:
            return self.bpf
        text = self.c_text()
        lacking = privileges.message()
        if lacking:  # else creating the first map fails, with an error about that map
            raise PrivilegeError(lacking)
        key = images.key(text, self.cflags)
        image = images.stored(key)
        if image is None:
            compile_ = loader.compile_in_child if self.compile_in == "child" else loader.compile_here
            image = compile_(text, self.cflags, self.source_path.name)
            images.store(key, image)
        self.bpf = images.Loaded(image)
        try:
            self.maps_created()
        except BaseException:
            self.bpf.cleanup()
            self.bpf = None
            raise
        return self.bpf

    def maps_created(self):
        """Called once, right after compile() created the maps, whatever first
        needed them (a load, a counter read): subclasses write their initial
        configuration here, so no path can see the maps empty."""

    def load(self, function: str, prog_type: str, attach_type=None):
        """Load one function of the program ("SCHED_CLS", "XDP", ...) through the
        verifier; a rejection raises VerifierError with the verifier's reason.
        attach_type: BCC's name of the expected attach type, which the kernel needs at
        load for cgroup socket-address programs ("CGROUP_INET4_CONNECT", ...)."""
        if function in self._functions:
            return self._functions[function]
        fn = self.compile().load_func(function, prog_type, attach_type)
        self._functions[function] = fn
        return fn

    # --- attaching ----------------------------------------------------------
    def attach_tc(
        self, function: str, ifname: str, direction: str, netns=None, owner="ebpf", mirror_ifindex=0, first=True
    ):
        """Attach `function` as a cls_bpf filter on ifname's clsact ingress or
        egress hook, next to whatever filters are already there: direct-action,
        or with mirror_ifindex a classifier whose matches a mirred action copies
        to that interface (see tc._bpf_filter). first: before the filters there
        (an observer's place), else after them (see ebpf/tc.py)."""
        self.refuse_reattach_tc(function, ifname, (direction,), netns)
        fn = self.load(function, "SCHED_CLS")
        with interrupts.held():  # attached and recorded, or neither
            f = tc.attach(netns, ifname, direction, fn.fd, function, owner, mirror_ifindex, first)
            self._tc_filters.append(f)
        return f

    def refuse_reattach_tc(self, function, ifname, directions, netns=None):
        """A second filter of this object on the same hook would run the program
        twice on every frame (a re-run notebook cell, a repeated call): refused,
        before anything changes."""
        for f in self._tc_filters:
            named = f.name == function or f.name.endswith(":" + function)  # tc names it owner+clsact:function
            if named and f.ifname == ifname and f.direction in directions and f.netns == netns:
                raise InputError(
                    f"{type(self).__name__} is already attached to {ifname} {f.direction}"
                    f"{' in netns ' + netns if netns else ''}: attaching again would run it twice "
                    "on every frame; nothing changed (detach or close() it first)"
                )

    # Subclasses that attach per interface override these two; attach_many() is theirs too.
    netns = None  # the namespace the object attaches in (None: this one)

    def check_iface(self, ifname, *how):
        """Raise a one-line error when `ifname` cannot be attached to (the base:
        it does not exist), before anything is attached."""
        with netdev.ipr(self.netns) as ip:
            netdev.ifindex_of(ip, ifname, self.netns)

    def attach(self, ifname, *how):
        raise NotImplementedError(f"{type(self).__name__} attaches with its own methods")

    def attach_many(self, ifnames, *how):
        """Attach to several interfaces, all or nothing: every name is checked
        (check_iface) before anything is attached, and on any failure, an
        interrupt included, what this call attached is detached again before
        the error is raised. `how`: attach()'s other arguments (a direction, an
        XDP mode). Returns the hooks attached."""
        for ifname in ifnames:
            self.check_iface(ifname, *how)
        done = []
        try:
            for ifname in ifnames:
                got = self.attach(ifname, *how)
                done += got if isinstance(got, list) else [got]
        except BaseException:
            for hook in reversed(done):
                if hook in self._tc_filters:
                    self.detach_tc(hook)
                elif hook in self._xdp:
                    self.detach_xdp(hook)
            raise
        return done

    def attach_cgroup(self, function: str, path, attach_type: str):
        """Attach a cgroup program (a socket-address hook: attach_type is one of
        ebpf.cgroup.ATTACH_TYPES) to the cgroup v2 directory `path`, beside what is there."""
        fn = self.load(function, "CGROUP_SOCK_ADDR", attach_type)
        with interrupts.held():  # attached and recorded, or neither
            a = cgroup.attach(fn.fd, path, attach_type, function)
            self._cgroups.append(a)
        return a

    def detach_tc(self, f):
        with interrupts.held():
            tc.detach(f)
            self._tc_filters.remove(f)

    def forget_tc(self, f):
        """Off a hook whose interface may be gone (a pod's veth deleted took its filter
        with it): detached where it is still there, forgotten either way."""
        with interrupts.held():
            try:
                tc.detach(f)
            except Exception:
                if tc.find(f) is not None:  # still there: a real failure, and still ours to detach
                    raise
            if f in self._tc_filters:
                self._tc_filters.remove(f)

    @property
    def tc_filters(self):
        return list(self._tc_filters)

    def attach_xdp(self, function: str, ifname: str, netns=None, mode="native"):
        """Attach `function` to ifname's XDP hook (refused if a program is there),
        in mode native, generic or offload (see xdp.py)."""
        fn = self._load_offloaded(function, ifname, netns) if mode == "offload" else self.load(function, "XDP")
        self._tell_skb_mode(mode)  # first: a second mode is refused for what it is, wherever
        for a in self._xdp:
            if a.ifname == ifname and a.netns == netns:
                raise InputError(
                    f"{type(self).__name__} is already attached to {a.where}: nothing changed "
                    "(detach or close() it first)"
                )
        with interrupts.held():
            a = xdp.attach(netns, ifname, fn.fd, mode)
            self._xdp.append(a)
        return a

    def _tell_skb_mode(self, mode):
        """A program that rewrites TCP/UDP declares a map `skb_mode` (one u32):
        in generic mode every frame leaves as an skb, which carries a partial
        checksum on for the kernel to finish; natively XDP_TX and XDP_REDIRECT do
        not, so the program finishes it (ebpf/include/csum_helpers.h). One
        program object runs in one mode: the flag is the program's, not a hook's."""
        try:
            flag = self.table("skb_mode")
        except KeyError:
            return
        generic = mode == "generic"
        for a in self._xdp:
            if (a.mode == "generic") != generic:
                raise InputError(
                    f"attaching in {mode} mode: this program is already attached in {a.mode} mode "
                    f"at {a.where}; one program runs in one XDP mode (load another for the other)"
                )
        flag[flag.Key(0)] = flag.Leaf(int(generic))

    def _load_offloaded(self, function, ifname, netns):
        """Offload is decided when the program is loaded: the kernel hands it (and
        its maps) to the device's driver, which translates it for the NIC. So the
        C text is compiled again, for that device; a device that cannot run BPF
        refuses here, and the error says so with the kernel's reason."""
        if ifname in self._offloaded:
            return self._offloaded[ifname][1]
        BPF = import_bcc()
        log = []
        try:
            with _BCC_LOCK, netdev.entered(netns) if netns else contextlib.nullcontext(), stderr_to(log):
                bpf = BPF(text=self.c_text().encode(), cflags=self.cflags, device=ifname.encode())
                fn = bpf.load_func(function.encode(), BPF.XDP, device=ifname.encode())
        except Exception as e:
            # libbpf says why on stderr ("could not open bpf map: stats, error:
            # Invalid argument"): the errno text ends its last line
            said = [ln for ln in "".join(log).splitlines() if ln.strip()]
            reason = said[-1].rsplit(":", 1)[-1].strip() if said else str(e)
            what = "creating its maps on the device" if said and "map" in said[-1] else "loading it for the device"
            raise AttachError(f"offloading {function} to {ifname}: {xdp.OFFLOAD_NEEDS}: {reason} ({what})") from None
        self._offloaded[ifname] = (bpf, fn)
        return fn

    @property
    def xdp_attachments(self):
        return list(self._xdp)

    # --- a datapath left attached: kept, or its process killed -----------------------------
    # close() leaves the XDP hooks and TC filters attached and serving when this is set: the program holds
    # its maps, so sessions and counters live on with it, for a later object to take over
    # (take_over_xdp). Nothing is pinned: a bpffs that outlives the process is not there
    # everywhere (`ip netns exec` mounts a fresh /sys, hiding /sys/fs/bpf).
    keep_attached = False

    def kept_xdp(self, function, ifname, netns=None):
        """(ifindex, mode, program id, pids holding it) of a program named `function` on
        ifname's XDP hook, or None when its hook has none (another program's is not ours)."""
        mine = {objinfo.prog(a.prog_fd).id for a in self._xdp}
        for name, ifindex, mode, pid in xdp.attached(netns):
            if name == ifname and xdp.name_of(pid) == function[:15] and pid not in mine:
                return ifindex, mode, pid, holders([pid])[pid]  # this process too: another object's
        return None

    def take_over_xdp(self, function, ifname, netns=None, mode="native", check=None):
        """Become the program of this kind left attached to ifname, serving on: when it is
        what this object loads (the same tag, so the same C text and flags; the same maps)
        and `check({name: table on its maps})`, the subclass's, returns no reason against it,
        this object's program and maps are the kept ones from here on (each of its file
        descriptors is made to refer to the kept object: every table, the program, the
        hook's record), and close() detaches it as its own. Returns the attachment, or None
        when the hook runs no such program. KeptDatapathMismatch, with nothing changed,
        when it is not the same; AttachError when a live process (this one too) holds it."""
        found = self.kept_xdp(function, ifname, netns)
        if found is None:
            return None
        ifindex, their_mode, pid, live = found
        refuse_live(ifname, function, live)
        fn = self.load(function, "XDP")
        why = f"it runs in XDP {their_mode} mode, this one would in {mode}" if their_mode != mode else None

        def record():
            a = xdp.XdpAttachment(netns, ifname, ifindex, their_mode, fn.fd)
            self._xdp.append(a)
            return a

        return self._become(fn, pid, f"{ifname} runs a kept {function}", why, check, record)

    def kept_tc(self, function, ifname, owner, netns=None, direction="ingress"):
        """The filter named for `owner` that runs a program named `function` on ifname's
        hook and is not this object's (tc.Found: its processes in .pids), or None."""
        mine = {f.prog_id for f in self._tc_filters}
        with netdev.ipr(netns) as ip:
            ifindex = netdev.ifindex_of(ip, ifname, netns)  # an unknown interface: its one-line error
        for f in tc.filters_of(owner, netns, ifindex, direction):
            if f.entry.name.split(":", 1)[-1] == function and f.entry.prog_id not in mine:
                return f
        return None

    def take_over_tc(self, function, found, netns=None, check=None):
        """take_over_xdp() for a filter kept_tc() found: the same checks, and the filter
        recorded as this object's."""
        refuse_live(found.ifname, function, found.pids)
        fn = self.load(function, "SCHED_CLS")

        def record():
            f = tc.adopt(netns, found, found.entry.prog_id)
            self._tc_filters.append(f)
            return f

        return self._become(fn, found.entry.prog_id, f"{found.ifname} runs a kept {function}", None, check, record)

    def _become(self, fn, their_id, what, why, check, record):
        """This object's program `fn` and its maps made the kept program `their_id`'s, when
        `why` (the caller's reason against it) is None and the tag, the maps' shapes and
        `check` agree; then record() notes the hook as ours. Else KeptDatapathMismatch."""
        theirs = objinfo.prog_fd(their_id)
        maps = {}
        try:
            maps = objinfo.maps_of(theirs)
            ours = objinfo.maps_of(fn.fd)
            mine_shape = {n: m for n, (_, m) in ours.items()}
            for fd, _ in ours.values():
                os.close(fd)
            if why is None and objinfo.prog(theirs).tag != objinfo.prog(fn.fd).tag:
                why = (
                    f"its program is another (tag {objinfo.prog(theirs).tag}, this one's "
                    f"{objinfo.prog(fn.fd).tag}: another mode, table size or version)"
                )
            elif why is None and {n: m for n, (_, m) in maps.items()} != mine_shape:
                why = "its maps differ from this one's"
            if why is None and check is not None:
                why = check({n: self._table_on(n, fd) for n, (fd, _) in maps.items()})
            if why:
                raise KeptDatapathMismatch(f"{what} that this one cannot take over: {why}")
            with interrupts.held(), _BCC_LOCK:  # all of it, or none
                os.dup2(theirs, fn.fd)  # first: our own program, gone, lets go of our maps
                for name, (fd, _) in maps.items():
                    os.dup2(fd, self.table(name).map_fd)
                return record()
        finally:
            os.close(theirs)
            for fd, _ in maps.values():
                os.close(fd)

    def _table_on(self, name, fd):
        """One of this program's tables (its key and value types) on another map's fd."""
        return self.table(name).on_fd(fd)

    def detach(self):
        """Off every hook this object attached to; it stays loaded, to attach
        again (close() also frees it)."""
        for a in reversed(self._xdp):
            self.detach_xdp(a)
        for f in reversed(self._tc_filters):
            self.detach_tc(f)
        with interrupts.held():
            for a in reversed(self._cgroups):
                cgroup.detach(a)
            self._cgroups.clear()

    def detach_xdp(self, a):
        with interrupts.held():
            xdp.detach(a)
            self._xdp.remove(a)

    # --- maps ---------------------------------------------------------------
    def table(self, name: str):
        return self.compile()[name.encode()]  # BCC wants bytes; str is deprecated

    def percpu_totals(self, map_name: str, index: int = 0) -> dict:
        """Sum one entry of a per-CPU array of counter structs over all CPUs. A
        struct fp_counts (verdict.h) becomes seen, the program's VERDICTS and
        REASONS, and dropped_<reason> for its DROPS."""
        table = self.table(map_name)
        per_cpu = table.getvalue(table.Key(index))
        out = {}
        for name, _ in table.sLeaf._fields_:  # BCC: Leaf is the per-CPU array
            if name == "exits":
                e = _exits([v.exits for v in per_cpu])
                out["seen"] = e["seen"]
                out.update({v: e["verdict"][v] for v in self.VERDICTS})
                out.update({r: e["reason"][r] for r in self.REASONS})
                out.update({f"dropped_{r}": e["dropped"][r] for r in self.DROPS})
            else:
                first = getattr(per_cpu[0], name)
                if isinstance(first, ctypes.Structure):  # a group of counters (struct cut_counts): its fields
                    for sub, _ in first._fields_:
                        out[sub] = sum(getattr(getattr(v, name), sub) for v in per_cpu)
                else:
                    out[name] = sum(getattr(v, name) for v in per_cpu)
        return out

    def exits(self, map_name: str = "stats", index: int = 0) -> dict:
        """Every verdict and reason of one entry's struct fp_counts, all of
        verdict.h's names (zero or not): {"seen": n, "verdict": {name: n},
        "reason": {name: n}, "dropped": {name: n}}. For every program,
        seen == sum(verdict) == sum(reason)."""
        table = self.table(map_name)
        return _exits([v.exits for v in table.getvalue(table.Key(index))])

    def counter_rows(self) -> dict:
        """{row: {counter: value}}, one row per ROWS (per interface, backend,
        rule, ... as the program counts them); the base has one row, "total"."""
        return {"total": self.counters()}

    def zero_percpu(self, map_name: str, index: int = 0):
        table = self.table(map_name)
        table[table.Key(index)] = table.Leaf()  # the per-CPU array type, all zero

    # --- what it says ----------------------------------------------------------
    def warn(self, msg):
        """Say something the caller should know, in one line on stderr (a
        notebook shows it under the cell). A command line points this at its own."""
        print(f"{type(self).__name__}: warning: {msg}", file=sys.stderr, flush=True)

    def hooks(self) -> list[str]:
        """Where this object is attached, one string per hook."""
        out = [f"{f.ifname} {f.direction} (tc){' in netns ' + f.netns if f.netns else ''}" for f in self._tc_filters]
        return out + [a.where for a in self._xdp] + [a.where for a in self._cgroups]

    # --- lifecycle ----------------------------------------------------------
    def close(self):
        """Detach every hook this object attached, then free the programs and maps.
        Safe to call twice; a detach failure does not stop the others, nor
        does an interrupt (held until everything is detached)."""
        with interrupts.held():
            self._close()

    def _close(self):
        errors = []
        for f in reversed(self._tc_filters if not self.keep_attached else []):
            try:
                tc.detach(f)
            except Exception as e:  # keep going: leaving the rest attached is worse
                errors.append(f"{f.where}: {netdev.reason(e)}")
        self._tc_filters.clear()
        for a in reversed(self._xdp if not self.keep_attached else []):
            try:
                xdp.detach(a)
            except Exception as e:
                errors.append(f"{a.where}: {netdev.reason(e)}")
        self._xdp.clear()
        for a in reversed(self._cgroups):
            try:
                cgroup.detach(a)
            except Exception as e:
                errors.append(f"{a.where}: {netdev.reason(e)}")
        self._cgroups.clear()
        with _BCC_LOCK:
            for bpf, _ in self._offloaded.values():
                bpf.cleanup()
            self._offloaded.clear()
            if self.bpf is not None:
                self.bpf.cleanup()
            self.bpf = None
            self._functions.clear()
        if errors:
            raise BpfError("detaching: " + "; ".join(errors))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
