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
from .filetransfer import FileTransfer, FileTransferServer
from .frames import Capture, ExactFrames, Flow, Marker, build, flow_frames, packet_socket, send_frames
from .iperf import Iperf3
from .report import MAX_PACKETS, MAX_SECONDS, SendReport
from .trafgen import TrafgenGenerator
from .xdpgen import XdpGenerator

GENERATORS = {"xdp": XdpGenerator, "trafgen": TrafgenGenerator}

__all__ = ["Capture", "ExactFrames", "FileTransfer", "FileTransferServer", "Flow", "GENERATORS", "Iperf3",
           "MAX_PACKETS", "MAX_SECONDS", "Marker", "SendReport", "TrafgenGenerator", "XdpGenerator", "build",
           "flow_frames", "packet_socket", "send_frames"]
