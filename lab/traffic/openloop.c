/* openloop: an open-loop HTTP/1.1 load generator (lab/traffic/http.py builds and runs it).
 *
 * Requests are due at fixed times, t0 + i / RATE, spread round-robin over CONNS
 * keep-alive connections, whatever the server does. Each request's latency is
 * measured from the time it was due, not from when it could be sent: a request
 * that waited behind a slow one on its connection is charged for the wait, so
 * a stall shows in the percentiles instead of pausing the load (the
 * "coordinated omission" a closed-loop tool such as wrk hides). wrk2 does the
 * same; Debian has no package of it, so the lab builds this with cc.
 *
 * usage: openloop ADDR[,ADDR...] PORT PATH CONNS RATE SECONDS TIMEOUT OUTFILE
 *   ADDR is IPv4 or IPv6; with several, connection c goes to the (c mod n)-th
 *   (servers without a balancer, loaded by one process as a balancer's VIP
 *   would be). OUTFILE receives each completed request's latency
 *   (uint32 microseconds, in completion order). A JSON summary goes to stdout.
 * One thread and epoll: at the lab's rates (tens of thousands of requests per
 * second) one core is enough, and a single clock orders everything.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct conn {
    int fd;
    int connecting;
    uint64_t done;      /* requests of this connection completed or failed: its k-th is due at due(k) */
    uint64_t queued;    /* requests of this connection that are due */
    int busy;           /* a request is on the wire */
    uint32_t gen;       /* bumped at each reconnect: events of a closed socket are ignored */
    uint64_t retry_at;  /* a failed connect is tried again from then (0: not waiting) */
    char buf[16384];
    size_t len;
};

#define MAX_DST 16
static struct sockaddr_storage dst[MAX_DST];
static socklen_t dstlen[MAX_DST];
static int ndst;
static char req[512];
static size_t reqlen;
static int ep, nconns;
static double rate;
static uint64_t t0;
static struct conn *conns;
static uint32_t *lat;
static uint64_t nlat, caplat;
static uint64_t in_schedule;   /* requests answered by the end of the schedule (its throughput) */
static int schedule_over;
static uint64_t errors, connect_errors, reconnects, status_errors, timeouts;
#define RETRY_NS 50000000ull   /* a refused or failed connect waits 50 ms: no spinning on a core */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* When request k of connection c is due: global request k * nconns + c. */
static uint64_t due(int c, uint64_t k)
{
    return t0 + (uint64_t)(((double)k * nconns + c) * 1e9 / rate);
}

static void die(const char *what)
{
    fprintf(stderr, "openloop: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void open_conn(int c)
{
    struct conn *k = &conns[c];
    int one = 1;
    int d = c % ndst;
    k->fd = socket(dst[d].ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (k->fd < 0)
        die("socket");
    setsockopt(k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    k->connecting = 1;
    k->busy = 0;
    k->len = 0;
    k->gen++;
    k->retry_at = 0;
    if (connect(k->fd, (struct sockaddr *)&dst[d], dstlen[d]) < 0 && errno != EINPROGRESS) {
        if (!t0)
            die("connect");
        /* during the run (ports used up, no route): count it, try again later */
        connect_errors++;
        close(k->fd);
        k->fd = -1;
        k->retry_at = now_ns() + RETRY_NS;
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u64 = (uint64_t)k->gen << 32 | c};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, k->fd, &ev) < 0)
        die("epoll_ctl");
}

static void reopen(int c)
{
    if (conns[c].fd >= 0)
        close(conns[c].fd);
    reconnects++;
    open_conn(c);
}

/* A connect that failed: close it now, try again in RETRY_NS. */
static void retry_later(int c)
{
    close(conns[c].fd);
    conns[c].fd = -1;
    conns[c].connecting = 1;   /* nothing is sent on it meanwhile */
    conns[c].retry_at = now_ns() + RETRY_NS;
    conns[c].gen++;
}

static void record(uint64_t ns)
{
    if (nlat == caplat) {
        caplat = caplat ? caplat * 2 : 1 << 16;
        lat = realloc(lat, caplat * sizeof(*lat));
        if (!lat)
            die("realloc");
    }
    uint64_t us = ns / 1000;
    lat[nlat++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

static void try_send(int c)
{
    struct conn *k = &conns[c];
    if (k->connecting || k->busy || k->done >= k->queued)
        return;
    ssize_t n = send(k->fd, req, reqlen, MSG_NOSIGNAL);
    if (n == (ssize_t)reqlen) {
        k->busy = 1;
        return;
    }
    /* a request is far smaller than a socket buffer: a short write is a broken connection */
    errors++;
    k->done++;
    reopen(c);
}

/* The connection failed with a request on the wire (reset, closed): that request is an error. */
static void conn_failed(int c)
{
    if (conns[c].busy) {
        errors++;
        conns[c].done++;
    }
    reopen(c);
}

/* Parse one complete response at the start of the buffer; 1 if one was
 * consumed, 0 if it is not all there yet, -1 if the server sent something
 * with no request out (the connection is then not to be trusted). */
static int take_response(int c, int *close_after)
{
    struct conn *k = &conns[c];
    int closing = 0;
    if (!k->busy)
        return k->len ? -1 : 0;
    char *end = memmem(k->buf, k->len, "\r\n\r\n", 4);
    if (!end)
        return 0;
    size_t head = end + 4 - k->buf;
    long body = -1;
    int status = 0;
    if (k->len > 12 && memcmp(k->buf, "HTTP/1.", 7) == 0)
        status = atoi(k->buf + 9);
    for (char *p = k->buf; p < end; ) {
        char *eol = memmem(p, end + 2 - p, "\r\n", 2);
        if (!eol)
            break;
        if (eol - p > 15 && strncasecmp(p, "Content-Length:", 15) == 0)
            body = strtol(p + 15, NULL, 10);
        if (eol - p >= 17 && strncasecmp(p, "Connection: close", 17) == 0)
            closing = 1;
        p = eol + 2;
    }
    if (body < 0) {      /* the lab's servers always send a length; anything else is an error */
        status = 0;
        body = 0;
        closing = 1;
    }
    if (k->len < head + (size_t)body)
        return 0;
    *close_after |= closing;   /* only once the response it ends is whole */
    memmove(k->buf, k->buf + head + body, k->len - head - body);
    k->len -= head + body;
    if (status >= 200 && status < 400)
        record(now_ns() - due(c, k->done));
    else {
        errors++;
        status_errors++;
    }
    k->done++;
    k->busy = 0;
    return 1;
}

static void readable(int c)
{
    struct conn *k = &conns[c];
    for (;;) {
        if (k->len == sizeof(k->buf)) {   /* a response larger than the buffer: not the lab's file */
            errors++;
            k->done++;
            reopen(c);
            return;
        }
        ssize_t n = recv(k->fd, k->buf + k->len, sizeof(k->buf) - k->len, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            conn_failed(c);
            return;
        }
        k->len += n;
        int close_after = 0, r;
        while ((r = take_response(c, &close_after)) > 0)
            ;
        if (r < 0 || close_after) {
            reopen(c);
            return;
        }
    }
    try_send(c);
}

static void writable(int c)
{
    struct conn *k = &conns[c];
    if (!k->connecting)
        return;
    int err = 0;
    socklen_t l = sizeof(err);
    getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &l);
    if (err) {
        connect_errors++;   /* its due requests wait for the new connection */
        if (t0)
            retry_later(c);
        else
            reopen(c);
        return;
    }
    k->connecting = 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)k->gen << 32 | c};
    epoll_ctl(ep, EPOLL_CTL_MOD, k->fd, &ev);
    try_send(c);
}

static int parse_addr(const char *addr, int port)
{
    if (ndst == MAX_DST)
        return -1;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&dst[ndst];
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&dst[ndst];
    if (inet_pton(AF_INET, addr, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons(port);
        dstlen[ndst++] = sizeof(*a4);
        return 0;
    }
    if (inet_pton(AF_INET6, addr, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(port);
        dstlen[ndst++] = sizeof(*a6);
        return 0;
    }
    return -1;
}

/* Every address of a comma-separated list; -1 if one is not an address. */
static int parse_addrs(char *list, int port)
{
    for (char *save = NULL, *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save))
        if (parse_addr(a, port) < 0)
            return -1;
    return ndst ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr, "usage: openloop ADDR[,ADDR...] PORT PATH CONNS RATE SECONDS TIMEOUT OUTFILE\n");
        return 2;
    }
    int port = atoi(argv[2]);
    nconns = atoi(argv[4]);
    rate = atof(argv[5]);
    double seconds = atof(argv[6]), timeout = atof(argv[7]);
    char host[64];
    snprintf(host, sizeof(host), "%.*s", (int)strcspn(argv[1], ","), argv[1]);   /* the Host header: the first */
    if (parse_addrs(argv[1], port) < 0 || port <= 0 || nconns <= 0 || rate <= 0 || seconds <= 0 || timeout <= 0) {
        fprintf(stderr, "openloop: bad arguments\n");
        return 2;
    }
    reqlen = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s%s%s\r\n\r\n", argv[3],
                      strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "");
    ep = epoll_create1(EPOLL_CLOEXEC);
    conns = calloc(nconns, sizeof(*conns));
    if (ep < 0 || !conns)
        die("setup");

    /* Connect everything first: the schedule starts once every connection is up. */
    for (int c = 0; c < nconns; c++)
        open_conn(c);
    struct epoll_event evs[256];
    uint64_t limit = now_ns() + (uint64_t)(timeout * 1e9);
    int up = 0;
    while (up < nconns) {
        if (now_ns() > limit) {
            fprintf(stderr, "openloop: only %d of %d connections were established in %.1f s\n", up, nconns, timeout);
            return 1;
        }
        int n = epoll_wait(ep, evs, 256, 100);
        for (int i = 0; i < n; i++) {
            int c = (uint32_t)evs[i].data.u64;
            if ((uint32_t)(evs[i].data.u64 >> 32) != conns[c].gen)
                continue;
            if (conns[c].connecting && (evs[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
                writable(c);
                if (!conns[c].connecting)
                    up++;
            }
        }
    }
    connect_errors = reconnects = 0;

    t0 = now_ns();
    uint64_t stop = t0 + (uint64_t)(seconds * 1e9), next = 0, total = (uint64_t)(seconds * rate);
    uint64_t hard = stop + (uint64_t)(timeout * 1e9);
    for (;;) {
        uint64_t now = now_ns();
        if (!schedule_over && now >= stop) {
            schedule_over = 1;
            in_schedule = nlat;
        }
        /* every request now due joins its connection's queue */
        while (next < total && t0 + (uint64_t)(next * 1e9 / rate) <= now) {
            int c = next % nconns;
            conns[c].queued++;
            try_send(c);
            next++;
        }
        uint64_t outstanding = 0, retry = 0;
        for (int c = 0; c < nconns; c++) {
            outstanding += conns[c].queued - conns[c].done;
            if (conns[c].fd < 0) {
                if (now >= conns[c].retry_at)
                    open_conn(c);
                retry = 1;
            }
        }
        if (next >= total && outstanding == 0)
            break;
        if (now >= hard) {
            timeouts = outstanding;
            errors += outstanding;
            break;
        }
        uint64_t wake = next < total ? t0 + (uint64_t)(next * 1e9 / rate) : hard;
        uint64_t wait = wake > now ? wake - now : 0;
        /* Sleep at least 100 us when nothing is due: a wakeup per request would
         * cost the generator a core at the lab's rates, and the servers share the
         * cores. So requests leave up to 0.1 ms late, and that is charged to their
         * latency like any other wait; epoll_wait's milliseconds would make it 1 ms. */
        if (wait && wait < 100000)
            wait = 100000;
        if (retry && wait > RETRY_NS)
            wait = RETRY_NS;
        struct timespec ts = {.tv_sec = wait / 1000000000ull, .tv_nsec = wait % 1000000000ull};
        int n = epoll_pwait2(ep, evs, 256, &ts, NULL);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < n; i++) {
            int c = (uint32_t)evs[i].data.u64;
            if ((uint32_t)(evs[i].data.u64 >> 32) != conns[c].gen)
                continue;   /* the socket it was for was closed earlier in this batch */
            if (conns[c].connecting)
                writable(c);
            else if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                readable(c);
        }
    }
    double elapsed = (now_ns() - t0) / 1e9;
    if (!schedule_over)
        in_schedule = nlat;

    FILE *f = fopen(argv[8], "wb");
    if (!f || fwrite(lat, sizeof(*lat), nlat, f) != nlat || fclose(f))
        die(argv[8]);
    printf("{\"scheduled\": %llu, \"requests\": %llu, \"in_schedule\": %llu, \"errors\": %llu, \"timeouts\": %llu, "
           "\"status_errors\": %llu, \"connect_errors\": %llu, \"reconnects\": %llu, \"seconds\": %.6f, "
           "\"offered_rps\": %.3f, \"connections\": %d}\n",
           (unsigned long long)total, (unsigned long long)nlat, (unsigned long long)in_schedule,
           (unsigned long long)errors,
           (unsigned long long)timeouts, (unsigned long long)status_errors, (unsigned long long)connect_errors,
           (unsigned long long)reconnects, elapsed, rate, nconns);
    return 0;
}
