"""python -m lab jupyter: JupyterLab on this machine, for this machine only.

    python -m lab jupyter                  # notebooks/ at http://127.0.0.1:8888/lab?token=...
    python -m lab jupyter --port 8890      # a busy port moves on to the next free one
    python -m lab.jupyter --register-only  # register the project's kernel, and exit (scripts/setup.sh)

The server listens on 127.0.0.1 and nowhere else: its notebooks run as root, so
whoever reaches the port with the token owns the machine. From another machine,
forward the port over ssh (ssh -L 8888:127.0.0.1:8888 HOST) and open the same
URL there. Notebooks run on the kernel "eBPF vTAP Lab" (ebpf-vtap-lab): this
Python (.venv's, where bcc and the project import), registered inside its
environment (jupyter's --sys-prefix); it is registered again if it is missing or
points elsewhere.
"""

import argparse
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

KERNEL_NAME = "ebpf-vtap-lab"
KERNEL_DISPLAY_NAME = "eBPF vTAP Lab"
HOST = "127.0.0.1"
DEFAULT_PORT = 8888
PORT_RETRIES = 50  # Jupyter's own: a busy port moves on to the next ones, then to random ones near it
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
# the token URL of Jupyter's start-up banner (its indented lines; its log lines start with "[")
BANNER_URL = re.compile(r"^\s+(http://127\.0\.0\.1:(\d+)/lab\?token=\w+)\s*$")


def kernel_dir(prefix=sys.prefix) -> Path:
    return Path(prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME


def ensure_kernel(prefix=sys.prefix) -> bool:
    """Register the project's kernel under `prefix` (this environment), running
    this Python, unless it is registered so already. True if it registered."""
    try:
        spec = json.loads((kernel_dir(prefix) / "kernel.json").read_text())
        if spec.get("display_name") == KERNEL_DISPLAY_NAME and spec.get("argv", [None])[0] == sys.executable:
            return False
    except (OSError, ValueError):
        pass  # missing or unreadable: write it again
    from ipykernel.kernelspec import install  # noqa: PLC0415 -- slow (~0.2 s); python -m lab imports this module

    install(kernel_name=KERNEL_NAME, display_name=KERNEL_DISPLAY_NAME, prefix=str(prefix))
    return True


def server_argv(port, root) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "jupyterlab",
        f"--ip={HOST}",
        f"--port={port}",
        f"--ServerApp.port_retries={PORT_RETRIES}",
        "--no-browser",
        f"--ServerApp.root_dir={root}",
    ]
    if os.geteuid() == 0:  # Jupyter refuses root without it; a user needs no such flag
        argv.append("--allow-root")
    return argv


def accepting(port, seconds=10.0) -> bool:
    """Whether the server accepts connections on `port` within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def serve(port) -> int:
    """Run JupyterLab until it stops; its log passes through, and the URL to open
    is said once more, on a line of ours, after its banner."""
    root = NOTEBOOKS if NOTEBOOKS.is_dir() else Path.cwd()  # an installed wheel has no notebooks/
    proc = subprocess.Popen(server_argv(port, root), stderr=subprocess.PIPE, text=True, bufsize=1)
    # Ctrl-C reaches Jupyter from the terminal too: it asks for a confirmation and
    # stops on a second one, and we wait for it. SIGTERM or SIGHUP sent to us
    # alone stops it cleanly (its kernels with it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: proc.send_signal(signal.SIGTERM))
    told = False
    for line in proc.stderr:
        sys.stderr.write(line)
        m = None if told else BANNER_URL.match(line)
        if m:
            told = True
            url, at = m.group(1), m.group(2)
            accepting(int(at))  # Jupyter prints its banner a moment before it listens: ours comes when it does
            sys.stderr.write(
                f"lab jupyter: open this URL: {url}  (from another machine: "
                f"ssh -L {at}:{HOST}:{at} {socket.gethostname()}, then the same URL)\n"
            )
        sys.stderr.flush()
    status = proc.wait()
    return 128 - status if status < 0 else status


def add_arguments(p):
    _, examples, rest = __doc__.split("\n\n", 2)
    p.description = "JupyterLab with notebooks/ as its root, for this machine only.\n\n" + rest
    p.epilog = "examples:\n" + examples
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the port to try first (default %(default)s; up to {PORT_RETRIES} more if it is busy)",
    )
    p.add_argument(
        "--register-only",
        action="store_true",
        help=f"register the kernel {KERNEL_DISPLAY_NAME!r} ({KERNEL_NAME}) in this environment, and exit",
    )


def main(a) -> int:
    missing = [m for m in ("ipykernel", "jupyterlab") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"lab jupyter: error: Python package {missing[0]!r} is missing; run `make setup` as root and use "
            ".venv/bin/python",
            file=sys.stderr,
        )
        return 1
    if not 1 <= a.port <= 65535:
        print(f"lab jupyter: error: --port must be from 1 to 65535, not {a.port}", file=sys.stderr)
        return 2
    try:
        registered = ensure_kernel()
    except OSError as e:  # .venv is root's: a user can use the kernel setup registered, not register it
        print(
            f"lab jupyter: error: cannot register the kernel in {sys.prefix}: {e.strerror}; run `make setup` as root",
            file=sys.stderr,
        )
        return 1
    if registered:
        print(
            f"lab jupyter: registered the Jupyter kernel {KERNEL_DISPLAY_NAME!r} ({KERNEL_NAME}: "
            f"{sys.executable}) in {sys.prefix}",
            flush=True,
        )
    if a.register_only:
        return 0
    return serve(a.port)


if __name__ == "__main__":
    from lab.console import ArgumentParser

    parser = ArgumentParser(prog="python -m lab jupyter")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
