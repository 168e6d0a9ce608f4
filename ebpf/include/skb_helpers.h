/* skb_helpers.h — header lengths of a frame at the TC hook, read with
 * bpf_skb_load_bytes (which needs no linear data): for the checks of a copy's
 * size, its GSO segments' included, that the vTAP programs make before sending.
 * Only on the rare path of a frame longer than an MTU, so they read byte by byte.
 */
#ifndef SKB_HELPERS_H
#define SKB_HELPERS_H

#include "parsing_helpers.h"

/* Length of the Ethernet header and of the VLAN tags still in the data; *proto
 * gets the ethertype after them. Only for copies longer than the monitor's MTU
 * (rare), so it reads with bpf_skb_load_bytes, which needs no linear data. */
static __always_inline __u32 l2_len(struct __sk_buff *skb, __be16 *proto)
{
	__u32 off = ETH_HLEN;
	__be16 p = 0;

	bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &p, sizeof(p));
#pragma unroll
	for (int i = 0; i < VLAN_MAX_DEPTH; i++) {
		if (!proto_is_vlan(p))
			break;
		if (bpf_skb_load_bytes(skb, off + offsetof(struct vlan_hdr, h_vlan_encapsulated_proto), &p, sizeof(p)) < 0)
			break;
		off += sizeof(struct vlan_hdr);
	}
	*proto = p;
	return off;
}

/* Bytes of IP and TCP/UDP header at `off`: what every segment of a GSO frame
 * repeats. 0 when it cannot tell (then the frame is not called oversize). */
static __always_inline __u32 l34_len(struct __sk_buff *skb, __u32 off, __be16 proto)
{
	__u8 b = 0, l4 = 0;
	__u32 l3;

	if (proto == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, off, &b, 1) < 0)
			return 0;
		l3 = (b & 0x0f) * 4;
		if (bpf_skb_load_bytes(skb, off + offsetof(struct iphdr, protocol), &l4, 1) < 0)
			return 0;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		l3 = sizeof(struct ipv6hdr);
		if (bpf_skb_load_bytes(skb, off + offsetof(struct ipv6hdr, nexthdr), &l4, 1) < 0)
			return 0;
	} else {
		return 0;
	}
	if (l4 == IPPROTO_UDP)
		return l3 + 8;
	if (l4 != IPPROTO_TCP || bpf_skb_load_bytes(skb, off + l3 + 12, &b, 1) < 0)
		return 0;
	return l3 + (b >> 4) * 4; /* TCP data offset, in 32-bit words */
}

#endif /* SKB_HELPERS_H */
