"""Benchmarks: `python -m lab bench <name>`. Each writes CSV + JSON sidecar under
datasets/results/ (or --out) and prints a summary: median over trials, min, max.

A bench is a module that defines NAME (its command), SUMMARY (one line for
--help), add_arguments(parser) and main(args) -> exit status. A fast path's
benches live in its bundle and are named by its FastPath (lab.fastpath); the
lab's own, which measure the harness and more than one fast path, live here:

    generators.py   our XDP generator against trafgen, at the ceiling, per frame size
    xdp_cost.py     a program's own ns per packet (kernel BPF statistics), whole vs partial checksums
    common.py       what the benches share: options, flow mixes, interleaved trials, progress, summaries
"""

import importlib
import pkgutil

from ..fastpath import fastpaths


def benches():
    """Every bench module, the lab's and the fast paths', in the order their names sort."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if all(hasattr(module, attr) for attr in ("NAME", "SUMMARY", "add_arguments", "main")):
            found.append(module)
    for fp in fastpaths():
        found += fp.bench_modules()
    return sorted(found, key=lambda m: m.NAME)
