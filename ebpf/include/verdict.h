/* verdict.h — one exit for every program of the lab, and one set of names
 * for what it found and what it did.
 *
 * Every frame a program runs on is counted in `seen` as it arrives, then at
 * its one exit (every return goes through fp_exit()) in exactly one verdict,
 * what the program did with it, and in exactly one reason, why. A frame
 * dropped is counted once more, in `dropped` by its reason, so a tool can say
 * what it dropped and why without knowing which reasons drop. So for every
 * program, on every path:
 *
 *     seen == sum(verdict) == sum(reason)        dropped[r] <= reason[r]
 *
 *     return fp_exit(&st->exits, V_PASS, R_NOT_IP, XDP_PASS);
 *
 * The names are the counters' names in Python (ebpf/abi.py reads these
 * #defines, ebpf/program.py turns the arrays into named counters), and a name
 * means the same in every program: a frame that is not IP is `not_ip` in the
 * vTAP, the redirect, the load balancer and the port filter alike.
 */
#ifndef VERDICT_H
#define VERDICT_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include "parsing_helpers.h"  /* parse_l4()'s results, which parse_reason() names */

/* Verdicts: what the program did with the frame. */
#define V_PASS 0      /* on to the kernel untouched or rewritten (XDP_PASS, TC_ACT_OK; the vTAP: not copied) */
#define V_DROP 1
#define V_TX 2        /* back out of the interface it came in on (XDP_TX) */
#define V_REDIRECT 3  /* out of another interface (XDP_REDIRECT, TC_ACT_REDIRECT) */
#define V_MIRROR 4    /* copied to a monitor, the original passed on (the vTAP) */
#define V_ABORTED 5   /* anything else: a program error (XDP_ABORTED) */
#define V_COUNT 6

/* Reasons: what the program found. */
#define R_NOT_IP 0      /* not IPv4/IPv6 (ARP, LLDP, ...) */
#define R_MALFORMED 1   /* a header cut short or invalid, or a length the frame does not hold */
#define R_FRAGMENT 2    /* an IP fragment: there are no ports to look at (but in the first piece) */
#define R_UNMATCHED 3   /* IP, but for none of the program's rules, services or watch-list entries */
#define R_IP_OPTIONS 4  /* a service's, with IPv4 options or IPv6 extension headers */
#define R_TO_BACKEND 5  /* rewritten towards a backend */
#define R_TO_CLIENT 6   /* a reply, rewritten back towards the client */
#define R_NO_BACKEND 7  /* no live backend for it */
#define R_NO_PORT 8     /* no free source port for a new session (NAT) */
#define R_NO_SESSION 9  /* TCP that opens nothing and belongs to no session */
#define R_NO_NEIGH 10   /* the next hop's MAC is not known yet */
#define R_STALE 11      /* a half-open session whose port another session has since taken */
#define R_SAMPLED_OUT 12 /* watched, but not the one in N that is copied */
#define R_MIRRORED 13   /* watched, and its copy handed to the kernel */
#define R_CLONE_FAILED 14 /* watched, but the kernel refused the copy (bpf_clone_redirect) */
#define R_FILTERED 15   /* matched a rule that drops it (the port filter) */
/* Why a frame a program would send out itself went to the kernel instead (the
 * XDP vTAP; R_NO_NEIGH above too): the kernel then resolves, answers or refuses
 * it as a router does, which a program should not redo. */
#define R_TTL_EXPIRED 16 /* TTL / hop limit <= 1: the kernel sends the ICMP error */
#define R_TOO_BIG 17     /* longer than the egress's (or the monitor's) MTU */
#define R_NO_ROUTE 18    /* a route that refuses it (unreachable, blackhole, prohibit), or forwarding off */
#define R_NOT_FORWARDED 19 /* the routes do not forward it: for this node itself, a broadcast, or no route at all */
#define R_NO_XDP_EGRESS 20 /* its egress cannot take XDP frames (a veth whose peer runs no XDP, a bridge) */
#define R_VLAN 21        /* VLAN-tagged: which subinterface routes it is the kernel's business */
/* The pod datapath's ways (ebpf/pods) */
#define R_LOCAL_POD 22   /* to a pod on this node: into it through its veth (bpf_redirect_peer) */
#define R_REMOTE_POD 23  /* to a pod on another node, routed by the FIB (native routing) */
#define R_TUNNELED 24    /* to a pod on another node, through the tunnel to that node */
/* The vTAP's per-flow cutoff (ebpf/vtap/cutoff.h) */
#define R_CUT 25         /* watched, but its flow is past the cutoff in this direction: not copied */
#define R_COUNT 26
#define R_SLOTS 32 /* the arrays' room: a power of two, for the mask in fp_exit() */

/* fp_exit() masks its indexes so the verifier can bound them: the masks must
 * cover every verdict and reason, and the arrays the masks. */
_Static_assert(V_COUNT <= 8, "fp_exit() masks a verdict with 7: V_COUNT outgrew it");
_Static_assert(R_SLOTS == 32, "fp_exit() masks a reason with 31 (R_SLOTS - 1)");
_Static_assert(R_COUNT <= R_SLOTS, "more reasons than the counters' arrays hold: raise R_SLOTS and the mask");

struct fp_counts {
	__u64 seen;
	__u64 verdict[V_COUNT];
	__u64 reason[R_SLOTS];
	__u64 dropped[R_SLOTS];  /* the reasons of the frames dropped */
};

/* The one exit: count the verdict and the reason, return the hook's code for
 * it. Out-of-range indexes count as aborted and malformed. The masks are
 * made in inline assembly because the compiler drops a mask it can prove
 * redundant after the compare, and may then index with a copy of the value
 * whose bounds the verifier no longer knows ("unbounded memory access"). */
static __always_inline int fp_exit(struct fp_counts *fp, int verdict, int reason, int code)
{
	__u64 v = (__u32)verdict < V_COUNT ? (__u32)verdict : V_ABORTED;
	__u64 r = (__u32)reason < R_COUNT ? (__u32)reason : R_MALFORMED;

	asm volatile("%0 &= 7" : "+r"(v));
	asm volatile("%0 &= 31" : "+r"(r)); /* R_SLOTS - 1 */
	fp->verdict[v]++;
	fp->reason[r]++;
	if (verdict == V_DROP)
		fp->dropped[r]++;
	return code;
}

/* The reason of a frame parse_l4() stopped short of what a program looks at,
 * in every program's words: not IP, a fragment (no ports to match), IP that is
 * neither TCP nor UDP (no rule, service or port can be for it), or cut short. */
static __always_inline int parse_reason(int parsed)
{
	if (parsed == PARSE_NOT_IP)
		return R_NOT_IP;
	if (parsed == PARSE_FRAGMENT)
		return R_FRAGMENT;
	if (parsed == PARSE_OTHER)
		return R_UNMATCHED;
	return R_MALFORMED; /* PARSE_MALFORMED, PARSE_SHORT_L4 */
}

/* An XDP program's action, as a verdict (an if chain: clang may turn a switch
 * into a jump table, which BPF has not). */
static __always_inline int xdp_exit(struct fp_counts *fp, int action, int reason)
{
	int v = action == XDP_PASS ? V_PASS : action == XDP_DROP ? V_DROP : action == XDP_TX ? V_TX :
		action == XDP_REDIRECT ? V_REDIRECT : V_ABORTED;

	return fp_exit(fp, v, reason, action);
}

/* A direct-action TC program's return code, as a verdict: TC_ACT_UNSPEC (on to
 * the next filter, then the stack) passes as TC_ACT_OK does. */
static __always_inline int tc_exit(struct fp_counts *fp, int action, int reason)
{
	int v = action == TC_ACT_OK || action == TC_ACT_UNSPEC ? V_PASS : action == TC_ACT_SHOT ? V_DROP :
		action == TC_ACT_REDIRECT ? V_REDIRECT : V_ABORTED;

	return fp_exit(fp, v, reason, action);
}

#endif /* VERDICT_H */
