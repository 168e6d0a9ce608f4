"""The lab's small C tools (openloop.c, rr.c), built with cc on first use and cached
by the hash of their source, so that an edited source is built anew."""

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..netns import LabError

CACHE = Path("/var/cache/vtap-lab")


def built(source: Path, what: str, libs=()) -> Path:
    """The binary of `source` (what: how an error names it), built once per version."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    binary = CACHE / f"{source.stem}-{digest}"
    if binary.exists():
        return binary
    cc = shutil.which("cc")
    if not cc:
        raise LabError(f"cc not found: {what} is built from C (Debian package gcc; run `make setup`)")
    CACHE.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=CACHE, prefix=f"{binary.name}.", suffix=".tmp")
    os.close(fd)
    try:
        r = subprocess.run([cc, "-O2", "-Wall", "-o", tmp, str(source), *libs], capture_output=True, text=True)
        if r.returncode != 0:
            raise LabError(f"building {source.name} failed: {(r.stderr.strip().splitlines() or ['?'])[0]}")
        os.chmod(tmp, 0o755)
        os.rename(tmp, binary)  # atomic: two builds at once both end with a whole binary
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return binary
