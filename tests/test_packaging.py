"""The wheel is complete: built from the sources, installed into a scratch venv
and used from outside the repository, it has every subpackage, the programs' C
beside their classes, the `vtap` command, and no unconditional jupyterlab.

The build runs on a copy of the repository, because setuptools writes build/
and *.egg-info into the tree it builds. Everything is offline: the project
venv's setuptools builds (--no-build-isolation), and pip installs the wheel
alone (--no-deps --no-index). The scratch venv borrows the project venv's
site-packages for the dependencies (pyroute2, scapy, pandas), appended after
its own through a .pth file, so the project's own modules can only come from
the wheel.
"""

import email.parser
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import require
from helpers import Lines, frames_in, wait_for

from lab.topology import Topology
from lab.traffic import Flow, Marker, build, send_frames

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ebpf", "vtap", "lab")
NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".ipynb_checkpoints",
    "datasets",
    "notebooks",
)


def _run(argv, **kw):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120, env=env, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, argv))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def _repo_packages():
    """Every package under the three top-level ones, dotted (lab.bench, ...)."""
    return sorted(
        ".".join(p.parent.relative_to(ROOT).parts) for top in PACKAGES for p in (ROOT / top).rglob("__init__.py")
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the wheel, what its build said: pip -v shows setuptools' warnings)."""
    for module in ("pip", "setuptools"):
        require(importlib.util.find_spec(module), f"{module} in the project venv")
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCES)
    r = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            tmp / "wheels",
            src,
        ]
    )
    (wheel,) = (tmp / "wheels").glob("*.whl")
    return wheel, r.stdout + r.stderr


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory):
    """(wheel path, scratch venv's python, its site-packages, a cwd outside the repo)."""
    wheel, _ = built
    tmp = tmp_path_factory.mktemp("packaging")
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    venv = tmp / "venv"
    # --without-pip: the project venv's pip installs into it (pip --python), which
    # saves the few seconds ensurepip takes
    _run([base_python, "-m", "venv", "--system-site-packages", "--without-pip", venv])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel])
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "zz-project-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    return wheel, python, site, cwd


def test_wheel_holds_every_package_and_the_c_sources(installed):
    wheel, *_ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for pkg in _repo_packages():
        assert pkg.replace(".", "/") + "/__init__.py" in names, f"{pkg} is not in the wheel"
    c_files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "ebpf").rglob("*") if p.suffix in (".c", ".h"))
    assert c_files and all(n in names for n in c_files)  # each family's C beside its class
    assert [n for n in c_files if n.startswith("ebpf/include/")]  # what the programs #include
    rules = sorted(p.name for p in (ROOT / "lab" / "rules").glob("*.rules"))
    assert rules and all(f"lab/rules/{n}" in names for n in rules)  # the IDS bench's default ruleset
    assert "lab/traffic/openloop.c" in names  # the LB bench's open-loop generator
    assert not any(n.startswith("tests/") for n in names)


def test_the_build_warns_about_nothing(built):
    """setuptools warned that the data directories (ebpf/include, lab/rules) were
    "absent from the `packages` configuration" (and, in a later version, would
    drop them), and that a TOML table for the license is deprecated."""
    _, said = built
    absent = re.findall(r"Package '[\w.]+' is absent from the `packages` configuration", said)
    assert not absent, absent
    # BuildBackendWarning, SetuptoolsDeprecationWarning, ...
    warnings = sorted(set(re.findall(r"\w+Warning: .*", said)))
    assert not warnings, "\n".join(warnings)


def test_installed_wheel_imports_and_compiles_from_outside_the_repo(installed):
    _, python, site, cwd = installed
    probe = """
import json, sys
import lab.fastpaths.vtap.bench, lab.traffic.filetransfer, ebpf, vtap
from ebpf import TcMirror
from ebpf.instruments.xdp_gen import XdpGen
from ebpf.instruments.xdp_sink import XdpSink
sources = []
for prog in (TcMirror("lo"), XdpSink(), XdpGen()):   # lo: a monitor every namespace has
    prog.compile()                                    # clang finds the C and its headers, installed
    sources.append(str(prog.source_path))
    prog.close()
mods = ("lab.fastpaths.vtap.bench", "lab.traffic.filetransfer", "ebpf", "vtap")
print(json.dumps({"files": [sys.modules[m].__file__ for m in mods], "sources": sources}))
"""
    out = json.loads(_run([python, "-I", "-c", probe], cwd=cwd).stdout.strip().splitlines()[-1])
    for f in out["files"] + out["sources"]:
        assert Path(f).is_relative_to(site) and not Path(f).resolve().is_relative_to(ROOT), f
    for p in (ROOT / "ebpf").rglob("*"):
        if p.suffix in (".c", ".h"):
            assert (site / p.relative_to(ROOT)).is_file(), f"{p.relative_to(ROOT)} is not installed beside its module"


def test_vtap_console_script_runs(installed):
    """The installed `vtap` command, run for real from outside the repository:
    it compiles the installed C, taps a lab host's eth0, and every frame sent
    there is copied and arrives at the monitor; bad input is one line, exit 2."""
    _, python, _, cwd = installed
    vtap = str(python.parent / "vtap")
    assert _run([vtap, "--help"], cwd=cwd).stdout.startswith("usage: vtap")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    t = Topology("pkg")
    for h in ("sender", "tapped", "monitor"):
        t.add_host(h)
    t.add_link("sender", "tapped")
    t.add_link("tapped", "monitor", a_if="mon0", b_if="eth0", a_addrs=[], b_addrs=[])
    with t:
        r = t.run(
            "tapped",
            [vtap, "--monitor", "nosuch0"],
            cwd=cwd,
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2 and r.stderr == "vtap: error: no interface named 'nosuch0' in this network namespace\n"
        proc = t.popen(
            "tapped",
            [vtap, "--monitor", "mon0", "--iface", "eth0", "--json"],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out = Lines(proc.stdout)
        assert json.loads(out.next(timeout=120))["event"] == "attached"
        at_monitor = frames_in(t.ns("monitor"), "eth0")
        frames = build(
            [Flow("a", t.addr("sender", "eth0"), t.addr("tapped", "eth0"), count=50)],
            Marker(),
            t.mac("sender", "eth0"),
            t.mac("tapped", "eth0"),
        )
        send_frames(t.ns("sender"), "eth0", frames, rate_pps=1000)
        wait_for(lambda: at_monitor() >= 50, what="50 copies at the monitor")
        proc.send_signal(signal.SIGINT)
        final = json.loads([ln for ln in iter(out.next, None)][-1])
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        assert final["event"] == "final" and final["seen"] == final["cloned"] == at_monitor() == 50


def test_jupyterlab_is_only_an_extra(installed):
    wheel, *_ = installed
    with zipfile.ZipFile(wheel) as z:
        (meta_name,) = (n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
    requires = meta.get_all("Requires-Dist") or []
    jupyter = [r for r in requires if r.split(";")[0].strip().lower().startswith("jupyterlab")]
    assert jupyter, "jupyterlab should still be offered, as an extra"
    assert all("extra ==" in r for r in jupyter), f"unconditional: {jupyter}"
    assert {"test", "notebooks"} <= set(meta.get_all("Provides-Extra") or [])
