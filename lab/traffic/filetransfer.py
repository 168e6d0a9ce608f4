"""A UDP file transfer: sequence numbers, repair rounds and a SHA-256 over the file.

What the XDP redirect experiment sends (the report's "512 MB file over UDP"), made
so that a wrong rewrite cannot hide: every datagram carries its chunk number, the
server writes chunks where they belong and checks the digest, and the client
talks through a *connected* socket, so a reply that comes back from any address
but the one the client sent to (a redirect without its reverse translation) is
never delivered and the transfer fails with a clear error.

    >>> with FileTransferServer(server_ns, "198.18.1.2", 8083) as srv:        # doctest: +SKIP
    ...     ft = FileTransfer(client_ns, "eth0", "198.18.1.2", 8083, size=512 << 20)
    ...     r = ft.send(seconds=60)           # SendReport; r.extra: ok, sha256, rounds, ...
    ...     srv.wait_result(timeout=10)       # the server's own account of the same transfer

Also a command line, one process per end, as in the report:
    python -m lab.traffic.filetransfer serve --bind ADDR --port P [--out DIR] [--once]
    python -m lab.traffic.filetransfer send --to ADDR --port P (--size BYTES | --file F)
                                            [--chunk N] [--rate-pps N] [--seconds S] [--cpu N]
Each prints one JSON object per finished transfer.

Wire format (network byte order), after a 13-byte header magic "VTLF", type,
session id, seq:
    START  1  client -> server   seq 0; total size (8 B) and chunk size (4 B)
    READY  2  server -> client   seq 0; the server has the session
    DATA   3  client -> server   seq = chunk number; the chunk's bytes
    END    4  client -> server   seq = repair round; the file's SHA-256 (32 B)
    RESULT 5  server -> client   seq = repair round; ok (1 B), missing chunks (4 B), then
                                 up to 178 missing ranges (first, last: 4 B each)
Chunks the server reports missing are sent again, round after round, until none
are missing (or --rounds or --seconds run out). Every datagram, replies included,
fits one frame: a fragmented reply would carry no UDP header in its later parts
for a redirect's reverse translation to match.
Datagrams are sized to fit one frame by default (no IP fragments, unlike the report's
30 KB datagrams, whose later fragments carry no UDP header for a redirect to match).
"""

import argparse
import hashlib
import ipaddress
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .. import netns
from ..paths import REPO
from .generator import Generator, run_bounded
from .report import ETH_HLEN, UDP_HLEN, ip_hlen

MAGIC = b"VTLF"
HDR = struct.Struct("!4sBII")
START, READY, DATA, END, RESULT = 1, 2, 3, 4, 5
START_BODY = struct.Struct("!QI")
RESULT_BODY = struct.Struct("!BI")
RANGE = struct.Struct("!II")
MAX_RANGES = 178  # missing ranges per RESULT: 13 + 5 + 178 * 8 + UDP + IPv6 = 1490 bytes, one frame
REPLY_TIMEOUT = 0.5  # seconds to wait for READY/RESULT before asking again
REPLY_TRIES = 6
SPOOL_DIR = Path("/var/tmp")  # received files, unless kept: on disk, not in /run's memory
SPOOL_PREFIX = "vtl-ft-"  # vtl-ft-<server pid>-...: `lab cleanup` removes those of dead servers


def default_chunk(addr, mtu=1500):
    """The largest chunk whose datagram fits one frame."""
    return mtu - ip_hlen(addr) - UDP_HLEN - HDR.size


def pattern_chunk(seed: bytes, seq: int, length: int) -> bytes:
    """Chunk `seq` of a generated file: deterministic, incompressible, cheap."""
    return hashlib.shake_128(seed + seq.to_bytes(8, "big")).digest(length)


def _ranges(missing):
    """Sorted chunk numbers -> [[first, last], ...]"""
    out = []
    for s in missing:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return out


# --- client ---------------------------------------------------------------------
class Source:
    """The file's chunks, from a file on disk or generated from a seed."""

    def __init__(self, size=None, path=None, chunk=1459, seed=b"vtap-lab"):
        if path is not None:
            self.fd = os.open(path, os.O_RDONLY)
            self.size = os.fstat(self.fd).st_size
        else:
            if size is None or size < 0:
                raise ValueError("a transfer needs --size or --file")
            self.fd, self.size = None, size
        self.chunk, self.seed = chunk, seed
        self.chunks = (self.size + chunk - 1) // chunk

    def read(self, seq):
        length = min(self.chunk, self.size - seq * self.chunk)
        if self.fd is not None:
            return os.pread(self.fd, length, seq * self.chunk)
        return pattern_chunk(self.seed, seq, length)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)


def _pace(rate_pps, start, sent):
    """Sleep until `sent` packets are due at rate_pps (batched per millisecond)."""
    if rate_pps:
        due = start + sent / rate_pps
        delay = due - time.monotonic()
        if delay > 0.001:
            time.sleep(delay)


def send_file(to, port, source: Source, rate_pps=None, seconds=60.0, rounds=1000, bind=None):
    """The client: send the file, repair what the server reports missing, return
    a summary. Raises TimeoutError when the server does not answer."""
    family = socket.AF_INET if ipaddress.ip_address(to).version == 4 else socket.AF_INET6
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    if bind:
        sock.bind((bind, 0))
    sock.connect((to, port))  # replies from any other address are dropped by the kernel
    session = int.from_bytes(os.urandom(4), "big")
    deadline = time.monotonic() + seconds
    stats = {"datagrams": 0, "payload_bytes": 0, "retransmitted": 0}

    def send(kind, seq, body=b""):
        sock.send(HDR.pack(MAGIC, kind, session, seq) + body)
        stats["datagrams"] += 1
        stats["payload_bytes"] += HDR.size + len(body)

    def ask(kind, seq, body, want):
        """Send a control datagram until the answer `want` for this round comes."""
        for _ in range(REPLY_TRIES):
            send(kind, seq, body)
            sock.settimeout(REPLY_TIMEOUT)
            wait_until = time.monotonic() + REPLY_TIMEOUT
            while time.monotonic() < wait_until:
                try:
                    data = sock.recv(65535)
                except (TimeoutError, socket.timeout):
                    break
                except ConnectionRefusedError:
                    continue  # an ICMP port unreachable from an earlier datagram
                if len(data) >= HDR.size:
                    magic, k, sess, s = HDR.unpack_from(data)
                    if magic == MAGIC and k == want and sess == session and s == seq:
                        return data[HDR.size :]
            if time.monotonic() > deadline:
                break
        raise TimeoutError(
            f"no {('READY', 'RESULT')[want == RESULT]} from {to}:{port} "
            "(a reply from any other address is dropped: check the return path's translation)"
        )

    start = time.monotonic()
    ask(START, 0, START_BODY.pack(source.size, source.chunk), READY)
    digest = hashlib.sha256()
    first = time.monotonic()
    for seq in range(source.chunks):
        chunk = source.read(seq)
        digest.update(chunk)
        send(DATA, seq, chunk)
        _pace(rate_pps, first, seq + 1)
        if not seq & 1023 and time.monotonic() > deadline:
            raise TimeoutError(f"the transfer did not finish in {seconds:g} s")
    sha = digest.digest()
    first_missing = None
    for rnd in range(rounds + 1):
        body = ask(END, rnd, sha, RESULT)
        ok, missing = RESULT_BODY.unpack_from(body)
        ranges = [
            RANGE.unpack_from(body, RESULT_BODY.size + i * RANGE.size)
            for i in range((len(body) - RESULT_BODY.size) // RANGE.size)
        ]
        if first_missing is None:
            first_missing = missing
        if missing == 0 or rnd == rounds or time.monotonic() > deadline:
            break
        resent, t0 = 0, time.monotonic()
        for lo, hi in ranges:
            for seq in range(lo, hi + 1):
                send(DATA, seq, source.read(seq))
                resent += 1
                _pace(rate_pps, t0, resent)
        stats["retransmitted"] += resent
    sock.close()
    elapsed = time.monotonic() - start
    return {
        "to": f"{to}:{port}",
        "session": session,
        "bytes": source.size,
        "chunk": source.chunk,
        "chunks": source.chunks,
        "datagrams": stats["datagrams"],
        "payload_bytes": stats["payload_bytes"],
        "retransmitted": stats["retransmitted"],
        "first_pass_missing": first_missing,
        "rounds": rnd,
        "missing": missing,
        "ok": bool(ok),
        "sha256": sha.hex(),
        "seconds": elapsed,
        "mbps": source.size * 8 / elapsed / 1e6 if elapsed else 0.0,
    }


# --- server ---------------------------------------------------------------------
class _Session:
    def __init__(self, peer, session, size, chunk, out_dir):
        self.peer, self.session, self.size, self.chunk = peer, session, size, chunk
        self.chunks = (size + chunk - 1) // chunk
        self.have = bytearray(self.chunks)
        self.received = self.duplicates = 0
        self.start = time.monotonic()
        self.first_missing = None
        fd, self.path = tempfile.mkstemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-", dir=out_dir or SPOOL_DIR)
        self.fd = fd
        os.ftruncate(fd, size)
        self.keep = out_dir is not None

    def data(self, seq, body):
        if seq >= self.chunks or len(body) != min(self.chunk, self.size - seq * self.chunk):
            return
        if self.have[seq]:
            self.duplicates += 1
            return
        os.pwrite(self.fd, body, seq * self.chunk)
        self.have[seq] = 1
        self.received += 1

    def missing(self):
        return [i for i, h in enumerate(self.have) if not h] if self.received < self.chunks else []

    def digest(self):
        h = hashlib.sha256()
        off = 0
        while off < self.size:
            block = os.pread(self.fd, min(1 << 20, self.size - off), off)
            h.update(block)
            off += len(block)
        return h.digest()

    def close(self):
        os.close(self.fd)
        if not self.keep:
            os.unlink(self.path)


def serve(bind, port, out_dir=None, once=False, emit=print, stop=None):
    """The server: receive transfers until stopped (or after one, with once)."""
    family = socket.AF_INET if ipaddress.ip_address(bind).version == 4 else socket.AF_INET6
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:  # a big queue, for this socket only (root may exceed rmem_max; no sysctl touched)
        sock.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    sock.bind((bind, port))
    sock.settimeout(0.2)
    emit(json.dumps({"event": "listening", "bind": bind, "port": port}))
    sessions = {}
    buf = bytearray(65535)
    try:
        while not (stop and stop.is_set()):
            try:
                n, peer = sock.recvfrom_into(buf)
            except (TimeoutError, socket.timeout):
                continue
            if n < HDR.size:
                continue
            magic, kind, sid, seq = HDR.unpack_from(buf)
            if magic != MAGIC:
                continue
            key = (peer, sid)
            s = sessions.get(key)
            if kind == DATA and s is not None:
                s.data(seq, bytes(buf[HDR.size : n]))
            elif kind == START and n >= HDR.size + START_BODY.size:
                if s is None:
                    size, chunk = START_BODY.unpack_from(buf, HDR.size)
                    if not 0 < chunk <= 65507 - HDR.size:
                        continue  # not a transfer this server can take
                    sessions[key] = _Session(peer, sid, size, chunk, out_dir)
                sock.sendto(HDR.pack(MAGIC, READY, sid, 0), peer)
            elif kind == END and s is not None and n >= HDR.size + 32:
                missing = s.missing()
                if s.first_missing is None:
                    s.first_missing = len(missing)
                sha = bytes(buf[HDR.size : HDR.size + 32])
                ok = not missing and s.digest() == sha
                reply = RESULT_BODY.pack(ok, len(missing)) + b"".join(
                    RANGE.pack(lo, hi) for lo, hi in _ranges(missing)[:MAX_RANGES]
                )
                sock.sendto(HDR.pack(MAGIC, RESULT, sid, seq) + reply, peer)
                if not missing:
                    emit(
                        json.dumps(
                            {
                                "event": "done",
                                "client": f"{peer[0]}:{peer[1]}",
                                "session": sid,
                                "bytes": s.size,
                                "chunks": s.chunks,
                                "received": s.received,
                                "duplicates": s.duplicates,
                                "first_pass_missing": s.first_missing,
                                "rounds": seq,
                                "ok": ok,
                                "sha256": sha.hex(),
                                "seconds": time.monotonic() - s.start,
                                "path": s.path if s.keep else None,
                            }
                        )
                    )
                    s.close()
                    del sessions[key]
                    if once:
                        break
    finally:
        for s in sessions.values():
            s.close()
        sock.close()


# --- the lab's handles -------------------------------------------------------------
def _module_argv(*args):
    return [sys.executable, "-m", "lab.traffic.filetransfer", *map(str, args)]


class FileTransferServer:
    """The server as a process in a lab namespace; results() are its JSON lines."""

    def __init__(self, ns, bind, port, out_dir=None, cpu=None):
        self.ns, self.bind, self.port, self.out_dir, self.cpu = ns, bind, port, out_dir, cpu
        self.proc = None
        self._lines, self._cond = [], threading.Condition()

    def __enter__(self):
        argv = _module_argv("serve", "--bind", self.bind, "--port", self.port)
        if self.out_dir:
            argv += ["--out", self.out_dir]
        if self.cpu is not None:  # pinned from its first instruction, imports included
            argv = ["taskset", "-c", str(self.cpu), *argv]
        self.proc = netns.popen(
            self.ns, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True
        )  # REPO: so `-m lab...` imports
        threading.Thread(target=self._read, daemon=True).start()
        first = self.wait_result(timeout=10, event="listening")
        if first is None:
            self.close()
            raise netns.LabError(f"file-transfer server in {self.ns} did not start: {self._stderr()}")
        return self

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self._lines.append(json.loads(line))
                self._cond.notify_all()

    def _stderr(self):
        try:
            return self.proc.stderr.read().strip().splitlines()[-1]
        except (IndexError, ValueError):
            return f"exit {self.proc.returncode}"

    def wait_result(self, timeout=10.0, event="done"):
        """The next line of kind `event` not yet taken, or None after timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i, r in enumerate(self._lines):
                    if r.get("event") == event:
                        return self._lines.pop(i)
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not self._lines:
                    return None
                self._cond.wait(left)

    def close(self):
        if self.proc is not None:
            netns.stop(self.proc)
            self.proc.stderr.close()
            self.proc = None

    def __exit__(self, *exc):
        self.close()
        return False


class FileTransfer(Generator):
    """The client as a lab traffic source: each send() is one whole transfer, by a
    client process in the namespace (pinned to `cpu`), bounded by `seconds`."""

    name = "filetransfer"
    needs_frames = False

    def __init__(self, ns, ifname, to, port, size=None, path=None, chunk=None, cpu=None, rounds=1000):
        super().__init__(ns, ifname, cpu=cpu)
        self.to, self.port, self.size, self.path, self.rounds = to, port, size, path, rounds
        self.chunk = chunk or default_chunk(to)
        self.ip_hlen = ip_hlen(to)

    def _open(self):
        pass

    def _close(self):
        pass

    def _send(self, limit, seconds, rate_pps):
        argv = _module_argv(
            "send",
            "--to",
            self.to,
            "--port",
            self.port,
            "--chunk",
            self.chunk,
            "--seconds",
            seconds,
            "--rounds",
            self.rounds,
        )
        argv += ["--file", self.path] if self.path else ["--size", self.size]
        if rate_pps:
            argv += ["--rate-pps", rate_pps]
        if self.cpu is not None:  # pinned from its first instruction, imports included
            argv = ["taskset", "-c", str(self.cpu), *argv]
        rc, out, elapsed = run_bounded(self.ns, argv, seconds + 5, cwd=REPO)
        try:
            res = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            res = {}
        if rc != 0 or "error" in res:
            raise netns.LabError(
                f"file transfer to {self.to}:{self.port}: {res.get('error') or out.strip()[-200:] or f'exit {rc}'}"
            )
        if res["datagrams"] > limit:
            raise netns.LabError(f"file transfer needs {res['datagrams']} datagrams, more than the bound {limit}")
        nbytes = res["payload_bytes"] + res["datagrams"] * (UDP_HLEN + self.ip_hlen + ETH_HLEN)
        return res["datagrams"], nbytes, res["seconds"], res


# --- command line ----------------------------------------------------------------
def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m lab.traffic.filetransfer", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="receive transfers, print one JSON line each")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--out", help="keep received files in this directory (default: discard)")
    s.add_argument("--once", action="store_true", help="exit after one transfer")
    s.add_argument("--cpu", type=int)
    c = sub.add_parser("send", help="send one file, print a JSON summary")
    c.add_argument("--to", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--size", type=int, help="send a generated file of this many bytes")
    c.add_argument("--file", help="send this file")
    c.add_argument("--chunk", type=int, help="bytes per datagram (default: fill one 1500-byte frame)")
    c.add_argument("--rate-pps", type=float, help="datagrams per second (default: as fast as possible)")
    c.add_argument("--seconds", type=float, default=60.0, help="give up after this long (default 60)")
    c.add_argument("--rounds", type=int, default=1000, help="repair rounds at most (default 1000)")
    c.add_argument("--cpu", type=int)
    a = p.parse_args(argv)
    # SIGTERM (how the lab stops a server) unwinds like Ctrl-C, so open files are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    try:
        if a.cmd == "serve":
            serve(a.bind, a.port, a.out, a.once, emit=lambda line: print(line, flush=True))
        else:
            if (a.size is None) == (a.file is None):
                raise ValueError("give exactly one of --size and --file")
            src = Source(a.size, a.file, a.chunk or default_chunk(a.to))
            try:
                print(json.dumps(send_file(a.to, a.port, src, a.rate_pps, a.seconds, a.rounds)), flush=True)
            finally:
                src.close()
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, TimeoutError) as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
