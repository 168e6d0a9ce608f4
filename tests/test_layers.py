"""The layers hold: `ebpf` (the kernel programs and their loader) imports
nothing of `lab` or `vtap`; `lab` nothing of `vtap`; and no module imports
itself back through others: no import cycle anywhere. Read from the source,
every import statement, deferred ones included (a deferred import is still a
dependency, only a hidden one)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGES = ("ebpf", "lab", "vtap")
BELOW = {"ebpf": set(), "lab": {"ebpf"}, "vtap": {"ebpf", "lab"}}  # what each package may import


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_of(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(name: str, path: Path, known) -> set[str]:
    """The project's modules that `name` imports (a `from X import y` that names
    a module counts as importing X.y)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
    return {m for m in found if m in known and m != name}


def _graph():
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def test_no_package_imports_a_layer_above_it():
    crossed = [
        f"{m} imports {d}"
        for m, deps in _graph().items()
        for d in deps
        if d.split(".")[0] != m.split(".")[0] and d.split(".")[0] not in BELOW[m.split(".")[0]]
    ]
    assert not crossed, crossed


def test_no_import_cycle():
    graph = _graph()
    # Tarjan's strongly connected components: a component of two or more
    # modules is a cycle. A package's __init__ importing its own submodules
    # is not one (Python imports the package first, always).
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w.startswith(v + "."):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_walk_sees_imports():
    """The walk itself: it finds what a module is known to import, deferred
    imports included, so the tests above cannot pass by reading nothing."""
    graph = _graph()
    assert {"ebpf.program", "ebpf.errors"} <= graph["ebpf.vtap.tc_mirror"] | graph["ebpf.vtap.mirror_base"]
    assert "lab.runs" in graph["lab.topology"] and "lab.runs" in graph["lab.cleanup"]
    assert any(d.startswith("ebpf") for d in graph["lab.cleanup"])


HEAVY = ("pandas", "scapy", "matplotlib", "nbformat")


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "lab", "redirect", "--help"],
        ["-m", "lab", "lb", "--help"],
        ["-m", "lab", "cleanup", "--help"],
        ["-m", "vtap", "--help"],
        ["-m", "lab.traffic.filetransfer", "--help"],
    ],
)
def test_a_command_started_in_a_namespace_loads_only_what_it_runs(argv):
    """Commands, generators and servers start in namespaces hundreds of times a
    bench or a suite: `python -m lab redirect` loaded every bench, pandas, scapy
    and matplotlib first (1.4 s of CPU), a file-transfer server pandas for one
    path. Read from the interpreter's own import log (-X importtime)."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = {
        line.rsplit("|", 1)[-1].strip().split(".")[0]
        for line in r.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "lab" in loaded or "vtap" in loaded  # the log is read
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
