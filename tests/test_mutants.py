"""python -m lab mutants: every mutant applies to the tree as it is, and the
tree is put back after each one, on an error, and after a killed run."""

import subprocess
import sys

import pytest
from conftest import ROOT

from lab import mutants


def test_every_mutant_finds_its_line_once_and_changes_it():
    every = mutants.all_mutants()
    ids = [m.id for m in every]
    assert len(ids) == len(set(ids)) and len(ids) >= 40
    for m in every:
        text = (ROOT / m.path).read_text()
        assert m.apply(text) != text, m.id
        assert m.line(text) >= 1
        fast, functional = m.tests
        assert fast or functional, m.id
        for args in (fast, functional):
            for a in args:
                assert a.startswith("-") or (ROOT / a).exists() or args[args.index(a) - 1] == "-k", (m.id, a)


def test_a_file_is_put_back_after_its_mutant_whatever_happens(tmp_path):
    (tmp_path / "ebpf").mkdir()
    f = tmp_path / "ebpf" / "x.c"
    f.write_text("a = 1;\nb = 2;\n")
    m = mutants.Mutant("t", "ebpf/x.c", "b = 2;", "b = 3;", "why", ([], []))
    with pytest.raises(RuntimeError):
        with mutants.Edited(m, tmp_path) as line:
            assert line == 2 and f.read_text() == "a = 1;\nb = 3;\n"
            raise RuntimeError("a test run that fails in any way")
    assert f.read_text() == "a = 1;\nb = 2;\n" and not list(tmp_path.rglob("*.mutant-orig"))
    # a run killed while the file was edited leaves the copy; the next one puts it back
    mutants.Edited(m, tmp_path).__enter__()
    assert f.read_text() != "a = 1;\nb = 2;\n"
    assert mutants.restore_all(tmp_path) == ["ebpf/x.c"] and f.read_text() == "a = 1;\nb = 2;\n"


def test_an_ambiguous_or_missing_edit_is_refused():
    m = mutants.Mutant("t", "x", "b", "c", "why", ([], []))
    with pytest.raises(ValueError, match="occurs 2 times"):
        m.apply("b b")
    with pytest.raises(ValueError, match="occurs 0 times"):
        m.apply("a")
    assert mutants.Mutant("t", "x", "b", "c", "why", ([], []), nth=2).apply("b b") == "b c"


def test_the_command_lists_and_refuses_an_unknown_mutant():
    r = subprocess.run([sys.executable, "-m", "lab", "mutants", "--list"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == len(mutants.all_mutants())
    r = subprocess.run(
        [sys.executable, "-m", "lab", "mutants", "--only", "nope"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 2 and r.stderr.strip() == "lab mutants: error: unknown mutant 'nope' (--list shows them)"


def test_inside_a_mutant_the_original_can_be_run_again(tmp_path):
    (tmp_path / "x.c").write_text("b = 2;\n")
    m = mutants.Mutant("t", "x.c", "b = 2;", "b = 3;", "why", ([], []))
    edited = mutants.Edited(m, tmp_path)
    with edited:
        with edited.original():
            assert (tmp_path / "x.c").read_text() == "b = 2;\n"
        assert (tmp_path / "x.c").read_text() == "b = 3;\n"
    assert (tmp_path / "x.c").read_text() == "b = 2;\n"


def test_a_hung_test_is_named_from_the_stack_faulthandler_dumped():
    """A mutant that makes a test hang is killed by the timeout; the stack
    pytest's faulthandler dumped first says in which test it hung."""
    dump = """Timeout (0:19:00)!
Thread 0x00007f (most recent call first):
  File "/usr/lib/python3/dist-packages/bcc/table.py", line 340 in __setitem__
  File "/tmp/m/repo/ebpf/lb/xdp_lb.py", line 220 in set_backends
  File "/tmp/m/repo/tests/test_xdp_lb_fixtures.py", line 346 in test_maglev_spreads_by_weight
  File "/tmp/m/repo/.venv/lib/python3.11/site-packages/_pytest/python.py", line 157 in pytest_pyfunc_call
"""
    assert mutants._hung_in(dump) == "tests/test_xdp_lb_fixtures.py:346 in test_maglev_spreads_by_weight"
    assert mutants._hung_in("no stack") == ""
