"""TcSwap: the floor of a program that sends frames back at TC (tc_swap.bpf.c):
each frame counted, its MAC addresses swapped, redirected out of the interface it
came in on. What the load balancer at TC is measured against, as XdpSink("swap")
is for the one at XDP.

    >>> with TcSwap() as floor:                                  # doctest: +SKIP
    ...     floor.attach("eth0", netns="vtl-...-lb")
    ...     floor.counters()
    {'packets': ..., 'bytes': ...}
"""

from ebpf.program import BpfProgram


class TcSwap(BpfProgram):
    SOURCE = "tc_swap.bpf.c"
    FUNCTION = "tc_swap"
    OWNER = "tc-swap"  # its filters' name on the interface (ebpf/tc.py), for cleanup

    def attach(self, ifname, netns=None):
        return self.attach_tc(self.FUNCTION, ifname, "ingress", netns, owner=self.OWNER)

    def load_program(self):
        return self.load(self.FUNCTION, "SCHED_CLS")

    def counters(self) -> dict:
        return self.percpu_totals("stats")

    def reset_counters(self):
        self.zero_percpu("stats")
