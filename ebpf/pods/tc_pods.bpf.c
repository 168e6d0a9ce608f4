/* tc_pods.bpf.c — a pod datapath as Cilium's connects pods on a node
 * (bpf/bpf_lxc.c cil_from_container, bpf/bpf_host.c cil_from_netdev,
 * bpf/bpf_overlay.c cil_from_overlay), on the kernel's own helpers.
 *
 * A pod is a network namespace whose eth0 is one end of a veth; the other end
 * (the host-side veth, Cilium's lxcXXX) is in the node's namespace, and the
 * node routes to the pod's address through it (a /32 or /128 route, as a CNI
 * writes). Two programs, both at TC ingress (direct-action):
 *
 *   pods_from_pod   on each pod's host-side veth: what a pod sends.
 *     - to a pod on this node: into it (deliver());
 *     - to another node's pod (a prefix of `remote`): native routing looks the
 *       way up in the FIB (bpf_fib_lookup()), rewrites the MACs and redirects
 *       out of the uplink, or hands an unresolved neighbour to
 *       bpf_redirect_neigh(); tunnel mode sets the tunnel key (that node's
 *       address, the VNI) and redirects to the collect-metadata VXLAN device;
 *     - anything else (the node itself, outside the cluster, ARP, ND) passes
 *       to the kernel untouched, counted by reason (unmatched: for no pod, as
 *       every program of the lab names what is none of its business).
 *   pods_from_node  on the uplink and on the VXLAN device: a frame for a pod
 *     on this node goes into it; anything else passes.
 *
 * Services (ClusterIP-like: an address, port and protocol standing for
 * backends, chosen through the service's Maglev table):
 *   pods_conn4/6, pods_send4/6  cgroup connect()/sendmsg() (Cilium's bpf_sock.c,
 *     the kube-proxy replacement): a socket in the pods' cgroup that connects or
 *     sends to a service is given a backend's address instead, once, so its
 *     packets need no translation at all; a UDP socket's choice is remembered
 *     by its cookie, and pods_recv4/6 (recvmsg()) give the replies' source
 *     back as the service.
 *   per packet, in pods_from_pod, for sockets outside that cgroup: a packet to
 *     a service gets a backend's address and port (the flow's first packet
 *     chooses; the choice is kept in `nat`, with the reverse for its replies),
 *     and deliver() gives a reply the service's address and port back, on the
 *     client's node, before it goes into the client's pod.
 *
 * deliver() is Cilium's local delivery (bpf/lib/local_delivery.h): the TTL or
 * hop limit less one, the pod's MAC as destination and its host-side veth's
 * as source, then bpf_redirect_peer(): from the veth's ingress straight to its
 * peer's ingress inside the pod, without a second trip through the CPU's
 * backlog queue (the commit that added the helper measured pod-to-remote-pod
 * TCP_RR at 122 us with bpf_redirect() and 44 us with it). A frame that came
 * out of the tunnel was classed as for another host on the VXLAN device (its
 * inner destination MAC is not the device's): it is made PACKET_HOST first,
 * as the stack would drop it otherwise, once in the pod.
 *
 * Only headers are rewritten: TTL (and the IPv4 header checksum) and MACs, so a
 * partial TCP/UDP checksum (a sender with TX checksum offload: every veth's
 * default) stays partial and correct. What the fast path cannot take goes to
 * the kernel as it came, counted by reason: TTL or hop limit <= 1 (the kernel
 * answers with the ICMP error), larger than the way's MTU, no route, a VLAN
 * tag. The tunnel's outer UDP checksum is the VXLAN device's to compute (the
 * key does not ask for it to be zero).
 *
 * Kernel 5.10+ (bpf_redirect_peer, bpf_redirect_neigh). Loaded by
 * ebpf/pods/tc_pods.py (class TcPods).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_packet.h>
#include "parsing_helpers.h"
#include "verdict.h"
#include "skb_rewrite.h"
#include "tc_pods.h"

/* As tc_redirect.bpf.c: BCC 0.26's helpers.h declares bpf_redirect_neigh
 * without plen, so its flags would land in plen. */
static long (*redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) =
	(void *)BPF_FUNC_redirect_neigh;
static long (*redirect_peer)(__u32 ifindex, __u64 flags) = (void *)BPF_FUNC_redirect_peer;

/* bpf_skb_set_tunnel_key()'s flag for an IPv6 remote: an enum in uapi bpf.h,
 * which #ifndef cannot see. */
#define TUNINFO_IPV6 (1ULL << 0)

/* bpf_get_socket_cookie() as the kernel has it: BCC 0.26's helpers.h declares it
 * returning u32, which would cut the 64-bit cookie (two sockets could share one). */
static __u64 (*sock_cookie)(void *ctx) = (void *)BPF_FUNC_get_socket_cookie;

/* Deepest header the datapath reads: Ethernet, two VLAN tags, IPv4 with its
 * options or IPv6 with a few extension headers, and TCP with its options. */
#define PULL_DEPTH 256

struct pod_stats {
	struct fp_counts exits;   /* first: every verdict and reason (verdict.h) */
	__u64 bytes;              /* of the frames it redirected */
	__u64 to_backend;         /* packets to a service given a backend's address (per packet) */
	__u64 to_client;          /* replies given their service's address back */
};

/* What a translation puts in its place: a backend (forward) or the service (reply). */
struct svc_nat_val {
	__u32 a[4];
	__be16 port;
	__u16 pad;
};

BPF_HASH(endpoints, struct pod_addr, struct pod_ep, PODS_MAX);          /* a pod's address -> how to reach it; user space */
BPF_HASH(lxc, __u32, __u32, PODS_MAX);                                  /* host-side veth's ifindex -> its pod's slot; user space */
BPF_LPM_TRIE(remote, struct pod_prefix, struct pod_node, PODS_REMOTE_MAX); /* other nodes' pod prefixes; user space */
BPF_ARRAY(conf, struct pods_conf, 1);                                   /* mode and tunnel; user space */
BPF_PERCPU_ARRAY(stats, struct pod_stats, PODS_SLOTS);                  /* per pod slot; this program */
BPF_HASH(services, struct svc_key, struct svc_val, PODS_SVC_MAX);       /* user space */
BPF_HASH(svc_slots, struct svc_slot_key, __u32, PODS_SVC_ENTRIES_MAX); /* a service's slot -> backend index; user space */
BPF_ARRAY(backends, struct svc_backend, PODS_BACKENDS_MAX);             /* user space */
BPF_TABLE("lru_hash", struct svc_nat_key, struct svc_nat_val, nat, PODS_NAT_MAX);          /* this program */
BPF_TABLE("lru_hash", struct svc_sock_key, struct svc_nat_val, sock_rev, PODS_SOCK_REV_MAX); /* the cgroup programs */
BPF_PERCPU_ARRAY(sock_stats, struct svc_sock_stats, 1);                 /* the cgroup programs */

/* What the routing and a service need of a frame (struct pkt_fields,
 * skb_rewrite.h), read while the packet pointers are valid. p->ports says
 * whether there was a TCP or UDP header (a service's packet has one). */
static __always_inline int read_pkt(struct __sk_buff *skb, struct pkt_fields *p, int *reason)
{
	void *data, *data_end;
	struct l4_pkt pk = {};
	__u32 linear = skb->data_end - skb->data;
	int parsed;

	/* headers split across pages (GSO, some drivers): pull just enough, before
	 * any packet pointer is taken (the pull invalidates them) */
	if (linear < PULL_DEPTH && skb->len > linear)
		bpf_skb_pull_data(skb, skb->len < PULL_DEPTH ? skb->len : PULL_DEPTH);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	parsed = parse_l4(data, data_end, &pk, PARSE_L4);
	/* a header cut short or invalid goes to the kernel, as every program of the lab
	 * hands it on; an IP packet without ports (ICMP, a fragment) is still routed */
	if (parsed == PARSE_NOT_IP || parsed == PARSE_MALFORMED || parsed == PARSE_SHORT_L4) {
		*reason = parse_reason(parsed);
		return -1;
	}
	p->v4 = pk.v4;
	if (pk.v4) {
		p->l3 = (void *)pk.iph - data;
		p->saddr[0] = pk.iph->saddr;
		p->daddr[0] = pk.iph->daddr;
		p->ttl = pk.iph->ttl;
		p->tos = pk.iph->tos;
		p->l4 = pk.iph->protocol; /* the header checksum's word with the TTL (ttl_down) */
		p->tot_len = bpf_ntohs(pk.iph->tot_len);
	} else {
		p->l3 = (void *)pk.ip6h - data;
		__builtin_memcpy(p->saddr, &pk.ip6h->saddr, sizeof(p->saddr));
		__builtin_memcpy(p->daddr, &pk.ip6h->daddr, sizeof(p->daddr));
		p->ttl = pk.ip6h->hop_limit;
		p->l4 = parsed == PARSE_OK ? pk.l4 : pk.ip6h->nexthdr;
		p->flowinfo = *(__be32 *)pk.ip6h & bpf_htonl(0x0FFFFFFF);
		p->tot_len = bpf_ntohs(pk.ip6h->payload_len) + sizeof(*pk.ip6h);
	}
	if (parsed == PARSE_OK) {
		p->ports = 1;
		p->udp = pk.l4 == IPPROTO_UDP;
		p->csum = (void *)pk.l4csum - data;
		p->sport = (void *)pk.sport - data;
		p->sport_val = *pk.sport;
		p->dport_val = *pk.dport;
		p->no_l4_csum = p->udp && !*pk.l4csum;
	}
	/* a tag left in the data: bpf_redirect_neigh() and the tunnel take the IP
	 * header to follow Ethernet's, and which subinterface routes it is the
	 * kernel's business */
	if (p->l3 != ETH_HLEN || skb->vlan_present) {
		*reason = R_VLAN;
		return -1;
	}
	return 0;
}

/* The TTL or hop limit less one (the IPv4 header checksum with it), through
 * the skb helpers, which keep a CHECKSUM_COMPLETE skb->csum in step. */
static __always_inline int ttl_down(struct __sk_buff *skb, struct pkt_fields *r)
{
	__u8 ttl = r->ttl - 1;

	if (r->v4) {
		/* TTL and protocol share a 16-bit word of the header checksum */
		__be16 old = bpf_htons(((__u16)r->ttl << 8) | r->l4);
		__be16 new = bpf_htons(((__u16)ttl << 8) | r->l4);

		if (bpf_l3_csum_replace(skb, r->l3 + offsetof(struct iphdr, check), old, new, sizeof(new)) < 0)
			return -1;
		return bpf_skb_store_bytes(skb, r->l3 + offsetof(struct iphdr, ttl), &ttl, 1, 0) < 0 ? -1 : 0;
	}
	/* no checksum covers the hop limit; a CHECKSUM_COMPLETE skb->csum must learn of it */
	return bpf_skb_store_bytes(skb, r->l3 + offsetof(struct ipv6hdr, hop_limit), &ttl, 1,
				   BPF_F_RECOMPUTE_CSUM) < 0 ? -1 : 0;
}

static __always_inline int set_macs_skb(struct __sk_buff *skb, const unsigned char *src, const unsigned char *dst)
{
	if (bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), dst, ETH_ALEN, 0) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_source), src, ETH_ALEN, 0) < 0 ? -1 : 0;
}

static __always_inline void key_of(struct pod_addr *k, struct pkt_fields *r)
{
	if (r->v4) {
		k->a[0] = r->daddr[0];
		k->family = 4;
	} else {
		__builtin_memcpy(k->a, r->daddr, sizeof(k->a));
		k->family = 6;
	}
}

/* --- services ------------------------------------------------------------ */

/* A service's backend for a hash: one of its `count` slots, by the hash (Cilium's
 * selection without Maglev: a change of backends moves flows not yet translated, never
 * one translated already); NULL when it has none of the service's family. The slots
 * cost memory by the entries there are, not by the services there could be. */
static __always_inline struct svc_backend *pick_backend(__u32 id, __u32 count, __u32 hash, __u32 family)
{
	struct svc_slot_key k = {.id = id, .slot = hash % count};
	__u32 *index = svc_slots.lookup(&k);
	struct svc_backend *be;

	if (!index) {  /* the service shrank since its count was read: slot 0 stays while it has any */
		k.slot = 0;
		index = svc_slots.lookup(&k);
	}
	if (!index)
		return NULL;
	be = backends.lookup(index);
	if (!be || be->family != family)
		return NULL;
	return be;
}

static __always_inline void svc_key_of(struct svc_key *k, const __u32 *addr, __be16 port, int l4, int v4)
{
	__builtin_memcpy(k->a, addr, sizeof(k->a));
	if (v4)
		k->a[1] = k->a[2] = k->a[3] = 0;
	k->port = port;
	k->proto = l4;
	k->family = v4 ? 4 : 6;
}

static __always_inline void nat_key_of(struct svc_nat_key *k, const __u32 *saddr, const __u32 *daddr, __be16 sport,
				       __be16 dport, const struct pkt_fields *p, int reply)
{
	__builtin_memcpy(k->saddr, saddr, sizeof(k->saddr));
	__builtin_memcpy(k->daddr, daddr, sizeof(k->daddr));
	k->sport = sport;
	k->dport = dport;
	k->proto = p->l4;
	k->family = p->v4 ? 4 : 6;
	k->reply = reply;
}

/* The destination in place of `to` (address and port), the checksums with it. */
static __always_inline int rewrite_dst(struct __sk_buff *skb, struct pkt_fields *p, const struct svc_nat_val *to)
{
	int failed;

	if (p->v4)
		failed = skb_rewrite_addr4(skb, p, p->l3 + offsetof(struct iphdr, daddr), p->daddr[0], to->a[0]);
	else
		failed = skb_rewrite_addr6(skb, p, p->l3 + offsetof(struct ipv6hdr, daddr), p->daddr, to->a);
	failed = failed || skb_rewrite_port(skb, p, p->sport + sizeof(__be16), p->dport_val, to->port);
	__builtin_memcpy(p->daddr, to->a, sizeof(p->daddr));
	p->dport_val = to->port;
	return failed ? -1 : 0;
}

static __always_inline int rewrite_src(struct __sk_buff *skb, struct pkt_fields *p, const struct svc_nat_val *to)
{
	int failed;

	if (p->v4)
		failed = skb_rewrite_addr4(skb, p, p->l3 + offsetof(struct iphdr, saddr), p->saddr[0], to->a[0]);
	else
		failed = skb_rewrite_addr6(skb, p, p->l3 + offsetof(struct ipv6hdr, saddr), p->saddr, to->a);
	failed = failed || skb_rewrite_port(skb, p, p->sport, p->sport_val, to->port);
	__builtin_memcpy(p->saddr, to->a, sizeof(p->saddr));
	p->sport_val = to->port;
	return failed ? -1 : 0;
}

#define SVC_NONE 0     /* not to a service: route it as it is */
#define SVC_DONE 1     /* translated: route it to the backend */
#define SVC_REFUSED 2  /* a service without a backend of its family: dropped, as Cilium does */
#define SVC_FAILED 3   /* a helper failed half-way: dropped */

/* Per packet, for a socket outside the pods' cgroup: a packet to a service is
 * sent to a backend. The flow's first packet chooses through the Maglev table
 * (on the kernel's flow hash); `nat` keeps the choice, so a flow stays with its
 * backend when the table changes, and the reverse, which deliver() finds on the
 * reply. An entry the LRU evicts lets the next packet choose again. */
static __always_inline int to_service(struct __sk_buff *skb, struct pod_stats *st, struct pkt_fields *p)
{
	struct svc_nat_key fk = {}, rk = {};
	struct svc_nat_val to = {}, back = {};
	struct svc_nat_val *kept;
	struct svc_backend *be;
	struct svc_val *svc;
	struct svc_key k = {};

	if (!p->ports)
		return SVC_NONE;
	svc_key_of(&k, p->daddr, p->dport_val, p->l4, p->v4);
	svc = services.lookup(&k);
	if (!svc)
		return SVC_NONE;
	nat_key_of(&fk, p->saddr, p->daddr, p->sport_val, p->dport_val, p, 0);
	kept = nat.lookup(&fk);
	if (kept) {
		to = *kept;
	} else {
		be = svc->count ? pick_backend(svc->id, svc->count, bpf_get_hash_recalc(skb), k.family) : NULL;
		if (!be)
			return SVC_REFUSED;
		__builtin_memcpy(to.a, be->a, sizeof(to.a));
		to.port = be->port;
		nat.update(&fk, &to);
	}
	/* the reverse, for the replies: written when missing (a new flow's, or one the LRU
	 * let go) or naming another service, not on every packet: a lookup costs no write
	 * to a shared entry. Another service's: a closed flow's, from the same client port
	 * to another service with this backend (a client reuses its ports per destination);
	 * kept, it gave this flow's replies that service's address, and they were lost. */
	__builtin_memcpy(back.a, p->daddr, sizeof(back.a));
	back.port = p->dport_val;
	nat_key_of(&rk, to.a, p->saddr, to.port, p->sport_val, p, 1);
	kept = nat.lookup(&rk);
	if (!kept || kept->port != back.port || kept->a[0] != back.a[0] || kept->a[1] != back.a[1] ||
	    kept->a[2] != back.a[2] || kept->a[3] != back.a[3])
		nat.update(&rk, &back);
	if (rewrite_dst(skb, p, &to) < 0)
		return SVC_FAILED;
	st->to_backend++;
	return SVC_DONE;
}

/* A reply of a per-packet translation, into its client's pod: the service's
 * address and port as its source. -1: a helper failed half-way. */
static __always_inline int from_service(struct __sk_buff *skb, struct pod_stats *st, struct pkt_fields *p)
{
	struct svc_nat_key rk = {};
	struct svc_nat_val *back, was;

	if (!p->ports)
		return 0;
	nat_key_of(&rk, p->saddr, p->daddr, p->sport_val, p->dport_val, p, 1);
	back = nat.lookup(&rk);
	if (!back)
		return 0;
	was = *back;
	if (rewrite_src(skb, p, &was) < 0)
		return -1;
	st->to_client++;
	return 0;
}

/* Into a pod on this node (see the top of the file). */
static __always_inline int deliver(struct __sk_buff *skb, struct pod_stats *st, struct pkt_fields *r, struct pod_ep *ep)
{
	struct pod_ep to = *ep; /* a copy: user space may replace the entry while we write */

	if (r->ttl <= 1)
		return tc_exit(&st->exits, TC_ACT_OK, R_TTL_EXPIRED);
	if (from_service(skb, st, r) < 0 || ttl_down(skb, r) < 0 || set_macs_skb(skb, to.node_mac, to.mac) < 0)
		return tc_exit(&st->exits, TC_ACT_SHOT, R_LOCAL_POD);
	bpf_skb_change_type(skb, PACKET_HOST);
	st->bytes += skb->len;
#ifdef PODS_PLAIN_REDIRECT
	/* the way before bpf_redirect_peer(): out of the pod's veth (its egress), into the pod
	 * through the CPU's backlog queue (TcPods(redirect="plain"): the helper's commit's baseline) */
	return tc_exit(&st->exits, bpf_redirect(to.ifindex, 0), R_LOCAL_POD);
#endif
	return tc_exit(&st->exits, redirect_peer(to.ifindex, 0), R_LOCAL_POD);
}

/* Native routing: the way to another node's pod, from the kernel's FIB. */
static __always_inline int route_remote(struct __sk_buff *skb, struct pod_stats *st, struct pkt_fields *r)
{
	struct bpf_fib_lookup fib = {};
	int rc;

	if (r->ttl <= 1)
		return tc_exit(&st->exits, TC_ACT_OK, R_TTL_EXPIRED);
	fib.ifindex = skb->ingress_ifindex;
	fib.l4_protocol = r->l4;
	/* with tot_len the lookup checks the route's MTU; a GSO skb (GRO on the
	 * way in) leaves as segments that fit: 0 makes it check the skb instead */
	if (!skb->gso_size)
		fib.tot_len = r->tot_len;
	if (r->v4) {
		fib.family = AF_INET;
		fib.tos = r->tos;
		fib.ipv4_src = r->saddr[0];
		fib.ipv4_dst = r->daddr[0];
	} else {
		fib.family = AF_INET6;
		fib.flowinfo = r->flowinfo;
		__builtin_memcpy(fib.ipv6_src, r->saddr, sizeof(fib.ipv6_src));
		__builtin_memcpy(fib.ipv6_dst, r->daddr, sizeof(fib.ipv6_dst));
	}
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return tc_exit(&st->exits, TC_ACT_OK, R_TOO_BIG);
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED)
		return tc_exit(&st->exits, TC_ACT_OK, R_NOT_FORWARDED);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return tc_exit(&st->exits, TC_ACT_OK, R_NO_ROUTE); /* the kernel sends the ICMP error */
	if (ttl_down(skb, r) < 0)
		return tc_exit(&st->exits, TC_ACT_SHOT, R_REMOTE_POD);
	st->bytes += skb->len;
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) /* the route is known; the helper resolves the neighbour */
		return tc_exit(&st->exits, redirect_neigh(fib.ifindex, NULL, 0, 0), R_REMOTE_POD);
	if (set_macs_skb(skb, fib.smac, fib.dmac) < 0)
		return tc_exit(&st->exits, TC_ACT_SHOT, R_REMOTE_POD);
	return tc_exit(&st->exits, bpf_redirect(fib.ifindex, 0), R_REMOTE_POD);
}

/* Tunnel mode: to the node that holds the prefix, through the VXLAN device. */
static __always_inline int tunnel(struct __sk_buff *skb, struct pod_stats *st, struct pkt_fields *r,
				  struct pod_node *node, struct pods_conf *cf)
{
	struct bpf_tunnel_key key = {};
	__u64 flags = 0;

	if (r->ttl <= 1)
		return tc_exit(&st->exits, TC_ACT_OK, R_TTL_EXPIRED);
	if (node->family == 4) {
		key.remote_ipv4 = bpf_ntohl(node->a[0]); /* the helper takes it in host order */
	} else {
		__builtin_memcpy(key.remote_ipv6, node->a, sizeof(key.remote_ipv6));
		flags = TUNINFO_IPV6;
	}
	key.tunnel_id = cf->vni;
	key.tunnel_ttl = PODS_TUNNEL_TTL;
	/* the size every kernel since 4.x takes: a larger struct (BCC's header may have
	 * fields a newer kernel added) is refused by an older one, every frame dropped */
	if (ttl_down(skb, r) < 0 ||
	    bpf_skb_set_tunnel_key(skb, &key, offsetof(struct bpf_tunnel_key, tunnel_label), flags) < 0)
		return tc_exit(&st->exits, TC_ACT_SHOT, R_TUNNELED);
	st->bytes += skb->len;
	return tc_exit(&st->exits, bpf_redirect(cf->tunnel_ifindex, 0), R_TUNNELED);
}

int pods_from_pod(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ingress_ifindex, slot = 0, zero = 0;
	__u32 *own = lxc.lookup(&ifindex);
	struct pod_stats *st;
	struct pods_conf *cf;
	struct pod_addr k = {};
	struct pod_prefix pk = {};
	struct pod_node *node;
	struct pod_ep *ep;
	struct pkt_fields r = {};
	int reason;

	if (own)
		slot = *own & (PODS_SLOTS - 1);
	st = stats.lookup(&slot);
	cf = conf.lookup(&zero);
	if (!st || !cf) /* an array's entries always exist; the verifier wants the check */
		return TC_ACT_OK;
	st->exits.seen++;
	if (read_pkt(skb, &r, &reason) < 0)
		return tc_exit(&st->exits, TC_ACT_OK, reason);
	switch (to_service(skb, st, &r)) {
	case SVC_REFUSED:
		return tc_exit(&st->exits, TC_ACT_SHOT, R_NO_BACKEND);
	case SVC_FAILED:
		return tc_exit(&st->exits, TC_ACT_SHOT, R_TO_BACKEND);
	}
	key_of(&k, &r);
	ep = endpoints.lookup(&k);
	if (ep)
		return deliver(skb, st, &r, ep);
	pk.prefixlen = 32 + (r.v4 ? 32 : 128);
	pk.family = k.family;
	__builtin_memcpy(pk.a, k.a, sizeof(pk.a));
	node = remote.lookup(&pk);
	if (!node)
		return tc_exit(&st->exits, TC_ACT_OK, R_UNMATCHED);
	if (cf->mode == PODS_MODE_TUNNEL) {
		struct pod_node to = *node;

		return tunnel(skb, st, &r, &to, cf);
	}
	return route_remote(skb, st, &r);
}

int pods_from_node(struct __sk_buff *skb)
{
	__u32 slot = 0;
	struct pod_stats *st;
	struct pod_addr k = {};
	struct pod_ep *ep;
	struct pkt_fields r = {};
	int reason;

	if (read_pkt(skb, &r, &reason) < 0) {
		st = stats.lookup(&slot);
		if (!st)
			return TC_ACT_OK;
		st->exits.seen++;
		return tc_exit(&st->exits, TC_ACT_OK, reason);
	}
	key_of(&k, &r);
	ep = endpoints.lookup(&k);
	if (ep)
		slot = ep->slot & (PODS_SLOTS - 1);
	st = stats.lookup(&slot);
	if (!st)
		return TC_ACT_OK;
	st->exits.seen++;
	if (!ep)
		return tc_exit(&st->exits, TC_ACT_OK, R_UNMATCHED);
	return deliver(skb, st, &r, ep);
}


/* --- the cgroup programs: services at connect(), sendmsg(), recvmsg() -------- */

/* A socket's backend, from its cookie through the service's Maglev table. */
static __always_inline int sock_forward(struct bpf_sock_addr *ctx, int v4, int msg)
{
	__u32 zero = 0;
	struct svc_sock_stats *ss = sock_stats.lookup(&zero);
	struct svc_sock_key rk = {};
	struct svc_nat_val back = {};
	struct svc_backend *be, to;
	struct svc_val *svc;
	struct svc_key k = {};
	__u64 cookie;

	if (!ss)
		return 1;
	if (v4) {
		k.a[0] = ctx->user_ip4;
		k.family = 4;
	} else {
		k.a[0] = ctx->user_ip6[0];
		k.a[1] = ctx->user_ip6[1];
		k.a[2] = ctx->user_ip6[2];
		k.a[3] = ctx->user_ip6[3];
		k.family = 6;
	}
	k.port = (__be16)ctx->user_port; /* a 4-byte read: the kernel takes no narrower one of it */
	k.proto = ctx->protocol;
	svc = services.lookup(&k);
	if (!svc)
		return 1;
	cookie = sock_cookie(ctx);
	be = svc->count ? pick_backend(svc->id, svc->count, (__u32)((cookie * 0x9E3779B97F4A7C15ULL) >> 32), k.family)
			 : NULL;
	if (!be) {
		ss->refused++; /* connect() and sendmsg() fail with EPERM */
		return 0;
	}
	to = *be;
	if (k.proto == IPPROTO_UDP) { /* recvmsg() gives the replies' source back as the service */
		rk.cookie = cookie;
		__builtin_memcpy(rk.a, to.a, sizeof(rk.a));
		rk.port = to.port;
		rk.family = k.family;
		__builtin_memcpy(back.a, k.a, sizeof(back.a));
		back.port = k.port;
		sock_rev.update(&rk, &back);
	}
	if (v4) {
		ctx->user_ip4 = to.a[0];
	} else {
		ctx->user_ip6[0] = to.a[0];
		ctx->user_ip6[1] = to.a[1];
		ctx->user_ip6[2] = to.a[2];
		ctx->user_ip6[3] = to.a[3];
	}
	ctx->user_port = (__u32)to.port;
	if (msg)
		ss->sendmsg++;
	else
		ss->connect++;
	return 1;
}

/* A UDP reply from a backend this socket was sent to: its source as the service. */
static __always_inline int sock_reverse(struct bpf_sock_addr *ctx, int v4)
{
	__u32 zero = 0;
	struct svc_sock_stats *ss = sock_stats.lookup(&zero);
	struct svc_sock_key rk = {};
	struct svc_nat_val *back, was;

	if (!ss)
		return 1;
	rk.cookie = sock_cookie(ctx);
	if (v4) {
		rk.a[0] = ctx->user_ip4;
		rk.family = 4;
	} else {
		rk.a[0] = ctx->user_ip6[0];
		rk.a[1] = ctx->user_ip6[1];
		rk.a[2] = ctx->user_ip6[2];
		rk.a[3] = ctx->user_ip6[3];
		rk.family = 6;
	}
	rk.port = (__be16)ctx->user_port;
	back = sock_rev.lookup(&rk);
	if (!back)
		return 1;
	was = *back;
	if (v4) {
		ctx->user_ip4 = was.a[0];
	} else {
		ctx->user_ip6[0] = was.a[0];
		ctx->user_ip6[1] = was.a[1];
		ctx->user_ip6[2] = was.a[2];
		ctx->user_ip6[3] = was.a[3];
	}
	ctx->user_port = (__u32)was.port;
	ss->recvmsg++;
	return 1; /* recvmsg programs may return nothing else */
}

int pods_conn4(struct bpf_sock_addr *ctx) { return sock_forward(ctx, 1, 0); }
int pods_conn6(struct bpf_sock_addr *ctx) { return sock_forward(ctx, 0, 0); }
int pods_send4(struct bpf_sock_addr *ctx) { return sock_forward(ctx, 1, 1); }
int pods_send6(struct bpf_sock_addr *ctx) { return sock_forward(ctx, 0, 1); }
int pods_recv4(struct bpf_sock_addr *ctx) { return sock_reverse(ctx, 1); }
int pods_recv6(struct bpf_sock_addr *ctx) { return sock_reverse(ctx, 0); }
