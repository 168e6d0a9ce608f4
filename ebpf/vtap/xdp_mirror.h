/* xdp_mirror.h — what the XDP vTAP (xdp_mirror.bpf.c) and its Python class
 * (xdp_mirror.py) both read, beside what it shares with the TC vTAP (vtap.h:
 * the config entry, the watch-list keys, the interface slots).
 *
 * Python never redeclares these: BCC turns each map's key and value type into a
 * ctypes structure, and ebpf/abi.py reads the #defines from this file.
 */
#ifndef XDP_MIRROR_H
#define XDP_MIRROR_H

#include "vtap.h"

/* config.flags, beside VTAP_F_MIRROR_ALL */
#define VTAP_F_FORWARD_ALL 2 /* forward what is not copied on the fast path too (else the kernel's) */
#define VTAP_F_MONITOR_NO_XDP 4 /* the monitor takes no XDP frames now (user space asks the kernel each
                                 * interval): a watched frame goes to its egress alone, its copy failed */

/* Per-CPU counters, one entry per ingress interface slot (vtap.h). Every frame
 * is counted in fp (verdict.h): seen; its verdict: mirror (sent to the egress
 * and to the monitor), redirect (to the egress alone: forward all), pass (to
 * the kernel, untouched); and its reason: mirrored, clone_failed (the monitor
 * takes no XDP frames: sent to the egress alone), sampled_out, unmatched,
 * not_ip, malformed, or why a watched frame went to the kernel instead (no_neigh,
 * ttl_expired, too_big, no_route, not_forwarded, no_xdp_egress, ip_options, vlan).
 *
 * What became of a frame after the redirect the kernel tells tracepoints, not
 * the program. In native mode the frames wait in a per-CPU queue per device
 * until the end of the receive poll, and the xdp:xdp_devmap_xmit tracepoint
 * then says how many of a queue's frames the device took. The *_pending
 * counters tie those reports to our frames: the program adds the frames it
 * hands over, the tracepoint takes the reported ones off, on the same CPU
 * within one poll; so a report about another namespace's device that happens
 * to have the same index finds nothing pending and is not counted. What stays
 * pending after the poll was never queued: the kernel skips, without a word,
 * a device that cannot take XDP frames (a veth whose peer runs no XDP
 * program). Generic mode sends each frame as an skb at once and reports no
 * queue: there only refused redirects are counted. */
struct xdp_mirror_stats {
	struct fp_counts exits;
	__u64 cloned_bytes;    /* bytes of the frames sent to both, Ethernet header included */
	__u64 forwarded;       /* frames sent to their egress on the fast path (mirror + redirect) */
	__u64 csum_finished;   /* of those, TCP/UDP checksums the sender's offload left partial
	                        * (csum_helpers.h), finished by the program */
	__u64 monitor_pending; /* copies handed to the monitor's queue, not reported yet */
	__u64 monitor_dropped; /* copies the monitor's driver refused */
	__u64 egress_pending;  /* frames handed to an egress's queue, not reported yet */
	__u64 egress_dropped;  /* frames an egress's driver refused: the receiver never got them */
	__u64 redirect_errors; /* redirects the kernel refused outright: frame and copy lost */
	struct cut_counts cut; /* the per-flow cutoff's (vtap.h, cutoff.h) */
};

#endif /* XDP_MIRROR_H */
