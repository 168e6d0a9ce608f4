"""Names a package imports on first use (PEP 562): `import ebpf`, `import lab` and
a process started as `python -m lab.traffic.filetransfer` load only the modules of
the names they use, not BCC, scapy and pandas for every sibling.

    __getattr__, __dir__ = lazy(__name__, {"TcMirror": ".vtap.tc_mirror", ...})
"""

import sys
from importlib import import_module


def lazy(package: str, names: dict, made: dict | None = None):
    """(__getattr__, __dir__) for `package`: `names` maps each name to the module,
    relative to the package, that defines it; `made` maps a name to a function
    that makes its value (from other lazy names) on each use."""
    made = made or {}

    def __getattr__(name):
        if name in made:
            return made[name]()
        if name in names:
            return getattr(import_module(names[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(names) | set(made))

    return __getattr__, __dir__
