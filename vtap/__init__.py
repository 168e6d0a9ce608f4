"""vtap: the entry of the eBPF vTAP's command line (python -m vtap --monitor mon0,
the `vtap` script), over the vTAP's bundle lab/fastpaths/vtap/.

The kernel work is ebpf.TcMirror (ebpf.XdpMirror with --hook xdp,
ebpf.SessionMirror with --sessions); the command (lab/fastpaths/vtap/command.py)
parses options, prints counters and makes sure every exit detaches.
"""
