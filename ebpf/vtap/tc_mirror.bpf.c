/* tc_mirror.bpf.c — the vTAP: at the TC (clsact) hook, clone every frame whose
 * IPv4/IPv6 source or destination is on a watch-list to a monitor interface.
 *
 * Kernel: 5.7+ (__sk_buff gso_segs and gso_size; LPM trie and bpf_clone_redirect are
 * older); built and tested on 6.x.
 * Loaded by ebpf/vtap/tc_mirror.py (class TcMirror), which passes these -D macros:
 *   VTAP_MATCH_SRC, VTAP_MATCH_DST  0/1: which address(es) to look up
 *   VTAP_WATCH_MAX                  watch-list capacity per address family
 *   VTAP_CLONE_BY_ACTION            1: who makes the copy (below)
 *   VTAP_FLOWS                      the per-flow cutoff's table (cutoff.h); not defined: no cutoff
 *
 * Who makes the copy:
 *  - VTAP_CLONE_BY_ACTION=1 (default): this program is the filter's classifier
 *    (cls_bpf without direct-action) and a tc mirred action attached to the same
 *    filter makes the copy. The program returns VERDICT_MIRROR (-1: "matched, run
 *    the filter's actions") or VERDICT_PASS (0: "no match"); the action's control
 *    is `continue`, so either way the frame goes on to the next filter.
 *  - VTAP_CLONE_BY_ACTION=0: direct-action, and the program copies the frame
 *    itself with bpf_clone_redirect(). That helper must leave the original
 *    writable by the program, so after cloning it un-clones the original
 *    (pskb_expand_head: allocate a new head and copy it, up to a page per frame
 *    on veth). Measured: 40-170 ns/pkt more than the action path at 64 B,
 *    up to 500 ns at larger frames, because the action clones without copying. Kept
 *    for comparison (`vtap --clone helper`, the lab's `ebpf-helper` mirror).
 *
 * The program only observes: the frame always goes on to the next filter on the
 * hook (if any) and is then passed. It never drops, never edits the original,
 * and a frame it cannot parse is counted, not mirrored by a watch-list. It
 * parses with the shared parse_l4() (addresses only: PARSE_L3) and every
 * return goes through fp_exit() (verdict.h), which counts the verdict (pass or
 * mirror) and the reason.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include "parsing_helpers.h"
#include "verdict.h"
#include "skb_helpers.h"
#include "vtap.h"
#include "watch.h"   /* the watch-list and its match, shared by both hooks */
#ifdef VTAP_FLOWS
#include "cutoff.h"  /* the per-flow cutoff, shared by both hooks */
#endif

#ifndef VTAP_CLONE_BY_ACTION
#define VTAP_CLONE_BY_ACTION 1
#endif

#if VTAP_CLONE_BY_ACTION
#define VERDICT_PASS 0      /* classifier: no match, the next filter runs */
#define VERDICT_MIRROR (-1) /* classifier: match, run this filter's mirred action */
#else
#define VERDICT_PASS TC_ACT_UNSPEC
#endif

/* Deepest header we read: Ethernet, two VLAN tags, and an IPv4 header with all
 * its options (60 bytes; IPv6's fixed header is 40). */
#define PARSE_DEPTH (ETH_HLEN + VLAN_MAX_DEPTH * sizeof(struct vlan_hdr) + 60)
/* With a cutoff, on to the TCP header with its options, past IPv6's extension headers. */
#define CUT_DEPTH 256

/* Pull the first `depth` bytes of the frame into its linear data when a driver
 * or GSO left headers in pages. Rare, so one compare is all the common case pays. */
static __always_inline void pull(struct __sk_buff *skb, __u32 depth)
{
	__u32 linear = skb->data_end - skb->data;

	if (linear < depth && skb->len > linear)
		bpf_skb_pull_data(skb, skb->len < depth ? skb->len : depth);
}

BPF_ARRAY(config, struct vtap_config, 1);                              /* monitor, sampling, flags */
BPF_PERCPU_ARRAY(stats, struct vtap_stats, VTAP_IF_SLOTS);             /* counters per interface slot */

#define CLASS_WATCHED (-1)
#define CLASS_WHOLE (-2) /* watched, and a host of it taken whole: past any cutoff (watch.h) */

/* Parse to the IP header (parse_l4, PARSE_L3: extension headers come after
 * the addresses, and ports are not matched), then look the addresses up.
 * Returns the reason a frame is not copied (not_ip, malformed, unmatched: a
 * watch-list can match none of them), or CLASS_* when it is watched. */
static __always_inline int classify(struct __sk_buff *skb)
{
	struct l4_pkt p = {};
	int parsed = parse_l4((void *)(long)skb->data, (void *)(long)skb->data_end, &p, PARSE_L3);
	int w;

	if (parsed != PARSE_OK) /* at PARSE_L3: not_ip or malformed */
		return parse_reason(parsed);
	w = p.v4 ? watched_v4(p.iph->saddr, p.iph->daddr) : watched_v6(p.ip6h);
	if (w)
		return w & WATCH_WHOLE ? CLASS_WHOLE : CLASS_WATCHED;
	return R_UNMATCHED;
}

/* Is the IP packet this copy carries (for a GSO frame: each of its segments)
 * longer than the monitor's MTU? Then the kernel fragments it on the way out (a
 * tunnel) or drops it (veth, most NICs), and the collector sees something else
 * than what passed here. Called only when the frame is longer than the MTU plus
 * an Ethernet header, so frames that fit pay one compare. */
static __always_inline int oversize(struct __sk_buff *skb, __u32 mtu, __u32 segs)
{
	__be16 proto;
	__u32 l2 = l2_len(skb, &proto);

	if (segs > 1) {
		__u32 hdr = l34_len(skb, l2, proto);
		return hdr && hdr + skb->gso_size > mtu;
	}
	return skb->len - l2 > mtu;
}

/* A fresh load of the flag at each call (volatile: the compiler may not reuse
 * an earlier read across the lookups between two calls). */
static __always_inline int mirror_all(struct vtap_config *cfg)
{
	return *(volatile __u32 *)&cfg->flags & VTAP_F_MIRROR_ALL;
}

int tc_mirror(struct __sk_buff *skb)
{
	__u32 zero = 0;
	__u32 slot = skb->ifindex & (VTAP_IF_SLOTS - 1);
	struct vtap_config *cfg = config.lookup(&zero);
	struct vtap_stats *st = stats.lookup(&slot);

	/* Array lookups in range cannot fail; the verifier still wants the check. */
	if (!cfg || !st)
		return VERDICT_PASS;
	st->exits.seen++;

	int why = CLASS_WATCHED;

	if (!mirror_all(cfg)) {
#ifdef VTAP_TEST_RACE_WINDOW
		/* Tests only: widen the moment between the first read of the flag
		 * and the lookup, so that a watch-list change lands in it. */
		for (int i = 0; i < VTAP_TEST_RACE_WINDOW; i++)
			bpf_get_prandom_u32();
#endif
		/* Headers split across pages (GSO, some drivers) are not in the linear
		 * data the parser reads: pull just enough of them. */
		pull(skb, PARSE_DEPTH);

		/* User space switches mirror-all on before it empties the watch-list,
		 * and fills the list before it switches mirror-all off. A frame that
		 * read the flag before the switch and looks up after the emptying
		 * would be missed, though its address was watched all along: so a
		 * miss reads the flag again. Found, or the flag on at either read:
		 * copied. */
		why = classify(skb);
		if (why >= 0 && !mirror_all(cfg))
			return fp_exit(&st->exits, V_PASS, why, VERDICT_PASS);
	}

#ifdef VTAP_FLOWS
	/* Watched: past its flow's cutoff, only the segments that open or end it are
	 * copied (cutoff.h). Before sampling, so that a flow is cut at the same place
	 * in its stream whatever the sampling. */
	__u64 cutoff = *(volatile __u64 *)&cfg->cutoff;
	if (cutoff && why != CLASS_WHOLE) {
		pull(skb, CUT_DEPTH);
		if (cut_frame((void *)(long)skb->data, (void *)(long)skb->data_end, skb->len, cutoff,
			      cfg->flow_idle_ns, &st->cut) == CUT_CUT)
			return fp_exit(&st->exits, V_PASS, R_CUT, VERDICT_PASS);
	}
#endif
	if (cfg->sample_rate > 1 && bpf_get_prandom_u32() >= cfg->sample_threshold)
		return fp_exit(&st->exits, V_PASS, R_SAMPLED_OUT, VERDICT_PASS);

	/* The copy leaves through the monitor's egress; the original is untouched. */
	__u32 segs = skb->gso_segs;
	if (cfg->monitor_mtu && skb->len > cfg->monitor_mtu + ETH_HLEN && oversize(skb, cfg->monitor_mtu, segs))
		st->oversize++;
#if VTAP_CLONE_BY_ACTION
	/* Counted as handed to the action; user space moves the action's own
	 * failures (monitor gone or down) from `mirrored` to `failed`. */
	st->cloned_bytes += skb->len;
	st->cloned_segs += segs > 1 ? segs : 1;
	return fp_exit(&st->exits, V_MIRROR, R_MIRRORED, VERDICT_MIRROR);
#else
	if (bpf_clone_redirect(skb, cfg->monitor_ifindex, 0) < 0)
		return fp_exit(&st->exits, V_PASS, R_CLONE_FAILED, VERDICT_PASS);
	st->cloned_bytes += skb->len;
	st->cloned_segs += segs > 1 ? segs : 1;
	return fp_exit(&st->exits, V_MIRROR, R_MIRRORED, VERDICT_PASS);
#endif
}
