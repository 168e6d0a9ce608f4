/* tc_redirect.bpf.c — xdp_redirect.bpf.c's rules at the TC (clsact) ingress
 * hook: rewrite the destination of datagrams sent to a service (protocol,
 * address, port) to a backend, and give the backend's replies the service's
 * address back. The same maps, keys and counters as the XDP program
 * (xdp_redirect.h), so that the two can be compared packet for packet: what
 * the XDP hook buys is the difference (no skb yet, no GRO, no tc).
 *
 * Kernel: 5.10+ (bpf_redirect_neigh; 5.7+ for __sk_buff gso_size); built and
 * tested on 6.x. On kernels without BPF_F_IPV6 (before 6.16 and its stable
 * backports) the IPv6 checksum update retries without it, see skb_rewrite_addr6().
 * Loaded by ebpf/redirect/tc_redirect.py (class TcRedirect), direct-action, which passes:
 *   REDIRECT_ACTION   REDIRECT_ACTION_PASS or REDIRECT_ACTION_FORWARD (xdp_redirect.h)
 *
 * Where the XDP program edits the frame through pointers and RFC 1624, this one
 * goes through the skb helpers: bpf_skb_store_bytes() for the fields,
 * bpf_l3_csum_replace() for the IPv4 header checksum, bpf_l4_csum_replace()
 * for TCP/UDP (BPF_F_PSEUDO_HDR for addresses, which the pseudo-header covers,
 * not for ports; BPF_F_MARK_MANGLED_0 for UDP). Unlike a pointer write, they
 * keep the skb's checksum state right: a CHECKSUM_PARTIAL skb (a local sender
 * with TX checksum offload) holds only the pseudo-header's sum in its L4 field,
 * and the helpers then fold in addresses but not ports; a CHECKSUM_COMPLETE
 * skb's skb->csum is kept in step. They also un-clone the skb before writing.
 *
 * After the rewrite, the action decides the way on:
 *   pass     TC_ACT_OK: the kernel routes the rewritten packet
 *   forward  bpf_fib_lookup() on the rewritten packet, TTL/hop limit minus one,
 *            then bpf_redirect_neigh() out of the egress interface, which finds
 *            the next hop and its MAC itself (and resolves a neighbour it does
 *            not know yet: TC has the skb the neighbour queue needs, which XDP
 *            has not). What the fast path cannot take (TTL <= 1, larger than the
 *            egress MTU, no route, a VLAN tag) goes to the kernel rewritten, as
 *            `pass` hands it over, counted by reason.
 *
 * The verdicts are counted under the names every program uses (verdict.h), so
 * one Python class (and one table of counters) serves both programs:
 *   pass      TC_ACT_OK        (the frame goes on into the stack)
 *   redirect  TC_ACT_REDIRECT  (bpf_redirect_neigh took it)
 *   drop      TC_ACT_SHOT      (a helper failed half-way through a rewrite,
 *                              or bpf_redirect_neigh refused its arguments)
 *   aborted   anything else    (never returned today)
 * slow_no_neigh stays 0: bpf_redirect_neigh resolves the neighbour itself.
 *
 * Frames it must not touch pass unchanged, counted by reason: not_ip,
 * unmatched, fragment, malformed. It parses with the shared parse_l4(), and
 * every return goes through tc_exit() (verdict.h).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include "parsing_helpers.h"
#include "xdp_redirect.h"
#include "redirect_match.h" /* the maps, the parse and the lookup, shared with xdp_redirect.bpf.c */
#include "skb_rewrite.h"    /* struct pkt_fields and the checksum-keeping rewrites, shared with tc_pods.bpf.c */

#ifndef REDIRECT_ACTION
#define REDIRECT_ACTION REDIRECT_ACTION_PASS
#endif

#ifndef offsetof
#define offsetof(type, member) __builtin_offsetof(type, member)
#endif

/* bpf_redirect_neigh(ifindex, params, plen, flags), as the kernel has it:
 * BCC 0.26's helpers.h declares it without plen, so its flags would land in
 * plen and whatever R4 held would be the flags (the helper refuses any). */
static long (*redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) =
	(void *)BPF_FUNC_redirect_neigh;

/* Deepest header the parser reads: Ethernet, two VLAN tags, IPv4 with all its
 * options (60) or IPv6 with a few extension headers, and TCP with all its
 * options (60). Enough to cover both, with room for IPv6 extensions. */
#define PULL_DEPTH 256

REDIRECT_MAPS();

#if REDIRECT_ACTION == REDIRECT_ACTION_FORWARD
/* Send the rewritten packet out ourselves, or say why the kernel must. */
static __always_inline int forward(struct __sk_buff *skb, struct redirect_stats *st, const struct pkt_fields *p)
{
	struct bpf_fib_lookup fib = {};
	int rc;

	/* bpf_redirect_neigh() strips exactly an Ethernet header and takes the IP
	 * header to follow (skb->protocol must say IP): a tag in the data (QinQ's
	 * inner one, or any when the driver does not strip tags) would be sent as
	 * the IP header. A tag the kernel moved to skb->vlan_tci would go out
	 * again on the egress device. Either way, not ours to route. */
	if (p->l3 != ETH_HLEN || skb->vlan_present) {
		st->slow_no_route++;
		return TC_ACT_OK;
	}
	if (p->ttl <= 1) {
		st->slow_ttl++;
		return TC_ACT_OK;
	}
	fib.ifindex = skb->ingress_ifindex;
	fib.l4_protocol = p->l4;
	fib.sport = p->sport_val;
	fib.dport = p->dport_val;
	/* The MTU check: with tot_len the lookup compares that length with the
	 * route's MTU before it looks at neighbours, so an unresolved neighbour
	 * cannot skip it. A GSO skb (GRO on the way in) is longer than any MTU
	 * and leaves as segments that fit: tot_len 0 makes the helper check the
	 * skb itself (is_skb_forwardable, which lets GSO through). */
	if (!skb->gso_size)
		fib.tot_len = p->tot_len;
	if (p->v4) {
		fib.family = AF_INET;
		fib.tos = p->tos;
		fib.ipv4_src = p->saddr[0];
		fib.ipv4_dst = p->daddr[0];
	} else {
		fib.family = AF_INET6;
		fib.flowinfo = p->flowinfo;
		__builtin_memcpy(fib.ipv6_src, p->saddr, sizeof(fib.ipv6_src));
		__builtin_memcpy(fib.ipv6_dst, p->daddr, sizeof(fib.ipv6_dst));
	}

	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
	case BPF_FIB_LKUP_RET_NO_NEIGH: /* the route is known (fib.ifindex is set):
					 * bpf_redirect_neigh resolves the neighbour */
		break;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		st->slow_too_big++;
		return TC_ACT_OK;
	default: /* blackhole, unreachable, prohibit, not forwarded, unsupported */
		st->slow_no_route++;
		return TC_ACT_OK;
	}

	if (p->v4) {
		/* TTL and protocol share a 16-bit word of the header checksum */
		__u8 ttl = p->ttl - 1;
		__be16 old = bpf_htons(((__u16)p->ttl << 8) | (__u8)p->l4);
		__be16 new = bpf_htons(((__u16)ttl << 8) | (__u8)p->l4);

		if (bpf_l3_csum_replace(skb, p->l3 + offsetof(struct iphdr, check), old, new, sizeof(new)) < 0 ||
		    bpf_skb_store_bytes(skb, p->l3 + offsetof(struct iphdr, ttl), &ttl, 1, 0) < 0)
			return TC_ACT_SHOT;
	} else {
		__u8 hop_limit = p->ttl - 1;

		/* no checksum covers the hop limit: only a CHECKSUM_COMPLETE
		 * skb->csum must learn of it (BPF_F_RECOMPUTE_CSUM) */
		if (bpf_skb_store_bytes(skb, p->l3 + offsetof(struct ipv6hdr, hop_limit), &hop_limit, 1,
					BPF_F_RECOMPUTE_CSUM) < 0)
			return TC_ACT_SHOT;
	}
	/* NULL: the helper looks the next hop up again from the packet's (new)
	 * destination, in the egress device's namespace, and fills in the MACs */
	return redirect_neigh(fib.ifindex, NULL, 0, 0);
}
#endif

int tc_redirect(struct __sk_buff *skb)
{
	void *data, *data_end;
	struct l4_pkt pk = {};
	struct redirect_key key = {};
	struct redirect_target *to;
	struct pkt_fields p = {};
	__u32 to_addr[4], zero = 0, linear, rule;
	__be16 to_port;
	int parsed, reason, reply, failed;
	struct redirect_stats *st = stats.lookup(&zero);

	if (!st) /* an array's index 0 always exists; the verifier wants the check */
		return TC_ACT_OK;
	st->exits.seen++;

	/* Headers split across pages (GSO, some drivers) are not in the linear
	 * data the parser reads: pull just enough of them. Rare, so one compare
	 * is all the common case pays. The pull invalidates packet pointers, so
	 * it comes before any are taken. */
	linear = skb->data_end - skb->data;
	if (linear < PULL_DEPTH && skb->len > linear)
		bpf_skb_pull_data(skb, skb->len < PULL_DEPTH ? skb->len : PULL_DEPTH);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;

	parsed = parse_l4(data, data_end, &pk, PARSE_L4);
	if (parsed != PARSE_OK) /* untouched, counted by reason */
		return tc_exit(&st->exits, TC_ACT_OK, parse_reason(parsed));
	/* to a service? else, from a backend (a reply)? */
	service_key(&pk, &key);
	to = rules.lookup(&key);
	reason = R_TO_BACKEND;
	if (!to) {
		reply_key(&pk, &key);
		to = replies.lookup(&key);
		reason = R_TO_CLIENT;
	}
	if (!to)
		return tc_exit(&st->exits, TC_ACT_OK, R_UNMATCHED);
	rule = to->rule;
	count_rule(rule_stats.lookup(&rule), reason == R_TO_CLIENT, skb->len);
	reply = reason == R_TO_CLIENT;

	/* Offsets and values now, while the packet pointers are valid (see
	 * struct pkt_fields). Offsets by pointer difference: the verifier allows
	 * it for a privileged loader (a plain number, bound-checked by the helpers). */
	p.l4 = pk.l4;
	p.udp = pk.l4 == IPPROTO_UDP;
	p.v4 = pk.v4;
	p.csum = (void *)pk.l4csum - data;
	p.sport = (void *)pk.sport - data;
	p.sport_val = *pk.sport;
	p.dport_val = *pk.dport;
	p.no_l4_csum = p.udp && !*pk.l4csum;
	if (p.v4) {
		p.l3 = (void *)pk.iph - data;
		p.saddr[0] = pk.iph->saddr;
		p.daddr[0] = pk.iph->daddr;
		p.ttl = pk.iph->ttl;
		p.tos = pk.iph->tos;
		p.tot_len = bpf_ntohs(pk.iph->tot_len);
	} else {
		p.l3 = (void *)pk.ip6h - data;
		__builtin_memcpy(p.saddr, &pk.ip6h->saddr, sizeof(p.saddr));
		__builtin_memcpy(p.daddr, &pk.ip6h->daddr, sizeof(p.daddr));
		p.ttl = pk.ip6h->hop_limit;
		p.flowinfo = *(__be32 *)pk.ip6h & bpf_htonl(0x0FFFFFFF);
		/* the whole packet, which is what the MTU is compared with */
		p.tot_len = bpf_ntohs(pk.ip6h->payload_len) + sizeof(*pk.ip6h);
	}

	/* a copy: user space may replace the entry while we write */
	__builtin_memcpy(to_addr, to->addr, sizeof(to_addr));
	to_port = to->port;

	if (reply) {
		if (p.v4)
			failed = skb_rewrite_addr4(skb, &p, p.l3 + offsetof(struct iphdr, saddr), p.saddr[0], to_addr[0]);
		else
			failed = skb_rewrite_addr6(skb, &p, p.l3 + offsetof(struct ipv6hdr, saddr), p.saddr, to_addr);
		failed = failed || skb_rewrite_port(skb, &p, p.sport, p.sport_val, to_port);
		__builtin_memcpy(p.saddr, to_addr, sizeof(p.saddr));
		p.sport_val = to_port;
	} else {
		if (p.v4)
			failed = skb_rewrite_addr4(skb, &p, p.l3 + offsetof(struct iphdr, daddr), p.daddr[0], to_addr[0]);
		else
			failed = skb_rewrite_addr6(skb, &p, p.l3 + offsetof(struct ipv6hdr, daddr), p.daddr, to_addr);
		failed = failed || skb_rewrite_port(skb, &p, p.sport + sizeof(__be16), p.dport_val, to_port);
		__builtin_memcpy(p.daddr, to_addr, sizeof(p.daddr));
		p.dport_val = to_port;
	}
	/* A helper fails only when it cannot make the skb writable (no memory)
	 * or is handed an offset out of the packet: whatever was written so far
	 * would reach nobody, half rewritten, so the packet stops here. */
	if (failed)
		return tc_exit(&st->exits, TC_ACT_SHOT, reason);
#if REDIRECT_ACTION == REDIRECT_ACTION_FORWARD
	return tc_exit(&st->exits, forward(skb, st, &p), reason);
#else
	return tc_exit(&st->exits, TC_ACT_OK, reason);
#endif
}
