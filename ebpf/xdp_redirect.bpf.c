/* xdp_redirect.bpf.c — rewrite the destination of datagrams sent to a service
 * (protocol, address, port) to a backend, at the XDP hook, and give the
 * backend's replies the service's address back, so that a client's connected
 * socket accepts them.
 *
 * Kernel: 5.x+ (bpf_fib_lookup, DEVMAP_HASH); built and tested on 6.x.
 * Loaded by ebpf/xdp_redirect.py (class XdpRedirect), which passes:
 *   REDIRECT_ACTION   REDIRECT_ACTION_PASS or REDIRECT_ACTION_FORWARD (xdp_redirect.h)
 *
 * One program serves both directions, attached where the client's datagrams
 * arrive and where the backend's replies arrive (often two interfaces of a
 * router): a frame whose destination is a service (`rules`) goes to its backend;
 * a frame whose source is a backend (`replies`) leaves as from its service.
 *
 * After the rewrite (addresses, ports and every checksum that covers them,
 * rewrite_helpers.h), the action decides the way on:
 *   pass     XDP_PASS: the kernel routes the rewritten packet (the seed's design)
 *   forward  bpf_fib_lookup() on the rewritten packet, new MACs, TTL/hop limit
 *            minus one, and XDP_REDIRECT out of the egress interface through the
 *            `egress` devmap: the stack never sees it. What the fast path cannot
 *            take (no neighbour entry yet, TTL <= 1, larger than the egress MTU,
 *            no route) goes to the kernel as `pass` would send it, counted by
 *            reason: the kernel then resolves the neighbour, sends the ICMP error
 *            or fragments, which a program should not redo.
 *
 * Frames it must not touch pass unchanged, counted by reason: not IP, no rule,
 * fragments, malformed. Every return goes through count_verdict().
 */
#include <uapi/linux/bpf.h>
#include <linux/socket.h>
#include "parsing_helpers.h"
#include "rewrite_helpers.h"
#include "xdp_redirect.h"

#ifndef REDIRECT_ACTION
#define REDIRECT_ACTION REDIRECT_ACTION_PASS
#endif

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

/* service -> backend; written by user space, live */
BPF_HASH(rules, struct redirect_key, struct redirect_target, REDIRECT_MAX_RULES);
/* backend -> service, for the replies; written by user space with `rules` */
BPF_HASH(replies, struct redirect_key, struct redirect_target, REDIRECT_MAX_RULES);
/* packets and bytes per rule, both ways; index given by user space */
BPF_PERCPU_ARRAY(rule_stats, struct rule_stats, REDIRECT_MAX_RULES);
/* verdicts and reasons, summed by user space */
BPF_PERCPU_ARRAY(stats, struct redirect_stats, 1);
/* ifindex -> ifindex of every interface `forward` may send out of; user space
 * fills it. A devmap indexed by ifindex (BCC knows no devmap_hash): an interface
 * whose index is REDIRECT_EGRESS_SLOTS or more goes the kernel's way, counted */
BPF_DEVMAP(egress, REDIRECT_EGRESS_SLOTS);

/* The one exit: every verdict is counted here, so no path can miss the count. */
static __always_inline int count_verdict(struct redirect_stats *st, int action)
{
	switch (action) {
	case XDP_PASS:
		st->xdp_pass++;
		break;
	case XDP_REDIRECT:
		st->xdp_redirect++;
		break;
	case XDP_DROP:
		st->xdp_drop++;
		break;
	default:
		st->xdp_aborted++;
	}
	return action;
}

/* The L4 header of a TCP or UDP packet: its checksum and its two ports.
 * Returns 0, or -1 when the header is cut short. */
static __always_inline int parse_ports(struct hdr_cursor *nh, void *data_end, int l4, __sum16 **csum,
				       __be16 **sport, __be16 **dport)
{
	struct udphdr *udph;
	struct tcphdr *tcph;

	if (l4 == IPPROTO_UDP) {
		if (parse_udphdr(nh, data_end, &udph) < 0)
			return -1;
		*csum = &udph->check;
		*sport = &udph->source;
		*dport = &udph->dest;
		return 0;
	}
	if (parse_tcphdr(nh, data_end, &tcph) < 0)
		return -1;
	*csum = &tcph->check;
	*sport = &tcph->source;
	*dport = &tcph->dest;
	return 0;
}

#if REDIRECT_ACTION == REDIRECT_ACTION_FORWARD
/* Send the rewritten packet out ourselves, or say why the kernel must. */
static __always_inline int forward(struct xdp_md *ctx, struct redirect_stats *st, struct ethhdr *eth, int v4,
				   struct iphdr *iph, struct ipv6hdr *ip6h, int l4, __be16 sport, __be16 dport)
{
	struct bpf_fib_lookup fib = {};
	int rc;

	fib.ifindex = ctx->ingress_ifindex;
	fib.l4_protocol = l4;
	fib.sport = sport;
	fib.dport = dport;
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
	void *data_end = (void *)(long)ctx->data_end;
	struct hdr_cursor nh = {.pos = (void *)(long)ctx->data};
	struct redirect_key key = {};
	struct redirect_target *to;
	struct rule_stats *rs;
	struct ethhdr *eth;
	struct iphdr *iph = NULL;
	struct ipv6hdr *ip6h = NULL;
	int v4; /* which of the two: branch on this, not on a pointer being NULL
	         * (the verifier does not take a packet pointer to be non-NULL) */
	__sum16 *l4csum;
	__be16 *sport, *dport;
	__u32 zero = 0, rule;
	int proto, l4, udp, reply = 0;
	struct redirect_stats *st = stats.lookup(&zero);

	if (!st) /* an array's index 0 always exists; the verifier wants the check */
		return XDP_PASS;
	st->seen++;

	proto = parse_ethhdr(&nh, data_end, &eth);
	if (proto == bpf_htons(ETH_P_IP)) {
		l4 = parse_iphdr(&nh, data_end, &iph);
		if (l4 < 0)
			goto malformed;
		if (ip_is_fragment(iph)) {
			st->fragment++;
			return count_verdict(st, XDP_PASS);
		}
		key.family = 4;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		l4 = parse_ip6hdr(&nh, data_end, &ip6h);
		if (l4 < 0)
			goto malformed;
		l4 = skip_ip6hdrext(&nh, data_end, l4);
		if (l4 < 0)
			goto malformed;
		if (l4 == IPPROTO_FRAGMENT) {
			st->fragment++;
			return count_verdict(st, XDP_PASS);
		}
		key.family = 6;
	} else {
		if (proto < 0)
			goto malformed;
		st->not_ip++;
		return count_verdict(st, XDP_PASS);
	}
	if (l4 != IPPROTO_UDP && l4 != IPPROTO_TCP) {
		st->no_rule++;
		return count_verdict(st, XDP_PASS);
	}
	if (parse_ports(&nh, data_end, l4, &l4csum, &sport, &dport) < 0)
		goto malformed;
	udp = l4 == IPPROTO_UDP;
	v4 = key.family == 4;
	key.proto = l4;

	/* To a service? */
	key.port = *dport;
	if (v4)
		key.addr[0] = iph->daddr;
	else
		__builtin_memcpy(key.addr, &ip6h->daddr, sizeof(key.addr));
	to = rules.lookup(&key);
	if (!to) {
		/* From a backend? (a reply) */
		key.port = *sport;
		if (v4)
			key.addr[0] = iph->saddr;
		else
			__builtin_memcpy(key.addr, &ip6h->saddr, sizeof(key.addr));
		to = replies.lookup(&key);
		if (!to) {
			st->no_rule++;
			return count_verdict(st, XDP_PASS);
		}
		reply = 1;
	}

	rule = to->rule;
	rs = rule_stats.lookup(&rule);
	if (rs) {
		if (reply) {
			rs->reply_packets++;
			rs->reply_bytes += data_end - (void *)(long)ctx->data;
		} else {
			rs->packets++;
			rs->bytes += data_end - (void *)(long)ctx->data;
		}
	}
	if (reply) {
		st->to_client++;
		if (v4)
			rewrite_ipv4_addr(iph, &iph->saddr, to->addr[0], l4csum, udp);
		else
			rewrite_ipv6_addr(&ip6h->saddr, (struct in6_addr *)to->addr, l4csum, udp);
		rewrite_port(sport, to->port, l4csum, udp);
	} else {
		st->to_backend++;
		if (v4)
			rewrite_ipv4_addr(iph, &iph->daddr, to->addr[0], l4csum, udp);
		else
			rewrite_ipv6_addr(&ip6h->daddr, (struct in6_addr *)to->addr, l4csum, udp);
		rewrite_port(dport, to->port, l4csum, udp);
	}
#if REDIRECT_ACTION == REDIRECT_ACTION_FORWARD
	return count_verdict(st, forward(ctx, st, eth, v4, iph, ip6h, l4, *sport, *dport));
#else
	return count_verdict(st, XDP_PASS);
#endif

malformed:
	st->malformed++;
	return count_verdict(st, XDP_PASS);
}
