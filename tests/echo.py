"""A UDP and TCP echo service and its client, for traffic through the fast paths
judged by real sockets (each run inside a namespace by the tests):

    python tests/echo.py serve PORT [COUNT_FILE]
        echoes UDP datagrams (from the address each was sent to) and TCP
        streams on every address, IPv4 and IPv6; prints "ready" once it listens;
        with COUNT_FILE, writes there how many TCP connections it has accepted
        (a health check's probe is one, once its handshake completed)
    python tests/echo.py exchange HOST PORT N [once]
        N UDP exchanges and N TCP connections with a connected socket, payloads
        of varied length (one byte to many segments); prints one JSON line:
        {"udp": answered in full, "tcp": echoed in full, "n": N}. `once`: no
        second try, short timeouts (for a test that expects no answer)
    python tests/echo.py hold HOST[,HOST...] PORT N
        N long-lived TCP connections to each host, each sending a line every
        100 ms and reading it back; prints "ready" once all are open, and when
        stdin closes, closes them and prints one JSON line: {"connections",
        "broken" (reset, closed or silent for 5 s), "sent", "echoed" (lines
        back in order), "wrong" (lines back that were not the next one sent),
        "max_wait_ms" (the longest a line waited for its echo)}
"""

import json
import os
import selectors
import socket
import struct
import sys
import threading
import time

IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)  # linux/in.h; Python 3.11 lacks the name


def udp_echo(family, port):
    """Each datagram back from the address it was sent to (IP_PKTINFO), as a
    UDP service behind a DSR load balancer must: a reply from the host's own
    address would not reach a connected client."""
    s = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
        s.bind(("::", port))
        level, kind = socket.IPPROTO_IPV6, socket.IPV6_PKTINFO
    else:
        s.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        s.bind(("0.0.0.0", port))
        level, kind = socket.IPPROTO_IP, IP_PKTINFO
    while True:
        data, anc, _, peer = s.recvmsg(65535, 256)
        info = [d for lv, ty, d in anc if (lv, ty) == (level, kind)]
        if info and family == socket.AF_INET:
            ifindex, _, dst = struct.unpack("=i4s4s", info[0])
            info = [struct.pack("=i4s4s", 0, dst, b"\0" * 4)]  # ipi_spec_dst: the source to use
        elif info:
            info = [info[0][:16] + struct.pack("=i", 0)]
        s.sendmsg([data], [(level, kind, info[0])] if info else [], 0, peer)


def serve(port, count_file=None):
    t = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    t.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(("::", port))
    t.listen(128)

    def one(c):
        with c:
            while data := c.recv(65536):
                c.sendall(data)

    for family in (socket.AF_INET, socket.AF_INET6):
        threading.Thread(target=udp_echo, args=(family, port), daemon=True).start()
    print("ready", flush=True)
    accepted = 0
    while True:
        c, _ = t.accept()
        accepted += 1
        if count_file:
            with open(count_file + ".tmp", "w") as f:
                f.write(str(accepted))
            os.replace(count_file + ".tmp", count_file)
        threading.Thread(target=one, args=(c,), daemon=True).start()


def exchange(host, port, n, tries=3, tcp_timeout=10, udp_timeout=2):
    """A datagram lost on the way (a veth ring full on a loaded machine) is sent
    again, as a UDP application would, up to `tries` times; TCP retransmits by
    itself, and is given the time its backed-off timers take (an initial
    retransmission timeout of 1 s, doubling): a loss is not a wrong answer.
    (A test that expects no answer gives 1 try and half a second to each: an
    answer inside the lab's namespaces takes milliseconds.)"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    ok_udp = ok_tcp = 0
    for i in range(n):
        msg = os.urandom(1 + (i * 397) % 1400)
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.settimeout(udp_timeout)
            s.connect((host, port))  # a reply from any other source never reaches it
            for _ in range(tries):
                try:
                    s.send(msg)
                    ok_udp += s.recv(65535) == msg
                    break
                except socket.timeout:
                    continue
                except OSError:
                    break
        msg = os.urandom(1 + (i * 7919) % 40000)
        try:
            with socket.create_connection((host, port), timeout=tcp_timeout) as c:
                c.sendall(msg)
                got = b""
                while len(got) < len(msg) and (data := c.recv(65536)):
                    got += data
                ok_tcp += got == msg
        except OSError:
            pass
    print(json.dumps({"udp": ok_udp, "tcp": ok_tcp, "n": n}), flush=True)


def hold(hosts, port, n):
    socks = [socket.create_connection((host, port), timeout=10) for host in hosts for _ in range(n)]
    for s in socks:
        s.setblocking(False)
    print("ready", flush=True)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    pending = {s: [] for s in socks}  # lines sent, not yet echoed: (line, when sent)
    bufs = {s: b"" for s in socks}
    broken, tally = set(), {"sent": 0, "echoed": 0, "wrong": 0, "max_wait": 0.0}
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)

    def receive(timeout):
        for key, _ in sel.select(timeout=timeout):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:  # closed or reset
                broken.add(s)
                sel.unregister(s)
                continue
            bufs[s] += data
            while b"\n" in bufs[s]:
                line, bufs[s] = bufs[s].split(b"\n", 1)
                expect, when = pending[s].pop(0) if pending[s] else (b"", 0)
                if line + b"\n" == expect:
                    tally["echoed"] += 1
                    tally["max_wait"] = max(tally["max_wait"], time.monotonic() - when)
                else:
                    tally["wrong"] += 1

    tick, k = time.monotonic(), 0
    while not done.is_set():
        now = time.monotonic()
        if now >= tick:
            tick += 0.1
            for i, s in enumerate(socks):
                if s in broken:
                    continue
                if pending[s] and now - pending[s][0][1] > 5:
                    broken.add(s)  # silent: a connection the LB lost
                    continue
                line = f"{i}:{k}\n".encode()
                try:
                    s.send(line)
                except OSError:
                    broken.add(s)
                    continue
                pending[s].append((line, now))
                tally["sent"] += 1
            k += 1
        receive(max(0.0, tick - time.monotonic()))
    # the lines in flight are echoed before the close: a line sent is a line owed, and a
    # socket closed with data unread is reset
    deadline = time.monotonic() + 5
    while any(pending[s] for s in socks if s not in broken) and time.monotonic() < deadline:
        receive(0.1)
    for s in socks:
        s.close()
    max_wait = tally.pop("max_wait")
    print(
        json.dumps(
            {"connections": len(socks), "broken": len(broken), **tally, "max_wait_ms": round(max_wait * 1000, 1)}
        )
    )


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        hold(sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        once = sys.argv[5:] == ["once"]
        exchange(
            sys.argv[2],
            int(sys.argv[3]),
            int(sys.argv[4]),
            tries=1 if once else 3,
            tcp_timeout=0.5 if once else 10,
            udp_timeout=0.5 if once else 2,
        )
