"""What a generator says it sent, and the bounds every load in the lab obeys."""

import ipaddress
from dataclasses import dataclass, field

MAX_SECONDS = 30.0  # no crafted-frame send runs longer than this
MAX_PACKETS = 10_000_000  # nor holds more frames than this in memory
MAX_LOAD_SECONDS = 300.0  # no generator run lasts longer than this...
MAX_LOAD_PACKETS = 2_000_000_000  # ...or sends more packets than this
ETH_HLEN, UDP_HLEN = 14, 8  # for frame sizes of sources that send datagrams


def ip_hlen(addr) -> int:
    """The IP header in front of a datagram to `addr` (no options)."""
    return 20 if ipaddress.ip_address(addr).version == 4 else 40


@dataclass
class SendReport:
    """packets and bytes actually handed to the device (bytes: Ethernet frames
    without FCS), over `seconds` of sending; `dropped` counts what the sending
    device itself refused (a full peer ring), when the generator can tell."""

    packets: int
    bytes: int
    seconds: float
    generator: str = ""
    dropped: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def pps(self):
        return self.packets / self.seconds if self.seconds else 0.0

    @property
    def mbps(self):
        return self.bytes * 8 / self.seconds / 1e6 if self.seconds else 0.0


def check_bounds(count, seconds):
    """Every load run is bounded in packets and in seconds; refuse anything else."""
    if seconds is None or not 0 < seconds <= MAX_LOAD_SECONDS:
        raise ValueError(f"a load run needs a duration in (0, {MAX_LOAD_SECONDS:.0f}] seconds, not {seconds}")
    if count is not None and not 0 < count <= MAX_LOAD_PACKETS:
        raise ValueError(f"a load run sends 1..{MAX_LOAD_PACKETS} packets, not {count}")
    return count if count is not None else MAX_LOAD_PACKETS
