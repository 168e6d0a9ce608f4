"""What the IDS run (issue 10) needs from set-up: Suricata 7 from bookworm-backports,
with AF_PACKET capture, and tcpreplay."""

import re
import subprocess

from conftest import require_tool


def test_setup_installs_suricata_with_af_packet_and_tcpreplay():
    require_tool("suricata")
    require_tool("tcpreplay")
    info = subprocess.run(["suricata", "--build-info"], capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"^This is Suricata version 7\.", info, re.M), info[:200]
    assert re.search(r"AF_PACKET support:\s+yes", info)
    version = subprocess.run(["tcpreplay", "--version"], capture_output=True, text=True, timeout=60)
    assert re.match(r"tcpreplay version: 4\.", version.stdout + version.stderr)
