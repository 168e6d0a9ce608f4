"""Small C sources built with cc on first use and cached by the hash of their source,
so that an edited source is built anew: the lab's tools (lab.traffic.ctools) and the
native helpers the ebpf layer loads with ctypes (ebpf/lb/maglev.c)."""

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ebpf.errors import BpfError

CACHE = Path("/var/cache/vtap-lab")


def build(source: Path, what: str, libs=(), shared=False) -> Path:
    """The binary (shared=True: a shared library) of `source`, built once per version;
    what: how an error names it. BpfError, in one line, when it cannot be built."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    binary = CACHE / f"{source.stem}-{digest}{'.so' if shared else ''}"
    if binary.exists():
        return binary
    cc = shutil.which("cc")
    if not cc:
        raise BpfError(f"cc not found: {what} is built from C (Debian package gcc; run `make setup`)")
    CACHE.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=CACHE, prefix=f"{binary.name}.", suffix=".tmp")
    os.close(fd)
    try:
        flags = ["-shared", "-fPIC"] if shared else []
        r = subprocess.run([cc, "-O2", "-Wall", *flags, "-o", tmp, str(source), *libs], capture_output=True, text=True)
        if r.returncode != 0:
            raise BpfError(f"building {source.name} failed: {(r.stderr.strip().splitlines() or ['?'])[0]}")
        os.chmod(tmp, 0o755)
        os.rename(tmp, binary)  # atomic: two builds at once both end with a whole binary
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return binary
