/* tc_sessions.bpf.c — vTAP sessions: ordered L4 rules choose which frames each
 * session copies; each copy is truncated, sampled and sent to the session's
 * target, a local interface or a tunnel to a collector elsewhere.
 *
 * Kernel: 5.10+ (bpf_redirect_neigh, bpf_skb_adjust_room's encapsulation
 * flags); built and tested on 6.x. Loaded by ebpf/vtap/sessions/tc_sessions.py (class
 * SessionMirror), the tables written by ebpf/vtap/sessions/tables.py.
 *
 * Two programs, one set of maps:
 *
 *  tap_ingress / tap_egress   on every tapped hook, a classifier (cls_bpf
 *      without direct-action) whose filter carries a tc mirred action to the
 *      sender device. It classifies (sessions.h: six lookups, bitmaps ANDed,
 *      the first rule of each session decides), samples per session, and for
 *      a frame some session takes writes the sessions in skb->cb[0] and returns
 *      -1: the action makes the one copy (a clone that shares the data, the
 *      cheapest the kernel has), the original goes on untouched.
 *
 *  sender   direct-action on the egress of the sender device (an ifb the class
 *      creates; nothing ever leaves through it). A copy for several sessions is
 *      cloned back to this same hook once per session but the last
 *      (bpf_clone_redirect to our own device: each session gets its own skb to
 *      cut and wrap). Then, per session: cut to its length (bpf_skb_change_tail;
 *      the IP and L4 length fields keep what the wire said, as pcap's snaplen
 *      and ERSPAN do), and either redirect to the local target, or push the
 *      tunnel headers user space built (bpf_skb_adjust_room), fill in what
 *      changes per copy (lengths, checksums, sequence, timestamp, truncation
 *      bit) and send with bpf_redirect_neigh(): the kernel routes the outer
 *      packet and resolves its next hop. A copy longer than the path's MTU is
 *      cut to fit (session fit) or counted oversize and not sent: never
 *      fragmented.
 *
 * Why the program builds the tunnel headers rather than handing copies to the
 * kernel's metadata-mode tunnel devices: a kernel may lack them (this lab's
 * has only VXLAN's), a namespace holds one collect-metadata VXLAN device per
 * UDP port (a second vTAP, or the user's own VTEP, could not have one), and
 * those devices fragment or answer with ICMP what does not fit, where a copy
 * must be counted instead.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include "parsing_helpers.h"
#include "verdict.h"
#include "skb_helpers.h"
#include "sessions.h"
#ifdef VTAP_FLOWS
#include "../cutoff.h"  /* the per-flow cutoff, shared with the vTAP at either hook */
#endif

/* The kernel's four-argument form (params, plen, flags); BCC's headers may
 * declare an early draft with three, which leaves the flags undefined. */
static long (*redirect_neigh)(__u32 ifindex, void *params, int plen, __u64 flags) =
	(void *)BPF_FUNC_redirect_neigh;

#define VERDICT_PASS 0      /* classifier: copied by no session, the next filter runs */
#define VERDICT_MIRROR (-1) /* classifier: run this filter's mirred action (to the sender) */

/* Ethernet, two VLAN tags, IPv6 and a chain of extension headers, TCP: pulled
 * into the linear data when a driver left headers in pages. */
#define PARSE_DEPTH 256

BPF_ARRAY(config, struct sess_config, 1);
BPF_ARRAY(dir_bits, struct sess_bits, SESS_GENS * 2);
BPF_ARRAY(proto_bits, struct sess_bits, SESS_GENS * 256);
BPF_ARRAY(sport_bits, struct sess_bits, SESS_GENS * SESS_PORT_SLOTS);
BPF_ARRAY(dport_bits, struct sess_bits, SESS_GENS * SESS_PORT_SLOTS);
BPF_F_TABLE("lpm_trie", struct sess_lpm4_key, struct sess_bits, lpm4, SESS_GENS * 2 * (SESS_RULES_MAX + 1), BPF_F_NO_PREALLOC);
BPF_F_TABLE("lpm_trie", struct sess_lpm6_key, struct sess_bits, lpm6, SESS_GENS * 2 * (SESS_RULES_MAX + 1), BPF_F_NO_PREALLOC);
BPF_ARRAY(rules, struct sess_rule, SESS_GENS * SESS_RULES_MAX);
BPF_ARRAY(sessions, struct sess_session, SESS_GENS * SESS_MAX);
BPF_ARRAY(cut_bits, struct sess_bits, SESS_GENS);  /* per generation: the rules of the sessions with a cutoff */
BPF_PERCPU_ARRAY(cut_scratch, __u64, 1);           /* a flow's count on its way to decide() (see there) */
BPF_PERCPU_ARRAY(rule_hits, __u64, SESS_GENS * SESS_RULES_MAX);
BPF_ARRAY(rule_first, __u64, SESS_GENS * SESS_RULES_MAX);  /* a whole rule's first frame taken (ns, monotonic) */
BPF_PERCPU_ARRAY(sess_stats, struct sess_stats, SESS_GENS * SESS_MAX);
BPF_PERCPU_ARRAY(stats, struct sess_if_stats, SESS_IF_SLOTS);
/* GRE sequence numbers (ERSPAN), per session. A lock rather than an atomic
 * add: BCC's compiler emits no fetch-and-add whose result is used. */
struct sess_seq {
	struct bpf_spin_lock lock;
	__u32 next;
};
BPF_ARRAY(seq, struct sess_seq, SESS_GENS * SESS_MAX);

static __always_inline void and_bits(struct sess_bits *x, struct sess_bits *b)
{
#pragma unroll
	for (int i = 0; i < SESS_WORDS; i++)
		x->w[i] &= b->w[i];
}

/* Index of the lowest set bit of a non-zero word (BPF has no such instruction). */
static __always_inline __u32 ctz64(__u64 x)
{
	__u32 n = 0;

	if (!(x & 0xffffffffULL)) { n += 32; x >>= 32; }
	if (!(x & 0xffff)) { n += 16; x >>= 16; }
	if (!(x & 0xff)) { n += 8; x >>= 8; }
	if (!(x & 0xf)) { n += 4; x >>= 4; }
	if (!(x & 0x3)) { n += 2; x >>= 2; }
	if (!(x & 0x1)) { n += 1; }
	return n;
}

/* The lowest set bit of the bitmap, or -1 when it is empty. */
static __always_inline int first_bit(struct sess_bits *x)
{
#pragma unroll
	for (int i = 0; i < SESS_WORDS; i++)
		if (x->w[i])
			return i * 64 + ctz64(x->w[i]);
	return -1;
}

static __always_inline int lookup_addr(struct l4_pkt *p, __u32 gen, struct sess_bits *x)
{
	struct sess_bits *b;

	if (p->v4) {
		struct sess_lpm4_key k = {.prefixlen = 16 + 32, .gen = gen};

		__builtin_memcpy(k.addr, &p->iph->saddr, 4);
		b = lpm4.lookup(&k);
		if (!b)
			return 0;
		and_bits(x, b);
		k.side = 1;
		__builtin_memcpy(k.addr, &p->iph->daddr, 4);
		b = lpm4.lookup(&k);
	} else {
		struct sess_lpm6_key k = {.prefixlen = 16 + 128, .gen = gen};

		__builtin_memcpy(k.addr, &p->ip6h->saddr, 16);
		b = lpm6.lookup(&k);
		if (!b)
			return 0;
		and_bits(x, b);
		k.side = 1;
		__builtin_memcpy(k.addr, &p->ip6h->daddr, 16);
		b = lpm6.lookup(&k);
	}
	if (!b)
		return 0;
	and_bits(x, b);
	return 1;
}

/* The rules a frame matches, as a bitmap; 0 when none can. */
static __always_inline int classify(struct l4_pkt *p, int parsed, __u32 gen, __u32 dir, struct sess_bits *x)
{
	__u32 k = gen * 2 + dir;
	struct sess_bits *b = dir_bits.lookup(&k);

	if (!b)
		return 0;
	*x = *b;
	/* A fragment (every piece, first or not) has no ports to match: all the
	 * pieces of a datagram are matched alike, by addresses and protocol,
	 * as a frame without ports is. l4 is -1 when an IPv6 fragment header
	 * is cut short: then only rules for any protocol can match it. */
	int proto = parsed == PARSE_OK || parsed == PARSE_OTHER || parsed == PARSE_FRAGMENT ? p->l4 : -1;
	if (proto >= 0) {
		k = gen * 256 + (proto & 0xff);
		b = proto_bits.lookup(&k);
		if (!b)
			return 0;
		and_bits(x, b);
	} else {
		k = gen * 256 + 255; /* IANA "reserved": user space puts the any-protocol rules there */
		b = proto_bits.lookup(&k);
		if (!b)
			return 0;
		and_bits(x, b);
	}
	if (!lookup_addr(p, gen, x))
		return 0;
	__u32 sport = SESS_NO_PORT, dport = SESS_NO_PORT;
	if (parsed == PARSE_OK) {
		sport = bpf_ntohs(*p->sport);
		dport = bpf_ntohs(*p->dport);
	}
	k = gen * SESS_PORT_SLOTS + sport;
	b = sport_bits.lookup(&k);
	if (!b)
		return 0;
	and_bits(x, b);
	k = gen * SESS_PORT_SLOTS + dport;
	b = dport_bits.lookup(&k);
	if (!b)
		return 0;
	and_bits(x, b);
	return 1;
}

/* The sessions that take the frame, as a mask of session slots: for each
 * session with a matching rule, its first one decides; an accepted frame is
 * then sampled, and a session whose target an earlier one already gets it
 * gives way. */
/* What the cutoff knows of a frame for decide(): its flow's bytes in this
 * direction before it, 0 when it has no flow or opens or ends one (a SYN, FIN
 * or RST always goes: cutoff.h), and its length. One compare per session in the
 * loop: more branches there multiplied the paths the verifier walks past its limit. */
struct cut_info {
	__u64 before;
	__u64 len;
};

static __always_inline __u32 decide(struct sess_bits *x, __u32 gen, struct cut_info *ci)
{
	__u32 take = 0, shadow = 0;

	/* a bounded loop, not unrolled: sixteen copies of this body made the
	 * program slow to compile and no faster to run */
	for (int i = 0; i < SESS_MAX; i++) {
		int bit = first_bit(x);
		if (bit < 0)
			break;
		__u32 rk = gen * SESS_RULES_MAX + (bit & (SESS_RULES_MAX - 1));
		struct sess_rule *r = rules.lookup(&rk);
		__u64 *hits = rule_hits.lookup(&rk);
		if (!r || !hits)
			break;
		(*hits)++;
		__u32 sk = gen * SESS_MAX + (r->session & (SESS_MAX - 1));
		struct sess_session *s = sessions.lookup(&sk);
		struct sess_stats *st = sess_stats.lookup(&sk);
		if (!s || !st)
			break;
		/* this session is decided: none of its other rules count */
#pragma unroll
		for (int w = 0; w < SESS_WORDS; w++)
			x->w[w] &= ~s->rules.w[w];
		if (!r->accept) {
			st->rejected++;
			continue;
		}
		st->accepted++;
		__u32 me = 1U << (r->session & (SESS_MAX - 1));
		if (shadow & me) {
			st->shadowed++;
			continue;
		}
		if (s->sample_rate > 1 && bpf_get_prandom_u32() >= s->sample_threshold) {
			st->sampled_out++;
			continue;
		}
		/* past this session's cutoff: only what opens or ends the flow (cutoff.h); a
		 * held host's rule (whole) takes all of it */
		if (s->cutoff && ci->before >= s->cutoff && !r->whole) {
			st->cut++;
			st->cut_bytes += ci->len;
			continue;
		}
		st->handed++;
		take |= me;
		shadow |= s->shadow;
		if (r->whole) {  /* the host's wait ends with its first frame taken (steer.py) */
			__u64 *first = rule_first.lookup(&rk);
			if (first && !*first)
				*first = bpf_ktime_get_ns();
		}
	}
	return take;
}

static __always_inline int tap(struct __sk_buff *skb, __u32 dir)
{
	__u32 zero = 0;
	__u32 slot = skb->ifindex & (SESS_IF_SLOTS - 1);
	struct sess_config *cfg = config.lookup(&zero);
	struct sess_if_stats *st = stats.lookup(&slot);

	if (!cfg || !st)
		return VERDICT_PASS;
	if ((skb->cb[0] & SESS_TAG_MASK) == SESS_TAG_COPY) {
		st->own_copies++; /* not a frame of the node's: not counted as seen */
		return VERDICT_PASS;
	}
	st->exits.seen++;
	__u32 linear = skb->data_end - skb->data;
	if (linear < PARSE_DEPTH && skb->len > linear)
		bpf_skb_pull_data(skb, skb->len < PARSE_DEPTH ? skb->len : PARSE_DEPTH);

	struct l4_pkt p = {};
	int parsed = parse_l4((void *)(long)skb->data, (void *)(long)skb->data_end, &p, PARSE_L4);
	/* Fragments and other protocols go on: rules on addresses and protocols match them. */
	if (parsed == PARSE_NOT_IP || parsed == PARSE_MALFORMED || parsed == PARSE_SHORT_L4)
		return fp_exit(&st->exits, V_PASS, parse_reason(parsed), VERDICT_PASS);

	__u32 gen = cfg->gen & 1;
	struct sess_bits x;
	if (!classify(&p, parsed, gen, dir, &x))
		return fp_exit(&st->exits, V_PASS, R_UNMATCHED, VERDICT_PASS);
	if (first_bit(&x) < 0)
		return fp_exit(&st->exits, V_PASS, R_UNMATCHED, VERDICT_PASS);
	struct cut_info ci = {.len = skb->len};
#ifdef VTAP_FLOWS
	/* A flow counts once, for every session with a cutoff that has a rule for it
	 * (the rules' bits of those sessions: user space's); each then cuts at its own. */
	struct sess_bits *cut_rules = cut_bits.lookup(&gen);
	if (cut_rules && ((x.w[0] & cut_rules->w[0]) | (x.w[1] & cut_rules->w[1]) | (x.w[2] & cut_rules->w[2]) |
			  (x.w[3] & cut_rules->w[3]))) {
		/* no index: the verifier loses gen's bounds where the compiler spills it */
		__u64 cap = gen ? cfg->cut_max[1] : cfg->cut_max[0];
		int flags = flow_step(&p, parsed, cap, cfg->flow_idle_ns, &st->cut, &ci.before);
		if (flags < 0 || flow_end(flags))
			ci.before = 0;
		/* Through a map and back: every path of flow_step() then reaches decide()'s loop
		 * with one unknown number, not its own known one, so the verifier walks the loop
		 * once, not once per path (it gave up past a million instructions). */
		__u64 *through = cut_scratch.lookup(&zero);
		if (through) {
			*through = ci.before;
			ci.before = *(volatile __u64 *)through;
		}
	}
#endif
	__u32 take = decide(&x, gen, &ci);
	if (!take)  /* rejected, sampled out, cut or given way: the reason is in the sessions' counters */
		return fp_exit(&st->exits, V_PASS, R_SAMPLED_OUT, VERDICT_PASS);
	skb->cb[0] = SESS_TAG_TAP | take;
	skb->cb[1] = gen | dir << 1;
	return fp_exit(&st->exits, V_MIRROR, R_MIRRORED, VERDICT_MIRROR);
}

int tap_ingress(struct __sk_buff *skb)
{
	return tap(skb, 0);
}

int tap_egress(struct __sk_buff *skb)
{
	return tap(skb, 1);
}

/* ---- the sender ---------------------------------------------------------- */

static __always_inline __u16 csum_fold32(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* The one's complement sum (16 bits) of the bytes from off to the end, in
 * 256-byte pieces read into the stack; -1 when a read fails. */
#define CSUM_CHUNK 256
#define CSUM_CHUNKS 40 /* up to 10 KB: a jumbo frame and its encapsulation */
static __always_inline int csum_to_end(struct __sk_buff *skb, __u32 off)
{
	__u8 buf[CSUM_CHUNK];
	__u32 len = skb->len - off;
	__s64 sum = 0;

	for (int i = 0; i < CSUM_CHUNKS; i++) {
		__u32 at = i * CSUM_CHUNK;
		if (at >= len)
			break;
		__u64 n = len - at;
		if (n >= CSUM_CHUNK) {
			if (bpf_skb_load_bytes(skb, off + at, buf, CSUM_CHUNK) < 0)
				return -1;
			sum = bpf_csum_diff(0, 0, (void *)buf, CSUM_CHUNK, sum);
		} else {
			/* the last piece, zero-padded to whole 32-bit words; the masks in
			 * assembly so that the verifier sees the bounds (verdict.h) */
			__u64 words = n + 3;
			__builtin_memset(buf, 0, CSUM_CHUNK);
			asm volatile("%0 &= 255" : "+r"(n));
			asm volatile("%0 &= 508" : "+r"(words));
			if (n == 0 || words == 0 || words > CSUM_CHUNK || bpf_skb_load_bytes(skb, off + at, buf, n) < 0)
				return -1;
			sum = bpf_csum_diff(0, 0, (void *)buf, words, sum);
		}
	}
	return csum_fold32((__u32)sum);
}

static __always_inline __u32 add16(__u32 a, __u32 b)
{
	return csum_fold32(a + b);
}

/* Where a copy's own TCP/UDP checksum is partial (a veth's sender with TX
 * checksum offload on, the default, hands on frames whose checksum field holds
 * only the pseudo-header's sum, for the last device to finish), the kernel or
 * the NIC finishes it after we built the outer UDP checksum. So the outer one
 * is built for the finished frame, as the kernel's tunnels do (local checksum
 * offload, lco_csum()): the sum over the inner segment once finished is the
 * complement of its pseudo-header sum. Returns the correction to add to the
 * sum from `from` on (0xffff-complemented arithmetic), or 0 when there is none. */
static __always_inline __u32 partial_fix(struct __sk_buff *skb, __u32 inner_l3, int cut)
{
	__be16 type;
	__u32 l4off, l4len, pseudo;
	__u8 proto;

	/* CHECKSUM_UNNECESSARY and CHECKSUM_COMPLETE frames are never partial (the
	 * first helper answers only for the one, the second, adding 0, only for the other) */
	if (bpf_csum_level(skb, BPF_CSUM_LEVEL_QUERY) >= 0 || bpf_csum_update(skb, 0) >= 0)
		return 0;
	if (bpf_skb_load_bytes(skb, inner_l3 - 2, &type, 2) < 0)
		return 0;
	if (type == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, inner_l3, &ip, sizeof(ip)) < 0 || ip.frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return 0;
		proto = ip.protocol;
		l4off = inner_l3 + ip.ihl * 4;
		l4len = bpf_ntohs(ip.tot_len) - ip.ihl * 4;
		pseudo = csum_fold32((__u32)bpf_csum_diff(0, 0, (void *)&ip.saddr, 8, 0));
	} else if (type == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, inner_l3, &ip6, sizeof(ip6)) < 0)
			return 0;
		proto = ip6.nexthdr;
		l4off = inner_l3 + sizeof(ip6);
		l4len = bpf_ntohs(ip6.payload_len);
		pseudo = csum_fold32((__u32)bpf_csum_diff(0, 0, (void *)&ip6.saddr, 32, 0));
	} else {
		return 0;
	}
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 0;
	__u32 field = l4off + (proto == IPPROTO_TCP ? 16 : 6);
	__u16 f;
	if (field + 2 > skb->len || bpf_skb_load_bytes(skb, field, &f, 2) < 0)
		return 0;
	/* the pseudo-header's sum, as the stack leaves it in a partial checksum */
	__be32 tail[2] = {bpf_htonl(l4len), bpf_htonl(proto)};
	pseudo = add16(pseudo, csum_fold32((__u32)bpf_csum_diff(0, 0, (void *)tail, sizeof(tail), 0)));
	if (f != (__u16)pseudo)
		return 0;
	int region = csum_to_end(skb, l4off);
	if (region < 0)
		return 0;
	/* a whole segment whose checksum already holds: complete after all (the
	 * pseudo-header's sum can be a checksum's value, 1 in 65536) */
	if (!cut && add16(pseudo, region) == 0xffff)
		return 0;
	/* what the segment sums to once finished, less what it sums to now */
	return add16(~pseudo & 0xffff, ~region & 0xffff);
}

/* The UDP checksum of an IPv6 tunnel packet (IPv6 forbids 0). */
static __always_inline __u16 udp6_csum(struct __sk_buff *skb, __u32 off, struct ipv6hdr *ip6, __u32 fix)
{
	int body = csum_to_end(skb, off);
	if (body < 0)
		return 0;
	__u32 len = skb->len - off;
	/* the pseudo-header: addresses, upper-layer length, next header */
	__u32 sum = csum_fold32((__u32)bpf_csum_diff(0, 0, (void *)&ip6->saddr, 32, 0));
	__be32 tail[2] = {bpf_htonl(len), bpf_htonl(IPPROTO_UDP)};
	sum = add16(sum, csum_fold32((__u32)bpf_csum_diff(0, 0, (void *)tail, sizeof(tail), 0)));
	sum = add16(add16(sum, body), fix);
	__u16 c = ~sum & 0xffff;
	return c ? c : 0xffff;
}

/* Wrap the copy in the session's tunnel and send it towards the collector. */
static __always_inline int encapsulate(struct __sk_buff *skb, struct sess_session *s, struct sess_stats *st,
				       __u32 sk, __u32 dir, int cut)
{
	struct ethhdr inner;
	__u8 tag[4];
	__u32 l2 = ETH_HLEN;
	__u32 hlen = s->hdr_len & (SESS_HDR_MAX - 1);

	if (hlen < sizeof(struct iphdr))
		goto failed;

	if (bpf_skb_load_bytes(skb, 0, &inner, sizeof(inner)) < 0)
		goto failed;
	/* A VLAN tag the kernel holds beside the frame (veth and most drivers)
	 * goes back into the inner frame, as it was on the wire; left beside it,
	 * it would be put on the outer frame. */
	if (skb->vlan_present) {
		__be16 tci = bpf_htons(skb->vlan_tci);
		__builtin_memcpy(&tag[0], &tci, 2);
		__builtin_memcpy(&tag[2], &inner.h_proto, 2); /* after the tag: the frame's own type */
		inner.h_proto = skb->vlan_proto;
		if (bpf_skb_vlan_pop(skb) < 0)
			goto failed;
		l2 += 4;
	}
	__u64 flags = BPF_F_ADJ_ROOM_ENCAP_L2(l2) | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
		      (s->flags & SESS_F_OUTER_V6 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 : BPF_F_ADJ_ROOM_ENCAP_L3_IPV4) |
		      (s->kind == SESS_T_VXLAN || s->kind == SESS_T_GENEVE ? BPF_F_ADJ_ROOM_ENCAP_L4_UDP
									 : BPF_F_ADJ_ROOM_ENCAP_L4_GRE);
	/* Room after the (soon outer) Ethernet header for the tunnel headers and
	 * the inner Ethernet header (the old one's place becomes the outer's). */
	if (bpf_skb_adjust_room(skb, hlen + l2, BPF_ADJ_ROOM_MAC, flags) < 0)
		goto failed;
	if (bpf_skb_store_bytes(skb, ETH_HLEN, s->hdr, hlen, 0) < 0)
		goto failed;
	if (bpf_skb_store_bytes(skb, ETH_HLEN + hlen, &inner, sizeof(inner), 0) < 0)
		goto failed;
	if (l2 > ETH_HLEN && bpf_skb_store_bytes(skb, ETH_HLEN + hlen + ETH_HLEN, tag, 4, 0) < 0)
		goto failed;

	/* The outer Ethernet header: bpf_redirect_neigh() writes the addresses;
	 * the destination must not look multicast meanwhile (the copy's own may). */
	struct ethhdr outer = {.h_proto = s->flags & SESS_F_OUTER_V6 ? bpf_htons(ETH_P_IPV6) : bpf_htons(ETH_P_IP)};
	if (bpf_skb_store_bytes(skb, 0, &outer, sizeof(outer), 0) < 0)
		goto failed;

	__u32 iplen = s->flags & SESS_F_OUTER_V6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);
	__u32 l4off = ETH_HLEN + iplen;
	__u32 total = skb->len - ETH_HLEN;
	if (s->flags & SESS_F_OUTER_V6) {
		__be16 plen = bpf_htons(total - sizeof(struct ipv6hdr));
		bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct ipv6hdr, payload_len), &plen, 2, 0);
	} else {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
			goto failed;
		ip.tot_len = bpf_htons(total); /* the template's checksum is 0 */
		ip.check = ~csum_fold32((__u32)bpf_csum_diff(0, 0, (void *)&ip, sizeof(ip), 0)) & 0xffff;
		bpf_skb_store_bytes(skb, ETH_HLEN, &ip, sizeof(ip), 0);
	}
	if (s->kind == SESS_T_VXLAN || s->kind == SESS_T_GENEVE) {
		/* the source port spreads flows over the collector's queues (RFC 7348) */
		__be16 sport = bpf_htons(49152 | (bpf_get_hash_recalc(skb) & 0x3fff));
		__be16 ulen = bpf_htons(total - iplen);
		bpf_skb_store_bytes(skb, l4off, &sport, 2, 0);
		bpf_skb_store_bytes(skb, l4off + 4, &ulen, 2, 0);
		if (s->flags & SESS_F_OUTER_V6) {
			struct ipv6hdr ip6;
			if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
				goto failed;
			__u32 fix = partial_fix(skb, ETH_HLEN + hlen + l2, cut);
			__u16 c = udp6_csum(skb, l4off, &ip6, fix);
			if (!c)
				goto failed;
			bpf_skb_store_bytes(skb, l4off + 6, &c, 2, 0);
		}
		/* IPv4: UDP checksum 0, as RFC 7348 and RFC 8926 ask */
	} else if (s->kind == SESS_T_ERSPAN2 || s->kind == SESS_T_ERSPAN3) {
		struct sess_seq *n = seq.lookup(&sk);
		if (!n)
			goto failed;
		bpf_spin_lock(&n->lock);
		__u32 mine = n->next++;
		bpf_spin_unlock(&n->lock);
		__be32 sq = bpf_htonl(mine);
		bpf_skb_store_bytes(skb, l4off + 4, &sq, 4, 0); /* GRE: flags+proto, then the sequence */
		__u32 eo = l4off + 8;                          /* the ERSPAN header */
		if (s->kind == SESS_T_ERSPAN2) {
			/* ver(4) vlan(12) | cos(3) en(2) t(1) session(10) | reserved(12) index(20) */
			if (cut) {
				__u8 b;
				if (bpf_skb_load_bytes(skb, eo + 2, &b, 1) == 0) {
					b |= 0x04;
					bpf_skb_store_bytes(skb, eo + 2, &b, 1, 0);
				}
			}
		} else {
			/* ver(4) vlan(12) | cos(3) bso(2) t(1) session(10) | timestamp(32) |
			 * sgt(16) p(1) ft(5) hwid(6) d(1) gra(2) o(1); gra 00: 100 us units */
			__be32 ts = bpf_htonl((__u32)(bpf_ktime_get_ns() / 100000));
			bpf_skb_store_bytes(skb, eo + 4, &ts, 4, 0);
			if (cut) {
				__u8 b;
				if (bpf_skb_load_bytes(skb, eo + 2, &b, 1) == 0) {
					b |= 0x04;
					bpf_skb_store_bytes(skb, eo + 2, &b, 1, 0);
				}
			}
			if (dir) {
				__u8 b;
				if (bpf_skb_load_bytes(skb, eo + 11, &b, 1) == 0) {
					b |= 0x08;
					bpf_skb_store_bytes(skb, eo + 11, &b, 1, 0);
				}
			}
		}
	}
	st->sent++;
	st->sent_bytes += skb->len;
	skb->cb[0] = SESS_TAG_COPY;
	return redirect_neigh(s->ifindex, 0, 0, 0);
failed:
	st->failed++;
	return TC_ACT_SHOT;
}

/* Send one copy for one session. */
static __always_inline int send_one(struct __sk_buff *skb, __u32 gen, __u32 slot, __u32 dir)
{
	__u32 sk = gen * SESS_MAX + (slot & (SESS_MAX - 1));
	struct sess_session *s = sessions.lookup(&sk);
	struct sess_stats *st = sess_stats.lookup(&sk);

	if (!s || !st)
		return TC_ACT_SHOT;
	__u32 tagged = skb->vlan_present ? 4 : 0; /* a tag beside the frame is on the wire too */
	__u32 wire = skb->len + tagged;
	st->frame_bytes += wire;
	int cut = 0;
	__u32 want = s->truncate && wire > s->truncate ? s->truncate : wire;
	/* what the path takes: the local target's MTU plus its Ethernet header
	 * (and a tag), or the outer IP packet within the collector's path MTU */
	__u32 room = s->kind == SESS_T_LOCAL ? s->mtu + ETH_HLEN + tagged
					     : s->mtu - (s->hdr_len & (SESS_HDR_MAX - 1));
	/* A GSO frame (a local sender's TCP at egress, a GRO'd one at ingress)
	 * is many wire packets in one skb; the kernel cuts it into them where the
	 * path needs (the tunnel's headers repeated in each): what must fit is
	 * one segment. Cut whole (truncation), it is one short frame. */
	__u32 size = want;
	if (want == wire && skb->gso_segs > 1 && skb->gso_size) {
		__be16 proto;
		__u32 l2 = l2_len(skb, &proto);
		__u32 hdr = l34_len(skb, l2, proto);
		if (hdr)
			size = tagged + l2 + hdr + skb->gso_size;
	}
	if (size > room) {
		if (!(s->flags & SESS_F_FIT)) {
			st->oversize++;
			return TC_ACT_SHOT;
		}
		want = room;
	}
	if (want < wire) {
		if (want < ETH_HLEN + tagged + 20 || bpf_skb_change_tail(skb, want - tagged, 0) < 0) {
			st->failed++;
			return TC_ACT_SHOT;
		}
		st->truncated++;
		cut = 1;
	}
	if (s->kind == SESS_T_LOCAL) {
		st->sent++;
		st->sent_bytes += skb->len + tagged;
		skb->cb[0] = SESS_TAG_COPY;
		return bpf_redirect(s->ifindex, 0);
	}
	return encapsulate(skb, s, st, sk, dir, cut);
}

int sender(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct sess_config *cfg = config.lookup(&zero);
	__u32 tag = skb->cb[0];
	__u32 gen = skb->cb[1] & 1, dir = (skb->cb[1] >> 1) & 1;

	if (!cfg || (tag & SESS_TAG_MASK) != SESS_TAG_TAP)
		return TC_ACT_SHOT; /* nothing but our copies goes out of the sender device */
	__u32 take = tag & ((1U << SESS_MAX) - 1);
	/* every session but the last gets a clone of its own, back through this hook */
	for (int i = 0; i < SESS_MAX; i++) {
		if (!(take & (take - 1)))
			break;
		__u32 low = take & -take;
		skb->cb[0] = SESS_TAG_TAP | low;
		if (bpf_clone_redirect(skb, cfg->sender_ifindex, 0) < 0) {
			__u32 sk = gen * SESS_MAX + ctz64(low);
			struct sess_stats *st = sess_stats.lookup(&sk);
			if (st)
				st->failed++;
		}
		take &= ~low;
	}
	if (!take)
		return TC_ACT_SHOT;
	return send_one(skb, gen, ctz64(take), dir);
}
