/* xdp_lb.h — what xdp_lb.bpf.c and ebpf/lb/xdp_lb.py (through ebpf/abi.py) share:
 * sizes, modes, session states and the layout of every map's key and value.
 * The load balancer's other parts: xdp_lb_maps.h (its maps), xdp_lb_flow.h
 * (hashing and comparing flows), xdp_lb.bpf.c (sessions and the program).
 */
#ifndef XDP_LB_H
#define XDP_LB_H

#include "verdict.h"

/* table sizes: defaults, which XdpLoadBalancer(max_services=, max_backends=, max_sessions=,
 * max_half_open=) override */
#ifndef LB_MAX_SERVICES
#define LB_MAX_SERVICES 64      /* each a Maglev table of LB_RING_SIZE u32, 8 bytes a slot in an array map: 512 KiB */
#endif
#ifndef LB_MAX_BACKENDS
#define LB_MAX_BACKENDS 4097    /* index 0 is "no backend": a ring slot of 0 is empty */
#endif
#define LB_RING_SIZE 65537      /* Maglev table per service, a prime (ebpf/lb/maglev.py) */
#ifndef LB_MAX_SESSIONS
#define LB_MAX_SESSIONS 131072  /* established sessions, each direction */
#endif
#ifndef LB_MAX_HALF_OPEN
#define LB_MAX_HALF_OPEN 65536  /* SYN-created sessions: a SYN flood evicts only these */
#endif
/* the reverse tables (NAT's LB ports): as large as the sessions they belong to; in DSR
 * unused, so XdpLoadBalancer makes them one entry each */
#ifndef LB_MAX_REVERSE
#define LB_MAX_REVERSE LB_MAX_SESSIONS
#endif
#ifndef LB_MAX_REVERSE_HALF
#define LB_MAX_REVERSE_HALF LB_MAX_HALF_OPEN
#endif
#define LB_PORT_PROBES 8        /* LB ports tried for a new session before the SYN is dropped */

#define LB_MODE_NAT 0           /* client -> LB -> backend, replies back through the LB (the articles') */
#define LB_MODE_DSR 1           /* only the destination MAC changes; the backend answers the client */

/* session states (struct lb_session.state) */
#define LB_ST_SYN 1             /* the client's SYN went to the backend */
#define LB_ST_EST 2             /* the handshake completed: in the established tables */
#define LB_ST_UDP 3
#define LB_FIN_CLIENT 0x10      /* who has sent a FIN, as XdpLoadBalancer.sessions() says it */
#define LB_FIN_BACKEND 0x20
/* struct lb_session.closing[side], side 0 the client, 1 the backend */
#define LB_CL_FIN 1             /* this side sent its FIN */
#define LB_CL_ACKED 2           /* this side acknowledged the other side's FIN */
#define LB_CL_DONE (LB_CL_FIN | LB_CL_ACKED)

/* timeouts, index into conf.timeout_ns */
#define LB_TO_SYN 0
#define LB_TO_EST 1
#define LB_TO_FIN 2
#define LB_TO_UDP 3
#define LB_TIMEOUTS 4

struct lb_addr {
	__u32 a[4];             /* IPv4 in a[0], network order */
};

struct lb_service_key {
	struct lb_addr vip;
	__be16 port;
	__u8 proto;
	__u8 family;            /* 4 or 6 */
};

struct lb_service {
	__u32 id;               /* 0..LB_MAX_SERVICES-1: its ring and its counters */
};

/* by service id: what replies leave as */
struct lb_service_info {
	struct lb_addr vip;
	__be16 port;
	__u8 proto;
	__u8 family;
};

struct lb_backend {
	struct lb_addr addr;
	__be16 port;
	__u8 family;
	__u8 live;              /* 1 once user space has written it */
};

/* a flow as the client sent it */
struct lb_flow_key {
	struct lb_addr client;
	__be16 cport;
	__u16 service;
	__u8 proto;
	__u8 pad[3];
};

struct lb_session {
	__u64 last_seen;        /* ns, bpf_ktime_get_ns() */
	__u32 backend;
	__be16 lb_port;         /* NAT: the source port towards the backend */
	__u8 state;
	__u8 pad;
	unsigned char client_mac[6];   /* where replies go (NAT): the client's frame said */
	unsigned char backend_mac[6];  /* from bpf_fib_lookup() when the session began */
	/* How far each side has closed (LB_CL_*), each byte written by its own side's
	 * packets only: the two directions run on two CPUs at once, and one writing
	 * the other's byte could undo a mark. */
	__u8 closing[2];
	__u8 pad2[2];
	__u32 fin_ack[2];       /* per side: the ACK number that acknowledges its FIN (host order) */
};

/* a reply as the backend sends it (NAT): which session owns this LB port */
struct lb_reverse_key {
	struct lb_addr backend;
	__be16 bport;
	__be16 lb_port;
	__u8 proto;
	__u8 family;
	__u8 pad[2];
};

struct lb_conf {
	struct lb_addr self4;   /* the LB's own addresses: the NAT source towards backends */
	struct lb_addr self6;
	__u16 port_min;         /* LB ports, host order: [port_min, port_min + port_count) */
	__u16 port_count;
	__u32 pad;
	__u64 timeout_ns[LB_TIMEOUTS];
};

/* Per CPU, one entry. Every frame is counted in fp (verdict.h): seen; its
 * verdict (tx, pass, drop); its reason: to_backend, to_client (rewritten and
 * sent back out), not_ip, malformed, unmatched (the stack's: passed), or why it
 * was dropped: fragment, ip_options, malformed, no_backend, no_port,
 * no_session, no_neigh, stale. Beside them, what happened to sessions: */
struct lb_stats {
	struct fp_counts exits;
	__u64 new_sessions;
	__u64 established;
	__u64 closed_rst;
	__u64 closed_fin;
	__u64 expired;
	__u64 csum_partial;     /* sent on with a TCP/UDP checksum the sender's offload had left
	                         * partial (rewrite_helpers.h): finished natively, kept partial
	                         * in generic mode. Not a verdict: counted beside them */
};

/* per backend */
struct lb_traffic {
	__u64 packets;
	__u64 bytes;
	__u64 reply_packets;
	__u64 reply_bytes;
	__u64 new_sessions;
};

#endif /* XDP_LB_H */
