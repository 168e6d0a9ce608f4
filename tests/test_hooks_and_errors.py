"""Attaching never disturbs what was there; build failures are one clear line."""

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import RX4, WATCHED_SRC4, frames_in, invariant
from pyroute2 import IPRoute

from ebpf import BpfError, BpfProgram, CompileError, TcMirror, VerifierError, tc
from ebpf.errors import verifier_summary
from lab import netns
from lab.traffic import Capture, Flow, Marker, build, send_frames

ROOT = Path(__file__).resolve().parents[1]

SIZE = 333  # a frame length nothing else on the link has, so the other filter counts exactly ours

OTHER_FILTER = r"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
BPF_ARRAY(hits, u64, 1);
/* Somebody else's filter: counts our test frames, then lets them pass. */
int count_frames(struct __sk_buff *skb)
{
    int zero = 0;
    u64 *n = hits.lookup(&zero);
    if (n && skb->len == SIZE)
        __sync_fetch_and_add(n, 1);
    return TC_ACT_OK;
}
"""


class OtherFilter(BpfProgram):
    def hits(self):
        t = self.table("hits")
        return t[t.Key(0)].value


def _send(tb, n):
    marker = Marker()
    frames = build([Flow("a", WATCHED_SRC4, RX4, count=n, size=SIZE)], marker, tb.sender_mac, tb.next_hop_mac)
    with Capture(tb.ns("monitor"), "eth0", marker) as mon:
        send_frames(tb.ns("sender"), "eth0", frames, rate_pps=20000)
    return mon.counts["a"]


@pytest.mark.parametrize("clone", ["action", "helper"])
def test_preexisting_clsact_and_filter_survive_and_keep_running(tb1, tmp_path, clone):
    src = tmp_path / "other.c"
    src.write_text(OTHER_FILTER)
    ns = tb1.ns("receiver")
    with IPRoute(netns=ns, flags=0) as ip:  # somebody else's clsact, made before us
        ip.tc("add", "clsact", index=ip.link_lookup(ifname="eth0")[0])
    with OtherFilter(cflags=[f"-DSIZE={SIZE}"], source=src) as other:
        other.attach_tc("count_frames", "eth0", "ingress", netns=ns, owner="other")
        before = tc.hook_snapshot(ns)
        with TcMirror(monitor="mon0", netns=ns, clone=clone) as tap:
            tap.attach("eth0", "ingress")
            at_monitor = frames_in(tb1.ns("monitor"), "eth0")
            during = tc.hook_snapshot(ns)["eth0"]
            assert sorted(n for _, _, _, n in during[1]) == ["other:count_frames", "vtap:tc_mirror"]
            assert tap.tc_filters[0].runs_after == 0
            # The other filter returns TC_ACT_OK, which ends the hook: the vTAP sees
            # frames only because it runs first, and the other filter still sees
            # every one because the vTAP hands them on.
            assert _send(tb1, 300) == 300
            assert other.hits() == 300
            c = tap.counters()
            assert c["matched"] == c["cloned"] == at_monitor() == 300 and invariant(c)
        assert tc.hook_snapshot(ns) == before
        assert _send(tb1, 200) == 0  # no vTAP any more...
        assert other.hits() == 500  # ...and the other filter still runs
    after = tc.hook_snapshot(ns)["eth0"]
    assert after == (True, [])  # their clsact, now empty, is theirs to remove


def test_goes_last_and_says_so_behind_a_foreign_kind_of_filter(tb1):
    ns = tb1.ns("receiver")
    with IPRoute(netns=ns, flags=0) as ip:
        idx = ip.link_lookup(ifname="eth0")[0]
        ip.tc("add", "clsact", index=idx)
        ip.tc(
            "add-filter",
            "u32",
            index=idx,
            parent=0xFFFFFFF2,
            prio=1,
            protocol=0x0800,
            keys=["0x0/0x0+0"],
            target=0x10001,
        )  # match-all u32 (this kernel has no matchall)
    before = tc.hook_snapshot(ns)
    with TcMirror(monitor="mon0", netns=ns) as tap:
        (f,) = tap.attach("eth0", "ingress")
        assert f.prio == 2 and f.runs_after == 1
    assert tc.hook_snapshot(ns) == before


def test_created_qdisc_removed_only_when_empty(tb1):
    ns = tb1.ns("receiver")
    before = tc.hook_snapshot(ns)
    with TcMirror(monitor="mon0", netns=ns) as tap:
        ingress, egress = tap.attach("eth0", "both")
        assert "+clsact" in ingress.name and "+clsact" in egress.name  # both know we created it
        tap.detach_tc(ingress)
        assert tc.hook_snapshot(ns)["eth0"][0], "clsact removed while our egress filter still used it"
    assert tc.hook_snapshot(ns) == before


@pytest.mark.parametrize("compile_in", ["process", "child"])
def test_verifier_rejection_is_one_line_with_the_reason(tmp_path, compile_in):
    bad = tmp_path / "bad.c"
    bad.write_text(r"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
int unchecked(struct __sk_buff *skb)
{
    unsigned char *p = (void *)(long)skb->data;
    return p[20] ? TC_ACT_OK : TC_ACT_SHOT;   /* no bounds check: must be rejected */
}
""")
    with BpfProgram(source=bad) as prog:
        prog.compile_in = compile_in
        with pytest.raises(VerifierError) as e:
            prog.load("unchecked", "SCHED_CLS")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("verifier rejected unchecked:")
    assert "invalid access to packet" in msg or "outside of the packet" in msg, msg
    assert "processed" in e.value.log or "R1" in e.value.log


@pytest.mark.parametrize("compile_in", ["process", "child"])
def test_compile_error_names_the_file_and_line(tmp_path, compile_in):
    bad = tmp_path / "typo.c"
    bad.write_text("int f(struct __sk_buff *skb) { return undefined_name; }\n")
    prog = BpfProgram(source=bad)
    prog.compile_in = compile_in
    with pytest.raises(CompileError) as e:
        prog.compile()
    assert "typo.c:1:" in str(e.value) and "undefined_name" in str(e.value)
    assert "\n" not in str(e.value)


def test_bcc_crashing_in_a_child_is_one_line_and_this_process_lives(tmp_path):
    """BCC 0.26 crashes (SIGSEGV) on a map of a struct the text never completes: in
    this process that would end it (a notebook's kernel, a command); compiled in a
    child (compile_in = "child", lab lb's way) it is one line."""
    bad = tmp_path / "incomplete.c"
    bad.write_text(
        "struct s { struct nowhere e; __u64 b; };\n"  # a field of a type never defined: a header not included
        "BPF_PERCPU_ARRAY(st, struct s, 4);\n"
        "int f(struct __sk_buff *skb) { return 0; }\n"
    )
    prog = BpfProgram(source=bad)
    prog.compile_in = "child"
    with pytest.raises(CompileError, match=r"incomplete.c: BCC crashed \(SIGSEGV\)") as e:
        prog.compile()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("cidr", ["198.18.0.300/24", "198.18.0.1/33", "2001:2::/129", "nonsense", "198.18.1.1/24"])
def test_bad_cidr_rejected_before_anything_is_loaded(tb1, cidr):
    ns = tb1.ns("receiver")
    before = tc.hook_snapshot(ns)
    with pytest.raises(BpfError, match="bad CIDR"):
        TcMirror(monitor="mon0", watch=[cidr], netns=ns)
    assert tc.hook_snapshot(ns) == before


def test_attach_many_is_all_or_nothing(tb2):
    ns = tb2.ns("tapnode")
    before = tc.hook_snapshot(ns)
    with TcMirror(monitor="mon0", netns=ns) as tap:
        with pytest.raises(BpfError, match="no interface named 'eth9'"):
            tap.attach_many(["eth0", "eth1", "eth9"], "both")
        assert tc.hook_snapshot(ns) == before
        assert tap.tc_filters == []


def test_lab_refuses_foreign_namespaces():
    with pytest.raises(netns.LabError, match="refusing"):
        netns.remove("not-a-lab-namespace")
    with pytest.raises(netns.LabError, match="refusing"):
        netns.ipr("default")


STACK_HOG = r"""
#include <uapi/linux/bpf.h>
int hog(struct xdp_md *ctx)
{
    volatile char buf[1024];   /* more than BPF's 512 bytes of stack: LLVM's backend ends the process */
    for (int i = 0; i < 1024; i++)
        buf[i] = i;
    return buf[ctx->ingress_ifindex & 1023];
}
"""


def test_a_program_whose_stack_outgrows_bpfs_says_so_in_one_line(tmp_path):
    """LLVM ends the process (exit 1) on a stack over 512 bytes, in the middle of a
    compile whose fd 2 is a temporary file: a command died saying nothing. In this
    process: the compiler's last words on stderr, one line; compiled in a child: a
    CompileError with them, and this process lives."""
    hog = tmp_path / "hog.bpf.c"
    hog.write_text(STACK_HOG)
    code = f"from ebpf.program import BpfProgram; BpfProgram(source={str(hog)!r}).compile(); print('survived')"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "survived" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "ended the process" in lines[0] and "stack limit of 512 bytes" in lines[0], r.stderr
    assert "hog.bpf.c" in lines[0]
    # and a process that compiled well ends well: the handler that says those last words
    # is a Python function, which the C library must not call once Python is gone (it did:
    # every such process ended on SIGSEGV)
    ok = tmp_path / "ok.bpf.c"
    ok.write_text("#include <uapi/linux/bpf.h>\nint fine(struct xdp_md *ctx) { return XDP_PASS; }\n")
    code = f"from ebpf.program import BpfProgram; BpfProgram(source={str(ok)!r}).compile(); print('done')"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "done\n", "")
    prog = BpfProgram(source=hog)
    prog.compile_in = "child"
    with pytest.raises(CompileError, match=r"compiling hog.bpf.c: .*stack limit of 512 bytes") as e:
        prog.compile()
    assert "\n" not in str(e.value)


def test_the_verifiers_reason_is_told_from_its_register_states():
    """A reason that names a register ("R2 unbounded memory access") is the summary;
    a register state ("R1=ctx() R10=fp0") and the closing statistics are not (the
    summary once gave the statistics line for such a log)."""
    log = (
        "748: (0f) r2 += r1\n"
        "R1=scalar(smin=0) R2=map_value(map=config,ks=4,vs=40)\n"
        "749: (79) r1 = *(u64 *)(r2 +16)\n"
        "R2 unbounded memory access, make sure to bounds check any such access\n"
        "processed 504 insns (limit 1000000) max_states_per_insn 0 total_states 31 peak_states 31 mark_read 0\n"
    )
    assert verifier_summary(log) == "R2 unbounded memory access, make sure to bounds check any such access"
