"""Compile a C text into its image (ebpf/images.py) with BCC: in this process, or in a
short-lived child process, so that a long-running one never holds the compiler.

BCC compiles with the clang and LLVM linked into libbcc: importing it maps them into
the process (about 60 MB resident, touched while the libraries are relocated) and a
compile leaves ~100 MB more that LLVM never returns. A controller that runs for days
(`lab lb`) needs none of it after the load. So the child imports BCC, compiles the C
text and answers with the compile's image (ebpf/images.py: each function's
instructions, each map's shape and types); then it exits. The parent creates the
maps and loads the functions from the image through libbpf, as it loads every image.

    >>> image = compile_in_child(text, cflags, "xdp_lb.bpf.c")   # doctest: +SKIP

Failures come back as the exception the in-process path raises (CompileError with
clang's line, BpfError), with their logs.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from ebpf import errors, images

HERE = Path(__file__).resolve().parent


# --- the parent ----------------------------------------------------------------------------


def compile_here(text: str, cflags, source_name: str) -> dict:
    """BCC's compile in this process, as an image (BCC's own maps are let go after)."""
    from ebpf.compiler import _BCC_LOCK, bcc_compile  # noqa: PLC0415 -- BCC only for a compile

    bpf = bcc_compile(text, cflags, source_name)
    try:
        return images.describe(bpf, text, source_name)
    finally:
        with _BCC_LOCK:
            bpf.cleanup()


def compile_in_child(text: str, cflags, source_name: str) -> dict:
    """Compile `text` with BCC in a child and return its image. The request goes on the
    child's stdin and its reply (JSON) comes on its stdout."""
    request = {"text": text, "cflags": list(cflags), "source": source_name}
    env = dict(os.environ)
    # the child imports this package from where the parent did, whatever its working directory
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    child = subprocess.Popen(
        [sys.executable, "-m", "ebpf.loader"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,  # what it says when it dies (LLVM's last words): into the error
    )
    try:
        data, said = child.communicate(json.dumps(request).encode())
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
    return reply


# --- the child -----------------------------------------------------------------------------


def _child(out):
    """Compile, describe; any failure is the reply."""
    request = json.load(sys.stdin)
    try:
        reply = compile_here(request["text"], request["cflags"], request["source"])
    except errors.BpfError as e:
        reply = {"error": type(e).__name__, "args": [str(e), e.log] if hasattr(e, "log") else [str(e)]}
    except Exception as e:  # noqa: BLE001 -- anything else is still this compile's failure, said in one line
        reply = {"error": "BpfError", "args": [f"compiling {request['source']}: {e}"]}
    out.write(json.dumps(reply).encode())
    out.flush()


def main(argv):
    # the reply owns the real stdout: whatever BCC or clang print goes to stderr
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _child(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
