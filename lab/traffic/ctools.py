"""The lab's small C tools (openloop.c, rr.c), built with cc on first use and cached
by the hash of their source (ebpf.ctools), so that an edited source is built anew."""

from pathlib import Path

from ebpf import ctools
from ebpf.errors import BpfError

from ..netns import LabError

CACHE = ctools.CACHE


def built(source: Path, what: str, libs=()) -> Path:
    """The binary of `source` (what: how an error names it), built once per version."""
    try:
        return ctools.build(source, what, libs)
    except BpfError as e:
        raise LabError(str(e)) from None
