/* redirect_match.h — what both redirect programs (xdp_redirect.bpf.c at the XDP
 * hook, tc_redirect.bpf.c at TC ingress) do before they rewrite: their maps,
 * the parse of a frame into the key of its service (or, for a reply, of its
 * backend), and the counting of what was decided. Each program then writes the
 * packet its own way (XDP through pointers, TC through the skb helpers).
 *
 * The map lookups stay in each program's own file, written out: BCC turns
 * `map.lookup()` into a helper call only in the file it compiles (in a header
 * it stays an indirect call, which BPF has not: the verifier's "unknown
 * opcode 8d"), and not inside a macro at all.
 *
 * Include after parsing_helpers.h and xdp_redirect.h.
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

/* What was decided. The first two are rewritten; the others are the reasons a
 * frame is left untouched; MATCH_PARSED is redirect_parse()'s "look it up". */
enum redirect_match {
	MATCH_TO_BACKEND, /* its destination is a service: it goes to the backend */
	MATCH_REPLY,      /* its source is a backend: it leaves as from the service */
	MATCH_NOT_IP,
	MATCH_NO_RULE,
	MATCH_FRAGMENT,   /* no port to match on: passed on, as Katran does */
	MATCH_MALFORMED,
	MATCH_PARSED,
};

/* The headers of a matched frame, proven inside the packet by the parse. */
struct redirect_pkt {
	struct ethhdr *eth;
	struct iphdr *iph;    /* when v4 */
	struct ipv6hdr *ip6h; /* when not */
	__sum16 *l4csum;      /* the TCP or UDP checksum */
	__be16 *sport;
	__be16 *dport;
	void *l4hdr;          /* the TCP or UDP header */
	__u32 l4len;          /* the segment's length, from the IP header */
	int l4;               /* IPPROTO_UDP or IPPROTO_TCP */
	int v4;               /* branch on this, not on iph being NULL: the verifier
	                       * does not take a packet pointer to be non-NULL */
};

/* Parse the frame in [data, data_end): MATCH_PARSED with *key set to its
 * service (destination) side, or the reason it cannot be matched. */
static __always_inline int redirect_parse(void *data, void *data_end, struct redirect_pkt *p,
					  struct redirect_key *key)
{
	struct hdr_cursor nh = {.pos = data};
	struct udphdr *udph;
	struct tcphdr *tcph;
	int proto, l4, iplen;

	proto = parse_ethhdr(&nh, data_end, &p->eth);
	if (proto == bpf_htons(ETH_P_IP)) {
		l4 = parse_iphdr(&nh, data_end, &p->iph);
		if (l4 < 0)
			return MATCH_MALFORMED;
		if (ip_is_fragment(p->iph))
			return MATCH_FRAGMENT;
		iplen = bpf_ntohs(p->iph->tot_len) - p->iph->ihl * 4;
		key->family = 4;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		l4 = parse_ip6hdr(&nh, data_end, &p->ip6h);
		if (l4 < 0)
			return MATCH_MALFORMED;
		l4 = skip_ip6hdrext(&nh, data_end, l4);
		if (l4 < 0)
			return MATCH_MALFORMED;
		if (l4 == IPPROTO_FRAGMENT)
			return MATCH_FRAGMENT;
		/* the payload less the extension headers walked */
		iplen = bpf_ntohs(p->ip6h->payload_len) - (int)(nh.pos - (void *)(p->ip6h + 1));
		key->family = 6;
	} else {
		return proto < 0 ? MATCH_MALFORMED : MATCH_NOT_IP;
	}
	p->l4hdr = nh.pos;
	if (l4 == IPPROTO_UDP) {
		if (parse_udphdr(&nh, data_end, &udph) < 0)
			return MATCH_MALFORMED;
		p->l4csum = &udph->check;
		p->sport = &udph->source;
		p->dport = &udph->dest;
	} else if (l4 == IPPROTO_TCP) {
		if (parse_tcphdr(&nh, data_end, &tcph) < 0)
			return MATCH_MALFORMED;
		p->l4csum = &tcph->check;
		p->sport = &tcph->source;
		p->dport = &tcph->dest;
	} else {
		return MATCH_NO_RULE;
	}
	p->l4len = iplen; /* checked where it is used: only a partial checksum's finish sums it */
	p->l4 = l4;
	p->v4 = key->family == 4;
	key->proto = l4;
	key->port = *p->dport;
	if (p->v4)
		key->addr[0] = p->iph->daddr;
	else
		__builtin_memcpy(key->addr, &p->ip6h->daddr, sizeof(key->addr));
	return MATCH_PARSED;
}

/* The key of the frame's source side: its backend, if it is a reply. */
static __always_inline void reply_key(struct redirect_pkt *p, struct redirect_key *key)
{
	key->port = *p->sport;
	if (p->v4)
		key->addr[0] = p->iph->saddr;
	else
		__builtin_memcpy(key->addr, &p->ip6h->saddr, sizeof(key->addr));
}

/* Count what was decided: the direction, with the rule's packets and bytes
 * (rs, when the rule's counters were found), or the reason a frame is left
 * untouched. (An if chain: clang may turn a switch into a jump table.) */
static __always_inline void count_match(struct redirect_stats *st, int match, struct rule_stats *rs, __u64 len)
{
	if (match == MATCH_REPLY) {
		st->to_client++;
		if (rs) {
			rs->reply_packets++;
			rs->reply_bytes += len;
		}
	} else if (match == MATCH_TO_BACKEND) {
		st->to_backend++;
		if (rs) {
			rs->packets++;
			rs->bytes += len;
		}
	} else if (match == MATCH_NOT_IP) {
		st->not_ip++;
	} else if (match == MATCH_NO_RULE) {
		st->no_rule++;
	} else if (match == MATCH_FRAGMENT) {
		st->fragment++;
	} else {
		st->malformed++;
	}
}

/* The one exit: every verdict is counted here, so no path can miss the count.
 * The hook's own codes say which is which (XDP_PASS or TC_ACT_OK, ...); the
 * counters keep XDP's names for both programs. */
static __always_inline int count_verdict_as(struct redirect_stats *st, int action, int pass, int redirect, int drop)
{
	if (action == pass)
		st->xdp_pass++;
	else if (action == redirect)
		st->xdp_redirect++;
	else if (action == drop)
		st->xdp_drop++;
	else
		st->xdp_aborted++;
	return action;
}

#endif /* REDIRECT_MATCH_H */
