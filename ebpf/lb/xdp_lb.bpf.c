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
 * (the maps), xdp_lb_flow.h (hashing and comparing flows), lb_sessions.h (the
 * sessions, as every hook of the LB keeps them: it calls the map wrappers this
 * file defines, since BCC turns a map call into a helper call only in the file it
 * compiles), and this file: the frame's access, rewrites and exit at XDP. It
 * parses with the shared parse_l4(); every return goes through xdp_exit()
 * (verdict.h), which counts the verdict and the reason.
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

/* The maps, as lb_sessions.h reaches them (its comment says why). */
static __always_inline struct lb_session *lb_session_get(struct lb_flow_key *k, int half)
{
	return half ? half_open.lookup(k) : sessions.lookup(k);
}
static __always_inline void lb_session_put(struct lb_flow_key *k, struct lb_session *s, int half)
{
	half ? half_open.update(k, s) : sessions.update(k, s);
}
static __always_inline void lb_session_del(struct lb_flow_key *k, int half)
{
	half ? half_open.delete(k) : sessions.delete(k);
}
static __always_inline struct lb_flow_key *lb_reverse_get(struct lb_reverse_key *k, int half)
{
	return half ? reverse_half.lookup(k) : reverse.lookup(k);
}
static __always_inline int lb_reverse_claim(struct lb_reverse_key *k, struct lb_flow_key *fk, int half)
{
	return half ? reverse_half.insert(k, fk) : reverse.insert(k, fk);
}
static __always_inline void lb_reverse_put(struct lb_reverse_key *k, struct lb_flow_key *fk)
{
	reverse.update(k, fk);
}
static __always_inline void lb_reverse_del(struct lb_reverse_key *k, int half)
{
	half ? reverse_half.delete(k) : reverse.delete(k);
}
static __always_inline __u32 *lb_ring_get(__u32 slot)
{
	return rings.lookup(&slot);
}
static __always_inline struct lb_backend *lb_backend_get(__u32 idx)
{
	return backends.lookup(&idx);
}
static __always_inline struct lb_service_info *lb_service_info_get(__u32 sid)
{
	return service_info.lookup(&sid);
}

#include "lb_sessions.h"

/* A parsed frame and the checksum its rewrites keep valid. */
struct pkt {
	struct l4_pkt h;   /* parse_l4()'s: headers, ports, TCP flags, options */
	struct l4csum c;   /* its TCP/UDP checksum, as rewrite_helpers.h keeps it */
	__u32 len;
};

/* What a frame is to the load balancer, from parse_l4()'s result: -1 when it
 * is a TCP or UDP packet to look at (h->options says whether it came with
 * options or extension headers: the caller drops those when a service owns
 * them), or the reason it is passed to the stack untouched (*verdict
 * XDP_PASS) or dropped (XDP_DROP).
 *
 * Traffic to a VIP that no service owns at L4 reaches the stack untouched:
 * ICMP, ICMPv6 (neighbour discovery, echo, packet-too-big: the LB host's own
 * IPv6 stops working without them), any protocol but TCP and UDP, whatever its
 * fragments or extension headers. Dropped is only what a service may own but
 * this program would forward wrongly: TCP/UDP fragments to a VIP (fragment: a
 * fragment after the first has no ports to find the session by), a TCP/UDP
 * header cut short to a VIP (malformed), and TCP/UDP to a service port with
 * IPv4 options or IPv6 extension headers (ip_options, in the caller). The
 * reason is what was found, the same as every program says it (a fragment to
 * another address is a fragment too, passed); the verdict is what the LB does
 * about it. */
static __always_inline int what_it_is(int parsed, struct l4_pkt *h, struct lb_addr *dst, int *verdict)
{
	*verdict = XDP_PASS;
	if (parsed == PARSE_NOT_IP)
		return R_NOT_IP;
	if (parsed == PARSE_MALFORMED)
		return R_MALFORMED;
	if (h->v4)
		dst->a[0] = h->iph->daddr;
	else
		__builtin_memcpy(dst->a, &h->ip6h->daddr, 16);
	if (parsed == PARSE_OK)
		return -1;
	if (parsed == PARSE_OTHER)  /* ICMP, ICMPv6, other protocols: the stack's */
		return R_UNMATCHED;
	/* a fragment, or a TCP/UDP header cut short: to a VIP it may be a
	 * service's, and cannot be forwarded right; to anything else it is the
	 * stack's business */
	if (vip_addrs.lookup(dst) && (parsed == PARSE_SHORT_L4 || h->l4 == IPPROTO_TCP || h->l4 == IPPROTO_UDP))
		*verdict = XDP_DROP;
	return parsed == PARSE_FRAGMENT ? R_FRAGMENT : R_MALFORMED;
}

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

/* The backend's MAC, by the kernel's route and neighbour tables. 0 or -1. */
static __always_inline int backend_mac(struct xdp_md *ctx, struct pkt *p, const struct lb_backend *be,
				       unsigned char *mac)
{
	struct bpf_fib_lookup fib = {};

	fib.ifindex = ctx->ingress_ifindex;
	fib.l4_protocol = p->h.l4;
	if (p->h.v4) {
		fib.family = AF_INET;
		fib.ipv4_dst = be->addr.a[0];
		fib.tot_len = bpf_ntohs(p->h.iph->tot_len);
	} else {
		fib.family = AF_INET6;
		__builtin_memcpy(fib.ipv6_dst, be->addr.a, 16);
		fib.tot_len = bpf_ntohs(p->h.ip6h->payload_len) + sizeof(struct ipv6hdr);
	}
	/* the output interface must be the one the frame came in on (one-armed) */
	if (bpf_fib_lookup(ctx, &fib, sizeof(fib), BPF_FIB_LOOKUP_OUTPUT) != BPF_FIB_LKUP_RET_SUCCESS ||
	    fib.ifindex != ctx->ingress_ifindex)
		return -1;
	__builtin_memcpy(mac, fib.dmac, ETH_ALEN);
	return 0;
}

static __always_inline void count(__u32 backend, __u32 len, int reply, int new_session)
{
	add_traffic(backend_stats.lookup(&backend), len, reply, new_session);
}

/* client -> VIP. Returns the XDP action; *reason says why. */
static __always_inline int to_backend(struct xdp_md *ctx, struct pkt *p, struct lb_stats *st, struct lb_conf *cf,
				      __u32 service, int *reason)
{
	struct lb_flow_key fk = {};
	struct lb_session *s, ns = {};
	struct lb_backend *be;
	__u64 now = bpf_ktime_get_ns();
	__u8 flags = p->h.tcpflags ? *p->h.tcpflags : 0;
	int syn = p->h.l4 == IPPROTO_TCP && (flags & (F_SYN | F_ACK)) == F_SYN;
	int half = 0, is_new = 0;
	__u32 idx;

	*reason = R_NO_SESSION;  /* a session that vanishes under us (evicted) */
	if (p->h.v4)
		copy_addr(&fk.client, 1, &p->h.iph->saddr);
	else
		copy_addr(&fk.client, 0, &p->h.ip6h->saddr);
	fk.cport = *p->h.sport;
	fk.service = service;
	fk.proto = p->h.l4;

	s = lb_find(&fk, p->h.l4, now, cf, st, &half);
	if (!s) {
		__u32 h = flow_hash(&fk);

		if (p->h.l4 == IPPROTO_TCP && !syn)
			return XDP_DROP;  /* no_session */
		be = lb_pick(service, h, &idx);
		if (!be) {
			*reason = R_NO_BACKEND;
			return XDP_DROP;
		}
		ns.backend = idx;
		ns.state = p->h.l4 == IPPROTO_TCP ? LB_ST_SYN : LB_ST_UDP;
		if (backend_mac(ctx, p, be, ns.backend_mac) < 0) {
			*reason = R_NO_NEIGH;
			return XDP_DROP;
		}
		__builtin_memcpy(ns.client_mac, p->h.eth->h_source, ETH_ALEN);
		if (LB_MODE == LB_MODE_NAT && lb_claim_port(&ns, &fk, be, h, cf, p->h.l4) < 0) {
			*reason = R_NO_PORT;
			return XDP_DROP;
		}
		s = lb_begin(&fk, &ns, now, st, &half);
		is_new = 1;
		if (!s)
			return XDP_DROP;  /* no_session: evicted as soon as made */
	}
	idx = s->backend;
	be = lb_backend_get(idx);
	if (!be || !be->live) {
		*reason = R_NO_BACKEND;
		return XDP_DROP;
	}
	s->last_seen = now;

	/* the handshake's last ACK: the session is established */
	if (half && !syn && (flags & F_ACK)) {
		s = lb_establish(&fk, s, be, p->h.l4, st, reason);
		if (!s)
			return XDP_DROP;  /* stale, or no_session: evicted as soon as made */
	}

	if (LB_MODE == LB_MODE_NAT) {
		if (p->h.v4)
			rewrite_addr(p, 1, &cf->self4);
		else
			rewrite_addr(p, 1, &cf->self6);
		rewrite_addr(p, 0, &be->addr);
		rewrite_ports(p, s->lb_port, be->port);
		__builtin_memcpy(p->h.eth->h_source, p->h.eth->h_dest, ETH_ALEN);  /* ours: the frame was sent to us */
	} else {
		__builtin_memcpy(p->h.eth->h_source, p->h.eth->h_dest, ETH_ALEN);
	}
	__builtin_memcpy(p->h.eth->h_dest, s->backend_mac, ETH_ALEN);
	count(idx, p->len, 0, is_new);

	if (flags & F_RST) {
		lb_end_session(&fk, be, s->lb_port, p->h.l4);
		st->closed_rst++;
	} else if (p->h.l4 == IPPROTO_TCP && lb_closed(&p->h, s, flags, 0)) {
		lb_end_session(&fk, be, s->lb_port, p->h.l4);
		st->closed_fin++;
	}
	*reason = R_TO_BACKEND;
	return XDP_TX;
}

/* backend -> LB (NAT): a reply to a session. Returns the XDP action; *reason says why. */
static __always_inline int to_client(struct xdp_md *ctx, struct pkt *p, struct lb_stats *st, struct lb_conf *cf,
				     int *reason)
{
	struct lb_reverse_key rk = {};
	struct lb_flow_key fk;
	struct lb_session *s;
	struct lb_service_info *svc;
	__u8 flags = p->h.tcpflags ? *p->h.tcpflags : 0;
	__u32 sid, idx;

	if (p->h.v4)
		copy_addr(&rk.backend, 1, &p->h.iph->saddr);
	else
		copy_addr(&rk.backend, 0, &p->h.ip6h->saddr);
	rk.bport = *p->h.sport;
	rk.lb_port = *p->h.dport;
	rk.proto = p->h.l4;
	rk.family = p->h.v4 ? 4 : 6;
	s = lb_reply(&rk, &fk, reason);
	if (!s)  /* not a session's: the LB's own traffic (health checks); or one that vanished */
		return *reason == R_UNMATCHED ? XDP_PASS : XDP_DROP;
	sid = fk.service;
	svc = lb_service_info_get(sid);
	if (!svc)
		return XDP_DROP;  /* no_session: its service is gone */
	s->last_seen = bpf_ktime_get_ns();
	rewrite_addr(p, 1, &svc->vip);
	rewrite_addr(p, 0, &fk.client);
	rewrite_ports(p, svc->port, fk.cport);
	__builtin_memcpy(p->h.eth->h_source, p->h.eth->h_dest, ETH_ALEN);
	__builtin_memcpy(p->h.eth->h_dest, s->client_mac, ETH_ALEN);
	idx = s->backend;
	count(idx, p->len, 1, 0);
	if (flags & F_RST) {
		lb_end_session(&fk, lb_backend_get(idx), s->lb_port, p->h.l4);
		st->closed_rst++;
	} else if (p->h.l4 == IPPROTO_TCP && lb_closed(&p->h, s, flags, 1)) {
		lb_end_session(&fk, lb_backend_get(idx), s->lb_port, p->h.l4);
		st->closed_fin++;
	}
	*reason = R_TO_CLIENT;
	return XDP_TX;
}

int xdp_lb(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct pkt p = {};
	struct lb_addr dst = {};
	struct lb_service_key sk = {};
	struct lb_service *svc;
	struct lb_conf *cf;
	__u32 zero = 0, *generic;
	int reason, action;
	struct lb_stats *st = stats.lookup(&zero);

	if (!st)
		return XDP_PASS;
	st->exits.seen++;
	cf = conf.lookup(&zero);
	if (!cf) /* index 0 of an array always exists: not reached */
		return xdp_exit(&st->exits, XDP_PASS, R_UNMATCHED);
	reason = what_it_is(parse_l4(data, data_end, &p.h, PARSE_L4), &p.h, &dst, &action);
	if (reason >= 0)
		return xdp_exit(&st->exits, action, reason);
	p.len = data_end - data;

	sk.vip = dst;
	sk.port = *p.h.dport;
	sk.proto = p.h.l4;
	sk.family = p.h.v4 ? 4 : 6;
	svc = services.lookup(&sk);
	if (svc && p.h.options)  /* a service's, with options or extension headers */
		return xdp_exit(&st->exits, XDP_DROP, R_IP_OPTIONS);
	if (p.h.v4)
		l4csum_init(&p.c, p.h.l4hdr, p.h.l4csum, p.h.l4 == IPPROTO_UDP, p.h.l4len,
			    ipv4_pseudo_sum(p.h.iph->saddr, p.h.iph->daddr, p.h.l4, p.h.l4len));
	else
		l4csum_init(&p.c, p.h.l4hdr, p.h.l4csum, p.h.l4 == IPPROTO_UDP, p.h.l4len,
			    ipv6_pseudo_sum((__be32 *)&p.h.ip6h->saddr, (__be32 *)&p.h.ip6h->daddr, p.h.l4, p.h.l4len));
	action = -1;
	if (svc) {
		action = to_backend(ctx, &p, st, cf, svc->id, &reason);
	} else if (LB_MODE == LB_MODE_NAT && !p.h.options) {
		const struct lb_addr *self = p.h.v4 ? &cf->self4 : &cf->self6;
		__u16 port = bpf_ntohs(*p.h.dport);

		if (same_addr(&dst, self) && port >= cf->port_min &&
		    port - cf->port_min < cf->port_count)
			action = to_client(ctx, &p, st, cf, &reason);
	}
	if (action < 0)  /* for no service of ours, nor a reply to one */
		return xdp_exit(&st->exits, XDP_PASS, R_UNMATCHED);
	if (action == XDP_TX)
		st->csum_partial += p.c.partial;
	generic = skb_mode.lookup(&zero);
	if (l4csum_exit(ctx, &p.c, action, generic && *generic, csum_scratch.lookup(&zero)) < 0)
		/* the segment the IP header claims is not all in the frame */
		return xdp_exit(&st->exits, XDP_DROP, R_MALFORMED);
	return xdp_exit(&st->exits, action, reason);
}
