/* skb_rewrite.h — rewriting addresses and ports of a TCP or UDP packet at the
 * TC hook through the skb helpers, which keep every checksum state right (see
 * tc_redirect.bpf.c's header): shared by tc_redirect.bpf.c (a service's
 * destination and its replies' source) and tc_pods.bpf.c (a pod service's, per
 * packet). The caller fills a struct pkt_fields from the headers while its
 * packet pointers are valid, then rewrites through the offsets it holds.
 */
#ifndef SKB_REWRITE_H
#define SKB_REWRITE_H

#include "parsing_helpers.h"

#ifndef EINVAL
#define EINVAL 22
#endif
#ifndef offsetof
#define offsetof(type, member) __builtin_offsetof(type, member)
#endif

/* bpf_l4_csum_replace()'s BPF_F_IPV6 (1 << 7): an enum in uapi bpf.h, which
 * #ifndef cannot see, and missing from the bpf.h BCC 0.26 compiles with. It
 * tells the helper that an IPv6 address change and the L4 checksum change
 * cancel in a CHECKSUM_COMPLETE skb->csum (there is no IPv6 header checksum
 * to take up the address change, as IPv4's does). */
#define L4_CSUM_F_IPV6 (1ULL << 7)

/* What the rewrite and the forward need, taken from the headers while the
 * packet pointers are valid: every helper that writes the packet invalidates
 * all of them (the verifier forgets every bound it proved), so after the first
 * write the program works from these offsets and copies only. Offsets count
 * from skb->data, which at the TC hook is the Ethernet header. */
struct pkt_fields {
	__u32 l3;      /* the IP header */
	__u32 csum;    /* the TCP or UDP checksum field */
	__u32 sport;   /* the source port field (the destination port follows it) */
	__u32 saddr[4];
	__u32 daddr[4];
	__be16 sport_val;
	__be16 dport_val;
	__u16 tot_len; /* IPv4 total length, or IPv6 payload length + 40 */
	__u8 ttl;      /* or hop limit */
	__u8 tos;
	__be32 flowinfo;
	int v4;
	int udp;
	int l4;
	int no_l4_csum; /* UDP sent without a checksum (0): see store_flags() */
	int ports;      /* a whole TCP or UDP header: csum, sport and the port values hold */
};

/* UDP's checksum rules for the helper: a checksum of 0 (IPv4: none) stays 0,
 * and an update that computes 0 writes 0xFFFF, its other form (RFC 768). */
static __always_inline __u64 l4_flags(const struct pkt_fields *p)
{
	return p->udp ? BPF_F_MARK_MANGLED_0 : 0;
}

/* bpf_skb_store_bytes()'s flags for a field the L4 checksum covers. A change
 * that some checksum in the packet takes up (a port, and the L4 checksum's
 * change) leaves a CHECKSUM_COMPLETE skb->csum as it is: flags 0. A UDP
 * datagram without a checksum has nothing to take it up, so skb->csum must
 * learn of the change itself (BPF_F_RECOMPUTE_CSUM). Found with
 * BPF_PROG_TEST_RUN's CHECKSUM_COMPLETE check (tests/test_tc_redirect.py). */
static __always_inline __u64 store_flags(const struct pkt_fields *p)
{
	return p->no_l4_csum ? BPF_F_RECOMPUTE_CSUM : 0;
}

/* An IPv4 address: the L4 checksum through its pseudo-header, the header
 * checksum, then the field. A helper that fails (no memory to un-clone the
 * skb) fails the rewrite, and tc_redirect() drops the packet. */
static __always_inline int skb_rewrite_addr4(struct __sk_buff *skb, const struct pkt_fields *p, __u32 field, __be32 from,
					 __be32 to)
{
	/* nothing to write; and an update by no difference could still turn a
	 * checksum of 0xFFFF into 0 (one value in one's complement, not one byte
	 * string: the fixtures compare bytes) */
	if (from == to)
		return 0;
	if (bpf_l4_csum_replace(skb, p->csum, from, to, BPF_F_PSEUDO_HDR | sizeof(to) | l4_flags(p)) < 0)
		return -1;
	if (bpf_l3_csum_replace(skb, p->l3 + offsetof(struct iphdr, check), from, to, sizeof(to)) < 0)
		return -1;
	/* flags 0: the address and the header checksum change cancel in a
	 * CHECKSUM_COMPLETE skb->csum; the L4 helper accounted for its own change */
	return bpf_skb_store_bytes(skb, field, &to, sizeof(to), 0) < 0 ? -1 : 0;
}

/* An IPv6 address: only the pseudo-header covers it. The helper takes a
 * 16-byte change as a checksum difference (size 0 in the flags). */
static __always_inline int skb_rewrite_addr6(struct __sk_buff *skb, const struct pkt_fields *p, __u32 field,
					 const __u32 *from, const __u32 *to)
{
	__u32 old[4], new[4], diff;
	long rc;

	__builtin_memcpy(old, from, sizeof(old));
	__builtin_memcpy(new, to, sizeof(new));
	/* word by word: clang would make a memcmp() call of __builtin_memcmp */
	if (!((old[0] ^ new[0]) | (old[1] ^ new[1]) | (old[2] ^ new[2]) | (old[3] ^ new[3])))
		return 0;
	/* A 32-bit sum (BCC declares it int: a sum from 2^31 up would look like
	 * an error). It cannot fail: both sizes are multiples of 4, below 512. */
	diff = bpf_csum_diff(old, sizeof(old), new, sizeof(new), 0);
	rc = bpf_l4_csum_replace(skb, p->csum, 0, diff, BPF_F_PSEUDO_HDR | L4_CSUM_F_IPV6 | l4_flags(p));
	if (rc == -EINVAL) /* a kernel without BPF_F_IPV6: the field comes out right, only a
			    * CHECKSUM_COMPLETE skb->csum is then off (the kernel's own bug) */
		rc = bpf_l4_csum_replace(skb, p->csum, 0, diff, BPF_F_PSEUDO_HDR | l4_flags(p));
	if (rc < 0)
		return -1;
	return bpf_skb_store_bytes(skb, field, new, sizeof(new), store_flags(p)) < 0 ? -1 : 0;
}

/* A TCP or UDP port: the L4 checksum covers it, not the pseudo-header (so a
 * CHECKSUM_PARTIAL field, which holds the pseudo-header's sum only, is left
 * alone by the helper: the port is summed at transmit). */
static __always_inline int skb_rewrite_port(struct __sk_buff *skb, const struct pkt_fields *p, __u32 field, __be16 from,
					__be16 to)
{
	if (from == to)
		return 0;
	if (bpf_l4_csum_replace(skb, p->csum, from, to, sizeof(to) | l4_flags(p)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, field, &to, sizeof(to), store_flags(p)) < 0 ? -1 : 0;
}

#endif /* SKB_REWRITE_H */
