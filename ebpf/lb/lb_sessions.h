/* lb_sessions.h — the load balancer's sessions, once for both hooks that run it
 * (xdp_lb.bpf.c at XDP, tc_lb.bpf.c at TC ingress): what a frame is to the LB, a
 * flow's session found and an idle one ended, a new session's backend from the
 * service's Maglev ring and its LB port (NAT) claimed atomically, the handshake's
 * move to the established tables, a reply's session, a TCP connection's close,
 * and the counters. Each hook keeps its own packet access, rewrites and exit: it
 * reads a TCP/UDP packet into a struct lb_seen (lb_seen_from) while its packet
 * pointers are valid, and the functions here work from that copy.
 *
 * Its map calls are BCC's (`map.lookup()`), which BCC turns into helper calls only
 * in the text it compiles: this header is pasted into each program's text where
 * it is included (BpfProgram.INLINE), after xdp_lb.h, xdp_lb_maps.h,
 * xdp_lb_flow.h and parsing_helpers.h, with LB_MODE set. Each hook defines
 * lb_hook_new_session(), declared below: what it needs of a new session's
 * backend before the session is made (the XDP hook: its MAC).
 */
#ifndef LB_SESSIONS_H
#define LB_SESSIONS_H

#define F_FIN 0x01
#define F_SYN 0x02
#define F_RST 0x04
#define F_ACK 0x10

/* The maps, as the functions below reach them (half: the half-open tables, else
 * the established ones). */
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
/* insert (BPF_NOEXIST): 0 when this claimed it, else taken */
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

/* A TCP or UDP packet as the LB reads it, copied while the hook's packet
 * pointers are valid (a TC program's first write invalidates them). */
struct lb_seen {
	struct lb_addr src;
	struct lb_addr dst;
	__be16 sport;
	__be16 dport;
	__u8 l4;
	__u8 v4;
	__u8 flags;          /* TCP's flags byte; 0 for UDP */
	__u8 options;        /* IPv4 options or IPv6 extension headers */
	__u32 seq;           /* TCP, host order */
	__u32 ack;
	__u32 payload;       /* TCP: the segment's data bytes */
	__u32 len;           /* the frame's bytes, for the counters */
	__u32 tot_len;       /* the IP packet's bytes (IPv6: payload + 40), as bpf_fib_lookup() takes it */
	unsigned char src_mac[6];
	__u8 pad[2];
};

/* What the hook does for a new session once its backend is picked, before the
 * session is made: 0, or -1 to drop the SYN (R_NO_NEIGH). Each hook defines it. */
static __always_inline int lb_hook_new_session(void *ctx, struct lb_seen *p, const struct lb_backend *be,
					       struct lb_session *ns);

/* After parse_l4() said PARSE_OK. */
static __always_inline void lb_seen_from(struct l4_pkt *h, __u32 len, struct lb_seen *p)
{
	if (h->v4) {
		copy_addr(&p->src, 1, &h->iph->saddr);
		copy_addr(&p->dst, 1, &h->iph->daddr);
		p->tot_len = bpf_ntohs(h->iph->tot_len);
	} else {
		copy_addr(&p->src, 0, &h->ip6h->saddr);
		copy_addr(&p->dst, 0, &h->ip6h->daddr);
		p->tot_len = bpf_ntohs(h->ip6h->payload_len) + sizeof(struct ipv6hdr);
	}
	p->sport = *h->sport;
	p->dport = *h->dport;
	p->l4 = h->l4;
	p->v4 = h->v4;
	p->options = h->options;
	p->flags = h->tcpflags ? *h->tcpflags : 0;
	if (h->l4 == IPPROTO_TCP) {
		struct tcphdr *t = h->l4hdr;

		p->seq = bpf_ntohl(t->seq);
		p->ack = bpf_ntohl(t->ack_seq);
		p->payload = h->l4len - t->doff * 4;
	}
	p->len = len;
	__builtin_memcpy(p->src_mac, h->eth->h_source, ETH_ALEN);
}

static __always_inline void lb_end_session(struct lb_flow_key *fk, struct lb_backend *be, __be16 lb_port,
					   __u8 proto)
{
	struct lb_reverse_key rk = {};

	if (LB_MODE == LB_MODE_NAT && be) {
		reverse_key(&rk, be, lb_port, proto);
		lb_reverse_del(&rk, 0);
		lb_reverse_del(&rk, 1);
	}
	lb_session_del(fk, 0);
	lb_session_del(fk, 1);
}

/* A TCP connection closing, as each side's packets show it (side 0: the
 * client's, 1: the backend's). A FIN marks its side and keeps the ACK number
 * that acknowledges it (the sequence number just past the FIN); an ACK at or
 * past the other side's marks that FIN acknowledged. Returns 1 when both FINs
 * are acknowledged: this packet is the connection's last, whichever side
 * closed first, or both at once. (Ending at the first ACK after both FINs
 * would be right only when the client closes first: when the backend does,
 * that ACK is the client's, and the backend's ACK of the client's FIN would
 * find no session.) */
static __always_inline int lb_closed(struct lb_seen *p, struct lb_session *s, int side)
{
	__u8 flags = p->flags;
	int other = !side;
	__u8 mine = s->closing[side];

	if (flags & F_FIN) {
		s->fin_ack[side] = p->seq + p->payload + 1;
		mine |= LB_CL_FIN;
	}
	if ((flags & F_ACK) && (s->closing[other] & LB_CL_FIN) && (__s32)(p->ack - s->fin_ack[other]) >= 0)
		mine |= LB_CL_ACKED;
	s->closing[side] = mine;
	return mine == LB_CL_DONE && s->closing[other] == LB_CL_DONE;
}

/* The session of a client's flow (the established tables first), or NULL; one
 * idle past its state's timeout is ended here (when next seen). *half: found in
 * the half-open tables. */
static __always_inline struct lb_session *lb_find(struct lb_flow_key *fk, __u8 proto, __u64 now,
						  struct lb_conf *cf, struct lb_stats *st, int *half)
{
	struct lb_session *s = lb_session_get(fk, 0);

	*half = 0;
	if (!s) {
		s = lb_session_get(fk, 1);
		*half = s != 0;
	}
	if (s) {
		__u8 base = s->state & 0x0F;
		__u32 to = base == LB_ST_UDP ? LB_TO_UDP : base == LB_ST_SYN ? LB_TO_SYN :
			   ((s->closing[0] | s->closing[1]) & LB_CL_FIN) ? LB_TO_FIN : LB_TO_EST;

		/* The other direction runs on another CPU and may have stamped last_seen
		 * after this CPU read `now`: a stamp ahead of now is fresh, not an idle
		 * time of 2^64 ns (which ended live sessions mid-connection). */
		if (to < LB_TIMEOUTS && now > s->last_seen && now - s->last_seen > cf->timeout_ns[to & 3]) {
			lb_end_session(fk, lb_backend_get(s->backend), s->lb_port, proto);
			st->expired++;
			s = 0;
			*half = 0;
		}
	}
	return s;
}

/* A new flow's backend: the service's ring at the flow's hash, if it is live
 * (*idx: its index), else NULL. */
static __always_inline struct lb_backend *lb_pick(__u32 service, __u32 h, __u32 *idx)
{
	__u32 *b = lb_ring_get(service * LB_RING_SIZE + h % LB_RING_SIZE);
	struct lb_backend *be;

	if (!b || !*b)
		return 0;
	*idx = *b;
	be = lb_backend_get(*idx);
	return be && be->live ? be : 0;
}

/* NAT: an LB port no live session to this backend holds, claimed atomically
 * (BPF_NOEXIST in the reverse table of the session's state, after a look in
 * the other): tried at LB_PORT_PROBES places from the flow's hash. Sets
 * ns->lb_port; -1 when none is free. */
static __always_inline int lb_claim_port(struct lb_session *ns, struct lb_flow_key *fk, struct lb_backend *be,
					 __u32 h, struct lb_conf *cf, __u8 proto)
{
	struct lb_reverse_key rk = {};
	int half = ns->state == LB_ST_SYN;

	for (int i = 0; i < LB_PORT_PROBES; i++) {
		__u16 port = cf->port_min + (h + i * 0x9e37) % (cf->port_count ? cf->port_count : 1);

		reverse_key(&rk, be, bpf_htons(port), proto);
		/* taken in the other table, or (insert: BPF_NOEXIST) in its own */
		if (lb_reverse_get(&rk, !half) || lb_reverse_claim(&rk, fk, half) != 0)
			continue;
		ns->lb_port = bpf_htons(port);
		return 0;
	}
	return -1;
}

/* A new session written (a SYN's to the half-open tables) and read back, or NULL
 * when it was evicted as soon as made. */
static __always_inline struct lb_session *lb_begin(struct lb_flow_key *fk, struct lb_session *ns, __u64 now,
						   struct lb_stats *st, int *half)
{
	*half = ns->state == LB_ST_SYN;
	ns->last_seen = now;
	lb_session_put(fk, ns, *half);
	st->new_sessions++;
	return lb_session_get(fk, *half);
}

/* The handshake's last ACK: the session moves to the established tables (and,
 * NAT, its reverse entry with it). Returns it there, or NULL: *reason R_STALE
 * when its LB port went to another flow meanwhile (evicted), else evicted as soon
 * as moved. */
static __always_inline struct lb_session *lb_establish(struct lb_flow_key *fk, struct lb_session *s,
						       struct lb_backend *be, __u8 proto, struct lb_stats *st,
						       int *reason)
{
	struct lb_session est = *s;
	struct lb_reverse_key rk = {};

	est.state = LB_ST_EST;
	if (LB_MODE == LB_MODE_NAT) {
		reverse_key(&rk, be, s->lb_port, proto);
		struct lb_flow_key *owner = lb_reverse_get(&rk, 1);
		if (!owner || !same_flow(owner, fk)) {
			/* evicted, and its port taken by another: this one cannot go on */
			lb_session_del(fk, 1);
			*reason = R_STALE;
			return 0;
		}
		lb_reverse_put(&rk, fk);
		lb_reverse_del(&rk, 1);
	}
	lb_session_put(fk, &est, 0);
	lb_session_del(fk, 1);
	st->established++;
	return lb_session_get(fk, 0);
}

/* NAT: the session a reply belongs to, by its reverse key; *fk its client's
 * flow. NULL with *reason R_UNMATCHED for no session of ours (the LB's own
 * traffic: health checks), R_NO_SESSION for one that vanished. */
static __always_inline struct lb_session *lb_reply(struct lb_reverse_key *rk, struct lb_flow_key *fk, int *reason)
{
	struct lb_flow_key *owner = lb_reverse_get(rk, 0);
	struct lb_session *s;

	if (!owner)
		owner = lb_reverse_get(rk, 1);
	if (!owner) {
		*reason = R_UNMATCHED;
		return 0;
	}
	*reason = R_NO_SESSION;
	*fk = *owner;
	s = lb_session_get(fk, 0);
	if (!s)
		s = lb_session_get(fk, 1);
	return s;
}

/* What a frame is to the load balancer, from parse_l4()'s result: -1 when it is
 * a TCP or UDP packet to look at (its options are the caller's to check once it
 * knows whether a service owns it), or the reason it goes on untouched (*drop
 * 0: to the stack, or the next TC filter) or is dropped (*drop 1).
 *
 * Traffic to a VIP that no service owns at L4 reaches the stack untouched:
 * ICMP, ICMPv6 (neighbour discovery, echo, packet-too-big: the LB host's own
 * IPv6 stops working without them), any protocol but TCP and UDP, whatever its
 * fragments or extension headers. Dropped is only what a service may own but
 * the LB would forward wrongly: TCP/UDP fragments to a VIP (fragment: a
 * fragment after the first has no ports to find the session by), a TCP/UDP
 * header cut short to a VIP (malformed), and TCP/UDP to a service port with
 * IPv4 options or IPv6 extension headers (ip_options, in the caller). The
 * reason is what was found, the same as every program says it (a fragment to
 * another address is a fragment too, passed); *drop is what the LB does about it. */
static __always_inline int lb_what_it_is(int parsed, struct l4_pkt *h, int *drop)
{
	struct lb_addr dst = {};

	*drop = 0;
	if (parsed == PARSE_OK)
		return -1;
	if (parsed == PARSE_NOT_IP)
		return R_NOT_IP;
	if (parsed == PARSE_MALFORMED)
		return R_MALFORMED;
	if (parsed == PARSE_OTHER)  /* ICMP, ICMPv6, other protocols: the stack's */
		return R_UNMATCHED;
	if (h->v4)
		dst.a[0] = h->iph->daddr;
	else
		__builtin_memcpy(dst.a, &h->ip6h->daddr, 16);
	/* a fragment, or a TCP/UDP header cut short: to a VIP it may be a
	 * service's, and cannot be forwarded right; to anything else it is the
	 * stack's business */
	if (vip_addrs.lookup(&dst) && (parsed == PARSE_SHORT_L4 || h->l4 == IPPROTO_TCP || h->l4 == IPPROTO_UDP))
		*drop = 1;
	return parsed == PARSE_FRAGMENT ? R_FRAGMENT : R_MALFORMED;
}

/* The service a packet is sent to, or NULL. */
static __always_inline struct lb_service *lb_service_of(struct lb_seen *p)
{
	struct lb_service_key sk = {};

	sk.vip = p->dst;
	sk.port = p->dport;
	sk.proto = p->l4;
	sk.family = p->v4 ? 4 : 6;
	return services.lookup(&sk);
}

/* NAT: whether a packet is sent to the LB's own address at one of its LB ports
 * (a backend's reply, or the LB host's own traffic there). */
static __always_inline int lb_to_lb_port(struct lb_seen *p, struct lb_conf *cf)
{
	__u16 port = bpf_ntohs(p->dport);

	return LB_MODE == LB_MODE_NAT && !p->options && same_addr(&p->dst, p->v4 ? &cf->self4 : &cf->self6) &&
	       port >= cf->port_min && port - cf->port_min < cf->port_count;
}

static __always_inline void lb_count(__u32 backend, __u32 len, int reply, int new_session)
{
	add_traffic(backend_stats.lookup(&backend), len, reply, new_session);
}

/* client -> VIP: the flow's session, found or begun (by a SYN, or a UDP flow's
 * first datagram), with *be its backend; *fk is the flow (zeroed by the caller).
 * NULL with *reason when the packet is to be dropped. */
static __always_inline struct lb_session *lb_client_packet(void *ctx, struct lb_seen *p, struct lb_flow_key *fk,
							   struct lb_stats *st, struct lb_conf *cf, __u32 service,
							   struct lb_backend **be, int *is_new, int *reason)
{
	struct lb_session *s, ns = {};
	__u64 now = bpf_ktime_get_ns();
	int syn = p->l4 == IPPROTO_TCP && (p->flags & (F_SYN | F_ACK)) == F_SYN;
	int half = 0;
	__u32 idx;

	*reason = R_NO_SESSION;  /* a session that vanishes under us (evicted) */
	*is_new = 0;
	fk->client = p->src;
	fk->cport = p->sport;
	fk->service = service;
	fk->proto = p->l4;

	s = lb_find(fk, p->l4, now, cf, st, &half);
	if (!s) {
		__u32 h = flow_hash(fk);

		if (p->l4 == IPPROTO_TCP && !syn)
			return 0;  /* no_session */
		*be = lb_pick(service, h, &idx);
		if (!*be) {
			*reason = R_NO_BACKEND;
			return 0;
		}
		ns.backend = idx;
		ns.state = p->l4 == IPPROTO_TCP ? LB_ST_SYN : LB_ST_UDP;
		__builtin_memcpy(ns.client_mac, p->src_mac, ETH_ALEN);
		if (lb_hook_new_session(ctx, p, *be, &ns) < 0) {
			*reason = R_NO_NEIGH;
			return 0;
		}
		if (LB_MODE == LB_MODE_NAT && lb_claim_port(&ns, fk, *be, h, cf, p->l4) < 0) {
			*reason = R_NO_PORT;
			return 0;
		}
		s = lb_begin(fk, &ns, now, st, &half);
		*is_new = 1;
		if (!s)
			return 0;  /* no_session: evicted as soon as made */
	}
	*be = lb_backend_get(s->backend);
	if (!*be || !(*be)->live) {
		*reason = R_NO_BACKEND;
		return 0;
	}
	s->last_seen = now;

	/* the handshake's last ACK: the session is established */
	if (half && !syn && (p->flags & F_ACK))
		return lb_establish(fk, s, *be, p->l4, st, reason);  /* NULL: stale, or no_session */
	return s;
}

/* After the hook has sent a client's packet on: counted, and a session that
 * this packet ends (RST, or the last ACK of a close) ended. */
static __always_inline void lb_client_done(struct lb_seen *p, struct lb_flow_key *fk, struct lb_session *s,
					   struct lb_backend *be, int is_new, struct lb_stats *st)
{
	lb_count(s->backend, p->len, 0, is_new);
	if (p->flags & F_RST) {
		lb_end_session(fk, be, s->lb_port, p->l4);
		st->closed_rst++;
	} else if (p->l4 == IPPROTO_TCP && lb_closed(p, s, 0)) {
		lb_end_session(fk, be, s->lb_port, p->l4);
		st->closed_fin++;
	}
}

/* backend -> LB port (NAT): the session a reply belongs to, *fk its client's
 * flow and *svc its service. NULL with *reason R_UNMATCHED when it is no
 * session's (the LB host's own traffic: pass it on), else one to drop. */
static __always_inline struct lb_session *lb_backend_packet(struct lb_seen *p, struct lb_flow_key *fk,
							    struct lb_service_info **svc, int *reason)
{
	struct lb_reverse_key rk = {};
	struct lb_session *s;

	rk.backend = p->src;
	rk.bport = p->sport;
	rk.lb_port = p->dport;
	rk.proto = p->l4;
	rk.family = p->v4 ? 4 : 6;
	s = lb_reply(&rk, fk, reason);
	if (!s)
		return 0;
	*svc = lb_service_info_get(fk->service);
	if (!*svc)
		return 0;  /* no_session: its service is gone */
	s->last_seen = bpf_ktime_get_ns();
	return s;
}

/* After the hook has sent a reply on: as lb_client_done(), from the backend's side. */
static __always_inline void lb_reply_done(struct lb_seen *p, struct lb_flow_key *fk, struct lb_session *s,
					  struct lb_stats *st)
{
	__u32 idx = s->backend;

	lb_count(idx, p->len, 1, 0);
	if (p->flags & F_RST) {
		lb_end_session(fk, lb_backend_get(idx), s->lb_port, p->l4);
		st->closed_rst++;
	} else if (p->l4 == IPPROTO_TCP && lb_closed(p, s, 1)) {
		lb_end_session(fk, lb_backend_get(idx), s->lb_port, p->l4);
		st->closed_fin++;
	}
}

#endif /* LB_SESSIONS_H */
