"""python -m lab pods on two nodes built with plain `ip` commands and the kernel's
defaults, as a user's CNI leaves them (not the lab's testbed): it finds the pods by
their routes, carries their traffic (native routing and the VXLAN tunnel), takes pods
as they come and go, says what a host lacks, and leaves nothing after a kill -9 and
its --cleanup."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from helpers import ECHO, PORT, wait_for

from ebpf import tc

P = f"pc{os.getpid() % 100000}"
N0, N1 = f"{P}n0", f"{P}n1"
PODS = {  # pod namespace: (node, its veth in the node, IPv4, IPv6)
    f"{P}a": (N0, "lxc0", "198.18.100.1", "2001:2:100::1"),
    f"{P}b": (N0, "lxc1", "198.18.100.2", "2001:2:100::2"),
    f"{P}c": (N1, "lxc0", "198.18.101.1", "2001:2:101::1"),
}
A, B, C = PODS


def sh(*cmds):
    for c in cmds:
        subprocess.run(c, shell=True, check=True, capture_output=True)


def add_pod(pod, node, lxc, v4, v6, mtu=1500):
    sh(
        f"ip netns add {pod}",
        f"ip link add {lxc} netns {node} mtu {mtu} type veth peer name eth0 netns {pod} mtu {mtu}",
        f"ip -n {pod} link set lo up && ip -n {pod} link set eth0 up && ip -n {node} link set {lxc} up",
        f"ip -n {pod} addr add {v4}/32 dev eth0 && ip -n {pod} addr add {v6}/128 dev eth0 nodad",
        f"ip -n {node} addr add 169.254.1.1/32 dev {lxc} && ip -n {node} addr add fe80::1/64 dev {lxc} nodad",
        f"ip -n {node} route add {v4}/32 dev {lxc} && ip -n {node} -6 route add {v6}/128 dev {lxc}",
        f"ip -n {pod} route add 169.254.1.1 dev eth0 scope link",
        f"ip -n {pod} route add default via 169.254.1.1 dev eth0",
        f"ip -n {pod} -6 route add default via fe80::1 dev eth0",
    )


@pytest.fixture
def nodes(request):
    """Two nodes (forwarding off, as a fresh namespace has it) and three pods; the
    tunnel variant gives its pods VXLAN's 50 bytes less MTU, as a CNI in tunnel mode does."""
    mtu = 1450 if getattr(request, "param", "") == "tunnel" else 1500
    try:
        sh(
            f"ip netns add {N0} && ip netns add {N1}",
            f"ip link add eth0 netns {N0} type veth peer name eth0 netns {N1}",
            f"ip -n {N0} addr add 198.18.99.1/24 dev eth0 && ip -n {N1} addr add 198.18.99.2/24 dev eth0",
            f"ip -n {N0} addr add 2001:2:99::1/64 dev eth0 nodad && ip -n {N1} addr add 2001:2:99::2/64 dev eth0 nodad",
            f"ip -n {N0} link set eth0 up && ip -n {N1} link set eth0 up",
        )
        for pod, (node, lxc, v4, v6) in PODS.items():
            add_pod(pod, node, lxc, v4, v6, mtu)
        sh(
            f"ip -n {N0} route add 198.18.101.0/24 via 198.18.99.2",
            f"ip -n {N0} -6 route add 2001:2:101::/64 via 2001:2:99::2",
            f"ip -n {N1} route add 198.18.100.0/24 via 198.18.99.1",
            f"ip -n {N1} -6 route add 2001:2:100::/64 via 2001:2:99::1",
        )
        servers = [
            subprocess.Popen(
                ["ip", "netns", "exec", p, sys.executable, ECHO, "serve", str(PORT)], stdout=subprocess.PIPE, text=True
            )
            for p in PODS
        ]
        for s in servers:
            assert s.stdout.readline().strip() == "ready"
        yield
    finally:
        for s in locals().get("servers", []):
            s.kill()
            s.wait()
        for ns in [*PODS, f"{P}d", N0, N1]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def lxc1_gone():
    return subprocess.run(["ip", "-n", N1, "link", "show", "lxc1"], capture_output=True).returncode != 0


def forwarding_on():
    for n in (N0, N1):
        sh(f"ip netns exec {n} sysctl -qw net.ipv4.conf.all.forwarding=1 net.ipv6.conf.all.forwarding=1")


def pods_cmd(node, *args, **kw):
    return subprocess.Popen(
        ["ip", "netns", "exec", node, sys.executable, "-m", "lab", "pods", "--uplink", "eth0", "--json", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kw,
    )


def attached(p) -> dict:
    line = p.stdout.readline()
    assert line, p.stderr.read()
    return json.loads(line)


def exchange(pod, dst, n=6):
    out = subprocess.run(
        ["ip", "netns", "exec", pod, sys.executable, ECHO, "exchange", dst, str(PORT), str(n)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def stop(p):
    """SIGTERM; then every JSON line and stderr. Read through the text wrappers that
    attached()'s readline() filled: communicate() reads the pipes' descriptors and would
    skip what the wrapper had buffered, cutting a line in two (seen under load: a line
    of '')."""
    p.send_signal(signal.SIGTERM)
    out, err = p.stdout.read(), p.stderr.read()
    assert p.wait(timeout=30) == 0, err
    return [json.loads(ln) for ln in out.splitlines()], err


def test_forwarding_off_is_said_with_its_fix_and_nothing_attached(nodes):
    r = subprocess.run(
        ["ip", "netns", "exec", N0, sys.executable, "-m", "lab", "pods", "--uplink", "eth0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert "forwarding is off" in r.stderr and "sysctl -w net.ipv4.conf.all.forwarding=1" in r.stderr
    assert tc.filters_of("pods", f"/run/netns/{N0}") == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tunnel", "vxlan"], "needs at least one --peer"),
        (["--peer", "198.18.99.2=198.18.101.0/24"], "--peer is for tunnel mode"),
        (["--tunnel", "vxlan", "--peer", "198.18.99.2"], "bad --peer"),
        (["--vni", "0"], "--vni 0 is outside"),
    ],
)
def test_bad_input_is_one_line(args, message):
    r = subprocess.run(
        [sys.executable, "-m", "lab", "pods", "--uplink", "eth0", *args], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("nodes", ["native", "tunnel"], indirect=True)
def test_it_carries_the_pods_traffic_takes_new_pods_and_drops_gone_ones(nodes, request):
    forwarding_on()
    tunnel = request.node.callspec.params["nodes"] == "tunnel"
    extra = {
        N0: ["--tunnel", "vxlan", "--peer", "198.18.99.2=198.18.101.0/24", "--peer", "198.18.99.2=2001:2:101::/64"],
        N1: ["--tunnel", "vxlan", "--peer", "198.18.99.1=198.18.100.0/24", "--peer", "198.18.99.1=2001:2:100::/64"],
    }
    runs = {n: pods_cmd(n, *(extra[n] if tunnel else [])) for n in (N0, N1)}
    try:
        heads = {n: attached(p) for n, p in runs.items()}
        assert heads[N0]["pods"] == {
            "lxc0": ["198.18.100.1", "2001:2:100::1"],
            "lxc1": ["198.18.100.2", "2001:2:100::2"],
        }
        assert heads[N0]["mode"] == ("tunnel" if tunnel else "native")
        for src, dst in ((A, PODS[B][2]), (A, PODS[C][2]), (C, PODS[A][3]), (B, PODS[C][3])):
            assert exchange(src, dst) == {"udp": 6, "tcp": 6, "n": 6}, (src, dst)
        # a pod that comes while it runs is taken within a second; one made again behind the
        # same veth name (a pod restarted: a new veth, a new MAC) is taken anew; one that goes, dropped
        mtu = 1450 if tunnel else 1500
        for _ in ("new", "restarted"):
            add_pod(f"{P}d", N1, "lxc1", "198.18.101.2", "2001:2:101::2", mtu)
            server = subprocess.Popen(
                ["ip", "netns", "exec", f"{P}d", sys.executable, ECHO, "serve", str(PORT)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert server.stdout.readline().strip() == "ready"
            time.sleep(1.0)
            assert exchange(A, "198.18.101.2") == {"udp": 6, "tcp": 6, "n": 6}
            server.kill()  # a process in it would keep the namespace, and the veth, alive
            server.wait()
            subprocess.run(["ip", "netns", "del", f"{P}d"], check=True)  # its veth goes with it...
            wait_for(lxc1_gone, what="lxc1 gone")  # ...once the kernel has cleaned the namespace up
        time.sleep(1.0)  # within a second, as for a pod that comes
        assert len(tc.filters_of("pods", f"/run/netns/{N1}")) == 2 + tunnel  # lxc0, the uplink (, the tunnel)
    finally:
        outs = {n: stop(p) for n, p in runs.items()}
    lines, err = outs[N1]
    assert "pod behind lxc1 (198.18.101.2, 2001:2:101::2): attached" in err and "pod behind lxc1 gone: dropped" in err
    final = lines[-1]
    assert final["event"] == "final" and final["pods"]["lxc0"]["local_pod"] > 0 and "lxc1" not in final["pods"]
    way = "tunneled" if tunnel else "remote_pod"
    assert json.loads(json.dumps(outs[N0][0][-1]))["pods"]["lxc0"][way] > 0
    for n in (N0, N1):  # nothing left: no filter, no VXLAN device
        assert tc.filters_of("pods", f"/run/netns/{n}") == []
        assert subprocess.run(["ip", "-n", n, "link", "show", "pods_vxlan"], capture_output=True).returncode != 0


@pytest.mark.parametrize("nodes", ["tunnel"], indirect=True)
def test_a_killed_run_is_cleaned_up_and_says_what_it_removed(nodes):
    forwarding_on()
    p = pods_cmd(N0, "--tunnel", "vxlan", "--peer", "198.18.99.2=198.18.101.0/24")
    attached(p)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert len(tc.filters_of("pods", f"/run/netns/{N0}")) == 4  # two pods, the uplink, the tunnel
    r = subprocess.run(
        ["ip", "netns", "exec", N0, sys.executable, "-m", "lab", "pods", "--cleanup"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("removed filter pods") == 4 and "removed the VXLAN device pods_vxlan" in r.stdout
    assert tc.filters_of("pods", f"/run/netns/{N0}") == []


SERVICES = """
[[service]]
address = "198.18.200.10"
port = 80
protocol = "tcp"
backends = ["198.18.100.2:{port}", "198.18.101.1:{port}"]

[[service]]
address = "198.18.200.10"
port = 80
protocol = "udp"
backends = ["198.18.100.2:{port}", "198.18.101.1:{port}"]
"""
MORE = """
[[service]]
address = "2001:2:200::10"
port = 80
protocol = "{proto}"
backends = ["[2001:2:101::1]:{port}"]
"""


@pytest.fixture
def pod_cgroup():
    """A cgroup v2 directory, as a user (or Kubernetes) makes one for the pods' processes."""
    from ebpf.cgroup import v2_mounts  # noqa: PLC0415

    path = v2_mounts()[0] / f"{P}-pods"
    path.mkdir()
    yield path
    path.rmdir()


def join(path):
    def f():
        (path / "cgroup.procs").write_text(f"{os.getpid()}\n")

    return f


def exchange_in(pod, dst, cg=None, n=6, port=80):
    """tests/echo.py exchange with a service (port 80), from inside cgroup `cg` or not."""
    out = subprocess.run(
        ["ip", "netns", "exec", pod, sys.executable, ECHO, "exchange", dst, str(port), str(n)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=join(cg) if cg else None,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_services_at_connect_and_per_packet_follow_the_file_and_a_kill_leaves_nothing_after_cleanup(
    nodes, pod_cgroup, tmp_path
):
    forwarding_on()
    f = tmp_path / "services.toml"
    f.write_text(SERVICES.format(port=PORT))
    p = pods_cmd(N0, "--services", str(f), "--cgroup", str(pod_cgroup))
    other = pods_cmd(N1)
    try:
        head = attached(p)
        attached(other)
        assert head["services"] == 2 and head["cgroup"] == str(pod_cgroup)
        assert exchange_in(A, "198.18.200.10", pod_cgroup) == {"udp": 6, "tcp": 6, "n": 6}  # at connect()
        assert exchange_in(A, "198.18.200.10") == {"udp": 6, "tcp": 6, "n": 6}  # per packet
        # a service added to the file is served within a second
        f.write_text(
            SERVICES.format(port=PORT) + MORE.format(proto="tcp", port=PORT) + MORE.format(proto="udp", port=PORT)
        )
        time.sleep(1.0)
        assert exchange_in(A, "2001:2:200::10", pod_cgroup) == {"udp": 6, "tcp": 6, "n": 6}
        # broken: said, and the services stay. Written in place, the file is empty for a
        # moment first (here longer than usual, still shorter than the watch's tick): an
        # empty file is a valid one with no services, and read then, it left none to stay
        # (seen under load)
        f.write_text("")
        time.sleep(0.15)
        f.write_text("[[service]]\naddress = 1\n")
        time.sleep(1.0)
        assert exchange_in(A, "2001:2:200::10") == {"udp": 6, "tcp": 6, "n": 6}
        # a cleanup while it runs (from the other node) leaves its socket programs alone
        from ebpf import cgroup  # noqa: PLC0415

        r = subprocess.run(
            ["ip", "netns", "exec", N1, sys.executable, "-m", "lab", "pods", "--cleanup"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        # each spared program names every process holding it: the run's among them (in
        # /proc's order, which after the pid numbers wrap need not put it first)
        held = re.findall(rf"on cgroup {re.escape(str(pod_cgroup))} \(pid ([\d, ]+)\)", r.stdout)
        assert r.returncode == 0 and len(held) == 6, r.stdout
        assert all(str(p.pid) in h.split(", ") for h in held), (p.pid, r.stdout)
        assert len([x for x in cgroup.find("pods_") if x[0] == str(pod_cgroup)]) == 6
        # and --all from there too: a live datapath's programs are its own namespace's to take
        r = subprocess.run(
            ["ip", "netns", "exec", N1, sys.executable, "-m", "lab", "pods", "--cleanup", "--all"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0 and r.stdout.count("in another network namespace") == 6, r.stdout
        assert len([x for x in cgroup.find("pods_") if x[0] == str(pod_cgroup)]) == 6
        # the other node's own live run is this namespace's: --all took its filter, and it
        # stops by itself within its next tick, saying so (CI once saw this race a SIGTERM
        # sent right after: whichever came first decided the exit code)
        assert other.wait(timeout=30) == 1, other.stderr.read()
        assert "the program was removed from eth0 from outside" in other.stderr.read()
    finally:
        if other.poll() is None:
            stop(other)
    os.killpg(p.pid, signal.SIGKILL)
    err = p.communicate()[1]
    assert "services file" in err and "the services stay as they were" in err
    from ebpf import cgroup  # noqa: PLC0415

    assert len([x for x in cgroup.find("pods_") if x[0] == str(pod_cgroup)]) == 6  # left by the kill
    r = subprocess.run(
        ["ip", "netns", "exec", N0, sys.executable, "-m", "lab", "pods", "--cleanup"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(f"on cgroup {pod_cgroup}") == 6, r.stdout
    assert [x for x in cgroup.find("pods_") if x[0] == str(pod_cgroup)] == []
    assert tc.filters_of("pods", f"/run/netns/{N0}") == []


@pytest.mark.parametrize(
    "text, message",
    [
        ("[[service]]\nport = 80\n", "needs address and port"),
        ('[[service]]\naddress = "198.18.200.1"\nport = 80\nbackend = []\n', "unknown key 'backend'"),
        ('[[service]]\naddress = "198.18.200.1"\nport = 80\nbackends = ["198.18.1.1"]\n', "want ADDR:PORT"),
        ('[[service]]\naddress = "198.18.200.1"\nport = 80\nprotocol = "sctp"\n', "protocol 'sctp'"),
        ("[[service]\n", "services file"),
    ],
)
def test_a_bad_services_file_is_one_line_naming_it(tmp_path, text, message):
    f = tmp_path / "s.toml"
    f.write_text(text)
    r = subprocess.run(
        [sys.executable, "-m", "lab", "pods", "--uplink", "eth0", "--services", str(f)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and message in r.stderr and str(f) in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_cgroup_that_is_not_v2_or_without_services_is_refused(nodes, tmp_path):
    forwarding_on()
    f = tmp_path / "s.toml"
    f.write_text(SERVICES.format(port=PORT))
    for args, message in (
        (["--cgroup", "/sys/fs/cgroup"], "needs --services"),
        (["--services", str(f), "--cgroup", str(tmp_path)], "not in a cgroup v2 hierarchy"),
        (["--services", str(f), "--cgroup", "/nonexistent"], "no such cgroup directory"),
    ):
        r = subprocess.run(
            ["ip", "netns", "exec", N0, sys.executable, "-m", "lab", "pods", "--uplink", "eth0", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 2 and message in r.stderr, r.stderr
        assert tc.filters_of("pods", f"/run/netns/{N0}") == []


def test_a_pod_that_cannot_reach_its_gateway_and_a_veth_without_a_route_are_said_with_the_fix(nodes):
    forwarding_on()
    sh(
        f"ip -n {A} route replace default via 169.254.1.254 dev eth0 onlink",
        f"ip -n {N0} route del 198.18.100.2/32 dev lxc1 && ip -n {N0} -6 route del 2001:2:100::2/128 dev lxc1",
    )
    p = pods_cmd(N0, "--duration", "1")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "pod behind lxc0: its default route goes via 169.254.1.254" in err
    assert "fix: ip addr add 169.254.1.254/32 dev lxc0" in err
    assert "lxc1 leads to another namespace but no /32 or /128 route goes through it" in err


def test_pods_that_come_and_go_do_not_disturb_the_traffic_of_the_others(nodes):
    """Pod churn while traffic runs: long-lived connections from one pod to the pods of
    both nodes (a line every 100 ms each, echoed in order) stay whole while a fourth pod
    is made and removed three times behind a veth the watch attaches and drops."""
    forwarding_on()
    runs = {n: pods_cmd(n) for n in (N0, N1)}
    try:
        for p in runs.values():
            attached(p)
        held = subprocess.Popen(
            ["ip", "netns", "exec", A, sys.executable, ECHO, "hold", f"{PODS[B][2]},{PODS[C][2]},{PODS[C][3]}"]
            + [str(PORT), "3"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert held.stdout.readline().strip() == "ready"
        for _ in range(3):
            add_pod(f"{P}d", N1, "lxc1", "198.18.101.2", "2001:2:101::2")
            time.sleep(0.6)
            subprocess.run(["ip", "netns", "del", f"{P}d"], check=True)
            wait_for(lxc1_gone, what="lxc1 gone")
            time.sleep(0.6)
        out, _ = held.communicate("", timeout=60)
        got = json.loads(out)
        assert got["connections"] == 9 and got["broken"] == 0 and got["wrong"] == 0, got
        assert got["echoed"] == got["sent"] > 9 * 20, got
    finally:
        outs = {n: stop(p) for n, p in runs.items()}
    err = outs[N1][1]
    # a pod may be taken half-made (one of its routes there, the other not yet: either
    # first, as netlink tells them), and its second address then said as it comes (seen under load)
    assert len(re.findall(r"pod behind lxc1 \([^)]*\): attached", err)) == 3, err
    assert err.count("pod behind lxc1 gone: dropped") == 3, err
    said = [ln for ln in err.splitlines() if "lxc1" in ln and ("attached" in ln or "addresses now" in ln)]
    for addr in ("198.18.101.2", "2001:2:101::2"):  # each pod's addresses both taken
        assert sum(addr in ln for ln in said) >= 3, err


def test_one_datapath_per_node_and_the_table_shows_services_with_a_dash_for_pods(nodes, tmp_path):
    """A second run on a node is refused with the first's pid (it would sit behind the
    first's filters); the plain table (not --json) with services shows the cgroup
    programs' counters in the totals and '-' in the pods' rows (it once died on a
    KeyError there)."""
    forwarding_on()
    f = tmp_path / "s.toml"
    f.write_text(SERVICES.format(port=PORT))
    first = subprocess.Popen(
        ["ip", "netns", "exec", N0, sys.executable, "-m", "lab", "pods", "--uplink", "eth0", "--services", str(f)]
        + ["--duration", "4", "--interval", "0.5"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert first.stdout.readline().startswith("pods: 2 pods on this node")
    second = subprocess.run(
        ["ip", "netns", "exec", N0, sys.executable, "-m", "lab", "pods", "--uplink", "eth0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert second.returncode == 2 and "carried already" in second.stderr and "one datapath per node" in second.stderr
    # read through the text wrapper that readline() filled (communicate() would skip its buffer)
    out, err = first.stdout.read(), first.stderr.read()
    assert first.wait(timeout=60) == 0, err
    head = next(ln for ln in out.splitlines() if ln.startswith("TIME"))
    assert head.split()[-4:] == ["CONNECT", "SENDMSG", "RECVMSG", "REFUSED"]
    pod_row = next(ln for ln in out.splitlines() if ln.split()[1:2] == ["lxc0"])
    assert pod_row.split()[-4:] == ["-", "-", "-", "-"]
    assert tc.filters_of("pods", f"/run/netns/{N0}") == []
