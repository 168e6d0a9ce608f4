"""Every redirect method with the service address on the router itself (the
netfilter-vs-XDP report's design). A module of its own: its testbed lives while
its tests run, and tests elsewhere in the redirect suite expect only theirs."""

import pytest
from test_redirects import transfer_through

from lab.fastpaths.redirect.testbed import router_testbed


@pytest.fixture(scope="module")
def rtb_held():
    """The netfilter-vs-XDP report's design: the service address is the router's own."""
    with router_testbed(vip_on_router=True) as tb:
        yield tb


@pytest.mark.parametrize("spec", ["nft-dnat", "nft-stateless", "xdp-pass:native", "xdp-pass:generic"])
@pytest.mark.parametrize("family", [4, 6])
def test_a_file_arrives_whole_through_every_method_with_the_service_address_on_the_router(rtb_held, spec, family):
    """Replies come back from the router's own address: xdp-pass translates
    them at TC egress and nft-stateless in postrouting, after the kernel's
    source check (before it, IPv4 drops them as martians). (The forwarding
    methods send replies themselves, past the kernel's check: nothing differs.)"""
    m = transfer_through(rtb_held, spec, family)
    if spec.startswith("xdp-pass"):
        assert m.egress is not None and m.replies_seen > 0  # the TC egress program's, counted with XDP's
    if spec == "nft-stateless":
        assert m.replies_seen > 0
