"""The lab's own programs, which measure the others: XdpSink counts frames at XDP and
drops, passes, sends back or redirects them; XdpGen sends frames from a test run;
XdpPeerPass passes everything on a veth peer, so XDP frames sent into it arrive.

Nothing is imported here: import the module you need (or the class from `ebpf`).
"""
