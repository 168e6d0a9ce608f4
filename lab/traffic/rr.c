/* rr: request/response over TCP, netperf's TCP_RR and TCP_CRR shapes (netperf is not
 * in Debian's main archive; lab/traffic/rr.py builds this with cc and runs it).
 *
 * usage: rr serve PORT
 *          answers every byte it reads with one byte, on any address (IPv4 and IPv6),
 *          for any number of connections (one thread, epoll); prints "ready" once it
 *          listens
 *        rr rr  ADDR PORT SECONDS THREADS OUTFILE
 *          each thread holds one connection and sends one byte, waits for the one back,
 *          again (a transaction), for SECONDS
 *        rr crr ADDR PORT SECONDS THREADS OUTFILE
 *          each transaction is a new connection: connect, one byte each way, close. The
 *          client closes with a reset (SO_LINGER 0), so no TIME_WAIT piles up on either
 *          side over a run of many thousand connections
 * OUTFILE receives each transaction's time (uint32 nanoseconds / 100, i.e. 0.1 us
 * units) in completion order, per thread; stdout one JSON line: transactions, errors,
 * seconds.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64
#define MAX_SAMPLES (1u << 22) /* per thread: 4 M transactions timed (more are counted) */

static struct sockaddr_storage dst;
static socklen_t dst_len;
static double seconds;
static int crr;

struct worker {
	pthread_t t;
	uint32_t *lat;
	uint64_t n, errors;
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int dial(void)
{
	int fd = socket(dst.ss_family, SOCK_STREAM, 0), one = 1;

	if (fd < 0)
		return -1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&dst, dst_len) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static void hang_up(int fd)
{
	struct linger l = {1, 0};

	setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
	close(fd);
}

static int one_byte(int fd)
{
	char c = 'x';

	if (write(fd, &c, 1) != 1)
		return -1;
	return read(fd, &c, 1) == 1 ? 0 : -1;
}

static void *client(void *arg)
{
	struct worker *w = arg;
	double end = now() + seconds, t0, t1;
	int fd = -1;

	while ((t0 = now()) < end) {
		if (fd < 0 && (fd = dial()) < 0) {
			w->errors++;
			usleep(1000);
			continue;
		}
		if (one_byte(fd) < 0) {
			w->errors++;
			hang_up(fd);
			fd = -1;
			continue;
		}
		if (crr) {
			hang_up(fd);
			fd = -1;
		}
		t1 = now();
		if (w->n < MAX_SAMPLES) {
			double units = (t1 - t0) * 1e7;
			w->lat[w->n] = units > 4e9 ? 4000000000u : (uint32_t)units;
		}
		w->n++;
	}
	if (fd >= 0)
		hang_up(fd);
	return NULL;
}

static int serve(const char *port)
{
	int ls = socket(AF_INET6, SOCK_STREAM, 0), one = 1, zero = 0, ep = epoll_create1(0);
	struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(atoi(port))};
	struct epoll_event ev = {.events = EPOLLIN}, evs[256];

	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	setsockopt(ls, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)); /* IPv4 too */
	if (bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(ls, 4096) < 0) {
		perror("rr serve");
		return 1;
	}
	ev.data.fd = ls;
	epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int n = epoll_wait(ep, evs, 256, -1);

		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd;
			char buf[64];

			if (fd == ls) {
				int c = accept4(ls, NULL, NULL, SOCK_NONBLOCK);

				if (c >= 0) {
					setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
					ev.data.fd = c;
					epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
				}
				continue;
			}
			ssize_t r = read(fd, buf, sizeof(buf));

			if (r <= 0) {
				if (r < 0 && errno == EAGAIN)
					continue;
				close(fd); /* also leaves the epoll set */
				continue;
			}
			for (ssize_t k = 0; k < r; k++)
				if (write(fd, "y", 1) != 1)
					break;
		}
	}
}

int main(int argc, char **argv)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST}, *ai;
	struct worker w[MAX_THREADS] = {0};
	int threads;
	uint64_t total = 0, errors = 0;
	double t0;
	FILE *out;

	if (argc == 3 && !strcmp(argv[1], "serve"))
		return serve(argv[2]);
	if (argc != 7 || (strcmp(argv[1], "rr") && strcmp(argv[1], "crr"))) {
		fprintf(stderr, "usage: rr serve PORT | rr {rr|crr} ADDR PORT SECONDS THREADS OUTFILE\n");
		return 2;
	}
	crr = !strcmp(argv[1], "crr");
	if (getaddrinfo(argv[2], argv[3], &hints, &ai) != 0) {
		fprintf(stderr, "rr: bad address %s\n", argv[2]);
		return 2;
	}
	memcpy(&dst, ai->ai_addr, ai->ai_addrlen);
	dst_len = ai->ai_addrlen;
	freeaddrinfo(ai);
	seconds = atof(argv[4]);
	threads = atoi(argv[5]);
	if (threads < 1 || threads > MAX_THREADS || seconds <= 0) {
		fprintf(stderr, "rr: threads 1..%d and seconds > 0\n", MAX_THREADS);
		return 2;
	}
	t0 = now();
	for (int i = 0; i < threads; i++) {
		w[i].lat = malloc(sizeof(uint32_t) * MAX_SAMPLES);
		if (!w[i].lat || pthread_create(&w[i].t, NULL, client, &w[i])) {
			fprintf(stderr, "rr: cannot start thread %d\n", i);
			return 1;
		}
	}
	out = fopen(argv[6], "wb");
	for (int i = 0; i < threads; i++) {
		pthread_join(w[i].t, NULL);
		total += w[i].n;
		errors += w[i].errors;
		if (out)
			fwrite(w[i].lat, sizeof(uint32_t), w[i].n < MAX_SAMPLES ? w[i].n : MAX_SAMPLES, out);
	}
	if (out)
		fclose(out);
	printf("{\"transactions\": %llu, \"errors\": %llu, \"seconds\": %.6f}\n", (unsigned long long)total,
	       (unsigned long long)errors, now() - t0);
	return 0;
}
