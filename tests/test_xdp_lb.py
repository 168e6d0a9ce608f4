"""XdpLoadBalancer on the real kernel: HTTP from a client namespace through the
LB (native XDP, XDP_TX on veth) to nginx backends, as in seeds 001/002."""

import pytest

from ebpf.xdp_lb import XdpLoadBalancer
from ebpf.xdp_sink import XdpSink
from lab import netns
from lab.testbeds import lb_testbed
from lab.topology import RUN_DIR
from lab.webservers import SUFFIX, NginxServer
from tests.conftest import require_tool


@pytest.fixture
def lab():
    require_tool("nginx")
    require_tool("curl")
    tb = lb_testbed()
    with tb:
        webs = [NginxServer(tb.ns(be), tb.backend4(i), tb.backend_port, name=be).start()
                for i, be in enumerate(tb.backends)]
        webs6 = [NginxServer(tb.ns(be), tb.backend6(i), tb.backend_port + 1, name=f"{be}-v6").start()
                 for i, be in enumerate(tb.backends)]
        # the switch's port towards the LB runs XDP too: else veth drops the LB's XDP_TX frames
        sink = XdpSink("pass")
        sink.attach(tb.lb, netns=tb.ns(tb.switch))
        lb = XdpLoadBalancer(self4=tb.lb4, self6=tb.lb6, netns=tb.ns(tb.lb))
        try:
            yield tb, lb, webs, webs6
        finally:
            lb.close()
            sink.close()
            for w in webs + webs6:
                w.close()
    assert not list(RUN_DIR.glob(f"*{SUFFIX}"))


def get(tb, url, n):
    bodies = []
    for _ in range(n):
        r = netns.run(tb.ns(tb.client), ["curl", "-sg", "-m", "5", url], check=False, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        bodies.append(r.stdout.splitlines()[0])
    return bodies


def test_http_through_the_lb_to_two_backends_ipv4_and_ipv6(lab):
    tb, lb, webs, webs6 = lab
    svc = lb.add_service(f"tcp:{tb.vip4}:{tb.service_port}")
    lb.set_backends(svc, {f"{tb.backend4(i)}:{tb.backend_port}": 1 for i in range(2)})
    svc6 = lb.add_service(f"tcp:[{tb.vip6}]:{tb.service_port}")
    lb.set_backends(svc6, {f"[{tb.backend6(i)}]:{tb.backend_port + 1}": 1 for i in range(2)})
    lb.attach("eth0")
    n = 24
    bodies = get(tb, f"http://{tb.vip4}/", n) + get(tb, f"http://[{tb.vip6}]/", n)
    # every request answered by a backend, and both backends of each family served
    assert set(bodies) == {"served by be1", "served by be2", "served by be1-v6", "served by be2-v6"}
    assert sum(w.requests() for w in webs) == n and sum(w.requests() for w in webs6) == n
    # NAT: the backends saw the LB's address, never the client's
    assert {c for w in webs for c in w.clients()} == {tb.lb4}
    assert {c for w in webs6 for c in w.clients()} == {tb.lb6}
    # each connection one session, established, closed by FIN from both sides: the tables are empty
    c = lb.counters()
    assert c["new_sessions"] == c["established"] == c["closed_fin"] == 2 * n
    assert c["drop_no_session"] == c["drop_no_port"] == c["drop_no_neigh"] == 0
    assert lb.sessions() == []
    per_backend = lb.backend_counters()
    assert sum(v["new_sessions"] for v in per_backend.values()) == 2 * n
    assert all(v["new_sessions"] == w for v, w in zip(per_backend.values(),
                                                       [x.requests() for x in webs + webs6]))
