/* xdp_lb.bpf.c — a layer-4 load balancer at the XDP hook: services (VIP, port,
 * protocol) spread over backends by a Maglev table, with connection tracking.
 *
 * Kernel: 5.x+ (LRU hash, bpf_fib_lookup, bounded loops); built on 6.x.
 * Loaded by ebpf/xdp_lb.py (class XdpLoadBalancer), which passes LB_MODE and
 * fills every map: services, Maglev rings, backends, the LB's own addresses.
 *
 * NAT mode (the seeds' design), one-armed: the LB sits on one interface.
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
 * ends a session; a FIN from each side and then an ACK end it; an idle session
 * expires (per state, conf.timeout_ns) when next seen, and user space sweeps
 * the rest. UDP: a session per client flow, ended by its timeout.
 *
 * What is not for a service passes to the stack untouched (ARP, ICMP, ICMPv6,
 * other protocols, addresses and ports): see parse(). TCP/UDP fragments to a
 * VIP, and a service's traffic with IPv4 options or IPv6 extension headers,
 * are dropped and counted (Katran does the same: the ports of a fragment are
 * not in it).
 * Every return goes through verdict(), which counts it.
 */
#include <uapi/linux/bpf.h>
#include <linux/socket.h>
#include "parsing_helpers.h"
#include "rewrite_helpers.h"
#include "xdp_lb.h"

#ifndef LB_MODE
#define LB_MODE LB_MODE_NAT
#endif
#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif
#define TCP_FLAGS(h) (((__u8 *)(h))[13])
#define F_FIN 0x01
#define F_SYN 0x02
#define F_RST 0x04
#define F_ACK 0x10

BPF_HASH(services, struct lb_service_key, struct lb_service, LB_MAX_SERVICES);
BPF_ARRAY(service_info, struct lb_service_info, LB_MAX_SERVICES);
BPF_HASH(vip_addrs, struct lb_addr, __u8, LB_MAX_SERVICES);   /* every VIP: fragments and options to it drop */
BPF_ARRAY(rings, __u32, LB_MAX_SERVICES * LB_RING_SIZE);
BPF_ARRAY(backends, struct lb_backend, LB_MAX_BACKENDS);
BPF_ARRAY(conf, struct lb_conf, 1);
BPF_TABLE("lru_hash", struct lb_flow_key, struct lb_session, sessions, LB_MAX_SESSIONS);
BPF_TABLE("lru_hash", struct lb_flow_key, struct lb_session, half_open, LB_MAX_HALF_OPEN);
BPF_TABLE("lru_hash", struct lb_reverse_key, struct lb_flow_key, reverse, LB_MAX_SESSIONS);
BPF_TABLE("lru_hash", struct lb_reverse_key, struct lb_flow_key, reverse_half, LB_MAX_HALF_OPEN);
BPF_PERCPU_ARRAY(stats, struct lb_stats, 1);
BPF_ARRAY(skb_mode, __u32, 1);   /* 1 in generic mode: frames leave as skbs (rewrite_helpers.h); user space writes it */
BPF_PERCPU_ARRAY(csum_scratch, struct csum_block, 1); /* where a partial checksum is finished */
BPF_PERCPU_ARRAY(service_stats, struct lb_traffic, LB_MAX_SERVICES);
BPF_PERCPU_ARRAY(backend_stats, struct lb_traffic, LB_MAX_BACKENDS);

struct pkt {
	struct ethhdr *eth;
	struct iphdr *iph;
	struct ipv6hdr *ip6h;
	__be16 *sport;
	__be16 *dport;
	__sum16 *l4csum;
	__u8 *tcpflags;
	void *l4hdr;     /* the TCP or UDP header */
	int l4len;       /* the segment's length, from the IP header */
	struct l4csum c; /* its checksum, as rewrite_helpers.h keeps it */
	int l4;
	int v4;
	int odd;         /* LB_ODD_*: came with fragmentation, options or extension headers */
	__u32 len;
};

static __always_inline int verdict(struct lb_stats *st, int action)
{
	if (action == XDP_TX)
		st->xdp_tx++;
	else if (action == XDP_PASS)
		st->xdp_pass++;
	else
		st->xdp_drop++;
	return action;
}

/* A small integer mix (murmur3's finaliser) over the client's address and ports:
 * the ring index and the first LB port tried. */
static __always_inline __u32 mix(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 flow_hash(const struct lb_flow_key *k)
{
	__u32 h = mix(k->client.a[0] ^ 0x9e3779b9);

	h = mix(h ^ k->client.a[1]);
	h = mix(h ^ k->client.a[2]);
	h = mix(h ^ k->client.a[3]);
	return mix(h ^ ((__u32)k->cport << 16 | k->service));
}

static __always_inline int same_addr(const struct lb_addr *x, const struct lb_addr *y)
{
	return x->a[0] == y->a[0] && x->a[1] == y->a[1] && x->a[2] == y->a[2] && x->a[3] == y->a[3];
}

static __always_inline int same_flow(const struct lb_flow_key *x, const struct lb_flow_key *y)
{
	return same_addr(&x->client, &y->client) && x->cport == y->cport && x->service == y->service &&
	       x->proto == y->proto;
}

static __always_inline void copy_addr(struct lb_addr *to, int v4, const void *from)
{
	if (v4) {
		to->a[0] = *(const __u32 *)from;
	} else {
		__builtin_memcpy(to->a, from, 16);
	}
}

#define LB_ODD_FRAGMENT 1 /* an IPv4 fragment, or an IPv6 fragment header */
#define LB_ODD_OPTIONS 2  /* IPv4 options, or IPv6 extension headers before TCP/UDP */

/* Parse to the ports. 0: a TCP or UDP packet (p->odd says whether it came with
 * options or extension headers: the caller drops those when a service owns
 * them); -1: pass it to the stack untouched; -2: drop it. Both counted here.
 *
 * Traffic to a VIP that no service owns at L4 reaches the stack untouched:
 * ICMP, ICMPv6 (neighbour discovery, echo, packet-too-big: the LB host's own
 * IPv6 stops working without them), any protocol but TCP and UDP, whatever its
 * fragments or extension headers. Dropped, each by its reason, is only what a
 * service may own but this program would forward wrongly: TCP/UDP fragments to
 * a VIP (drop_fragment: a fragment after the first has no ports to find the
 * session by), a TCP/UDP header cut short to a VIP (drop_malformed), and
 * TCP/UDP to a service port with IPv4 options or IPv6 extension headers
 * (drop_ip_options, in the caller). */
static __always_inline int parse(void *data, void *data_end, struct pkt *p, struct lb_stats *st,
				 struct lb_addr *dst)
{
	struct hdr_cursor nh = { .pos = data };
	int proto, l4, iplen;

	p->odd = 0;
	proto = parse_ethhdr(&nh, data_end, &p->eth);
	if (proto == bpf_htons(ETH_P_IP)) {
		p->v4 = 1;
		l4 = parse_iphdr(&nh, data_end, &p->iph);
		if (l4 < 0) {
			st->pass_not_ip++;
			return -1;
		}
		dst->a[0] = p->iph->daddr;
		iplen = bpf_ntohs(p->iph->tot_len) - p->iph->ihl * 4;
		if (ip_is_fragment(p->iph))
			p->odd = LB_ODD_FRAGMENT;
		else if (p->iph->ihl != 5)
			p->odd = LB_ODD_OPTIONS;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		p->v4 = 0;
		l4 = parse_ip6hdr(&nh, data_end, &p->ip6h);
		if (l4 < 0) {
			st->pass_not_ip++;
			return -1;
		}
		__builtin_memcpy(dst->a, &p->ip6h->daddr, 16);
		if (l4 != IPPROTO_TCP && l4 != IPPROTO_UDP) {
			/* extension headers: walked to what they carry (ICMPv6 is not one) */
			int next = skip_ip6hdrext(&nh, data_end, l4);

			if (next == IPPROTO_FRAGMENT) {
				__u8 *frag_next = nh.pos;  /* a fragment header's first byte */

				p->odd = LB_ODD_FRAGMENT;
				next = (void *)(frag_next + 1) > data_end ? -1 : *frag_next;
			} else if (next != l4) {
				p->odd = LB_ODD_OPTIONS;
			}
			l4 = next;
		}
		iplen = bpf_ntohs(p->ip6h->payload_len) - (int)(nh.pos - (void *)(p->ip6h + 1));
	} else {
		st->pass_not_ip++;
		return -1;
	}
	if (l4 != IPPROTO_TCP && l4 != IPPROTO_UDP) {
		st->pass_not_service++;  /* ICMP, ICMPv6, other protocols: the stack's */
		return -1;
	}
	if (p->odd == LB_ODD_FRAGMENT) {
		if (vip_addrs.lookup(dst)) {
			st->drop_fragment++;
			return -2;
		}
		st->pass_not_service++;
		return -1;
	}
	p->l4 = l4;
	p->l4hdr = nh.pos;
	p->l4len = iplen;
	if (l4 == IPPROTO_TCP) {
		struct tcphdr *th;

		if (parse_tcphdr(&nh, data_end, &th) < 0)
			goto short_l4;
		p->sport = &th->source;
		p->dport = &th->dest;
		p->l4csum = &th->check;
		p->tcpflags = &TCP_FLAGS(th);
	} else {
		struct udphdr *uh;

		if (parse_udphdr(&nh, data_end, &uh) < 0)
			goto short_l4;
		p->sport = &uh->source;
		p->dport = &uh->dest;
		p->l4csum = &uh->check;
		p->tcpflags = 0;
	}
	p->len = data_end - data;
	return 0;

short_l4:
	/* to a VIP it may be a service's, and cannot be forwarded; else the stack's */
	if (vip_addrs.lookup(dst)) {
		st->drop_malformed++;
		return -2;
	}
	st->pass_not_service++;
	return -1;
}

static __always_inline void rewrite_addr(struct pkt *p, int src, const struct lb_addr *to)
{
	if (p->v4)
		rewrite_ipv4_addr(p->iph, src ? &p->iph->saddr : &p->iph->daddr, to->a[0], &p->c);
	else
		rewrite_ipv6_addr(src ? &p->ip6h->saddr : &p->ip6h->daddr, (const struct in6_addr *)to->a, &p->c);
}

static __always_inline void rewrite_ports(struct pkt *p, __be16 sport, __be16 dport)
{
	rewrite_port(p->sport, sport, &p->c);
	rewrite_port(p->dport, dport, &p->c);
}

/* The backend's MAC, by the kernel's route and neighbour tables. 0 or -1. */
static __always_inline int backend_mac(struct xdp_md *ctx, struct pkt *p, const struct lb_backend *be,
				       unsigned char *mac)
{
	struct bpf_fib_lookup fib = {};

	fib.ifindex = ctx->ingress_ifindex;
	fib.l4_protocol = p->l4;
	if (p->v4) {
		fib.family = AF_INET;
		fib.ipv4_dst = be->addr.a[0];
		fib.tot_len = bpf_ntohs(p->iph->tot_len);
	} else {
		fib.family = AF_INET6;
		__builtin_memcpy(fib.ipv6_dst, be->addr.a, 16);
		fib.tot_len = bpf_ntohs(p->ip6h->payload_len) + sizeof(struct ipv6hdr);
	}
	/* the output interface must be the one the frame came in on (one-armed) */
	if (bpf_fib_lookup(ctx, &fib, sizeof(fib), BPF_FIB_LOOKUP_OUTPUT) != BPF_FIB_LKUP_RET_SUCCESS ||
	    fib.ifindex != ctx->ingress_ifindex)
		return -1;
	__builtin_memcpy(mac, fib.dmac, ETH_ALEN);
	return 0;
}

static __always_inline void add_traffic(struct lb_traffic *t, __u32 len, int reply, int new_session)
{
	if (!t)
		return;
	if (reply) {
		t->reply_packets++;
		t->reply_bytes += len;
	} else {
		t->packets++;
		t->bytes += len;
	}
	t->new_sessions += new_session;
}

/* Map calls stay here, in the main file: BCC rewrites them only there. */
static __always_inline void count(__u32 service, __u32 backend, __u32 len, int reply, int new_session)
{
	add_traffic(service_stats.lookup(&service), len, reply, new_session);
	add_traffic(backend_stats.lookup(&backend), len, reply, new_session);
}

static __always_inline void reverse_key(struct lb_reverse_key *rk, const struct lb_backend *be, __be16 lb_port,
					__u8 proto)
{
	rk->backend = be->addr;
	rk->bport = be->port;
	rk->lb_port = lb_port;
	rk->proto = proto;
	rk->family = be->family;
}

static __always_inline void end_session(struct lb_flow_key *fk, struct lb_session *s, struct lb_backend *be,
					__u8 proto)
{
	struct lb_reverse_key rk = {};

	if (LB_MODE == LB_MODE_NAT && be) {
		reverse_key(&rk, be, s->lb_port, proto);
		reverse.delete(&rk);
		reverse_half.delete(&rk);
	}
	sessions.delete(fk);
	half_open.delete(fk);
}

/* client -> VIP */
static __always_inline int to_backend(struct xdp_md *ctx, struct pkt *p, struct lb_stats *st, struct lb_conf *cf,
				      __u32 service)
{
	struct lb_flow_key fk = {};
	struct lb_session *s, ns = {};
	struct lb_backend *be;
	struct lb_reverse_key rk = {};
	__u64 now = bpf_ktime_get_ns();
	__u8 flags = p->tcpflags ? *p->tcpflags : 0;
	int syn = p->l4 == IPPROTO_TCP && (flags & (F_SYN | F_ACK)) == F_SYN;
	int half = 0, is_new = 0;
	__u32 idx;

	if (p->v4)
		copy_addr(&fk.client, 1, &p->iph->saddr);
	else
		copy_addr(&fk.client, 0, &p->ip6h->saddr);
	fk.cport = *p->sport;
	fk.service = service;
	fk.proto = p->l4;

	s = sessions.lookup(&fk);
	if (!s) {
		s = half_open.lookup(&fk);
		half = s != 0;
	}
	if (s) {
		__u8 base = s->state & 0x0F;
		__u32 to = base == LB_ST_UDP ? LB_TO_UDP : base == LB_ST_SYN ? LB_TO_SYN :
			   (s->state & (LB_FIN_CLIENT | LB_FIN_BACKEND)) ? LB_TO_FIN : LB_TO_EST;

		if (to < LB_TIMEOUTS && now - s->last_seen > cf->timeout_ns[to & 3]) {
			idx = s->backend;
			be = backends.lookup(&idx);
			end_session(&fk, s, be, p->l4);
			st->expired++;
			s = 0;
			half = 0;
		}
	}
	if (!s) {
		__u32 slot;
		__u32 h = flow_hash(&fk);

		if (p->l4 == IPPROTO_TCP && !syn) {
			st->drop_no_session++;
			return XDP_DROP;
		}
		slot = service * LB_RING_SIZE + h % LB_RING_SIZE;
		__u32 *b = rings.lookup(&slot);
		if (!b || !*b) {
			st->drop_no_backend++;
			return XDP_DROP;
		}
		idx = *b;
		be = backends.lookup(&idx);
		if (!be || !be->live) {
			st->drop_no_backend++;
			return XDP_DROP;
		}
		ns.backend = idx;
		ns.state = p->l4 == IPPROTO_TCP ? LB_ST_SYN : LB_ST_UDP;
		if (backend_mac(ctx, p, be, ns.backend_mac) < 0) {
			st->drop_no_neigh++;
			return XDP_DROP;
		}
		__builtin_memcpy(ns.client_mac, p->eth->h_source, ETH_ALEN);
		if (LB_MODE == LB_MODE_NAT) {
			/* an LB port no live session to this backend holds, claimed atomically */
			int found = 0;

			for (int i = 0; i < LB_PORT_PROBES; i++) {
				__u16 port = cf->port_min + (h + i * 0x9e37) % (cf->port_count ? cf->port_count : 1);

				reverse_key(&rk, be, bpf_htons(port), p->l4);
				/* taken in the other table, or (insert: BPF_NOEXIST) in its own */
				if (ns.state == LB_ST_SYN) {
					if (reverse.lookup(&rk) || reverse_half.insert(&rk, &fk) != 0)
						continue;
				} else if (reverse_half.lookup(&rk) || reverse.insert(&rk, &fk) != 0) {
					continue;
				}
				ns.lb_port = bpf_htons(port);
				found = 1;
				break;
			}
			if (!found) {
				st->drop_no_port++;
				return XDP_DROP;
			}
		}
		ns.last_seen = now;
		if (ns.state == LB_ST_SYN)
			half_open.update(&fk, &ns);
		else
			sessions.update(&fk, &ns);
		st->new_sessions++;
		is_new = 1;
		s = ns.state == LB_ST_SYN ? half_open.lookup(&fk) : sessions.lookup(&fk);
		half = ns.state == LB_ST_SYN;
		if (!s)
			return XDP_DROP;
	}
	idx = s->backend;
	be = backends.lookup(&idx);
	if (!be || !be->live) {
		st->drop_no_backend++;
		return XDP_DROP;
	}
	s->last_seen = now;

	/* the handshake's last ACK: the session is established */
	if (half && !syn && (flags & F_ACK)) {
		struct lb_session est = *s;

		est.state = LB_ST_EST;
		if (LB_MODE == LB_MODE_NAT) {
			reverse_key(&rk, be, s->lb_port, p->l4);
			struct lb_flow_key *owner = reverse_half.lookup(&rk);
			if (!owner || !same_flow(owner, &fk)) {
				/* evicted, and its port taken by another: this one cannot go on */
				half_open.delete(&fk);
				st->drop_stale++;
				return XDP_DROP;
			}
			reverse.update(&rk, &fk);
			reverse_half.delete(&rk);
		}
		sessions.update(&fk, &est);
		half_open.delete(&fk);
		st->established++;
		s = sessions.lookup(&fk);
		if (!s)
			return XDP_DROP;
	}

	if (LB_MODE == LB_MODE_NAT) {
		if (p->v4)
			rewrite_addr(p, 1, &cf->self4);
		else
			rewrite_addr(p, 1, &cf->self6);
		rewrite_addr(p, 0, &be->addr);
		rewrite_ports(p, s->lb_port, be->port);
		__builtin_memcpy(p->eth->h_source, p->eth->h_dest, ETH_ALEN);  /* ours: the frame was sent to us */
	} else {
		__builtin_memcpy(p->eth->h_source, p->eth->h_dest, ETH_ALEN);
	}
	__builtin_memcpy(p->eth->h_dest, s->backend_mac, ETH_ALEN);
	count(fk.service, idx, p->len, 0, is_new);
	st->to_backend++;

	if (flags & F_RST) {
		end_session(&fk, s, be, p->l4);
		st->closed_rst++;
	} else if (flags & F_FIN) {
		s->state |= LB_FIN_CLIENT;
	} else if ((flags & F_ACK) && (s->state & (LB_FIN_CLIENT | LB_FIN_BACKEND)) == (LB_FIN_CLIENT | LB_FIN_BACKEND)) {
		/* the ACK of the backend's FIN, after both FINs: the last packet */
		end_session(&fk, s, be, p->l4);
		st->closed_fin++;
	}
	return XDP_TX;
}

/* backend -> LB (NAT): a reply to a session */
static __always_inline int to_client(struct xdp_md *ctx, struct pkt *p, struct lb_stats *st, struct lb_conf *cf)
{
	struct lb_reverse_key rk = {};
	struct lb_flow_key *owner, fk;
	struct lb_session *s;
	struct lb_service_info *svc;
	__u8 flags = p->tcpflags ? *p->tcpflags : 0;
	__u32 sid, idx;
	struct lb_backend *be;

	if (p->v4)
		copy_addr(&rk.backend, 1, &p->iph->saddr);
	else
		copy_addr(&rk.backend, 0, &p->ip6h->saddr);
	rk.bport = *p->sport;
	rk.lb_port = *p->dport;
	rk.proto = p->l4;
	rk.family = p->v4 ? 4 : 6;
	owner = reverse.lookup(&rk);
	if (!owner)
		owner = reverse_half.lookup(&rk);
	if (!owner) {
		st->pass_not_service++;
		return XDP_PASS;   /* the LB's own traffic (health checks) */
	}
	fk = *owner;
	s = sessions.lookup(&fk);
	if (!s)
		s = half_open.lookup(&fk);
	if (!s) {
		st->drop_no_session++;
		return XDP_DROP;
	}
	sid = fk.service;
	svc = service_info.lookup(&sid);
	if (!svc)
		return XDP_DROP;
	s->last_seen = bpf_ktime_get_ns();
	rewrite_addr(p, 1, &svc->vip);
	rewrite_addr(p, 0, &fk.client);
	rewrite_ports(p, svc->port, fk.cport);
	__builtin_memcpy(p->eth->h_source, p->eth->h_dest, ETH_ALEN);
	__builtin_memcpy(p->eth->h_dest, s->client_mac, ETH_ALEN);
	idx = s->backend;
	count(sid, idx, p->len, 1, 0);
	st->to_client++;
	if (flags & F_RST) {
		be = backends.lookup(&idx);
		end_session(&fk, s, be, p->l4);
		st->closed_rst++;
	} else if (flags & F_FIN) {
		s->state |= LB_FIN_BACKEND;
	}
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
	int rc, action;
	struct lb_stats *st = stats.lookup(&zero);

	if (!st)
		return XDP_PASS;
	st->seen++;
	cf = conf.lookup(&zero);
	if (!cf)
		return verdict(st, XDP_PASS);
	rc = parse(data, data_end, &p, st, &dst);
	if (rc == -1)
		return verdict(st, XDP_PASS);
	if (rc < 0)
		return verdict(st, XDP_DROP);

	sk.vip = dst;
	sk.port = *p.dport;
	sk.proto = p.l4;
	sk.family = p.v4 ? 4 : 6;
	svc = services.lookup(&sk);
	if (svc && p.odd) {
		st->drop_ip_options++;  /* a service's, with options or extension headers */
		return verdict(st, XDP_DROP);
	}
	if (p.v4)
		l4csum_init(&p.c, p.l4hdr, p.l4csum, p.l4 == IPPROTO_UDP, p.l4len,
			    ipv4_pseudo_sum(p.iph->saddr, p.iph->daddr, p.l4, p.l4len));
	else
		l4csum_init(&p.c, p.l4hdr, p.l4csum, p.l4 == IPPROTO_UDP, p.l4len,
			    ipv6_pseudo_sum((__be32 *)&p.ip6h->saddr, (__be32 *)&p.ip6h->daddr, p.l4, p.l4len));
	action = -1;
	if (svc) {
		action = to_backend(ctx, &p, st, cf, svc->id);
	} else if (LB_MODE == LB_MODE_NAT && !p.odd) {
		const struct lb_addr *self = p.v4 ? &cf->self4 : &cf->self6;
		__u16 port = bpf_ntohs(*p.dport);

		if (same_addr(&dst, self) && port >= cf->port_min &&
		    port - cf->port_min < cf->port_count)
			action = to_client(ctx, &p, st, cf);
	}
	if (action < 0) {
		st->pass_not_service++;
		return verdict(st, XDP_PASS);
	}
	if (action == XDP_TX)
		st->csum_partial += p.c.partial;
	generic = skb_mode.lookup(&zero);
	if (l4csum_exit(ctx, &p.c, action, generic && *generic, csum_scratch.lookup(&zero)) < 0) {
		st->drop_malformed++;  /* the segment the IP header claims is not all in the frame */
		action = XDP_DROP;
	}
	return verdict(st, action);
}
