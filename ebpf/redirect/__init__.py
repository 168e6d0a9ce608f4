"""The XDP redirect: XdpRedirect (xdp_redirect.bpf.c) rewrites a service's datagrams to a
backend and back; TcRedirect (tc_redirect.bpf.c) runs the same rules at TC for
comparison. redirect_match.h is what both programs share.

Nothing is imported here: import the module you need (or the class from `ebpf`).
"""
