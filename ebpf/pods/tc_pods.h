/* tc_pods.h — what tc_pods.bpf.c and its class (tc_pods.py) share: sizes,
 * modes, and the maps' keys and values. Python reads the #defines (ebpf.abi)
 * and BCC gives it the structs. */
#ifndef TC_PODS_H
#define TC_PODS_H

#define PODS_MAX 1024         /* pods on this node (addresses: one or two per pod) */
#define PODS_SLOTS 256        /* counter rows: slot 0 is the node's (no pod), then one per pod */
#define PODS_REMOTE_MAX 1024  /* other nodes' pod prefixes */

#define PODS_MODE_NATIVE 0    /* another node's pod: routed by the FIB, out of the uplink */
#define PODS_MODE_TUNNEL 1    /* another node's pod: through the VXLAN device, to its node */

#define PODS_TUNNEL_TTL 64    /* the outer header's TTL, as the kernel's VXLAN device sets by default */

/* A pod's address: IPv4 in a[0], family 4 or 6. */
struct pod_addr {
	__u32 a[4];
	__u32 family;
};

/* How to hand a frame to a pod on this node. */
struct pod_ep {
	__u32 ifindex;            /* the pod's host-side veth, in the node's namespace */
	__u32 slot;               /* its counters' row */
	unsigned char mac[6];     /* the pod's own interface's MAC (inside the pod) */
	unsigned char node_mac[6];/* the host-side veth's MAC: the pod's gateway, the frames' source */
};

/* Another node's pod prefix (a longest-prefix-match key: prefixlen counts the
 * family's 32 bits, then the address's). */
struct pod_prefix {
	__u32 prefixlen;
	__u32 family;
	__u32 a[4];
};

/* The node a remote prefix lives on: its underlay address (tunnel mode). */
struct pod_node {
	__u32 a[4];
	__u32 family;             /* 0 in native mode: the FIB knows the way */
};

struct pods_conf {
	__u32 mode;               /* PODS_MODE_* */
	__u32 tunnel_ifindex;     /* the collect-metadata VXLAN device (tunnel mode) */
	__u32 vni;                /* the tunnel's VXLAN network identifier */
	__u32 pad;
};

/* Services (ClusterIP-like): an address, port and protocol that stand for a set
 * of backends, chosen per connection through the service's Maglev table
 * (ebpf/lb/maglev.py), at connect()/sendmsg() by the cgroup programs, or per
 * packet at the pod's veth for sockets outside that cgroup. */
/* sizes: defaults, which TcPods(max_services=, max_entries=, max_backends=) override */
#ifndef PODS_SVC_MAX
#define PODS_SVC_MAX 16384        /* services */
#endif
#ifndef PODS_SVC_ENTRIES_MAX
#define PODS_SVC_ENTRIES_MAX 65536 /* service-backend entries: each service's backend slots (Cilium's default) */
#endif
#ifndef PODS_BACKENDS_MAX
#define PODS_BACKENDS_MAX 65536   /* distinct backends of all services */
#endif
#define PODS_NAT_MAX 65536        /* per-packet translations remembered (LRU): replies find their service */
#define PODS_SOCK_REV_MAX 65536   /* UDP sockets' translations (LRU): recvmsg() gives the service back */

struct svc_key {
	__u32 a[4];
	__be16 port;
	__u8 proto;               /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 family;              /* 4 or 6 */
};

struct svc_val {
	__u32 id;                 /* its backend slots: svc_slots {id, 0 .. count - 1} */
	__u32 count;              /* backends; 0: the service refuses (connect: EPERM; a packet: dropped) */
};

/* One of a service's backends: slot 0 .. count - 1 -> a backends index (Cilium's
 * lb4_services_v2 keeps its backends the same way, by service and slot). */
struct svc_slot_key {
	__u32 id;
	__u32 slot;
};

struct svc_backend {
	__u32 a[4];
	__be16 port;
	__u16 family;
};

/* A per-packet translation, keyed by what its replies carry (source: the
 * backend; destination: the client). The value is the service to put back. */
struct svc_nat_key {
	__u32 saddr[4], daddr[4];
	__be16 sport, dport;
	__u8 proto, family;
	__u8 reply;               /* 0: the flow's way to its backend; 1: its replies' way back */
	__u8 pad;
};

/* A UDP socket's translation: its cookie and the backend it was sent to. */
struct svc_sock_key {
	__u64 cookie;
	__u32 a[4];
	__be16 port;
	__u16 family;
	__u32 pad;
};

/* The cgroup programs' counters (one row: a socket belongs to no pod slot). */
struct svc_sock_stats {
	__u64 connect;            /* connect() to a service, sent to a backend */
	__u64 sendmsg;            /* sendmsg() to a service, sent to a backend */
	__u64 recvmsg;            /* a reply's source given back as the service */
	__u64 refused;            /* to a service without backends */
};

#endif /* TC_PODS_H */
