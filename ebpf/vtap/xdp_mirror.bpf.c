/* xdp_mirror.bpf.c — the XDP vTAP: on a node that forwards, send every frame
 * whose IPv4/IPv6 source or destination is on a watch-list both to its egress
 * and to a monitor interface, before the kernel builds an skb for it.
 *
 * Kernel: 5.15+ (devmap broadcast, BPF_F_BROADCAST); built and tested on 6.x.
 * Loaded by ebpf/vtap/xdp_mirror.py (class XdpMirror), which passes these -D macros:
 *   VTAP_MATCH_SRC, VTAP_MATCH_DST  0/1: which address(es) to look up
 *   VTAP_WATCH_MAX                  watch-list capacity per address family
 *   VTAP_FLOWS                      the per-flow cutoff's table (cutoff.h); not defined: no cutoff
 *   TP_*                            where the tracepoints' fields are (below)
 *
 * How a watched frame leaves: bpf_fib_lookup() finds its egress and the MACs,
 * the TTL / hop limit drops by one, and one redirect with BPF_F_BROADCAST sends
 * it to every device in a small devmap that holds exactly its egress and the
 * monitor (`pairs`: one such devmap per egress, made by user space). The
 * kernel copies the frame for the first and hands the frame itself to the
 * last: one page copy, no skb, no clone. The monitor gets the frame as the
 * egress does (new MACs, TTL one less): what leaves the node is what is
 * recorded, and one buffer serves both.
 *
 * A TCP/UDP checksum the sender's offload left partial (every veth by default)
 * is finished first (rewrite_helpers.h), in native mode: both copies leave
 * without an skb to carry the "finish me" flag.
 *
 * What it does not take goes to the kernel untouched (XDP_PASS), counted by
 * reason (verdict.h): not watched (unmatched; with VTAP_F_FORWARD_ALL sent to
 * its egress alone when the fast path can), sampled out, and the watched frames
 * a router must handle itself: no neighbour entry yet, TTL <= 1, longer than the
 * egress's or the monitor's MTU, no route, for this node, an egress that cannot
 * take XDP frames, IPv4 options / IPv6 hop-by-hop headers, VLAN tags. The kernel
 * then resolves, answers or refuses them as a router does.
 *
 * What the kernel does with the frames after the redirect it tells the
 * tracepoints, not the program: two tracepoint programs here read them
 * (xdp:xdp_devmap_xmit, xdp:xdp_redirect_err) into the counters (xdp_mirror.h).
 */
#include <uapi/linux/bpf.h>
#include "parsing_helpers.h"
#include "rewrite_helpers.h"
#include "xdp_mirror.h"
#include "watch.h"   /* the watch-list and its match, shared by both hooks */
#ifdef VTAP_FLOWS
#include "cutoff.h"  /* the per-flow cutoff, shared by both hooks */
#endif

#define PAIRS_MAX 256 /* egresses a node can have on the fast path */

BPF_ARRAY(config, struct vtap_config, 1);                              /* monitor, sampling, flags; user space */
BPF_PERCPU_ARRAY(stats, struct xdp_mirror_stats, VTAP_IF_SLOTS);       /* counters per ingress slot */
/* The shape of every inner devmap: slot 0 the egress, slot 1 the monitor. */
BPF_DEVMAP(pair_shape, 2);
/* egress ifindex -> its devmap {egress, monitor}; user space, for every
 * interface that can take XDP frames (a miss: no_xdp_egress) */
BPF_HASH_OF_MAPS(pairs, int, "pair_shape", PAIRS_MAX);
BPF_ARRAY(last_err, __s32, 1);    /* the errno of the last refused redirect; tracepoint */
BPF_ARRAY(prog_self, __u32, 1);   /* this program's id, for the tracepoint to know its errors; user space */
BPF_ARRAY(skb_mode, __u32, 1);    /* 1 in generic mode (BpfProgram._tell_skb_mode); user space */
BPF_PERCPU_ARRAY(csum_scratch, struct csum_block, 1); /* where a partial checksum is finished */

/* A fresh load of the flags at each call (tc_mirror.bpf.c says why a miss
 * reads mirror-all again). */
static __always_inline __u32 flags_now(struct vtap_config *cfg)
{
	return *(volatile __u32 *)&cfg->flags;
}

/* Whether a frame is copied: yes (1), or why not. */
#define COPY_UNMATCHED 0
#define COPY_SAMPLED_OUT (-1)
#define COPY_CUT (-2)

static __always_inline int nocopy_reason(int copy)
{
	return copy == COPY_CUT ? R_CUT : copy == COPY_SAMPLED_OUT ? R_SAMPLED_OUT : R_UNMATCHED;
}

/* The route out, or the reason the kernel must take the frame. */
static __always_inline int route(struct xdp_md *ctx, struct l4_pkt *p, struct bpf_fib_lookup *fib)
{
	int rc;

	fib->ifindex = ctx->ingress_ifindex;
	if (p->v4) {
		if (p->iph->ttl <= 1)
			return R_TTL_EXPIRED;
		fib->family = AF_INET;
		fib->tos = p->iph->tos;
		fib->tot_len = bpf_ntohs(p->iph->tot_len);
		fib->ipv4_src = p->iph->saddr;
		fib->ipv4_dst = p->iph->daddr;
	} else {
		if (p->ip6h->hop_limit <= 1)
			return R_TTL_EXPIRED;
		fib->family = AF_INET6;
		fib->flowinfo = *(__be32 *)p->ip6h & bpf_htonl(0x0FFFFFFF);
		fib->tot_len = bpf_ntohs(p->ip6h->payload_len) + sizeof(struct ipv6hdr);
		__builtin_memcpy(fib->ipv6_src, &p->ip6h->saddr, sizeof(fib->ipv6_src));
		__builtin_memcpy(fib->ipv6_dst, &p->ip6h->daddr, sizeof(fib->ipv6_dst));
	}
	rc = bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS)
		return -1;
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return R_NO_NEIGH;
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return R_TOO_BIG;
	if (rc == BPF_FIB_LKUP_RET_NOT_FWDED) /* the lookup says no more than that */
		return R_NOT_FORWARDED;
	return R_NO_ROUTE; /* blackhole, unreachable, prohibit, forwarding off, unsupported */
}

/* The IP packet is all in the frame, as long as its header says (a frame may
 * be longer: Ethernet's padding). The kernel drops one that is not. */
static __always_inline int ip_whole(struct l4_pkt *p, void *data, void *data_end)
{
	__u64 l3 = p->v4 ? (void *)p->iph - data : (void *)p->ip6h - data;
	__u64 len = p->v4 ? bpf_ntohs(p->iph->tot_len) : sizeof(struct ipv6hdr) + bpf_ntohs(p->ip6h->payload_len);

	return l3 + len <= (__u64)(data_end - data);
}

int xdp_mirror(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0, slot = ctx->ingress_ifindex & (VTAP_IF_SLOTS - 1), *generic;
	struct vtap_config *cfg = config.lookup(&zero);
	struct xdp_mirror_stats *st = stats.lookup(&slot);
	struct bpf_fib_lookup fib = {};
	struct l4_pkt p = {};
	struct l4csum c = {};
	int parsed, why, copy = 1, egress, skb, w = 0;
	void *pair;

	/* Array lookups in range cannot fail; the verifier still wants the check. */
	if (!cfg || !st)
		return XDP_PASS;
	st->exits.seen++;

	parsed = parse_l4(data, data_end, &p, PARSE_L4);
	if (parsed == PARSE_NOT_IP)
		return xdp_exit(&st->exits, XDP_PASS, R_NOT_IP);
	/* An IP packet longer than its frame the kernel drops: so does the count. */
	if (parsed == PARSE_MALFORMED || !ip_whole(&p, data, data_end))
		return xdp_exit(&st->exits, XDP_PASS, R_MALFORMED);
	/* Past here the IP packet is whole: its addresses can be looked up. A miss
	 * reads mirror-all again (tc_mirror.bpf.c says why). */
	if (!(flags_now(cfg) & VTAP_F_MIRROR_ALL)) {
#ifdef VTAP_TEST_RACE_WINDOW
		/* Tests only: widen the moment between the first read of the flag
		 * and the lookup, so that a watch-list change lands in it. The clock,
		 * not prandom: a few times longer per call, and this program's
		 * instruction budget (the verifier walks every turn) allows 1000
		 * turns; with prandom, the mutant that reads the flag once missed
		 * a frame in one run of three, with the clock some 50 in each. */
#pragma clang loop unroll(disable)
		for (int i = 0; i < VTAP_TEST_RACE_WINDOW; i++)
			bpf_ktime_get_ns();
#endif
		w = p.v4 ? watched_v4(p.iph->saddr, p.iph->daddr) : watched_v6(p.ip6h);
		if (!w &&
		    !(flags_now(cfg) & VTAP_F_MIRROR_ALL))
			copy = COPY_UNMATCHED;
	}
#ifdef VTAP_FLOWS
	/* Past its flow's cutoff: not copied (cutoff.h); before sampling, as at TC. */
	if (copy > 0 && !(w & WATCH_WHOLE) && cut_parsed(&p, parsed, data_end - data, *(volatile __u64 *)&cfg->cutoff, cfg->flow_idle_ns,
			       &st->cut) == CUT_CUT)
		copy = COPY_CUT;
#endif
	if (copy > 0 && cfg->sample_rate > 1 && bpf_get_prandom_u32() >= cfg->sample_threshold)
		copy = COPY_SAMPLED_OUT;
	if (copy <= 0 && !(flags_now(cfg) & VTAP_F_FORWARD_ALL))
		return xdp_exit(&st->exits, XDP_PASS, nocopy_reason(copy));

	/* Sent out here: first everything that could send it to the kernel instead. */
	if (proto_is_vlan(p.eth->h_proto))
		why = R_VLAN;
	else if (p.v4 ? p.iph->ihl != 5 : p.ip6h->nexthdr == IPPROTO_HOPOPTS) /* a router reads those */
		why = R_IP_OPTIONS;
	else if (copy > 0 && cfg->monitor_mtu && data_end - data > cfg->monitor_mtu + ETH_HLEN)
		why = R_TOO_BIG;
	else
		why = route(ctx, &p, &fib);
	if (why < 0) {
		egress = fib.ifindex;
		pair = pairs.lookup(&egress);
		if (!pair)
			why = R_NO_XDP_EGRESS;
	}
	if (why >= 0) {
		if (copy <= 0) /* forward all: not copied, and not forwarded either */
			why = nocopy_reason(copy);
		return xdp_exit(&st->exits, XDP_PASS, why);
	}

	/* The packet as a router sends it on. */
	if (parsed == PARSE_OK) {
		if (p.v4)
			l4csum_init(&c, p.l4hdr, p.l4csum, p.l4 == IPPROTO_UDP, p.l4len,
				    ipv4_pseudo_sum(p.iph->saddr, p.iph->daddr, p.l4, p.l4len));
		else
			l4csum_init(&c, p.l4hdr, p.l4csum, p.l4 == IPPROTO_UDP, p.l4len,
				    ipv6_pseudo_sum((__be32 *)&p.ip6h->saddr, (__be32 *)&p.ip6h->daddr, p.l4, p.l4len));
	}
	if (p.v4)
		ip_decrease_ttl(p.iph);
	else
		p.ip6h->hop_limit--;
	set_macs(p.eth, fib.smac, fib.dmac);
	generic = skb_mode.lookup(&zero);
	skb = generic && *generic;
	/* Both copies leave without an skb in native mode: a checksum the sender's
	 * offload left partial is finished now (in generic mode the skb carries it
	 * on). It cannot fail here: the segment was found whole above, and a native
	 * frame fits a page. */
	st->csum_finished += c.partial && !skb;
	if (l4csum_exit(ctx, &c, XDP_REDIRECT, skb, csum_scratch.lookup(&zero)) < 0)
		return xdp_exit(&st->exits, XDP_DROP, R_MALFORMED);
	st->forwarded++;

	if (copy <= 0 || (flags_now(cfg) & VTAP_F_MONITOR_NO_XDP)) { /* to the egress alone */
		st->egress_pending += !skb;
		why = copy > 0 ? R_CLONE_FAILED : nocopy_reason(copy);
		return xdp_exit(&st->exits, bpf_redirect_map(pair, 0, 0), why);
	}
	st->egress_pending += !skb;
	st->monitor_pending += !skb;
	st->cloned_bytes += data_end - data;
	/* to every device in the pair but the one it came in on */
	return fp_exit(&st->exits, V_MIRROR, R_MIRRORED,
		       bpf_redirect_map(pair, 0, BPF_F_BROADCAST | BPF_F_EXCLUDE_INGRESS));
}

/* --- what the kernel did with them: tracepoints --------------------------------
 * A tracepoint program's context is the event's record; its fields' offsets
 * come from the event's format file (user space passes them as TP_*), so no
 * kernel header has to match the running kernel. */
#ifndef TP_XMIT_TO /* as on 6.x */
#define TP_XMIT_FROM 8
#define TP_XMIT_TO 16
#define TP_XMIT_DROPS 20
#define TP_XMIT_SENT 24
#define TP_ERR_PROG 8
#define TP_ERR_IFINDEX 16
#define TP_ERR_ERR 20
#endif

static __always_inline int tp_int(void *ctx, int off)
{
	return *(int *)((char *)ctx + off);
}

/* Take n reported frames off a pending count; the refused among them (d)
 * are added to *dropped. */
static __always_inline void report(__u64 *pending, __u64 *dropped, __u64 n, __u64 d)
{
	if (n > *pending)
		n = *pending;
	if (d > n)
		d = n;
	*pending -= n;
	*dropped += d;
}

/* xdp:xdp_devmap_xmit: a device's queue was transmitted, `sent` taken and
 * `drops` refused; its frames came in on `from`. */
int on_devmap_xmit(void *ctx)
{
	int from = tp_int(ctx, TP_XMIT_FROM), to = tp_int(ctx, TP_XMIT_TO);
	int drops = tp_int(ctx, TP_XMIT_DROPS), sent = tp_int(ctx, TP_XMIT_SENT);
	__u32 zero = 0, in = (__u32)from & (VTAP_IF_SLOTS - 1);
	struct vtap_config *cfg = config.lookup(&zero);
	struct xdp_mirror_stats *st = stats.lookup(&in);

	if (!cfg || !st || sent < 0 || drops < 0)
		return 0;
	if ((__u32)to == cfg->monitor_ifindex) {
		/* none of ours pending for it: this report is another node's */
		if (!(cfg->flags & VTAP_F_MONITOR_NO_XDP))
			report(&st->monitor_pending, &st->monitor_dropped, (__u64)sent + drops, drops);
	}
	else
		report(&st->egress_pending, &st->egress_dropped, (__u64)sent + drops, drops);
	return 0;
}

/* xdp:xdp_redirect_err: a redirect refused outright (the frame is dropped);
 * ours when the program id is ours, counted where the frame came in. */
int on_redirect_err(void *ctx)
{
	__u32 zero = 0, in = (__u32)tp_int(ctx, TP_ERR_IFINDEX) & (VTAP_IF_SLOTS - 1);
	__u32 *self = prog_self.lookup(&zero);
	struct xdp_mirror_stats *st;
	__s32 *err;

	if (!self || !*self || (__u32)tp_int(ctx, TP_ERR_PROG) != *self)
		return 0;
	st = stats.lookup(&in);
	if (st)
		st->redirect_errors++;
	err = last_err.lookup(&zero);
	if (err)
		*err = tp_int(ctx, TP_ERR_ERR);
	return 0;
}
