/* xdp_redirect.h — what the redirect programs (xdp_redirect.bpf.c, and its TC
 * twin tc_redirect.bpf.c) and their Python classes both read.
 *
 * Python never redeclares these: BCC turns each map's key and value type into a
 * ctypes structure, and ebpf/abi.py reads the #defines from this file.
 */
#ifndef XDP_REDIRECT_H
#define XDP_REDIRECT_H

#include "verdict.h"

#define REDIRECT_MAX_RULES 1024    /* rules (and so reply mappings) per program */
#define REDIRECT_EGRESS_SLOTS 4096 /* interfaces `forward` can send out of: ifindex below this */

#define REDIRECT_ACTION_PASS 0    /* rewrite, then the kernel routes it (XDP_PASS) */
#define REDIRECT_ACTION_FORWARD 1 /* rewrite, look the route up, send it out ourselves */

/* A service (or, in `replies`, a backend): protocol, address and port.
 * IPv4 addresses sit in addr[0], the rest zero; all in network byte order. */
struct redirect_key {
	__u32 addr[4];
	__be16 port;
	__u8 proto;  /* IPPROTO_UDP or IPPROTO_TCP */
	__u8 family; /* 4 or 6 */
};

/* Where a service's datagrams go (in `rules`), or which service a backend's
 * replies must appear to come from (in `replies`). */
struct redirect_target {
	__u32 addr[4];
	__be16 port;
	__u16 rule; /* index into rule_stats, given by user space */
};

/* Per rule, per CPU. */
struct rule_stats {
	__u64 packets;       /* sent on to the backend */
	__u64 bytes;
	__u64 reply_packets; /* replies given the service's address back */
	__u64 reply_bytes;
};

/* Per CPU, one entry. Every frame is counted in fp (verdict.h): seen; its
 * verdict (pass, redirect, drop, aborted; the TC program's TC_ACT_OK,
 * TC_ACT_REDIRECT and TC_ACT_SHOT under the same names); and its reason:
 * to_backend, to_client (rewritten), or not_ip, unmatched, fragment,
 * malformed (untouched, or dropped when the segment the IP header claims is
 * not all in the frame). Beside them: */
struct redirect_stats {
	struct fp_counts exits;
	/* forward: rewritten, but left to the kernel (verdict pass), by reason */
	__u64 slow_no_neigh; /* the next hop's MAC is not known yet: the kernel resolves it */
	__u64 slow_ttl;      /* TTL / hop limit <= 1: the kernel sends the ICMP error */
	__u64 slow_too_big;  /* larger than the egress MTU: the kernel fragments or says so */
	__u64 slow_no_route; /* no route, or one the fast path cannot take */
	__u64 csum_partial;  /* rewritten frames whose TCP/UDP checksum the sender's offload
	                      * left partial (rewrite_helpers.h): kept so for an skb,
	                      * finished by the program for XDP_TX / XDP_REDIRECT */
};

#endif /* XDP_REDIRECT_H */
