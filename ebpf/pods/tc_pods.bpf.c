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
#include "tc_pods.h"

#ifndef offsetof
#define offsetof(type, member) __builtin_offsetof(type, member)
#endif

/* As tc_redirect.bpf.c: BCC 0.26's helpers.h declares bpf_redirect_neigh
 * without plen, so its flags would land in plen. */
static long (*redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) =
	(void *)BPF_FUNC_redirect_neigh;
static long (*redirect_peer)(__u32 ifindex, __u64 flags) = (void *)BPF_FUNC_redirect_peer;

/* bpf_skb_set_tunnel_key()'s flag for an IPv6 remote: an enum in uapi bpf.h,
 * which #ifndef cannot see. */
#define TUNINFO_IPV6 (1ULL << 0)

/* Deepest header the routing reads: Ethernet, two VLAN tags, the IP header. */
#define PULL_DEPTH 128

struct pod_stats {
	struct fp_counts exits;   /* first: every verdict and reason (verdict.h) */
	__u64 bytes;              /* of the frames it redirected */
};

BPF_HASH(endpoints, struct pod_addr, struct pod_ep, PODS_MAX);          /* a pod's address -> how to reach it; user space */
BPF_HASH(lxc, __u32, __u32, PODS_MAX);                                  /* host-side veth's ifindex -> its pod's slot; user space */
BPF_LPM_TRIE(remote, struct pod_prefix, struct pod_node, PODS_REMOTE_MAX); /* other nodes' pod prefixes; user space */
BPF_ARRAY(conf, struct pods_conf, 1);                                   /* mode and tunnel; user space */
BPF_PERCPU_ARRAY(stats, struct pod_stats, PODS_SLOTS);                  /* per pod slot; this program */

/* What the routing needs of a frame, read while the packet pointers are valid. */
struct route {
	int v4;
	__u32 l3;                 /* the IP header's offset */
	__u32 saddr[4], daddr[4];
	__u8 ttl, tos, l4;
	__be32 flowinfo;
	__u16 tot_len;            /* the whole IP packet, as the MTU is compared with */
};

static __always_inline int read_route(struct __sk_buff *skb, struct route *r, int *reason)
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
	parsed = parse_l4(data, data_end, &pk, PARSE_L3);
	if (parsed != PARSE_OK) {
		*reason = parse_reason(parsed);
		return -1;
	}
	r->v4 = pk.v4;
	if (pk.v4) {
		r->l3 = (void *)pk.iph - data;
		r->saddr[0] = pk.iph->saddr;
		r->daddr[0] = pk.iph->daddr;
		r->ttl = pk.iph->ttl;
		r->tos = pk.iph->tos;
		r->l4 = pk.iph->protocol;
		r->tot_len = bpf_ntohs(pk.iph->tot_len);
	} else {
		r->l3 = (void *)pk.ip6h - data;
		__builtin_memcpy(r->saddr, &pk.ip6h->saddr, sizeof(r->saddr));
		__builtin_memcpy(r->daddr, &pk.ip6h->daddr, sizeof(r->daddr));
		r->ttl = pk.ip6h->hop_limit;
		r->l4 = pk.ip6h->nexthdr;
		r->flowinfo = *(__be32 *)pk.ip6h & bpf_htonl(0x0FFFFFFF);
		r->tot_len = bpf_ntohs(pk.ip6h->payload_len) + sizeof(*pk.ip6h);
	}
	/* a tag left in the data: bpf_redirect_neigh() and the tunnel take the IP
	 * header to follow Ethernet's, and which subinterface routes it is the
	 * kernel's business */
	if (r->l3 != ETH_HLEN || skb->vlan_present) {
		*reason = R_VLAN;
		return -1;
	}
	return 0;
}

/* The TTL or hop limit less one (the IPv4 header checksum with it), through
 * the skb helpers, which keep a CHECKSUM_COMPLETE skb->csum in step. */
static __always_inline int ttl_down(struct __sk_buff *skb, struct route *r)
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

static __always_inline void key_of(struct pod_addr *k, struct route *r)
{
	if (r->v4) {
		k->a[0] = r->daddr[0];
		k->family = 4;
	} else {
		__builtin_memcpy(k->a, r->daddr, sizeof(k->a));
		k->family = 6;
	}
}

/* Into a pod on this node (see the top of the file). */
static __always_inline int deliver(struct __sk_buff *skb, struct pod_stats *st, struct route *r, struct pod_ep *ep)
{
	struct pod_ep to = *ep; /* a copy: user space may replace the entry while we write */

	if (r->ttl <= 1)
		return tc_exit(&st->exits, TC_ACT_OK, R_TTL_EXPIRED);
	if (ttl_down(skb, r) < 0 || set_macs_skb(skb, to.node_mac, to.mac) < 0)
		return tc_exit(&st->exits, TC_ACT_SHOT, R_LOCAL_POD);
	bpf_skb_change_type(skb, PACKET_HOST);
	st->bytes += skb->len;
	return tc_exit(&st->exits, redirect_peer(to.ifindex, 0), R_LOCAL_POD);
}

/* Native routing: the way to another node's pod, from the kernel's FIB. */
static __always_inline int route_remote(struct __sk_buff *skb, struct pod_stats *st, struct route *r)
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
static __always_inline int tunnel(struct __sk_buff *skb, struct pod_stats *st, struct route *r,
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
	struct route r = {};
	int reason;

	if (own)
		slot = *own & (PODS_SLOTS - 1);
	st = stats.lookup(&slot);
	cf = conf.lookup(&zero);
	if (!st || !cf) /* an array's entries always exist; the verifier wants the check */
		return TC_ACT_OK;
	st->exits.seen++;
	if (read_route(skb, &r, &reason) < 0)
		return tc_exit(&st->exits, TC_ACT_OK, reason);
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
	struct route r = {};
	int reason;

	if (read_route(skb, &r, &reason) < 0) {
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
