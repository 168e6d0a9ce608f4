"""vtap: mirror watched traffic to a monitor interface with an eBPF TC program.

Runs in whatever network namespace it is started in; every failure detaches what
it attached. See `python -m vtap --help` for examples.
"""

import argparse
import json
import os
import signal
import sys
import time

EXAMPLES = """\
examples:
  vtap --monitor mon0                          # mirror everything on every UP interface
  vtap --monitor mon0 --iface eth0 --watch 198.18.1.10/32
                                               # eth0 traffic from or to one host
  vtap --monitor mon0 --watch 198.18.0.0/15 --watch 2001:2::/48 --match dst
  vtap --monitor mon0 --iface eth0 --direction both --sample 100
                                               # 1 in 100 frames, both directions
  vtap --monitor mon0 --duration 10 --json     # one JSON object per interval, then exit
  ip netns exec ns1 vtap --monitor mon0        # inside a network namespace
  vtap --cleanup                               # remove what a killed vtap left behind
"""

COUNTERS = ("seen", "matched", "cloned", "failed")


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="vtap", description="Clone packets whose source or destination is on a watch-list "
        "to a monitor interface (eBPF at the TC clsact hook).",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--monitor", metavar="MON", help="interface the copies leave through")
    p.add_argument("--iface", metavar="IF", action="append", default=[],
                   help="interface to tap (repeatable; default: every UP interface but lo and the monitor)")
    p.add_argument("--watch", metavar="CIDR", action="append",
                   help="IPv4/IPv6 address or network to watch (repeatable; default: mirror everything)")
    p.add_argument("--match", default="any", help="which address must be watched: src, dst or any (default any)")
    p.add_argument("--direction", default="ingress", help="ingress, egress or both (default ingress)")
    p.add_argument("--sample", type=int, default=1, metavar="N", help="mirror 1 in N matched packets (default 1: all)")
    p.add_argument("--clone", default="action", choices=("action", "helper"),
                   help="who copies a matched frame: the filter's tc mirred action (default, cheapest) "
                        "or the program itself with bpf_clone_redirect()")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between counter lines (default 1)")
    p.add_argument("--duration", type=float, metavar="S", help="detach and exit after S seconds")
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    p.add_argument("--cleanup", action="store_true",
                   help="remove vtap filters (and the clsact qdiscs vtap created) left in this namespace by a killed vtap")
    # For developers: print the C text, or load a modified copy of it.
    p.add_argument("--ebpf", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--program", metavar="FILE", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def check_args(a):
    if a.cleanup:
        return
    if not a.monitor:
        raise UsageError("--monitor is required (the interface the copies leave through)")
    if a.match not in ("src", "dst", "any"):
        raise UsageError(f"--match must be src, dst or any, not {a.match!r}")
    if a.direction not in ("ingress", "egress", "both"):
        raise UsageError(f"--direction must be ingress, egress or both, not {a.direction!r}")
    if a.sample < 1:
        raise UsageError(f"--sample must be >= 1 (1 mirrors every matched packet), not {a.sample}")
    if a.interval <= 0:
        raise UsageError(f"--interval must be > 0, not {a.interval}")
    if a.duration is not None and a.duration <= 0:
        raise UsageError(f"--duration must be > 0, not {a.duration}")
    if a.monitor in a.iface:
        raise UsageError(f"monitor {a.monitor} is also a tapped interface (its own clones would loop)")
    if len(set(a.iface)) != len(a.iface):
        raise UsageError("an interface is given twice with --iface")


def default_ifaces(tap):
    """Every UP interface in this namespace but lo, the monitor and the monitor's
    own veth peer (tapping that would clone the clones)."""
    from pyroute2 import IPRoute
    skip = {"lo", tap.monitor} | tap.loop_peers()
    with IPRoute() as ip:
        return sorted(link.get_attr("IFLA_IFNAME") for link in ip.get_links()
                      if link["flags"] & 1 and link.get_attr("IFLA_IFNAME") not in skip)


class Printer:
    """Live counters: rates over the last interval and totals."""

    def __init__(self, as_json, out=sys.stdout):
        self.json = as_json
        self.out = out
        self.last = None
        self.rows = 0

    def header(self, tap, ifaces, direction):
        watch = ", ".join(tap.watch) if tap.watch is not None else "everything"
        msg = dict(event="attached", monitor=tap.monitor, ifaces=ifaces, direction=direction,
                   watch=tap.watch, match=tap.match, sample=tap.sample, clone=tap.clone)
        if self.json:
            self._emit(msg)
        else:
            self._emit(f"vtap: tapping {', '.join(ifaces)} ({direction}) -> {tap.monitor}; "
                       f"watching {watch} (match {tap.match}), sample 1/{tap.sample}; Ctrl-C to stop")

    def sample(self, counters, final=False):
        now = time.monotonic()
        if self.last is None:
            dt, prev = None, None
        else:
            dt, prev = now - self.last[0], self.last[1]
        self.last = (now, counters)
        rates = {k: (counters[k] - prev[k]) / dt if dt else 0.0 for k in COUNTERS} if prev else {k: 0.0 for k in COUNTERS}
        if self.json:
            self._emit({"event": "final" if final else "counters", "time": round(time.time(), 3),
                        **counters, **{f"{k}_pps": round(v, 1) for k, v in rates.items()}})
            return
        if self.rows % 20 == 0 or final:
            self._emit(f"{'':8} {'SEEN/s':>10} {'MATCHED/s':>10} {'CLONED/s':>10} {'FAILED/s':>9} |"
                       f" {'SEEN':>11} {'MATCHED':>11} {'CLONED':>11} {'FAILED':>9}")
        self.rows += 1
        label = "total" if final else time.strftime("%H:%M:%S")
        self._emit(f"{label:8} " + " ".join(f"{rates[k]:>{9 if k == 'failed' else 10}.0f}" for k in COUNTERS)
                   + " | " + " ".join(f"{counters[k]:>{9 if k == 'failed' else 11}}" for k in COUNTERS))

    def _emit(self, obj):
        print(json.dumps(obj) if isinstance(obj, dict) else obj, file=self.out, flush=True)


class Stop(Exception):
    """SIGTERM/SIGHUP: leave the loop and detach, as Ctrl-C does."""


_MAIN_PID = os.getpid()


def _raise_stop(signum, frame):
    # pyroute2 forks short-lived helpers to open sockets in other namespaces and
    # stops them with SIGTERM. They inherit this handler, and must die quietly
    # rather than unwind a copy of our stack (which would detach the vTAP).
    if os.getpid() != _MAIN_PID:
        os._exit(128 + signum)
    raise Stop(signal.Signals(signum).name)


def run(a):
    from ebpf import TcMirror
    from ebpf import tc

    if a.cleanup:
        removed = tc.cleanup("vtap")
        for what in removed:
            print(f"vtap: removed {what}")
        if not removed:
            print("vtap: nothing to clean up in this namespace")
        return 0

    tap = TcMirror(monitor=a.monitor, watch=a.watch, match=a.match, sample=a.sample, clone=a.clone,
                   source=a.program)
    ifaces = a.iface or default_ifaces(tap)
    if not ifaces:
        raise UsageError("no interface to tap: none is UP besides lo and the monitor (use --iface)")
    if a.ebpf:
        print(tap.c_text())
        print("// cflags: " + " ".join(tap.cflags))
        return 0
    for ifname in ifaces:  # all names checked before anything is attached
        tap.check_iface(ifname)

    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    printer = Printer(a.json)
    with tap:
        tap.load_program()
        tap.attach_many(ifaces, a.direction)
        printer.header(tap, ifaces, a.direction)
        for f in tap.tc_filters:
            if f.runs_after:
                print(f"vtap: warning: {f.runs_after} existing filter(s) on {f.ifname} {f.direction} run before the "
                      "vTAP; frames they stop are not mirrored", file=sys.stderr)
        if not tap.monitor_is_up():
            print(f"vtap: warning: monitor {tap.monitor} is down: the kernel drops the copies without an error",
                  file=sys.stderr)
        printer.sample(tap.counters())
        deadline = time.monotonic() + a.duration if a.duration else None
        try:
            while True:
                wait = a.interval if deadline is None else min(a.interval, deadline - time.monotonic())
                if wait > 0:
                    time.sleep(wait)
                if deadline is not None and time.monotonic() >= deadline:
                    break
                printer.sample(tap.counters())
        except (KeyboardInterrupt, Stop):
            pass
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # no second signal while detaching
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            printer.sample(tap.counters(), final=True)
    return 0


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        check_args(a)
        if os.geteuid() != 0:
            raise UsageError("must run as root (loading BPF programs and changing TC hooks needs CAP_BPF and CAP_NET_ADMIN)")
        from ebpf.program import import_bcc
        import_bcc()
        return run(a)
    except UsageError as e:
        print(f"vtap: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except ImportError as e:
        print(f"vtap: error: Python package {e.name!r} is missing; run `make setup` as root and use .venv/bin/python",
              file=sys.stderr)
        return 1
    except Exception as e:
        from ebpf.errors import BpfError
        if isinstance(e, BpfError):
            print(f"vtap: error: {e}", file=sys.stderr)
            return 1
        raise
