"""Benchmarks: `python -m lab bench <name>`. Each writes CSV + JSON sidecar under
datasets/results/ (or --out) and prints a summary: median over trials, min, max.

A bench is a module of this package that defines NAME (its command), SUMMARY
(one line for --help), add_arguments(parser) and main(args) -> exit status;
`python -m lab` finds it here, so adding a bench touches nothing else.

    vtap_throughput.py   the vTAP paper's Tables 1-2: PPS/Mbps/CPU per frame size and mirror
    generators.py        our XDP generator against trafgen, at the ceiling, per frame size
    redirect.py          the student report on netfilter vs XDP: a UDP destination rewrite by netfilter,
                         XDP or TC (file transfer, rate)
    xdp_modes.py         the Cilium/SmartNIC benchmark note: XDP drop, tx, redirect and forward in native,
                         generic and offload mode
    ids.py               the vTAP paper's Table 3: Suricata at the receiver and at the vTAP's monitor
    lb.py                the two load-balancer articles: the XDP load balancer against nginx, HAProxy
                         and nftables
    xdp_cost.py          a program's own ns per packet (kernel BPF statistics), whole vs partial checksums
"""

import importlib
import pkgutil


def benches():
    """The bench modules, in the order their names sort."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if all(hasattr(module, attr) for attr in ("NAME", "SUMMARY", "add_arguments", "main")):
            found.append(module)
    return sorted(found, key=lambda m: m.NAME)
