"""Traffic for the lab, always bounded in packets and seconds.

    frames.py      crafted, marked frames (scapy), a paced AF_PACKET sender, exact-count capture
    xdpgen.py      XdpGenerator: our own line-rate generator (XDP + BPF_PROG_TEST_RUN live frames)
    trafgen.py     TrafgenGenerator: the same frames through netsniff-ng's trafgen
    iperf.py       iperf3 client and server (TCP or UDP)
    filetransfer.py  a UDP file transfer with sequence numbers and a digest, client and server
    generator.py   Generator: the lifecycle, bounds and drop accounting every generator shares
    report.py      SendReport (what a generator actually sent) and the bounds

Every packet generator has send(count=None, seconds=..., rate_pps=None) -> SendReport.
"""
from .frames import (Capture, ExactFrames, Flow, Marker, build, flow_frames, packet_socket,
                     send_frames)
from .report import MAX_PACKETS, MAX_SECONDS, SendReport
from .trafgen import TrafgenGenerator
from .xdpgen import XdpGenerator

GENERATORS = {"xdp": XdpGenerator, "trafgen": TrafgenGenerator}

__all__ = ["Capture", "ExactFrames", "Flow", "GENERATORS", "MAX_PACKETS", "MAX_SECONDS", "Marker",
           "SendReport", "TrafgenGenerator", "XdpGenerator", "build", "flow_frames",
           "packet_socket", "send_frames"]
