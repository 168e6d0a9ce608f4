"""Compile and load in a short-lived child process, so that a long-running one never
holds the compiler.

BCC compiles with the clang and LLVM linked into libbcc: importing it maps them into
the process (about 60 MB resident, touched while the libraries are relocated) and a
compile leaves ~100 MB more that LLVM never returns. A controller that runs for days
(`lab lb`) needs none of it after the load. So the child imports BCC, compiles the C
text, loads the functions asked for through the verifier, and hands back over a Unix
socket (SCM_RIGHTS) a file descriptor of each map and program, with BCC's description
of each map's key and value types; then it exits. The parent works on the same kernel
objects through libbpf's map calls (ebpf/maps.py): the maps and programs live as long
as a descriptor or an attachment holds them, whichever process made them.

    >>> got = load_in_child(text, cflags, "xdp_lb.bpf.c", [("xdp_lb", "XDP")])   # doctest: +SKIP
    >>> got[b"sessions"].items(), got.load_func(b"xdp_lb", got.XDP).fd

Failures come back as the exception the in-process path raises (CompileError with
clang's line, VerifierError with the verifier's, BpfError), with their logs.
"""

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from ebpf import errors, maps

HERE = Path(__file__).resolve().parent
MAX_FDS = 250  # SCM_RIGHTS carries at most 253 descriptors in one message


# --- the parent ----------------------------------------------------------------------------


class LoadedFunction:
    """What BCC's load_func() returns, as far as the lab uses it."""

    def __init__(self, name, fd):
        self.name, self.fd = name, fd


class ChildLoaded:
    """A compiled and loaded program held by descriptors: BCC's BPF object as far as
    BpfProgram uses it (tables by name, the loaded functions, cleanup())."""

    XDP, SCHED_CLS, CGROUP_SOCK_ADDR = (
        "XDP",
        "SCHED_CLS",
        "CGROUP_SOCK_ADDR",
    )  # load_func's prog_type, as BCC names them

    def __init__(self, tables: dict, functions: dict):
        self._tables = tables  # name -> maps.Table
        self._functions = functions  # name -> LoadedFunction

    def __getitem__(self, name):
        name = name.decode() if isinstance(name, bytes) else name
        return self._tables[name]  # KeyError, as BCC's, for a map the program has not

    def load_func(self, name, prog_type, attach_type=None):
        name = name.decode() if isinstance(name, bytes) else name
        try:
            return self._functions[name]
        except KeyError:
            raise errors.BpfError(
                f"loading {name}: it was not loaded with the program (compiled in a child, which "
                f"loads {', '.join(self._functions) or 'nothing'})"
            ) from None

    def cleanup(self):
        """Let go of every map and program (attached ones stay, held by their hooks)."""
        for t in self._tables.values():
            t.close()
        for f in self._functions.values():
            if f.fd >= 0:
                os.close(f.fd)
                f.fd = -1
        self._tables, self._functions = {}, {}


def load_in_child(text: str, cflags, source_name: str, functions) -> ChildLoaded:
    """Compile `text` with BCC in a child, load each (name, prog_type) of `functions`,
    and return what the child made, held by this process's descriptors. The request
    goes on the child's stdin and its reply (JSON) comes on its stdout, the
    descriptors on a Unix socket, in one message."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    request = {"text": text, "cflags": list(cflags), "source": source_name, "functions": [list(f) for f in functions]}
    env = dict(os.environ)
    # the child imports this package from where the parent did, whatever its working directory
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    with ours:
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", "ebpf.loader", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,  # what it says when it dies (LLVM's last words): into the error
            )
        finally:
            theirs.close()
        try:
            data, said = child.communicate(json.dumps(request).encode())
            fds = _receive_fds(ours) if data else []
        except BaseException:
            child.kill()
            child.wait()
            raise
    if not data:
        if child.returncode < 0:  # BCC itself crashed: here that costs the child only
            raise errors.CompileError(
                f"compiling {source_name}: BCC crashed ({signal.Signals(-child.returncode).name}); one known cause "
                "is a map whose key or value is a struct the C text never defines (a missing #include)"
            )
        last = [ln.strip() for ln in said.decode(errors="replace").splitlines() if ln.strip()]
        if last:
            raise errors.CompileError(
                f"compiling {source_name}: {last[-1].removeprefix('error: ').replace('/virtual/main.c', source_name)}"
            )
        raise errors.BpfError(
            f"compiling {source_name}: the compiling process ended with status {child.returncode}, saying nothing"
        )
    if said:  # warnings of a compile that worked: said here, as in-process
        sys.stderr.write(said.decode(errors="replace"))
    reply = json.loads(data)
    if "error" in reply:
        cls = getattr(errors, reply["error"], errors.BpfError)
        if not (isinstance(cls, type) and issubclass(cls, errors.BpfError)):
            cls = errors.BpfError
        raise cls(*reply["args"])
    try:
        if len(fds) != reply["fds"]:
            raise errors.BpfError(f"compiling {source_name}: {len(fds)} of {reply['fds']} descriptors came back")
        return _built(reply, fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _receive_fds(sock) -> list:
    """The child's descriptors, sent before it wrote its reply (so they are queued by now)."""
    sock.setblocking(False)
    try:
        _, fds, _, _ = socket.recv_fds(sock, 16, MAX_FDS)
    except BlockingIOError:
        return []
    return fds


def _built(reply, fds) -> ChildLoaded:
    tables, functions = {}, {}
    for m in reply["maps"]:
        key = decode_type(m["key"]) if m["key"] is not None else ctypes.c_int
        leaf = decode_type(m["leaf"])
        tables[m["name"]] = maps.table(fds[m["fd"]], m["type"], key, leaf, m["max_entries"], m["name"])
    for name, i in reply["functions"].items():
        functions[name] = LoadedFunction(name, fds[i])
    return ChildLoaded(tables, functions)


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


# --- the child -----------------------------------------------------------------------------


def _child(sock, out):
    """Compile, load, send the descriptors, then the reply; any failure is the reply."""
    from ebpf import compiler  # noqa: PLC0415 -- the child's: BCC, in this process only

    request = json.load(sys.stdin)
    try:
        bpf = compiler.bcc_compile(request["text"], request["cflags"], request["source"])
        loaded = {f[0]: compiler.bcc_load(bpf, *f) for f in request["functions"]}
        reply, fds = _describe(bpf, loaded)
        socket.send_fds(sock, [b"fds"], fds)
        reply["fds"] = len(fds)
    except errors.BpfError as e:
        reply = {"error": type(e).__name__, "args": [str(e), e.log] if hasattr(e, "log") else [str(e)]}
    except Exception as e:  # noqa: BLE001 -- anything else is still this load's failure, said in one line
        reply = {"error": "BpfError", "args": [f"compiling {request['source']}: {e}"]}
    out.write(json.dumps(reply).encode())
    out.flush()


def _describe(bpf, loaded):
    """Every map of the module (its fd, kernel type, size, key and value descriptions) and
    the loaded functions' fds, as the reply and its descriptor list."""
    from bcc.libbcc import lib  # noqa: PLC0415 -- the child's only

    # bcc/libbcc.py declares neither of these two; without it ctypes takes the name for an int
    lib.bpf_num_tables.restype, lib.bpf_num_tables.argtypes = ctypes.c_ulonglong, [ctypes.c_void_p]
    lib.bpf_table_name.restype, lib.bpf_table_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_ulonglong]
    fds, described = [], []
    for i in range(lib.bpf_num_tables(bpf.module)):
        name = lib.bpf_table_name(bpf.module, i)
        fd = lib.bpf_table_fd(bpf.module, name)
        key = lib.bpf_table_key_desc(bpf.module, name).decode()
        described.append(
            {
                "name": name.decode(),
                "fd": len(fds),
                "type": lib.bpf_table_type_id(bpf.module, i),
                "max_entries": lib.bpf_table_max_entries_id(bpf.module, i),
                "key": json.loads(key) if key else None,
                "leaf": json.loads(lib.bpf_table_leaf_desc(bpf.module, name).decode()),
            }
        )
        fds.append(fd)
    functions = {}
    for name, fn in loaded.items():
        functions[name] = len(fds)
        fds.append(fn.fd)
    if len(fds) > MAX_FDS:
        raise errors.BpfError(f"{len(fds)} maps and programs: more than one message carries ({MAX_FDS})")
    return {"maps": described, "functions": functions}, fds


def main(argv):
    # the reply owns the real stdout: whatever BCC or clang print goes to stderr
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    with socket.socket(fileno=int(argv[0])) as sock:
        _child(sock, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
