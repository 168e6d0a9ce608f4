"""Peer: one way of doing a fast path's job (a mirror for the vTAP, a
destination rewrite for the redirect, a balancer for the LB), the fast path's
own program among them, with the same small protocol for all, so that a bench
swaps them by name and its rig never needs to know which one it runs:

    attach()      start doing the job (hooks, rules, daemons)
    ready()       block until the job is really being done (a daemon has
                  configured its ports); the rig calls it after attach()
    counters()    {name: int} of the peer's own statistics, monotonic while attached
    detach()      stop, leaving nothing behind; close() detaches if needed
    pids()        its user-space processes, where it has some (CPU and memory are read from them)
    maps_bytes()  kernel memory it holds on its own (its BPF maps), where we can read it

What benches and figures read of it:

    name          how commands, CSVs and figures call it
    kind          the fast path whose job it does ("vtap", "redirect", "lb", ...)
    mode          the XDP mode it runs in, of `modes` (None: it has no XDP program)
    label         name, or name:mode for a peer that runs in several
    colour, marker   its colour and marker in every figure (lab.palette)

and two facts a rig plans around:

    takes_dut_core  a userspace datapath (OVS): the rig gives it the DUT core and
                    moves the kernel's receive work to the generator's core
    owns_dut_xdp    the peer attaches an XDP program to the DUT's receiving
                    interface, where the rig's counting sink would sit: the rig
                    lifts its sink for that run and counts with the peer's verdicts

The peers of every fast path are its bundle's PEERS (lab.fastpath); peers()
reads them all.
"""

from .fastpath import fastpaths


class Peer:
    name = "none"
    kind = ""
    modes = (None,)  # the XDP modes it runs in, the first its default; (None,): no XDP program
    colour = "#555555"  # Okabe-Ito's palette (lab.palette); a baseline is grey
    colours = {}  # {mode: colour} where a mode has a colour of its own
    marker = "o"
    takes_dut_core = False
    owns_dut_xdp = False

    def __init__(self, mode=None):
        mode = self.modes[0] if mode is None else mode
        if mode not in self.modes:
            raise ValueError(f"{self.name} runs in mode {' or '.join(map(str, self.modes))}, not {mode}")
        self.mode = mode
        self.attached = False

    @property
    def label(self):
        return self.name if self.mode is None else f"{self.name}:{self.mode}"

    def attach(self):
        self.attached = True

    def ready(self, timeout=15.0):
        """Return once the job is being done; the default job is ready at once."""

    def counters(self) -> dict:
        return {}

    def pids(self) -> list[int]:
        return []

    def maps_bytes(self) -> int:
        return 0

    def detach(self):
        self.attached = False

    def close(self):
        if self.attached:
            self.detach()

    def __enter__(self):
        self.attach()
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def peers(fastpath=None) -> dict:
    """{name: Peer class} of one fast path, or of all of them."""
    found = {}
    for fp in fastpaths():
        if fastpath in (None, fp.name):
            found.update(fp.peer_classes())
    return found
