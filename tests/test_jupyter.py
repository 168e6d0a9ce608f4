"""`python -m lab jupyter` (`make lab`): JupyterLab on 127.0.0.1 only, with the
project's kernel registered, started and stopped as a user does."""

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT

from lab import jupyter

PY = sys.executable
URL_LINE = "lab jupyter: open this URL: "


def socket_inodes(pgid):
    """The socket inodes open in the processes of process group `pgid`."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone in the meantime
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed in the meantime
            if target.startswith("socket:["):
                found.add(target[8:-1])
    return found


def listening(inodes=None):
    """{(address, port)} of the TCP sockets listening in this namespace (those
    of `inodes` only, if given), from /proc/net/tcp and tcp6."""
    found = set()
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or (inodes is not None and f[9] not in inodes):  # 0A: LISTEN
                continue
            addr, port = f[1].split(":")
            raw = bytes.fromhex(addr)  # 32-bit words, each in the host's (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def lines_of(stream):
    """A queue of the stream's lines, read in a thread (so that waits are bounded)."""
    q = queue.Queue()

    def read():
        for line in stream:
            q.put(line)
        q.put(None)

    threading.Thread(target=read, daemon=True).start()
    return q


def wait_for_url(q, timeout=90):
    """The URL of our "open this URL" line, and everything said before it."""
    said = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = q.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError("no URL within %ss:\n%s" % (timeout, "".join(said))) from None
        if line is None:
            raise AssertionError("it exited before printing the URL:\n" + "".join(said))
        said.append(line)
        if line.startswith(URL_LINE):
            return line[len(URL_LINE) :].split()[0], said


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def test_kernel_registration_is_idempotent(tmp_path):
    """Registered under a prefix (setup.sh and `python -m lab jupyter` use .venv's),
    pointing at this Python; again only when it is missing or points elsewhere."""
    assert jupyter.ensure_kernel(tmp_path)
    spec_file = tmp_path / "share/jupyter/kernels/ebpf-vtap-lab/kernel.json"
    spec = json.loads(spec_file.read_text())
    assert spec["display_name"] == "eBPF vTAP Lab" and spec["argv"][0] == PY and "ipykernel_launcher" in spec["argv"]
    assert not jupyter.ensure_kernel(tmp_path)
    spec["argv"][0] = "/usr/bin/python3"  # without bcc's venv: the notebooks would not import
    spec_file.write_text(json.dumps(spec))
    assert jupyter.ensure_kernel(tmp_path)
    assert json.loads(spec_file.read_text())["argv"][0] == PY


def test_allow_root_only_as_root():
    """Jupyter refuses root without --allow-root; a user gets no such flag. The
    module is run from a copy any user can read (a clone may be root's alone)."""
    tmp_path = Path(tempfile.mkdtemp(prefix="vtl-jupyter-"))
    tmp_path.chmod(0o755)
    shutil.copy(ROOT / "lab" / "jupyter.py", tmp_path / "labjupyter.py")
    (tmp_path / "labjupyter.py").chmod(0o644)
    try:
        _allow_root_as_root_only(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _allow_root_as_root_only(tmp_path):
    probe = "from labjupyter import server_argv; print('--allow-root' in server_argv(8888, '/'))"
    as_root = subprocess.run(
        ["/usr/bin/python3", "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    as_nobody = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (as_root.stdout, as_nobody.stdout) == ("True\n", "False\n"), as_root.stderr + as_nobody.stderr


def test_serves_on_loopback_only_with_the_kernel_and_stops_cleanly():
    """Started on a busy port it moves on; it listens on 127.0.0.1 and nowhere
    else; the API, with the token it printed, lists the project's kernel; SIGTERM
    stops it, and frees the port."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    first = busy.getsockname()[1]
    proc = subprocess.Popen(
        [PY, "-m", "lab", "jupyter", "--port", str(first)],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        url, said = wait_for_url(lines_of(proc.stderr))
        base, token = url.split("/lab?token=")
        port = int(base.rsplit(":", 1)[1])
        assert base.startswith("http://127.0.0.1:") and token and port != first, url
        assert sum(url in line for line in said) >= 1  # Jupyter's own banner said it too

        # every listening socket of the server's processes is on 127.0.0.1 (not 0.0.0.0, not ::)
        server = listening(socket_inodes(proc.pid))  # by the time it says "open this URL", it listens
        assert ("127.0.0.1", port) in server and {a for a, _ in server} == {"127.0.0.1"}, server
        assert {a for a, p in listening() if p == port} == {"127.0.0.1"}

        specs = get_json(f"{base}/api/kernelspecs?token={token}")["kernelspecs"]
        spec = specs["ebpf-vtap-lab"]["spec"]
        assert spec["display_name"] == "eBPF vTAP Lab" and spec["argv"][0] == PY, spec
        with pytest.raises(urllib.error.HTTPError) as refused:  # and nothing without the token
            get_json(f"{base}/api/kernelspecs")
        assert refused.value.code == 403
        # what setup.sh registers, where `.venv/bin/jupyter kernelspec list` looks
        listed = subprocess.run(
            [Path(PY).parent / "jupyter", "kernelspec", "list", "--json"], capture_output=True, text=True, timeout=60
        )
        found = json.loads(listed.stdout)["kernelspecs"]["ebpf-vtap-lab"]
        assert Path(found["resource_dir"]).is_relative_to(sys.prefix) and found["spec"]["argv"][0] == PY

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        # nothing of it is left: no process (Jupyter's own included), no listening socket
        deadline = time.monotonic() + 10
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not group_alive(proc.pid)
        assert not [a for a, p in listening() if p == port]
    finally:
        busy.close()
        try:  # whatever failed: the whole group, Jupyter too if we were killed before it
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        proc.stdout.close()


def group_alive(pgid) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
