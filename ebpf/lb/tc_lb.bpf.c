/* tc_lb.bpf.c — the layer-4 load balancer of xdp_lb.bpf.c at the TC (clsact)
 * ingress hook: the same services, Maglev tables, sessions, LB ports, NAT and
 * DSR, timeouts and counters (lb_sessions.h, shared), for the interfaces where
 * XDP cannot pay off: veths, bridges, tap and VXLAN devices. There a frame the
 * XDP LB sends with XDP_TX reaches the far end as an XDP frame, which a program
 * there must turn into an skb again (and without one it does not arrive at all);
 * at TC the kernel has built the skb once, and the LB sends that on.
 *
 * Kernel: 5.10+ (bpf_redirect_neigh; 5.12+ for bpf_check_mtu); built and tested
 * on 6.x. Loaded by ebpf/lb/tc_lb.py (class TcLoadBalancer), direct-action, as a
 * classic clsact filter that runs after observers such as the vTAP (ebpf/tc.py).
 *
 * What differs from the XDP program is the frame's access, its rewrites and its
 * exit:
 *   - rewrites through the skb helpers (skb_rewrite.h, as tc_redirect.bpf.c),
 *     which keep every checksum state right: a CHECKSUM_PARTIAL skb from a
 *     sender's TX offload, a CHECKSUM_COMPLETE one, a GSO one (GRO on the way
 *     in). Nothing is finished by hand, as the XDP program must.
 *   - out by bpf_redirect_neigh() on the interface the frame came in on
 *     (one-armed, as XDP_TX), to the next hop the kernel's routes give for the
 *     new destination (NAT: the backend; a reply: the client), or, in DSR, where
 *     the destination is still the VIP, to the backend's address as the next hop.
 *     The kernel resolves the neighbour itself (TC has the skb its queue needs):
 *     no forwarding sysctl, no neighbour entries made beforehand, no no_neigh.
 *   - bpf_redirect bypasses IP forwarding, so nothing fragments or sends ICMP for
 *     it: a frame longer than the egress MTU (bpf_check_mtu; a GSO frame by its
 *     segments) is answered with the ICMP error forwarding would send (too_big()),
 *     counted as too_big.
 *   - what is not the LB's goes on with TC_ACT_UNSPEC, so that filters after it
 *     still run (TC_ACT_OK would end classification there).
 * The session's MACs (backend_mac) stay unset: the neighbour table has them.
 *
 * Verdicts, as every program counts them (verdict.h): redirect (sent on),
 * pass (on to the next filter and the stack, untouched), drop.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include "parsing_helpers.h"
#include "verdict.h"
#include "xdp_lb.h"
#include "csum_helpers.h" /* struct csum_block: a map of xdp_lb_maps.h only the XDP program uses */
#include "xdp_lb_maps.h"
#include "xdp_lb_flow.h"
#include "skb_rewrite.h"

#ifndef LB_MODE
#define LB_MODE LB_MODE_NAT
#endif

#include "lb_sessions.h"

/* bpf_redirect_neigh(ifindex, params, plen, flags), as the kernel has it (BCC
 * 0.26's helpers.h declares it without plen: see tc_redirect.bpf.c). */
static long (*redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) =
	(void *)BPF_FUNC_redirect_neigh;
/* bpf_check_mtu(ctx, ifindex, *mtu_len, len_diff, flags), missing from BCC 0.26's helpers.h;
 * BPF_MTU_CHK_SEGS (an enum in uapi bpf.h): a GSO frame is checked by its segments */
#define MTU_CHK_SEGS 1
static long (*check_mtu)(void *ctx, __u32 ifindex, __u32 *mtu_len, __s32 len_diff, __u64 flags) =
	(void *)BPF_FUNC_check_mtu;

/* Deepest header the parser reads (see tc_redirect.bpf.c). */
#define PULL_DEPTH 256
#define LB_PASS TC_ACT_UNSPEC  /* not ours: on to the next filter, then the stack */

/* At TC the kernel finds the next hop's MAC when the frame leaves. */
static __always_inline int lb_hook_new_session(void *ctx, struct lb_seen *p, const struct lb_backend *be,
					       struct lb_session *ns)
{
	return 0;
}

/* An address and the checksums over it, from `from` to `to` (src: the source field). */
static __always_inline int rewrite_addr(struct __sk_buff *skb, struct pkt_fields *f, int src,
					const struct lb_addr *from, const struct lb_addr *to)
{
	if (f->v4)
		return skb_rewrite_addr4(skb, f, f->l3 + (src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr)),
					 from->a[0], to->a[0]);
	return skb_rewrite_addr6(skb, f, f->l3 + (src ? offsetof(struct ipv6hdr, saddr) : offsetof(struct ipv6hdr, daddr)),
				 from->a, to->a);
}

/* Both ports, from the packet's to (sport, dport). */
static __always_inline int rewrite_ports(struct __sk_buff *skb, struct pkt_fields *f, struct lb_seen *p, __be16 sport,
					 __be16 dport)
{
	return skb_rewrite_port(skb, f, f->sport, p->sport, sport) ||
	       skb_rewrite_port(skb, f, f->sport + sizeof(__be16), p->dport, dport);
}

/* Out of the interface the frame came in on, to `nh` as the next hop (DSR: the
 * backend), or, nh NULL, to the next hop the routes give for its destination. */
static __always_inline int send_on(struct __sk_buff *skb, struct lb_addr *nh, int v4)
{
	struct bpf_redir_neigh to = {};

	if (!nh)
		return redirect_neigh(skb->ingress_ifindex, 0, 0, 0);
	if (v4) {
		to.nh_family = AF_INET;
		to.ipv4_nh = nh->a[0];
	} else {
		to.nh_family = AF_INET6;
		__builtin_memcpy(to.ipv6_nh, nh->a, 16);
	}
	return redirect_neigh(skb->ingress_ifindex, &to, sizeof(to), 0);
}

#define ICMP_QUOTE 8  /* bytes of the original's TCP/UDP header an ICMP error quotes (RFC 792) */
#define ICMP_FRAG_NEEDED_TYPE 3
#define ICMP_FRAG_NEEDED_CODE 4
#define ICMPV6_PKT_TOOBIG 2

/* A frame too big for the interface it would leave by, handed back to its sender
 * as the ICMP error the kernel's forwarding would send: IPv4 "fragmentation
 * needed" (DF set; without it the frame is dropped: nothing here fragments) or
 * IPv6 "packet too big", from the address the frame was sent to (the VIP, or the
 * LB's own address for a backend's reply), to its source, quoting its IP header
 * and the 8 bytes after (a service's frame has no options or extension headers:
 * those are dropped before). Built in place: the frame is cut to the error's
 * length (bpf_skb_change_tail(), made for such replies, which also ends a GSO
 * frame's offload: one whose segments do not fit gets its error too, as
 * forwarding would send it), its MACs swapped, and sent back out the way it came. Handing the frame
 * to the stack instead would not do: the rewritten one's error would go to the
 * LB's own address (NAT's source), and the original one is to a local VIP (it
 * would be delivered here, and answered with a RST). Returns the TC action. */
static __always_inline int too_big(struct __sk_buff *skb, struct pkt_fields *f, __u32 mtu)
{
	__u32 zero = 0, l3 = ETH_HLEN;
	struct csum_block *scratch = csum_scratch.lookup(&zero);
	unsigned char mac[2 * ETH_ALEN], swapped[2 * ETH_ALEN];
	__u8 *d;
	__u64 sum;

	if (!scratch || f->l3 != ETH_HLEN || bpf_skb_load_bytes(skb, 0, mac, sizeof(mac)) < 0)
		return TC_ACT_SHOT;
	__builtin_memcpy(swapped, mac + ETH_ALEN, ETH_ALEN);
	__builtin_memcpy(swapped + ETH_ALEN, mac, ETH_ALEN);
	d = scratch->b;
	if (f->v4) {
		/* d[0..20) the error's IP header, d[20..28) ICMP, d[28..56) the quote */
		struct iphdr *ip = (void *)d;
		struct iphdr *orig = (void *)(d + 28);

		if (bpf_skb_load_bytes(skb, l3, d + 28, sizeof(struct iphdr) + ICMP_QUOTE) < 0 ||
		    !(orig->frag_off & bpf_htons(0x4000)))  /* DF clear: it should be fragmented */
			return TC_ACT_SHOT;
		__builtin_memset(d, 0, 28);
		ip->version = 4;
		ip->ihl = 5;
		ip->tos = 0xc0;  /* internetwork control, as the kernel's ICMP errors */
		ip->tot_len = bpf_htons(56);
		ip->ttl = 64;
		ip->protocol = IPPROTO_ICMP;
		ip->saddr = orig->daddr;
		ip->daddr = orig->saddr;
		ip->check = csum_from_sum((__u32)bpf_csum_diff(0, 0, (void *)d, 20, 0));
		d[20] = ICMP_FRAG_NEEDED_TYPE;
		d[21] = ICMP_FRAG_NEEDED_CODE;
		*(__be16 *)(d + 26) = bpf_htons(mtu);  /* the next hop's MTU */
		*(__sum16 *)(d + 22) = csum_from_sum((__u32)bpf_csum_diff(0, 0, (void *)(d + 20), 36, 0));
		if (bpf_skb_change_tail(skb, l3 + 56, 0) < 0 ||
		    bpf_skb_store_bytes(skb, l3, d, 56, BPF_F_RECOMPUTE_CSUM) < 0)
			return TC_ACT_SHOT;
	} else {
		/* d[0..40) the error's IPv6 header, d[40..48) ICMPv6, d[48..96) the quote,
		 * d[128..168) the pseudo-header its checksum covers */
		struct ipv6hdr *ip6 = (void *)d;
		struct ipv6hdr *orig = (void *)(d + 48);

		if (bpf_skb_load_bytes(skb, l3, d + 48, sizeof(struct ipv6hdr) + ICMP_QUOTE) < 0)
			return TC_ACT_SHOT;
		__builtin_memset(d, 0, 48);
		ip6->version = 6;
		ip6->payload_len = bpf_htons(56);
		ip6->nexthdr = IPPROTO_ICMPV6;
		ip6->hop_limit = 64;
		__builtin_memcpy(&ip6->saddr, &orig->daddr, 16);
		__builtin_memcpy(&ip6->daddr, &orig->saddr, 16);
		d[40] = ICMPV6_PKT_TOOBIG;
		*(__be32 *)(d + 44) = bpf_htonl(mtu);
		__builtin_memcpy(d + 128, &ip6->saddr, 16);
		__builtin_memcpy(d + 144, &ip6->daddr, 16);
		*(__be32 *)(d + 160) = bpf_htonl(56);
		*(__be32 *)(d + 164) = bpf_htonl(IPPROTO_ICMPV6);
		sum = (__u32)bpf_csum_diff(0, 0, (void *)(d + 128), 40, 0);
		sum = (__u32)bpf_csum_diff(0, 0, (void *)(d + 40), 56, (__u32)sum);
		*(__sum16 *)(d + 42) = csum_from_sum(sum);
		if (bpf_skb_change_tail(skb, l3 + 96, 0) < 0 ||
		    bpf_skb_store_bytes(skb, l3, d, 96, BPF_F_RECOMPUTE_CSUM) < 0)
			return TC_ACT_SHOT;
	}
	/* flags 0: a CHECKSUM_COMPLETE sum starts after the Ethernet header */
	if (bpf_skb_store_bytes(skb, 0, swapped, sizeof(swapped), 0) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

/* client -> VIP. Returns the TC action; *reason says why. */
static __always_inline int to_backend(struct __sk_buff *skb, struct pkt_fields *f, struct lb_seen *p,
				      struct lb_stats *st, struct lb_conf *cf, __u32 service, int *reason)
{
	struct lb_flow_key fk = {};
	struct lb_backend *be = 0;
	struct lb_session *s;
	struct lb_addr to;
	__be16 lb_port, bport;
	int is_new, action;

	s = lb_client_packet(skb, p, &fk, st, cf, service, &be, &is_new, reason);
	if (!s || !be)
		return TC_ACT_SHOT;
	to = be->addr;  /* copies: user space may rewrite the backend meanwhile */
	bport = be->port;
	lb_port = s->lb_port;
	if (LB_MODE == LB_MODE_NAT &&
	    (rewrite_addr(skb, f, 1, &p->src, p->v4 ? &cf->self4 : &cf->self6) || rewrite_addr(skb, f, 0, &p->dst, &to) ||
	     rewrite_ports(skb, f, p, lb_port, bport))) {
		*reason = R_MALFORMED;  /* a helper could not write the skb: half rewritten, it goes nowhere */
		return TC_ACT_SHOT;
	}
	*reason = R_TO_BACKEND;
	action = send_on(skb, LB_MODE == LB_MODE_NAT ? 0 : &to, p->v4);
	if (action == TC_ACT_REDIRECT)  /* counted, and a close taken, only for what went on */
		lb_client_done(p, &fk, s, be, is_new, st);
	return action;
}

/* backend -> LB (NAT): a reply to a session. Returns the TC action; *reason says why. */
static __always_inline int to_client(struct __sk_buff *skb, struct pkt_fields *f, struct lb_seen *p,
				     struct lb_stats *st, int *reason)
{
	struct lb_flow_key fk;
	struct lb_service_info *svc = 0;
	struct lb_session *s;
	struct lb_addr vip;
	__be16 vport;
	int action;

	s = lb_backend_packet(p, &fk, &svc, reason);
	if (!s || !svc)  /* not a session's: the LB host's own traffic (health checks); or one that vanished */
		return *reason == R_UNMATCHED ? LB_PASS : TC_ACT_SHOT;
	vip = svc->vip;
	vport = svc->port;
	if (rewrite_addr(skb, f, 1, &p->src, &vip) || rewrite_addr(skb, f, 0, &p->dst, &fk.client) ||
	    rewrite_ports(skb, f, p, vport, fk.cport)) {
		*reason = R_MALFORMED;
		return TC_ACT_SHOT;
	}
	*reason = R_TO_CLIENT;
	action = send_on(skb, 0, p->v4);
	if (action == TC_ACT_REDIRECT)
		lb_reply_done(p, &fk, s, st);
	return action;
}

int tc_lb(struct __sk_buff *skb)
{
	void *data, *data_end;
	struct l4_pkt h = {};
	struct lb_seen p = {};
	struct pkt_fields f = {};
	struct lb_service *svc;
	struct lb_conf *cf;
	__u32 zero = 0, linear, sid, mtu = 0;
	int reason, action, drop, parsed;
	struct lb_stats *st = stats.lookup(&zero);

	if (!st)
		return LB_PASS;
	st->exits.seen++;
	cf = conf.lookup(&zero);
	if (!cf) /* index 0 of an array always exists: not reached */
		return tc_exit(&st->exits, LB_PASS, R_UNMATCHED);

	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	parsed = parse_l4(data, data_end, &h, PARSE_L4);
	/* Headers split across pages (some drivers) are not in the linear data the
	 * parser reads: then, and only then, pull just enough of them and parse
	 * again. A sender's TCP segment has its payload in pages but its headers in
	 * the linear data: pulling it every time (as a pull by length would) copies
	 * payload into a new head for nothing. The pull invalidates packet pointers. */
	linear = skb->data_end - skb->data;
	if ((parsed == PARSE_MALFORMED || parsed == PARSE_SHORT_L4) && linear < PULL_DEPTH && skb->len > linear) {
		bpf_skb_pull_data(skb, skb->len < PULL_DEPTH ? skb->len : PULL_DEPTH);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		parsed = parse_l4(data, data_end, &h, PARSE_L4);
	}

	reason = lb_what_it_is(parsed, &h, &drop);
	if (reason >= 0)
		return tc_exit(&st->exits, drop ? TC_ACT_SHOT : LB_PASS, reason);
	lb_seen_from(&h, skb->len, &p);

	svc = lb_service_of(&p);
	if (svc && p.options)  /* a service's, with options or extension headers */
		return tc_exit(&st->exits, TC_ACT_SHOT, R_IP_OPTIONS);
	if (!svc && !lb_to_lb_port(&p, cf))  /* for no service of ours, nor a reply to one */
		return tc_exit(&st->exits, LB_PASS, R_UNMATCHED);

	/* Offsets while the packet pointers are valid (struct pkt_fields) */
	f.l4 = h.l4;
	f.udp = h.l4 == IPPROTO_UDP;
	f.v4 = h.v4;
	f.csum = (void *)h.l4csum - data;
	f.sport = (void *)h.sport - data;
	f.no_l4_csum = f.udp && !*h.l4csum;
	f.l3 = h.v4 ? (void *)h.iph - data : (void *)h.ip6h - data;
	sid = svc ? svc->id : 0;

	/* Too big for the interface it would leave by (the one it came in on, whose MTU a
	 * driver need not have held it to); a GSO frame by its segments */
	if (check_mtu(skb, 0, &mtu, 0, MTU_CHK_SEGS) != 0)
		return tc_exit(&st->exits, too_big(skb, &f, mtu), R_TOO_BIG);
	if (svc)
		action = to_backend(skb, &f, &p, st, cf, sid, &reason);
	else
		action = to_client(skb, &f, &p, st, &reason);
	return tc_exit(&st->exits, action, reason);
}
