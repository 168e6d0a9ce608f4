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

#endif /* TC_PODS_H */
