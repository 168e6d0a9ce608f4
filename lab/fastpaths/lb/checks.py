"""What the suite and `make mutants` check of the load balancer, found through
its FastPath (lab.fastpath): how the one-exit check runs its program, and its
mutants with the tests that must catch each."""

from ebpf.lb.tc_lb import TcLoadBalancer
from ebpf.lb.xdp_lb import XdpLoadBalancer
from lab.fastpath import ExitCheck
from lab.mutants import M

EXITS = [
    ExitCheck("ebpf.lb.xdp_lb:XdpLoadBalancer", make="lab.fastpaths.lb.checks:balancer"),
    ExitCheck("ebpf.lb.tc_lb:TcLoadBalancer", hook="tc", make="lab.fastpaths.lb.checks:tc_balancer"),
]
LB = (
    ["tests/test_xdp_lb_fixtures.py", "tests/test_partial_csum.py", "tests/test_one_exit.py"],
    ["tests/test_lb_traffic.py", "tests/test_xdp_lb.py", "tests/test_user_topologies.py", "tests/test_lb_health.py"],
)
LB_PY = (["tests/test_xdp_lb_fixtures.py"], ["tests/test_lb_traffic.py", "tests/test_xdp_lb.py"])
SCALE = (["tests/test_lb_scale.py"], ["tests/test_xdp_lb_fixtures.py"])
RESTART = (["tests/test_lb_restart.py"], [])
HEALTH = (["tests/test_lb_health.py"], ["tests/test_xdp_lb.py", "tests/test_lb_traffic.py"])

MUTANTS = [
    M(
        "lb-synack-as-syn",
        "ebpf/lb/lb_sessions.h",
        "(p->flags & (F_SYN | F_ACK)) == F_SYN;",
        "(p->flags & F_SYN);",
        "a SYN-ACK from outside opens a session",
        LB,
    ),
    M(
        "lb-ring-ignores-service",
        "ebpf/lb/lb_sessions.h",
        "lb_ring_get(service * LB_RING_SIZE + h % LB_RING_SIZE)",
        "lb_ring_get(h % LB_RING_SIZE)",
        "every service uses the first service's backends",
        LB,
    ),
    M(
        "lb-reverse-leak",
        "ebpf/lb/lb_sessions.h",
        "\t\tlb_reverse_del(&rk, 0);",
        "\t\t;",
        "an ended NAT session keeps its LB port",
        LB,
    ),
    M(
        "lb-reply-ports-swapped",
        "ebpf/lb/xdp_lb.bpf.c",
        "rewrite_ports(p, svc->port, fk.cport);",
        "rewrite_ports(p, fk.cport, svc->port);",
        "replies go back with the ports swapped",
        LB,
    ),
    M(
        "lb-fin-one-side",
        "ebpf/lb/lb_sessions.h",
        "return mine == LB_CL_DONE && s->closing[other] == LB_CL_DONE;",
        "return mine == LB_CL_DONE || (flags & F_FIN);",
        "a session ends at one side's FIN",
        LB,
    ),
    M(
        "lb-fin-any-ack",
        "ebpf/lb/lb_sessions.h",
        "(__s32)(p->ack - s->fin_ack[other]) >= 0)",
        "1)",
        "any ACK after a FIN is taken for its acknowledgement (the session ends early when the backend closes first)",
        LB,
    ),
    M(
        "lb-timeout-doubled",
        "ebpf/lb/lb_sessions.h",
        "now - s->last_seen > cf->timeout_ns[to & 3]",
        "now - s->last_seen > 2 * cf->timeout_ns[to & 3]",
        "sessions live twice their timeout",
        LB,
    ),
    M(
        "lb-options-ignored",
        "ebpf/include/parsing_helpers.h",
        "p->options = p->iph->ihl != 5;",
        "p->options = p->iph->ihl > 6;",
        "a service's packets with short IPv4 options forwarded",
        LB,
    ),
    # (`<` made `<=` here, a reply to the port after the range looked up too, is equivalent: no session
    # can hold a port outside the range, so the lookup finds none and the frame passes as before)
    M(
        "lb-port-range-last",
        "ebpf/lb/lb_sessions.h",
        "port - cf->port_min < cf->port_count;",
        "port - cf->port_min < cf->port_count - 1;",
        "a reply to the range's last LB port not taken for one",
        LB,
    ),
    M(
        "lb-port-range-first",
        "ebpf/lb/lb_sessions.h",
        "port >= cf->port_min &&",
        "port > cf->port_min &&",
        "a reply to the range's first LB port not taken for one",
        LB,
    ),
    M(
        "lb-reply-mac",
        "ebpf/lb/xdp_lb.bpf.c",
        "__builtin_memcpy(p->h.eth->h_dest, s->client_mac, ETH_ALEN);",
        "__builtin_memcpy(p->h.eth->h_dest, s->backend_mac, ETH_ALEN);",
        "replies sent back to the backend's MAC",
        LB,
    ),
    M(
        "lb-frag-passes",
        "ebpf/lb/lb_sessions.h",
        "\t\t*drop = 1;",
        "\t\t*drop = 0;",
        "a fragment (or a cut-short header) to a VIP passed to the stack",
        LB,
    ),
    M(
        "maglev-weights-ignored",
        "ebpf/lb/maglev.py",
        "credit[i] += w",
        "credit[i] += 1",
        "backends' weights ignored",
        LB_PY,
    ),
    M(
        "maglev-order-dependent",
        "ebpf/lb/maglev.py",
        "live = sorted((n, w) for n, w in weights.items() if w > 0)",
        "live = [(n, w) for n, w in weights.items() if w > 0]",
        "the table depends on the backends' order",
        LB_PY,
    ),
    # (right whenever each weight divides the largest, as every other test's weights do)
    M(
        "maglev-credit-remainder-lost",
        "ebpf/lb/maglev.py",
        "credit[i] -= wmax",
        "credit[i] = 0",
        "weights that do not divide each other (2:3) spread as if rounded down (1:2)",
        (["tests/test_xdp_lb_fixtures.py", "-k", "maglev"], LB_PY[1]),
    ),
    M(
        "lb-nat-ports-overlap",
        "ebpf/lb/xdp_lb.py",
        "below, above = (1024, lo - 1024), (hi + 1, 65535 - hi)",
        "below, above = (1024, hi - 1024), (hi + 1, 65535 - hi)",
        "NAT ports that overlap the host's own ephemeral ports",
        LB_PY,
    ),
    M(
        "lb-sweep-keeps-idle",
        "ebpf/lb/native.c",
        "if (now > seen && now - seen > timeout)",
        "if (now > seen && now - seen > 2 * timeout)",
        "idle sessions swept at twice their timeout",
        SCALE,
    ),
    M(
        "lb-sweep-counts-idle",
        "ebpf/lb/native.c",
        "		else if (backend <= max_backend)\n",
        "		if (backend <= max_backend)\n",
        "the live table counts the sessions the sweep is deleting as active",
        SCALE,
    ),
    M(
        "lb-maglev-c-credit",
        "ebpf/lb/native.c",
        "			if (credit[i] < wmax)",
        "			if (credit[i] <= wmax)",
        "the C builder's tables differ from the reference's: weights spread otherwise",
        SCALE,
    ),
    M(
        "lb-ring-diff-misses-last",
        "ebpf/lb/native.c",
        "	for (uint32_t i = 0; i < size; i++)\n		if (old[i] != new[i]) {",
        "	for (uint32_t i = 0; i + 1 < size; i++)\n		if (old[i] != new[i]) {",
        "a change leaves the table's last slot on the old backend",
        (["tests/test_xdp_lb_fixtures.py", "-k", "ring or maglev"], ["tests/test_lb_scale.py"]),
    ),
    M(
        "lb-backends-limit-half-written",
        "ebpf/lb/xdp_lb.py",
        "        if len(self._backends) + len(new) > self.max_backends:",
        "        if len(self._backends) > self.max_backends:",
        "one backend past --max-backends written into the map, past its end",
        SCALE,
    ),
    M(
        "lb-walk-restarts-each-step",
        "ebpf/maps.py",
        "            self.token_in.value, self.first = self.token_out.value, False\n            ask",
        "            self.first = True\n            ask",
        "the sweep reads the table's first buckets over and over, never the rest",
        SCALE,
    ),
    M(
        "health-rise-ignored",
        "lab/fastpaths/lb/health.py",
        "if self._streak[b] >= (self.rise if ok else self.fall):",
        "if self._streak[b] >= (1 if ok else self.fall):",
        "a backend back after one good probe, not --rise",
        HEALTH,
    ),
    M(
        "health-fall-ignored",
        "lab/fastpaths/lb/health.py",
        "if self._streak[b] >= (self.rise if ok else self.fall):",
        "if self._streak[b] >= (self.rise if ok else 1):",
        "a backend out after one failed probe, not --fall",
        HEALTH,
    ),
    M(
        "health-timeout-passes",
        "lab/fastpaths/lb/health.py",
        "        except OSError:\n            return False",
        "        except socket.timeout:\n            return True\n        except OSError:\n            return False",
        "a backend that fails silently (probes time out) counted healthy",
        HEALTH,
    ),
    M(
        "health-not-applied",
        "lab/fastpaths/lb/command.py",
        "b: (w if up.get(b, True) else 0)",
        "b: (w if up.get(b, True) or 1 else 0)",
        "the command line's health results never reach the LB's table",
        HEALTH,
    ),
    M(
        "lb-takeover-renumbers",
        "ebpf/lb/xdp_lb.py",
        "index = {be: theirs_be[be] for be in self._backends if be in theirs_be}",
        "index = {}",
        "a taken-over LB numbers its backends anew: kept sessions name another backend",
        RESTART,
    ),
    M(
        "lb-takeover-services-renumbered",
        "ebpf/lb/xdp_lb.py",
        "ids = {svc: theirs_svc[svc] for svc in self._services if svc in theirs_svc}",
        "ids = {}",
        "a taken-over LB numbers its services anew: kept sessions name another service",
        RESTART,
    ),
    M(
        "lb-ring-read-off-by-one",
        "ebpf/maps.py",
        "token_in, token_out = ctypes.c_uint32(start - 1), ctypes.c_uint32()",
        "token_in, token_out = ctypes.c_uint32(start), ctypes.c_uint32()",
        "a kept Maglev table read back one slot late",
        (["tests/test_xdp_lb_fixtures.py", "-k", "batches"], []),
    ),
    M(
        "lb-keep-detaches",
        "ebpf/program.py",
        "for a in reversed(self._xdp if not self.keep_attached else []):",
        "for a in reversed(self._xdp):",
        "--keep detaches on exit all the same",
        RESTART,
    ),
    M(
        "lb-expiry-wraps",
        "ebpf/lb/lb_sessions.h",
        "now > s->last_seen && now - s->last_seen > cf->timeout_ns[to & 3]",
        "now - s->last_seen > cf->timeout_ns[to & 3]",
        "a stamp another CPU wrote after this one read the clock counts as 2^64 ns idle: a live session expires",
        (["tests/test_xdp_lb_fixtures.py", "-k", "stamped"], []),
    ),
    M(
        "lb-controller-keeps-compiler",
        "lab/fastpaths/lb/command.py",
        'self.lb.compile_in = "child"',
        'self.lb.compile_in = "process"',
        "lab lb compiles in its own process and keeps BCC's compiler for as long as it runs",
        (["tests/test_lb_restart.py", "-k", "stopped_and_started"], []),
    ),
    M(
        "lb-child-table-deletes-nothing",
        "ebpf/maps.py",
        'self._call("delete", libbpf().bpf_map_delete_elem(self.map_fd, ctypes.byref(key)), key)',
        "return",
        "a table of a program compiled in a child deletes no entry (sessions never swept)",
        (["tests/test_xdp_lb_fixtures.py"], []),
    ),
    M(
        "cost-floor-is-another-program",
        "lab/bench/xdp_cost.py",
        'prog = XdpSink("swap")',
        'out[name] = XdpSink("swap")',
        "xdp-cost's floor measured on another program's object",
        (["tests/test_partial_csum.py", "-k", "cost_bench"], []),
    ),
    M(
        "lb-cli-timeouts-ignored",
        "lab/fastpaths/lb/command.py",
        "            timeouts=self.timeouts,\n",
        "            timeouts=None,\n",
        "--timeout accepted and ignored",
        (["tests/test_lb_health.py"], []),
    ),
    M(
        "tc-lb-not-its-own-ends-classification",
        "ebpf/lb/tc_lb.bpf.c",
        "#define LB_PASS TC_ACT_UNSPEC",
        "#define LB_PASS TC_ACT_OK",
        "what the LB at TC does not own ends the hook's classification there: filters after it never run",
        (["tests/test_xdp_lb_fixtures.py", "-k", "not_for_a_service or reaches_the_stack"], []),
    ),
    M(
        "tc-lb-placed-first",
        "ebpf/lb/tc_lb.py",
        'return self.attach_tc(self.FUNCTION, ifname, "ingress", self.netns, owner=OWNER, first=False)',
        'return self.attach_tc(self.FUNCTION, ifname, "ingress", self.netns, owner=OWNER)',
        "the LB at TC goes before observers: a vTAP started before it never sees the frames it balances",
        (["tests/test_tc_lb.py", "-k", "vtap"], []),
    ),
    M(
        "tc-lb-dsr-to-the-vip",
        "ebpf/lb/tc_lb.bpf.c",
        "send_on(skb, LB_MODE == LB_MODE_NAT ? 0 : &to, p->v4)",
        "send_on(skb, 0, p->v4)",
        "DSR at TC sends the client's frames towards the VIP, the LB host's own address: none reaches a backend",
        (["tests/test_tc_lb.py", "-k", "gso and dsr"], []),
    ),
    M(
        "tc-lb-mtu-gso-whole",
        "ebpf/lb/tc_lb.bpf.c",
        "if (check_mtu(skb, 0, &mtu, 0, MTU_CHK_SEGS) != 0)",
        "if (check_mtu(skb, 0, &mtu, 0, 0) != 0 || skb->len > 1514)",
        "a GSO frame from a sender's TSO is measured whole against the MTU: every bulk upload dropped as too_big",
        (["tests/test_tc_lb.py", "-k", "gso and nat and ipv4"], []),
    ),
    M(
        "tc-lb-gso-too-big-dropped",
        "ebpf/lb/tc_lb.bpf.c",
        "if (!scratch || f->l3 != ETH_HLEN ||",
        "if (!scratch || skb->gso_size || f->l3 != ETH_HLEN ||",
        "a GSO frame whose segments do not fit the LB's interface is dropped unanswered: on a segment whose "
        "MTUs differ every bulk upload stalls",
        (["tests/test_tc_lb.py", "-k", "mtu and ipv4"], []),
    ),
    M(
        "tc-lb-icmp-to-itself",
        "ebpf/lb/tc_lb.bpf.c",
        "\t\tip->daddr = orig->saddr;",
        "\t\tip->daddr = orig->daddr;",
        'the LB at TC sends its "fragmentation needed" to the VIP it came from: the client never learns the MTU',
        (["tests/test_xdp_lb_fixtures.py", "-k", "too_big"], []),
    ),
    M(
        "tc-lb-kept-detached",
        "ebpf/program.py",
        "for f in reversed(self._tc_filters if not self.keep_attached else []):",
        "for f in reversed(self._tc_filters):",
        "lab lb --keep at TC removes its filter on exit: every connection through it breaks",
        (["tests/test_lb_restart.py", "-k", "stopped_and_started and tc"], []),
    ),
]


def balancer(kind=XdpLoadBalancer):
    """An LB with a service on each family (none of the one-exit frames is for it)."""
    lb = kind(self4="198.18.5.1", self6="2001:2:0:5::1")
    lb.set_backends(lb.add_service("tcp:198.18.5.100:80"), {"198.18.5.11:8080": 1})
    lb.set_backends(lb.add_service("udp:[2001:2:0:5::100]:80"), {"[2001:2:0:5::11]:8080": 1})
    return lb


def tc_balancer():
    return balancer(TcLoadBalancer)
