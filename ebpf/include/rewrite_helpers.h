/* rewrite_helpers.h — change header fields and keep every checksum valid.
 *
 * Each function writes the new value and updates the checksums that cover it
 * (csum_helpers.h): an IPv4 address is covered by the IPv4 header checksum and
 * by the TCP/UDP pseudo-header; a port only by the TCP/UDP checksum; an IPv6
 * address only by the pseudo-header. `l4csum` points at the TCP or UDP checksum
 * field, already proven inside the packet by the caller's parse; `udp` selects
 * UDP's rules for 0 (csum_helpers.h).
 *
 * A packet whose checksum the kernel will finish later (CHECKSUM_PARTIAL: the
 * field then holds the pseudo-header's sum only, and the data is summed at
 * transmit) must not have a port change folded in: programs that rewrite
 * locally sent traffic run where the sender's checksum is complete (the lab
 * turns TX checksum offload off on the senders it controls).
 */
#ifndef REWRITE_HELPERS_H
#define REWRITE_HELPERS_H

#include "csum_helpers.h"

static __always_inline void l4_csum_replace4(__sum16 *l4csum, int udp, __be32 from, __be32 to)
{
	if (udp)
		udp_csum_replace4(l4csum, from, to);
	else
		csum_replace4(l4csum, from, to);
}

static __always_inline void l4_csum_replace2(__sum16 *l4csum, int udp, __be16 from, __be16 to)
{
	if (udp)
		udp_csum_replace2(l4csum, from, to);
	else
		csum_replace2(l4csum, from, to);
}

/* IPv4 destination (or source) address, with the header and L4 checksums. */
static __always_inline void rewrite_ipv4_addr(struct iphdr *iph, __be32 *field, __be32 to, __sum16 *l4csum, int udp)
{
	__be32 from = *field;

	if (from == to)
		return;
	*field = to;
	csum_replace4(&iph->check, from, to);
	l4_csum_replace4(l4csum, udp, from, to);
}

/* IPv6 address: only the pseudo-header covers it. */
static __always_inline void rewrite_ipv6_addr(struct in6_addr *field, const struct in6_addr *to, __sum16 *l4csum,
					      int udp)
{
	struct in6_addr from = *field;

	*field = *to;
	if (udp)
		udp_csum_replace16(l4csum, from.in6_u.u6_addr32, to->in6_u.u6_addr32);
	else
		csum_replace16(l4csum, from.in6_u.u6_addr32, to->in6_u.u6_addr32);
}

/* TCP or UDP port. */
static __always_inline void rewrite_port(__be16 *field, __be16 to, __sum16 *l4csum, int udp)
{
	__be16 from = *field;

	if (from == to)
		return;
	*field = to;
	l4_csum_replace2(l4csum, udp, from, to);
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
