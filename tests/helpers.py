"""Small pieces the tests share: send flows through a testbed and count them."""

from lab import netns
from lab.traffic import Capture, Marker, build, send_frames

WATCHED_SRC4 = "198.18.1.10"
UNWATCHED_SRC4 = "198.18.1.20"
RX4, RX4_ALT = "198.18.1.2", "198.18.1.3"
WATCHED_SRC6 = "2001:2:0:1::10"
UNWATCHED_SRC6 = "2001:2:0:1::20"
RX6 = "2001:2:0:1::2"

RATE = 20_000  # packets/s: "modest": zero loss is required at this rate


def run_flows(tb, flows, rate=RATE, sender=None, sender_iface="eth0", dst_mac=None, extra_captures=()):
    """Send flows from the sender; count them at the receiver and the monitor.
    Returns (report, receiver counts, monitor counts)."""
    marker = Marker()
    sender = sender or tb.sender
    src_mac = tb.topo.mac(sender, sender_iface)
    frames = build(flows, marker, src_mac, dst_mac or tb.next_hop_mac)
    with Capture(tb.ns(tb.receiver), tb.receiver_iface, marker) as rx, \
            Capture(tb.ns(tb.monitor), tb.monitor_capture_iface, marker) as mon:
        report = send_frames(tb.ns(sender), sender_iface, frames, rate_pps=rate)
    assert report.packets == len(frames)
    assert rx.kernel_drops == 0 and mon.kernel_drops == 0, "the capture itself lost frames"
    return report, rx.counts, mon.counts


def snmp(ns, proto, field):
    """One counter of a namespace's IPv4 MIBs (/proc/net/snmp): proto "Udp", "Icmp", ..."""
    text = netns.run(ns, ["cat", "/proc/net/snmp"], capture_output=True, text=True).stdout
    names, values = [line.split() for line in text.splitlines() if line.startswith(proto + ":")]
    return int(values[names.index(field)])


def invariant(c):
    return c["matched"] == c["cloned"] + c["sampled_out"] + c["failed"]

