/* xdp_lb_flow.h — the load balancer's flows, without maps: the hash that picks
 * a ring slot and the first LB port to try, and comparing and copying keys. */
#ifndef XDP_LB_FLOW_H
#define XDP_LB_FLOW_H

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

/* The key of a NAT session's replies: the backend, its port and the LB port. */
static __always_inline void reverse_key(struct lb_reverse_key *rk, const struct lb_backend *be, __be16 lb_port,
					__u8 proto)
{
	rk->backend = be->addr;
	rk->bport = be->port;
	rk->lb_port = lb_port;
	rk->proto = proto;
	rk->family = be->family;
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

#endif /* XDP_LB_FLOW_H */
