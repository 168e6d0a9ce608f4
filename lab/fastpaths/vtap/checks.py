"""What the suite and `make mutants` check of the vTAP, found through its
FastPath (lab.fastpath): how the one-exit check runs its programs (at TC, at
XDP, sessions), and their mutants with the tests that must catch each."""

from ebpf.vtap.sessions.config import Rule, Session
from ebpf.vtap.sessions.tc_sessions import SessionMirror
from lab.fastpath import ExitCheck
from lab.mutants import M

WATCH = ["198.18.1.0/24"]  # none of the one-exit frames is from or to it
EXITS = [
    # the TC vTAP matches addresses only (its parse stops at the IP header): what it
    # is not told to watch is unmatched, whatever lies past the addresses
    ExitCheck("ebpf.vtap.tc_mirror:TcMirror", {"monitor": "lo", "watch": WATCH}, hook="tc", slot=1, sees="l3"),
    # the XDP vTAP sees every frame whole (no skb has been built): what the others
    # call malformed it does too
    ExitCheck("ebpf.vtap.xdp_mirror:XdpMirror", {"monitor": "lo", "watch": WATCH}, slot=1, sees="ip"),
    # sessions parse to the ports: a fragment is matched as a frame without ports
    ExitCheck(
        "ebpf.vtap.sessions.tc_sessions:SessionMirror",
        hook="tc",
        function="tap_ingress",
        slot=1,
        sees="ip",
        make="lab.fastpaths.vtap.checks:sessions",
    ),
]
VTAP = (
    ["tests/test_parsing.py", "tests/test_one_exit.py"],
    ["tests/test_tc_mirror.py", "tests/test_copy_path.py", "tests/test_hooks_and_errors.py"],
)
XDP_MIRROR = (
    ["tests/test_xdp_mirror.py", "-k", "fixture or counters or mode or sampled or forward or everything or match"],
    ["tests/test_xdp_mirror.py"],
)
SESSIONS = (["tests/test_sessions.py"], ["tests/test_vtap_sessions.py"])
SESSION_TABLES = (["tests/test_sessions_file.py"], ["tests/test_sessions.py"])
CUTOFF = (["tests/test_vtap_cutoff.py"], ["tests/test_vtap_cutoff.py", "tests/test_xdp_mirror.py", "-k", "cut"])
ALERTS = (["tests/test_eve_follower.py"], ["tests/test_vtap_alerts.py"])
SESSION_ALERTS = (["tests/test_session_alerts.py", "-k", "held"], ["tests/test_session_alerts.py"])
WATCH_PY = (["tests/test_tc_mirror.py", "-k", "watch or cidr or bad"], ["tests/test_cli.py", "tests/test_tc_mirror.py"])

MUTANTS = [
    M(
        "vtap-v4-src-as-dst",
        "ebpf/vtap/watch.h",
        "key.addr = saddr;",
        "key.addr = daddr;",
        "--match src watches destinations",
        VTAP,
    ),
    M(
        "vtap-v6-src-as-dst",
        "ebpf/vtap/watch.h",
        "__builtin_memcpy(key.addr, &ip6->saddr",
        "__builtin_memcpy(key.addr, &ip6->daddr",
        "IPv6 --match src watches destinations",
        VTAP,
    ),
    M(
        "vtap-v6-prefix-64",
        "ebpf/vtap/watch.h",
        "struct watch_v6_key key = {.prefixlen = 128};",
        "struct watch_v6_key key = {.prefixlen = 64};",
        "an IPv6 address is looked up by its /64 only",
        VTAP,
    ),
    M(
        "vtap-v4-dst-skipped",
        "ebpf/vtap/watch.h",
        "\tkey.addr = daddr;\n\tw |= hit(watch_v4.lookup(&key));",
        "\tkey.addr = saddr;\n\tw |= hit(watch_v4.lookup(&key));",
        "--match dst never matches IPv4",
        VTAP,
    ),
    M(
        "vtap-v6-dst-skipped",
        "ebpf/vtap/watch.h",
        "__builtin_memcpy(key.addr, &ip6->daddr",
        "__builtin_memcpy(key.addr, &ip6->saddr",
        "--match dst (and any) never match an IPv6 destination",
        (["tests/test_tc_mirror.py", "-k", "ipv6_destination_alone"], VTAP[1]),
    ),
    M(
        "vtap-sampled-out-uncounted",
        "ebpf/vtap/tc_mirror.bpf.c",
        "V_PASS, R_SAMPLED_OUT, VERDICT_PASS",
        "V_PASS, R_UNMATCHED, VERDICT_PASS",
        "sampled-out frames counted as unwatched",
        VTAP,
    ),
    # (the program's compare made `>` for `>=` is equivalent: it samples with bpf_get_prandom_u32(),
    # and the one value it changes comes 1 time in 2^32)
    M(
        "vtap-sample-one-in-n-plus-1",
        "ebpf/vtap/mirror_base.py",
        "value.sample_threshold = (1 << 32) // n if n > 1",
        "value.sample_threshold = (1 << 32) // (n + 1) if n > 1",
        "--sample N copies 1 in N+1",
        ([], ["tests/test_cli.py", "tests/test_tc_mirror.py", "-k", "every_counter_per_interface or sampling_ratio"]),
    ),
    M(
        "vtap-cloned-bytes-l2",
        "ebpf/vtap/tc_mirror.bpf.c",
        "st->cloned_bytes += skb->len;",
        "st->cloned_bytes += skb->len - ETH_HLEN;",
        "cloned bytes without the Ethernet header",
        VTAP,
        nth=1,
    ),
    M(
        "vtap-segs-one",
        "ebpf/vtap/tc_mirror.bpf.c",
        "st->cloned_segs += segs > 1 ? segs : 1;",
        "st->cloned_segs += 1;",
        "a GSO copy counted as one segment",
        VTAP,
        nth=1,
    ),
    M(
        "vtap-oversize-boundary",
        "ebpf/vtap/tc_mirror.bpf.c",
        "return skb->len - l2 > mtu;",
        "return skb->len - l2 >= mtu;",
        "a copy exactly at the monitor's MTU called oversize",
        VTAP,
    ),
    M(
        "vtap-mirror-all-read-once",
        "ebpf/vtap/tc_mirror.bpf.c",
        "if (why >= 0 && !mirror_all(cfg))",
        "if (why >= 0)",
        "a frame missed while the watch-list changes to mirror-all",
        VTAP,
    ),
    M(
        "vtap-helper-failure-uncounted",
        "ebpf/vtap/tc_mirror.bpf.c",
        "V_PASS, R_CLONE_FAILED, VERDICT_PASS",
        "V_PASS, R_SAMPLED_OUT, VERDICT_PASS",
        "--clone helper: a refused copy is not counted as failed",
        VTAP,
    ),
    M(
        "xdp-mirror-mirror-all-read-once",
        "ebpf/vtap/xdp_mirror.bpf.c",
        "if (!w &&\n\t\t    !(flags_now(cfg) & VTAP_F_MIRROR_ALL))\n\t\t\tcopy = COPY_UNMATCHED;",
        "if (!w)\n\t\t\tcopy = COPY_UNMATCHED;",
        "a frame missed while the watch-list changes to mirror-all",
        XDP_MIRROR,
    ),
    M(
        "xdp-mirror-ttl-kept",
        "ebpf/vtap/xdp_mirror.bpf.c",
        "\t\tip_decrease_ttl(p.iph);",
        "\t\t;",
        "IPv4 sent on without its TTL decremented",
        XDP_MIRROR,
    ),
    M(
        "xdp-mirror-hop-limit-1",
        "ebpf/vtap/xdp_mirror.bpf.c",
        "if (p->ip6h->hop_limit <= 1)",
        "if (p->ip6h->hop_limit < 1)",
        "IPv6 with hop limit 1 sent on instead of to the kernel",
        XDP_MIRROR,
    ),
    M(
        "xdp-mirror-no-copy",
        "ebpf/vtap/xdp_mirror.bpf.c",
        "bpf_redirect_map(pair, 0, BPF_F_BROADCAST | BPF_F_EXCLUDE_INGRESS)",
        "bpf_redirect_map(pair, 0, 0)",
        "watched frames sent to their egress alone, never to the monitor",
        XDP_MIRROR,
    ),
    M(
        "xdp-mirror-partial-kept",
        "ebpf/vtap/xdp_mirror.bpf.c",
        "l4csum_exit(ctx, &c, XDP_REDIRECT, skb,",
        "l4csum_exit(ctx, &c, XDP_REDIRECT, 1,",
        "a partial checksum left unfinished in native mode",
        XDP_MIRROR,
    ),
    M(
        "xdp-mirror-monitor-mtu",
        "ebpf/vtap/xdp_mirror.bpf.c",
        "cfg->monitor_mtu + ETH_HLEN)",
        "cfg->monitor_mtu + ETH_HLEN + 100)",
        "copies longer than the monitor's MTU sent to it",
        XDP_MIRROR,
    ),
    M(
        "xdp-mirror-vlan-routed",
        "ebpf/vtap/xdp_mirror.bpf.c",
        "if (proto_is_vlan(p.eth->h_proto))",
        "if (0)",
        "VLAN-tagged frames routed by the program",
        XDP_MIRROR,
    ),
    M(
        "xdp-mirror-hop-by-hop-routed",
        "ebpf/vtap/xdp_mirror.bpf.c",
        "p.ip6h->nexthdr == IPPROTO_HOPOPTS",
        "0",
        "IPv6 hop-by-hop headers not left to the router",
        XDP_MIRROR,
    ),
    # (the tracepoint's check of VTAP_F_MONITOR_NO_XDP removed is equivalent in every test: with the
    # flag on, the program adds nothing pending for the monitor, so a report finds nothing to take;
    # the check keeps copies that were pending when the flag went on from another node's reports)
    M(
        "xdp-mirror-skipped-copies-uncounted",
        "ebpf/vtap/xdp_mirror.py",
        'lost = c["monitor_dropped"] + c["monitor_pending"] + c["redirect_errors"]',
        'lost = c["monitor_dropped"] + c["redirect_errors"]',
        "copies the kernel skipped counted as cloned",
        XDP_MIRROR,
    ),
    M(
        "sessions-every-rule-decides",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "\t\t\tx->w[w] &= ~s->rules.w[w];",
        "\t\t\t;",
        "a session's later rules decide too (not the first match)",
        SESSIONS,
    ),
    M(
        "sessions-shared-target-twice",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "\t\tshadow |= s->shadow;",
        "\t\t;",
        "two sessions with one target send a frame twice",
        SESSIONS,
    ),
    M(
        "sessions-fragment-protocol-lost",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "parsed == PARSE_OK || parsed == PARSE_OTHER || parsed == PARSE_FRAGMENT ? p->l4 : -1",
        "parsed == PARSE_OK || parsed == PARSE_OTHER ? p->l4 : -1",
        "fragments matched as of no known protocol",
        SESSIONS,
    ),
    M(
        "sessions-cut-ignores-the-tag",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "bpf_skb_change_tail(skb, want - tagged, 0)",
        "bpf_skb_change_tail(skb, want, 0)",
        "a tagged copy cut 4 bytes long",
        SESSIONS,
    ),
    M(
        "sessions-erspan-t-bit",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "\t\t\t\t\tb |= 0x04;",
        "\t\t\t\t\tb |= 0;",
        "a cut ERSPAN II copy without its T bit",
        SESSIONS,
        nth=1,
    ),
    M(
        "sessions-udp6-pseudo-length",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "__be32 tail[2] = {bpf_htonl(len), bpf_htonl(IPPROTO_UDP)};",
        "__be32 tail[2] = {bpf_htonl(len + 1), bpf_htonl(IPPROTO_UDP)};",
        "a wrong outer UDP checksum to an IPv6 collector",
        SESSIONS,
    ),
    M(
        "sessions-partial-inner-ignored",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "__u32 fix = partial_fix(skb, ETH_HLEN + hlen + l2, cut);",
        "__u32 fix = 0;",
        "the outer IPv6 UDP checksum built for an unfinished inner checksum",
        SESSIONS,
    ),
    M(
        "sessions-oversize-sent",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "\tif (size > room) {",
        "\tif (size > room + 10000) {",
        "copies too big for the path sent (to be fragmented or dropped)",
        SESSIONS,
    ),
    M(
        "sessions-gso-by-whole-length",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "\tif (want == wire && skb->gso_segs > 1 && skb->gso_size) {",
        "\tif (0) {",
        "a GRO'd frame judged by its whole length, so counted oversize",
        SESSIONS,
    ),
    M(
        "sessions-own-copies-copied",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "if ((skb->cb[0] & SESS_TAG_MASK) == SESS_TAG_COPY) {",
        "if (0) {",
        "the program's own copies copied again",
        SESSIONS,
    ),
    M(
        "sessions-vlan-tag-dropped",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "\t\tl2 += 4;",
        "\t\t;",
        "a tunnelled copy loses its VLAN tag",
        SESSIONS,
    ),
    M(
        "sessions-outer-ip-checksum",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "ip.check = ~csum_fold32((__u32)bpf_csum_diff(0, 0, (void *)&ip, sizeof(ip), 0)) & 0xffff;",
        "ip.check = ~csum_fold32((__u32)bpf_csum_diff(0, 0, (void *)&ip, sizeof(ip), 1)) & 0xffff;",
        "a wrong outer IPv4 header checksum",
        SESSIONS,
    ),
    M(
        "encap-gre-key-flag-lost",
        "ebpf/vtap/sessions/encap.py",
        'struct.pack("!HHI", 0x2000, GRE_PROTO[kind], target.key)',
        'struct.pack("!HHI", 0, GRE_PROTO[kind], target.key)',
        "a GRE key sent without its K bit (the key read as data)",
        SESSIONS,
    ),
    M(
        "session-tables-containment-reversed",
        "ebpf/vtap/sessions/tables.py",
        "(n is None or p.subnet_of(n))",
        "(n is None or n.subnet_of(p))",
        "an address matched by the rules of prefixes inside its own",
        SESSION_TABLES,
    ),
    M(
        "vtap-cutoff-one-byte-late",
        "ebpf/vtap/cutoff.h",
        "if (before < cutoff)\n\t\treturn CUT_GO;",
        "if (before <= cutoff)\n\t\treturn CUT_GO;",
        "a flow of exactly the cutoff's bytes has one more segment copied",
        CUTOFF,
    ),
    M(
        "vtap-cutoff-one-direction",
        "ebpf/vtap/cutoff.h",
        "\tk->proto = p->l4;\n\treturn d;",
        "\tk->proto = p->l4;\n\treturn 0;",
        "both directions of a flow count into one: the server's bytes cut by the client's",
        CUTOFF,
    ),
    M(
        "vtap-cutoff-ends-cut",
        "ebpf/vtap/cutoff.h",
        "(flags & (TCP_F_SYN | TCP_F_FIN | TCP_F_RST));",
        "(flags & (TCP_F_SYN | TCP_F_RST));",
        "a FIN after the cut is not copied: the sensor never sees the flow end",
        CUTOFF,
    ),
    M(
        "vtap-cutoff-never-idle",
        "ebpf/vtap/cutoff.h",
        "now - f->last_ns > idle_ns",
        "now - f->last_ns > idle_ns * 1000",
        "an idle flow stays cut past its timeout",
        CUTOFF,
    ),
    M(
        "sessions-cutoff-late",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "if (s->cutoff && ci->before >= s->cutoff && !r->whole) {",
        "if (s->cutoff && ci->before >= s->cutoff * 2 && !r->whole) {",
        "a session cut past its cutoff",
        (["tests/test_sessions.py", "-k", "cutoff"], ["tests/test_sessions.py", "tests/test_vtap_sessions.py"]),
    ),
    M(
        "watch-whole-ignored",
        "ebpf/vtap/watch.h",
        "return WATCH_HIT | (e->flags & VTAP_W_WHOLE ? WATCH_WHOLE : 0);",
        "return WATCH_HIT;",
        "an alert's host is cut like any other: the IDS never gets its whole traffic",
        ALERTS,
    ),
    M(
        "alerts-held-not-whole",
        "ebpf/vtap/mirror_base.py",
        "if n in held:  # an alert's host",
        "if False:  # an alert's host",
        "a held host's entry lacks the whole flag: the loop steers nothing past the cutoff",
        (ALERTS[0], [*ALERTS[1], "tests/test_ids_loop.py"]),
    ),
    M(
        "sessions-held-host-cut",
        "ebpf/vtap/sessions/tc_sessions.bpf.c",
        "if (s->cutoff && ci->before >= s->cutoff && !r->whole) {",
        "if (s->cutoff && ci->before >= s->cutoff) {",
        "a host held in a session is cut like the rest: the IDS never gets its whole traffic",
        SESSION_ALERTS,
    ),
    M(
        "sessions-held-first-copy-of-a-past-hold",
        "ebpf/vtap/sessions/tc_sessions.py",
        "got = [t for t in self._stamps.get(net, []) if t >= since]",
        "got = list(self._stamps.get(net, []))",
        "a host held again takes its last hold's first copy for this one's",
        SESSION_ALERTS,
    ),
    M(
        "alerts-hold-never-ends",
        "ebpf/vtap/alerts.py",
        "gone = [a for a, t in self.until.items() if t <= now]",
        "gone = [a for a, t in self.until.items() if t <= now - 3600]",
        "a host an alert named stays watched past its hold",
        ALERTS,
    ),
    M(
        "alerts-no-renewal",
        "ebpf/vtap/alerts.py",
        "self.until[a] = max(self.until[a], now + hold)",
        "self.until[a] = self.until[a]",
        "a later alert does not renew its host's hold",
        ALERTS,
    ),
    M(
        "alerts-src-for-dst",
        "ebpf/vtap/alerts.py",
        "else [getattr(alert, self.which)]",
        "else [alert.dst if self.which == 'src' else alert.src]",
        "--alert-watch src watches the alert's destination",
        ALERTS,
    ),
    M(
        "ids-monitor-truth-ignores-the-cutoff",
        "lab/fastpaths/vtap/ids_bench.py",
        "if self.truth is None or not cutoff or not self.elephants[0]:",
        "if True:",
        "the monitor behind a cutoff judged against signatures it cannot see",
        ([], ["tests/test_ids_notebook.py", "-k", "cutoff_keeps"]),
    ),
    M(
        "watch-host-bits",
        "ebpf/vtap/watchlist.py",
        "net = ipaddress.ip_network(text.strip(), strict=True)",
        "net = ipaddress.ip_network(text.strip(), strict=False)",
        "a CIDR with host bits set accepted silently",
        WATCH_PY,
    ),
]


def sessions():
    """A SessionMirror with one session to lo, for sources in WATCH."""
    return SessionMirror([Session(target="lo", rules=[Rule("accept", source=WATCH[0])])])
