"""Testbeds, traffic and measurements for the kernel programs of `ebpf`.

What a notebook or a script imports, directly from here:

    testbed1, testbed2   the vTAP paper's testbeds (Testbed: build(), ns(host), send(), capture(), close())
    testbed3             a routed one, for the XDP vTAP
    router_testbed, lb_testbed, pair     the redirect's and the load balancer's testbeds, two hosts
    Topology             a testbed of one's own: add_host, add_link, build
    Flow, Marker, build, send_frames, Capture   crafted, marked frames: send them, count them on arrival
    Sampler, sample, live                 counters over time as rates (pandas), a view that updates in place
    dead_runs, remove_leftovers           what killed runs left, and removing it (`python -m lab cleanup`)

The names are imported on first use, so `import lab` stays light.
"""

from ebpf.lazy import lazy

_LAZY = {
    "testbed1": ".testbeds",
    "testbed2": ".testbeds",
    "testbed3": ".testbeds",
    "router_testbed": ".fastpaths.redirect.testbed",
    "lb_testbed": ".fastpaths.lb.testbed",
    "pair": ".testbeds",
    "Testbed": ".testbeds",
    "Topology": ".topology",
    "Flow": ".traffic",
    "Marker": ".traffic",
    "build": ".traffic",
    "send_frames": ".traffic",
    "Capture": ".traffic",
    "SendReport": ".traffic",
    "Sampler": ".sampler",
    "sample": ".sampler",
    "live": ".sampler",
    "dead_runs": ".runs",
    "remove_leftovers": ".cleanup",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy(__name__, _LAZY)
