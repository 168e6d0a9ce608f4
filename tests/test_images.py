"""Program images (ebpf/images.py): a compile's result kept and loaded again. Every
function of every program loaded from its image must be the program BCC itself loads
(the kernel's tag: its hash of the instructions), named as BCC names it, with the
same maps; a kept image is used only for the very inputs it was made from."""

import json
import os
import stat

import pytest
from bcc import BPF, BPFAttachType
from test_kernel_headers import PROGRAMS

from ebpf import BpfError, BpfProgram, images, objinfo
from ebpf.pods.tc_pods import SOCKET_HOOKS

# Every function each program has, with the type it is loaded as (and the attach type
# a cgroup program needs at load).
FUNCTIONS = {
    "TcMirror": {"tc_mirror": ("SCHED_CLS", None)},
    "XdpMirror": {
        "xdp_mirror": ("XDP", None),
        "on_devmap_xmit": ("TRACEPOINT", None),
        "on_redirect_err": ("TRACEPOINT", None),
    },
    "SessionMirror": {f: ("SCHED_CLS", None) for f in ("tap_ingress", "tap_egress", "sender")},
    "XdpRedirect": {"xdp_redirect": ("XDP", None)},
    "TcRedirect": {"tc_redirect": ("SCHED_CLS", None)},
    "XdpLoadBalancer": {"xdp_lb": ("XDP", None)},
    "TcLoadBalancer": {"tc_lb": ("SCHED_CLS", None)},
    "XdpPortFilter": {"xdp_port_filter": ("XDP", None)},
    "TcPods": {
        "pods_from_pod": ("SCHED_CLS", None),
        "pods_from_node": ("SCHED_CLS", None),
        **{f: ("CGROUP_SOCK_ADDR", hook) for f, hook in SOCKET_HOOKS},
    },
    "XdpSink": {"xdp_sink": ("XDP", None)},
    "XdpGen": {"xdp_gen": ("XDP", None)},
    "XdpPeerPass": {"xdp_peer_pass": ("XDP", None)},
    "TcSwap": {"tc_swap": ("SCHED_CLS", None)},
}


def test_every_program_class_is_here():
    assert set(FUNCTIONS) == set(PROGRAMS)


def _shapes(prog_fd):
    got = objinfo.maps_of(prog_fd)
    for fd, _ in got.values():
        os.close(fd)
    return {name: shape for name, (_, shape) in got.items()}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_function_from_the_image_is_the_program_bcc_loads(name):
    prog = PROGRAMS[name]()
    text = prog.c_text()
    bcc = BPF(text=text.encode(), cflags=prog.cflags)
    loaded = images.Loaded(images.describe(bcc, text, prog.source_path.name))  # one compile: both from it
    try:
        assert set(loaded.image["functions"]) == set(FUNCTIONS[name]), "a function the test does not load"
        for function, (prog_type, attach_type) in FUNCTIONS[name].items():
            kw = {"attach_type": getattr(BPFAttachType, attach_type)} if attach_type else {}
            theirs = bcc.load_func(function.encode(), getattr(BPF, prog_type), **kw)
            ours = loaded.load_func(function, prog_type, attach_type)
            a, b = objinfo.prog(theirs.fd), objinfo.prog(ours.fd)
            assert (b.tag, b.name) == (a.tag, a.name), function
            assert _shapes(ours.fd) == _shapes(theirs.fd), function
        # every map, used by a function or not, as BCC made it
        for m in loaded.image["maps"]:
            assert objinfo.map_(loaded[m["name"]].map_fd) == objinfo.map_(bcc[m["name"].encode()].map_fd), m["name"]
    finally:
        loaded.cleanup()
        bcc.cleanup()


PROGRAM = r"""
#include <uapi/linux/bpf.h>
#include "answer.h"
BPF_ARRAY(counts, __u64, 1);
int count(struct xdp_md *ctx)
{
    int zero = 0;
    __u64 *n = counts.lookup(&zero);
    if (n)
        __sync_fetch_and_add(n, ANSWER);
    return XDP_PASS;
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("VTL_BPF_CACHE", str(d))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "count.bpf.c").write_text(PROGRAM)
    (tmp_path / "src" / "answer.h").write_text("#define ANSWER 42\n")
    return d


def _load(tmp_path, cflags=()):
    """The test program compiled (or taken from its image), its one counter after one run."""
    from ebpf import testrun  # noqa: PLC0415

    with BpfProgram(source=tmp_path / "src" / "count.bpf.c", cflags=[f"-I{tmp_path / 'src'}", *cflags]) as p:
        testrun.run(p.load("count", "XDP").fd, bytes(64))
        return p.bpf.image["source"], p.table("counts")[0].value


def test_a_kept_image_is_used_and_a_changed_input_compiled_again(tmp_path, cache):
    assert _load(tmp_path) == ("count.bpf.c", 42)
    (kept,) = cache.glob("*.json")
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and stat.S_IMODE(kept.stat().st_mode) == 0o600
    # mark the kept image: a load that reads it says so
    image = json.loads(kept.read_text())
    kept.write_text(json.dumps({**image, "source": "from-the-cache.c"}))
    assert _load(tmp_path) == ("from-the-cache.c", 42)
    # a header the text includes, edited: another compile, another image
    (tmp_path / "src" / "answer.h").write_text("#define ANSWER 7\n")
    assert _load(tmp_path) == ("count.bpf.c", 7)
    # other flags: another compile too
    assert _load(tmp_path, ["-DUNUSED=1"]) == ("count.bpf.c", 7)
    assert len(list(cache.glob("*.json"))) == 3


def test_an_unreadable_image_is_compiled_again_and_replaced(tmp_path, cache):
    _load(tmp_path)
    (kept,) = cache.glob("*.json")
    kept.write_text(kept.read_text()[:100])  # cut short, as by a full disk
    assert _load(tmp_path) == ("count.bpf.c", 42)
    assert json.loads(kept.read_text())["format"] == images.FORMAT


def test_off_keeps_nothing_and_a_directory_others_can_write_is_refused(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("VTL_BPF_CACHE", "off")
    assert _load(tmp_path) == ("count.bpf.c", 42)
    assert not cache.exists()
    monkeypatch.setenv("VTL_BPF_CACHE", str(cache))
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    with pytest.raises(BpfError, match=r"is not this user's alone .*chmod go-w") as e:
        _load(tmp_path)
    assert "\n" not in str(e.value)
    assert not list(cache.glob("*.json"))


def test_a_write_a_killed_process_left_is_removed_once_it_is_old(tmp_path, cache):
    cache.mkdir(mode=0o700)
    old, fresh = cache / ".image-old.tmp", cache / ".image-fresh.tmp"
    old.write_text("{")
    fresh.write_text("{")  # another process writing now
    os.utime(old, (0, 0))
    assert _load(tmp_path) == ("count.bpf.c", 42)
    assert not old.exists() and fresh.exists()
    assert len(list(cache.glob("*.json"))) == 1
