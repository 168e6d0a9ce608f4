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
 * Every program parses a frame with parse_l4() at the end of this file, which
 * walks these to the TCP/UDP ports (or, for the vTAP, to the IP addresses) and
 * says in one return value how far it got. The layout follows xdp-tutorial's
 * common/parsing_helpers.h.
 */
#ifndef PARSING_HELPERS_H
#define PARSING_HELPERS_H

/* uapi in.h and tcp.h include <linux/socket.h>, which on BCC's include path is
 * the kernel's own header, not uapi's: through uio.h and kernel.h it brings most
 * of the kernel's headers into every program, two thirds of a compile's time
 * (1.24 s of clang for the TC vTAP, 0.45 s without it). They use one type of it,
 * __kernel_sa_family_t, which uapi's socket.h has; its guard keeps the rest out.
 * Programs take AF_INET and AF_INET6 from below, not from that header. */
#include <uapi/linux/socket.h>
#ifndef _LINUX_SOCKET_H
#define _LINUX_SOCKET_H
#endif
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/in6.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>

#ifndef AF_INET               /* address families, as bpf_fib_lookup() takes them (the kernel's linux/socket.h) */
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

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

/* --- the whole parse: parse_l4() ------------------------------------------ */

/* What parse_l4() found, each pointer proven inside [data, data_end). */
struct l4_pkt {
	struct ethhdr *eth;
	struct iphdr *iph;    /* when v4 */
	struct ipv6hdr *ip6h; /* when not */
	void *l4hdr;          /* the TCP or UDP header */
	__be16 *sport;
	__be16 *dport;
	__sum16 *l4csum;      /* the TCP or UDP checksum */
	__u8 *tcpflags;       /* TCP's flags byte; NULL for UDP */
	__u32 l4len;          /* the segment's length, as the IP header says (checked where it is used) */
	int l4;               /* IPPROTO_*: what the IP packet carries (a fragment: its first piece's, or -1) */
	int v4;               /* branch on this, not on iph being NULL: the verifier does not take a
	                       * packet pointer to be non-NULL */
	int options;          /* IPv4 options, or IPv6 extension headers before the TCP/UDP header */
};

/* How far parse_l4() got: one return convention for every program. Past
 * PARSE_MALFORMED the IP header is whole (its addresses can be read). */
#define PARSE_OK 0        /* IP, and (with PARSE_L4) a whole TCP or UDP header */
#define PARSE_NOT_IP 1    /* not IPv4 or IPv6 */
#define PARSE_MALFORMED 2 /* the Ethernet or IP header, or IPv6's extension headers, cut short or invalid */
#define PARSE_FRAGMENT 3  /* an IP fragment (l4: what its first piece carries, -1 when not known) */
#define PARSE_OTHER 4     /* IP carrying neither TCP nor UDP (ICMP, ICMPv6, GRE, ...) */
#define PARSE_SHORT_L4 5  /* a TCP or UDP header cut short or invalid */

#define PARSE_L3 0 /* how deep: the IP header (the vTAP matches addresses only) */
#define PARSE_L4 1 /* ... or on to the TCP/UDP ports */

/* Ethernet, up to two VLAN tags, IPv4 with its options or IPv6 with its
 * extension headers, then (depth PARSE_L4) TCP or UDP. `depth` is a constant
 * at every call, so the compiler leaves out what a caller does not ask for. */
static __always_inline int parse_l4(void *data, void *data_end, struct l4_pkt *p, int depth)
{
	struct hdr_cursor nh = {.pos = data};
	struct udphdr *udph;
	struct tcphdr *tcph;
	int proto, l4;

	p->options = 0;
	proto = parse_ethhdr(&nh, data_end, &p->eth);
	if (proto == bpf_htons(ETH_P_IP)) {
		p->v4 = 1;
		l4 = parse_iphdr(&nh, data_end, &p->iph);
		if (l4 < 0)
			return PARSE_MALFORMED;
		if (depth == PARSE_L3)
			return PARSE_OK;
		p->l4 = l4;
		if (ip_is_fragment(p->iph))
			return PARSE_FRAGMENT;
		p->options = p->iph->ihl != 5;
		p->l4len = bpf_ntohs(p->iph->tot_len) - p->iph->ihl * 4;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		p->v4 = 0;
		l4 = parse_ip6hdr(&nh, data_end, &p->ip6h);
		if (l4 < 0)
			return PARSE_MALFORMED;
		if (depth == PARSE_L3)
			return PARSE_OK;
		if (l4 != IPPROTO_TCP && l4 != IPPROTO_UDP) {
			/* extension headers, walked to what they carry (ICMPv6 is not one) */
			int next = skip_ip6hdrext(&nh, data_end, l4);

			if (next < 0)
				return PARSE_MALFORMED;
			if (next == IPPROTO_FRAGMENT) {
				__u8 *carried = nh.pos; /* a fragment header's first byte */

				p->l4 = (void *)(carried + 1) > data_end ? -1 : *carried;
				return PARSE_FRAGMENT;
			}
			p->options = next != l4;
			l4 = next;
		}
		p->l4 = l4;
		/* the payload less the extension headers walked */
		p->l4len = bpf_ntohs(p->ip6h->payload_len) - (int)(nh.pos - (void *)(p->ip6h + 1));
	} else {
		return proto < 0 ? PARSE_MALFORMED : PARSE_NOT_IP;
	}
	p->l4hdr = nh.pos;
	if (l4 == IPPROTO_TCP) {
		if (parse_tcphdr(&nh, data_end, &tcph) < 0)
			return PARSE_SHORT_L4;
		p->sport = &tcph->source;
		p->dport = &tcph->dest;
		p->l4csum = &tcph->check;
		p->tcpflags = (__u8 *)tcph + 13; /* the byte of FIN, SYN, RST, PSH, ACK */
	} else if (l4 == IPPROTO_UDP) {
		if (parse_udphdr(&nh, data_end, &udph) < 0)
			return PARSE_SHORT_L4;
		p->sport = &udph->source;
		p->dport = &udph->dest;
		p->l4csum = &udph->check;
		p->tcpflags = 0;
	} else {
		return PARSE_OTHER;
	}
	return PARSE_OK;
}

#endif /* PARSING_HELPERS_H */
