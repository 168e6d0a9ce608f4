/* parsing_helpers.h — packet headers read through a cursor, in XDP and TC programs.
 *
 * One parse_*() per header. Each proves the header lies before data_end before
 * it reads a byte of it (the verifier rejects any packet read it cannot prove
 * to be inside [data, data_end)), moves the cursor past it, and returns what
 * comes next, or -1 when the header is truncated or invalid:
 *
 *     struct hdr_cursor nh = { .pos = data };
 *     int proto = parse_ethhdr(&nh, data_end, &eth);     // ethertype, network order
 *     if (proto == bpf_htons(ETH_P_IP))
 *             l4 = parse_iphdr(&nh, data_end, &iph);     // IPPROTO_*, or -1
 *
 * Used by tc_mirror.bpf.c (the vTAP's parser), xdp_redirect.bpf.c and the load
 * balancer. The layout follows xdp-tutorial's common/parsing_helpers.h.
 */
#ifndef PARSING_HELPERS_H
#define PARSING_HELPERS_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/in6.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>

#define VLAN_MAX_DEPTH 2      /* 802.1ad outer + 802.1Q inner (QinQ) */
#define IPV6_EXT_MAX_DEPTH 3  /* extension headers walked before giving up */
#define IP_MF 0x2000          /* IPv4 "more fragments" */
#define IP_OFFSET 0x1FFF      /* IPv4 fragment offset, in 8-byte units */

struct hdr_cursor {
	void *pos;
};

struct vlan_hdr {
	__be16 h_vlan_TCI;
	__be16 h_vlan_encapsulated_proto;
};

static __always_inline int proto_is_vlan(__be16 proto)
{
	return proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD);
}

/* Ethernet, and up to VLAN_MAX_DEPTH tags still in the data (at TC ingress the
 * kernel has usually moved the outer tag into skb->vlan_tci: only the tags in
 * the data are skipped). Returns the ethertype after them, network order. */
static __always_inline int parse_ethhdr(struct hdr_cursor *nh, void *data_end, struct ethhdr **ethhdr)
{
	struct ethhdr *eth = nh->pos;
	__be16 proto;

	if ((void *)(eth + 1) > data_end)
		return -1;
	*ethhdr = eth;
	nh->pos = eth + 1;
	proto = eth->h_proto;

#pragma unroll
	for (int i = 0; i < VLAN_MAX_DEPTH; i++) {
		struct vlan_hdr *vlh = nh->pos;

		if (!proto_is_vlan(proto))
			break;
		/* Each tag is read only after its own four bytes are proven there. */
		if ((void *)(vlh + 1) > data_end)
			return -1;
		proto = vlh->h_vlan_encapsulated_proto;
		nh->pos = vlh + 1;
	}
	return proto;
}

/* IPv4 with its options. Returns the protocol (IPPROTO_*). */
static __always_inline int parse_iphdr(struct hdr_cursor *nh, void *data_end, struct iphdr **iphdr)
{
	struct iphdr *iph = nh->pos;
	int hdrsize;

	/* The fixed 20 bytes first: ihl cannot be read before they are proven. */
	if ((void *)(iph + 1) > data_end)
		return -1;
	if (iph->version != 4 || iph->ihl < 5)
		return -1;
	hdrsize = iph->ihl * 4;
	/* Then the options: ihl says how many, and they must be there too. */
	if (nh->pos + hdrsize > data_end)
		return -1;
	*iphdr = iph;
	nh->pos += hdrsize;
	return iph->protocol;
}

/* A fragment has no port to match but in its first piece, and the first piece
 * may not carry the whole L4 header: programs pass fragments on untouched. */
static __always_inline int ip_is_fragment(struct iphdr *iph)
{
	return (iph->frag_off & bpf_htons(IP_MF | IP_OFFSET)) != 0;
}

/* The fixed IPv6 header. Returns its next header (IPPROTO_*). */
static __always_inline int parse_ip6hdr(struct hdr_cursor *nh, void *data_end, struct ipv6hdr **ip6hdr)
{
	struct ipv6hdr *ip6h = nh->pos;

	if ((void *)(ip6h + 1) > data_end)
		return -1;
	if (ip6h->version != 6)
		return -1;
	*ip6hdr = ip6h;
	nh->pos = ip6h + 1;
	return ip6h->nexthdr;
}

struct ipv6_opt_hdr_min {
	__u8 nexthdr;
	__u8 hdrlen; /* in 8-byte units, not counting the first 8 */
};

/* Past the hop-by-hop, routing and destination-options headers to the upper
 * layer. Returns the upper-layer protocol, IPPROTO_FRAGMENT for a fragment
 * (which the caller leaves alone), or -1 when the chain is truncated or longer
 * than IPV6_EXT_MAX_DEPTH. */
static __always_inline int skip_ip6hdrext(struct hdr_cursor *nh, void *data_end, __u8 next)
{
#pragma unroll
	for (int i = 0; i < IPV6_EXT_MAX_DEPTH; i++) {
		struct ipv6_opt_hdr_min *h = nh->pos;

		if (next != IPPROTO_HOPOPTS && next != IPPROTO_ROUTING && next != IPPROTO_DSTOPTS)
			return next;
		if ((void *)(h + 1) > data_end)
			return -1;
		next = h->nexthdr;
		nh->pos += (h->hdrlen + 1) * 8;
	}
	return next == IPPROTO_HOPOPTS || next == IPPROTO_ROUTING || next == IPPROTO_DSTOPTS ? -1 : next;
}

/* UDP. Returns the payload length the header claims, or -1. */
static __always_inline int parse_udphdr(struct hdr_cursor *nh, void *data_end, struct udphdr **udphdr)
{
	struct udphdr *h = nh->pos;
	int len;

	if ((void *)(h + 1) > data_end)
		return -1;
	len = bpf_ntohs(h->len) - (int)sizeof(*h);
	if (len < 0)
		return -1;
	*udphdr = h;
	nh->pos = h + 1;
	return len;
}

/* TCP with its options. Returns the header's length, or -1. */
static __always_inline int parse_tcphdr(struct hdr_cursor *nh, void *data_end, struct tcphdr **tcphdr)
{
	struct tcphdr *h = nh->pos;
	int len;

	if ((void *)(h + 1) > data_end)
		return -1;
	len = h->doff * 4;
	if (len < (int)sizeof(*h))
		return -1;
	/* The options, as for IPv4: doff says how long, and all of it must be there. */
	if (nh->pos + len > data_end)
		return -1;
	*tcphdr = h;
	nh->pos += len;
	return len;
}

#endif /* PARSING_HELPERS_H */
