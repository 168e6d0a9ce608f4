/* xdp_gen.bpf.c — the lab's traffic generator: transmit every frame it is given.
 *
 * User space feeds frames through BPF_PROG_TEST_RUN with live frames
 * (BPF_F_TEST_XDP_LIVE_FRAMES, kernel 5.18+, as xdp-trafficgen does): the
 * kernel runs this program on a page-pool copy of the frame, and XDP_TX sends
 * it out of the context's ingress device, i.e. into the veth peer. Nothing is
 * rewritten here, so checksums stay as scapy computed them.
 */
#include <uapi/linux/bpf.h>

struct gen_stats {
	__u64 packets;
	__u64 bytes;
};

/* What the program handed to the device; the device may still drop some (a
 * full peer ring), which its own counters report. */
BPF_PERCPU_ARRAY(stats, struct gen_stats, 1);

int xdp_gen(struct xdp_md *ctx)
{
	int zero = 0;
	struct gen_stats *s = stats.lookup(&zero);

	if (s) {
		s->packets++;
		s->bytes += ctx->data_end - ctx->data;
	}
	return XDP_TX;
}
