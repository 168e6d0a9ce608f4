"""The fast paths of the lab, and the one registry everything else reads.

A fast path is one bundle: a folder lab/fastpaths/<name>/ whose __init__.py
declares it with FastPath(...): its kernel program (a class of `ebpf`), its
command line (whose cleanup() removes what a killed run of it left), the peers
it is measured against, its benches and its plots.
`python -m lab` (its commands, `bench`, `cleanup`), the benches, the plots'
palette and the README's table of tools all read this registry, so adding a
fast path is adding a folder (docs/adding-a-fast-path.md walks through one).

    >>> [fp.name for fp in fastpaths()]
    ['vtap', 'redirect', 'lb', 'port-filter']

Declarations name modules as strings: reading the registry imports nothing
heavier than the bundles' __init__.py files (no BCC, no pyroute2).

The protocol of the modules a FastPath names:
  command   COMMAND: a lab.lifecycle.Command (add_arguments(parser); main(args)
            -> exit status; cleanup(all_runs) -> (removed, spared), the
            leftovers of killed runs in this namespace, as lines)
  benches   NAME, SUMMARY, add_arguments(parser), main(args) -> exit status
  peers     PEERS: {name: class}, each a lab.peer.Peer
  checks    EXITS: [ExitCheck], how the suite's one-exit check (tests/test_one_exit.py)
            runs each of its kernel programs; MUTANTS: [lab.mutants.Mutant], its
            one-line bugs that `make mutants` seeds (each with the tests that
            must catch it)
"""

import importlib
import pkgutil
from dataclasses import dataclass

from . import fastpaths as package


@dataclass(frozen=True)
class FastPath:
    name: str  # its command: python -m lab NAME
    title: str  # what it does, in one line
    hook: str  # where in the kernel it runs
    program: str  # "module:Class" of its kernel program
    command: str  # module of its command line (see the protocol above)
    example: str  # one command line a user types
    compared_with: str  # the tools people would use instead, in words
    peers: str = ""  # module with PEERS
    benches: tuple = ()  # bench modules
    plots: tuple = ()  # modules of the figures its notebooks draw from the benches' CSVs
    doc: str = ""  # its manual, relative to the repository root
    order: int = 100  # where it stands in lists (--help, the README)
    variants: tuple = ()  # "module:Class" of its other kernel programs: the same job at another
    # hook (the vTAP's XDP twin), under the same command and peers
    checks: str = ""  # module with EXITS and MUTANTS (see the protocol above)

    def module(self, dotted):
        return importlib.import_module(dotted)

    def command_module(self):
        return self.module(self.command)

    def command_object(self):
        """Its command line: a lab.lifecycle.Command."""
        return self.command_module().COMMAND

    def program_class(self):
        return self._class(self.program)

    def program_classes(self) -> list:
        """Its kernel program's class, then its variants'."""
        return [self._class(p) for p in (self.program, *self.variants)]

    def _class(self, dotted):
        mod, _, cls = dotted.partition(":")
        return getattr(self.module(mod), cls)

    def peer_classes(self) -> dict:
        return dict(self.module(self.peers).PEERS) if self.peers else {}

    def bench_modules(self) -> list:
        return [self.module(b) for b in self.benches]

    def exit_checks(self) -> list:
        return list(self.module(self.checks).EXITS) if self.checks else []

    def mutants(self) -> list:
        return list(self.module(self.checks).MUTANTS) if self.checks else []


@dataclass(frozen=True)
class ExitCheck:
    """How the one-exit check runs one kernel program of a bundle through
    BPF_PROG_TEST_RUN on frames that are no rule's, service's or watch-list's
    (198.18.9.9, 2001:2:0:9::9): not IP, cut short, fragments, other protocols.
    Every program must count them in one verdict (pass) and the reason every
    program gives them, as far as it looks into a frame."""

    program: str  # "module:Class" of the program it runs (as FastPath.program names it)
    kwargs: dict = None  # its arguments (plain data: the declaration stays light)
    hook: str = "xdp"  # which test run: "xdp", or "tc" (an skb: some cut-short frames are refused)
    function: str = ""  # the function to load ("" : the class's load_program())
    slot: int = 0  # the counters' index (per interface programs: 1, the test run's lo)
    sees: str = "l4"  # how far it looks: "l4" (to the ports: every reason as parse_l4() names it),
    # "ip" (the IP header whole: not_ip and malformed, the rest unmatched),
    # "l3" (to the addresses: not_ip, the rest unmatched)
    make: str = ""  # "module:function" that builds it, where kwargs cannot (default: the class)

    def build(self):
        mod, _, name = (self.make or self.program).partition(":")
        return getattr(importlib.import_module(mod), name)(**(self.kwargs or {}))


def fastpaths() -> list[FastPath]:
    """Every bundle of lab/fastpaths/, in their order."""
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        mod = importlib.import_module(f"{package.__name__}.{info.name}")
        fp = getattr(mod, "FASTPATH", None)
        if isinstance(fp, FastPath):
            found.append(fp)
    return sorted(found, key=lambda fp: (fp.order, fp.name))


def fastpath(name) -> FastPath:
    for fp in fastpaths():
        if fp.name == name:
            return fp
    raise KeyError(f"no fast path named {name!r} (known: {', '.join(fp.name for fp in fastpaths())})")


def tool_table() -> str:
    """The README's table of tools, in Markdown, from the registry."""
    rows = ["| fast path | command | kernel hook | compared with | manual |", "|---|---|---|---|---|"]
    for fp in fastpaths():
        rows.append(
            f"| **{fp.name}**: {fp.title} | `{fp.example}` | {fp.hook} | {fp.compared_with} | [{fp.doc}]({fp.doc}) |"
        )
    return "\n".join(rows)


if __name__ == "__main__":  # python -m lab.fastpath: the README's table, to paste between its markers
    from lab.fastpath import tool_table as table  # the module, not this __main__ copy of it: the bundles import that

    print(table())
