/* vtap.h — structures the vTAP kernel program and its Python class both read.
 *
 * Python never redeclares these: BCC turns each map's key and value type into a
 * ctypes structure (table.Key / table.Leaf), so the counter names the CLI prints
 * are the field names below, and ebpf/abi.py reads the #defines from this file.
 */
#ifndef VTAP_H
#define VTAP_H

#include "verdict.h"

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
	__u32 pad;
	__u64 cutoff;           /* payload bytes copied per flow and direction (cutoff.h); 0: no cutoff */
	__u64 flow_idle_ns;     /* a flow idle this long starts again from zero */
};

/* The per-flow cutoff's counters (cutoff.h), beside the frames it cut (reason
 * `cut`). Flows evicted from the full table user space works out: made, less
 * ended, less those in the table. */
struct cut_counts {
	__u64 cut_bytes;        /* bytes of the frames cut (what their copies would have been) */
	__u64 ends_copied;      /* SYN, FIN or RST segments copied after their flow's cut */
	__u64 flows_new;        /* entries made */
	__u64 flows_ended;      /* TCP flows forgotten after FINs from both sides or a RST */
	__u64 flows_restarted;  /* flows that started again from zero: idle past the timeout, or a new SYN */
	__u64 uncut_fragment;   /* copied without a flow: IP fragments */
	__u64 uncut_no_ports;   /* ... IP carrying neither TCP nor UDP */
	__u64 uncut_malformed;  /* ... a TCP/UDP header cut short */
};

/* Per-CPU counters, one entry per interface slot. Every frame is counted in
 * fp (verdict.h): seen; verdict pass (not copied) or mirror; and its reason:
 * not_ip, malformed, unmatched (not on the watch-list), sampled_out, mirrored
 * (the copy handed to the kernel) or clone_failed (bpf_clone_redirect refused
 * it). With the mirred action (default) user space moves the action's own
 * refusals out of `mirrored` (ebpf/vtap/mirror_ledger.py). */
struct vtap_stats {
	struct fp_counts exits;
	__u64 cloned_bytes; /* bytes of the copies handed over, Ethernet header included */
	__u64 cloned_segs;  /* the copies in wire packets: a GSO frame (one skb of up to 64 KB,
	                     * seen by egress taps of local TCP and after GRO) counts its
	                     * gso_segs, any other frame 1 */
	__u64 oversize;     /* copies whose IP packet (a GSO frame: each segment's) is longer
	                     * than the monitor's MTU: the kernel fragments or drops those */
	struct cut_counts cut;
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

/* A watch-list entry's value: when a frame first matched it (bpf_ktime_get_ns(),
 * CLOCK_MONOTONIC; 0: not yet). */
struct watch_entry {
	__u64 first_ns;
	__u32 flags;  /* VTAP_W_* */
	__u32 pad;
};

/* watch_entry.flags */
#define VTAP_W_WHOLE 1 /* the host's frames are copied whole, past any per-flow cutoff (an alert's host) */

#endif /* VTAP_H */
