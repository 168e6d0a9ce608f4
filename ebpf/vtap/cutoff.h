/* cutoff.h — the vTAP's per-flow cutoff, one copy for every hook (tc_mirror.bpf.c,
 * xdp_mirror.bpf.c, and per session in tc_sessions.bpf.c).
 *
 * Most of what an IDS spends goes on the bulk of long flows whose first bytes
 * already told it everything: Suricata stops reassembling a stream after
 * stream.reassembly.depth, Time Machine keeps each connection's first N bytes.
 * Both cut after the copy has crossed the network to the sensor; this cuts at
 * the tap, before the copy is made.
 *
 * A flow is the 5-tuple, both directions as one flow (the key puts the lower
 * address and port first; `dir` says which way a frame goes). Each direction
 * counts the L4 payload bytes the cutoff let through; a frame is let through
 * while its direction's count is below the cutoff, so the frame that crosses
 * the line goes whole. After that only TCP segments with SYN, FIN or RST go, so
 * the sensor still sees every flow begin and end. A segment without payload (an
 * ACK) is cut once either direction is past the cutoff. Bytes are counted as they
 * pass, not by sequence number: a retransmission before the cut counts again,
 * and one after it is cut like any other segment.
 *
 * The table is an LRU hash (VTAP_FLOWS entries, user space sizes it): a flow
 * evicted, or idle longer than config.flow_idle_ns, starts again from zero when
 * it is seen next; a TCP flow ended by a FIN from both sides or a RST is
 * forgotten at once, and a SYN without ACK starts its 5-tuple over (a new
 * connection on the same ports). A frame that carries no payload and opens
 * nothing makes no entry (an ACK after both FINs, a flow's ACKs the tap met
 * midway): it goes, as a new flow's would.
 *
 * Fragments and IP packets without ports (ICMP, GRE, ...) have no flow to cut
 * and always go, counted by reason; so does a TCP/UDP header cut short.
 *
 * Not an ordinary header: its map calls are BCC's, pasted in where a program
 * includes it (BpfProgram.INLINE), as watch.h.
 */
#ifndef VTAP_CUTOFF_H
#define VTAP_CUTOFF_H

#include "parsing_helpers.h"
#include "vtap.h"

/* Programs include this file only when user space asks for a flow table
 * (-DVTAP_FLOWS=entries): a tap without a cutoff pays nothing for it. */

/* TCP's flags byte */
#define TCP_F_FIN 0x01
#define TCP_F_SYN 0x02
#define TCP_F_RST 0x04
#define TCP_F_ACK 0x10

struct flow_key {
	__u8 lo[16];       /* the lower address (IPv4 in the first 4 bytes) */
	__u8 hi[16];
	__be16 lo_port;    /* the port that goes with lo */
	__be16 hi_port;
	__u8 proto;        /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 family;       /* 4 or 6 */
	__u8 pad[2];
};

struct flow_state {
	__u64 bytes[2];    /* payload bytes let through, per direction (0: lo -> hi) */
	__u64 last_ns;     /* when a frame of the flow was last seen (coarse clock) */
	__u32 fins;        /* bit d: a FIN seen from direction d */
	__u32 pad;
};

BPF_TABLE("lru_hash", struct flow_key, struct flow_state, flows, VTAP_FLOWS);

/* What cut() decided, and for the counters its reason. */
#define CUT_GO 0        /* under the cutoff (or no cutoff): copied, counted in the flow */
#define CUT_CUT 1       /* past the cutoff: not copied */
#define CUT_END 2       /* past the cutoff, but a SYN, FIN or RST: copied */
#define CUT_NO_FLOW 3   /* a fragment, no ports, or a header cut short: copied, no flow */

/* Payload bytes of the TCP/UDP segment parse_l4() found (its length as the IP
 * header says, less the L4 header): the same at TC, where a GSO frame's IP
 * header carries the whole super-packet's length, and at XDP. */
static __always_inline __u32 l4_payload(struct l4_pkt *p)
{
	__u32 hdr = p->tcpflags ? ((struct tcphdr *)p->l4hdr)->doff * 4 : sizeof(struct udphdr);

	return p->l4len > hdr ? p->l4len - hdr : 0;
}

/* Which address is the lower, compared as numbers in network order (-1, 0, 1):
 * word by word, from the packet itself (no copy on the stack, which the XDP
 * vTAP has little of left). */
static __always_inline int addr_cmp(__be32 *a, __be32 *b, int words)
{
#pragma unroll
	for (int i = 0; i < 4; i++) {
		if (i < words && a[i] != b[i])
			return bpf_ntohl(a[i]) < bpf_ntohl(b[i]) ? -1 : 1;
	}
	return 0;
}

/* The flow's key, and which way this frame goes in it (0: from the lower end). */
static __always_inline int flow_key_of(struct l4_pkt *p, struct flow_key *k)
{
	__be32 *src, *dst;
	__be16 sport = *p->sport, dport = *p->dport;
	int words, c, d;

	if (p->v4) {
		src = &p->iph->saddr;
		dst = &p->iph->daddr;
		words = 1;
		k->family = 4;
	} else {
		src = (__be32 *)&p->ip6h->saddr;
		dst = (__be32 *)&p->ip6h->daddr;
		words = 4;
		k->family = 6;
	}
	c = addr_cmp(src, dst, words);
	d = c > 0 || (c == 0 && bpf_ntohs(sport) > bpf_ntohs(dport));
	if (d) {
		__be32 *t = src;

		src = dst;
		dst = t;
		k->lo_port = dport;
		k->hi_port = sport;
	} else {
		k->lo_port = sport;
		k->hi_port = dport;
	}
	if (p->v4) {
		__builtin_memcpy(k->lo, src, 4);
		__builtin_memcpy(k->hi, dst, 4);
	} else {
		__builtin_memcpy(k->lo, src, 16);
		__builtin_memcpy(k->hi, dst, 16);
	}
	k->proto = p->l4;
	return d;
}

/* One frame of a flow, which parse_l4(..., PARSE_L4) read into p and answered
 * `parsed`: the flow's entry found, made, started over or forgotten (the
 * comment at the top), *before set to the payload bytes its direction had
 * counted before this frame, and this frame's counted while that is under
 * `cap` (the largest cutoff that applies: past it, counting more changes
 * nothing). Returns the frame's TCP flags (0 for UDP), or -1 when it has no
 * flow (a fragment, no ports, a header cut short: counted by reason). */
static __always_inline int flow_step(struct l4_pkt *p, int parsed, __u64 cap, __u64 idle_ns,
				     struct cut_counts *cc, __u64 *before)
{
	struct flow_key k = {};
	struct flow_state fresh = {}, *f;
	__u64 now;
	__u32 payload;
	__u8 flags = 0;
	int d;

	*before = 0;
	if (parsed != PARSE_OK) {
		/* past the IP header: a fragment, no ports, or a TCP/UDP header cut short */
		if (parsed == PARSE_FRAGMENT)
			cc->uncut_fragment++;
		else if (parsed == PARSE_OTHER)
			cc->uncut_no_ports++;
		else
			cc->uncut_malformed++;
		return -1;
	}
	if (p->tcpflags)
		flags = *p->tcpflags;
	payload = l4_payload(p);
	d = flow_key_of(p, &k);
	now = bpf_ktime_get_coarse_ns();

	f = flows.lookup(&k);
	if (f && ((flags & (TCP_F_SYN | TCP_F_ACK)) == TCP_F_SYN || now - f->last_ns > idle_ns)) {
		/* a new connection on these ports, or a flow idle past its timeout: from zero */
		f->bytes[0] = f->bytes[1] = 0;
		f->fins = 0;
		cc->flows_restarted++;
	}
	if (!f) {
		if (!payload && !(flags & TCP_F_SYN))
			return flags; /* nothing to count, nothing it opens: no entry */
		fresh.last_ns = now;
		if (flows.insert(&k, &fresh) == 0)
			cc->flows_new++;
		f = flows.lookup(&k);
		if (!f) /* evicted at once by a full table under other CPUs' inserts: from zero */
			return flags;
	}
	f->last_ns = now;
	/* A segment without payload (an ACK) goes as its flow does: cut once either
	 * direction is past the cutoff. Counted by its own direction only, a bulk
	 * transfer's ACKs (a third of its frames) went to the IDS for ever, and at
	 * 200 Mbps they alone kept the monitor's Suricata dropping (bench ids). */
	if (!payload) {
		*before = f->bytes[0] > f->bytes[1] ? f->bytes[0] : f->bytes[1];
	} else {
		*before = f->bytes[d & 1];
		/* the count before this frame, taken and added in one atomic step: two frames of
		 * one direction on two CPUs at once then each see the other's bytes (with a plain
		 * read and an add, both could cross the line) */
		if (*before < cap)
			*before = __sync_fetch_and_add(&f->bytes[d & 1], payload);
	}
	if (flags & TCP_F_FIN) /* a plain or: a FIN from each side at the same instant, on two
				 * CPUs, leaves the flow to its timeout, no worse */
		f->fins |= 1 << (d & 1);
	if ((flags & TCP_F_RST) || ((flags & TCP_F_FIN) && (f->fins | (1 << (d & 1))) == 3)) {
		/* ended: forgotten now, so a later flow on these ports starts from zero */
		if (flows.delete(&k) == 0)
			cc->flows_ended++;
	}
	return flags;
}

/* Past the cutoff, a segment that opens or ends its flow is still copied. */
static __always_inline int flow_end(int flags)
{
	return flags > 0 && (flags & (TCP_F_SYN | TCP_F_FIN | TCP_F_RST));
}

/* What becomes of a watched frame of frame_len bytes (what its copy would be)
 * under one cutoff (payload bytes per direction; 0: none, nothing tracked): CUT_*. */
static __always_inline int cut_parsed(struct l4_pkt *p, int parsed, __u32 frame_len, __u64 cutoff,
				      __u64 idle_ns, struct cut_counts *cc)
{
	__u64 before;
	int flags;

	if (!cutoff)
		return CUT_GO;
	flags = flow_step(p, parsed, cutoff, idle_ns, cc, &before);
	if (flags < 0)
		return CUT_NO_FLOW;
	if (before < cutoff)
		return CUT_GO;
	if (flow_end(flags)) {
		cc->ends_copied++;
		return CUT_END;
	}
	cc->cut_bytes += frame_len;
	return CUT_CUT;
}

/* The same from the frame itself (the TC vTAP parses only to the addresses). */
static __always_inline int cut_frame(void *data, void *data_end, __u32 frame_len, __u64 cutoff, __u64 idle_ns,
				     struct cut_counts *cc)
{
	struct l4_pkt p = {};
	int parsed;

	if (!cutoff)
		return CUT_GO;
	parsed = parse_l4(data, data_end, &p, PARSE_L4);
	if (parsed == PARSE_NOT_IP || parsed == PARSE_MALFORMED) /* mirror-all copies those: no flow */
		return CUT_NO_FLOW;
	return cut_parsed(&p, parsed, frame_len, cutoff, idle_ns, cc);
}

#endif /* VTAP_CUTOFF_H */
