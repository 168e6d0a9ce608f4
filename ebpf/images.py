"""Program images: what BCC's compile of a C text leaves (each function's instructions,
each map's shape and BCC's description of its key and value types, the module's BTF),
kept on disk, so the same text is compiled once and loaded in milliseconds after that.

BCC compiles with the clang and LLVM inside libbcc: half a second to two seconds of
CPU a program, every time a program object is made, in every process (a command, a
notebook cell, each test). The compile's result depends only on its inputs: the C
text, the flags, the headers in the include directories, BCC itself and the kernel
headers it compiles against. So an image is kept under a hash of all of them; a
later compile of the same inputs creates the maps and loads the functions from it
through libbpf (ebpf/maps.py's tables), and the kernel's verifier checks every load
as it checks BCC's. Every program, compiled now or earlier, is loaded this one way.

    >>> image = stored(key(text, cflags)) or describe(BPF(text=...), text, "tc_mirror.bpf.c")  # doctest: +SKIP
    >>> module = Loaded(image); module[b"stats"], module.load_func(b"tc_mirror", "SCHED_CLS").fd

BpfProgram.compile() takes the image kept, or has ebpf/loader.py compile one (here or
in a child), keeps it, and loads it.

Where images are kept: $VTL_BPF_CACHE, else $XDG_CACHE_HOME/ebpf-vtap-lab/bpf
(~/.cache/...); VTL_BPF_CACHE=off keeps none (every program compiled again). The
directory must be the user's own and writable by no one else: an image is code the
kernel runs.
"""

import base64
import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import struct
import tempfile
import time
from pathlib import Path

from ebpf import cgroup, errors, maps, objinfo
from ebpf.testrun import libbpf

FORMAT = 1  # of an image; a change of what is kept changes it, and every key with it
LOG_SIZE = (
    16 << 20
) - 1  # the verifier's log when a load failed (the reason is at its end); kernels before 6.4 refuse more

# BCC's names for program types, as the lab's classes pass them, in the kernel's numbers
# (uapi bpf.h); a cgroup program's attach type by BCC's name is cgroup.ATTACH_TYPES
PROG_TYPES = {"SOCKET_FILTER": 1, "SCHED_CLS": 3, "SCHED_ACT": 4, "TRACEPOINT": 5, "XDP": 6, "CGROUP_SOCK_ADDR": 18}
MAPS_OF_MAPS = {12, 13}  # ARRAY_OF_MAPS, HASH_OF_MAPS: created from an inner map
# Flags the kernel adds to a map it makes, which it refuses when asked for: a devmap's
# (and a devmap hash's) BPF_F_RDONLY_PROG (dev_map_alloc sets it; creation allows none)
KERNEL_SET_FLAGS = {14: 0x80, 25: 0x80}
# BCC's BPF_HASH_OF_MAPS(name, key, "inner", n) and BPF_ARRAY_OF_MAPS(name, "inner", n):
# the inner map is named only in the text (the kernel does not say which it was)
_OF_MAPS = re.compile(r'BPF_(?:HASH_OF_MAPS\(\s*(\w+)\s*,[^,]+,|ARRAY_OF_MAPS\(\s*(\w+)\s*,)\s*"(\w+)"')
LD_IMM64, PSEUDO_MAP_FD = 0x18, 1
# BCC names a program after its function, without these prefixes, cut to 15 bytes
_NAME_PREFIXES = ("kprobe__", "kretprobe__", "tracepoint__", "raw_tracepoint__", "kfunc__", "kretfunc__", "lsm__")


# --- where the inputs are, and the key ---------------------------------------------------


def _bcc_identity() -> str:
    """BCC's version and its library's file, without importing BCC (which maps LLVM)."""
    import importlib.util  # noqa: PLC0415 -- only for the key

    spec = importlib.util.find_spec("bcc")
    if spec is None or spec.origin is None:
        return "no bcc"
    here = Path(spec.origin).parent
    version = (here / "version.py").read_text() if (here / "version.py").exists() else ""
    libs = sorted(Path("/usr/lib").glob("*/libbcc.so.0*")) + sorted(Path("/usr/lib").glob("libbcc.so.0*"))
    lib = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in libs[:1]]
    return f"{version}{lib}"


def _kernel_identity() -> str:
    """The running kernel (a program's helper numbers, kfuncs) and the headers BCC compiles
    against: where /lib/modules/RELEASE/{build,source} lead, and when those trees changed."""
    u = os.uname()
    parts = [u.release, u.version, u.machine]
    for link in ("build", "source"):
        p = Path("/lib/modules", u.release, link)
        with contextlib.suppress(OSError):
            real = p.resolve()
            parts.append(f"{real}:{(real / 'Makefile').stat().st_mtime_ns}")
    return "|".join(parts)


def key(text: str, cflags) -> str:
    """The hash of everything a compile reads: the text, the flags, every header of each
    include directory the flags name (all of them, whether included or not: a header
    edited is a new key), BCC, the kernel and its headers."""
    h = hashlib.sha256(f"{FORMAT}\0{text}\0{list(cflags)!r}\0{_bcc_identity()}\0{_kernel_identity()}".encode())
    for flag in cflags:
        if flag.startswith("-I"):
            d = Path(flag[2:])
            for header in sorted(d.glob("*.h")) if d.is_dir() else ():
                h.update(f"\0{header.name}\0".encode())
                h.update(header.read_bytes())
    return h.hexdigest()


# --- the store ----------------------------------------------------------------------------


def cache_dir():
    """The directory images are kept in, made if missing; None when VTL_BPF_CACHE=off.
    A directory another user could write to is refused: its images would be loaded
    into the kernel."""
    where = os.environ.get("VTL_BPF_CACHE", "")
    if where.lower() in ("off", "0", "no", "false"):
        return None
    if not where:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        where = os.path.join(base, "ebpf-vtap-lab", "bpf")
    d = Path(where)
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = d.stat()
    except OSError as e:
        raise errors.BpfError(
            f"the compiled programs' cache {d}: {e.strerror} (VTL_BPF_CACHE=off does without)"
        ) from None
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise errors.BpfError(
            f"the compiled programs' cache {d} is not this user's alone (owner uid {st.st_uid}, mode "
            f"{st.st_mode & 0o777:o}): its programs would be loaded into the kernel; `chmod go-w {d}` if it is "
            "yours, or VTL_BPF_CACHE=DIR for another"
        )
    return d


def stored(k: str):
    """The image kept under key k, or None (none kept, or one unreadable: compiled again)."""
    d = cache_dir()
    if d is None:
        return None
    try:
        image = json.loads((d / f"{k}.json").read_text())
    except (OSError, ValueError):
        return None
    return image if isinstance(image, dict) and image.get("format") == FORMAT else None


def store(k: str, image: dict):
    """Keep an image under key k: written whole to a temporary file, then renamed, so a
    reader (another process compiling the same text) sees it whole or not at all."""
    d = cache_dir()
    if d is None:
        return
    for stale in d.glob(".image-*.tmp"):  # a writer killed mid-write left it: gone after an hour
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > 3600:
                stale.unlink()
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".image-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(image, f)
        os.replace(tmp, d / f"{k}.json")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --- an image from BCC's module (where BCC is: this process, or the compiling child) --------


def _btf_bytes(btf_id) -> bytes:
    """The raw BTF the kernel holds under this id (what BCC loaded for the module's maps)."""
    lib = libbpf()
    lib.btf__load_from_kernel_by_id.restype, lib.btf__load_from_kernel_by_id.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_uint32],
    )
    lib.btf__raw_data.restype = ctypes.c_void_p
    lib.btf__raw_data.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    lib.btf__free.argtypes = [ctypes.c_void_p]
    btf = lib.btf__load_from_kernel_by_id(btf_id)
    if not btf:
        raise errors.BpfError(f"reading BTF {btf_id}: {os.strerror(ctypes.get_errno() or 22)}")
    try:
        size = ctypes.c_uint32()
        data = lib.btf__raw_data(btf, ctypes.byref(size))
        return ctypes.string_at(data, size.value)
    finally:
        lib.btf__free(btf)


def describe(bpf, text: str, source_name: str) -> dict:
    """The image of a module BCC compiled (its maps created, no function loaded yet)."""
    from bcc.libbcc import lib  # noqa: PLC0415 -- only where BCC already is

    # bcc/libbcc.py declares neither of these two; without it ctypes takes the name for an int
    lib.bpf_num_tables.restype, lib.bpf_num_tables.argtypes = ctypes.c_ulonglong, [ctypes.c_void_p]
    lib.bpf_table_name.restype, lib.bpf_table_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_ulonglong]
    inner_of = {m[0] or m[1]: m[2] for m in _OF_MAPS.findall(text)}
    described, by_fd, btf_ids = [], {}, set()
    for i in range(lib.bpf_num_tables(bpf.module)):
        name = lib.bpf_table_name(bpf.module, i)
        fd = lib.bpf_table_fd(bpf.module, name)
        info = objinfo.map_info(fd)
        key_desc = lib.bpf_table_key_desc(bpf.module, name).decode()
        m = {
            "name": name.decode(),
            "kernel_name": info.name.decode(),
            "type": info.type,
            "key_size": info.key_size,
            "value_size": info.value_size,
            "max_entries": info.max_entries,
            "flags": info.map_flags & ~KERNEL_SET_FLAGS.get(info.type, 0),
            "map_extra": info.map_extra,
            "btf": [info.btf_key_type_id, info.btf_value_type_id] if info.btf_id else None,
            "inner": inner_of.get(name.decode()),
            "key": json.loads(key_desc) if key_desc else None,
            "leaf": json.loads(lib.bpf_table_leaf_desc(bpf.module, name).decode()),
        }
        if info.type in MAPS_OF_MAPS and m["inner"] is None:
            raise errors.BpfError(f"compiling {source_name}: map {m['name']} holds maps of a shape no text names")
        if info.btf_id:
            btf_ids.add(info.btf_id)
        described.append(m)
        by_fd[fd] = m["name"]
    if len(btf_ids) > 1:
        raise errors.BpfError(f"compiling {source_name}: its maps carry {len(btf_ids)} BTF objects, not one")
    functions = {}
    for i in range(lib.bpf_num_functions(bpf.module)):
        fn = lib.bpf_function_name(bpf.module, i)
        start, size = lib.bpf_function_start(bpf.module, fn), lib.bpf_function_size(bpf.module, fn)
        code = bytearray(ctypes.string_at(start, size))
        refs = []
        for at in range(0, len(code), 8):
            op, regs, _, imm = struct.unpack_from("<BBhi", code, at)
            if op == LD_IMM64 and regs >> 4:  # a 64-bit load of an object, not of a number
                if regs >> 4 != PSEUDO_MAP_FD or imm not in by_fd:
                    raise errors.BpfError(
                        f"compiling {source_name}: {fn.decode()} refers to an object at instruction {at // 8} "
                        f"(kind {regs >> 4}) that is none of its maps"
                    )
                refs.append([at // 8, by_fd[imm]])
                struct.pack_into("<i", code, at + 4, 0)  # the map's fd in this process: none of the image's
        functions[fn.decode()] = {"insns": base64.b64encode(bytes(code)).decode(), "maps": refs}
    return {
        "format": FORMAT,
        "source": source_name,
        "license": lib.bpf_module_license(bpf.module).decode(),
        "kern_version": lib.bpf_module_kern_version(bpf.module),
        "btf": base64.b64encode(_btf_bytes(btf_ids.pop())).decode() if btf_ids else None,
        "maps": described,
        "functions": functions,
    }


# --- the image in the kernel ----------------------------------------------------------------


class _MapCreateOpts(ctypes.Structure):
    """struct bpf_map_create_opts (libbpf 1.1 bpf.h)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("btf_fd", ctypes.c_uint32),
        ("btf_key_type_id", ctypes.c_uint32),
        ("btf_value_type_id", ctypes.c_uint32),
        ("btf_vmlinux_value_type_id", ctypes.c_uint32),
        ("inner_map_fd", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("map_extra", ctypes.c_uint64),
        ("numa_node", ctypes.c_uint32),
        ("map_ifindex", ctypes.c_uint32),
    ]


class _ProgLoadAttr(ctypes.Structure):
    """union bpf_attr for BPF_PROG_LOAD (uapi bpf.h), up to expected_attach_type: the
    kernel's own ABI, given to the syscall itself (libbpf's options struct changes with
    its version; 1.1 refuses the log fields of a later one without a word)."""

    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
    ]


SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine, 321)
BPF_PROG_LOAD = 5
_libc = ctypes.CDLL(None, use_errno=True)


def _prog_load(attr) -> int:
    """The BPF_PROG_LOAD syscall: a descriptor, or -errno (EAGAIN tried again, as libbpf does)."""
    for _ in range(5):
        fd = _libc.syscall(SYS_BPF, BPF_PROG_LOAD, ctypes.byref(attr), ctypes.sizeof(attr))
        err = ctypes.get_errno() if fd < 0 else 0
        if err != errno.EAGAIN:
            return fd if fd >= 0 else -err
    return -errno.EAGAIN


def program_name(function: str) -> bytes:
    """The name BCC gives a function's program (what bpftool and the lab's cleanup see)."""
    for p in _NAME_PREFIXES:
        if function.startswith(p):
            function = function[len(p) :]
            break
    return function.encode()[:15]


class LoadedFunction:
    """What BCC's load_func() returns, as far as the lab uses it."""

    def __init__(self, name, fd):
        self.name, self.fd = name, fd


class Loaded:
    """An image in the kernel: its maps created (tables by name, as BCC's module has
    them: ebpf/maps.py's), each function loaded through the verifier on first use."""

    # load_func's prog_type, as BCC's class names them (BpfProgram.load passes the name)
    XDP, SCHED_CLS, CGROUP_SOCK_ADDR, TRACEPOINT = "XDP", "SCHED_CLS", "CGROUP_SOCK_ADDR", "TRACEPOINT"

    def __init__(self, image: dict):
        self.image = image
        self._tables, self._functions = {}, {}
        lib = libbpf()
        btf_fd = -1
        try:
            if image["btf"]:
                data = base64.b64decode(image["btf"])
                btf_fd = lib.bpf_btf_load(data, len(data), None)
                if btf_fd < 0:
                    raise errors.BpfError(f"loading {image['source']}'s BTF: {os.strerror(-btf_fd)}")
            # a map of maps is made from its inner map's shape: the inner ones first
            for m in sorted(image["maps"], key=lambda m: m["type"] in MAPS_OF_MAPS):
                self._tables[m["name"]] = self._create(lib, m, btf_fd)
        except BaseException:
            self.cleanup()
            raise
        finally:
            if btf_fd >= 0:
                os.close(btf_fd)  # the maps hold the BTF they were made with

    def _create(self, lib, m, btf_fd):
        opts = _MapCreateOpts(sz=ctypes.sizeof(_MapCreateOpts), map_flags=m["flags"], map_extra=m["map_extra"])
        if m["btf"]:
            opts.btf_fd, (opts.btf_key_type_id, opts.btf_value_type_id) = btf_fd, m["btf"]
        if m["type"] in MAPS_OF_MAPS:
            opts.inner_map_fd = self._tables[m["inner"]].map_fd
        fd = lib.bpf_map_create(
            m["type"], m["kernel_name"].encode(), m["key_size"], m["value_size"], m["max_entries"], ctypes.byref(opts)
        )
        if fd < 0:
            raise errors.BpfError(f"creating map {m['name']} of {self.image['source']}: {os.strerror(-fd)}")
        key = decode_type(m["key"]) if m["key"] is not None else ctypes.c_int
        return maps.table(fd, m["type"], key, decode_type(m["leaf"]), m["max_entries"], m["name"])

    def __getitem__(self, name):
        name = name.decode() if isinstance(name, bytes) else name
        return self._tables[name]  # KeyError, as BCC's, for a map the program has not

    def load_func(self, name, prog_type, attach_type=None) -> LoadedFunction:
        """Load one function (prog_type, attach_type: BCC's names) through the verifier; a
        rejection raises VerifierError with the verifier's reason (the log's end as .log)."""
        name = name.decode() if isinstance(name, bytes) else name
        if name in self._functions:
            return self._functions[name]
        try:
            f = self.image["functions"][name]
        except KeyError:
            raise errors.BpfError(f"loading {name}: {self.image['source']} has no function of that name") from None
        code = bytearray(base64.b64decode(f["insns"]))
        for at, map_name in f["maps"]:
            struct.pack_into("<i", code, at * 8 + 4, self._tables[map_name].map_fd)  # the immediate only
        insns = (ctypes.c_char * len(code)).from_buffer(code)
        license_ = ctypes.create_string_buffer(self.image["license"].encode())
        attr = _ProgLoadAttr(
            prog_type=PROG_TYPES[prog_type],
            insn_cnt=len(code) // 8,
            insns=ctypes.addressof(insns),
            license=ctypes.addressof(license_),
            kern_version=self.image["kern_version"],
            prog_name=program_name(name),
            expected_attach_type=cgroup.ATTACH_TYPES[attach_type] if attach_type is not None else 0,
        )
        fd = _prog_load(attr)
        if fd < 0 and fd != -errno.EPERM:  # again, with the verifier's log
            log = ctypes.create_string_buffer(LOG_SIZE)
            attr.log_level, attr.log_size, attr.log_buf = 1, LOG_SIZE, ctypes.addressof(log)
            fd = _prog_load(attr)
            text = log.value.decode(errors="replace").strip()
            if fd < 0 and text:
                tail = "\n".join(text.splitlines()[-25:])
                raise errors.VerifierError(f"verifier rejected {name}: {errors.verifier_summary(text)}", tail)
        if fd < 0:
            raise errors.BpfError(f"loading {name}: {os.strerror(-fd)}")
        self._functions[name] = LoadedFunction(name, fd)
        return self._functions[name]

    def cleanup(self):
        """Let go of every map and program (attached ones stay, held by their hooks)."""
        for t in self._tables.values():
            t.close()
        for f in self._functions.values():
            if f.fd >= 0:
                os.close(f.fd)
                f.fd = -1
        self._tables, self._functions = {}, {}


# BCC's type descriptions (bcc/__init__.py, BPF.str2ctype and BPF._decode_table_type): the
# JSON that BCC's front end writes for a map's key and value types, as ctypes types.
STR2CTYPE = {
    "_Bool": ctypes.c_bool,
    "char": ctypes.c_char,
    "wchar_t": ctypes.c_wchar,
    "unsigned char": ctypes.c_ubyte,
    "short": ctypes.c_short,
    "unsigned short": ctypes.c_ushort,
    "int": ctypes.c_int,
    "unsigned int": ctypes.c_uint,
    "long": ctypes.c_long,
    "unsigned long": ctypes.c_ulong,
    "long long": ctypes.c_longlong,
    "unsigned long long": ctypes.c_ulonglong,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "long double": ctypes.c_longdouble,
    "__int128": ctypes.c_int64 * 2,
    "unsigned __int128": ctypes.c_uint64 * 2,
}


def decode_type(desc):
    """A ctypes type from BCC's description: a C type's name, or [name, fields, kind]."""
    if isinstance(desc, str):
        return STR2CTYPE[desc]
    anon, fields = [], []
    for t in desc[1]:
        if len(t) == 2:
            fields.append((t[0], decode_type(t[1])))
        elif len(t) == 3 and isinstance(t[2], list):  # an array: [name, type, [length]]
            fields.append((t[0], decode_type(t[1]) * t[2][0]))
        elif len(t) == 3 and isinstance(t[2], int):  # a bit field: [name, type, bits]
            fields.append((t[0], decode_type(t[1]), t[2]))
        elif len(t) == 3 and t[2] in ("union", "struct", "struct_packed"):  # a nested one
            name = t[0] or f"__anon{len(anon)}"
            if not t[0]:
                anon.append(name)
            fields.append((name, decode_type(t)))
        else:
            raise errors.BpfError(f"cannot decode BCC's type description {t!r}")
    kind = desc[2] if len(desc) > 2 else "struct"
    base = ctypes.Union if kind == "union" else ctypes.Structure
    attrs = {"_anonymous_": anon, "_fields_": fields}
    if kind == "struct_packed":
        attrs["_pack_"] = 1
    return type(str(desc[0]), (base,), attrs)
