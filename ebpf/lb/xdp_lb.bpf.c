/* xdp_lb.bpf.c — a layer-4 load balancer at the XDP hook: services (VIP, port,
 * protocol) spread over backends by a Maglev table, with connection tracking.
 *
 * Kernel: 5.x+ (LRU hash, bpf_fib_lookup, bounded loops); built on 6.x.
 * Loaded by ebpf/lb/xdp_lb.py (class XdpLoadBalancer), which passes LB_MODE and
 * fills every map: services, Maglev rings, backends, the LB's own addresses.
 *
 * NAT mode (the articles' design), one-armed: the LB sits on one interface.
 *   client:cport -> VIP:vport      becomes   LB:lb_port -> backend:bport
 *   backend:bport -> LB:lb_port    becomes   VIP:vport -> client:cport
 * both sent back out of the receiving interface with XDP_TX, with new MACs: the
 * backend's from the kernel's neighbour table (bpf_fib_lookup, when the session
 * begins), the client's from its own frames. Checksums change incrementally
 * (rewrite_helpers.h); one that the sender's TX checksum offload left partial
 * (every veth's default) is finished over the segment before XDP_TX sends it,
 * in DSR too, where nothing at L4 changes.
 * DSR mode: only the destination MAC changes (the backend holds the VIP on its
 * loopback and answers the client itself); the forward session is kept, so an
 * established flow stays on its backend when the ring changes.
 *
 * Sessions. A SYN picks a backend from the service's ring by a hash of the
 * client's address and port, and (NAT) an LB port no live session towards that
 * backend uses: tried at LB_PORT_PROBES places, claimed atomically (BPF_NOEXIST
 * in the reverse table), the SYN dropped and counted when none is free: never
 * two sessions on one (backend, LB port). A SYN's session lives in the
 * half-open tables; the client's first packet after the handshake moves it to
 * the established ones, so a SYN flood can evict only half-open sessions. RST
 * ends a session; so does the ACK of the second FIN, whichever side sent its
 * FIN first (closed()); an idle session expires (per state, conf.timeout_ns)
 * when next seen, and user space sweeps the rest. UDP: a session per client flow, ended by its timeout.
 *
 * What is not for a service passes to the stack untouched (ARP, ICMP, ICMPv6,
 * other protocols, addresses and ports): see what_it_is(). TCP/UDP fragments
 * to a VIP, and a service's traffic with IPv4 options or IPv6 extension
 * headers, are dropped and counted (Katran does the same: the ports of a
 * fragment are not in it).
 *
 * Its parts: xdp_lb.h (constants and structs Python reads too), xdp_lb_maps.h
 * (the maps), xdp_lb_flow.h (hashing and comparing flows), lb_sessions.h (what a
 * frame is to the LB, the sessions and the counters, as both hooks keep them;
 * tc_lb.bpf.c is the LB at TC), and this file: the frame's access, rewrites and
 * exit at XDP. It parses with the shared parse_l4(); every return goes through
 * xdp_exit() (verdict.h), which counts the verdict and the reason.
 */
#include <uapi/linux/bpf.h>
#include "parsing_helpers.h"
#include "rewrite_helpers.h"
#include "verdict.h"
#include "xdp_lb.h"
#include "xdp_lb_maps.h"
#include "xdp_lb_flow.h"

#ifndef LB_MODE
#define LB_MODE LB_MODE_NAT
#endif

#include "lb_sessions.h"

/* A parsed frame and the checksum its rewrites keep valid. */
struct pkt {
	struct l4_pkt h;   /* parse_l4()'s: headers, ports, TCP flags, options */
	struct l4csum c;   /* its TCP/UDP checksum, as rewrite_helpers.h keeps it */
	struct lb_seen s;  /* what lb_sessions.h reads */
};

static __always_inline void rewrite_addr(struct pkt *p, int src, const struct lb_addr *to)
{
	struct l4_pkt *h = &p->h;

	if (h->v4)
		rewrite_ipv4_addr(h->iph, src ? &h->iph->saddr : &h->iph->daddr, to->a[0], &p->c);
	else
		rewrite_ipv6_addr(src ? &h->ip6h->saddr : &h->ip6h->daddr, (const struct in6_addr *)to->a, &p->c);
}

static __always_inline void rewrite_ports(struct pkt *p, __be16 sport, __be16 dport)
{
	rewrite_port(p->h.sport, sport, &p->c);
	rewrite_port(p->h.dport, dport, &p->c);
}

/* A new session's backend MAC, by the kernel's route and neighbour tables
 * (XDP_TX sends the frame with the MACs it has): 0, or -1 when not known yet. */
static __always_inline int lb_hook_new_session(void *ctx, struct lb_seen *p, const struct lb_backend *be,
					       struct lb_session *ns)
{
	struct xdp_md *x = ctx;
	struct bpf_fib_lookup fib = {};

	fib.ifindex = x->ingress_ifindex;
	fib.l4_protocol = p->l4;
	fib.tot_len = p->tot_len;
	if (p->v4) {
		fib.family = AF_INET;
		fib.ipv4_dst = be->addr.a[0];
	} else {
		fib.family = AF_INET6;
		__builtin_memcpy(fib.ipv6_dst, be->addr.a, 16);
	}
	/* the output interface must be the one the frame came in on (one-armed) */
	if (bpf_fib_lookup(ctx, &fib, sizeof(fib), BPF_FIB_LOOKUP_OUTPUT) != BPF_FIB_LKUP_RET_SUCCESS ||
	    fib.ifindex != x->ingress_ifindex)
		return -1;
	__builtin_memcpy(ns->backend_mac, fib.dmac, ETH_ALEN);
	return 0;
}

/* client -> VIP. Returns the XDP action; *reason says why. */
static __always_inline int to_backend(struct xdp_md *ctx, struct pkt *p, struct lb_stats *st, struct lb_conf *cf,
				      __u32 service, int *reason)
{
	struct lb_flow_key fk = {};
	struct lb_backend *be = 0;
	struct lb_session *s;
	int is_new;

	s = lb_client_packet(ctx, &p->s, &fk, st, cf, service, &be, &is_new, reason);
	if (!s || !be)
		return XDP_DROP;
	if (LB_MODE == LB_MODE_NAT) {
		rewrite_addr(p, 1, p->s.v4 ? &cf->self4 : &cf->self6);
		rewrite_addr(p, 0, &be->addr);
		rewrite_ports(p, s->lb_port, be->port);
	}
	__builtin_memcpy(p->h.eth->h_source, p->h.eth->h_dest, ETH_ALEN);  /* ours: the frame was sent to us */
	__builtin_memcpy(p->h.eth->h_dest, s->backend_mac, ETH_ALEN);
	lb_client_done(&p->s, &fk, s, be, is_new, st);
	*reason = R_TO_BACKEND;
	return XDP_TX;
}

/* backend -> LB (NAT): a reply to a session. Returns the XDP action; *reason says why. */
static __always_inline int to_client(struct xdp_md *ctx, struct pkt *p, struct lb_stats *st, int *reason)
{
	struct lb_flow_key fk;
	struct lb_service_info *svc = 0;
	struct lb_session *s;

	s = lb_backend_packet(&p->s, &fk, &svc, reason);
	if (!s || !svc)  /* not a session's: the LB's own traffic (health checks); or one that vanished */
		return *reason == R_UNMATCHED ? XDP_PASS : XDP_DROP;
	rewrite_addr(p, 1, &svc->vip);
	rewrite_addr(p, 0, &fk.client);
	rewrite_ports(p, svc->port, fk.cport);
	__builtin_memcpy(p->h.eth->h_source, p->h.eth->h_dest, ETH_ALEN);
	__builtin_memcpy(p->h.eth->h_dest, s->client_mac, ETH_ALEN);
	lb_reply_done(&p->s, &fk, s, st);
	*reason = R_TO_CLIENT;
	return XDP_TX;
}

int xdp_lb(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct pkt p = {};
	struct lb_service *svc;
	struct lb_conf *cf;
	__u32 zero = 0, *generic;
	int reason, action, drop;
	struct lb_stats *st = stats.lookup(&zero);

	if (!st)
		return XDP_PASS;
	st->exits.seen++;
	cf = conf.lookup(&zero);
	if (!cf) /* index 0 of an array always exists: not reached */
		return xdp_exit(&st->exits, XDP_PASS, R_UNMATCHED);
	reason = lb_what_it_is(parse_l4(data, data_end, &p.h, PARSE_L4), &p.h, &drop);
	if (reason >= 0)
		return xdp_exit(&st->exits, drop ? XDP_DROP : XDP_PASS, reason);
	lb_seen_from(&p.h, data_end - data, &p.s);

	svc = lb_service_of(&p.s);
	if (svc && p.s.options)  /* a service's, with options or extension headers */
		return xdp_exit(&st->exits, XDP_DROP, R_IP_OPTIONS);
	if (p.h.v4)
		l4csum_init(&p.c, p.h.l4hdr, p.h.l4csum, p.h.l4 == IPPROTO_UDP, p.h.l4len,
			    ipv4_pseudo_sum(p.h.iph->saddr, p.h.iph->daddr, p.h.l4, p.h.l4len));
	else
		l4csum_init(&p.c, p.h.l4hdr, p.h.l4csum, p.h.l4 == IPPROTO_UDP, p.h.l4len,
			    ipv6_pseudo_sum((__be32 *)&p.h.ip6h->saddr, (__be32 *)&p.h.ip6h->daddr, p.h.l4, p.h.l4len));
	if (svc)
		action = to_backend(ctx, &p, st, cf, svc->id, &reason);
	else if (lb_to_lb_port(&p.s, cf))
		action = to_client(ctx, &p, st, &reason);
	else  /* for no service of ours, nor a reply to one */
		return xdp_exit(&st->exits, XDP_PASS, R_UNMATCHED);
	if (action == XDP_TX)
		st->csum_partial += p.c.partial;
	generic = skb_mode.lookup(&zero);
	if (l4csum_exit(ctx, &p.c, action, generic && *generic, csum_scratch.lookup(&zero)) < 0)
		/* the segment the IP header claims is not all in the frame */
		return xdp_exit(&st->exits, XDP_DROP, R_MALFORMED);
	return xdp_exit(&st->exits, action, reason);
}
