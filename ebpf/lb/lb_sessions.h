/* lb_sessions.h — the load balancer's sessions, once for every hook that runs it
 * (xdp_lb.bpf.c at XDP; a TC program includes the same): a flow's session found and
 * an idle one ended, a new session's backend from the service's Maglev ring and its
 * LB port (NAT) claimed atomically, the handshake's move to the established tables,
 * a reply's session, and a TCP connection's close. Each hook keeps its own packet
 * access, rewrites and exit.
 *
 * No map call is written here: BCC turns `map.lookup()` into a helper call only in
 * the file it compiles (in a header it stays an indirect call the verifier rejects,
 * and BCC refuses map calls inside macros). So each program defines, before it
 * includes this, the one-line wrappers declared below over its maps
 * (xdp_lb_maps.h); clang inlines them, and the verifier sees the same helper calls
 * as when the sessions were written out in the program. A wrapper left out is a
 * compile error (-Werror=undefined-internal, ebpf/lb/xdp_lb.py).
 *
 * Include after xdp_lb.h, xdp_lb_flow.h and parsing_helpers.h, with LB_MODE set.
 */
#ifndef LB_SESSIONS_H
#define LB_SESSIONS_H

#define F_FIN 0x01
#define F_SYN 0x02
#define F_RST 0x04
#define F_ACK 0x10

/* The wrappers each program defines over its maps (half: the half-open tables,
 * else the established ones). */
static __always_inline struct lb_session *lb_session_get(struct lb_flow_key *k, int half);
static __always_inline void lb_session_put(struct lb_flow_key *k, struct lb_session *s, int half);
static __always_inline void lb_session_del(struct lb_flow_key *k, int half);
static __always_inline struct lb_flow_key *lb_reverse_get(struct lb_reverse_key *k, int half);
/* insert (BPF_NOEXIST): 0 when this claimed it, else taken */
static __always_inline int lb_reverse_claim(struct lb_reverse_key *k, struct lb_flow_key *fk, int half);
static __always_inline void lb_reverse_put(struct lb_reverse_key *k, struct lb_flow_key *fk);
static __always_inline void lb_reverse_del(struct lb_reverse_key *k, int half);
static __always_inline __u32 *lb_ring_get(__u32 slot);
static __always_inline struct lb_backend *lb_backend_get(__u32 idx);
static __always_inline struct lb_service_info *lb_service_info_get(__u32 sid);

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
static __always_inline int lb_closed(struct l4_pkt *h, struct lb_session *s, __u8 flags, int side)
{
	struct tcphdr *t = h->l4hdr;
	int other = !side;
	__u8 mine = s->closing[side];

	if (flags & F_FIN) {
		s->fin_ack[side] = bpf_ntohl(t->seq) + (h->l4len - t->doff * 4) + 1;
		mine |= LB_CL_FIN;
	}
	if ((flags & F_ACK) && (s->closing[other] & LB_CL_FIN) &&
	    (__s32)(bpf_ntohl(t->ack_seq) - s->fin_ack[other]) >= 0)
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

#endif /* LB_SESSIONS_H */
