/* xdp_gen.bpf.c — the lab's traffic generator: transmit every frame it is given.
 *
 * User space feeds frames through BPF_PROG_TEST_RUN with live frames
 * (BPF_F_TEST_XDP_LIVE_FRAMES, kernel 5.18+, as xdp-trafficgen does): the
 * kernel runs this program on a page-pool copy of the frame, and XDP_TX sends
 * it out of the context's ingress device, i.e. into the veth peer.
 *
 * Why the program writes the frame itself, every time: the kernel copies the
 * frame into a page once, when the page pool first hands the page out, and
 * afterwards only resets the page's pointers. A veth passes the page itself
 * to its peer, so whoever rewrites the frame there (a router decrementing the
 * TTL, a NAT, an XDP redirect) rewrites the generator's page, and the page
 * comes back to the pool and out again rewritten. In a redirect bench half the
 * frames then arrived already translated and missed the rule. So user space
 * keeps every frame in `frames`, names the one of this call in `current`, and
 * each run copies it over the page: each frame leaves as scapy built it.
 */
#include <uapi/linux/bpf.h>

#ifndef GEN_MAX_FRAMES
#define GEN_MAX_FRAMES 1024
#endif
#ifndef GEN_MAX_LEN
#define GEN_MAX_LEN 1536
#endif

struct gen_stats {
	__u64 packets;
	__u64 bytes;
};

struct gen_frame {
	__u32 len;
	__u8 data[GEN_MAX_LEN];
};

/* What the program handed to the device; the device may still drop some (a
 * full peer ring), which its own counters report. */
BPF_PERCPU_ARRAY(stats, struct gen_stats, 1);
BPF_ARRAY(frames, struct gen_frame, GEN_MAX_FRAMES);
BPF_ARRAY(current, __u32, 1);

int xdp_gen(struct xdp_md *ctx)
{
	int zero = 0;
	__u32 *cur = current.lookup(&zero);
	struct gen_frame *f;
	struct gen_stats *s;
	__u64 len; /* 64 bits: a 32-bit one is tested in a zero-extended copy, not itself */

	if (!cur)
		return XDP_ABORTED;
	f = frames.lookup(cur);
	if (!f)
		return XDP_ABORTED;
	len = f->len;
	/* User space sets len to the frame's own length: the copy never changes
	 * the frame's size. */
	if (len != ctx->data_end - ctx->data)
		return XDP_ABORTED;
	/* The verifier needs len within the map value, and not 0, before it lets
	 * the helper read that many bytes from it. Two separate tests: clang would
	 * fold them into one unsigned compare of len - 1, whose bounds the
	 * verifier does not carry back to len (the empty asm keeps them apart). */
	if (len > GEN_MAX_LEN)
		return XDP_ABORTED;
	asm volatile("" : "+r"(len));
	if (len < 1)
		return XDP_ABORTED;
	if (bpf_xdp_store_bytes(ctx, 0, f->data, len))
		return XDP_ABORTED;
	s = stats.lookup(&zero);
	if (s) {
		s->packets++;
		s->bytes += len;
	}
	return XDP_TX;
}
