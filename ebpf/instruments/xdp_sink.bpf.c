/* xdp_sink.bpf.c — count every frame at the XDP hook, then give one verdict.
 *
 * The lab's packet sink: receivers and monitors in throughput runs count here,
 * at the first place a frame can be seen, so the stack's own cost never limits
 * what they can absorb. The same program, with another verdict, is the
 * simplest program of each kind the XDP-modes bench compares (after the
 * Cilium/SmartNIC benchmark note): drop, pass, send back (XDP_TX: out of the
 * same device, nothing rewritten) and redirect (XDP_REDIRECT to one other
 * device, nothing rewritten).
 * Needs kernel 4.8+ (XDP), 5.9+ for native XDP on veth receiving XDP_TX frames.
 * Built with -D SINK_VERDICT=XDP_DROP (default), XDP_PASS, XDP_TX or
 * XDP_REDIRECT, the last with -D SINK_REDIRECT_IFINDEX=<ifindex>.
 * With -D SINK_SWAP_MACS (and XDP_TX) it swaps the Ethernet addresses first:
 * the least a program must do to send a frame back where it came from, which
 * makes it the floor a load balancer's XDP_TX path is measured against (the
 * program of xdp-tools' `xdp-bench tx -m swap`).
 * With -D SINK_MATCH_SRC4=<address, network order> and -D SINK_MATCH_DPORT=<port>
 * it counts only the lab's own frames (IPv4 UDP from that source to that port),
 * and passes every other frame on uncounted: on a real NIC, LLDP, neighbour
 * discovery and the host's own traffic arrive too, and must neither be counted
 * nor dropped. With -D SINK_WINDOW it also keeps the times of this CPU's counted
 * frames that a host's rates are taken over (its own window, nothing polled):
 * the first frame's, and the last of those that opened a tick of the coarse
 * clock or a new 64 frames. Reading the precise clock for every frame cost the
 * DUT a sixth of its rate at 64 B (1515 against 1274 kpps, on a 2-vCPU VM); the
 * coarse clock is a load of what the timer tick wrote. So the window ends at
 * most 63 frames' or one tick's time before the last frame (at 1.5 Mpps, 42 us;
 * below a frame per tick, every frame is stamped).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#ifdef SINK_MATCH_DPORT
/* uapi in.h includes <linux/socket.h>, which on BCC's include path is the kernel's
 * own (and 199 headers with it): uapi's socket.h instead, its guard set, as
 * parsing_helpers.h does */
#include <uapi/linux/socket.h>
#ifndef _LINUX_SOCKET_H
#define _LINUX_SOCKET_H
#endif
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/udp.h>
#endif

#ifndef SINK_VERDICT
#define SINK_VERDICT XDP_DROP
#endif

struct sink_stats {
	__u64 packets;
	__u64 bytes;  /* frame bytes, Ethernet header included */
#ifdef SINK_WINDOW
	__u64 first_ns; /* bpf_ktime_get_ns() of this CPU's first counted frame */
	__u64 last_ns;  /* and of the last one that opened a tick or a new 64 */
	__u64 tick_ns;  /* bpf_ktime_get_coarse_ns() then */
#endif
};

/* One per-CPU entry: no atomics, user space sums the CPUs. */
BPF_PERCPU_ARRAY(stats, struct sink_stats, 1);

int xdp_sink(struct xdp_md *ctx)
{
	int zero = 0;
	struct sink_stats *s;

#ifdef SINK_MATCH_DPORT
	{
		void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
		struct ethhdr *eth = data;
		struct iphdr *ip = (void *)(eth + 1);
		struct udphdr *udp;

		/* each header bounds-checked before it is read: the verifier's rule */
		if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
			return XDP_PASS;
		if (ip->protocol != IPPROTO_UDP || ip->saddr != SINK_MATCH_SRC4 || ip->ihl != 5)
			return XDP_PASS;
		udp = (void *)(ip + 1);
		if ((void *)(udp + 1) > data_end || udp->dest != bpf_htons(SINK_MATCH_DPORT))
			return XDP_PASS;
	}
#endif
	s = stats.lookup(&zero);

	if (s) { /* the verifier insists on the NULL check even for index 0 */
#ifdef SINK_WINDOW
		__u64 tick = bpf_ktime_get_coarse_ns();

		if (!s->packets || tick != s->tick_ns || !(s->packets & 63)) {
			__u64 now = bpf_ktime_get_ns();

			if (!s->packets)
				s->first_ns = now;
			s->last_ns = now;
			s->tick_ns = tick;
		}
#endif
		s->packets++;
		s->bytes += ctx->data_end - ctx->data;
	}
#ifdef SINK_SWAP_MACS
	{
		void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
		struct ethhdr *eth = data;
		unsigned char tmp[ETH_ALEN];

		if ((void *)(eth + 1) > data_end)
			return XDP_DROP;
		__builtin_memcpy(tmp, eth->h_dest, ETH_ALEN);
		__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
		__builtin_memcpy(eth->h_source, tmp, ETH_ALEN);
	}
#endif
#ifdef SINK_REDIRECT_IFINDEX /* (the verdicts are an enum: #if cannot compare them) */
	return bpf_redirect(SINK_REDIRECT_IFINDEX, 0);
#else
	return SINK_VERDICT;
#endif
}
