"""One palette for every figure. Okabe-Ito's colours, which stay distinct with
colour blindness; a baseline (no mirror, plain routing, no balancer) is grey.
Each peer declares its own colour and marker in its class (lab.peer.Peer), so
it has the same colour in every figure, and a new fast path's peers bring
theirs; what no peer declares gets a spare colour, the same in every process.

    colour("xdp-pass:generic", "redirect")   a peer's label -> its colour
    labels("redirect")                       its peers' labels, in the order figures show them
"""

import zlib

from .peer import peers

GREY = "#555555"
SPARE = ["#F0E442", "#000000", "#8C564B"]  # for a label that no peer declares
# XDP modes, where a figure compares them (the Cilium/SmartNIC note's bars)
MODES = {"native": "#0072B2", "generic": "#56B4E9", "offload": "#999999"}
# mpstat's columns where a figure stacks them (the netfilter-vs-XDP report's per-second CPU)
CPU = {"usr": "#56B4E9", "sys": "#0072B2", "soft": "#D55E00"}
# where an IDS runs (the vTAP paper's Table 3), and the attack's ground truth
IDS_SIDES = {"receiver": "#D55E00", "monitor": "#0072B2"}
TRUTH = GREY
# a tap's per-flow cutoff, where a figure compares them: none is the baseline (grey),
# then the cutoffs from the largest to the smallest
CUTOFFS = [GREY, "#0072B2", "#009E73", "#E69F00", "#CC79A7", "#56B4E9"]


def _label(name, mode):
    return name if mode is None else f"{name}:{mode}"


def labels(fastpath=None) -> list[str]:
    """Every label of the fast path's peers (name, or name:mode for each mode),
    in the order of its PEERS."""
    return [_label(cls.name, m) for cls in peers(fastpath).values() for m in cls.modes]


def colours(fastpath=None) -> dict[str, str]:
    """{label: colour} of the fast path's peers."""
    return {label: colour(label, fastpath) for label in labels(fastpath)}


def colour(label, fastpath=None) -> str:
    name, _, mode = str(label).partition(":")
    cls = peers(fastpath).get(name)
    if cls is not None:
        return cls.colours.get(mode, cls.colour)
    return SPARE[zlib.crc32(str(label).encode()) % len(SPARE)]


def marker(label, fastpath=None) -> str:
    cls = peers(fastpath).get(str(label).partition(":")[0])
    return cls.marker if cls is not None else "o"


def in_order(present, fastpath=None) -> list[str]:
    """The labels present, those of the fast path's peers first in their order,
    then any others sorted."""
    present = set(present)
    known = labels(fastpath)
    return [x for x in known if x in present] + sorted(present - set(known))
