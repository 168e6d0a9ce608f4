"""python -m lab mutants: does the suite fail when the code is wrong?

Each mutant is one edit of one line of the kernel programs, the shared C
headers, or the Python the data plane depends on: a checksum step, a TTL, a
parse bound, a session's end, a match on the wrong address. One at a time, the
edit is made, the tests that cover it run (the fast fixture tests first, then
the functional ones on real traffic, stopping at the first failure), and the
file is restored. The table says, per mutant, which test killed it, or that it
survived.

No mutation tool reads C that BCC compiles at run time, so the edits are ours:
the text to find (it must occur exactly once, or `nth` picks one), and what
replaces it. The file is copied aside (FILE.mutant-orig) before it is edited
and put back after each mutant, on Ctrl-C and on an error; a run killed with
SIGKILL leaves the copy, and the next run (or `--restore`) puts it back first.

Python logic gets the same one-line edits, for the same reason a maintained
tool (mutmut) does not fit here: its unit is "run the tests", and ours need
root, namespaces and minutes each; choosing the few tests that cover a line,
fast ones first, is what makes 40 mutants take an hour and not a day.
"""

import csv
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKUP = ".mutant-orig"
TIMEOUT = 1200  # seconds per test command: a mutant that hangs a test is killed (by the timeout)

# Which tests cover what: fast (golden fixtures through BPF_PROG_TEST_RUN, pure
# Python) and functional (real traffic through namespaces). Each a pytest argument list.
VTAP = (["tests/test_parsing.py", "tests/test_one_exit.py"], ["tests/test_tc_mirror.py", "tests/test_copy_path.py", "tests/test_hooks_and_errors.py"])
HEADERS = (["tests/test_kernel_headers.py", "tests/test_one_exit.py", "tests/test_redirect_fixtures.py", "tests/test_partial_csum.py",
            "tests/test_xdp_lb_fixtures.py", "tests/test_parsing.py"],
           ["tests/test_tc_mirror.py", "tests/test_redirect.py"])
REDIRECT = (["tests/test_redirect_fixtures.py", "tests/test_partial_csum.py", "tests/test_one_exit.py"],
            ["tests/test_redirect.py", "tests/test_user_topologies.py", "tests/test_redirects.py"])
TC_REDIRECT = (["tests/test_tc_redirect.py"], ["tests/test_redirects.py"])
LB = (["tests/test_xdp_lb_fixtures.py", "tests/test_partial_csum.py", "tests/test_one_exit.py"],
      ["tests/test_lb_traffic.py", "tests/test_xdp_lb.py", "tests/test_user_topologies.py", "tests/test_lb_health.py"])
LB_PY = (["tests/test_xdp_lb_fixtures.py"], ["tests/test_lb_traffic.py", "tests/test_xdp_lb.py"])
HEALTH = (["tests/test_lb_health.py"], ["tests/test_xdp_lb.py", "tests/test_lb_traffic.py"])
EXIT = (["tests/test_one_exit.py", "tests/test_xdp_lb_fixtures.py", "tests/test_redirect_fixtures.py"],
        ["tests/test_tc_mirror.py", "tests/test_redirect.py"])
XDP_MIRROR = (["tests/test_xdp_mirror.py", "-k", "fixture or counters or mode or sampled or forward or everything or match"],
              ["tests/test_xdp_mirror.py"])
SESSIONS = (["tests/test_sessions.py"], ["tests/test_vtap_sessions.py"])
SESSION_TABLES = (["tests/test_sessions_file.py"], ["tests/test_sessions.py"])
WATCH_PY = (["tests/test_tc_mirror.py", "-k", "watch or cidr or bad"], ["tests/test_cli.py", "tests/test_tc_mirror.py"])


@dataclass
class Mutant:
    id: str
    path: str          # relative to the repository root
    find: str          # the text replaced: once in the file, or the nth occurrence
    replace: str
    why: str           # what a user would see if this shipped
    tests: tuple       # (fast, functional) pytest argument lists
    nth: int | None = None  # which occurrence, when the text is not unique

    def line(self, text):
        return text[:self._at(text)].count("\n") + 1

    def _at(self, text):
        at, found = -1, 0
        while found < (self.nth or 1):
            at = text.find(self.find, at + 1)
            if at < 0:
                raise ValueError(f"mutant {self.id}: {self.find!r} occurs {found} times in {self.path}, "
                                 f"not {self.nth}")
            found += 1
        if self.nth is None and text.count(self.find) != 1:
            raise ValueError(f"mutant {self.id}: {self.find!r} occurs {text.count(self.find)} times in "
                             f"{self.path}: give nth")
        return at

    def apply(self, text):
        at = self._at(text)
        return text[:at] + self.replace + text[at + len(self.find):]


def M(id, path, find, replace, why, tests, nth=None):
    return Mutant(id, path, find, replace, why, tests, nth)


MUTANTS = [
    # --- the vTAP ------------------------------------------------------------------------------
    M("vtap-v4-src-as-dst", "ebpf/tc_mirror.bpf.c", "key.addr = saddr;", "key.addr = daddr;",
      "--match src watches destinations", VTAP),
    M("vtap-v6-src-as-dst", "ebpf/tc_mirror.bpf.c", "__builtin_memcpy(key.addr, &ip6->saddr",
      "__builtin_memcpy(key.addr, &ip6->daddr", "IPv6 --match src watches destinations", VTAP),
    M("vtap-v6-prefix-64", "ebpf/tc_mirror.bpf.c", "struct watch_v6_key key = {.prefixlen = 128};",
      "struct watch_v6_key key = {.prefixlen = 64};", "an IPv6 address is looked up by its /64 only", VTAP),
    M("vtap-v4-dst-skipped", "ebpf/tc_mirror.bpf.c", "\tkey.addr = daddr;\n\tif (watch_v4.lookup(&key))",
      "\tkey.addr = saddr;\n\tif (watch_v4.lookup(&key))", "--match dst never matches IPv4", VTAP),
    M("vtap-sampled-out-uncounted", "ebpf/tc_mirror.bpf.c", "V_PASS, R_SAMPLED_OUT, VERDICT_PASS", "V_PASS, R_UNMATCHED, VERDICT_PASS",
      "sampled-out frames counted as unwatched", VTAP),
    M("vtap-non-ip-as-malformed", "ebpf/tc_mirror.bpf.c", "\t\treturn R_NOT_IP;", "\t\treturn R_MALFORMED;",
      "ARP counted as malformed", VTAP),
    M("vtap-cloned-bytes-l2", "ebpf/tc_mirror.bpf.c", "st->cloned_bytes += skb->len;",
      "st->cloned_bytes += skb->len - ETH_HLEN;", "cloned bytes without the Ethernet header", VTAP, nth=1),
    M("vtap-segs-one", "ebpf/tc_mirror.bpf.c", "st->cloned_segs += segs > 1 ? segs : 1;",
      "st->cloned_segs += 1;", "a GSO copy counted as one segment", VTAP, nth=1),
    M("vtap-oversize-boundary", "ebpf/tc_mirror.bpf.c", "return skb->len - l2 > mtu;",
      "return skb->len - l2 >= mtu;", "a copy exactly at the monitor's MTU called oversize", VTAP),
    M("vtap-mirror-all-read-once", "ebpf/tc_mirror.bpf.c", "if (why >= 0 && !mirror_all(cfg))",
      "if (why >= 0)", "a frame missed while the watch-list changes to mirror-all", VTAP),
    M("vtap-helper-failure-uncounted", "ebpf/tc_mirror.bpf.c", "V_PASS, R_CLONE_FAILED, VERDICT_PASS",
      "V_PASS, R_SAMPLED_OUT, VERDICT_PASS", "--clone helper: a refused copy is not counted as failed", VTAP),
    # --- the shared parsing -----------------------------------------------------------------------
    M("parse-one-vlan", "ebpf/include/parsing_helpers.h", "for (int i = 0; i < VLAN_MAX_DEPTH; i++) {",
      "for (int i = 0; i < 1; i++) {", "QinQ frames not parsed past the outer tag", HEADERS),
    M("parse-v4-version", "ebpf/include/parsing_helpers.h", "if (iph->version != 4 || iph->ihl < 5)",
      "if (iph->ihl < 5)", "an IPv4 ethertype with version 6 parsed as IPv4", HEADERS),
    M("parse-v4-options", "ebpf/include/parsing_helpers.h", "hdrsize = iph->ihl * 4;",
      "hdrsize = sizeof(*iph);", "IPv4 options read as the L4 header", HEADERS),
    M("parse-first-fragment", "ebpf/include/parsing_helpers.h", "bpf_htons(IP_MF | IP_OFFSET)",
      "bpf_htons(IP_OFFSET)", "a first fragment taken for a whole datagram", HEADERS),
    M("parse-v6-ext-len", "ebpf/include/parsing_helpers.h", "nh->pos += (h->hdrlen + 1) * 8;",
      "nh->pos += h->hdrlen * 8;", "IPv6 extension headers skipped 8 bytes short", HEADERS),
    M("parse-udp-len", "ebpf/include/parsing_helpers.h", "len = bpf_ntohs(h->len) - (int)sizeof(*h);",
      "len = bpf_ntohs(h->len);", "UDP payload length 8 bytes long", HEADERS),
    M("parse-tcp-options", "ebpf/include/parsing_helpers.h", "len = h->doff * 4;", "len = sizeof(*h);",
      "TCP options taken for payload", HEADERS),
    # --- checksums -----------------------------------------------------------------------------------
    M("csum-fold-once", "ebpf/include/csum_helpers.h", "for (int i = 0; i < 4; i++)\n\t\tsum = (sum & 0xffff)",
      "for (int i = 0; i < 1; i++)\n\t\tsum = (sum & 0xffff)", "a sum folded once: carries lost", HEADERS),
    M("csum-replace4-low", "ebpf/include/csum_helpers.h", "\ts += to & 0xffff;\n", "\ts += to >> 16;\n",
      "a 4-byte rewrite sums the new value's high half twice", HEADERS),
    M("csum-replace16-3words", "ebpf/include/csum_helpers.h", "for (int i = 0; i < 4; i++) {",
      "for (int i = 0; i < 3; i++) {", "an IPv6 address rewrite leaves its last word out of the sum", HEADERS, nth=1),
    M("csum-udp-zero-kept", "ebpf/include/csum_helpers.h", "\tcsum_replace4(sum, from, to);\n\tif (!*sum)",
      "\tcsum_replace4(sum, from, to);\n\tif (0)", "a UDP checksum that becomes 0 is sent as 0 (no checksum)",
      HEADERS),
    M("csum-pseudo4-len", "ebpf/include/csum_helpers.h", "s += bpf_htons(len);", "s += len;",
      "the IPv4 pseudo-header's length in host order", HEADERS),
    M("csum-pseudo6-next", "ebpf/include/csum_helpers.h", "s += bpf_htons(next);", "s += next;",
      "the IPv6 pseudo-header's next header in host order", HEADERS),
    M("csum-tail-byte", "ebpf/include/csum_helpers.h", "sum += (__u32)b[1] << 8;", "sum += b[1];",
      "a segment ending 2 or 3 bytes into a word summed wrong", HEADERS),
    # --- rewrites ------------------------------------------------------------------------------------
    M("rewrite-partial-never", "ebpf/include/rewrite_helpers.h",
      "c->partial = *field == (__sum16)csum_fold16(pseudo);", "c->partial = 0;",
      "a partial checksum (TX offload) taken for a whole one", HEADERS),
    M("rewrite-udp-port-zero", "ebpf/include/rewrite_helpers.h", "udp_csum_replace2(c->field, from, to);",
      "csum_replace2(c->field, from, to);", "a UDP datagram without checksum gets one made up", HEADERS),
    M("rewrite-ttl-check", "ebpf/include/rewrite_helpers.h", "check += (__u32)bpf_htons(0x0100);",
      "check += (__u32)bpf_htons(0x0001);", "the IPv4 checksum wrong after the TTL's decrement", HEADERS),
    M("rewrite-finish-tx-only", "ebpf/include/rewrite_helpers.h",
      "(action != XDP_TX && action != XDP_REDIRECT)", "(action != XDP_TX)",
      "a partial checksum left unfinished on XDP_REDIRECT", HEADERS),
    M("rewrite-macs-swapped", "ebpf/include/rewrite_helpers.h", "__builtin_memcpy(eth->h_source, src, ETH_ALEN);",
      "__builtin_memcpy(eth->h_source, dst, ETH_ALEN);", "forwarded frames leave with the wrong source MAC",
      REDIRECT),
    # --- the XDP vTAP -------------------------------------------------------------------------------
    M("xdp-mirror-mirror-all-read-once", "ebpf/xdp_mirror.bpf.c",
      " &&\n\t\t    !(flags_now(cfg) & VTAP_F_MIRROR_ALL))\n\t\t\tcopy = 0;", ")\n\t\t\tcopy = 0;",
      "a frame missed while the watch-list changes to mirror-all", XDP_MIRROR),
    M("xdp-mirror-ttl-kept", "ebpf/xdp_mirror.bpf.c", "\t\tip_decrease_ttl(p.iph);", "\t\t;",
      "IPv4 sent on without its TTL decremented", XDP_MIRROR),
    M("xdp-mirror-hop-limit-1", "ebpf/xdp_mirror.bpf.c", "if (p->ip6h->hop_limit <= 1)",
      "if (p->ip6h->hop_limit < 1)", "IPv6 with hop limit 1 sent on instead of to the kernel", XDP_MIRROR),
    M("xdp-mirror-no-copy", "ebpf/xdp_mirror.bpf.c", "bpf_redirect_map(pair, 0, BPF_F_BROADCAST | BPF_F_EXCLUDE_INGRESS)",
      "bpf_redirect_map(pair, 0, 0)", "watched frames sent to their egress alone, never to the monitor", XDP_MIRROR),
    M("xdp-mirror-partial-kept", "ebpf/xdp_mirror.bpf.c", "l4csum_exit(ctx, &c, XDP_REDIRECT, skb,",
      "l4csum_exit(ctx, &c, XDP_REDIRECT, 1,", "a partial checksum left unfinished in native mode", XDP_MIRROR),
    M("xdp-mirror-monitor-mtu", "ebpf/xdp_mirror.bpf.c", "cfg->monitor_mtu + ETH_HLEN)",
      "cfg->monitor_mtu + ETH_HLEN + 100)", "copies longer than the monitor's MTU sent to it", XDP_MIRROR),
    M("xdp-mirror-vlan-routed", "ebpf/xdp_mirror.bpf.c", "if (proto_is_vlan(p.eth->h_proto))", "if (0)",
      "VLAN-tagged frames routed by the program", XDP_MIRROR),
    M("xdp-mirror-hop-by-hop-routed", "ebpf/xdp_mirror.bpf.c", "p.ip6h->nexthdr == IPPROTO_HOPOPTS", "0",
      "IPv6 hop-by-hop headers not left to the router", XDP_MIRROR),
    # (the tracepoint's check of VTAP_F_MONITOR_NO_XDP removed is equivalent in every test: with the
    # flag on, the program adds nothing pending for the monitor, so a report finds nothing to take;
    # the check keeps copies that were pending when the flag went on from another node's reports)
    M("xdp-mirror-skipped-copies-uncounted", "ebpf/xdp_mirror.py",
      'lost = c["monitor_dropped"] + c["monitor_pending"] + c["redirect_errors"]',
      'lost = c["monitor_dropped"] + c["redirect_errors"]', "copies the kernel skipped counted as cloned",
      XDP_MIRROR),
    # --- vTAP sessions ------------------------------------------------------------------------------
    M("sessions-every-rule-decides", "ebpf/tc_sessions.bpf.c", "\t\t\tx->w[w] &= ~s->rules.w[w];", "\t\t\t;",
      "a session's later rules decide too (not the first match)", SESSIONS),
    M("sessions-shared-target-twice", "ebpf/tc_sessions.bpf.c", "\t\tshadow |= s->shadow;", "\t\t;",
      "two sessions with one target send a frame twice", SESSIONS),
    M("sessions-fragment-protocol-lost", "ebpf/tc_sessions.bpf.c",
      "parsed == PARSE_OK || parsed == PARSE_OTHER || parsed == PARSE_FRAGMENT ? p->l4 : -1",
      "parsed == PARSE_OK || parsed == PARSE_OTHER ? p->l4 : -1",
      "fragments matched as of no known protocol", SESSIONS),
    M("sessions-cut-ignores-the-tag", "ebpf/tc_sessions.bpf.c", "bpf_skb_change_tail(skb, want - tagged, 0)",
      "bpf_skb_change_tail(skb, want, 0)", "a tagged copy cut 4 bytes long", SESSIONS),
    M("sessions-erspan-t-bit", "ebpf/tc_sessions.bpf.c", "\t\t\t\t\tb |= 0x04;", "\t\t\t\t\tb |= 0;",
      "a cut ERSPAN II copy without its T bit", SESSIONS, nth=1),
    M("sessions-udp6-pseudo-length", "ebpf/tc_sessions.bpf.c",
      "__be32 tail[2] = {bpf_htonl(len), bpf_htonl(IPPROTO_UDP)};",
      "__be32 tail[2] = {bpf_htonl(len + 1), bpf_htonl(IPPROTO_UDP)};",
      "a wrong outer UDP checksum to an IPv6 collector", SESSIONS),
    M("sessions-partial-inner-ignored", "ebpf/tc_sessions.bpf.c",
      "__u32 fix = partial_fix(skb, ETH_HLEN + hlen + l2, cut);", "__u32 fix = 0;",
      "the outer IPv6 UDP checksum built for an unfinished inner checksum", SESSIONS),
    M("sessions-oversize-sent", "ebpf/tc_sessions.bpf.c", "\tif (size > room) {", "\tif (size > room + 10000) {",
      "copies too big for the path sent (to be fragmented or dropped)", SESSIONS),
    M("sessions-gso-by-whole-length", "ebpf/tc_sessions.bpf.c",
      "\tif (want == wire && skb->gso_segs > 1 && skb->gso_size) {", "\tif (0) {",
      "a GRO'd frame judged by its whole length, so counted oversize", SESSIONS),
    M("sessions-own-copies-copied", "ebpf/tc_sessions.bpf.c",
      "if ((skb->cb[0] & SESS_TAG_MASK) == SESS_TAG_COPY) {", "if (0) {",
      "the program's own copies copied again", SESSIONS),
    M("sessions-vlan-tag-dropped", "ebpf/tc_sessions.bpf.c", "\t\tl2 += 4;", "\t\t;",
      "a tunnelled copy loses its VLAN tag", SESSIONS),
    M("sessions-outer-ip-checksum", "ebpf/tc_sessions.bpf.c",
      "ip.check = ~csum_fold32((__u32)bpf_csum_diff(0, 0, (void *)&ip, sizeof(ip), 0)) & 0xffff;",
      "ip.check = ~csum_fold32((__u32)bpf_csum_diff(0, 0, (void *)&ip, sizeof(ip), 1)) & 0xffff;",
      "a wrong outer IPv4 header checksum", SESSIONS),
    M("encap-gre-key-flag-lost", "ebpf/encap.py", "struct.pack(\"!HHI\", 0x2000, GRE_PROTO[kind], target.key)",
      "struct.pack(\"!HHI\", 0, GRE_PROTO[kind], target.key)", "a GRE key sent without its K bit (the key read as data)",
      SESSIONS),
    M("session-tables-containment-reversed", "ebpf/session_tables.py", "(n is None or p.subnet_of(n))",
      "(n is None or n.subnet_of(p))", "an address matched by the rules of prefixes inside its own",
      SESSION_TABLES),
    # --- the XDP redirect ---------------------------------------------------------------------------
    M("redirect-v6-hop-limit-1", "ebpf/xdp_redirect.bpf.c", "if (ip6h->hop_limit <= 1) {",
      "if (ip6h->hop_limit < 1) {", "IPv6 with hop limit 1 forwarded instead of left to the kernel", REDIRECT),
    M("redirect-v6-hop-limit-kept", "ebpf/xdp_redirect.bpf.c", "\t\tip6h->hop_limit--;", "\t\t;",
      "IPv6 forwarded without decrementing the hop limit", REDIRECT),
    M("redirect-v4-ttl-1", "ebpf/xdp_redirect.bpf.c", "if (iph->ttl <= 1) {", "if (iph->ttl < 1) {",
      "IPv4 with TTL 1 forwarded instead of left to the kernel", REDIRECT),
    M("redirect-reply-port", "ebpf/xdp_redirect.bpf.c", "rewrite_port(p.sport, to->port, &c);",
      "rewrite_port(p.dport, to->port, &c);", "replies keep the backend's port", REDIRECT),
    M("redirect-v6-mtu", "ebpf/xdp_redirect.bpf.c",
      "fib.tot_len = bpf_ntohs(ip6h->payload_len) + sizeof(*ip6h);", "fib.tot_len = bpf_ntohs(ip6h->payload_len);",
      "IPv6 packets 40 bytes over the egress MTU forwarded", REDIRECT),
    M("redirect-reply-key-port", "ebpf/redirect_match.h", "key->port = *p->sport;", "key->port = *p->dport;",
      "replies looked up by the wrong port", REDIRECT),
    M("redirect-fragment-uncounted", "ebpf/redirect_match.h", "\t\treturn R_FRAGMENT;", "\t\treturn R_MALFORMED;",
      "fragments counted as malformed", REDIRECT),
    M("redirect-v6-rule-on-source", "ebpf/redirect_match.h",
      "__builtin_memcpy(key->addr, &p->ip6h->daddr, sizeof(key->addr));",
      "__builtin_memcpy(key->addr, &p->ip6h->saddr, sizeof(key->addr));",
      "IPv6 rules matched on the source",
      (["tests/test_redirect_fixtures.py", "tests/test_tc_redirect.py"], ["tests/test_redirect.py"])),
    # --- the load balancer --------------------------------------------------------------------------
    M("lb-synack-as-syn", "ebpf/xdp_lb.bpf.c", "(flags & (F_SYN | F_ACK)) == F_SYN;", "(flags & F_SYN);",
      "a SYN-ACK from outside opens a session", LB),
    M("lb-ring-ignores-service", "ebpf/xdp_lb.bpf.c", "slot = service * LB_RING_SIZE + h % LB_RING_SIZE;",
      "slot = h % LB_RING_SIZE;", "every service uses the first service's backends", LB),
    M("lb-reverse-leak", "ebpf/xdp_lb.bpf.c", "\t\treverse.delete(&rk);", "\t\t;",
      "an ended NAT session keeps its LB port", LB),
    M("lb-reply-ports-swapped", "ebpf/xdp_lb.bpf.c", "rewrite_ports(p, svc->port, fk.cport);",
      "rewrite_ports(p, fk.cport, svc->port);", "replies go back with the ports swapped", LB),
    M("lb-fin-one-side", "ebpf/xdp_lb.bpf.c",
      "(s->state & (LB_FIN_CLIENT | LB_FIN_BACKEND)) == (LB_FIN_CLIENT | LB_FIN_BACKEND)) {",
      "(s->state & LB_FIN_CLIENT)) {", "a session ends after the client's FIN alone", LB),
    M("lb-timeout-doubled", "ebpf/xdp_lb.bpf.c", "now - s->last_seen > cf->timeout_ns[to & 3]",
      "now - s->last_seen > 2 * cf->timeout_ns[to & 3]", "sessions live twice their timeout", LB),
    M("lb-options-ignored", "ebpf/include/parsing_helpers.h", "p->options = p->iph->ihl != 5;",
      "p->options = p->iph->ihl > 6;", "a service's packets with short IPv4 options forwarded", LB),
    # (`<` made `<=` here, a reply to the port after the range looked up too, is equivalent: no session
    # can hold a port outside the range, so the lookup finds none and the frame passes as before)
    M("lb-port-range-last", "ebpf/xdp_lb.bpf.c", "port - cf->port_min < cf->port_count)",
      "port - cf->port_min < cf->port_count - 1)", "a reply to the range's last LB port not taken for one", LB),
    M("lb-port-range-first", "ebpf/xdp_lb.bpf.c", "port >= cf->port_min &&", "port > cf->port_min &&",
      "a reply to the range's first LB port not taken for one", LB),
    M("lb-reply-mac", "ebpf/xdp_lb.bpf.c", "__builtin_memcpy(p->h.eth->h_dest, s->client_mac, ETH_ALEN);",
      "__builtin_memcpy(p->h.eth->h_dest, s->backend_mac, ETH_ALEN);", "replies sent back to the backend's MAC", LB),
    M("lb-frag-passes", "ebpf/xdp_lb.bpf.c", "\t\t*verdict = XDP_DROP;", "\t\t*verdict = XDP_PASS;",
      "a fragment (or a cut-short header) to a VIP passed to the stack", LB),
    # --- the one exit and the one parse every program shares ----------------------------------------
    M("exit-reason-uncounted", "ebpf/include/verdict.h", "\tfp->reason[r]++;", "\t;",
      "frames counted in no reason", EXIT),
    M("exit-dropped-uncounted", "ebpf/include/verdict.h", "\t\tfp->dropped[r]++;", "\t\t;",
      "what is dropped not said by reason", EXIT),
    M("exit-drop-as-pass", "ebpf/include/verdict.h", "action == XDP_DROP ? V_DROP", "action == XDP_DROP ? V_PASS",
      "XDP drops counted as passed", EXIT),
    M("parse-short-l4-as-other", "ebpf/include/parsing_helpers.h",
      "\t\tif (parse_tcphdr(&nh, data_end, &tcph) < 0)\n\t\t\treturn PARSE_SHORT_L4;",
      "\t\tif (parse_tcphdr(&nh, data_end, &tcph) < 0)\n\t\t\treturn PARSE_OTHER;",
      "a TCP header cut short taken for another protocol", EXIT),
    # --- the Python the data plane depends on --------------------------------------------------------
    M("maglev-weights-ignored", "ebpf/maglev.py", "credit[i] += w", "credit[i] += 1",
      "backends' weights ignored", LB_PY),
    M("maglev-order-dependent", "ebpf/maglev.py", "live = sorted((n, w) for n, w in weights.items() if w > 0)",
      "live = [(n, w) for n, w in weights.items() if w > 0]", "the table depends on the backends' order", LB_PY),
    M("lb-nat-ports-overlap", "ebpf/xdp_lb.py", "below, above = (1024, lo - 1024), (hi + 1, 65535 - hi)",
      "below, above = (1024, hi - 1024), (hi + 1, 65535 - hi)",
      "NAT ports that overlap the host's own ephemeral ports", LB_PY),
    M("lb-sweep-keeps-idle", "ebpf/xdp_lb.py", "if now - v.last_seen / 1e9 <= self._timeout(v.state):",
      "if now - v.last_seen / 1e9 <= 2 * self._timeout(v.state):", "idle sessions swept at twice their timeout",
      LB_PY),
    M("health-rise-ignored", "lab/fastpaths/lb/health.py", "if self._streak[b] >= (self.rise if ok else self.fall):",
      "if self._streak[b] >= (1 if ok else self.fall):", "a backend back after one good probe, not --rise",
      HEALTH),
    M("health-fall-ignored", "lab/fastpaths/lb/health.py", "if self._streak[b] >= (self.rise if ok else self.fall):",
      "if self._streak[b] >= (self.rise if ok else 1):", "a backend out after one failed probe, not --fall", HEALTH),
    M("health-timeout-passes", "lab/fastpaths/lb/health.py", "        except OSError:\n            return False",
      "        except socket.timeout:\n            return True\n        except OSError:\n            return False",
      "a backend that fails silently (probes time out) counted healthy", HEALTH),
    M("health-not-applied", "lab/fastpaths/lb/command.py", "{b: (w if up.get(b, True) else 0)", "{b: (w if up.get(b, True) or 1 else 0)",
      "the command line's health results never reach the LB's table", HEALTH),
    M("lb-cli-timeouts-ignored", "lab/fastpaths/lb/command.py", "mode=a.mode, timeouts=read_timeouts(a))", "mode=a.mode, timeouts=None)",
      "--timeout accepted and ignored", (["tests/test_lb_health.py"], [])),
    M("watch-host-bits", "ebpf/watchlist.py", "net = ipaddress.ip_network(text.strip(), strict=True)",
      "net = ipaddress.ip_network(text.strip(), strict=False)", "a CIDR with host bits set accepted silently",
      WATCH_PY),
    M("partial-fold", "lab/traffic/partial.py", "s = (s & 0xFFFF) + (s >> 16)", "s = s & 0xFFFF",
      "the tests' own partial checksums computed wrong (their frames)", (["tests/test_partial_csum.py"], [])),
]


# --- the tree, kept whole -------------------------------------------------------------------
def restore_all(root=ROOT) -> list[str]:
    """Put back every file a killed run left edited (its FILE.mutant-orig)."""
    put_back = []
    for orig in sorted(root.rglob(f"*{BACKUP}")):
        target = orig.with_name(orig.name[:-len(BACKUP)])
        os.replace(orig, target)
        put_back.append(str(target.relative_to(root)))
    return put_back


class Edited:
    """The mutant's file edited for the block, restored after it, whatever happens."""

    def __init__(self, mutant, root=ROOT):
        self.m, self.path = mutant, root / mutant.path
        self.backup = self.path.with_name(self.path.name + BACKUP)

    def __enter__(self):
        text = self.path.read_text()
        mutated = self.m.apply(text)
        self.backup.write_text(text)
        os.chmod(self.backup, os.stat(self.path).st_mode)
        self.path.write_text(mutated)
        return self.m.line(text)

    def __exit__(self, *exc):
        os.replace(self.backup, self.path)
        return False

    def original(self):
        """For a block inside this one: the file as it was, the mutant after."""
        edited = self

        class _Original:
            def __enter__(self):
                self.mutated = edited.path.read_text()
                edited.path.write_text(edited.backup.read_text())

            def __exit__(self, *exc):
                edited.path.write_text(self.mutated)
                return False
        return _Original()


def _failed_test(output: str) -> str | None:
    """The first failing test's node id, from pytest's -rfE summary lines
    ("FAILED tests/x.py::name[param with spaces] - message")."""
    for line in output.splitlines():
        m = re.match(r"(FAILED|ERROR) (tests/.+?)(?: - .*)?$", line)
        if m:
            return m.group(2)
    return None


def _interruptible():
    """In the pytest child: SIGINT as Python's default (a KeyboardInterrupt that
    tears testbeds down), even if this process was started with it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(proc, grace=60) -> str:
    """SIGINT (pytest unwinds its fixtures: namespaces removed), SIGKILL after
    `grace` s. Returns what it printed."""
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


def _hung_in(output: str) -> str:
    """Where a hung test was, from the stack faulthandler dumped: the deepest
    frame in a test file ("tests/x.py:123 in test_name")."""
    frames = re.findall(r'File "[^"]*/(tests/[^"]+)", line (\d+) in (\w+)', output)
    return f"{frames[0][0]}:{frames[0][1]} in {frames[0][2]}" if frames else ""


def run_tests(args, root=ROOT, timeout=TIMEOUT) -> tuple[bool, str, float]:
    """(killed?, by which test, seconds): pytest on `args`, stopping at the first failure."""
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    # faulthandler_timeout: a test that hangs dumps its stack before the timeout, which says where
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider",
                             "-o", "addopts=", "-o", f"faulthandler_timeout={max(1, timeout - 60)}", *args],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, preexec_fn=_interruptible)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        where = _hung_in(_stop(proc))
        return True, f"timeout after {timeout} s ({where or ' '.join(args)})", time.monotonic() - t0
    except KeyboardInterrupt:  # pytest tears its testbeds down on SIGINT: let it, then stop
        _stop(proc)
        raise
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
    seconds = time.monotonic() - t0
    if r.returncode == 0:
        return False, "", seconds
    if r.returncode == 5:  # no tests collected: a wrong -k, not a kill
        raise RuntimeError(f"no test collected by {' '.join(args)}")
    return True, _failed_test(r.stdout) or f"pytest exit {r.returncode} ({' '.join(args)})", seconds


def confirmed_run(args, edited, root=ROOT, tries=3):
    """run_tests(), with each kill confirmed: the failing test alone must fail
    again with the mutant and pass without it. One that does not failed for
    another reason (a flaky test, which is itself a defect, or the machine: a
    second lab run at the same time) and is listed and deselected for the next
    try. Returns (killed?, by, seconds, [tests that failed without the mutant's doing])."""
    flaky, secs, deselect = [], 0.0, []
    for _ in range(tries):
        killed, by, s = run_tests([*args, *deselect], root)
        secs += s
        if not killed or not by.startswith("tests/"):
            return killed, by, secs, flaky
        again, _, s = run_tests([by], root)
        secs += s
        if again:
            with edited.original():
                baseline_fails, _, s = run_tests([by], root)
            secs += s
            if not baseline_fails:
                return True, by, secs, flaky
        flaky.append(by)
        deselect += ["--deselect", by]
    return False, "", secs, flaky


def run(mutants, out_dir, progress=True, root=ROOT) -> Path:
    """Every mutant in turn; the table as CSV in out_dir, returned."""
    from .bench.common import Progress
    put_back = restore_all(root)
    for p in put_back:
        print(f"lab mutants: put back {p}, left edited by a killed run", file=sys.stderr)
    for m in mutants:  # every edit is checked before anything runs
        m.apply((root / m.path).read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"mutants-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.csv"
    rows = []
    bar = Progress(len(mutants)) if progress else None
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["mutant", "where", "what", "killed_by", "stage", "seconds", "flaky"])
        w.writeheader()
        for m in mutants:
            fast, functional = m.tests
            edited = Edited(m, root)
            with edited as line:
                flaky = []
                killed, by, secs, stage = False, "", 0.0, ""
                for name, args in (("fast", fast), ("functional", functional)):
                    if not args:
                        continue
                    killed, by, more, seen_flaky = confirmed_run(args, edited, root)
                    secs += more
                    flaky += seen_flaky
                    if killed:
                        stage = name
                        break
            row = {"mutant": m.id, "where": f"{m.path}:{line}", "what": m.why,
                   "killed_by": by if killed else "SURVIVED", "stage": stage, "seconds": round(secs, 1),
                   "flaky": " ".join(flaky)}
            w.writerow(row)
            f.flush()
            rows.append(row)
            if bar:
                bar.step(f"{m.id}: {'killed' if killed else 'SURVIVED'}")
    print_table(rows)
    return path


def print_table(rows, stream=sys.stdout):
    width = max((len(r["mutant"]) for r in rows), default=10)
    for r in rows:
        stream.write(f"{r['mutant']:<{width}}  {r['where']:<40}  {r['killed_by']}\n")
    survived = [r for r in rows if r["killed_by"] == "SURVIVED"]
    stream.write(f"\n{len(rows) - len(survived)} of {len(rows)} mutants killed"
                 + (f"; survived: {', '.join(r['mutant'] for r in survived)}\n" if survived else "\n"))


def add_arguments(p):
    p.description = __doc__.split("\n\n")[0].split(": ", 1)[1]
    p.add_argument("--only", help="mutant ids, comma-separated (default: all)")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--restore", action="store_true", help="put back files a killed run left edited, and exit")
    p.add_argument("--out", type=Path, default=ROOT / "datasets" / "results",
                   help="where the CSV goes (default datasets/results)")


def main(a) -> int:
    if a.restore:
        for f in restore_all():
            print(f"lab mutants: put back {f}")
        return 0
    chosen = MUTANTS
    if a.only:
        wanted = a.only.split(",")
        unknown = [w for w in wanted if w not in {m.id for m in MUTANTS}]
        if unknown:
            print(f"lab mutants: error: unknown mutant {unknown[0]!r} (--list shows them)", file=sys.stderr)
            return 2
        chosen = [m for m in MUTANTS if m.id in wanted]
    if a.list:
        for m in chosen:
            print(f"{m.id:32} {m.path}:{m.line((ROOT / m.path).read_text()):<5} {m.why}")
        return 0
    if os.geteuid() != 0:
        print("lab mutants: error: the tests run real namespaces and BPF programs: run as root", file=sys.stderr)
        return 2
    # SIGTERM unwinds as Ctrl-C does, through Edited: the file is put back before we exit.
    # SIGINT too when started in the background (`... &` ignores it): its pytest
    # children, which inherit the disposition, are stopped with it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        path = run(chosen, a.out)
    except KeyboardInterrupt:
        print("\nlab mutants: stopped; every file is as it was", file=sys.stderr)
        return 130
    print(f"lab mutants: {path}")
    return 0


if __name__ == "__main__":
    from lab.console import ArgumentParser
    parser = ArgumentParser(prog="python -m lab mutants", error_name="lab mutants")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
