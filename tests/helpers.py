"""Small pieces the tests share: send flows through a testbed and count them; run
code where the kernel refuses it."""

import contextlib
import ctypes
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from ebpf.instruments.xdp_sink import XdpSink
from lab import netns, nft
from lab.daemons.nginx import NginxServer
from lab.fastpaths.lb.testbed import lb_testbed
from lab.metrics import iface_counters
from lab.testbeds import Testbed
from lab.traffic import Capture, Marker, build, send_frames

# The testbeds' addresses (the same in both), named for what the tests do with them.
WATCHED_SRC4, UNWATCHED_SRC4 = Testbed.src4, Testbed.alt_src4
RX4, RX4_ALT = Testbed.dst4, Testbed.alt_dst4
WATCHED_SRC6, UNWATCHED_SRC6 = Testbed.src6, Testbed.alt_src6
RX6 = Testbed.dst6

RATE = 20_000  # packets/s: "modest": zero loss is required at this rate


def run_flows(tb, flows, rate=RATE, sender=None, sender_iface="eth0", dst_mac=None, extra_captures=()):
    """Send flows from the sender; count them at the receiver and the monitor.
    Returns (report, receiver counts, monitor counts)."""
    marker = Marker()
    sender = sender or tb.sender
    src_mac = tb.topo.mac(sender, sender_iface)
    frames = build(flows, marker, src_mac, dst_mac or tb.next_hop_mac)
    with (
        Capture(tb.ns(tb.receiver), tb.receiver_iface, marker) as rx,
        Capture(tb.ns(tb.monitor), tb.monitor_capture_iface, marker) as mon,
    ):
        report = send_frames(tb.ns(sender), sender_iface, frames, rate_pps=rate)
        # The run's end: the receiver has every frame (a vTAP never holds one back;
        # where a test expects fewer, this waits its full time), so every copy made
        # of them has been sent to the monitor; then each capture has read all its
        # interface counted.
        rx.finish(Counter(k for k in map(marker, frames) if k))
        mon.finish()
    assert report.packets == len(frames)
    assert rx.kernel_drops == 0 and mon.kernel_drops == 0, "the capture itself lost frames"
    return report, rx.counts, mon.counts


def snmp(ns, proto, field):
    """One counter of a namespace's IPv4 MIBs (/proc/net/snmp): proto "Udp", "Icmp", ..."""
    text = netns.run(ns, ["cat", "/proc/net/snmp"], capture_output=True, text=True).stdout
    names, values = [line.split() for line in text.splitlines() if line.startswith(proto + ":")]
    return int(values[names.index(field)])


def invariant(c):
    """The vTAP's own tally, of counters read once traffic has stopped: the
    program counts every frame in `seen` as it arrives, and at its one exit in
    one verdict and in one reason (include/verdict.h), so both sums must come
    to `seen` whatever path a frame took. (matched == cloned + sampled_out +
    failed holds by construction: TcMirror derives matched from those.)"""
    reasons = ("not_ip", "malformed", "unmatched", "sampled_out", "cloned", "failed")
    return (
        c["seen"] == c["pass"] + c["mirror"] == sum(c[k] for k in reasons)
        and c["matched"] == c["cloned"] + c["sampled_out"] + c["failed"]
    )


def frames_in(ns, ifname):
    """How many frames interface `ifname` of namespace `ns` receives from now on,
    by the kernel's own count (every frame, not only a run's marked ones): a
    function that reads it. At a monitor, that is every copy that arrived."""
    base = iface_counters(ns, ifname)["rx_packets"]
    return lambda: iface_counters(ns, ifname)["rx_packets"] - base


def wait_for(predicate, timeout=10.0, what="the condition"):
    """Return once predicate() is true (polled every 10 ms); fail, saying `what`
    was waited for, if it is not within `timeout` seconds. For state reached
    asynchronously (a veth's NAPI, a capture's thread, a counter in another
    namespace): a wait on the state itself, never a sleep that guesses how long."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}")
        time.sleep(0.01)


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


def in_a_thread_without_net_admin(fn):
    """Run fn in a thread whose effective capabilities lack CAP_NET_ADMIN, and
    return what it raised (or None). Linux keeps capabilities per thread, so the
    rest of the process keeps its own, and the kernel really refuses (EPERM)
    every netlink change the thread asks for."""
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}

    def body():
        hdr, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3, this thread
        if libc.capget(ctypes.byref(hdr), data) != 0:
            out["error"] = OSError(ctypes.get_errno(), "capget")
            return
        data[0].effective &= ~(1 << 12)  # CAP_NET_ADMIN; still permitted, but the thread ends anyway
        if libc.capset(ctypes.byref(hdr), data) != 0:
            out["error"] = OSError(ctypes.get_errno(), "capset")
            return
        try:
            fn()
        except Exception as e:
            out["raised"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("raised")


def unchecked_copy(source, ctx_data, tmp_path):
    """A copy of a program's C file that reads a byte of the frame without proving
    it is there (its `st->exits.seen++;` becomes such a read): the verifier must refuse it."""
    src = Path(source).read_text()
    count = "\tst->exits.seen++;\n"
    assert count in src, f"{source} has no `st->exits.seen++;` line to break"
    broken = tmp_path / Path(source).name
    broken.write_text(src.replace(count, f"\tst->exits.seen += *(__u8 *)(long){ctx_data};  /* no bounds check */\n"))
    return broken


def nft_udp_counter(ns, port):
    """An nftables counter of UDP datagrams to `port` arriving in namespace `ns`
    (prerouting, before any socket, IPv4 and IPv6): returns a function that reads it."""
    t = {"family": "inet", "table": "vtl_count"}
    nft.run(
        ns,
        [
            {"add": {"table": {"family": "inet", "name": "vtl_count"}}},
            {
                "add": {
                    "chain": {
                        **t,
                        "name": "pre",
                        "type": "filter",
                        "hook": "prerouting",
                        "prio": -400,
                        "policy": "accept",
                    }
                }
            },
            {
                "add": {
                    "rule": {
                        **t,
                        "chain": "pre",
                        "expr": [
                            {
                                "match": {
                                    "op": "==",
                                    "left": {"payload": {"protocol": "udp", "field": "dport"}},
                                    "right": port,
                                }
                            },
                            {"counter": None},
                        ],
                    }
                }
            },
        ],
    )
    return lambda: nft.counters(ns, "inet", "vtl_count")[0][0]


ROOT = Path(__file__).resolve().parents[1]


def read_notebook(path):
    """A notebook file, as nbformat reads it. nbformat and nbclient are imported here, not
    at the top: they take 3 s of CPU to import (jsonschema), and every worker of the
    suite imports every test module when it collects, the notebooks' or not."""
    import nbformat  # noqa: PLC0415 -- see above

    return nbformat.read(path, as_version=4)


def execute_notebook(path, env):
    """A notebook run as Jupyter runs it (the kernel its metadata names, the
    project's own as `make lab` registers it; from the repository root) with
    `env` set for the kernel; returns the executed notebook."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from nbclient import NotebookClient  # noqa: PLC0415 -- read_notebook() says why

        nb = read_notebook(path)
        NotebookClient(
            nb, timeout=600, kernel_name=nb.metadata.kernelspec.name, resources={"metadata": {"path": str(ROOT)}}
        ).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb


def assert_every_figure_shown_once(nb, figures):
    """Each cell that saves a figure also shows it, once, as a PNG in the notebook
    (when lab.fastpaths.vtap.plots forced matplotlib's Agg backend, the notebook showed none),
    and no cell raised."""
    shown = 0
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        pngs = [
            o
            for o in c.outputs
            if o.output_type in ("display_data", "execute_result") and "image/png" in o.get("data", {})
        ]
        assert len(pngs) == c.source.count(".savefig("), c.source
        shown += len(pngs)
    assert shown == len(figures)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


@contextlib.contextmanager
def lb_bed(backends=2, attacker=False, log=True, dsr=False):
    """lab.fastpaths.lb.testbed.lb_testbed with an nginx on each backend (port 8080, its
    page says "served by beN") and the pass program on the switch's port to the
    LB (veth drops XDP_TX frames unless the peer runs XDP): (testbed, servers).
    dsr: the backends also hold the VIP and serve it on the service's port (the
    servers after the first `backends`), as bench lb's rig does for tc-dsr."""
    tb = lb_testbed(backends=backends, attacker=attacker, dsr=dsr)
    with tb:
        webs = [
            NginxServer(tb.ns(be), tb.backend4(i), tb.backend_port, name=be, log=log)
            for i, be in enumerate(tb.backends)
        ]
        if dsr:
            webs += [NginxServer(tb.ns(be), tb.vip4, tb.service_port, name=be, log=log) for be in tb.backends]
        sink = XdpSink("pass")
        try:
            for w in webs:
                w.start()
            sink.attach(tb.lb, netns=tb.ns(tb.switch))
            yield tb, webs
        finally:
            sink.close()
            for w in webs:
                w.close()


class Lines:
    """A child's output stream read by a thread, line by line, so that a test can
    wait for a line with a timeout (select() on a buffered pipe misses lines
    already read into the buffer)."""

    def __init__(self, stream):
        self.q = queue.Queue()
        self.t = threading.Thread(target=lambda: [self.q.put(ln) for ln in stream] + [self.q.put(None)], daemon=True)
        self.t.start()

    def wait_for(self, text, timeout=20.0):
        deadline = time.monotonic() + timeout
        while True:
            line = self.next(max(0.01, deadline - time.monotonic()), f"line with {text!r}")
            assert line is not None, f"the stream ended before a line with {text!r}"
            if text in line:
                return line

    def next(self, timeout=20.0, what="line"):
        """The next line, or None once the stream has ended."""
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no {what} within {timeout:g} s") from None


# --- the fast paths' command lines, judged by echo sockets (tests/echo.py) ---------------

ROOT = Path(__file__).resolve().parents[1]
ECHO = str(ROOT / "tests" / "echo.py")
PORT = 7000  # where the backends listen
N = 12  # UDP exchanges and TCP connections per family


class Tool:
    """`python -m lab CMD ARGS --json` in a namespace, as a user runs it."""

    def __init__(self, ns, cmd, *args, interval=0.5, env=None):
        self.p = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "lab", cmd, *args, "--json", "--interval", str(interval)],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.out, self.err = Lines(self.p.stdout), Lines(self.p.stderr)
        self.attached = json.loads(self.out.wait_for('"attached"', timeout=90))

    def stop(self):
        """SIGTERM; the last JSON object (its final counters) and every warning."""
        self.p.send_signal(signal.SIGTERM)
        assert self.p.wait(timeout=30) == 0
        lines = [ln for ln in iter(self.out.q.get, None)]
        warnings = [ln for ln in iter(self.err.q.get, None)]
        return json.loads(lines[-1]), warnings

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def echo_servers(topo, hosts, count_dir=None):
    """tests/echo.py serving on each host; with count_dir, each writes how many
    TCP connections it has accepted to count_dir/HOST."""
    procs = []
    for h in hosts:
        extra = [str(count_dir / h)] if count_dir else []
        p = topo.popen(h, [sys.executable, ECHO, "serve", str(PORT), *extra], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "ready"
    return procs


def exchange(topo, host, dst, port, n=N, expect_none=False, **kw):
    """tests/echo.py exchange from `host`; expect_none: a test that expects no
    answer tries once, with short timeouts. kw: more for subprocess (preexec_fn)."""
    argv = [sys.executable, ECHO, "exchange", dst, str(port), str(n), *(["once"] if expect_none else [])]
    out = topo.run(host, argv, capture_output=True, text=True, timeout=16 * n + 60, **kw).stdout
    return json.loads(out.strip().splitlines()[-1])


def stop_all(procs):
    for p in procs:
        p.kill()
        p.wait()


def start_until(argv, ready, timeout=120, **kw):
    """Start a command of the lab (in a process group of its own, so that a
    test can signal all of it) and return it once `ready()` is true; killed,
    with the group, if it exits first or the deadline passes."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw
    )
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc


def assert_run_averages(final, rows, key="packets"):
    """A live table's final rates are averages over the whole run: each row's
    `<key>_pps` is its count over the run's `seconds` (which the tool rounds to
    the millisecond, and the rate to 0.1)."""
    s = final["seconds"]
    for name, r in rows.items():
        lo, hi = r[key] / (s + 5e-4) - 0.05, r[key] / (s - 5e-4) + 0.05
        assert lo <= r[f"{key}_pps"] <= hi, (name, r, s)


def assert_bench_refused(r, message, out_dir):
    """A `python -m lab bench` run refused its input: exit status 1, one line on stderr
    that says so (matching the regular expression `message`), nothing written."""
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("lab bench: error: "), r.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not list(Path(out_dir).iterdir())
