"""The lab on the user's own hosts (lab.hosts), tested on namespaces as hosts: a rack
of three namespaces each running Debian's sshd (lab.hosts.nshosts), reached by
Ansible from a controller namespace of its own, with the inventory a user writes.

Built and set up once for this file: `hosts setup` on one host (the checkout's
tracked files into its lab_dir and scripts/setup.sh run there, from a wheelhouse:
the namespaces have no way out to PyPI), and that host's lab_dir copied to the
others, as machines imaged from a set-up one are (each host's disk is its own at
the same path: lab.hosts.nshosts); `hosts setup` then finds them set up. One pip
install, not three: the suite's time. Everything is driven through the command
line as a user types it, in the controller's namespace.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from lab import netns
from lab.fastpaths.pods.testbed import HOST_DEVICES
from lab.fastpaths.vtap import bench as vtap_bench
from lab.hosts import source
from lab.hosts.check import judge
from lab.hosts.inventory import Host, InventoryError
from lab.hosts.library import lab_facts
from lab.hosts.nshosts import TESTBED2_ROLES, NamespaceHosts
from lab.hosts.runner import alive, pid_of
from lab.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "hosts"
PY = str(Path(sys.executable))


# --- the facts' parsers, on real NICs' output ----------------------------------------------
def test_ethtool_of_real_nics_is_read_as_it_says():
    read = lambda name: (FIXTURES / name).read_text()  # noqa: E731
    assert lab_facts.parse_ethtool_i(read("mlx5-ethtool-i.txt")) == {
        "driver": "mlx5_core",
        "version": "6.1.0-18-amd64",
        "firmware-version": "16.35.2000 (MT_0000000012)",
        "bus-info": "0000:41:00.0",
    }
    veth = lab_facts.parse_ethtool_i(read("veth-ethtool-i.txt"))
    assert veth["driver"] == "veth" and veth["firmware-version"] is None and veth["bus-info"] is None
    assert lab_facts.parse_ethtool_l(read("mlx5-ethtool-l.txt")) == {
        "max": {"rx": None, "tx": None, "other": None, "combined": 63},
        "current": {"rx": None, "tx": None, "other": None, "combined": 32},
    }
    assert lab_facts.parse_ethtool_l(read("ixgbe-ethtool-l.txt"))["current"] == {
        "rx": None,
        "tx": None,
        "other": 1,
        "combined": 16,
    }
    assert lab_facts.parse_ethtool_l(read("veth-ethtool-l.txt"))["current"]["rx"] == 1
    k = lab_facts.parse_ethtool_k(read("mlx5-ethtool-k.txt"))
    assert k["features"]["generic-receive-offload"] is True
    assert k["features"]["large-receive-offload"] is False
    assert k["fixed"] == ["rx-gro-hw"]
    assert lab_facts.parse_ethtool_a(read("mlx5-ethtool-a.txt")) == {"autonegotiate": False, "rx": True, "tx": True}
    assert lab_facts.parse_os_release(read("os-release-debian12.txt"))["VERSION_ID"] == "12"
    assert lab_facts.parse_os_release(read("os-release-ubuntu2204.txt"))["ID"] == "ubuntu"
    # a veth has no speed (EINVAL), a device without NUMA says -1
    assert lab_facts.sysfs_int(None) is None and lab_facts.sysfs_int("-1\n") is None
    assert lab_facts.sysfs_int("25000\n") == 25000
    assert lab_facts.features_of(0b1000111) == ["basic", "redirect", "ndo-xmit", "ndo-xmit-sg"]


def dpkg_version(package):
    return subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True).stdout


def test_dpkg_query_output_is_read_with_what_is_not_installed():
    said = "python3-bpfcc ii  0.26.0+ds-1\nsuricata rc  1:7.0.10-1~bpo12+1\nnftables ii  1.0.6-2+deb12u2\n"
    assert lab_facts.parse_dpkg_query(said) == {
        "python3-bpfcc": "0.26.0+ds-1",
        "suricata": None,  # removed, its configuration kept: not installed
        "nftables": "1.0.6-2+deb12u2",
    }


GOOD_HOST = {
    "uid": 0,
    "os": {"id": "debian", "version_id": "12", "pretty": "Debian GNU/Linux 12 (bookworm)"},
    "kernel": "6.1.0-18-amd64",
    "btf": True,
    "bpf_jit": 1,
    "lab": {"dir": "/opt/vtap-lab", "present": True, "commit": "b" * 40, "setup": "b" * 40, "python": True},
    "management": {"addresses": ["10.0.0.13"], "ifaces": ["eno1"]},
    "irqbalance": False,
    "governor": "performance",
}


def test_a_host_judged_from_facts_says_each_problem_with_its_fix():
    facts = {
        **GOOD_HOST,
        "uid": 1000,
        "os": {"id": "ubuntu", "version_id": "22.04", "pretty": "Ubuntu 22.04.4 LTS"},
        "kernel": "5.15.0-100-generic",
        "lab": {
            "dir": "/opt/vtap-lab",
            "present": True,
            "commit": "a" * 40,
            "setup": "a" * 40,
            "python": True,
            "held_by": {"bench": "20261128T204658Z-1f2e", "controller": "ctl", "pid": 4242, "since": "2026-11-28"},
        },
        "management": {"addresses": ["10.0.0.12"], "ifaces": ["eno1"]},
        "ifaces": {
            "eno1": {"present": True, "up": True, "xdp_features": ["basic"], "xdp_features_known": True},
            "ens1": {
                "present": True,
                "up": False,
                "xdp_features": [],
                "xdp_features_known": True,
                "ethtool": {"driver": "r8169"},
                "pause": {"rx": True},
            },
        },
        "irqbalance": True,
        "governor": "powersave",
    }
    v = judge(
        Host("beta", {}, ["tap"]),
        facts,
        {"tap": "ens1", "tap:monitor": "eno1", "receiver": "ens9"},
        "b" * 40,
        "vtap-throughput",
    )
    text = "\n".join(v.problems)
    assert "not root (uid 1000)" in text and "ansible_become" in text
    assert "Ubuntu 22.04.4 LTS" in text and "Debian 12" in text
    assert "kernel 5.15.0-100-generic" in text
    assert "another tree" in text and "hosts setup" in text
    assert "eno1 (tap:monitor) holds the address Ansible reaches" in text
    assert "(r8169) has no native XDP" in text
    assert "ens9 (receiver) is missing" in text
    assert "in use by bench 20261128T204658Z-1f2e (from ctl, pid 4242" in text and "hosts cleanup" in text
    assert len(v.problems) == 8, v.problems
    # down is no problem: prepare brings it up and cleanup down again (its record says so)
    assert any("ens1 (tap) is down: a bench brings it up" in a for a in v.advice)
    assert any("irqbalance" in a for a in v.advice) and any("pause frames" in a for a in v.advice)
    assert any("powersave" in a for a in v.advice)
    # a pods node: its socket programs attach to a cgroup v2 hierarchy, which must be mounted
    node = {**GOOD_HOST, "ifaces": {"ens1": {"present": True, "up": True}}}
    assert judge(
        Host("alpha", {}, ["nodes"]), {**node, "cgroup2": "/sys/fs/cgroup"}, {"nodes": "ens1"}, "b" * 40, "pods"
    ).ok
    v = judge(Host("alpha", {}, ["nodes"]), {**node, "cgroup2": None}, {"nodes": "ens1"}, "b" * 40, "pods")
    assert len(v.problems) == 1 and "mount -t cgroup2 none /sys/fs/cgroup" in v.problems[0], v.problems


def test_a_tunnel_counts_with_a_generic_xdp_sink_and_the_tap_still_needs_native_xdp():
    from lab.hosts.check import sink_mode  # noqa: PLC0415

    vxlan = {"present": True, "up": True, "operstate": "unknown", "xdp_features": [], "xdp_features_known": True}
    vxlan["ethtool"] = {"driver": "vxlan"}
    nic = {"present": True, "up": True, "xdp_features": ["basic", "redirect"], "xdp_features_known": True}
    facts = {**GOOD_HOST, "ifaces": {"vxlan0": vxlan, "ens1": nic}}
    for role in ("monitor", "receiver"):
        v = judge(Host("gamma", {}, [role]), facts, {role: "vxlan0"}, "b" * 40, "vtap-throughput")
        assert v.problems == [], v.problems
        assert any("vxlan0" in a and "generic XDP" in a for a in v.advice), v.advice
    v = judge(Host("beta", {}, ["tap"]), facts, {"tap": "vxlan0", "tap:monitor": "ens1"}, "b" * 40, "vtap-throughput")
    assert len(v.problems) == 1 and "has no native XDP, and the tap's" in v.problems[0], v.problems
    assert sink_mode(vxlan) == "generic" and sink_mode(nic) == "native"
    assert sink_mode({"xdp_features_known": False}) == "native"  # a kernel that does not say: as before


def test_a_generic_xdp_sink_on_a_vxlan_device_counts_every_frame_through_the_tunnel():
    """What a monitor host behind a tunnel does: its sink on the VXLAN device, where no
    native XDP runs, counts exactly what came through, and only the lab's frames."""
    from ebpf.errors import AttachError  # noqa: PLC0415
    from lab.fastpaths.vtap.rig import CountingSide  # noqa: PLC0415

    n, port = 500, 5001
    topo = Topology("tunnel")
    topo.add_host("a")
    topo.add_host("b")
    topo.add_link("a", "b", a_addrs=["198.18.61.1/24"], b_addrs=["198.18.61.2/24"])
    with topo:
        for host, me, peer in (("a", "1", "2"), ("b", "2", "1")):
            for argv in (
                ["ip", "link", "add", "vxlan0", "type", "vxlan", "id", "42", "remote", f"198.18.61.{peer}"]
                + ["local", f"198.18.61.{me}", "dstport", "4789", "dev", "eth0"],
                ["ip", "addr", "add", f"198.18.62.{me}/24", "dev", "vxlan0"],
                ["ip", "link", "set", "vxlan0", "up"],
            ):
                topo.run(host, argv, check=True)
        with pytest.raises(AttachError, match="no native XDP"):  # on a tunnel: why the sink goes generic there
            CountingSide("drop", topo.ns("b"), "vxlan0", ("198.18.62.1", port)).open().close()
        side = CountingSide("drop", topo.ns("b"), "vxlan0", ("198.18.62.1", port), window=True, mode="generic")
        side.open()
        try:
            topo.run("a", ["ping", "-c", "1", "-W", "5", "198.18.62.2"], check=True)  # ARP passes the sink
            send = (
                "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
                "s.bind(('198.18.62.1', 0)); "
                f"[s.sendto(b'x' * 64, ('198.18.62.2', p)) for p in [{port}] * {n} + [{port + 1}] * 7]"
            )
            topo.run("a", [PY, "-c", send], check=True)
            deadline = time.monotonic() + 5
            while side.counters()["packets"] < n and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)  # and no more than n
            counted = side.counters()
        finally:
            side.close()
        assert counted["packets"] == n, counted  # the other port's 7 and the ping passed uncounted
        assert counted["window_s"] > 0


def test_a_cleanup_kills_only_the_runner_its_pid_file_names_not_a_process_that_took_its_number(tmp_path, monkeypatch):
    from lab.hosts import local  # noqa: PLC0415
    from lab.hosts.runner import pid_stamp  # noqa: PLC0415

    monkeypatch.setattr(local, "STATE", tmp_path)
    monkeypatch.setattr(local, "RUNS", tmp_path / "runs")
    runner = subprocess.Popen(["sleep", "30"])  # a runner that does not stop when told
    other = subprocess.Popen(["sleep", "30"])  # whatever has a dead runner's number now
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        for name, text in [
            ("1-monitor", pid_stamp(runner.pid)),
            ("2-monitor", f"{other.pid} 1"),  # its number, another start time
            ("3-monitor", f"{gone.pid} 1"),
        ]:
            (tmp_path / "runs/b" / name).mkdir(parents=True)
            (tmp_path / "runs/b" / name / "pid").write_text(text + "\n")
        assert alive(pid_stamp(other.pid)) and not alive(f"{other.pid} 1") and alive(str(other.pid))
        said = local.abort_runners(grace=0.3)
        assert said == ["runner b/1-monitor killed (it did not stop within 0 s)"], said
        assert runner.wait(timeout=5) == -signal.SIGKILL
        assert other.poll() is None, "a process that only had a runner's number was killed"
        assert (tmp_path / "runs/b/1-monitor/abort").exists()
        assert not (tmp_path / "runs/b/2-monitor/abort").exists()
    finally:
        for q in (runner, other):
            q.kill()
            q.wait()


def test_the_hosts_are_listed_in_the_inventorys_order_not_their_roles(tmp_path):
    from lab.hosts.inventory import Inventory  # noqa: PLC0415

    inv = tmp_path / "hosts.ini"  # INI, as a user's own may be; roles sort monitor, receiver, sender, tap
    inv.write_text(
        "[sender]\nzulu lab_iface=eth1\n[tap]\nmike lab_iface=eth1 lab_monitor_iface=eth2\n"
        "[receiver]\nmike\n[monitor]\nalpha lab_iface=eth1\n"
    )
    assert [h.name for h in Inventory(inv).lab_hosts()] == ["zulu", "mike", "alpha"]


def _local(ns, state, code):
    """lab.hosts.local's functions run in `ns` as a host runs them, its record in `state`."""
    p = netns.run(
        ns,
        [PY, "-c", "import json; from lab.hosts import local; " + code],
        cwd=ROOT,
        env={**os.environ, "VTL_HOST_STATE": str(state)},
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_an_offload_the_kernel_holds_while_the_veth_peer_has_xdp_is_neither_recorded_nor_forced(tmp_path):
    from lab.fastpaths.vtap.rig import CountingSide  # noqa: PLC0415

    topo = Topology("tso")
    topo.add_host("a")
    topo.add_host("b")
    topo.add_link("a", "b", a_addrs=[], b_addrs=[])
    with topo:
        ns = topo.ns("a")
        assert _local(ns, tmp_path, "print(json.dumps(local.remember('eth0')))")["offloads"]["tso"] == "on"
        side = CountingSide("drop", topo.ns("b"), "eth0").open()  # the peer's XDP: the kernel holds TSO off here
        try:
            # a record made now would hold the kernel's "off" as the user's, and turn TSO off later
            assert "tso" not in _local(ns, tmp_path, "print(json.dumps(local.snapshot('eth0')))")["offloads"]
            said = _local(ns, tmp_path, "print(json.dumps(local.restore('eth0')))")
            assert said == ["eth0: FAILED offload tso on: fixed by the kernel for now (on a veth: its peer has XDP)"]
            assert "eth0" in json.loads((tmp_path / "before.json").read_text())  # kept for a later pass
        finally:
            side.close()
        assert _local(ns, tmp_path, "print(json.dumps(local.restore('eth0')))") == ["eth0: as it was"]
        assert not (tmp_path / "before.json").exists()


def test_dirty_setup_takes_the_working_tree_with_staged_and_intent_to_add_files_and_changes_nothing(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "first")
    (tmp_path / "a.py").write_text("a = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
    (tmp_path / "a.py").write_text("a = 2\n")  # changed, not staged
    (tmp_path / "b.py").write_text("b = 1\n")
    git("add", "b.py")  # staged
    (tmp_path / "c.py").write_text("c = 1\n")
    git("add", "-N", "c.py")  # intent to add: `git stash create` refused this ("not uptodate")
    (tmp_path / "junk.txt").write_text("untracked\n")
    status = git("status", "--porcelain")
    src = source.current(allow_dirty=True, repo=tmp_path)
    assert sorted(src.dirty) == ["a.py", "b.py", "c.py"]
    files = {name: git("show", f"{src.ref}:{name}") for name in git("ls-tree", "--name-only", src.ref).split()}
    assert files == {"a.py": "a = 2\n", "b.py": "b = 1\n", "c.py": "c = 1\n"}  # untracked files never go
    assert git("rev-parse", f"{src.ref}^{{tree}}").strip() == src.tree
    assert git("status", "--porcelain") == status and git("stash", "list") == ""  # the user's state, untouched
    with pytest.raises(InventoryError, match="uncommitted changes to 3 tracked files"):
        source.current(repo=tmp_path)


# --- the rack ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    """The project's Python dependencies as files (a bench host's: no extra): the
    hosts' scripts/setup.sh installs from here (PIP_NO_INDEX), as a rack without a way to
    PyPI would."""
    d = tmp_path_factory.mktemp("wheelhouse")
    subprocess.run(
        [PY, "-m", "pip", "download", "-q", "-d", str(d), str(ROOT), "pip", "setuptools"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return d


@pytest.fixture(scope="module")
def rack(wheelhouse):
    r = NamespaceHosts().build()
    try:
        r.setup_env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse), "PIP_NO_COMPILE": "1"}
        r.inventory = r.write_inventory(extra_vars={"lab_setup_env": r.setup_env})
        # --dirty: what is on the hosts is this working tree exactly (a mutant's edit too)
        first = r.write_inventory(
            r.base / "first.yml",
            roles={"sender": {"alpha": {"lab_iface": "eth1"}}},
            extra_vars={"lab_setup_env": r.setup_env},
        )
        p = lab(r, "hosts", "setup", "--dirty", inventory=first, timeout=900)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.count(": set up") == 1, p.stdout
        r.copy_lab("alpha", "beta", "gamma", "delta")
        yield r
    finally:
        r.close()


def lab(rack, *args, inventory=None, timeout=300):
    """`python -m lab ARGS -i INVENTORY` in the controller's namespace."""
    argv = [PY, "-m", "lab", *args[:2], "-i", str(inventory or rack.inventory), *args[2:]]
    return rack.run_controller(argv, cwd=ROOT, timeout=timeout)


def on_host(rack, host, argv, **kw):
    return rack.run_on(host, argv, **kw)


AS_MADE = {"addrs": [], "promisc": False, "xdp": False, "mtu": 1500, "master": None}


def link(rack, host, ifname):
    p = on_host(rack, host, ["ip", "-j", "-d", "addr", "show", "dev", ifname])
    info = json.loads(p.stdout)[0]
    return {
        "addrs": sorted(f"{a['local']}/{a['prefixlen']}" for a in info["addr_info"] if a["family"] == "inet"),
        "promisc": "PROMISC" in info["flags"],
        "xdp": "xdp" in info,
        "mtu": info["mtu"],
        "master": info.get("master"),
    }


def test_setup_a_second_time_changes_nothing_and_says_so(rack):
    p = lab(rack, "hosts", "setup", "--dirty")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(": unchanged") == 3 and "nothing to do" in p.stdout
    for name in rack.names:  # each host's own lab_dir, stamped with this tree
        stamp = (rack.lab_dir(name) / ".lab-commit").read_text().strip()
        assert stamp == (rack.lab_dir(name) / ".lab-setup").read_text().strip()
        assert (rack.lab_dir(name) / ".venv/bin/python").exists()


def test_check_says_ready_and_facts_say_what_it_read(rack):
    p = lab(rack, "hosts", "check", "--bench", "vtap-throughput", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.loads(p.stdout)
    assert report["ok"] and set(report["hosts"]) == {"alpha", "beta", "gamma"}
    beta = report["hosts"]["beta"]
    assert beta["roles"] == ["receiver", "tap"]
    assert beta["facts"]["ifaces"]["eth2"]["ethtool"]["driver"] == "veth"
    assert "basic" in beta["facts"]["ifaces"]["eth1"]["xdp_features"]
    assert beta["facts"]["management"]["ifaces"] == ["eth0"]
    p = lab(rack, "hosts", "facts", "--json")
    assert p.returncode == 0, p.stderr
    facts = json.loads(p.stdout)
    assert facts["artifacts"] and Path(facts["artifacts"]).is_dir()
    assert facts["inventory"]["hosts"]["alpha"]["vars"]["ansible_ssh_private_key_file"] == "<removed>"
    assert set(facts["hosts"]) == {"alpha", "beta", "gamma"}  # those of a role (delta: Testbed 2's)
    # the versions: Debian's as dpkg has them, the lab's venv's as pip installed them there
    packages = facts["hosts"]["alpha"]["packages"]
    assert packages["debian"]["python3-bpfcc"] == dpkg_version("python3-bpfcc")
    assert packages["python"]["ebpf-vtap-lab"] == "0.1.0" and packages["python"]["pyroute2"].startswith("0.9.")
    assert "pytest" not in packages["python"]  # a bench host's set-up: no extras


@pytest.mark.parametrize(
    "change, said",
    [
        ({"host_vars": {"gamma": {"ansible_host": "198.18.1.99"}}}, ["gamma: unreachable at 198.18.1.99"]),
        (  # three hosts, a problem each: every one said, each in a line of its own
            {
                "roles": {
                    "tap": {"beta": {"lab_iface": "eth0", "lab_monitor_iface": "eth2"}},
                    "monitor": {"gamma": {"lab_iface": "eth7"}},
                },
                "host_vars": {"alpha": {"lab_dir": "/nonexistent/lab"}},
            },
            [
                "eth0 (receiver, tap) holds the address Ansible reaches this host on",
                "gamma: interface eth7 (monitor) is missing",
                "alpha: the lab is not in /nonexistent/lab",
            ],
        ),
    ],
    ids=["unreachable", "management-iface,missing-iface,no-lab"],
)
def test_check_refuses_each_bad_host_in_one_line_with_its_fix(rack, tmp_path, change, said):
    roles = json.loads(json.dumps(rack.role_vars))
    for role, members in change.get("roles", {}).items():
        roles[role] = members
    inv = rack.write_inventory(tmp_path / "hosts.yml", roles=roles, host_vars=change.get("host_vars"))
    p = lab(rack, "hosts", "check", "--bench", "vtap-throughput", inventory=inv)
    assert p.returncode == 1, p.stdout + p.stderr
    for problem in said:
        lines = [ln for ln in p.stderr.splitlines() if problem in ln]
        assert len(lines) == 1, p.stderr
        assert "fix:" in lines[0]


@pytest.mark.parametrize(
    "roles, said, command",
    [
        ({"sender": {}}, "the role 'sender' has no host", "check"),
        (
            {"monitor": {"gamma": {"lab_iface": "eth1"}, "alpha": {"lab_iface": "eth1"}}},
            "the role 'monitor' has 2 hosts (gamma, alpha), it takes 1",
            "bench",
        ),
    ],
    ids=["no-sender", "two-monitors"],
)
def test_an_inventory_that_does_not_fit_the_bench_is_refused_before_any_host_is_asked(
    rack, tmp_path, roles, said, command
):
    merged = {**json.loads(json.dumps(rack.role_vars)), **roles}
    merged = {k: v for k, v in merged.items() if v}
    inv = rack.write_inventory(tmp_path / "hosts.yml", roles=merged)
    if command == "check":  # (both commands read the roles through one function: lab.hosts.inventory)
        p = lab(rack, "hosts", "check", "--bench", "vtap-throughput", inventory=inv)
        assert p.returncode == 2 and said in p.stderr and "fix:" in p.stderr, p.stderr
    else:
        p = lab(rack, "bench", "vtap-throughput", "--sizes", "64", "--trials", "1", "--duration", "1", inventory=inv)
        assert p.returncode == 1 and said in p.stderr and "fix:" in p.stderr, p.stderr


# What a sender's veth may refuse at 20 kpps, as a share of what was sent: its ring holds
# 12.8 ms, and the suite's other workers take the tap's core for longer now and then (as
# tests/test_bench_and_notebook.py says). What the lab answers for is the identity: every
# frame the link took is counted at the tap and the receiver, and every watched one at the
# monitor, exactly.
SENDER_DROP_SHARE = 0.5


def assert_every_frame_counted(df, copies):
    """copies: {mirror: copies per frame at the monitor} (0 for none)."""
    took = df["sent_packets"] - df["sender_dropped"]
    assert (df["sender_dropped"] <= SENDER_DROP_SHARE * df["sent_packets"]).all(), df["sender_dropped"]
    assert (df["dut_packets"] == took).all(), (df["dut_packets"], took)
    assert (df["receiver_packets"] == took).all(), (df["receiver_packets"], took)
    assert (df["monitor_packets"] == took * df["mirror"].map(copies)).all(), (df["monitor_packets"], took)


def bench(rack, out, *extra, inventory=None, **kw):
    args = ["bench", "vtap-throughput", "--sizes", "64", "--duration", "1", "--rate", "20000", "--out", str(out)]
    return lab(rack, *args, *extra, inventory=inventory, **kw)


TESTBED1_IFACES = (("alpha", "eth1"), ("beta", "eth1"), ("beta", "eth2"), ("gamma", "eth1"))


def assert_testbed1_run(rack, csv, before):
    """A Testbed 1 sweep of none, ebpf and tc-mirred at 64 B on the rack, as notebook 07
    runs it (lab.fastpaths.vtap.bench.run(..., inventory=)): its rows, sidecar and hosts."""
    df = pd.read_csv(csv)
    assert sorted(df["mirror"]) == ["ebpf", "none", "tc-mirred"]
    assert (df["sent_packets"] == 20000).all()
    # every frame the sender's link took arrived at the tap (the receiver), every watched one
    # at the monitor, none for `none`
    assert_every_frame_counted(df, {"none": 0, "ebpf": 1, "tc-mirred": 1})
    assert (df["sender_host"] == "alpha").all() and (df["tap_host"] == "beta").all()
    assert (df["monitor_host"] == "gamma").all() and (df["place"] == "hosts").all()
    assert df["receiver_pps"].between(15000, 25000).all(), df["receiver_pps"]
    assert (df["run_wall_s"] > df["duration_s"]).all()
    # each host's CPU over its own window (here all four are this machine's two cores)
    for role in ("sender", "tap", "receiver", "monitor"):
        assert df[f"{role}_host_busy_pct"].between(0.01, 100).all(), df[f"{role}_host_busy_pct"]
    assert (df["receiver_host_busy_pct"] == df["tap_host_busy_pct"]).all()  # Testbed 1: one host, one window
    meta = json.loads(csv.with_suffix(".json").read_text())
    assert set(meta["hosts"]["facts"]) == {"alpha", "beta", "gamma"}
    assert meta["hosts"]["roles"] == {"sender": "alpha", "tap": "beta", "monitor": "gamma"}
    assert meta["hosts"]["failure"] is None and len(meta["hosts"]["orchestration"]["runs"]) == 3
    assert meta["hosts"]["orchestration"]["prepare_s"] > 0
    ceiling = meta["parameters"]["generator_ceiling"]  # veths: no line rate to hold the rate to
    assert ceiling["driver"] == "veth" and ceiling["line_rate_pps"] == {"64": None}
    # every interface as it was: addresses, promiscuous mode, no XDP program; no record left
    for (h, i), was in before.items():
        assert link(rack, h, i) == was, (h, i)
    for name in rack.names:
        assert not (rack.lab_dir(name) / ".lab-state/before.json").exists()
        assert not (rack.lab_dir(name) / ".lab-state/owner.json").exists()


def test_testbed2_on_hosts_bridges_at_the_tap_counts_at_the_receiver_and_takes_its_bridge_away(rack, tmp_path):
    inv = rack.write_inventory(tmp_path / "testbed2.yml", roles=TESTBED2_ROLES)
    ifaces = (("alpha", "eth1"), ("beta", "eth1"), ("beta", "eth2"), ("beta", "eth3"), ("delta", "eth1"))
    before = {(h, i): link(rack, h, i) for h, i in ifaces}
    p = bench(rack, tmp_path, "--peers", "none,ebpf", "--trials", "1", inventory=inv, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    (csv,) = tmp_path.glob("vtap_throughput-*.csv")
    df = pd.read_csv(csv)
    assert (df["testbed"] == 2).all() and (df["receiver_host"] == "delta").all()
    # every frame through beta's bridge to delta, counted at both; the copies at gamma
    assert (df["sent_packets"] == 20000).all()
    assert_every_frame_counted(df, {"none": 0, "ebpf": 1})
    assert json.loads(csv.with_suffix(".json").read_text())["hosts"]["roles"]["receiver"] == "delta"
    for (h, i), was in before.items():
        assert link(rack, h, i) == was, (h, i)
    assert on_host(rack, "beta", ["ip", "link", "show", "vtl-br0"]).returncode != 0  # the lab's bridge, gone
    p = bench(rack, tmp_path, "--testbed", "1", inventory=inv)
    assert p.returncode == 1 and "the inventory is Testbed 2's shape" in p.stderr, p.stderr


def test_pods_on_two_nodes_carry_each_way_through_their_datapath_and_leave_each_node_as_it_was(rack, tmp_path):
    nodes = ("alpha", "beta")  # the rack's nodes, joined by their eth1s as by a cable
    before = {h: link(rack, h, "eth1") for h in nodes}

    def pods(*extra):
        args = ["bench", "pods", "--experiments", "stream,rr,services", "--paths", "across", "--parallel", "1"]
        args += ["--services", "3"]
        return lab(rack, *args, "--duration", "0.5", "--trials", "1", "--out", str(tmp_path), *extra)

    # IPv6 forwarding is the host's, and off here: refused before anything starts, with the fix
    p = pods("--peers", "ebpf", "--families", "6")
    assert p.returncode == 1 and "IPv6 forwarding is off" in p.stderr and "--families 4" in p.stderr, p.stderr
    assert not list(tmp_path.glob("pods-*.csv"))
    assert all(not (rack.lab_dir(h) / ".lab-state/owner.json").exists() for h in nodes)
    p = pods("--peers", "legacy,bridge-vxlan,ebpf,ebpf-vxlan", "--families", "4")
    assert p.returncode == 0, p.stdout + p.stderr
    # the rack is a lab run of this machine's, but the bench measures the hosts' CPUs: no warning
    assert "another lab run is live" not in p.stderr, p.stderr
    (csv,) = tmp_path.glob("pods-*.csv")
    df = pd.read_csv(csv)
    assert sorted(zip(df["experiment"], df["peer"], df["way"].fillna(""), strict=True)) == sorted(
        [(e, peer, "") for e in ("rr", "stream") for peer in ("bridge-vxlan", "ebpf", "ebpf-vxlan", "legacy")]
        + [("services", "ebpf", "connect"), ("services", "ebpf", "per-packet"), ("services", "legacy", "nft")]
    )
    assert (df["place"] == "hosts").all() and (df["n0_host"] == "alpha").all() and (df["n1_host"] == "beta").all()
    stream, rr = df[df["experiment"] == "stream"], df[df["experiment"] == "rr"]
    assert (stream["gbps"] > 0).all() and (stream["gbps_per_core"] > 0).all()
    assert (rr["transactions"] > 0).all() and (rr["errors"] == 0).all()
    # services: a new connection per transaction from p00 to the VIP, each translated where
    # its way says, on the client's node: at connect() (no packet rewritten), per packet, by nftables
    svc = df[df["experiment"] == "services"].set_index("way")
    assert (svc["transactions"] > 0).all() and (svc["errors"] == 0).all() and (svc["services"] == 3).all()
    assert svc.loc["connect", "n0_connect"] >= svc.loc["connect", "transactions"], svc.T
    assert svc.loc["connect", "n0_to_backend"] == 0, svc.T
    assert svc.loc["per-packet", "n0_connect"] == 0 and svc.loc["per-packet", "n0_to_backend"] > 0, svc.T
    assert pd.isna(svc.loc["nft", "n0_connect"]), svc.T  # the kernel's: no datapath counters
    # each node's CPU over its own window: the client's run on alpha, beta's serving
    assert (df["n0_window_s"] > 0).all() and (df["n1_window_s"] > 0).all() and (df["n1_busy_cores"] > 0).all()
    # ...beta's from its first busy tenth of a second to its last: the run's, within a sample each
    # side, not its runner's life from ready to stop (which holds Ansible's go and stop as well)
    assert (df["n1_window_s"] <= df["n0_window_s"] + 0.5).all(), df[["n0_window_s", "n1_window_s"]]
    # the eBPF datapath carried the pods' packets on each node, the kernel's routes the legacy's
    ebpf = df[df["peer"] == "ebpf"]
    assert (ebpf["n0_remote_pod"] > 0).all() and (ebpf["n1_local_pod"] > 0).all(), ebpf.T
    assert (ebpf["n0_tunneled"] == 0).all()
    assert (df[df["peer"] == "ebpf-vxlan"]["n0_tunneled"] > 0).all()
    assert df[df["peer"] == "legacy"]["n0_seen"].isna().all()
    # the nodes' CPU by kind, as a share of all their cores: the pods notebook's figures read it
    summed = stream["n0_busy_cores"] + stream["n1_busy_cores"]
    assert (stream["sys_pct"] > 0).all() and ((stream["busy_cores"] - summed).abs() < 0.002).all()
    from lab.fastpaths.pods import plots  # noqa: PLC0415

    for fig in (plots.stream_bars(df), plots.cpu_per_gbit(df), plots.rr_bars(df)):
        assert fig.axes and any(ax.patches for ax in fig.axes)
        plt.close(fig)
    meta = json.loads(csv.with_suffix(".json").read_text())
    assert meta["hosts"]["roles"] == {"n0": "alpha", "n1": "beta"} and meta["hosts"]["failure"] is None
    assert meta["parameters"]["services"] == [3] and meta["parameters"]["ways"] == ["connect", "per-packet", "nft"]
    for h in nodes:  # as it was: its interface, and nothing of the lab's left in the host's namespace
        assert link(rack, h, "eth1") == before[h], h
        for dev in HOST_DEVICES:  # the tunnels and flannel's bridge of the runs
            assert on_host(rack, h, ["ip", "link", "show", dev]).returncode != 0, (h, dev)
        assert "vtl-kube-proxy" not in on_host(rack, h, ["nft", "list", "tables"]).stdout, h  # legacy's services
        for family in ("-4", "-6"):
            routes = on_host(rack, h, ["ip", family, "route", "show", "proto", "250"])
            assert routes.stdout == "", (h, routes.stdout)
        names = on_host(rack, h, ["ip", "-br", "link"]).stdout
        assert "vtl-lxc" not in names, names
        assert not (rack.lab_dir(h) / ".lab-state/before.json").exists(), h
    prefixes = [rack.host_vars(h)["lab_env"]["VTL_NETNS_PREFIX"] for h in nodes]
    assert not [n for n in os.listdir("/run/netns") if n.startswith(tuple(prefixes))]


def test_cleanup_puts_back_only_its_hosts_and_leaves_the_machines_own_runs(rack, tmp_path):
    from ebpf import cgroup  # noqa: PLC0415
    from ebpf.pods.tc_pods import TcPods  # noqa: PLC0415
    from lab.fastpaths.pods.testbed import pods_testbed  # noqa: PLC0415

    topo = Topology("bystander")  # a lab run of this machine's own, beside the rack
    topo.add_host("a")
    topo.add_host("b")
    topo.add_link("a", "b")
    pods = pods_testbed()  # and pods datapaths of the machine's, their services' programs on cgroups
    with topo, pods, contextlib.closing(TcPods(netns=pods.ns("n0"))) as datapath:
        datapath.load_program()
        datapath.attach_services(pods.cgroup.path)  # a live one
        killed = pods.cgroup.path.parent / f"{pods.ns('p00')}.killed"  # and one whose process was killed
        killed.mkdir()
        orphan = (
            "import os, sys; from ebpf.pods.tc_pods import TcPods; from lab import runs; "
            "p = TcPods(netns=sys.argv[1]); p.load_program(); runs.note_cgroup(sys.argv[2]); "
            "p.attach_services(sys.argv[2]); os._exit(0)"  # as `lab pods --cgroup DIR` killed
        )
        subprocess.run([PY, "-c", orphan, pods.ns("n0"), str(killed)], cwd=ROOT, check=True)

        def programs(where):  # cgroups are the machine's: a host's cleanup of all its runs must not take these
            return len([x for x in cgroup.find("pods_") if x[0] == str(where)])

        assert programs(pods.cgroup.path) == 6 and programs(killed) == 6
        for host, iface, address in (("alpha", "eth1", "198.19.7.1/24"), ("gamma", "eth1", "198.19.7.3/24")):
            item = json.dumps([{"iface": iface, "address": address, "promisc": True}])
            # what a bench's prepare step runs there (lab.hosts.bench), by hand
            p = on_host(
                rack,
                host,
                [str(rack.disk / "lab/.venv/bin/python"), "-m", "lab.hosts.local", "prepare", item],
                cwd=rack.disk / "lab",
                env={**os.environ, **rack.host_vars(host)["lab_env"]},
            )
            assert p.returncode == 0, p.stderr
            assert link(rack, host, iface)["promisc"] and address in link(rack, host, iface)["addrs"]
        only_alpha = rack.write_inventory(tmp_path / "alpha.yml", roles={"sender": {"alpha": {"lab_iface": "eth1"}}})
        p = lab(rack, "hosts", "cleanup", inventory=only_alpha)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "eth1: address 198.19.7.1/24 removed" in p.stdout and "promiscuous off" in p.stdout
        assert link(rack, "alpha", "eth1") == AS_MADE
        # gamma was not named: its interface and its record are as they were
        assert link(rack, "gamma", "eth1")["promisc"]
        assert (rack.lab_dir("gamma") / ".lab-state/before.json").exists()
        assert all(netns.exists(h.ns) for h in topo.hosts.values())  # the machine's own run, intact
        p = lab(rack, "hosts", "cleanup")
        assert p.returncode == 0, p.stderr
        assert link(rack, "gamma", "eth1") == AS_MADE
        assert all(netns.exists(h.ns) for h in topo.hosts.values())
        assert programs(pods.cgroup.path) == 6 and programs(killed) == 6, p.stdout
        # ...which are its own instance's: its cleanup takes the killed run's, from its note
        p = subprocess.run([PY, "-m", "lab", "pods", "--cleanup"], cwd=ROOT, capture_output=True, text=True)
        assert p.returncode == 0 and p.stdout.count(f"on cgroup {killed}") == 6, p.stdout + p.stderr
        assert programs(killed) == 0 and programs(pods.cgroup.path) == 6
        killed.rmdir()


def _wait_for_rows(out, n, proc, seconds=120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for csv in out.glob("vtap_throughput-*.csv"):
            try:
                if len(pd.read_csv(csv)) >= n:
                    return csv
            except (pd.errors.EmptyDataError, FileNotFoundError):
                pass
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError(f"no {n} rows in {seconds} s")


def _start_bench(rack, out, trials):
    argv = [
        PY,
        "-m",
        "lab",
        "bench",
        "vtap-throughput",
        "-i",
        str(rack.inventory),
        "--sizes",
        "64",
        "--duration",
        "1",
        "--rate",
        "20000",
        "--peers",
        "none,ebpf",
        "--trials",
        str(trials),
        "--out",
        str(out),
    ]
    return subprocess.Popen(
        netns.command(rack.ns("ctl"), argv), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _clean(rack, hosts, said=""):
    for name in hosts:
        record = rack.lab_dir(name) / ".lab-state/before.json"
        assert not record.exists(), f"{name}: {record.read_text()}{said}"
        assert not link(rack, name, "eth1")["xdp"] and not link(rack, name, "eth1")["addrs"], name


HOLD_XDP = """
import os, sys, time
from pathlib import Path
from lab import netns
from lab.fastpaths.vtap.rig import CountingSide
from lab.hosts.runner import pid_stamp
netns.host_mode()
side = CountingSide("drop", None, "eth1").open()
d = Path(sys.argv[1])
(d / "pid").write_text(pid_stamp() + chr(10))
while not (d / "abort").exists():
    time.sleep(0.05)
time.sleep(5)  # a tap's runner taking its time to detach: beta's cleanup ends seconds after alpha's
os._exit(0)  # its program left attached, as by a runner killed: beta's record takes it away
"""


def test_a_host_whose_link_partner_still_holds_xdp_is_put_back_by_a_second_pass(rack, tmp_path):
    # alpha's eth1 and beta's eth1 are one veth pair: while beta's has an XDP program (a
    # tap's runner, until beta's cleanup stops it) the kernel holds alpha's TSO off
    py, lab_dir = str(rack.disk / "lab/.venv/bin/python"), rack.disk / "lab"
    for host, address in (("alpha", "198.19.8.1/24"), ("beta", "198.19.8.2/24")):
        item = json.dumps([{"iface": "eth1", "address": address}])
        env = {**os.environ, **rack.host_vars(host)["lab_env"]}
        p = on_host(rack, host, [py, "-m", "lab.hosts.local", "prepare", item], cwd=lab_dir, env=env)
        assert p.returncode == 0, p.stderr
    run = rack.lab_dir("beta") / ".lab-state/runs/held/0000-tap"
    run.mkdir(parents=True)
    argv = ["nsenter", "-t", str(rack.sshd["beta"].pid), "-n", "-m", "--", "sh", "-c", 'cd "$0" && exec "$@"']
    env = {**os.environ, **rack.host_vars("beta")["lab_env"]}
    holder = subprocess.Popen(
        [*argv, str(lab_dir), py, "-c", HOLD_XDP, str(rack.disk / "lab/.lab-state/runs/held/0000-tap")], env=env
    )
    try:
        deadline = time.monotonic() + 60
        while not (run / "pid").exists():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert link(rack, "beta", "eth1")["xdp"]
        tso = on_host(rack, "alpha", ["ethtool", "-k", "eth1"]).stdout
        assert "tcp-segmentation-offload: off" in tso, tso
        p = lab(rack, "hosts", "cleanup")
        assert holder.wait(timeout=30) == 0
    finally:
        holder.kill()
    assert p.returncode == 0, p.stdout + p.stderr
    said = dict(line.split(": ", 1) for line in p.stdout.splitlines())
    # alpha's first pass could not, its second (after beta's) found TSO back as it was
    assert said["alpha"] == "eth1: address 198.19.8.1/24 removed; eth1: as it was", p.stdout
    assert "FAILED" not in p.stdout
    _clean(rack, rack.names)
    tso = on_host(rack, "alpha", ["ethtool", "-k", "eth1"]).stdout
    assert "tcp-segmentation-offload: on" in tso, tso


def test_a_second_bench_is_refused_and_ctrl_c_stops_the_first_keeps_its_rows_and_cleans_every_host(rack, tmp_path):
    proc = _start_bench(rack, tmp_path, trials=10)
    csv = _wait_for_rows(tmp_path, 1, proc)
    # the hosts are held by that bench: a second one is refused before it starts anything...
    held = json.loads((rack.lab_dir("beta") / ".lab-state/owner.json").read_text())
    p = bench(rack, tmp_path / "second", "--peers", "ebpf", "--trials", "1")
    assert p.returncode == 1 and "nothing was started" in p.stderr, p.stderr
    assert f"beta: in use by bench {held['bench']}" in p.stderr, p.stderr
    # ...and a cleanup in another bench's name (one whose prepare lost a race) leaves it alone
    argv = [str(rack.disk / "lab/.venv/bin/python"), "-m", "lab.hosts.local", "cleanup", "--bench", "another"]
    q = on_host(rack, "beta", argv, cwd=rack.disk / "lab", env={**os.environ, **rack.host_vars("beta")["lab_env"]})
    assert q.returncode == 0 and q.stdout.strip() == f"held by bench {held['bench']}: left alone", q.stdout + q.stderr
    _wait_for_rows(tmp_path, 3, proc)  # the first bench measures on, untouched
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    df = pd.read_csv(csv)
    assert 3 <= len(df) < 20
    assert_every_frame_counted(df, {"none": 0, "ebpf": 1})
    meta = json.loads(csv.with_suffix(".json").read_text())
    assert meta["hosts"]["failure"]["task"] == "interrupted"
    _clean(rack, rack.names)
    assert not (rack.lab_dir("beta") / ".lab-state/owner.json").exists()  # let go


def test_a_host_lost_mid_bench_stops_it_names_it_and_the_others_are_cleaned(rack, tmp_path):
    proc = _start_bench(rack, tmp_path, trials=10)
    csv = _wait_for_rows(tmp_path, 1, proc)
    lost = time.monotonic()
    rack.lose("gamma")
    try:
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - lost
        assert proc.returncode == 1, out + err
        assert "host gamma" in err, err
        # within one run's bound: its start margin, its length and the ssh timeouts
        assert took < 120 + 1 + 30, took
        df = pd.read_csv(csv)
        assert len(df) >= 1
        assert_every_frame_counted(df, {"none": 0, "ebpf": 1})
        meta = json.loads(csv.with_suffix(".json").read_text())
        failure = meta["hosts"]["failure"]
        assert failure["host"] == "gamma" and failure["run"] is not None
        assert failure["cleanup"]["gamma"].startswith("not cleaned")
        _clean(rack, ["alpha", "beta"])
    finally:
        rack.revive("gamma")
        p = lab(rack, "hosts", "cleanup")
        assert p.returncode == 0, p.stdout + p.stderr
    _clean(rack, rack.names)


def test_a_runner_killed_mid_run_stops_the_bench_names_its_host_and_every_host_is_cleaned(rack, tmp_path):
    proc = _start_bench(rack, tmp_path, trials=10)
    csv = _wait_for_rows(tmp_path, 1, proc)
    # this bench's runs only: the earlier tests' benches left runs killed before their
    # result (a pid file whose number another process may have taken by now)
    held = json.loads((rack.lab_dir("gamma") / ".lab-state/owner.json").read_text())
    runs = rack.lab_dir("gamma") / ".lab-state/runs" / held["bench"]
    killed, deadline = None, time.monotonic() + 60
    while killed is None and time.monotonic() < deadline:  # the monitor's runner of a run under way
        for pid_file in runs.glob("*-monitor/pid"):
            text = pid_file.read_text()
            if not (pid_file.parent / "result.json").exists() and alive(text):
                try:
                    # off the DUT's core (1, the bench's default), as every runner of the run is:
                    # on the one machine of the rack, it would take that core's time
                    assert os.sched_getaffinity(pid_of(text)) == set(range(os.cpu_count())) - {1}
                    os.kill(pid_of(text), signal.SIGKILL)
                    killed = pid_file.parent
                except ProcessLookupError:
                    continue
                break
        time.sleep(0.05)
    assert killed is not None, proc.communicate()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert "host gamma" in err and "ended without a result" in err, err
    meta = json.loads(csv.with_suffix(".json").read_text())
    failure = meta["hosts"]["failure"]
    assert failure["host"] == "gamma" and failure["run"] == killed.name.split("-")[0], failure
    df = pd.read_csv(csv)
    assert len(df) == int(failure["run"])
    assert_every_frame_counted(df, {"none": 0, "ebpf": 1})
    _clean(rack, rack.names, f"\n{failure}\n{err}")  # gamma too: its runner died, the host did not


def test_the_generators_ceiling_is_the_line_rate_of_a_real_nic_and_none_on_a_veth():
    nic = {"ethtool": {"driver": "mlx5_core"}, "speed_mbps": 100000, "xdp_features": ["basic", "ndo-xmit"]}
    said = vtap_bench.generator_ceiling("xdp", nic, [64, 1518])
    # 100 Gbit/s over (64 + 20) and (1518 + 20) bytes on the wire
    assert round(said["line_rate_pps"][64]) == 148_809_524 and round(said["line_rate_pps"][1518]) == 8_127_438
    assert said["ndo_xdp_xmit"] and said["speed_mbps"] == 100000
    veth = {"ethtool": {"driver": "veth"}, "speed_mbps": 10000, "xdp_features": []}  # nominal speed
    assert vtap_bench.generator_ceiling("trafgen", veth, [64])["line_rate_pps"] == {64: None}


# --- notebook 07: a hosts run beside the namespaces' and the paper's -----------------------
NOTEBOOK = ROOT / "notebooks" / "07_hosts.ipynb"
FIGURES = ["hosts_cpu.png", "hosts_monitor_pps.png", "hosts_orchestration.png", "hosts_receiver_pps.png"]
# the notebook run as Jupyter runs it, in the controller's namespace (where Ansible reaches the hosts)
EXECUTE = """import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
client = NotebookClient(nb, timeout=600, kernel_name=nb.metadata.kernelspec.name,
                        resources={"metadata": {"path": sys.argv[3]}})
try:
    client.execute()
finally:
    nbformat.write(nb, sys.argv[2])
"""


def test_notebook07_runs_the_bench_on_the_hosts_through_the_python_api(rack, tmp_path):
    """The Python API as a user types it (Hosts(...).check(), .facts(), bench.run(...,
    inventory=)), in a notebook; the command line's path is the other tests'."""
    env = {
        "VTL_INVENTORY": str(rack.inventory),
        "VTL_SIZES": "64",
        "VTL_MIRRORS": "none,ebpf,tc-mirred",
        "VTL_TRIALS": "1",
        "VTL_DURATION": "1",
        "VTL_RATE": "20000",
        "VTL_OUT": str(tmp_path / "results"),
        "VTL_FIGURES": str(tmp_path / "figures"),
    }
    before = {(h, i): link(rack, h, i) for h, i in TESTBED1_IFACES}
    executed = tmp_path / "executed.ipynb"
    p = rack.run_controller(
        [PY, "-c", EXECUTE, str(NOTEBOOK), str(executed), str(ROOT)], env={**os.environ, **env}, timeout=600
    )
    assert p.returncode == 0, p.stderr[-3000:]
    from helpers import assert_every_figure_shown_once, read_notebook  # noqa: PLC0415 -- nbformat: 3 s of import

    assert_every_figure_shown_once(read_notebook(executed), FIGURES)
    assert sorted(f.name for f in (tmp_path / "figures").glob("*.png")) == FIGURES
    (csv,) = (tmp_path / "results").glob("vtap_throughput-*.csv")
    assert_testbed1_run(rack, csv, before)


def test_notebook07_on_the_reference_runs_shows_every_figure(tmp_path):
    from helpers import assert_every_figure_shown_once, execute_notebook  # noqa: PLC0415

    nb = execute_notebook(NOTEBOOK, {"VTL_FIGURES": str(tmp_path)})
    assert sorted(p.name for p in tmp_path.glob("*.png")) == FIGURES
    assert_every_figure_shown_once(nb, FIGURES)


def test_committed_notebook07_holds_its_figures():
    from helpers import assert_every_figure_shown_once, read_notebook  # noqa: PLC0415

    assert_every_figure_shown_once(read_notebook(NOTEBOOK), FIGURES)


def test_the_parity_summary_holds_each_median_to_the_namespace_paths_and_says_each_target():
    from lab.bench import hosts_parity  # noqa: PLC0415

    rows = []
    for place, pps, over in (
        ("hosts", (96_000, 100_000, 104_000), 2.4),
        ("namespaces", (100_000, 100_000, 99_000), 0.2),
    ):
        for r, v in enumerate(pps):
            for mirror in ("none", "ebpf"):
                rows.append(
                    {
                        "place": place,
                        "round": r,
                        "size": 64,
                        "mirror": mirror,
                        "receiver_pps": v,
                        "monitor_pps": v if mirror == "ebpf" else 0,
                        "overhead_s": over + r / 10,
                    }
                )
    said = " ".join(" ".join(hosts_parity.summary(pd.DataFrame(rows))).split())
    assert "64 ebpf receiver 100 [96..104] 100 [99..100] 1.000" in said, said
    assert "64 ebpf monitor 100 [96..104] 100 [99..100] 1.000" in said, said
    assert "64 none monitor" not in said  # nothing to copy: no ratio of nothing
    assert "hosts 2.50 s, namespaces 0.30 s" in said
    assert "worst 0.0% met" in said and "2.20 s MISSED" in said
