/* redirect_match.h — what both redirect programs (xdp_redirect.bpf.c at the XDP
 * hook, tc_redirect.bpf.c at TC ingress) do before they rewrite: their maps,
 * the reason a frame is left untouched, the key of its service (or, for a
 * reply, of its backend), and its rule's counters. Each program parses with
 * parse_l4(), writes the packet its own way (XDP through pointers, TC through
 * the skb helpers) and counts its verdict and reason at its one exit
 * (verdict.h).
 *
 * The map lookups stay in each program's own file, written out: BCC turns
 * `map.lookup()` into a helper call only in the file it compiles (in a header
 * it stays an indirect call, which BPF has not: the verifier's "unknown
 * opcode 8d"), and not inside a macro at all.
 *
 * Include after parsing_helpers.h and xdp_redirect.h (which includes verdict.h).
 */
#ifndef REDIRECT_MATCH_H
#define REDIRECT_MATCH_H

/* The maps (expanded in each program's file):
 *   rules       service -> backend; written by user space, live
 *   replies     backend -> service, for the replies; written with `rules`
 *   rule_stats  packets and bytes per rule, both ways; index given by user space
 *   stats       verdicts and reasons, summed by user space */
#define REDIRECT_MAPS()                                                                    \
	BPF_HASH(rules, struct redirect_key, struct redirect_target, REDIRECT_MAX_RULES); \
	BPF_HASH(replies, struct redirect_key, struct redirect_target, REDIRECT_MAX_RULES); \
	BPF_PERCPU_ARRAY(rule_stats, struct rule_stats, REDIRECT_MAX_RULES);               \
	BPF_PERCPU_ARRAY(stats, struct redirect_stats, 1)

/* The key of the frame's destination side: its service, if it is for one. */
static __always_inline void service_key(const struct l4_pkt *p, struct redirect_key *key)
{
	key->family = p->v4 ? 4 : 6;
	key->proto = p->l4;
	key->port = *p->dport;
	if (p->v4)
		key->addr[0] = p->iph->daddr;
	else
		__builtin_memcpy(key->addr, &p->ip6h->daddr, sizeof(key->addr));
}

/* The key of the frame's source side: its backend, if it is a reply. */
static __always_inline void reply_key(const struct l4_pkt *p, struct redirect_key *key)
{
	key->port = *p->sport;
	if (p->v4)
		key->addr[0] = p->iph->saddr;
	else
		__builtin_memcpy(key->addr, &p->ip6h->saddr, sizeof(key->addr));
}

/* A rewritten frame's packets and bytes, in its rule's counters (rs: NULL
 * when user space has not made them). */
static __always_inline void count_rule(struct rule_stats *rs, int reply, __u64 len)
{
	if (!rs)
		return;
	if (reply) {
		rs->reply_packets++;
		rs->reply_bytes += len;
	} else {
		rs->packets++;
		rs->bytes += len;
	}
}

#endif /* REDIRECT_MATCH_H */
