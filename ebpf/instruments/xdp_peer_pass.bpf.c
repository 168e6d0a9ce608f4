/* xdp_peer_pass.bpf.c — pass every frame on, unchanged, and count nothing.
 *
 * Why a program that does nothing: a frame that XDP sends into a veth (XDP_TX,
 * XDP_REDIRECT) is taken by the far end only when the far end has NAPI on, and
 * a native XDP program there is what turns it on. `python -m lab lb
 * --prepare-peer` (and the redirect's) attach this to the veth peer of a user's
 * interface while they run; its own name lets cleanup find one a killed run left.
 * Kernel: 5.9+ (native XDP on veth receiving XDP frames).
 */
#include <uapi/linux/bpf.h>

int xdp_peer_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}
