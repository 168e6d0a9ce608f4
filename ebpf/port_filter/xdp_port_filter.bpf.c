/* xdp_port_filter.bpf.c — drop TCP and UDP frames to the ports on a list, at
 * the XDP hook, before the kernel builds an skb for them. The worked example
 * of docs/adding-a-fast-path.md: a new program on the lab's shared skeleton,
 * compared with the nftables rule a user would write instead.
 *
 * Kernel: 5.x+ (any kernel with XDP); built and tested on 6.x.
 * Loaded by ebpf/port_filter/xdp_port_filter.py (class XdpPortFilter), which fills `ports`.
 *
 * It parses with the shared parse_l4() and every return goes through
 * xdp_exit() (verdict.h): a frame is `filtered` (dropped) when its protocol
 * and destination port are on the list, else passed untouched, counted by what
 * it is (not_ip, malformed, fragment, unmatched). A fragment after the first
 * has no ports: it passes, as nftables' `th dport` does not match it either.
 */
#include <uapi/linux/bpf.h>
#include "parsing_helpers.h"
#include "verdict.h"

#ifndef PORT_FILTER_MAX
#define PORT_FILTER_MAX 1024
#endif

struct port_key {
	__u16 port;  /* host byte order */
	__u8 proto;  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
};

struct port_filter_stats {
	struct fp_counts exits;
};

BPF_HASH(ports, struct port_key, __u8, PORT_FILTER_MAX);   /* (port, proto) -> 1: what to drop; user space */
BPF_PERCPU_ARRAY(stats, struct port_filter_stats, 1);     /* verdicts and reasons; the program */

int xdp_port_filter(struct xdp_md *ctx)
{
	struct l4_pkt p = {};
	struct port_key key = {};
	__u32 zero = 0;
	int parsed;
	struct port_filter_stats *st = stats.lookup(&zero);

	if (!st) /* an array's index 0 always exists; the verifier wants the check */
		return XDP_PASS;
	st->exits.seen++;
	parsed = parse_l4((void *)(long)ctx->data, (void *)(long)ctx->data_end, &p, PARSE_L4);
	if (parsed != PARSE_OK)
		return xdp_exit(&st->exits, XDP_PASS, parse_reason(parsed));
	key.port = bpf_ntohs(*p.dport);
	key.proto = p.l4;
	if (ports.lookup(&key))
		return xdp_exit(&st->exits, XDP_DROP, R_FILTERED);
	return xdp_exit(&st->exits, XDP_PASS, R_UNMATCHED);
}
