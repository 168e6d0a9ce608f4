"""The XDP load balancer: XdpLoadBalancer (xdp_lb.py, xdp_lb.bpf.c and its headers) and the
Maglev table it reads (maglev.py).

Nothing is imported here: import the module you need (or the class from `ebpf`).
"""
