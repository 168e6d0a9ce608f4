"""Iperf3: iperf3 as a lab traffic source, server and client in lab namespaces.

    >>> with Iperf3(client_ns, "eth0", server_ns, "198.18.1.2", proto="udp") as ip3:  # doctest: +SKIP
    ...     r = ip3.send(count=10_000, seconds=5, rate_pps=20_000)
    ...     r.packets, r.extra["received_packets"], r.extra["lost_packets"]

The server (`iperf3 -s`) runs in its namespace for the object's life; each send()
is one client run (`iperf3 -c ... -J`) bounded like every load in the lab: with a
count, `-k count` and at most `seconds` (then SIGINT); without, `-t seconds`, in whole
seconds as iperf3 counts them (a run of 0.5 s lasts 1).

What is reported as sent:
  UDP  packets: the datagrams the client's JSON says it sent (exactly `count` when
       one is given); bytes: those datagrams as Ethernet frames (payload + UDP +
       IP + Ethernet headers), like every other generator
  TCP  packets and bytes: the client interface's transmit counters over the run,
       read once they stop moving (segments on the wire, the control
       connection's included). `count` is in blocks of `length` bytes (iperf3's
       -k), not packets. iperf3's own sent_bytes is what it wrote to the socket:
       its server closes with data unread, so some of that may never be sent.
extra holds iperf3's own summary: bytes and packets received by the server, loss,
jitter, retransmits, and both ends' CPU use.
"""

import ipaddress
import json
import math
import shutil
import subprocess
import time

from .. import netns
from ..counters import iface_counters
from .generator import Generator, run_bounded
from .report import ETH_HLEN, MAX_LOAD_PACKETS, UDP_HLEN, ip_hlen


class Iperf3(Generator):
    name = "iperf3"
    needs_frames = False

    def __init__(
        self,
        ns,
        ifname,
        server_ns,
        server_addr,
        proto="tcp",
        port=5201,
        length=None,
        mtu=1500,
        cpu=None,
        server_cpu=None,
        parallel=1,
        serve=True,
    ):
        if not shutil.which("iperf3"):
            raise netns.LabError("iperf3 not found (Debian package iperf3; run `make setup`)")
        if proto not in ("tcp", "udp"):
            raise ValueError(f"iperf3 protocol is tcp or udp, not {proto!r}")
        super().__init__(ns, ifname, cpu=cpu)
        # serve=False: the server is another host's (IperfServer there; a pods bench on hosts)
        self.server_ns, self.server_cpu, self.serve = server_ns, server_cpu, serve
        self.addr = ipaddress.ip_address(server_addr)
        self.proto, self.port, self.parallel = proto, port, parallel
        self.ip_hlen = ip_hlen(self.addr)
        # UDP: one datagram per frame unless told otherwise (no IP fragments).
        # TCP: iperf3's own default write size (128 KiB).
        self.length = length or (mtu - self.ip_hlen - UDP_HLEN if proto == "udp" else 128 * 1024)
        self.server = None

    # --- the server ----------------------------------------------------------
    def _open(self):
        if self.serve:
            self.server = IperfServer(self.server_ns, self.addr, self.port, self.server_cpu).open()

    def _close(self):
        if self.server is not None:
            self.server.close()
            self.server = None

    def _open_connections(self):
        """The TCP connections of a run not yet done: the client's not in
        TIME-WAIT, and the server's not in TIME-WAIT or LISTEN. Both sides count:
        a server still in LAST-ACK (its FIN's answer lost) sends its FIN again,
        and the client's TIME-WAIT socket answers it, one packet more after the
        client alone looked finished (seen once under load, 45 retransmits)."""
        done = {"TIME-WAIT", "LISTEN"}
        client = netns.run(
            self.ns,
            # ss reads an IPv6 address only in brackets (bare, its colons are taken for a port)
            ["ss", "-Htan", "dst", f"[{self.addr}]" if self.addr.version == 6 else str(self.addr)]
            + ["dport", "=", f":{self.port}"],
            capture_output=True,
            text=True,
        ).stdout
        server = ""
        if self.serve:  # (another host's server: its closes are its own)
            server = netns.run(
                self.server_ns, ["ss", "-Htan", "sport", "=", f":{self.port}"], capture_output=True, text=True
            ).stdout
        return [ln for ln in (client + server).splitlines() if ln.split() and ln.split()[0] not in done]

    def _settled_counters(self, quiet=0.05, limit=5.0):
        """The client interface's counters once every connection to the server
        has closed and they stop moving: when iperf3 exits, TCP may still hold
        written data in the socket, and the kernel sends it afterwards; the last
        ACK answers the server's FIN, whenever that comes (a quiet 50 ms alone
        once missed it: one packet more at the receiver than counted here)."""
        last, deadline = iface_counters(self.ns, self.ifname), time.monotonic() + limit
        while time.monotonic() < deadline:
            time.sleep(quiet)
            now = iface_counters(self.ns, self.ifname)
            if now["tx_packets"] == last["tx_packets"] and (self.proto != "tcp" or not self._open_connections()):
                return now
            last = now
        return last

    # --- one client run ------------------------------------------------------
    def _send(self, limit, seconds, rate_pps):
        argv = [
            "iperf3",
            "-c",
            str(self.addr),
            "-p",
            str(self.port),
            "-J",
            "-l",
            str(self.length),
            "-P",
            str(self.parallel),
        ]
        if self.cpu is not None:
            argv += ["-A", str(self.cpu)]
        if self.proto == "udp":
            # -b is application bits per second; 0 = as fast as it can
            argv += ["-u", "-b", str(int(rate_pps * self.length * 8)) if rate_pps else "0"]
        elif rate_pps:
            raise ValueError("iperf3 paces TCP by bitrate, not packets; send TCP at the ceiling")
        counted = limit < MAX_LOAD_PACKETS
        # iperf3 takes one end condition: a count (then `seconds` is enforced by
        # SIGINT, after which iperf3 still prints its JSON) or a duration.
        if not counted:  # iperf3 reads -t as whole seconds (atoi: 0.5 is 0, and then it sends nothing)
            seconds = max(1, math.ceil(seconds))
        argv += ["-k", str(limit)] if counted else ["-t", str(seconds)]
        before = iface_counters(self.ns, self.ifname)
        rc, out, elapsed = run_bounded(self.ns, argv, seconds + 2 if not counted else seconds)
        after = self._settled_counters()
        try:
            res = json.loads(out[out.index("{") :])
        except ValueError:
            raise netns.LabError(f"iperf3 client failed (exit {rc}): {out.strip()[-200:]}") from None
        if "error" in res and not res.get("end", {}).get("sum_sent", res.get("end", {}).get("sum")):
            raise netns.LabError(f"iperf3 client: {res['error']}")
        end = res["end"]
        extra = {
            "proto": self.proto,
            "length": self.length,
            "cpu_client_pct": end.get("cpu_utilization_percent", {}).get("host_total"),
            "cpu_server_pct": end.get("cpu_utilization_percent", {}).get("remote_total"),
        }
        if self.proto == "udp":
            s = end["sum"]
            # sum: what the client sent; the server's side comes back in the same summary
            received = end.get("sum_received", {})
            packets = s["packets"]
            lost = s.get("lost_packets", 0)
            extra.update(
                received_packets=packets - lost,
                lost_packets=lost,
                jitter_ms=s.get("jitter_ms"),
                received_bytes=received.get("bytes", (packets - lost) * self.length),
            )
            nbytes = packets * (self.length + UDP_HLEN + self.ip_hlen + ETH_HLEN)
        else:
            sent, received = end["sum_sent"], end["sum_received"]
            packets = after["tx_packets"] - before["tx_packets"]
            nbytes = after["tx_bytes"] - before["tx_bytes"]
            extra.update(
                sent_bytes=sent["bytes"],
                received_bytes=received["bytes"],
                received_seconds=received.get("seconds"),
                retransmits=sent.get("retransmits"),
            )
        return packets, nbytes, elapsed, extra


class IperfServer:
    """`iperf3 -s` bound to one address in a namespace (None: a host runner's own), for as
    long as it is open: Iperf3's own, or a server node's on a user's host."""

    def __init__(self, ns, addr, port=5201, cpu=None):
        if not shutil.which("iperf3"):
            raise netns.LabError("iperf3 not found (Debian package iperf3; run `make setup`)")
        self.ns, self.addr, self.port, self.cpu = ns, str(addr), port, cpu
        self.proc = None

    def open(self):
        argv = ["iperf3", "-s", "-B", self.addr, "-p", str(self.port)]
        if self.cpu is not None:
            argv += ["-A", str(self.cpu)]
        self.proc = netns.popen(
            self.ns, argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        where = f" in {self.ns}" if self.ns else ""
        deadline = time.monotonic() + 5
        try:
            while not self._listening():
                if self.proc.poll() is not None:
                    raise netns.LabError(f"iperf3 server{where} exited: {self.proc.stderr.read().strip()}")
                if time.monotonic() > deadline:
                    raise netns.LabError(f"iperf3 server{where} is not listening on {self.addr} port {self.port}")
                time.sleep(0.02)
        except BaseException:
            self.close()
            raise
        return self

    def _listening(self):
        out = netns.run(self.ns, ["ss", "-Hltn", f"sport = :{self.port}"], capture_output=True, text=True)
        return bool(out.stdout.strip())

    def close(self):
        if self.proc is not None:
            netns.stop(self.proc)
            self.proc.stderr.close()
            self.proc = None

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()
        return False
