"""Kernel programs as Python classes: one class per program, its C beside it.

    TcMirror      tc_mirror.bpf.c   the vTAP: clone watched traffic to a monitor (TC clsact)
"""
from .errors import AttachError, BpfError, CompileError, VerifierError
from .program import BpfProgram
from .tc_mirror import TcMirror

__all__ = ["AttachError", "BpfError", "BpfProgram", "CompileError", "TcMirror", "VerifierError"]
