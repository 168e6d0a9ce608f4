"""The fast paths, one folder each (lab.fastpath reads them):

    vtap/         clone watched traffic to a monitor (TC clsact or XDP), against OVS, tc mirred, nftables dup
    redirect/     a UDP/TCP destination rewrite at XDP, against netfilter
    lb/           a layer-4 load balancer at XDP, against nginx, HAProxy, nftables
    port_filter/  drop TCP/UDP frames to listed ports at XDP, against an nftables rule (the guide's example)

Each holds the same kinds of module: __init__.py (its FastPath), command.py
(its command line; the vTAP's entry is the top-level `vtap` package), peers.py
(what it is measured against), bench.py and plots.py, and checks.py (what the
suite and `make mutants` check of it). Its kernel program is the package
ebpf/<name>/.
"""
