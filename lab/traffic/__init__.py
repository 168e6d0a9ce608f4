"""Traffic for the lab, always bounded in packets and seconds.

    frames.py      crafted, marked frames (scapy), a paced AF_PACKET sender, exact-count capture
    xdpgen.py      XdpGenerator: our own line-rate generator (XDP + BPF_PROG_TEST_RUN live frames)
    trafgen.py     TrafgenGenerator: the same frames through netsniff-ng's trafgen
    iperf.py       Iperf3: iperf3 client and server (TCP or UDP), as a source with the same send()
    filetransfer.py  FileTransfer(+Server): a UDP file transfer with sequence numbers, repair
                   rounds and a SHA-256, as processes in lab namespaces (and a command line)
    http.py        HTTP load: closed loop (wrk), open loop (openloop.c, ours), Connections
                   (thousands of keep-alive connections held open)
    generator.py   Generator: the lifecycle, bounds and drop accounting every generator shares
    report.py      SendReport (what a generator actually sent) and the bounds

Every source has send(count=None, seconds=..., rate_pps=None) -> SendReport.
"""

from ebpf.lazy import lazy

# Imported on first use: a generator's own process (`python -m lab.traffic.filetransfer`
# in a namespace, started dozens of times per bench) then loads only what it runs,
# not scapy, BCC and pandas for every sibling module (a second of CPU per start).
_LAZY = {
    "FileTransfer": ".filetransfer",
    "FileTransferServer": ".filetransfer",
    "Capture": ".frames",
    "ExactFrames": ".frames",
    "Flow": ".frames",
    "Marker": ".frames",
    "build": ".frames",
    "flow_frames": ".frames",
    "packet_socket": ".frames",
    "send_frames": ".frames",
    "Iperf3": ".iperf",
    "MAX_PACKETS": ".report",
    "MAX_SECONDS": ".report",
    "SendReport": ".report",
    "TrafgenGenerator": ".trafgen",
    "XdpGenerator": ".xdpgen",
}

__all__ = sorted([*_LAZY, "GENERATORS"])


__getattr__, __dir__ = lazy(
    __name__,
    _LAZY,
    made={
        # each generator's module, so that whoever names one gets the class
        "GENERATORS": lambda: {"xdp": __getattr__("XdpGenerator"), "trafgen": __getattr__("TrafgenGenerator")}
    },
)
