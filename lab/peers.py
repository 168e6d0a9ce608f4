"""Peer: what the rig drives. One way of doing the device under test's job (a
mirror for the vTAP, a destination rewrite for the redirect, a balancer), with
the same small protocol for all, so that an experiment swaps them by name and
the rig never needs to know which one it runs:

    attach()      start doing the job (hooks, rules, daemons)
    ready()       block until the job is really being done (a daemon has
                  configured its ports); the rig calls it after attach()
    counters()    {name: int} of the peer's own statistics, monotonic while attached
    detach()      stop, leaving nothing behind; close() detaches if needed

and two facts the rig plans around:

    takes_dut_core  a userspace datapath (OVS): the rig gives it the DUT core and
                    moves the kernel's receive work to the generator's core
    owns_dut_xdp    the peer attaches an XDP program to the DUT's receiving
                    interface, where the rig's counting sink would sit: the rig
                    lifts its sink for that run and counts with the peer's verdicts
"""


class Peer:
    name = "none"
    takes_dut_core = False
    owns_dut_xdp = False

    def __init__(self):
        self.attached = False

    def attach(self):
        self.attached = True

    def ready(self, timeout=15.0):
        """Return once the job is being done; the default job is ready at once."""

    def counters(self) -> dict:
        return {}

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
