"""The main job (`make demo`): build Testbed 1, run `python -m vtap` on the
receiver with a watch-list, send a bounded mix of watched and unwatched flows, and
show per flow what was sent, received and mirrored; then tear everything down.
"""

import json
import signal
import subprocess
import sys
import time

from lab import netns
from lab.testbeds import testbed1
from lab.traffic import Capture, Flow, Marker, build, send_frames


def watch_list(tb):
    """Watched: the sender's first source (v4 and v6), and the receiver's second address."""
    return [f"{tb.src4}/32", f"{tb.alt_dst4}/32", f"{tb.src6}/128"]


def demo_flows(tb, count):
    """(flow, watched?): watched by source, or by destination."""

    def short(a):
        return a[a.rfind(":") :] if ":" in a else a[a.rfind(".") :]

    def flow(proto, src, dst, watched, why):
        name = f"{proto}{6 if ':' in src else 4} {short(src)}->{short(dst)} ({why})"
        return Flow(name, src, dst, proto, count=count), watched

    return [
        flow("udp", tb.src4, tb.dst4, True, "src watched"),
        flow("tcp", tb.src4, tb.dst4, True, "src watched"),
        flow("udp", tb.alt_src4, tb.alt_dst4, True, "dst watched"),
        flow("udp", tb.alt_src4, tb.dst4, False, "unwatched"),
        flow("tcp", tb.alt_src4, tb.dst4, False, "unwatched"),
        flow("udp", tb.src6, tb.dst6, True, "src watched"),
        flow("tcp", tb.src6, tb.dst6, True, "src watched"),
        flow("udp", tb.alt_src6, tb.dst6, False, "unwatched"),
    ]


def start_vtap(tb, args, timeout=30):
    """`python -m vtap` in the tap host's namespace; returns once it has attached."""
    argv = [
        sys.executable,
        "-m",
        "vtap",
        "--monitor",
        tb.monitor_iface,
        "--iface",
        tb.tap_iface,
        "--direction",
        tb.tap_direction,
        "--json",
        *args,
    ]
    proc = tb.topo.popen(tb.tap_host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vtap exited ({proc.wait()}): {proc.stderr.read().strip()}")
        if json.loads(line).get("event") == "attached":
            return proc
    proc.kill()
    raise RuntimeError(f"vtap did not attach within {timeout} s")


def stop_vtap(proc, timeout=10):
    """SIGINT, as Ctrl-C would; returns vtap's final counters."""
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"vtap failed ({proc.returncode}): {err.strip()}")
    final = [json.loads(line) for line in out.splitlines() if line.strip()]
    return next(o for o in reversed(final) if o.get("event") == "final")


def run(count=1000, rate_pps=20000, out=sys.stdout):
    t0 = time.monotonic()
    say = lambda s="": print(s, file=out, flush=True)  # noqa: E731
    tb = testbed1()
    with tb:
        say(
            f"Testbed 1 (namespaces {tb.topo.prefix}*): sender -> receiver {tb.dst4} (vTAP on eth0 ingress) "
            "-> mon0 -> monitor"
        )
        watch = watch_list(tb)
        say("vtap --monitor mon0 --iface eth0 " + " ".join(f"--watch {w}" for w in watch))
        vtap = start_vtap(tb, [a for w in watch for a in ("--watch", w)])
        flows = demo_flows(tb, count)
        marker = Marker()
        frames = build([f for f, _ in flows], marker, tb.sender_mac, tb.next_hop_mac)
        with Capture(tb.ns("receiver"), "eth0", marker) as rx, Capture(tb.ns("monitor"), "eth0", marker) as mon:
            report = send_frames(tb.ns("sender"), "eth0", frames, rate_pps=rate_pps)
        counters = stop_vtap(vtap)

    say(f"\nsent {report.packets} frames in {report.seconds:.2f} s ({report.pps:,.0f} pps)\n")
    say(f"{'flow':32} {'watched':>7} {'sent':>6} {'received':>8} {'mirrored':>8}  ok")
    ok = True
    unwatched_at_monitor = 0
    for flow, watched in flows:
        want = flow.count if watched else 0
        got_rx, got_mon = rx.counts[flow.name], mon.counts[flow.name]
        good = got_rx == flow.count and got_mon == want
        ok &= good
        if not watched:
            unwatched_at_monitor += got_mon
        say(
            f"{flow.name:32} {'yes' if watched else 'no':>7} {flow.count:>6} {got_rx:>8} {got_mon:>8}  "
            f"{'ok' if good else 'WRONG'}"
        )
    say(f"\nunwatched packets that reached the monitor: {unwatched_at_monitor} (must be 0)")
    say(
        "vTAP counters: "
        + ", ".join(
            f"{k} {counters[k]}"
            for k in (
                "seen",
                "matched",
                "cloned",
                "sampled_out",
                "failed",
                "not_ip",
                "malformed",
                "unmatched",
                "pass",
                "mirror",
            )
        )
    )
    c = counters  # every frame the program saw, in one verdict and in one reason (include/verdict.h)
    inv = (
        c["seen"]
        == c["pass"] + c["mirror"]
        == sum(c[k] for k in ("not_ip", "malformed", "unmatched", "sampled_out", "cloned", "failed"))
    )
    ok &= inv and unwatched_at_monitor == 0
    say(
        f"seen == pass + mirror == not_ip + malformed + unmatched + sampled_out + cloned + failed: "
        f"{'yes' if inv else 'NO'}"
    )
    left = [n for n in netns.lab_namespaces() if n.startswith(tb.topo.prefix)]
    ok &= not left
    say(f"lab namespaces left behind: {len(left)} (must be 0)")
    say(f"\n{'PASS' if ok else 'FAIL'}: demo finished in {time.monotonic() - t0:.1f} s")
    return 0 if ok else 1
