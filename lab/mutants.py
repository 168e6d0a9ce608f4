"""python -m lab mutants: does the suite fail when the code is wrong?

Each mutant is one edit of one line of the kernel programs, the shared C
headers, or the Python the data plane depends on: a checksum step, a TTL, a
parse bound, a session's end, a match on the wrong address. One at a time, the
edit is made, the tests that cover it run (the fast fixture tests first, then
the functional ones on real traffic, stopping at the first failure), and the
file is restored. The table says, per mutant, which test killed it, or that it
survived.

No mutation tool reads C that BCC compiles at run time, so the edits are ours:
the text to find (it must occur exactly once, or `nth` picks one), and what
replaces it. The file is copied aside (FILE.mutant-orig) before it is edited
and put back after each mutant, on Ctrl-C and on an error; a run killed with
SIGKILL leaves the copy, and the next run (or `--restore`) puts it back first.

Python logic gets the same one-line edits, for the same reason a maintained
tool (mutmut) does not fit here: its unit is "run the tests", and ours need
root, namespaces and minutes each; choosing the few tests that cover a line,
fast ones first, is what makes 40 mutants take an hour and not a day.
"""

import csv
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from lab.fastpath import fastpaths

ROOT = Path(__file__).resolve().parents[1]
BACKUP = ".mutant-orig"
TIMEOUT = 1200  # seconds per test command: a mutant that hangs a test is killed (by the timeout)

# Which tests cover what: fast (golden fixtures through BPF_PROG_TEST_RUN, pure
# Python) and functional (real traffic through namespaces). Each a pytest argument list.
HEADERS = (
    [
        "tests/test_kernel_headers.py",
        "tests/test_one_exit.py",
        "tests/test_redirect_fixtures.py",
        "tests/test_partial_csum.py",
        "tests/test_xdp_lb_fixtures.py",
        "tests/test_parsing.py",
    ],
    ["tests/test_tc_mirror.py", "tests/test_redirect.py"],
)
HOSTS = (["tests/test_hosts.py", "-k", "judged_from_facts or ethtool"], ["tests/test_hosts.py"])
EXIT = (
    ["tests/test_one_exit.py", "tests/test_xdp_lb_fixtures.py", "tests/test_redirect_fixtures.py"],
    ["tests/test_tc_mirror.py", "tests/test_redirect.py"],
)


@dataclass
class Mutant:
    id: str
    path: str  # relative to the repository root
    find: str  # the text replaced: once in the file, or the nth occurrence
    replace: str
    why: str  # what a user would see if this shipped
    tests: tuple  # (fast, functional) pytest argument lists
    nth: int | None = None  # which occurrence, when the text is not unique

    def line(self, text):
        return text[: self._at(text)].count("\n") + 1

    def _at(self, text):
        at, found = -1, 0
        while found < (self.nth or 1):
            at = text.find(self.find, at + 1)
            if at < 0:
                raise ValueError(f"mutant {self.id}: {self.find!r} occurs {found} times in {self.path}, not {self.nth}")
            found += 1
        if self.nth is None and text.count(self.find) != 1:
            raise ValueError(
                f"mutant {self.id}: {self.find!r} occurs {text.count(self.find)} times in {self.path}: give nth"
            )
        return at

    def apply(self, text):
        at = self._at(text)
        return text[:at] + self.replace + text[at + len(self.find) :]


def M(id, path, find, replace, why, tests, nth=None):
    return Mutant(id, path, find, replace, why, tests, nth)


# The shared C headers' (parsing, checksums, rewrites, the one exit) and the
# tests' own helpers'; each fast path's own are in its bundle (FastPath.checks).
SHARED = [
    M(
        "vtap-non-ip-as-malformed",
        "ebpf/include/verdict.h",
        "\t\treturn R_NOT_IP;",
        "\t\treturn R_MALFORMED;",
        "ARP counted as malformed",
        EXIT,
    ),
    M(
        "parse-one-vlan",
        "ebpf/include/parsing_helpers.h",
        "for (int i = 0; i < VLAN_MAX_DEPTH; i++) {",
        "for (int i = 0; i < 1; i++) {",
        "QinQ frames not parsed past the outer tag",
        HEADERS,
    ),
    M(
        "parse-v4-version",
        "ebpf/include/parsing_helpers.h",
        "if (iph->version != 4 || iph->ihl < 5)",
        "if (iph->ihl < 5)",
        "an IPv4 ethertype with version 6 parsed as IPv4",
        HEADERS,
    ),
    M(
        "parse-v4-options",
        "ebpf/include/parsing_helpers.h",
        "hdrsize = iph->ihl * 4;",
        "hdrsize = sizeof(*iph);",
        "IPv4 options read as the L4 header",
        HEADERS,
    ),
    M(
        "parse-first-fragment",
        "ebpf/include/parsing_helpers.h",
        "bpf_htons(IP_MF | IP_OFFSET)",
        "bpf_htons(IP_OFFSET)",
        "a first fragment taken for a whole datagram",
        HEADERS,
    ),
    M(
        "parse-v6-ext-len",
        "ebpf/include/parsing_helpers.h",
        "nh->pos += (h->hdrlen + 1) * 8;",
        "nh->pos += h->hdrlen * 8;",
        "IPv6 extension headers skipped 8 bytes short",
        HEADERS,
    ),
    M(
        "parse-udp-len",
        "ebpf/include/parsing_helpers.h",
        "len = bpf_ntohs(h->len) - (int)sizeof(*h);",
        "len = bpf_ntohs(h->len);",
        "UDP payload length 8 bytes long",
        HEADERS,
    ),
    M(
        "parse-tcp-options",
        "ebpf/include/parsing_helpers.h",
        "len = h->doff * 4;",
        "len = sizeof(*h);",
        "TCP options taken for payload",
        HEADERS,
    ),
    M(
        "csum-fold-once",
        "ebpf/include/csum_helpers.h",
        "for (int i = 0; i < 4; i++)\n\t\tsum = (sum & 0xffff)",
        "for (int i = 0; i < 1; i++)\n\t\tsum = (sum & 0xffff)",
        "a sum folded once: carries lost",
        HEADERS,
    ),
    M(
        "csum-replace4-low",
        "ebpf/include/csum_helpers.h",
        "\ts += to & 0xffff;\n",
        "\ts += to >> 16;\n",
        "a 4-byte rewrite sums the new value's high half twice",
        HEADERS,
    ),
    M(
        "csum-replace16-3words",
        "ebpf/include/csum_helpers.h",
        "for (int i = 0; i < 4; i++) {",
        "for (int i = 0; i < 3; i++) {",
        "an IPv6 address rewrite leaves its last word out of the sum",
        HEADERS,
        nth=1,
    ),
    M(
        "csum-udp-zero-kept",
        "ebpf/include/csum_helpers.h",
        "\tcsum_replace4(sum, from, to);\n\tif (!*sum)",
        "\tcsum_replace4(sum, from, to);\n\tif (0)",
        "a UDP checksum that becomes 0 is sent as 0 (no checksum)",
        HEADERS,
    ),
    M(
        "csum-pseudo4-len",
        "ebpf/include/csum_helpers.h",
        "s += bpf_htons(len);",
        "s += len;",
        "the IPv4 pseudo-header's length in host order",
        HEADERS,
    ),
    M(
        "csum-pseudo6-next",
        "ebpf/include/csum_helpers.h",
        "s += bpf_htons(next);",
        "s += next;",
        "the IPv6 pseudo-header's next header in host order",
        HEADERS,
    ),
    M(
        "csum-tail-byte",
        "ebpf/include/csum_helpers.h",
        "sum += (__u32)b[1] << 8;",
        "sum += b[1];",
        "a segment ending 2 or 3 bytes into a word summed wrong",
        HEADERS,
    ),
    M(
        "rewrite-partial-never",
        "ebpf/include/rewrite_helpers.h",
        "c->partial = *field == (__sum16)csum_fold16(pseudo);",
        "c->partial = 0;",
        "a partial checksum (TX offload) taken for a whole one",
        HEADERS,
    ),
    M(
        "rewrite-udp-port-zero",
        "ebpf/include/rewrite_helpers.h",
        "udp_csum_replace2(c->field, from, to);",
        "csum_replace2(c->field, from, to);",
        "a UDP datagram without checksum gets one made up",
        HEADERS,
    ),
    M(
        "rewrite-ttl-check",
        "ebpf/include/rewrite_helpers.h",
        "check += (__u32)bpf_htons(0x0100);",
        "check += (__u32)bpf_htons(0x0001);",
        "the IPv4 checksum wrong after the TTL's decrement",
        HEADERS,
    ),
    M(
        "rewrite-finish-tx-only",
        "ebpf/include/rewrite_helpers.h",
        "(action != XDP_TX && action != XDP_REDIRECT)",
        "(action != XDP_TX)",
        "a partial checksum left unfinished on XDP_REDIRECT",
        HEADERS,
    ),
    M(
        "rewrite-macs-swapped",
        "ebpf/include/rewrite_helpers.h",
        "__builtin_memcpy(eth->h_source, src, ETH_ALEN);",
        "__builtin_memcpy(eth->h_source, dst, ETH_ALEN);",
        "forwarded frames leave with the wrong source MAC",
        HEADERS,
    ),
    M(
        "redirect-fragment-uncounted",
        "ebpf/include/verdict.h",
        "\t\treturn R_FRAGMENT;",
        "\t\treturn R_MALFORMED;",
        "fragments counted as malformed",
        EXIT,
    ),
    M(
        "exit-reason-uncounted",
        "ebpf/include/verdict.h",
        "\tfp->reason[r]++;",
        "\t;",
        "frames counted in no reason",
        EXIT,
    ),
    M(
        "exit-dropped-uncounted",
        "ebpf/include/verdict.h",
        "\t\tfp->dropped[r]++;",
        "\t\t;",
        "what is dropped not said by reason",
        EXIT,
    ),
    M(
        "exit-drop-as-pass",
        "ebpf/include/verdict.h",
        "action == XDP_DROP ? V_DROP",
        "action == XDP_DROP ? V_PASS",
        "XDP drops counted as passed",
        EXIT,
    ),
    M(
        "parse-short-l4-as-other",
        "ebpf/include/parsing_helpers.h",
        "\t\tif (parse_tcphdr(&nh, data_end, &tcph) < 0)\n\t\t\treturn PARSE_SHORT_L4;",
        "\t\tif (parse_tcphdr(&nh, data_end, &tcph) < 0)\n\t\t\treturn PARSE_OTHER;",
        "a TCP header cut short taken for another protocol",
        EXIT,
    ),
    # the lab on hosts (lab.hosts): what a wrong line would break without a word
    M(
        "hosts-tap-ifaces-swapped",
        "lab/fastpaths/vtap/bench.py",
        't.iface("tap"), t.iface("tap", "monitor")',
        't.iface("tap", "monitor"), t.iface("tap")',
        "on hosts, the tap taps its monitor interface and copies to its test interface",
        HOSTS,
    ),
    M(
        "sink-match-inverted",
        "ebpf/instruments/xdp_sink.bpf.c",
        "udp->dest != bpf_htons(SINK_MATCH_DPORT)",
        "udp->dest == bpf_htons(SINK_MATCH_DPORT)",
        "on hosts, the sinks count everything but the lab's frames (LLDP, neighbour discovery)",
        HOSTS,
    ),
    M(
        "sink-window-first-never-set",
        "ebpf/instruments/xdp_sink.bpf.c",
        "\t\t\tif (!s->packets)\n\t\t\t\ts->first_ns = now;",
        "\t\t\tif (!s->packets)\n\t\t\t\ts->first_ns = 0;",
        "on hosts, every rate taken over a window that starts at boot",
        (["tests/test_xdp.py", "-k", "window"], HOSTS[1]),
    ),
    M(
        "sink-window-per-tick-only",
        "ebpf/instruments/xdp_sink.bpf.c",
        "tick != s->tick_ns || !(s->packets & 63)",
        "tick != s->tick_ns",
        "on hosts, a window that ends up to a tick (4-10 ms) before its last frame at any rate",
        (["tests/test_xdp.py", "-k", "window"], HOSTS[1]),
    ),
    M(
        "tc-floor-macs-kept",
        "ebpf/instruments/tc_swap.bpf.c",
        "\t__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);",
        "\t;",
        "the TC floor sends frames back to the address they are for (a bridge drops them)",
        (["tests/test_xdp.py", "-k", "tc_floor"], []),
    ),
    M(
        "hosts-runner-on-dut-core",
        "lab/hosts/runner.py",
        "    keep_off(spec)  # first:",
        "    pass  # first:",
        "on a host that is also the tap (Testbed 1), or a rack, the runners take the DUT core's time",
        (["tests/test_hosts.py", "-k", "runner_killed"], HOSTS[1]),
    ),
    M(
        "hosts-cleanup-one-pass",
        "lab/hosts/__init__.py",
        "        if again:\n",
        "        if again and False:\n",
        "a host whose veth partner held XDP during its cleanup keeps TSO off (and its record) after a failed bench",
        (["tests/test_hosts.py", "-k", "second_pass"], HOSTS[1]),
    ),
    M(
        "hosts-offload-fixed-recorded",
        "lab/hosts/local.py",
        "if k in features and features[k][0] != v}",
        "if k in features and features[k][0] != v and features[k][1]}",
        "an offload the kernel holds is skipped unsaid, its record dropped: after a failed bench, TSO never comes back",
        (["tests/test_hosts.py", "-k", "offload_the_kernel_holds"], HOSTS[1]),
    ),
    M(
        "hosts-restore-skipped",
        "lab/hosts/local.py",
        "done = [*abort_runners(), *lab_cleanup(all_runs=True), *restore_all()]",
        "done = [*abort_runners(), *lab_cleanup(all_runs=True)]",
        "a host's interfaces left as a bench changed them (addresses, promiscuous, offloads)",
        HOSTS,
    ),
    M(
        "hosts-hold-not-checked",
        "lab/hosts/check.py",
        '    held = lab.get("held_by")',
        "    held = None",
        "a second bench on hosts another holds gets past check (and starts its runners' hosts' prepare)",
        HOSTS,
    ),
    M(
        "hosts-hold-ignored-by-cleanup",
        "lab/hosts/local.py",
        "    if bench and held and held != bench:",
        "    if False:",
        "a bench whose prepare lost a race tears down the run of the bench that holds the hosts",
        HOSTS,
    ),
    M(
        "hosts-runner-death-unseen",
        "lab/hosts/runner.py",
        '    return "died"  # killed',
        "    return None  # killed",
        "a runner killed on a host is waited for until the stop's timeout, and not named",
        HOSTS,
    ),
    M(
        "hosts-pid-number-trusted",
        "lab/hosts/runner.py",
        '    return fields[0] != "Z" and (not started or fields[19] == started[0])',
        '    return fields[0] != "Z"',
        "a host's cleanup kills whatever process has a dead runner's number now",
        (["tests/test_hosts.py", "-k", "cleanup_kills_only"], ["tests/test_hosts.py"]),
    ),
    M(
        "hosts-failure-not-recorded",
        "lab/hosts/bench.py",
        '                failure["cleanup"] = cleaned\n            write()',
        '                failure["cleanup"] = cleaned',
        "a bench stopped by a lost host: its sidecar does not say which host or run",
        HOSTS,
    ),
    M(
        "hosts-pods-window-whole",
        "lab/fastpaths/pods/hosts.py",
        "if self.packets[i] - self.packets[i - 1] > ACTIVE]",
        "if self.packets[i] - self.packets[i - 1] >= 0]",
        "on hosts, a serving node's CPU taken over its runner's whole life (Ansible's go and stop too), "
        "not the run's: diluted",
        (["tests/test_hosts.py", "-k", "pods_on_two_nodes"], ["tests/test_hosts.py"]),
    ),
    M(
        "http-spread-loads-not-stopped",
        "lab/traffic/http.py",
        "            loads.stop()\n            raise",
        "            raise",
        "a Ctrl-C during a bench's load waits out the run's whole duration when wrk has not yet taken SIGINT",
        (["tests/test_lb_bench.py", "-k", "interrupted_spread"], ["tests/test_lb_bench.py"]),
    ),
    M(
        "partial-fold",
        "lab/traffic/partial.py",
        "s = (s & 0xFFFF) + (s >> 16)",
        "s = s & 0xFFFF",
        "the tests' own partial checksums computed wrong (their frames)",
        (["tests/test_partial_csum.py"], []),
    ),
    M(
        "pktsend-mid-batch-drop-uncounted",
        "lab/traffic/pktsend.c",
        "sent += r + ((unsigned int)r < n);",
        "sent += r;",
        "the generator's AF_PACKET path counts a frame dropped mid-batch nowhere, and sends it again",
        (["tests/test_generators.py", "-k", "drops"], ["tests/test_generators.py"]),
    ),
]


def all_mutants() -> list:
    """The shared mutants, then each fast path's, in the registry's order."""
    return SHARED + [m for fp in fastpaths() for m in fp.mutants()]


# --- the tree, kept whole -------------------------------------------------------------------
def restore_all(root=ROOT) -> list[str]:
    """Put back every file a killed run left edited (its FILE.mutant-orig)."""
    put_back = []
    for orig in sorted(root.rglob(f"*{BACKUP}")):
        target = orig.with_name(orig.name[: -len(BACKUP)])
        os.replace(orig, target)
        put_back.append(str(target.relative_to(root)))
    return put_back


class Edited:
    """The mutant's file edited for the block, restored after it, whatever happens."""

    def __init__(self, mutant, root=ROOT):
        self.m, self.path = mutant, root / mutant.path
        self.backup = self.path.with_name(self.path.name + BACKUP)

    def __enter__(self):
        text = self.path.read_text()
        mutated = self.m.apply(text)
        self.backup.write_text(text)
        os.chmod(self.backup, os.stat(self.path).st_mode)
        self.path.write_text(mutated)
        return self.m.line(text)

    def __exit__(self, *exc):
        os.replace(self.backup, self.path)
        return False

    def original(self):
        """For a block inside this one: the file as it was, the mutant after."""
        edited = self

        class _Original:
            def __enter__(self):
                self.mutated = edited.path.read_text()
                edited.path.write_text(edited.backup.read_text())

            def __exit__(self, *exc):
                edited.path.write_text(self.mutated)
                return False

        return _Original()


def _failed_test(output: str) -> str | None:
    """The first failing test's node id, from pytest's -rfE summary lines
    ("FAILED tests/x.py::name[param with spaces] - message")."""
    for line in output.splitlines():
        m = re.match(r"(FAILED|ERROR) (tests/.+?)(?: - .*)?$", line)
        if m:
            return m.group(2)
    return None


def _interruptible():
    """In the pytest child: SIGINT as Python's default (a KeyboardInterrupt that
    tears testbeds down), even if this process was started with it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(proc, grace=60) -> str:
    """SIGINT (pytest unwinds its fixtures: namespaces removed), SIGKILL after
    `grace` s. Returns what it printed."""
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


def _hung_in(output: str) -> str:
    """Where a hung test was, from the stack faulthandler dumped: the deepest
    frame in a test file ("tests/x.py:123 in test_name")."""
    frames = re.findall(r'File "[^"]*/(tests/[^"]+)", line (\d+) in (\w+)', output)
    return f"{frames[0][0]}:{frames[0][1]} in {frames[0][2]}" if frames else ""


_IMAGES = []  # the compiled programs' directory every pytest of this process shares


def _images_env() -> dict:
    """One directory of program images (ebpf/images.py) for every pytest this process
    starts: a program a mutant does not touch is compiled once, not once per run (an
    image is kept under the hash of its whole text, so a mutant's is its own). Gone
    when the process ends."""
    if os.environ.get("VTL_BPF_CACHE"):
        return {}
    if not _IMAGES:
        _IMAGES.append(tempfile.TemporaryDirectory(prefix="vtl-mutants-images-"))
    return {"VTL_BPF_CACHE": _IMAGES[0].name}


def run_tests(args, root=ROOT, timeout=TIMEOUT) -> tuple[bool, str, float]:
    """(killed?, by which test, seconds): pytest on `args`, stopping at the first failure."""
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **_images_env()}
    # faulthandler_timeout: a test that hangs dumps its stack before the timeout, which says where
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-rfE",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-o",
            f"faulthandler_timeout={max(1, timeout - 60)}",
            *args,
        ],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=_interruptible,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        where = _hung_in(_stop(proc))
        return True, f"timeout after {timeout} s ({where or ' '.join(args)})", time.monotonic() - t0
    except KeyboardInterrupt:  # pytest tears its testbeds down on SIGINT: let it, then stop
        _stop(proc)
        raise
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
    seconds = time.monotonic() - t0
    if r.returncode == 0:
        return False, "", seconds
    if r.returncode == 5:  # no tests collected: a wrong -k, not a kill
        raise RuntimeError(f"no test collected by {' '.join(args)}")
    return True, _failed_test(r.stdout) or f"pytest exit {r.returncode} ({' '.join(args)})", seconds


def confirmed_run(args, edited, root=ROOT, tries=3):
    """run_tests(), with each kill confirmed: the failing test alone must fail
    again with the mutant and pass without it. One that does not failed for
    another reason (a flaky test, which is itself a defect, or the machine: a
    second lab run at the same time) and is listed and deselected for the next
    try. Returns (killed?, by, seconds, [tests that failed without the mutant's doing])."""
    flaky, secs, deselect = [], 0.0, []
    for _ in range(tries):
        killed, by, s = run_tests([*args, *deselect], root)
        secs += s
        if not killed or not by.startswith("tests/"):
            return killed, by, secs, flaky
        again, _, s = run_tests([by], root)
        secs += s
        if again:
            with edited.original():
                baseline_fails, _, s = run_tests([by], root)
            secs += s
            if not baseline_fails:
                return True, by, secs, flaky
        flaky.append(by)
        deselect += ["--deselect", by]
    return False, "", secs, flaky


def run(mutants, out_dir, progress=True, root=ROOT) -> Path:
    """Every mutant in turn; the table as CSV in out_dir, returned."""
    from .bench.common import Progress  # noqa: PLC0415 -- bench.common pulls pandas and pyroute2

    put_back = restore_all(root)
    for p in put_back:
        print(f"lab mutants: put back {p}, left edited by a killed run", file=sys.stderr)
    for m in mutants:  # every edit is checked before anything runs
        m.apply((root / m.path).read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"mutants-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.csv"
    rows = []
    bar = Progress(len(mutants)) if progress else None
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["mutant", "where", "what", "killed_by", "stage", "seconds", "flaky"])
        w.writeheader()
        for m in mutants:
            fast, functional = m.tests
            edited = Edited(m, root)
            with edited as line:
                flaky = []
                killed, by, secs, stage = False, "", 0.0, ""
                for name, args in (("fast", fast), ("functional", functional)):
                    if not args:
                        continue
                    killed, by, more, seen_flaky = confirmed_run(args, edited, root)
                    secs += more
                    flaky += seen_flaky
                    if killed:
                        stage = name
                        break
            row = {
                "mutant": m.id,
                "where": f"{m.path}:{line}",
                "what": m.why,
                "killed_by": by if killed else "SURVIVED",
                "stage": stage,
                "seconds": round(secs, 1),
                "flaky": " ".join(flaky),
            }
            w.writerow(row)
            f.flush()
            rows.append(row)
            if bar:
                bar.step(f"{m.id}: {'killed' if killed else 'SURVIVED'}")
    print_table(rows)
    return path


def print_table(rows, stream=sys.stdout):
    width = max((len(r["mutant"]) for r in rows), default=10)
    for r in rows:
        stream.write(f"{r['mutant']:<{width}}  {r['where']:<40}  {r['killed_by']}\n")
    survived = [r for r in rows if r["killed_by"] == "SURVIVED"]
    stream.write(
        f"\n{len(rows) - len(survived)} of {len(rows)} mutants killed"
        + (f"; survived: {', '.join(r['mutant'] for r in survived)}\n" if survived else "\n")
    )


def add_arguments(p):
    p.description = __doc__.split("\n\n")[0].split(": ", 1)[1]
    p.add_argument("--only", help="mutant ids, comma-separated (default: all)")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--restore", action="store_true", help="put back files a killed run left edited, and exit")
    p.add_argument(
        "--out", type=Path, default=ROOT / "datasets" / "results", help="where the CSV goes (default datasets/results)"
    )


def main(a) -> int:
    if a.restore:
        for f in restore_all():
            print(f"lab mutants: put back {f}")
        return 0
    every = all_mutants()
    chosen = every
    if a.only:
        wanted = a.only.split(",")
        unknown = [w for w in wanted if w not in {m.id for m in every}]
        if unknown:
            print(f"lab mutants: error: unknown mutant {unknown[0]!r} (--list shows them)", file=sys.stderr)
            return 2
        chosen = [m for m in every if m.id in wanted]
    if a.list:
        for m in chosen:
            print(f"{m.id:32} {m.path}:{m.line((ROOT / m.path).read_text()):<5} {m.why}")
        return 0
    if os.geteuid() != 0:
        print("lab mutants: error: the tests run real namespaces and BPF programs: run as root", file=sys.stderr)
        return 2
    # SIGTERM unwinds as Ctrl-C does, through Edited: the file is put back before we exit.
    # SIGINT too when started in the background (`... &` ignores it): its pytest
    # children, which inherit the disposition, are stopped with it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        path = run(chosen, a.out)
    except KeyboardInterrupt:
        print("\nlab mutants: stopped; every file is as it was", file=sys.stderr)
        return 130
    print(f"lab mutants: {path}")
    return 0


if __name__ == "__main__":
    from lab.console import ArgumentParser

    parser = ArgumentParser(prog="python -m lab mutants", error_name="lab mutants")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
