"""The load balancer at a cluster's size: the Maglev builder in C against the Python
reference, the limits of services and backends (the last that fits, one more refused
with nothing written), the sweep that walks the session tables a part at a time, a
full session table, and a table change under traffic. Programs run on frames
through BPF_PROG_TEST_RUN (tests/fixtures/lb.py), at TC where a backend need not be
a neighbour (XDP's bpf_fib_lookup would drop frames to the made-up ones)."""

import ctypes
import ipaddress
import json
import random
import socket
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
from conftest import ROOT
from fixtures.lb import BE1, BE2, VIP, Rig, lb_fixture_net
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether

from ebpf.errors import InputError
from ebpf.lb.maglev import SIZE, maglev_slots, maglev_table
from ebpf.lb.xdp_lb import RING_SIZE, Service
from lab import netns
from lab.fastpaths.lb.command import parse_backends, service_weights, weights_of
from lab.fastpaths.lb.testbed import lb_testbed


@pytest.fixture(scope="module")
def net():
    with lb_fixture_net() as t:
        yield t


def fast(weights, size):
    names = sorted(n for n, w in weights.items() if w > 0)
    slots = maglev_slots(weights, size)
    return [names[i] for i in slots] if slots is not None else [None] * size


@pytest.mark.parametrize("seed", range(6))
def test_the_c_builder_makes_the_reference_builders_tables(seed):
    """Random backend sets and weights (weights that do not divide each other, zeros,
    one backend, as many as slots), small primes and the program's size: the table
    from native.c is the one maglev_table() builds, slot for slot."""
    rnd = random.Random(seed)
    for _ in range(12):
        size = rnd.choice([3, 13, 251, 4099])
        n = min(size, rnd.choice([1, 2, 3, 7, 64, size]))
        names = {f"198.18.{rnd.randrange(256)}.{rnd.randrange(256)}:{rnd.randrange(1, 65536)}" for _ in range(n)}
        weights = {b: rnd.choice([0, 1, 2, 3, 5, 7, 10, 13]) for b in names}
        assert fast(weights, size) == maglev_table(weights, size)
    weights = {f"10.{i // 256}.{i % 256}.1:80": rnd.choice([1, 2, 3, 7]) for i in range(300)}
    assert fast(weights, SIZE) == maglev_table(weights, SIZE)
    assert fast({}, 13) == maglev_table({}, 13) == [None] * 13


def test_the_c_builder_writes_each_backends_own_index():
    weights = {"a": 1, "b": 2, "c": 3}
    slots = maglev_slots(weights, 251, {"a": 7, "b": 9, "c": 4000})
    ref = maglev_table(weights, 251)
    assert list(slots) == [{"a": 7, "b": 9, "c": 4000}[n] for n in ref]


def ring(lb, svc):
    """A service's table as the program reads it, from the kernel's map."""
    t, base = lb.table("rings"), lb._services[lb.services[lb.services.index(svc)]] * RING_SIZE
    return [t[ctypes.c_int(base + i)].value for i in range(0, RING_SIZE, 97)]


def test_the_last_service_and_backend_that_fit_and_one_more_refused_with_nothing_written(net):
    r = Rig(net, hook="tc", max_services=3, max_backends=4, services=())
    lb = r.lb
    try:
        svcs = [lb.add_service(f"tcp:{VIP}:{80 + i}") for i in range(3)]  # the last that fits
        lb.set_backends(svcs[0], {f"{BE1}:8080": 1, f"{BE2}:8080": 1})
        lb.set_backends(svcs[1], {f"{BE1}:8080": 1, "198.18.1.4:8080": 1, "198.18.1.5:8080": 1})  # 4 in all
        services, backends = lb.table("services"), lb.table("backends")
        before = (len(services), [backends[ctypes.c_int(i)].live for i in range(5)], ring(lb, svcs[1]))
        with pytest.raises(InputError, match=r"more than 3 services \(max_services, --max-services\)"):
            lb.add_service(f"tcp:{VIP}:90")
        with pytest.raises(InputError, match=r"5 backends in all, more than 4 \(max_backends"):
            lb.set_backends(svcs[1], {f"{BE1}:8080": 1, "198.18.1.6:8080": 1})
        # nothing half-written: no service, no backend slot, the table as it was
        after = (len(services), [backends[ctypes.c_int(i)].live for i in range(5)], ring(lb, svcs[1]))
        assert after == before and before[1] == [0, 1, 1, 1, 1]
        assert lb.services == tuple(svcs) and len(lb.backends) == 4
    finally:
        r.close()


def client(i):
    return f"198.18.{8 + i // 250}.{i % 250 + 1}"


def syn(r, i, sport=30000):
    return (
        Ether(src="02:00:00:00:00:c1", dst=r.mac) / IP(src=client(i), dst=VIP) / TCP(sport=sport, dport=80, flags="S")
    )


def backend_of(lb, svc, src, sport):
    """The backend (ADDR:PORT) of a DSR flow's half-open session: DSR leaves the frame's
    addresses as they were, so the session says where it went."""
    t = lb.table("half_open")
    k = t.Key()
    k.client.a[0] = int.from_bytes(ipaddress.ip_address(src).packed, "little")
    k.cport, k.service, k.proto = socket.htons(sport), lb._services[svc], 6
    by_index = {i: str(b) for b, i in lb._backends.items()}
    try:
        return by_index[t[k].backend]
    except KeyError:
        return None


def test_the_sweep_walks_a_table_larger_than_a_step_and_counts_per_backend(net):
    """Sessions written into the table by hand (10000: a third idle past their timeout):
    sweep_step() reads at most about its budget each call and answers only when a whole
    pass is done, with the live sessions per backend; the idle ones are gone then."""
    r = Rig(net, hook="tc", mode="dsr", backends=((BE1, 1), (BE2, 1)), services=("tcp",))
    lb = r.lb
    try:
        t = lb.table("sessions")
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        idx = {str(b): i for b, i in lb._backends.items()}
        live = {f"{BE1}:8080": 0, f"{BE2}:8080": 0}
        for i in range(10000):
            k, v = t.Key(), t.Leaf()
            k.client.a[0], k.cport, k.proto = 0x0A000000 + i, 1000 + i % 50000, 6
            be = f"{BE1}:8080" if i % 2 else f"{BE2}:8080"
            v.backend, v.state = idx[be], 2  # established
            idle = i % 3 == 0
            v.last_seen = now - (400 if idle else 1) * 10**9  # established times out at 300 s
            live[be] += not idle
            t[k] = v
        steps, got = 0, None
        while got is None:
            got = lb.sweep_step(budget=1000)
            steps += 1
            assert steps < 100
        assert steps >= 10  # 10000 entries, about 1000 a step (whole batches of 4096 at least)
        assert got == live and len(t) == sum(live.values()) == 6666
        assert lb.sweep_step(budget=1 << 20) is None  # a new pass: the established table first
    finally:
        r.close()


def test_a_full_session_table_evicts_the_least_recent_and_counts_its_next_packet(net):
    """max_sessions 64: 200 connections complete their handshakes; the table holds
    at most 64, the oldest evicted (LRU). The next ACK of an evicted connection finds
    no session: dropped and counted (no_session, Katran's LRU miss); the newest go on."""
    r = Rig(net, hook="tc", mode="dsr", max_sessions=64, max_half_open=256)
    try:
        for i in range(200):
            assert r.run(syn(r, i)).action == "sent"
            ack = syn(r, i)
            ack[TCP].flags = "A"
            assert r.run(ack).action == "sent"
        assert len(r.lb.table("sessions")) <= 64
        first = syn(r, 0)
        first[TCP].flags = "A"
        assert r.run(first).action == "drop"
        last = syn(r, 199)
        last[TCP].flags = "A"
        assert r.run(last).action == "sent"
        c = r.lb.counters()
        assert c["dropped_no_session"] == 1 and c["established"] == 200, c
    finally:
        r.close()


def test_a_table_change_under_traffic_sends_no_new_flow_to_an_empty_slot_or_a_removed_backend(net):
    """New flows (SYNs from fresh clients) run through the program while set_backends()
    rewrites the table from 20 backends to 19 and back, over and over: each goes to a
    backend of the old set or the new one, none is dropped for an empty slot; once a
    change has returned, no new flow goes to the backend it removed."""
    r = Rig(net, hook="tc", mode="dsr", services=(), max_half_open=1 << 16)
    lb = r.lb
    names = [f"198.18.{50 + i}.1:8080" for i in range(20)]
    svc = lb.add_service(f"tcp:{VIP}:80")
    lb.set_backends(svc, dict.fromkeys(names, 1))
    r.fd = lb.load_program().fd
    stop, seen, errors = threading.Event(), [], []

    def traffic():
        i = 0
        while not stop.is_set():
            res = r.run(syn(r, i % 60000, sport=1024 + i // 60000))
            if res.action != "sent":
                errors.append(res.action)
            seen.append(backend_of(lb, svc, client(i % 60000), 1024 + i // 60000))
            i += 1

    th = threading.Thread(target=traffic)
    th.start()
    try:
        for _ in range(10):
            lb.set_backends(svc, dict.fromkeys(names[:-1], 1))  # the last one removed
            mark = len(seen)
            time.sleep(0.02)
            after = [d for d in seen[mark:] if d]
            assert after and names[-1] not in after
            lb.set_backends(svc, dict.fromkeys(names, 1))
            time.sleep(0.02)
    finally:
        stop.set()
        th.join()
    assert errors == [] and len(seen) > 200 and None not in seen
    assert set(seen) <= set(names) and names[-1] in seen
    assert lb.counters()["dropped_no_backend"] == 0


def test_bench_lb_tables_at_tiny_sizes_writes_its_rows(tmp_path):
    """The bench's dimensions at tiny sizes: a row per trial of each change and each
    table size, each change writing slots, each sweep's pass counting every session
    it was given (the bench refuses to report one that does not)."""
    r = subprocess.run(
        [sys.executable, "-m", "lab", "bench", "lb-tables", "--backends", "2,5", "--sessions", "10,70000"]
        + ["--services", "1,3", "--packets", "500", "--trials", "2", "--reference", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(next(tmp_path.glob("lb_tables-*.csv")))
    change, sweep = df[df["what"] == "change"], df[df["what"] == "sweep"]
    assert sorted(change["size"]) == [2, 2, 5, 5] and (change["slots_written"] > 0).all()
    assert (change["ms"] > 0).all() and (change["reference_ms"] > 0).all()
    assert sorted(sweep["size"]) == [10, 10, 70000, 70000]
    # 70000 sessions: more than one tick's budget (65536), so a pass takes two ticks or more
    assert (sweep[sweep["size"] == 70000]["ticks"] >= 2).all() and (sweep[sweep["size"] == 10]["ticks"] == 2).all()
    assert "change (ms a change)" in r.stdout and "sweep (ms a tick)" in r.stdout
    # and the program's time a packet, at each number of services and sessions: every frame
    # sent to its backend, every SYN a new session (the bench refuses a row otherwise)
    packet = df[df["what"] == "packet"]
    got = sorted(zip(packet["kind"], packet["services"], packet["backends"], packet["size"], strict=True))
    want = [(k, s, 2 + 8 * (s - 1), n) for k in ("established", "syn") for s in (1, 3) for n in (10, 70000)]
    assert got == sorted(want * 2)
    assert (packet["ns_median"] > 0).all() and (packet["ns_p99"] >= packet["ns_median"]).all()
    assert "packet (ns, the program's run; size: sessions)" in r.stdout and "(target <= 1.20)" in r.stdout


def test_backends_named_per_service_and_for_every_service_of_a_family():
    """`--backend SERVICE=ADDR:PORT` gives that service its own backends; the unnamed ones
    go to every service of their family that has none of its own; a weight given twice
    for the same service is the last one."""
    a, b, six = (
        Service.parse("tcp:198.18.5.100:80"),
        Service.parse("tcp:198.18.5.100:81"),
        Service.parse("tcp:[2001:2::100]:80"),
    )
    given = parse_backends(
        (t, "--backend")
        for t in (
            "198.18.5.11:8080@2",
            "[2001:2::11]:8080",
            "tcp:198.18.5.100:81=198.18.5.12:8080",
            "tcp:198.18.5.100:81=198.18.5.13:8080@3",
            "tcp:198.18.5.100:81=198.18.5.12:8080@5",
        )
    )
    assigned = weights_of(given)
    assert {str(k): w for k, w in service_weights(assigned, a).items()} == {"198.18.5.11:8080": 2}
    got = {str(k): w for k, w in service_weights(assigned, b).items()}
    assert got == {"198.18.5.12:8080": 5, "198.18.5.13:8080": 3}
    assert {str(k): w for k, w in service_weights(assigned, six).items()} == {"[2001:2::11]:8080": 1}


def test_the_command_fills_its_session_table_for_a_bench_in_dsr_only(tmp_path):
    """`lab lb --fill-sessions N` (what bench lb --sessions runs): N live sessions spread over
    the service's backends before it attaches, counted by its sweep like any; in NAT, or
    past --max-sessions, refused in one line with nothing attached."""
    tb = lb_testbed(2, dsr=True)
    with tb:
        args = ["--iface", "eth0", "--hook", "tc", "--service", f"tcp:{tb.vip4}:{tb.service_port}"]
        args += [f"--backend={tb.backend4(i)}:{tb.service_port}" for i in range(2)]
        args += ["--fill-sessions", "5000", "--json", "--interval", "1", "--duration", "2"]

        def lb(*more):
            argv = [sys.executable, "-m", "lab", "lb", *args, *more]
            return netns.run(tb.ns(tb.lb), argv, check=False, capture_output=True, text=True, cwd=ROOT)

        r = lb("--mode", "dsr")
        assert r.returncode == 0, r.stderr
        final = json.loads(r.stdout.splitlines()[-1])
        assert final["event"] == "final"
        assert [b["active_sessions"] for b in final["backends"].values()] == [2500, 2500]
        for more, error in (
            (["--mode", "nat"], "--fill-sessions: DSR only"),
            (["--mode", "dsr", "--max-sessions", "4999"], "more than the table holds (--max-sessions 4999); fix: "),
        ):
            r = lb(*more)
            assert r.returncode == 2 and r.stderr.count("\n") == 1 and error in r.stderr, r.stderr
        tc = netns.run(tb.ns(tb.lb), ["tc", "filter", "show", "dev", "eth0", "ingress"], capture_output=True, text=True)
        assert tc.stdout.strip() == ""  # nothing left attached by the runs, nor by the refusals
