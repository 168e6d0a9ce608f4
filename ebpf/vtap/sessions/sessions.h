/* sessions.h — structures the vTAP sessions program (tc_sessions.bpf.c) and
 * its Python class (tc_sessions.py, tables.py) both read.
 *
 * A session is a target (a local interface or a tunnel to a collector), its
 * ordered rules, a truncation length and a sampling rate. Rules are classified
 * the way packet classifiers do it at scale (bit vectors, Lakshman & Stiliadis):
 * every field of a frame is looked up once in a table of its own, each lookup
 * gives the set of rules that field allows as a bitmap, the bitmaps are ANDed,
 * and the lowest set bit of a session's rules is the first rule that matches.
 * The cost is the same six lookups for 1 rule as for SESS_RULES_MAX.
 *
 *   field               table                          entries
 *   direction           dir_bits   (array)             2
 *   protocol            proto_bits (array)             256
 *   source address      lpm4 / lpm6 (LPM trie), side 0 every prefix named by a rule
 *   destination address lpm4 / lpm6, side 1            (and /0)
 *   source port         sport_bits (array)             65536 ports + "no port"
 *   destination port    dport_bits (array)             65536 ports + "no port"
 *
 * Everything a frame is classified with is double-buffered: two generations,
 * config.gen says which is live. User space writes the other one whole, then
 * flips gen: a frame sees the old rules or the new, never a mix.
 */
#ifndef SESSIONS_H
#define SESSIONS_H

#include "verdict.h"
#include "vtap.h"  /* struct cut_counts */

#define SESS_MAX 16         /* sessions per program: one bit each in a u32 mask */
#define SESS_RULES_MAX 256  /* rules over all sessions: the bitmaps' width */
#define SESS_WORDS 4        /* SESS_RULES_MAX / 64 */
#define SESS_GENS 2
#define SESS_NO_PORT 65536  /* the port tables' last entry: frames without ports
                             * (fragments, ICMP, ...) look this one up */
#define SESS_PORT_SLOTS 65537
#define SESS_IF_SLOTS 256   /* per-interface counters: ifindex & (SESS_IF_SLOTS - 1) */
#define SESS_HDR_MAX 64     /* the encapsulation header template's room */
#define SESS_SAMPLE_MAX 4294967295

/* What the tap hands the sender in the copy's skb->cb[0]: a tag and the
 * sessions that take the copy. The sender marks what it sends with COPY, and
 * the tap never copies a frame marked so (a copy is never copied again). */
#define SESS_TAG_MASK 0xffff0000
#define SESS_TAG_TAP 0x5a7a0000
#define SESS_TAG_COPY 0x5a7c0000

/* Target kinds. */
#define SESS_T_LOCAL 0   /* an interface of this namespace */
#define SESS_T_VXLAN 1   /* UDP, RFC 7348 */
#define SESS_T_GENEVE 2  /* UDP, RFC 8926 */
#define SESS_T_GRE 3     /* GRE carrying Ethernet (0x6558), optional key */
#define SESS_T_ERSPAN2 4 /* GRE 0x88be with a sequence number, ERSPAN type II */
#define SESS_T_ERSPAN3 5 /* GRE 0x22eb with a sequence number, ERSPAN type III */

/* session.flags */
#define SESS_F_OUTER_V6 1     /* the collector is IPv6 */
#define SESS_F_FIT 2          /* cut copies to fit the path's MTU instead of counting them oversize */

struct sess_bits {
	__u64 w[SESS_WORDS];
};

struct sess_config {
	__u32 gen;           /* the live generation (0 or 1) */
	__u32 sender_ifindex; /* the device the sender runs on (its egress) */
	__u32 pad;
	__u64 cut_max[SESS_GENS];  /* per generation: the largest cutoff of its sessions (cutoff.h) */
	__u64 flow_idle_ns;        /* a flow idle this long starts again from zero */
};

/* One rule: which session it belongs to and what it decides. */
struct sess_rule {
	__u8 session;  /* slot in sessions (the session's order) */
	__u8 accept;   /* 1: copy, 0: do not (for this session) */
	__u8 whole;    /* 1: a held host's (an alert's): its frames go past the session's cutoff,
	                * and the first one it takes is stamped (rule_first) */
};

/* One session, as the program needs it. */
struct sess_session {
	struct sess_bits rules;   /* its rules' bits */
	__u32 shadow;             /* sessions after this one with the same target: a frame
	                           * this one copies is not copied by them again */
	__u32 sample_rate;        /* keep 1 in N accepted frames; 0 or 1 keeps all */
	__u32 sample_threshold;   /* keep when bpf_get_prandom_u32() < this */
	__u32 truncate;           /* copy at most this many bytes of the frame (0: whole) */
	__u32 ifindex;            /* the local target, or the interface towards the collector */
	__u32 mtu;                /* that interface's MTU (the path's, for a collector) */
	__u32 kind;               /* SESS_T_* */
	__u32 flags;              /* SESS_F_* */
	__u32 hdr_len;            /* bytes of hdr: outer IP, UDP or GRE, the tunnel header */
	__u8 hdr[SESS_HDR_MAX];   /* the encapsulation, as user space built it */
	__u64 cutoff;             /* payload bytes per flow and direction it copies (cutoff.h); 0: all */
};

/* Counters per session (per CPU; index gen * SESS_MAX + slot). The tap counts
 * what the rules decided, the sender what it sent. For a session:
 *     accepted = sampled_out + shadowed + cut + handed
 *     handed   = sent + oversize + failed   (+ what the kernel's action refused)  */
struct sess_stats {
	__u64 accepted;     /* frames its rules accepted */
	__u64 rejected;     /* frames a reject rule of it decided */
	__u64 sampled_out;  /* accepted, not the one in N kept */
	__u64 shadowed;     /* accepted, but an earlier session with the same target copied it */
	__u64 handed;       /* handed to the sender */
	__u64 sent;         /* copies sent to the target */
	__u64 sent_bytes;   /* their bytes as sent (encapsulation included) */
	__u64 frame_bytes;  /* the frames' bytes before truncation */
	__u64 truncated;    /* copies cut to the session's length (or to fit) */
	__u64 oversize;     /* not sent: longer than the path's MTU */
	__u64 failed;       /* not sent: the kernel refused to grow or send it */
	__u64 cut;          /* accepted and kept, but its flow is past the session's cutoff */
	__u64 cut_bytes;    /* their bytes */
};

/* Counters per interface slot (per CPU): every frame the tap sees, in fp
 * (verdict.h): pass (copied by no session: not_ip, malformed, unmatched,
 * sampled_out) or mirror (mirrored: at least one session copies it). */
struct sess_if_stats {
	struct fp_counts exits;
	__u64 own_copies;   /* copies this program sent, seen again: never copied */
	struct cut_counts cut; /* the flow table's (cutoff.h): what the sessions' cutoffs share */
};

/* LPM keys: generation, side (0 source, 1 destination), address. The prefix
 * length counts the 16 bits of generation and side. */
struct sess_lpm4_key {
	__u32 prefixlen;
	__u8 gen;
	__u8 side;
	__u8 addr[4];
};

struct sess_lpm6_key {
	__u32 prefixlen;
	__u8 gen;
	__u8 side;
	__u8 addr[16];
};

#endif /* SESSIONS_H */
