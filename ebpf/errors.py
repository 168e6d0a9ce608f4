"""Errors raised by the ebpf package: each says in one line what failed and where.

Two kinds, so that a command line can tell them apart (vtap exits 2 and 1):
- InputError: what the caller asked for cannot work as given (a bad CIDR, an
  unknown interface or namespace, a monitor whose copies would loop, no privileges).
- every other BpfError: it was tried and the kernel or the toolchain refused
  (clang, the verifier, a hook, a filter removed from outside).
"""

import re


class BpfError(Exception):
    """A kernel program could not be built, loaded, attached or configured."""


class InputError(BpfError, ValueError):
    """The request itself is wrong: nothing was attached because of it."""


class PrivilegeError(InputError):
    """The process lacks the capabilities BPF and TC need (not root)."""


class CompileError(BpfError):
    """clang (through BCC) rejected the C text. `.log` holds its diagnostics."""

    def __init__(self, message, log=""):
        super().__init__(message)
        self.log = log


class VerifierError(BpfError):
    """The kernel verifier rejected a program. `.log` holds the end of its log."""

    def __init__(self, message, log=""):
        super().__init__(message)
        self.log = log


class AttachError(BpfError):
    """A hook (TC, XDP) refused the program, or the interface is not there."""


class NoSuchInterface(InputError, AttachError):
    """No interface of that name (or index) in the namespace."""


class NoSuchNamespace(InputError):
    """No network namespace of that name: never created on the fly."""


class KeptDatapathMismatch(InputError):
    """A program left attached (kept, or its process killed) is not what this one
    would load: another program, other maps, or state the new one cannot serve on.
    Nothing was changed."""


def verifier_summary(log: str) -> str:
    """The line of a verifier log that says why: the last line that is neither an
    instruction dump, a register state, nor the closing statistics."""
    noise = re.compile(
        r"^(\d+:|;|processed \d+ insns|verification time|stack depth|mark_precise|"
        # a register state ("R1=ctx() R10=fp0"), not a reason that names one ("R2 unbounded
        # memory access", which the summary once skipped for the statistics line after it)
        r"from \d+ to \d+|bpf: Failed to load program|HINT|\s*$|R\d+(_[rw]+)?=)"
    )
    lines = [ln.strip() for ln in log.splitlines()]
    for line in reversed(lines):
        if not noise.match(line):
            return line
    return lines[-1] if lines else "no verifier log"
