"""The XDP redirect: a UDP/TCP destination rewrite at the XDP hook, and the
replies' source rewritten back (ebpf.XdpRedirect), after the netfilter-vs-XDP
report."""

from lab.fastpath import FastPath

FASTPATH = FastPath(
    name="redirect",
    title="rewrite a service's datagrams to a backend, and back",
    hook="XDP",
    program="ebpf.redirect.xdp_redirect:XdpRedirect",
    command="lab.fastpaths.redirect.command",
    example="python -m lab redirect --iface eth0 --rule udp:198.18.0.17:8080=198.18.2.2:8083",
    compared_with="nftables DNAT, a stateless PREROUTING rewrite, the same program at TC",
    peers="lab.fastpaths.redirect.peers",
    benches=("lab.fastpaths.redirect.bench", "lab.fastpaths.redirect.modes_bench"),
    plots=("lab.fastpaths.redirect.plots",),
    checks="lab.fastpaths.redirect.checks",
    doc="docs/redirect.md",
    order=2,
)
