"""Constants the kernel programs and Python share, read from the headers both
sides include, so each is defined once (in C). Standard library only: the
command line reads these before it imports anything heavier.

    >>> defines("vtap/vtap.h")["VTAP_IF_SLOTS"]
    256
"""

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
_DEFINE = re.compile(r"^#define\s+(\w+)\s+(0x[0-9a-fA-F]+|\d+)\b", re.M)


def defines(header) -> dict[str, int]:
    """Every `#define NAME <integer>` of a header."""
    return {name: int(value, 0) for name, value in _DEFINE.findall((HERE / header).read_text())}
