/* csum_helpers.h — Internet checksums kept valid without recomputing them.
 *
 * A rewrite changes a few 16-bit words of a header; RFC 1624 (eqn. 3) updates
 * its checksum from the old and the new words alone:
 *
 *     HC' = ~(~HC + ~m + m')
 *
 * One's-complement sums do not depend on byte order, so the values go in as
 * the packet holds them (network order) and come out the same way. The TCP and
 * UDP checksums also cover a pseudo-header (RFC 768, RFC 793, RFC 8200 8.1)
 * with both IP addresses: rewriting an address updates the IPv4 header's
 * checksum and the L4 checksum; rewriting a port only the L4 one. IPv6 has no
 * header checksum.
 *
 * UDP over IPv4 may carry no checksum (0): it stays 0. A computed UDP checksum
 * of 0 is sent as 0xFFFF, the other zero of one's complement (RFC 768).
 */
#ifndef CSUM_HELPERS_H
#define CSUM_HELPERS_H

#define CSUM_MANGLED_0 ((__sum16)0xffff)

/* Fold a 32-bit (or wider) one's-complement sum to 16 bits, without inverting. */
static __always_inline __u16 csum_fold16(__u64 sum)
{
#pragma unroll
	for (int i = 0; i < 4; i++)
		sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* The checksum over a sum: its one's complement, folded. */
static __always_inline __sum16 csum_from_sum(__u64 sum)
{
	return (__sum16)~csum_fold16(sum);
}

/* One 16-bit word of the covered data changed from `from` to `to`. */
static __always_inline void csum_replace2(__sum16 *sum, __be16 from, __be16 to)
{
	__u64 s = (__u16)~*sum;

	s += (__u16)~from;
	s += to;
	*sum = (__sum16)~csum_fold16(s);
}

/* A 32-bit word (an IPv4 address) changed: its two halves. */
static __always_inline void csum_replace4(__sum16 *sum, __be32 from, __be32 to)
{
	__u64 s = (__u16)~*sum;

	s += (__u16)~(from >> 16);
	s += (__u16)~(from & 0xffff);
	s += to >> 16;
	s += to & 0xffff;
	*sum = (__sum16)~csum_fold16(s);
}

/* A 16-byte word (an IPv6 address) changed. */
static __always_inline void csum_replace16(__sum16 *sum, const __be32 *from, const __be32 *to)
{
	__u64 s = (__u16)~*sum;

#pragma unroll
	for (int i = 0; i < 4; i++) {
		s += (__u16)~(from[i] >> 16);
		s += (__u16)~(from[i] & 0xffff);
		s += to[i] >> 16;
		s += to[i] & 0xffff;
	}
	*sum = (__sum16)~csum_fold16(s);
}

/* The UDP forms: a checksum of 0 over IPv4 means "none" and stays so, and a
 * result of 0 is sent as 0xFFFF. (Over IPv6 a UDP checksum is never 0.) */
static __always_inline void udp_csum_replace2(__sum16 *sum, __be16 from, __be16 to)
{
	if (!*sum)
		return;
	csum_replace2(sum, from, to);
	if (!*sum)
		*sum = CSUM_MANGLED_0;
}

static __always_inline void udp_csum_replace4(__sum16 *sum, __be32 from, __be32 to)
{
	if (!*sum)
		return;
	csum_replace4(sum, from, to);
	if (!*sum)
		*sum = CSUM_MANGLED_0;
}

static __always_inline void udp_csum_replace16(__sum16 *sum, const __be32 *from, const __be32 *to)
{
	if (!*sum)
		return;
	csum_replace16(sum, from, to);
	if (!*sum)
		*sum = CSUM_MANGLED_0;
}

/* Sum of the IPv4 pseudo-header (addresses, zero, protocol, L4 length), to
 * start a TCP or UDP checksum from: csum_from_sum(pseudo + sum of the segment). */
static __always_inline __u64 ipv4_pseudo_sum(__be32 saddr, __be32 daddr, __u8 proto, __u16 len)
{
	__u64 s = 0;

	s += saddr >> 16;
	s += saddr & 0xffff;
	s += daddr >> 16;
	s += daddr & 0xffff;
	s += bpf_htons(proto);
	s += bpf_htons(len);
	return s;
}

/* Sum of the IPv6 pseudo-header (addresses, 32-bit length, next header). */
static __always_inline __u64 ipv6_pseudo_sum(const __be32 *saddr, const __be32 *daddr, __u8 next, __u32 len)
{
	__u64 s = 0;

#pragma unroll
	for (int i = 0; i < 4; i++) {
		s += saddr[i] >> 16;
		s += saddr[i] & 0xffff;
		s += daddr[i] >> 16;
		s += daddr[i] & 0xffff;
	}
	s += bpf_htonl(len) >> 16;
	s += bpf_htonl(len) & 0xffff;
	s += bpf_htons(next);
	return s;
}

#endif /* CSUM_HELPERS_H */
