/* xdp_sink.bpf.c — count every frame and drop it (or pass it on) at the XDP hook.
 *
 * The lab's packet sink: receivers and monitors in throughput runs count here,
 * at the first place a frame can be seen, so the stack's own cost never limits
 * what they can absorb. Needs kernel 4.8+ (XDP), 5.9+ for native XDP on veth
 * receiving XDP_TX frames from its peer.
 * Built with -D SINK_VERDICT=XDP_DROP (default) or XDP_PASS.
 */
#include <uapi/linux/bpf.h>

#ifndef SINK_VERDICT
#define SINK_VERDICT XDP_DROP
#endif

struct sink_stats {
	__u64 packets;
	__u64 bytes;  /* frame bytes, Ethernet header included */
};

/* One per-CPU entry: no atomics, user space sums the CPUs. */
BPF_PERCPU_ARRAY(stats, struct sink_stats, 1);

int xdp_sink(struct xdp_md *ctx)
{
	int zero = 0;
	struct sink_stats *s = stats.lookup(&zero);

	if (s) { /* the verifier insists on the NULL check even for index 0 */
		s->packets++;
		s->bytes += ctx->data_end - ctx->data;
	}
	return SINK_VERDICT;
}
