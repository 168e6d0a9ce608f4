/* vtap.h — structures the vTAP kernel program and its Python class both read.
 *
 * Python never redeclares these: BCC turns each map's key and value type into a
 * ctypes structure (table.Key / table.Leaf), so the counter names the CLI prints
 * are the field names below, and ebpf/abi.py reads the #defines from this file.
 */
#ifndef VTAP_H
#define VTAP_H

/* config.flags */
#define VTAP_F_MIRROR_ALL 1 /* no watch-list: mirror every frame, parsed or not */

/* Counters per tapped interface: the `stats` array has VTAP_IF_SLOTS entries and
 * a frame counts in slot (ifindex of the device it passes) & (VTAP_IF_SLOTS - 1).
 * User space sums the slots for totals, and tells interfaces that share a slot. */
#define VTAP_IF_SLOTS 256

/* Largest 1-in-N sampling rate: config.sample_rate is a __u32. */
#define VTAP_SAMPLE_MAX 4294967295

/* The one entry of the `config` array map. Written by user space while the
 * program runs, so the watch-list, sampling and monitor change without a reload. */
struct vtap_config {
	__u32 monitor_ifindex;  /* clones leave through this interface (egress) */
	__u32 sample_rate;      /* keep 1 in N matched packets; 0 or 1 keeps all */
	__u32 sample_threshold; /* keep when bpf_get_prandom_u32() < this: 2^32/N,
	                         * computed in user space so the packet path never divides */
	__u32 flags;            /* VTAP_F_* */
	__u32 monitor_mtu;      /* the monitor's MTU, kept current by user space; 0: unknown */
};

/* Per-CPU counters, one entry per interface slot.
 * Invariant: matched == cloned + sampled_out + failed. */
struct vtap_stats {
	__u64 seen;         /* every frame the program ran on */
	__u64 non_ip;       /* not IPv4/IPv6 (ARP, LLDP, ...): a watch-list cannot match it */
	__u64 malformed;    /* IPv4/IPv6 ethertype but headers truncated or invalid */
	__u64 matched;      /* on the watch-list (or every frame, with no watch-list) */
	__u64 sampled_out;  /* matched, but skipped by 1-in-N sampling */
	__u64 cloned;       /* copies sent to the monitor. With the mirred action
	                     * (default), the program counts what it hands over and user
	                     * space moves the action's refusals to `failed` */
	__u64 failed;       /* the copy was refused (monitor gone, or down on the action path;
	                     * no memory). With bpf_clone_redirect a monitor that is only
	                     * down takes the copies and drops them without an error */
	__u64 cloned_bytes; /* bytes of those copies, Ethernet header included */
	__u64 cloned_segs;  /* the copies in wire packets: a GSO frame (one skb of up to 64 KB,
	                     * seen by egress taps of local TCP and after GRO) counts its
	                     * gso_segs, any other frame 1 */
	__u64 oversize;     /* copies whose IP packet (a GSO frame: each segment's) is longer
	                     * than the monitor's MTU: the kernel fragments or drops those */
};

/* Watch-list keys. LPM trie keys start with the prefix length in bits. */
struct watch_v4_key {
	__u32 prefixlen;
	__u32 addr; /* network byte order */
};

struct watch_v6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

#endif /* VTAP_H */
