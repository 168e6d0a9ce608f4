/* tc_swap.bpf.c — the least a TC program must do to send a frame back where it
 * came from: count it, swap its Ethernet addresses and redirect it out of the
 * interface it arrived on (bpf_redirect to its own ifindex, egress). The TC twin
 * of xdp_sink.bpf.c with SINK_SWAP_MACS and XDP_TX (xdp-tools' `xdp-bench tx -m
 * swap`): the floor the load balancer at TC is measured against, as the XDP
 * one's is against that. Without the swap a bridge would drop the frame (it
 * would come back from the address it is sent to).
 * Needs kernel 4.4+ (cls_bpf direct-action, bpf_redirect); attached as a classic
 * clsact ingress filter (ebpf/tc.py).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/pkt_cls.h>

struct swap_stats {
	__u64 packets;
	__u64 bytes;  /* frame bytes, Ethernet header included */
};

/* One per-CPU entry: no atomics, user space sums the CPUs. */
BPF_PERCPU_ARRAY(stats, struct swap_stats, 1);

int tc_swap(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	unsigned char mac[ETH_ALEN];
	__u32 zero = 0;
	struct swap_stats *s;

	/* the Ethernet header is in the linear data of every skb cls_bpf sees */
	if ((void *)(eth + 1) > data_end)
		return TC_ACT_UNSPEC;
	s = stats.lookup(&zero);
	if (s) {
		s->packets++;
		s->bytes += skb->len;
	}
	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	return bpf_redirect(skb->ifindex, 0);
}
