"""The vTAP: TcMirror at TC clsact (tc_mirror.bpf.c) and XdpMirror at XDP on a router
(xdp_mirror.bpf.c), sharing the watch-list (mirror_base.py, watchlist.py, watch.h), the
loop checks (mirror_loops.py) and vtap.h; sessions/ copies to remote sensors.

Nothing is imported here: import the module you need (or the class from `ebpf`).
"""
