"""Errors raised by the ebpf package: each says in one line what failed and where."""


class BpfError(Exception):
    """A kernel program could not be built, loaded, attached or configured."""


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
