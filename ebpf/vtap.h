/* vtap.h — structures the vTAP kernel program and its Python class both read.
 *
 * Python never redeclares these: BCC turns each map's key and value type into a
 * ctypes structure (table.Key / table.Leaf), so the counter names the CLI prints
 * are the field names below.
 */
#ifndef VTAP_H
#define VTAP_H

/* config.flags */
#define VTAP_F_MIRROR_ALL 1 /* no watch-list: mirror every frame, parsed or not */

/* The one entry of the `config` array map. Written by user space while the
 * program runs, so the watch-list, sampling and monitor change without a reload. */
struct vtap_config {
	__u32 monitor_ifindex;  /* clones leave through this interface (egress) */
	__u32 sample_rate;      /* keep 1 in N matched packets; 0 or 1 keeps all */
	__u32 sample_threshold; /* keep when bpf_get_prandom_u32() < this: 2^32/N,
	                         * computed in user space so the packet path never divides */
	__u32 flags;            /* VTAP_F_* */
};

/* Per-CPU counters, one entry. Invariant: matched == cloned + sampled_out + failed. */
struct vtap_stats {
	__u64 seen;         /* every frame the program ran on */
	__u64 non_ip;       /* not IPv4/IPv6 (ARP, LLDP, ...): a watch-list cannot match it */
	__u64 malformed;    /* IPv4/IPv6 ethertype but headers truncated or invalid */
	__u64 matched;      /* on the watch-list (or every frame, with no watch-list) */
	__u64 sampled_out;  /* matched, but skipped by 1-in-N sampling */
	__u64 cloned;       /* copies handed to the monitor */
	__u64 failed;       /* bpf_clone_redirect() refused (monitor gone, no memory); a monitor
	                     * that is only down drops copies without an error */
	__u64 cloned_bytes; /* bytes of those copies, Ethernet header included */
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
