"""The Python API where users type it: a Jupyter kernel's main thread (whose
asyncio loop is running), asyncio.run(), several threads; objects that explain
themselves; safe to re-run and to interrupt; a dead run's leftovers said."""

import _thread
import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT
from helpers import execute_notebook, read_notebook, wait_for
from jupyter_client.manager import start_new_kernel

import lab
from ebpf import InputError, TcMirror, XdpSink, tc
from lab import Flow, Sampler, Topology, dead_runs, live, netns, remove_leftovers, runs
from lab.metrics import iface_counters
from lab.runs import RUN_DIR

QUICKSTART = ROOT / "notebooks" / "00_quickstart.ipynb"


def _texts(cell):
    out = []
    for o in cell.outputs:
        if o.output_type == "stream":
            out.append(o.text)
        elif o.output_type in ("execute_result", "display_data"):
            out.append(o.get("data", {}).get("text/plain", ""))
        elif o.output_type == "error":
            out.append(f"ERROR {o.ename}: {o.evalue}")
    return "".join(out)


def test_quickstart_runs_cell_by_cell_in_the_projects_kernel():
    """The README's quick start, executed as JupyterLab runs it, by the kernel
    the README's command registers: every API call in the kernel's main thread."""
    nb = read_notebook(QUICKSTART)
    assert nb.metadata.kernelspec.name == "ebpf-vtap-lab"
    before = _not_others()
    nb = execute_notebook(QUICKSTART, {"VTL_QS_COUNT": "50", "VTL_QS_RATE": "400", "VTL_QS_SECONDS": "3"})
    text = "\n".join(_texts(c) for c in nb.cells if c.cell_type == "code")
    assert "ERROR" not in text, text
    assert "Traceback" not in text
    assert "at the monitor: {'watched': 50}" in text  # exactly the watched flow, exactly once
    assert "after set_watch: at the monitor: {'unwatched': 50}" in text
    assert "InputError TcMirror is already attached to eth0 ingress" in text
    peak = int(re.search(r"peak cloned rate ([\d,]+) pps", text).group(1).replace(",", ""))
    assert 200 <= peak <= 800, text  # paced at 400 pps
    assert "attached: []; namespaces left: []" in text
    pngs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 1
    assert _not_others() == before  # the kernel has exited: whatever it left would be a dead run's


def _not_others():
    """Lab namespaces but those of another live process (a bench or a second
    suite beside this one, which come and go as they like)."""
    return {
        n for n in netns.lab_namespaces() if runs.run_of(n) in runs.LIVE_RUNS or not runs.owner_alive(runs.run_of(n))
    }


def _sequence(count=40):
    """What a notebook does, as plain calls: returns (monitor counts before and
    after a watch-list change, the testbed's namespace prefix)."""
    with lab.testbed1() as tb:
        tap = TcMirror(monitor=tb.monitor_iface, watch=[f"{tb.src4}/32"], netns=tb.ns("receiver"))
        try:
            tap.attach("eth0", "ingress")
            flows = [Flow("w", tb.src4, tb.dst4, count=count), Flow("u", tb.alt_src4, tb.dst4, count=count)]
            with tb.capture() as mon:
                tb.send(flows)
            first = dict(mon.counts)
            tap.set_watch([f"{tb.alt_src4}/32"])
            with tb.capture() as mon:
                tb.send(flows)
            second = dict(mon.counts)
            frame = tap.counters_frame()
        finally:
            tap.close()
        return first, second, frame, tb.topo.prefix


def _nothing_left(prefix):
    assert not [n for n in netns.lab_namespaces() if n.startswith(prefix)]


def test_the_api_inside_a_running_asyncio_loop():
    async def main():
        asyncio.get_running_loop()  # as in a notebook cell: a loop runs in this very thread
        return _sequence()

    first, second, frame, prefix = asyncio.run(main())
    assert first == {"w": 40} and second == {"u": 40}
    assert frame.loc["eth0", "cloned"] == 80 and frame.index.name == "interface"
    _nothing_left(prefix)


def test_the_api_from_several_threads_at_once():
    results, errors = [], []

    def one():
        try:
            results.append(_sequence(30))
        except BaseException as e:  # handed to the test
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert [(r[0], r[1]) for r in results] == [({"w": 30}, {"u": 30})] * 2
    for r in results:
        _nothing_left(r[3])


def test_objects_explain_themselves(tb1):
    text = repr(tb1)
    for host in ("sender", "receiver", "monitor"):
        assert tb1.ns(host) in text
    assert "mon0" in text and "198.18.1.10/24" in text and "tap_host=receiver" in text
    assert "<table>" in tb1._repr_html_() and tb1.ns("monitor") in tb1._repr_html_()
    topo = Topology("declared")
    topo.add_host("a")
    topo.add_host("b")
    topo.add_link("a", "b")
    assert "not built" in repr(topo) and "veth to b/eth0" in repr(topo)
    tap = TcMirror(monitor="mon0", watch=["198.18.1.0/24", "2001:2::/48"], netns=tb1.ns("receiver"))
    try:
        assert "not loaded" in repr(tap) and tap.bpf is None  # a repr never compiles
        tap.attach("eth0", "ingress")
        r = repr(tap)
        assert f"eth0 ingress (tc) in netns {tb1.ns('receiver')}" in r
        assert "monitor mon0" in r and "1 IPv4 + 1 IPv6 entries" in r and "cloned=0" in r
        assert "eth0 ingress" in tap._repr_html_()
    finally:
        tap.close()
    assert "not loaded" in repr(tap)


def test_attaching_again_is_refused_and_changes_nothing(tb1):
    ns = tb1.ns("receiver")
    tap = TcMirror(monitor="mon0", watch=[f"{tb1.src4}/32"], netns=ns)
    try:
        tap.attach("eth0", "ingress")
        for direction in ("ingress", "both"):
            with pytest.raises(InputError, match="already attached to eth0 ingress"):
                tap.attach("eth0", direction)
        assert len(tc.filters_of("vtap", ns, tb1.topo.ifindex("receiver", "eth0"))) == 1
        with tb1.capture() as mon:
            tb1.send(Flow("w", tb1.src4, tb1.dst4, count=100))
        assert dict(mon.counts) == {"w": 100}  # once each, not twice
    finally:
        tap.close()
    sink = XdpSink("pass")
    try:
        sink.attach("eth0", netns=tb1.ns("sender"))
        with pytest.raises(InputError, match="already attached to eth0 XDP"):
            sink.attach("eth0", netns=tb1.ns("sender"))
    finally:
        sink.close()


def test_a_second_object_on_the_same_hook_is_said(tb1, capsys):
    """A re-run cell makes a new object while the old one is still attached."""
    ns = tb1.ns("receiver")
    first, second = TcMirror(monitor="mon0", netns=ns), TcMirror(monitor="mon0", netns=ns)
    try:
        first.attach("eth0", "ingress")
        capsys.readouterr()
        second.attach("eth0", "ingress")
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            len(err) == 1
            and "eth0 ingress already has another vTAP filter (another TcMirror of this "
            "process runs it: close() that one)"
            in err[0]
        )
    finally:
        second.close()
        first.close()


def _interrupt_after(seconds):
    t = threading.Timer(seconds, _thread.interrupt_main)
    t.start()
    return t


def _interrupted_loop(tap, delay):
    """attach/detach in a loop until an interrupt `delay` s in (or a second
    after the loop, when it ended first)."""
    timer = threading.Timer(delay, _thread.interrupt_main)
    try:
        timer.start()
        for _ in range(50):
            tap.attach("eth0", "both")
            for f in tap.tc_filters:
                tap.detach_tc(f)
        timer.join()  # the loop ended first: the interrupt is due now,
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # raised at a bytecode boundary of this loop
            time.sleep(0.001)
        pytest.fail("the interrupt never arrived")
    except KeyboardInterrupt:
        pass
    timer.join()


def test_an_interrupt_leaves_objects_usable(tb1):
    tap = TcMirror(monitor="mon0", watch=[f"{tb1.src4}/32"], netns=tb1.ns("receiver"))
    try:
        tap.attach("eth0", "ingress")
        # sampling and the live view: stopped early, what was read is kept
        _interrupt_after(0.6)
        s = Sampler(tap, interval=0.1)
        s.run(10)
        assert s.interrupted and 3 <= len(s.reads) < 20
        _interrupt_after(0.6)
        view = live(tap, seconds=10, interval=0.1)
        assert view.interrupted
        # traffic: the send stops, the testbed and the program go on
        rx0, seen0 = iface_counters(tb1.ns("receiver"), "eth0")["rx_packets"], tap.counters()["seen"]
        _interrupt_after(0.5)
        with pytest.raises(KeyboardInterrupt):
            tb1.send(Flow("w", tb1.src4, tb1.dst4, count=2000), rate_pps=1000)
        # every frame the interrupted send got out has passed the vTAP (the receiver's
        # kernel counts a frame before its ingress hook runs) before the counters restart
        wait_for(
            lambda: tap.counters()["seen"] - seen0 == iface_counters(tb1.ns("receiver"), "eth0")["rx_packets"] - rx0,
            what="the vTAP to see every frame",
        )
        tap.reset_counters()
        with tb1.capture() as mon:
            tb1.send(Flow("again", tb1.src4, tb1.dst4, count=50))
        assert dict(mon.counts) == {"again": 50} and tap.counters()["cloned"] == 50
        tap.close()
        # attach and detach, interrupted at moments spread over the calls: the
        # kernel's filters are always exactly the ones the object knows
        ifindex = tb1.topo.ifindex("receiver", "eth0")
        for delay in (0.0, 0.003, 0.007, 0.012, 0.02, 0.03, 0.05):
            tap = TcMirror(monitor="mon0", netns=tb1.ns("receiver"))
            tap.load_program()
            _interrupted_loop(tap, delay)
            kernel = tc.filters_of("vtap", tb1.ns("receiver"), ifindex)
            assert sorted(o.entry.prog_id for o in kernel) == sorted(f.prog_id for f in tap.tc_filters)
            tap.close()
            assert tc.filters_of("vtap", tb1.ns("receiver"), ifindex) == []
    except KeyboardInterrupt:  # pragma: no cover - a stray interrupt must not end the session
        pytest.fail("an interrupt escaped")
    finally:
        tap.close()


def test_sampler_rates_add_up_to_the_counters(tb1):
    tap = TcMirror(monitor="mon0", watch=[f"{tb1.src4}/32"], netns=tb1.ns("receiver"))
    try:
        tap.attach("eth0", "ingress")
        flow = Flow("w", tb1.src4, tb1.dst4, count=300, size=200)
        with Sampler(tap, interval=0.1, by_row=True) as s:
            tb1.send(flow, rate_pps=600)
            wait_for(lambda: tap.counters()["cloned"] == 300, what="300 copies")
            n = len(s.times)
            wait_for(lambda: len(s.times) > n, what="a sample after the last copy")
        counts, rates = s.counts, s.rates
        assert counts["eth0 cloned"].iloc[-1] - counts["eth0 cloned"].iloc[0] == 300
        seconds = [b - a for a, b in zip(s.times, s.times[1:], strict=False)]
        assert round(sum(r * dt for r, dt in zip(rates["eth0 cloned pps"], seconds, strict=True))) == 300
        mbits = sum(r * dt for r, dt in zip(rates["eth0 cloned Mbps"], seconds, strict=True))
        assert abs(mbits - 300 * 200 * 8 / 1e6) < 1e-6
        assert "eth0 sampled_out pps" not in rates  # never moved: left out
        with pytest.raises(ValueError, match="bounded"):
            Sampler(tap).run(10_000)
        with pytest.raises(ValueError, match="interval"):
            Sampler(tap, interval=0)
    finally:
        tap.close()


def test_a_started_sampler_has_read_before_the_traffic_after_it():
    """`with Sampler(tap): tb.send(...)` counts every packet sent in the block: the
    first read is taken before start() returns. Read by the sampler's thread, it came
    after the first copy once frames were built fast (299 of 300 counted, CI). Here
    the thread is held until the counter has moved: a first read of it sees 7."""
    value, gate = [0], threading.Event()

    def source():
        if threading.current_thread() is not threading.main_thread():
            gate.wait(5)
        return {"n": value[0]}

    s = Sampler(source, interval=0.05).start()
    value[0] = 7
    gate.set()
    time.sleep(0.12)
    s.stop()
    assert s.reads[0] == {("", "n"): 0} and s.reads[-1] == {("", "n"): 7}
    assert s.counts["n"].iloc[-1] - s.counts["n"].iloc[0] == 7


KILLED_RUN = """
import os, sys, time
from lab import testbed1
tb = testbed1().build()
print(tb.topo.run_id, flush=True)
time.sleep(60)
"""


def test_a_dead_runs_leftovers_are_said_once_with_what_removes_them(capsys):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        run_id = proc.stdout.readline().strip()
        assert run_id, "the run did not start"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    try:
        assert run_id in dead_runs() and len(dead_runs()[run_id]) == 3
        capsys.readouterr()
        topo = Topology("after")
        topo.add_host("a")
        with topo:
            err = capsys.readouterr().err.strip().splitlines()
            said = [ln for ln in err if f"{netns.PREFIX}{run_id}-*" in ln]
            assert len(said) == 1 and "3 namespaces" in said[0]
            assert "python -m lab cleanup" in said[0] and "lab.remove_leftovers()" in said[0]
            tap = TcMirror(monitor="lo")
            tap.compile()  # a program starting says nothing new: said once
            tap.close()
            assert f"{netns.PREFIX}{run_id}-*" not in capsys.readouterr().err
            removed = remove_leftovers()  # the dead run's, never this process's live one
            assert sum(f"{netns.PREFIX}{run_id}-" in r for r in removed) == 3
            assert not [r for r in removed if topo.prefix in r] and netns.exists(topo.ns("a"))
            assert run_id not in dead_runs() and not (RUN_DIR / f"{run_id}.pid").exists()
    finally:
        for name in netns.lab_namespaces():
            if name.startswith(f"{netns.PREFIX}{run_id}-"):
                netns.remove(name)
        (RUN_DIR / f"{run_id}.pid").unlink(missing_ok=True)


def test_lab_exports_what_a_notebook_imports():
    for name in (
        "testbed1",
        "testbed2",
        "Topology",
        "Flow",
        "Marker",
        "build",
        "send_frames",
        "Capture",
        "Sampler",
        "sample",
        "live",
        "remove_leftovers",
        "dead_runs",
    ):
        obj = getattr(lab, name)
        assert obj.__doc__, name
    assert runs.CLEANUP.startswith("python -m lab cleanup")
    assert os.path.exists(QUICKSTART)


def test_notebooks_call_the_api_in_their_own_thread():
    """No notebook hides the API in a worker thread any more: each calls it as a user types it."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = read_notebook(path)
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert "ThreadPoolExecutor" not in code and "threading" not in code, path.name
        assert nb.metadata.kernelspec.name == "ebpf-vtap-lab", path.name


def test_interrupting_a_cell_in_a_real_kernel_leaves_the_program_usable():
    """The notebook's stop button during a live view (SIGINT to the kernel), then
    the next cells: the view ended early, the vTAP is still attached and counting."""
    km, kc = start_new_kernel(kernel_name="ebpf-vtap-lab", cwd=str(ROOT))
    outputs = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            outputs.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            outputs.append(f"ERROR {msg['content']['ename']}")

    try:
        kc.execute_interactive(
            "from lab import testbed1, Flow, live\nfrom ebpf import TcMirror\ntb = testbed1().build()\n"
            "tap = TcMirror(monitor='mon0', watch=[f'{tb.src4}/32'], netns=tb.ns('receiver'))\n"
            "tap.attach('eth0', 'ingress')",
            timeout=120,
            output_hook=hook,
        )
        msg_id = kc.execute("view = live(tap, seconds=60, interval=0.2)")
        time.sleep(3)
        km.interrupt_kernel()
        reply = kc._recv_reply(msg_id, timeout=30)
        assert reply["content"]["status"] == "ok"  # live() ends at the interrupt, quietly
        # an awaited sampler beside paced traffic: both end with the cell. The kernel sends
        # an error's reply before it aborts what is queued behind it (stop_on_error), so a
        # next cell sent on that reply races the abort and was dropped without a word
        # (CI, two workers): the user here runs the next cells on purpose.
        msg_id = kc.execute(
            "import asyncio\nfrom lab import Sampler\n"
            "await asyncio.gather(Sampler(tap, interval=0.2).arun(60), "
            "tb.asend(Flow('w', tb.src4, tb.dst4, count=1500), rate_pps=150))",
            stop_on_error=False,
        )
        time.sleep(6)
        km.interrupt_kernel()
        reply = kc._recv_reply(msg_id, timeout=30)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] in (
            "KeyboardInterrupt",
            "CancelledError",
        )
        replies = [
            kc.execute_interactive(
                "import time\nc0 = tap.counters()['seen']; time.sleep(1.5); c1 = tap.counters()['seen']\n"
                "print('after the interrupt', c1 - c0, 'frames in 1.5 s; sent before it', c0)",
                timeout=60,
                output_hook=hook,
            )
        ]
        replies += [
            kc.execute_interactive(
                "tap.reset_counters()\n"
                "with tb.capture() as mon:\n    tb.send(Flow('w', tb.src4, tb.dst4, count=40))\n"
                "print('interrupted', view.interrupted, 'hooks', tap.hooks(), 'mon', dict(mon.counts))\n"
                "tap.close(); tb.close(); print('closed', tap.hooks())",
                timeout=120,
                output_hook=hook,
            )
        ]
        assert [r["content"]["status"] for r in replies] == ["ok", "ok"]  # none aborted
        text = "".join(outputs)
        assert "ERROR" not in text, text
        assert "interrupted True hooks ['eth0 ingress (tc) in netns " + netns.PREFIX in text, text
        assert "mon {'w': 40}" in text, text
        assert "closed []" in text
        stopped = re.search(r"after the interrupt (\d+) frames in 1.5 s; sent before it (\d+)", text)
        assert stopped and int(stopped.group(1)) == 0 and 0 < int(stopped.group(2)) < 1500, text
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
