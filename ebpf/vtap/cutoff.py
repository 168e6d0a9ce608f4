"""The vTAP's per-flow cutoff (cutoff.h) as both hooks and the command line take it:
its defaults, its counters' names and how a size is read. Standard library only:
`vtap --help` reads these before anything heavier is imported."""

from ebpf.errors import InputError

FLOWS_DEFAULT = 65536  # the cutoff's flow table: 136 bytes of kernel memory a flow (8.9 MB; bpftool map show)
FLOWS_MAX = 1 << 24
FLOW_TIMEOUT_DEFAULT = 300.0  # seconds a flow may be idle before it starts again from zero
CUT_COUNTERS = (  # what the cutoff adds to counters() when the tap has its table
    "cut",
    "cut_bytes",
    "ends_copied",
    "flows_new",
    "flows_ended",
    "flows_restarted",
    "uncut_fragment",
    "uncut_no_ports",
    "uncut_malformed",
)


def parse_size(value, what="cutoff") -> int:
    """Bytes from an int or a string: 65536, "64K", "64KiB", "1M", "1MiB" (powers of 1024:
    what a stream depth is counted in); 0 is 0."""
    if isinstance(value, bool):
        raise InputError(f"{what} must be a number of bytes, not {value!r}")
    if isinstance(value, int):
        n = value
    else:
        text = str(value).strip().upper().removesuffix("B").removesuffix("I")
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text[:-1] if scale > 1 else text
        if not digits.isdigit():
            raise InputError(f"{what} must be bytes (65536, 64K, 1MiB), not {value!r}")
        n = int(digits) * scale
    if not 0 <= n < 1 << 62:
        raise InputError(f"{what} must be from 0 (no cutoff) to 2^62 bytes, not {value!r}")
    return n
