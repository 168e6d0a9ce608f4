"""BpfProgram: the base of every kernel program class in this package.

A subclass names its C file (kept beside it) and the functions it loads; the base
compiles the C with BCC, turns clang and verifier failures into one-line
exceptions that keep the log, attaches to TC clsact and XDP hooks, sums per-CPU counters,
and detaches everything on close() or at the end of a `with` block.

    >>> with SomeProgram(...) as prog:          # doctest: +SKIP
    ...     prog.attach(...)
    ...     print(prog.counters())
"""

import inspect
import os
import re
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from .abi import defines
from .errors import AttachError, BpfError, CompileError, InputError, PrivilegeError, VerifierError
from . import interrupts, netdev, privileges, tc, xdp

HERE = Path(__file__).resolve().parent
# BCC's compiler (clang/LLVM inside libbcc) is not thread-safe, and the verifier's
# log is caught by pointing the process's fd 2 elsewhere: one compile, load or
# cleanup at a time in this process, whichever thread asks.
_BCC_LOCK = threading.RLock()
INCLUDE = HERE / "include"  # headers every program may use: parsing, checksums, rewriting, the one exit


def _names(prefix):
    """The verdicts (V_) or reasons (R_) of include/verdict.h, lowercase, by index."""
    found = sorted((v, n) for n, v in defines("include/verdict.h").items()
                   if n.startswith(prefix) and n not in (prefix + "COUNT", prefix + "SLOTS"))
    return [n[len(prefix):].lower() for _, n in found]


VERDICTS = _names("V_")  # what a program did with a frame: pass, drop, tx, redirect, mirror, aborted
REASONS = _names("R_")   # why: not_ip, malformed, fragment, unmatched, ...


def import_bcc():
    """Import BCC, or fail with a message that says how to get it."""
    try:
        from bcc import BPF  # Debian's python3-bpfcc, not PyPI's "bcc"
    except ImportError as e:
        raise BpfError(
            f"BCC is not importable ({e}); run `make setup` as root, then use .venv/bin/python "
            "(BCC comes from Debian's python3-bpfcc; never `pip install bcc`, an unrelated package)"
        ) from None
    return BPF


@contextmanager
def _here():
    """The namespace we are in (netdev.entered's counterpart for netns=None)."""
    yield


@contextmanager
def _stderr_to(buffer: list):
    """Send file descriptor 2 to a temporary file and append what was written
    there to `buffer`: libbcc prints clang diagnostics and the verifier log from C,
    straight to fd 2, so sys.stderr redirection would not see them."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            buffer.append(tmp.read().decode(errors="replace"))


def _notice_leftovers():
    """A program starting says what dead runs of the lab left (lab.leftovers),
    when the lab is installed beside this package."""
    try:
        from lab.leftovers import notice
    except ImportError:
        return
    notice()


def _verifier_summary(log: str) -> str:
    """The line of a verifier log that says why: the last line that is neither an
    instruction dump, a register state, nor the closing statistics."""
    noise = re.compile(r"^(\d+:|;|processed \d+ insns|verification time|stack depth|mark_precise|"
                       r"from \d+ to \d+|bpf: Failed to load program|HINT|\s*$|R\d+)")
    lines = [ln.strip() for ln in log.splitlines()]
    for line in reversed(lines):
        if not noise.match(line):
            return line
    return lines[-1] if lines else "no verifier log"


def _exits(fps) -> dict:
    """A struct fp_counts per CPU, summed and named."""
    return {"seen": sum(f.seen for f in fps),
            "verdict": {n: sum(f.verdict[i] for f in fps) for i, n in enumerate(VERDICTS)},
            "reason": {n: sum(f.reason[i] for f in fps) for i, n in enumerate(REASONS)},
            "dropped": {n: sum(f.dropped[i] for f in fps) for i, n in enumerate(REASONS)}}


class BpfProgram:
    """Base class: compile, load, attach, read counters, detach.

    Subclasses set SOURCE (a file name beside the subclass's module, wherever
    that module lives) and pass -D parameters to __init__. `source` overrides the
    C file, for developing an extension of a program without editing the
    package. The C text sees two include directories: the class's own (for the
    program's header, e.g. vtap.h) and ebpf/include (the shared headers).
    """

    SOURCE: str = ""
    ROWS = "total"              # what counter_rows() is per: "interface", "backend", "rule", ...
    MAIN_COUNTERS: tuple = ()   # the counters repr() shows (all of them when empty)
    # Which of verdict.h's verdicts and reasons the program gives, in the order
    # its counters show them; DROPS: the reasons it drops for, each also counted
    # as dropped_<reason>. exits() has them all, for checking these lists.
    VERDICTS: tuple = ()
    REASONS: tuple = ()
    DROPS: tuple = ()

    def __init__(self, cflags=(), source=None):
        here = Path(inspect.getfile(type(self))).resolve().parent
        self.source_path = Path(source) if source else here / self.SOURCE
        self.cflags = [f"-I{here}", f"-I{INCLUDE}", *cflags]
        self.bpf = None
        self._functions = {}
        self._tc_filters = []
        self._xdp = []
        self._offloaded = {}  # ifname -> (BPF object loaded for that device, its function)

    # --- building -----------------------------------------------------------
    def c_text(self) -> str:
        try:
            return self.source_path.read_text()
        except OSError as e:
            raise BpfError(f"cannot read {self.source_path}: {e.strerror}") from None

    def compile(self):
        """Compile the C text with BCC (maps are created here, programs not yet
        loaded), then let the subclass fill its maps (maps_created)."""
        if self.bpf is not None:
            return self.bpf
        BPF = import_bcc()
        text = self.c_text()
        _notice_leftovers()
        lacking = privileges.message()
        if lacking:  # else BCC fails later, on some map, with an error about that map
            raise PrivilegeError(lacking)
        log = []
        try:
            with _BCC_LOCK, _stderr_to(log):
                self.bpf = BPF(text=text.encode(), cflags=self.cflags)
        except Exception as e:
            diag = "".join(log)
            first = next((ln for ln in diag.splitlines() if "error:" in ln), str(e))
            first = first.replace("/virtual/main.c", self.source_path.name)
            raise CompileError(f"compiling {self.source_path.name}: {first.strip()}", diag) from None
        try:
            self.maps_created()
        except BaseException:
            with _BCC_LOCK:
                self.bpf.cleanup()
            self.bpf = None
            raise
        return self.bpf

    def maps_created(self):
        """Called once, right after compile() created the maps, whatever first
        needed them (a load, a counter read): subclasses write their initial
        configuration here, so no path can see the maps empty."""

    def load(self, function: str, prog_type: str):
        """Load one function of the program ("SCHED_CLS", "XDP", ...) through the
        verifier; a rejection raises VerifierError with the verifier's reason."""
        if function in self._functions:
            return self._functions[function]
        bpf = self.compile()
        log = []
        try:
            with _BCC_LOCK, _stderr_to(log):
                fn = bpf.load_func(function.encode(), getattr(type(bpf), prog_type))
        except Exception as e:
            text = "".join(log).strip()
            if not text:  # no verifier log: the load failed before the verifier ran
                raise BpfError(f"loading {function}: {e}") from None
            tail = "\n".join(text.splitlines()[-25:])
            raise VerifierError(f"verifier rejected {function}: {_verifier_summary(text)}", tail) from None
        self._functions[function] = fn
        return fn

    # --- attaching ----------------------------------------------------------
    def attach_tc(self, function: str, ifname: str, direction: str, netns=None, owner="ebpf",
                  mirror_ifindex=0):
        """Attach `function` as a cls_bpf filter on ifname's clsact ingress or
        egress hook, next to whatever filters are already there: direct-action,
        or with mirror_ifindex a classifier whose matches a mirred action copies
        to that interface (see tc._bpf_filter)."""
        self.refuse_reattach_tc(function, ifname, (direction,), netns)
        fn = self.load(function, "SCHED_CLS")
        with interrupts.held():  # attached and recorded, or neither
            f = tc.attach(netns, ifname, direction, fn.fd, function, owner, mirror_ifindex)
            self._tc_filters.append(f)
        return f

    def refuse_reattach_tc(self, function, ifname, directions, netns=None):
        """A second filter of this object on the same hook would run the program
        twice on every frame (a re-run notebook cell, a repeated call): refused,
        before anything changes."""
        for f in self._tc_filters:
            named = f.name == function or f.name.endswith(":" + function)  # tc names it owner+clsact:function
            if named and f.ifname == ifname and f.direction in directions and f.netns == netns:
                raise InputError(f"{type(self).__name__} is already attached to {ifname} {f.direction}"
                                 f"{' in netns ' + netns if netns else ''}: attaching again would run it twice "
                                 "on every frame; nothing changed (detach or close() it first)")

    def detach_tc(self, f):
        with interrupts.held():
            tc.detach(f)
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
                raise InputError(f"{type(self).__name__} is already attached to {a.where}: nothing changed "
                                 "(detach or close() it first)")
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
                raise InputError(f"attaching in {mode} mode: this program is already attached in {a.mode} mode "
                                 f"at {a.where}; one program runs in one XDP mode (load another for the other)")
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
            with _BCC_LOCK, netdev.entered(netns) if netns else _here(), _stderr_to(log):
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

    def detach(self):
        """Off every hook this object attached to; it stays loaded, to attach
        again (close() also frees it)."""
        for a in reversed(self._xdp):
            self.detach_xdp(a)
        for f in reversed(self._tc_filters):
            self.detach_tc(f)

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
            if name == "fp":
                e = _exits([v.fp for v in per_cpu])
                out["seen"] = e["seen"]
                out.update({v: e["verdict"][v] for v in self.VERDICTS})
                out.update({r: e["reason"][r] for r in self.REASONS})
                out.update({f"dropped_{r}": e["dropped"][r] for r in self.DROPS})
            else:
                out[name] = sum(getattr(v, name) for v in per_cpu)
        return out

    def exits(self, map_name: str = "stats", index: int = 0) -> dict:
        """Every verdict and reason of one entry's struct fp_counts, all of
        verdict.h's names (zero or not): {"seen": n, "verdict": {name: n},
        "reason": {name: n}, "dropped": {name: n}}. For every program,
        seen == sum(verdict) == sum(reason)."""
        table = self.table(map_name)
        return _exits([v.fp for v in table.getvalue(table.Key(index))])

    def counter_rows(self) -> dict:
        """{row: {counter: value}}, one row per ROWS (per interface, backend,
        rule, ... as the program counts them); the base has one row, "total"."""
        return {"total": self.counters()}

    def counters_frame(self):
        """counter_rows() as a pandas DataFrame: a row per ROWS, a column per counter."""
        import pandas as pd
        rows = self.counter_rows()
        frame = pd.DataFrame.from_dict(rows, orient="index")
        frame.index.name = self.ROWS
        return frame

    def zero_percpu(self, map_name: str, index: int = 0):
        table = self.table(map_name)
        table[table.Key(index)] = table.Leaf()  # the per-CPU array type, all zero

    # --- what a notebook shows ------------------------------------------------
    def warn(self, msg):
        """Say something the caller should know, in one line on stderr (a
        notebook shows it under the cell). A command line points this at its own."""
        print(f"{type(self).__name__}: warning: {msg}", file=sys.stderr, flush=True)

    def hooks(self) -> list[str]:
        """Where this object is attached, one string per hook."""
        out = [f"{f.ifname} {f.direction} (tc){' in netns ' + f.netns if f.netns else ''}" for f in self._tc_filters]
        return out + [a.where for a in self._xdp]

    def describe(self) -> dict:
        """What repr() shows: the source, where attached, settings (subclasses add
        theirs) and, once loaded, the main counters."""
        d = {"source": self.source_path.name,
             "attached": ", ".join(self.hooks()) or ("nowhere (compiled)" if self.bpf else "nowhere (not loaded yet)")}
        return d

    def _shown_counters(self):
        if self.bpf is None:  # reading would compile: a repr must not
            return {}
        try:
            c = self.counters()
        except Exception:
            return {}
        keys = self.MAIN_COUNTERS or tuple(c)
        return {k: c[k] for k in keys if k in c}

    def __repr__(self):
        try:
            d = self.describe()
            shown = self._shown_counters()
        except Exception as e:  # a repr never raises
            return f"<{type(self).__name__} ({e})>"
        parts = [f"{k} {v}" for k, v in d.items()]
        if shown:
            parts.append("counters " + " ".join(f"{k}={v:,}" for k, v in shown.items()))
        return f"<{type(self).__name__}: " + "; ".join(parts) + ">"

    def _repr_html_(self):
        from html import escape
        try:
            d, shown = self.describe(), self._shown_counters()
        except Exception as e:
            return f"<b>{type(self).__name__}</b> ({escape(str(e))})"
        rows = "".join(f"<tr><th style='text-align:left'>{escape(k)}</th><td style='text-align:left'>"
                       f"{escape(str(v))}</td></tr>" for k, v in d.items())
        if shown:
            rows += ("<tr><th style='text-align:left'>counters</th><td style='text-align:left'>"
                     + ", ".join(f"{escape(k)} {v:,}" for k, v in shown.items()) + "</td></tr>")
        return f"<b>{escape(type(self).__name__)}</b><table>{rows}</table>"

    # --- lifecycle ----------------------------------------------------------
    def close(self):
        """Detach every hook this object attached, then free the programs and maps.
        Safe to call twice; a detach failure does not stop the others, nor
        does an interrupt (held until everything is detached)."""
        with interrupts.held():
            self._close()

    def _close(self):
        errors = []
        for f in reversed(self._tc_filters):
            try:
                tc.detach(f)
            except Exception as e:  # keep going: leaving the rest attached is worse
                errors.append(f"{f.where}: {netdev.reason(e)}")
        self._tc_filters.clear()
        for a in reversed(self._xdp):
            try:
                xdp.detach(a)
            except Exception as e:
                errors.append(f"{a.where}: {netdev.reason(e)}")
        self._xdp.clear()
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

