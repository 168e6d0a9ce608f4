"""nftables inside a lab namespace, through libnftables' JSON API (Debian's
python3-nftables): commands and answers as data, never text to parse; and the
namespace's connection tracking, which nftables' NAT rules use.

    >>> nft.run(ns, [{"add": {"table": {"family": "inet", "name": "vtl_x"}}}])   # doctest: +SKIP
    >>> nft.counters(ns, "inet", "vtl_x")      # [(packets, bytes)] of its rules' counters, in order
"""

import socket

from pyroute2 import Conntrack

from ebpf import netdev

from . import netns
from .netns import LabError

NETLINK_NETFILTER = 12  # linux/netlink.h


def run(ns, commands) -> dict:
    """Run JSON commands in namespace `ns`; the answer (for list commands)."""
    try:
        import nftables  # noqa: PLC0415 -- optional (python3-nftables, Debian): its absence is said
    except ImportError:
        raise LabError("python3-nftables is missing (Debian package; run `make setup`)") from None
    with netns.entered(ns):  # libnftables talks netlink in this thread's namespace
        nft = nftables.Nftables()
        nft.set_json_output(True)
        rc, out, err = nft.json_cmd({"nftables": commands})
    if rc != 0:
        raise LabError(f"nft: {err.strip().splitlines()[0] if err.strip() else f'exit {rc}'}")
    return out


def run_text(ns, text, preexec=None):
    """Run nft's own syntax in namespace `ns` (a ruleset as `nft -f` takes it: for rules
    written as their tools write them, kube-proxy's). preexec: run it as `nft -f -`, a
    process of its own that calls this first (to join a cgroup: MemoryCgroup.joiner)."""
    if preexec is not None:
        argv = ["nft", "-f", "-"]
        r = netns.run(
            ns, argv, input=text, capture_output=True, text=True, check=False, timeout=900, preexec_fn=preexec
        )
        if r.returncode != 0:
            raise LabError(f"nft: {(r.stderr.strip().splitlines() or [f'exit {r.returncode}'])[0]}")
        return
    try:
        import nftables  # noqa: PLC0415 -- optional (python3-nftables, Debian): its absence is said
    except ImportError:
        raise LabError("python3-nftables is missing (Debian package; run `make setup`)") from None
    with netns.entered(ns):
        rc, _, err = nftables.Nftables().cmd(text)
    if rc != 0:
        raise LabError(f"nft: {err.strip().splitlines()[0] if err.strip() else f'exit {rc}'}")


def tables(ns, family) -> list[str]:
    out = run(ns, [{"list": {"tables": {"family": family}}}])
    return [i["table"]["name"] for i in out.get("nftables", []) if "table" in i]


def delete_table(ns, family, name):
    """Delete a table of ours if it is there (and the namespace still is)."""
    if netns.exists(ns) and name in tables(ns, family):
        run(ns, [{"delete": {"table": {"family": family, "name": name}}}])


def counters(ns, family, table) -> list[tuple[int, int]]:
    """(packets, bytes) of each counter in the table's rules, in rule order."""
    out = run(ns, [{"list": {"table": {"family": family, "name": table}}}])
    found = []
    for item in out.get("nftables", []):
        for e in item.get("rule", {}).get("expr", []):
            if "counter" in e:
                found.append((e["counter"]["packets"], e["counter"]["bytes"]))
    return found


def conntrack(ns):
    """pyroute2's Conntrack on a netlink socket opened inside lab namespace `ns`.
    Conntrack() itself opens its socket lazily, at its first call: made in an
    entered namespace and used after leaving it, it flushed the root
    namespace's table. Close it after use."""
    with netns.entered(ns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_NETFILTER)
    return netdev.wrap_socket(sock, lambda fd: Conntrack(fileno=fd, nfgen_family=socket.AF_UNSPEC))  # both IP versions


def flush_conntrack(ns):
    """Forget every connection the router's conntrack holds."""
    ct = conntrack(ns)
    try:
        ct.flush()
    finally:
        ct.close()
