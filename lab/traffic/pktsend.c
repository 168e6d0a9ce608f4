/* The XDP generator's other way out (xdpgen.py): when the kernel refuses
 * BPF_PROG_TEST_RUN with live frames, the same frames are handed to the same
 * device through an AF_PACKET socket that bypasses the qdisc, in batches of
 * sendmmsg(2). Built as a shared library with cc on first use (ebpf.ctools). */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/if_packet.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define BATCH 256

/* A socket that sends on ifindex (in the caller's namespace) and receives
 * nothing (protocol 0: no receive hook, so it costs the stack nothing). */
int pktsend_open(int ifindex)
{
	int one = 1, fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
	struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_ifindex = ifindex};

	if (fd < 0)
		return -errno;
	/* straight to the driver, as the live frames go: no qdisc in the way */
	if (setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&sll, sizeof(sll)) < 0) {
		int err = errno;

		close(fd);
		return -err;
	}
	return fd;
}

/* Hand `count` copies of the frame to the device. Returns how many were handed,
 * or -errno. A frame the device drops (its peer's queue full) fails with
 * ENOBUFS: it was handed, and the device counted it in tx_dropped as it counts a
 * live frame it drops, so it is counted here too and the next one goes. */
long pktsend_send(int fd, const void *frame, unsigned int len, long count)
{
	struct iovec iov = {.iov_base = (void *)frame, .iov_len = len};
	struct mmsghdr msgs[BATCH];
	long sent = 0;

	memset(msgs, 0, sizeof(msgs));
	for (int i = 0; i < BATCH; i++) {
		msgs[i].msg_hdr.msg_iov = &iov;
		msgs[i].msg_hdr.msg_iovlen = 1;
	}
	while (sent < count) {
		unsigned int n = count - sent < BATCH ? count - sent : BATCH;
		int r = sendmmsg(fd, msgs, n, 0);

		if (r < 0) {
			if (errno == ENOBUFS)
				sent++;
			else if (errno != EINTR)
				return -errno;
			continue;
		}
		/* Short: message r failed, and sendmmsg returns the count before it
		 * and loses its error. The frames are alike, so what fails one of them
		 * alone is the device's drop (ENOBUFS): counted, as above. An error
		 * that lasts fails the next call's first message, and is returned. */
		sent += r + ((unsigned int)r < n);
	}
	return sent;
}
