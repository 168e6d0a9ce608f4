"""BCC, the compiler every program of this package is built with: importing it (or
saying how to get it), compiling C text into maps, a failure as one line
(CompileError) with its log. Used by ebpf/loader.py, in this process or a child.
"""

import importlib.util
import os
import sys
import tempfile
import threading
from contextlib import contextmanager

from ebpf.errors import BpfError, CompileError

# BCC's compiler (clang/LLVM inside libbcc) is not thread-safe, and the verifier's
# log is caught by pointing the process's fd 2 elsewhere: one compile, load or
# cleanup at a time in this process, whichever thread asks.
_BCC_LOCK = threading.RLock()


def _no_bcc(why):
    return BpfError(
        f"BCC is not importable ({why}); run `make setup` as root, then use .venv/bin/python "
        "(BCC comes from Debian's python3-bpfcc; never `pip install bcc`, an unrelated package)"
    )


def import_bcc():
    """Import BCC, or fail with a message that says how to get it."""
    try:  # Debian's python3-bpfcc, not PyPI's "bcc"
        from bcc import BPF  # noqa: PLC0415 -- heavy and maybe absent; deferred so the error says how to get it
    except ImportError as e:
        raise _no_bcc(e) from None
    return BPF


def check_bcc():
    """Fail as import_bcc() does when there is no BCC to import, without importing it: a
    command that compiles in a child (compile_in) must not map the compiler itself."""
    if importlib.util.find_spec("bcc") is None:
        raise _no_bcc("No module named 'bcc'")


# LLVM ends the process on some errors of its backend (a program whose stack outgrows
# BPF's 512 bytes: report_fatal_error(), then exit(1)), in the middle of a compile whose
# fd 2 points at a temporary file: the error went nowhere and a command died silently,
# exit status 1. A C exit handler (registered once, with the C library's __cxa_atexit)
# puts fd 2 back and says the compiler's last words in one line before the process goes.
_REDIRECTED = []  # (saved fd 2, the temporary file) while stderr_to() holds fd 2
_REDIRECTED_SOURCE = [None]  # the source file bcc_compile() compiles, for the message
_EXIT_HOOK = None


def _said_at_exit(_arg):
    if not _REDIRECTED:
        return
    saved, tmp = _REDIRECTED[-1]
    os.dup2(saved, 2)
    try:
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    except (OSError, ValueError):
        text = ""
    first = next((ln.strip() for ln in text.splitlines() if "error" in ln), text.strip()[:300] or "no message")
    first = first.replace("error: ", "", 1).replace("/virtual/main.c", _REDIRECTED_SOURCE[0] or "the program")
    os.write(2, f"error: the compiler (LLVM, in libbcc) ended the process: {first}\n".encode())


def _hook_exit():
    """Register _said_at_exit() with the C library, under a handle of its own: a Python
    function must never be called by the C library after the interpreter is gone (a
    normal exit segfaulted so), so Python's own exit runs the handler first, through
    __cxa_finalize(handle), which also takes it off the C library's list."""
    global _EXIT_HOOK  # noqa: PLW0603 -- one handler for the process, registered on first use
    if _EXIT_HOOK is not None:
        return
    import atexit  # noqa: PLC0415 -- only once a compile redirects fd 2
    import ctypes  # noqa: PLC0415

    libc = ctypes.CDLL(None)
    hook = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_said_at_exit)
    handle = ctypes.create_string_buffer(1)  # what names our handler to __cxa_finalize
    try:
        libc.__cxa_atexit(hook, None, handle)
    except AttributeError:  # not glibc: the old silence, nothing worse
        _EXIT_HOOK = ()
        return
    _EXIT_HOOK = (hook, handle)  # kept alive: the C library holds their addresses
    atexit.register(libc.__cxa_finalize, handle)


@contextmanager
def stderr_to(buffer: list):
    """Send file descriptor 2 to a temporary file and append what was written
    there to `buffer`: libbcc prints clang diagnostics and the verifier log from C,
    straight to fd 2, so sys.stderr redirection would not see them."""
    _hook_exit()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        _REDIRECTED.append((saved, tmp))
        try:
            yield
        finally:
            _REDIRECTED.pop()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            buffer.append(tmp.read().decode(errors="replace"))


def bcc_compile(text, cflags, source_name):
    """BCC's BPF object for the C text (its maps created), or CompileError with clang's
    first error line (and its whole output as .log)."""
    BPF = import_bcc()
    log = []
    _REDIRECTED_SOURCE[0] = source_name
    try:
        with _BCC_LOCK, stderr_to(log):
            return BPF(text=text.encode(), cflags=list(cflags))
    except Exception as e:
        diag = "".join(log)
        first = next((ln for ln in diag.splitlines() if "error:" in ln), str(e))
        first = first.replace("/virtual/main.c", source_name)
        raise CompileError(f"compiling {source_name}: {first.strip()}", diag) from None
