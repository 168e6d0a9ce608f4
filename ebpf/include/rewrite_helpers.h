/* rewrite_helpers.h — change header fields and keep every checksum valid.
 *
 * Each function writes the new value and updates the checksums that cover it
 * (csum_helpers.h): an IPv4 address is covered by the IPv4 header checksum and
 * by the TCP/UDP pseudo-header; a port only by the TCP/UDP checksum; an IPv6
 * address only by the pseudo-header.
 *
 * The TCP/UDP checksum is described by a struct l4csum, which the caller fills
 * with l4csum_init() right after its parse, before any rewrite: it says where
 * the field and the segment are, whether UDP's rules for 0 apply, and whether
 * the sender's offload left the field partial (csum_helpers.h: only the
 * pseudo-header's sum). A partial field is kept partial while rewriting, and
 * l4csum_exit() finishes it over the segment when the verdict sends the frame
 * out on XDP's own path, where no skb carries the "finish me" flag on.
 * What is true now, measured on veth with TX checksum offload on and off at the
 * sender: every frame the redirect and the load balancer send on carries a
 * checksum its receiver accepts, on XDP_TX, XDP_REDIRECT and XDP_PASS, native
 * and generic, TCP and UDP, IPv4 and IPv6 (tests/test_partial_csum.py).
 */
#ifndef REWRITE_HELPERS_H
#define REWRITE_HELPERS_H

#include "csum_helpers.h"

struct l4csum {
	__sum16 *field; /* the TCP or UDP checksum, proven inside the packet by the parse */
	void *start;    /* the TCP or UDP header */
	__u32 len;      /* the segment's length, from the IP header */
	int udp;        /* UDP's rules: 0 over IPv4 means "no checksum" */
	int partial;    /* the sender's offload finishes it: the field holds the pseudo-header's sum */
};

/* Describe the checksum of a parsed segment; `pseudo` is the sum of its
 * pseudo-header (ipv4_pseudo_sum() or ipv6_pseudo_sum(), as the packet is now). */
static __always_inline void l4csum_init(struct l4csum *c, void *l4, __sum16 *field, int udp, __u32 len,
					__u64 pseudo)
{
	c->field = field;
	c->start = l4;
	c->len = len;
	c->udp = udp;
	/* a folded sum is never 0, so UDP's "no checksum" is never taken for partial */
	c->partial = *field == (__sum16)csum_fold16(pseudo);
}

/* A partial field is a plain sum, not its complement: it is updated as the
 * complement of a checksum would be (csum_replace*() on its inverse). */
static __always_inline void l4_csum_replace4(struct l4csum *c, __be32 from, __be32 to)
{
	if (c->partial) {
		*c->field = ~*c->field;
		csum_replace4(c->field, from, to);
		*c->field = ~*c->field;
	} else if (c->udp) {
		udp_csum_replace4(c->field, from, to);
	} else {
		csum_replace4(c->field, from, to);
	}
}

static __always_inline void l4_csum_replace16(struct l4csum *c, const __be32 *from, const __be32 *to)
{
	if (c->partial) {
		*c->field = ~*c->field;
		csum_replace16(c->field, from, to);
		*c->field = ~*c->field;
	} else if (c->udp) {
		udp_csum_replace16(c->field, from, to);
	} else {
		csum_replace16(c->field, from, to);
	}
}

/* IPv4 destination (or source) address, with the header and L4 checksums. */
static __always_inline void rewrite_ipv4_addr(struct iphdr *iph, __be32 *field, __be32 to, struct l4csum *c)
{
	__be32 from = *field;

	if (from == to)
		return;
	*field = to;
	csum_replace4(&iph->check, from, to);
	l4_csum_replace4(c, from, to);
}

/* IPv6 address: only the pseudo-header covers it. */
static __always_inline void rewrite_ipv6_addr(struct in6_addr *field, const struct in6_addr *to, struct l4csum *c)
{
	struct in6_addr from = *field;

	*field = *to;
	l4_csum_replace16(c, from.in6_u.u6_addr32, to->in6_u.u6_addr32);
}

/* TCP or UDP port. A partial field does not cover the ports yet: whoever
 * finishes it sums them as they are then. */
static __always_inline void rewrite_port(__be16 *field, __be16 to, struct l4csum *c)
{
	__be16 from = *field;

	if (from == to)
		return;
	*field = to;
	if (c->partial)
		return;
	if (c->udp)
		udp_csum_replace2(c->field, from, to);
	else
		csum_replace2(c->field, from, to);
}

/* Finish a partial checksum: the sum of the segment, the field (the
 * pseudo-header's sum) included, inverted, as skb_checksum_help() does.
 * 0, or -1 when the segment is not all inside the packet. */
static __always_inline int l4csum_finish(struct xdp_md *ctx, struct l4csum *c, struct csum_block *buf)
{
	void *data = (void *)(long)ctx->data;
	__s64 sum;

	if (!c->partial)
		return 0;
	if (!buf)
		return -1;
	sum = csum_xdp_bytes(ctx, c->start - data, c->len, buf);
	if (sum < 0)
		return -1;
	*c->field = csum_from_sum(sum);
	if (c->udp && !*c->field)
		*c->field = CSUM_MANGLED_0;
	c->partial = 0;
	return 0;
}

/* At the exit of an XDP program that may have rewritten the frame: a frame that
 * leaves as an skb (XDP_PASS, or any verdict in generic mode: `skb_mode`) keeps
 * its partial sum for whoever finishes it; one that leaves on XDP's own path
 * (native XDP_TX or XDP_REDIRECT) is finished here. `buf` is the program's
 * scratch block (csum_helpers.h). Returns 0, or -1 when it could not be (the
 * caller drops the frame and counts why). */
static __always_inline int l4csum_exit(struct xdp_md *ctx, struct l4csum *c, int action, int skb_mode,
				       struct csum_block *buf)
{
	if (!c->field || !c->partial || skb_mode || (action != XDP_TX && action != XDP_REDIRECT))
		return 0;
	return l4csum_finish(ctx, c, buf);
}

/* Forwarding decrements the TTL, and the header checksum with it: the TTL is
 * the high byte of its 16-bit word, so the word drops by 0x0100 (as the
 * kernel's ip_decrease_ttl()). Returns the new TTL. */
static __always_inline int ip_decrease_ttl(struct iphdr *iph)
{
	__u32 check = (__u32)iph->check;

	check += (__u32)bpf_htons(0x0100);
	iph->check = (__sum16)(check + (check >= 0xFFFF));
	return --iph->ttl;
}

static __always_inline void set_macs(struct ethhdr *eth, const unsigned char *src, const unsigned char *dst)
{
	__builtin_memcpy(eth->h_source, src, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, dst, ETH_ALEN);
}

#endif /* REWRITE_HELPERS_H */
