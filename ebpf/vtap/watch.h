/* watch.h — the vTAP's watch-list and its match, one copy for both hooks
 * (tc_mirror.bpf.c at TC, xdp_mirror.bpf.c at XDP).
 *
 * The watch-list is two LPM tries of CIDRs, one per family, that user space
 * (ebpf/vtap/mirror_base.py) writes. A frame is watched when its source or its
 * destination (VTAP_MATCH_SRC / VTAP_MATCH_DST, compiled in from --match) lies
 * in a watched prefix: each address is looked up as a full-length key, and the
 * trie answers with the longest prefix that contains it.
 *
 * Not an ordinary header: its map calls are BCC's (`watch_v4.lookup()`), which
 * BCC turns into helper calls only in the text it compiles, so the loader pastes
 * this file where a program includes it (BpfProgram.INLINE in mirror_base.py).
 */
#ifndef VTAP_WATCH_H
#define VTAP_WATCH_H

#include "vtap.h"

#ifndef VTAP_MATCH_SRC
#define VTAP_MATCH_SRC 1
#endif
#ifndef VTAP_MATCH_DST
#define VTAP_MATCH_DST 1
#endif
#ifndef VTAP_WATCH_MAX
#define VTAP_WATCH_MAX 1024
#endif

BPF_LPM_TRIE(watch_v4, struct watch_v4_key, struct watch_entry, VTAP_WATCH_MAX); /* watched IPv4 CIDRs; user space */
BPF_LPM_TRIE(watch_v6, struct watch_v6_key, struct watch_entry, VTAP_WATCH_MAX); /* watched IPv6 CIDRs; user space */

/* What a lookup found: watched, and (an entry user space marked, a host an IDS's
 * alert put there) taken whole, past any per-flow cutoff. */
#define WATCH_HIT 1
#define WATCH_WHOLE 2

/* With a cutoff, a match that is not whole goes on to the other address, which may
 * be a host taken whole; without one, the first match is enough. */
#ifdef VTAP_FLOWS
#define WATCH_DONE(w) ((w) & WATCH_WHOLE)
#else
#define WATCH_DONE(w) (w)
#endif

/* A match: the entry found, stamped the first time (what an alert's host waited
 * for: user space writes 0 and reads when its first frame came). One load per
 * watched frame, one store per entry. */
static __always_inline int hit(struct watch_entry *e)
{
	if (!e)
		return 0;
	if (!e->first_ns)
		e->first_ns = bpf_ktime_get_ns();
	return WATCH_HIT | (e->flags & VTAP_W_WHOLE ? WATCH_WHOLE : 0);
}

/* WATCH_HIT (| WATCH_WHOLE), or 0 when neither address is watched. */
static __always_inline int watched_v4(__be32 saddr, __be32 daddr)
{
	struct watch_v4_key key = {.prefixlen = 32};
	int w = 0;

#if VTAP_MATCH_SRC
	key.addr = saddr;
	w |= hit(watch_v4.lookup(&key));
	if (WATCH_DONE(w))
		return w;
#endif
#if VTAP_MATCH_DST
	key.addr = daddr;
	w |= hit(watch_v4.lookup(&key));
#endif
	return w;
}

static __always_inline int watched_v6(struct ipv6hdr *ip6)
{
	struct watch_v6_key key = {.prefixlen = 128};
	int w = 0;

#if VTAP_MATCH_SRC
	__builtin_memcpy(key.addr, &ip6->saddr, sizeof(key.addr));
	w |= hit(watch_v6.lookup(&key));
	if (WATCH_DONE(w))
		return w;
#endif
#if VTAP_MATCH_DST
	__builtin_memcpy(key.addr, &ip6->daddr, sizeof(key.addr));
	w |= hit(watch_v6.lookup(&key));
#endif
	return w;
}

#endif /* VTAP_WATCH_H */
