"""vtap: the command line of the eBPF vTAP (python -m vtap --monitor mon0).

The kernel work is ebpf.TcMirror; this package only parses options, prints
counters and makes sure every exit detaches.
"""
