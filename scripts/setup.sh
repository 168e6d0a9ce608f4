#!/usr/bin/env bash
# One-time (and idempotent) set-up of eBPF vTAP Lab on a Debian 12 machine, as root.
#   scripts/setup.sh          # what `make demo`, `make test` and `make lab` run first
# A second run only checks and takes a few seconds: apt runs only for missing
# packages, pip only when pyproject.toml changed since the last install.
# One line per step; what apt and pip say goes to .setup.log (its tail is shown
# if a step fails).
set -euo pipefail

cd "$(dirname "$0")/.."
top=$PWD
log=$top/.setup.log
say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }
# run CMD...: its output into the log. The log holds the last run that had
# something to install (a second run, which installs nothing, keeps it).
logged=0
run() {
  if [ "$logged" = 0 ]; then
    printf '# scripts/setup.sh, %s\n' "$(date -u +%FT%TZ)" > "$log"
    logged=1
  fi
  printf '\n$ %s\n' "$*" >> "$log"
  local status=0
  "$@" >> "$log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    printf 'setup: error: `%s` failed (exit %d); the end of %s:\n' "$*" "$status" "$log" >&2
    tail -n 20 "$log" | sed 's/^/  /' >&2
    exit 1
  fi
}

[ "$(id -u)" -eq 0 ] || die "run as root (BPF and network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
command -v dpkg >/dev/null || die "this set-up needs a Debian-based system (dpkg/apt); see environment.yml for conda"

# --- Debian packages ----------------------------------------------------------
# BCC comes from Debian, never from PyPI: the PyPI name "bcc" is an unrelated lattice library.
packages=(
  python3-bpfcc bpfcc-tools linux-headers-amd64   # BCC and the kernel headers it compiles against
  python3-venv python3-dev                        # the project's .venv, made from the system Python
  iproute2 iputils-ping nftables tcpdump ethtool procps  # plumbing and debugging tools
  bpftool libbpf1                                 # program inspection; libbpf for BPF_PROG_TEST_RUN
  python3-nftables                                # nftables' JSON API, for the nft dup peer
  openvswitch-switch                              # OVS port mirroring peer (userspace datapath)
  netsniff-ng iperf3 tcpreplay                    # traffic: trafgen, iperf3, pcap replay (the IDS run)
  nginx libnginx-mod-stream haproxy wrk           # the load balancer's backends, peers and load (issue 11)
  gcc libc6-dev curl                              # cc builds the open-loop generator (lab/traffic/openloop.c); curl for tests
  prometheus                                      # promtool: the tests check every tool's --metrics with it
  openssh-server                                  # sshd for the namespace hosts the hosts tests reach with Ansible
  iptables                                        # kube-proxy's iptables mode, a way of bench pods (legacy and nft backends)
)
services=(nginx haproxy prometheus ssh)           # daemons their packages start in the root namespace
declare -A pidfile=([ssh]=/run/sshd.pid)          # where one's pid file is not /run/<service>.pid
backported=(suricata)                             # the IDS run: only bookworm-backports has it
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=() missing_bp=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
for p in "${backported[@]}"; do installed "$p" || missing_bp+=("$p"); done
if [ ${#missing[@]} -gt 0 ] || [ ${#missing_bp[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  if [ ${#missing_bp[@]} -gt 0 ] && [ "$codename" = bookworm ] &&
     ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # The suite from the mirror the machine already uses.
    mirror=$( { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
                2>/dev/null || true; } | grep -E '^(URIs:|deb )' | grep -oE 'https?://[^ ]+/debian( |$)' |
              head -n 1 | tr -d ' ' || true)
    mirror=${mirror:-http://deb.debian.org/debian}
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: %s\n' \
      "$mirror" /usr/share/keyrings/debian-archive-keyring.gpg > /etc/apt/sources.list.d/vtap-lab-backports.sources
    say "added bookworm-backports from $mirror (for ${missing_bp[*]})"
  fi
  say "updating apt's package lists (output in $log)"
  run apt-get update -q
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    # Debian's policy-rc.d (exit 101: "not allowed"): the packages' daemons are not started
    # at all while they install, so no sshd, nginx or HAProxy listens in the root
    # namespace even for a moment. Ours only when the machine has none, removed after.
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\n# scripts/setup.sh of eBPF vTAP Lab, while it installs packages\nexit 101\n' > "$policy"
      chmod 755 "$policy"
      trap 'rm -f "$policy"' EXIT
    fi
    run apt-get install -y -q --no-install-recommends "${missing[@]}"
    if grep -qs "eBPF vTAP Lab" "$policy"; then rm -f "$policy"; trap - EXIT; fi
    # nginx and haproxy start a system daemon on the root namespace's port 80,
    # prometheus its server on 9090 and openssh-server sshd on 22; the lab runs its own
    # daemons, in its namespaces, and leaves the root namespace alone (of prometheus it
    # uses promtool; sshd runs only in the hosts tests' namespaces). Where policy-rc.d
    # was the machine's own, they may have started: stopped and disabled here.
    for svc in "${services[@]}"; do
      if command -v systemctl >/dev/null && systemctl is-enabled "$svc" >/dev/null 2>&1; then
        systemctl disable --now "$svc" >/dev/null 2>&1 || true
        say "disabled the $svc service its package enabled (the lab runs its own daemons, in its namespaces)"
      fi
      pid=${pidfile[$svc]:-/run/$svc.pid}
      if [ -f "$pid" ] && kill -0 "$(cat "$pid")" 2>/dev/null; then
        kill "$(cat "$pid")" && say "stopped the $svc daemon its package started"
      fi
    done
  fi
  if [ ${#missing_bp[@]} -gt 0 ]; then
    say "installing from bookworm-backports: ${missing_bp[*]}"
    run apt-get install -y -q --no-install-recommends -t bookworm-backports "${missing_bp[@]}"
    # Debian enables a system Suricata on the root namespace's eth0; the lab runs its own,
    # in its namespaces, and a second IDS on the host would take CPU from every benchmark.
    if command -v systemctl >/dev/null && systemctl is-enabled suricata >/dev/null 2>&1; then
      systemctl disable --now suricata >/dev/null 2>&1 || true
      say "disabled the suricata service the package enabled (the lab starts its own)"
    fi
  fi
fi

# --- kernel headers for BCC ---------------------------------------------------
# Debian ships headers for its own kernel; this VM may run another one. BCC works
# against the Debian header tree when /lib/modules/$(uname -r)/{build,source} point
# at it. Only create links that are missing: never replace a real header tree.
kver=$(uname -r)
mod=/lib/modules/$kver
if [ ! -e "$mod/build" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
  [ -n "$hdr" ] || die "no /usr/src/linux-headers-*-amd64 tree found after installing linux-headers-amd64"
  mkdir -p "$mod"
  ln -s "$hdr" "$mod/build"
  say "linked $mod/build -> $hdr"
fi
if [ ! -e "$mod/source" ]; then
  build=$(readlink -f "$mod/build")
  common="${build%-amd64}-common"
  [ -d "$common" ] || common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
  [ -n "$common" ] && [ -d "$common" ] || die "no matching linux-headers-*-common tree for $build"
  ln -s "$common" "$mod/source"
  say "linked $mod/source -> $common"
fi

# --- the project's virtual environment ---------------------------------------
# --system-site-packages so that Debian's bcc (python3-bpfcc) is importable.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(0)' 2>/dev/null; then
  say "creating .venv from /usr/bin/python3 (with system site packages, for bcc)"
  rm -rf .venv
  run /usr/bin/python3 -m venv --system-site-packages .venv
fi
# VTL_SETUP_EXTRAS: the project's extras to install, or "none" (`python -m lab hosts setup`
# gives a bench host none: it runs the lab's runners, not the suite, JupyterLab or Ansible)
extras=${VTL_SETUP_EXTRAS:-test,notebooks,hosts}
[[ "$extras" =~ ^[a-z,]+$ ]] || die "VTL_SETUP_EXTRAS=$extras: a comma-separated list of the project's extras, or none"
stamp=.venv/.installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  say "installing the project and its Python dependencies into .venv (editable; output in $log)"
  run .venv/bin/python -m pip install --upgrade pip
  if [ "$extras" = none ]; then run .venv/bin/python -m pip install -e .; else run .venv/bin/python -m pip install -e ".[$extras]"; fi
  echo "$want" > "$stamp"
fi

# --- the lab's own modules, compiled ------------------------------------------------
# pip compiled the dependencies as it installed them; the lab's own packages (an editable
# install) are compiled here, once per change. Where PYTHONDONTWRITEBYTECODE is set (some
# environments set it), Python never writes what it compiles, and every process (each
# command, notebook kernel and host runner: the suite starts hundreds) would compile every
# lab module it imports again. Only what changed since is compiled; a stale file is
# never used (Python checks each against its source).
.venv/bin/python -m compileall -q -j 0 lab ebpf vtap >/dev/null || die "compiling the lab's modules failed (python -m compileall lab ebpf vtap says where)"

# --- the Jupyter kernel ----------------------------------------------------------
# Notebooks run on "eBPF vTAP Lab" (ebpf-vtap-lab): .venv's python, where bcc and
# the project import. Registered inside .venv (jupyter's --sys-prefix), so that
# `.venv/bin/jupyter kernelspec list` shows it; it says a line only when it did.
if [[ ",$extras," == *",notebooks,"* ]]; then  # (a bench host's set-up has no JupyterLab)
  said=$(.venv/bin/python -m lab.jupyter --register-only) || die "registering the Jupyter kernel failed (see above)"
  [ -z "$said" ] || say "${said#lab jupyter: }"
fi

# --- check ---------------------------------------------------------------------
.venv/bin/python - <<'EOF' || die "the environment does not work; see the error above"
import bcc, pyroute2, scapy, pandas  # noqa: F401
from bcc import BPF
BPF(text="int f(void *ctx) { return 0; }")   # proves clang, the headers and the kernel agree
EOF
say "ready (.venv/bin/python -m vtap --help)"
