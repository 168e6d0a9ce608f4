"""The port filter: XdpPortFilter (xdp_port_filter.bpf.c) drops TCP/UDP frames to listed
ports; the worked example of docs/adding-a-fast-path.md.

Nothing is imported here: import the module you need (or the class from `ebpf`).
"""
