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

/* --- Checksums the sender's offload left to finish ---------------------------
 *
 * A socket that sends through an interface with TX checksum offload (every veth
 * by default) leaves its TCP/UDP checksum to the hardware: the skb is
 * CHECKSUM_PARTIAL and the field holds only the pseudo-header's sum, folded and
 * not inverted (the kernel's ~tcp_v4_check(len, saddr, daddr, 0)). Whoever
 * transmits the skb finishes it: the NIC, skb_checksum_help(), or nobody, when
 * it stays on the machine (a veth hands the skb on with the flag, and the
 * receiving stack trusts it).
 *
 * XDP sees bytes, not the flag. What happens to the flag depends on the way out,
 * measured on veth (kernel 6.x):
 *   native XDP_TX / XDP_REDIRECT  the skb is freed and the frame becomes a new
 *                                 skb with no flag: the receiver verifies the
 *                                 field, and a partial one fails (UDP/TCP
 *                                 InCsumErrors). The program must finish it.
 *   native XDP_PASS, and every    the skb lives on with the flag: the field
 *   verdict in generic mode       must stay a partial sum (of the new
 *                                 addresses), or whoever finishes it later
 *                                 computes a wrong checksum.
 * So a program recognises a partial field (it equals the pseudo-header's sum),
 * keeps it partial while rewriting (an address changes the pseudo-header's sum;
 * a port is not in it), and finishes it over the segment only when the frame
 * leaves on XDP's own path (l4csum_exit()).
 *
 * The one case the bytes cannot tell: a complete checksum that happens to equal
 * the pseudo-header's sum (one frame in 65536 of traffic that arrives with
 * complete checksums). On XDP's own path it is recomputed, which gives the same
 * valid checksum (a frame corrupted in transit and matching by chance would be
 * given a valid one). Kept as an skb, it leaves with a partial sum where a
 * complete one was: a receiver that verifies it (one across a NIC that does
 * not offload) drops that frame. Within one machine (veth, bridge) receivers
 * trust the skb and nothing is lost.
 */

#define CSUM_BLOCK 512     /* bytes summed a step: bpf_csum_diff()'s most */
#define CSUM_MAX_BLOCKS 8  /* a native XDP frame on veth fits in a page */

/* Scratch room for csum_xdp_bytes(): a per-CPU array of one of these, declared
 * in the program's own file (BCC turns map calls into helpers only there). */
struct csum_block {
	__u8 b[CSUM_BLOCK];
};

/* The one's-complement sum of `len` packet bytes from offset `off` (an even
 * distance from where the checksum starts), or -1 when they are not all in the
 * packet. XDP only. The bytes are copied a block at a time into `buf` and summed
 * there: summing them in place would need the verifier to follow a packet
 * pointer through every length the tail can have (tried: it gives up, "program
 * too large"), while a copy is one straight path, and also reads the frags of a
 * multi-buffer frame. */
static __always_inline __s64 csum_xdp_bytes(struct xdp_md *ctx, __u32 off, __u32 len, struct csum_block *buf)
{
	__u64 sum = 0;

	if (len > CSUM_MAX_BLOCKS * CSUM_BLOCK)
		return -1;
	len &= 0xffff; /* a no-op that tells the verifier len is not negative */
	asm volatile("" : "+r"(len));
#pragma unroll
	for (int i = 0; i < CSUM_MAX_BLOCKS; i++) {
		__u64 n = len > CSUM_BLOCK ? CSUM_BLOCK : len, words, rem;

		/* clang may reuse a signed form of n; the barrier and the test give
		 * the verifier a bound it can see */
		asm volatile("" : "+r"(n));
		if (n > CSUM_BLOCK)
			return -1;
		if (!n)
			break;
		if (bpf_xdp_load_bytes(ctx, off, buf->b, n) < 0)
			return -1;
		words = n & ~3ULL; /* bpf_csum_diff() takes whole 4-byte words */
		if (words)
			sum += (__u32)bpf_csum_diff(0, 0, (void *)buf->b, words, 0);
		rem = n & 3;     /* only the last block can end inside a word */
		if (rem) {
			__u8 *b = buf->b + (words & (CSUM_BLOCK - 4)); /* the mask only tells the verifier */

			/* the bytes as the first of 16-bit words whose missing bytes are
			 * zero: in the packet's byte order, [b0, b1] reads b0 | b1 << 8 */
			sum += b[0];
			if (rem > 1)
				sum += (__u32)b[1] << 8;
			if (rem > 2)
				sum += b[2];
		}
		off += n;
		len -= n;
	}
	return csum_fold16(sum);
}

#endif /* CSUM_HELPERS_H */
