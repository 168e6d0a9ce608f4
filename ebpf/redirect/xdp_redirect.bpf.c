/* xdp_redirect.bpf.c — rewrite the destination of datagrams sent to a service
 * (protocol, address, port) to a backend, at the XDP hook, and give the
 * backend's replies the service's address back, so that a client's connected
 * socket accepts them.
 *
 * Kernel: 5.x+ (bpf_fib_lookup, DEVMAP_HASH); built and tested on 6.x.
 * Loaded by ebpf/redirect/xdp_redirect.py (class XdpRedirect), which passes:
 *   REDIRECT_ACTION   REDIRECT_ACTION_PASS or REDIRECT_ACTION_FORWARD (xdp_redirect.h)
 *
 * One program serves both directions, attached where the client's datagrams
 * arrive and where the backend's replies arrive (often two interfaces of a
 * router): a frame whose destination is a service (`rules`) goes to its backend;
 * a frame whose source is a backend (`replies`) leaves as from its service.
 *
 * After the rewrite (addresses, ports and every checksum that covers them,
 * rewrite_helpers.h; a checksum the sender's offload left partial is kept
 * partial for an skb and finished for a frame that leaves on XDP's own path),
 * the action decides the way on:
 *   pass     XDP_PASS: the kernel routes the rewritten packet (the report's design)
 *   forward  bpf_fib_lookup() on the rewritten packet, new MACs, TTL/hop limit
 *            minus one, and XDP_REDIRECT out of the egress interface through the
 *            `egress` devmap: the stack never sees it. What the fast path cannot
 *            take (no neighbour entry yet, TTL <= 1, larger than the egress MTU,
 *            no route) goes to the kernel as `pass` would send it, counted by
 *            reason: the kernel then resolves the neighbour, sends the ICMP error
 *            or fragments, which a program should not redo.
 *
 * Frames it must not touch pass unchanged, counted by reason: not_ip,
 * unmatched, fragment, malformed. It parses with the shared parse_l4(), and
 * every return goes through xdp_exit() (verdict.h), which counts the verdict
 * and the reason.
 */
#include <uapi/linux/bpf.h>
#include "parsing_helpers.h"
#include "rewrite_helpers.h"
#include "xdp_redirect.h"
#include "redirect_match.h" /* the maps, the parse and the lookup, shared with tc_redirect.bpf.c */

#ifndef REDIRECT_ACTION
#define REDIRECT_ACTION REDIRECT_ACTION_PASS
#endif

REDIRECT_MAPS();


/* ifindex -> ifindex of every interface `forward` may send out of; user space
 * fills it. A devmap indexed by ifindex (BCC knows no devmap_hash): an interface
 * whose index is REDIRECT_EGRESS_SLOTS or more goes the kernel's way, counted */
BPF_DEVMAP(egress, REDIRECT_EGRESS_SLOTS);

/* 1 when attached in generic mode: every verdict then leaves as an skb, which
 * carries a partial checksum on (rewrite_helpers.h). Written by user space
 * before it attaches. */
BPF_ARRAY(skb_mode, __u32, 1);
BPF_PERCPU_ARRAY(csum_scratch, struct csum_block, 1); /* where a partial checksum is finished */

#if REDIRECT_ACTION == REDIRECT_ACTION_FORWARD
/* Send the rewritten packet out ourselves, or say why the kernel must. */
static __always_inline int forward(struct xdp_md *ctx, struct redirect_stats *st, struct l4_pkt *p)
{
	struct ethhdr *eth = p->eth;
	struct iphdr *iph = p->iph;
	struct ipv6hdr *ip6h = p->ip6h;
	int v4 = p->v4;
	struct bpf_fib_lookup fib = {};
	int rc;

	fib.ifindex = ctx->ingress_ifindex;
	fib.l4_protocol = p->l4;
	fib.sport = *p->sport;
	fib.dport = *p->dport;
	if (v4) {
		if (iph->ttl <= 1) {
			st->slow_ttl++;
			return XDP_PASS;
		}
		fib.family = AF_INET;
		fib.tos = iph->tos;
		fib.tot_len = bpf_ntohs(iph->tot_len);
		fib.ipv4_src = iph->saddr;
		fib.ipv4_dst = iph->daddr;
	} else {
		if (ip6h->hop_limit <= 1) {
			st->slow_ttl++;
			return XDP_PASS;
		}
		fib.family = AF_INET6;
		fib.flowinfo = *(__be32 *)ip6h & bpf_htonl(0x0FFFFFFF);
		/* the whole packet, which is what the MTU is compared with */
		fib.tot_len = bpf_ntohs(ip6h->payload_len) + sizeof(*ip6h);
		__builtin_memcpy(fib.ipv6_src, &ip6h->saddr, sizeof(fib.ipv6_src));
		__builtin_memcpy(fib.ipv6_dst, &ip6h->daddr, sizeof(fib.ipv6_dst));
	}

	rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);
	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		break;
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		st->slow_no_neigh++;
		return XDP_PASS;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		st->slow_too_big++;
		return XDP_PASS;
	default: /* blackhole, unreachable, prohibit, not forwarded, unsupported */
		st->slow_no_route++;
		return XDP_PASS;
	}
	if (v4)
		ip_decrease_ttl(iph);
	else
		ip6h->hop_limit--;
	set_macs(eth, fib.smac, fib.dmac);
	/* XDP_PASS when the egress interface is not in the devmap: user space put
	 * every interface of the namespace there, so this is a route out of one
	 * made after it started */
	rc = egress.redirect_map(fib.ifindex, XDP_PASS);
	if (rc == XDP_PASS)
		st->slow_no_route++;
	return rc;
}
#endif

int xdp_redirect(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct l4_pkt p = {};
	struct redirect_key key = {};
	struct redirect_target *to;
	struct l4csum c = {};
	__u32 zero = 0, rule, *generic;
	int parsed, reason, udp, action;
	struct redirect_stats *st = stats.lookup(&zero);

	if (!st) /* an array's index 0 always exists; the verifier wants the check */
		return XDP_PASS;
	st->exits.seen++;

	parsed = parse_l4(data, data_end, &p, PARSE_L4);
	if (parsed != PARSE_OK) /* untouched, counted by reason */
		return xdp_exit(&st->exits, XDP_PASS, parse_reason(parsed));
	/* to a service? else, from a backend (a reply)? */
	service_key(&p, &key);
	to = rules.lookup(&key);
	reason = R_TO_BACKEND;
	if (!to) {
		reply_key(&p, &key);
		to = replies.lookup(&key);
		reason = R_TO_CLIENT;
	}
	if (!to)
		return xdp_exit(&st->exits, XDP_PASS, R_UNMATCHED);
	rule = to->rule;
	count_rule(rule_stats.lookup(&rule), reason == R_TO_CLIENT, data_end - data);

	udp = p.l4 == IPPROTO_UDP;
	if (p.v4)
		l4csum_init(&c, p.l4hdr, p.l4csum, udp, p.l4len,
			    ipv4_pseudo_sum(p.iph->saddr, p.iph->daddr, p.l4, p.l4len));
	else
		l4csum_init(&c, p.l4hdr, p.l4csum, udp, p.l4len,
			    ipv6_pseudo_sum((__be32 *)&p.ip6h->saddr, (__be32 *)&p.ip6h->daddr, p.l4, p.l4len));
	st->csum_partial += c.partial;
	if (reason == R_TO_CLIENT) {
		if (p.v4)
			rewrite_ipv4_addr(p.iph, &p.iph->saddr, to->addr[0], &c);
		else
			rewrite_ipv6_addr(&p.ip6h->saddr, (struct in6_addr *)to->addr, &c);
		rewrite_port(p.sport, to->port, &c);
	} else {
		if (p.v4)
			rewrite_ipv4_addr(p.iph, &p.iph->daddr, to->addr[0], &c);
		else
			rewrite_ipv6_addr(&p.ip6h->daddr, (struct in6_addr *)to->addr, &c);
		rewrite_port(p.dport, to->port, &c);
	}
#if REDIRECT_ACTION == REDIRECT_ACTION_FORWARD
	action = forward(ctx, st, &p);
#else
	action = XDP_PASS;
#endif
	generic = skb_mode.lookup(&zero);
	if (l4csum_exit(ctx, &c, action, generic && *generic, csum_scratch.lookup(&zero)) < 0)
		/* the segment the IP header claims is not all in the frame */
		return xdp_exit(&st->exits, XDP_DROP, R_MALFORMED);
	return xdp_exit(&st->exits, action, reason);
}
