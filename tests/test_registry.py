"""The registry of fast paths (lab/fastpath.py) holds what every reader of it
relies on: each bundle names a kernel program that counts through the one exit,
a command module with the protocol python -m lab calls, peers of its own kind in
colours a figure can tell apart, benches python -m lab bench can run, and a
manual that exists. A new bundle that misses any of it fails here, by name."""

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from ebpf.program import REASONS, VERDICTS, BpfProgram
from lab import palette
from lab.bench import benches
from lab.fastpath import fastpaths
from lab.lifecycle import Command

FASTPATHS = fastpaths()


def test_the_bundles_are_found_in_their_order():
    assert [fp.name for fp in FASTPATHS] == ["vtap", "redirect", "lb", "port-filter", "pods"]


@pytest.mark.parametrize("fp", FASTPATHS, ids=[fp.name for fp in FASTPATHS])
def test_a_bundle_declares_what_its_readers_need(fp):
    for prog in fp.program_classes():
        assert issubclass(prog, BpfProgram) and (Path(inspect.getfile(prog)).parent / prog.SOURCE).exists()
        assert prog.VERDICTS and set(prog.VERDICTS) <= set(VERDICTS)
        assert prog.REASONS and set(prog.REASONS) <= set(REASONS) and set(prog.DROPS) <= set(prog.REASONS)
    # what the suite and `make mutants` find through the bundle: its one-exit runs
    # (tests/test_one_exit.py checks each program has one) and its own mutants
    assert fp.checks, f"{fp.name}: no checks module (EXITS, MUTANTS)"
    assert fp.exit_checks(), f"{fp.name}: its checks module declares no EXITS"
    assert fp.mutants() and all(m.path.startswith(("ebpf/", "lab/")) for m in fp.mutants()), (
        f"{fp.name}: its checks module declares no MUTANTS"
    )
    cmd = fp.command_object()
    assert isinstance(cmd, Command) and type(cmd).start is not Command.start, fp.command  # the lifecycle's
    peers = fp.peer_classes()
    assert peers and all(cls.kind == fp.name and cls.name == name for name, cls in peers.items())
    colours = palette.colours(fp.name)
    assert len(set(colours.values())) == len(colours), colours  # every label its own colour
    for b in fp.bench_modules():
        assert all(hasattr(b, a) for a in ("NAME", "SUMMARY", "add_arguments", "main")) and b in benches()
    for m in fp.plots:
        assert fp.module(m).__doc__, m
    assert (ROOT / fp.doc).exists()


@pytest.mark.parametrize(
    "argv, name",
    [
        (["port-filter"], "python -m lab port-filter"),
        (["lb"], "python -m lab lb"),
        (["bench", "lb"], "lab bench"),
        (["cleanup"], "lab"),
    ],
)
def test_an_unknown_option_is_said_by_the_command_it_was_given_to(argv, name):
    """One line, exit 2, named as the command's other errors are (not by the top
    level `lab`, which a user typing `lab port-filter` did not address)."""
    r = subprocess.run(
        [sys.executable, "-m", "lab", *argv, "--bogus", "1"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert r.returncode == 2 and r.stderr == f"{name}: error: unrecognized arguments: --bogus 1\n", r.stderr
