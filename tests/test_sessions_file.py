"""The sessions file and the session/rule/target model (ebpf/vtap/sessions/config.py), and
the classifier's tables built from them (ebpf/vtap/sessions/tables.py), checked
against a plain first-match evaluation of the same rules. No kernel needed."""

import ipaddress
import random

import pytest

from ebpf.errors import InputError
from ebpf.vtap.sessions.config import Rule, Session, load_sessions, parse_sessions, parse_target, watching
from ebpf.vtap.sessions.tables import NO_PORT, UNKNOWN_PROTO, field_bits

GOOD = """\
# two sessions
[[session]]
number = 20
target = "erspan3://[2001:db8::9]/7"
truncate = 128
cutoff = "1MiB"

  [[session.rule]]
  action = "reject"
  protocol = "udp"
  destination_ports = "53"

  [[session.rule]]
  action = "accept"
  source = "198.18.0.0/15"

[[session]]
number = 10
name = "web"
target = "mon0"
sample = 10

  [[session.rule]]
  action = "accept"
  direction = "ingress"
  protocol = "tcp"
  destination_ports = "80-443"
"""


def test_a_good_file():
    ss = parse_sessions(GOOD, "s.toml")
    assert [s.number for s in ss] == [10, 20]  # ordered by number
    web, e3 = ss
    assert (web.label, web.target.kind, web.target.ifname, web.sample) == ("web", "local", "mon0", 10)
    assert str(web.rules[0]) == "accept ingress tcp to any port 80-443"
    assert (e3.label, e3.target.kind, e3.target.key, e3.truncate) == ("session 20", "erspan3", 7, 128)
    assert (e3.cutoff, web.cutoff) == (1 << 20, 0)
    assert e3.target.address == ipaddress.ip_address("2001:db8::9")
    assert [r.action for r in e3.rules] == ["reject", "accept"]


@pytest.mark.parametrize(
    "text,line,says",
    [
        (
            '[[session]]\ntarget = "mon0"\n[[session.rule]]\naction = "accept"\nsource = "198.18.0.0/33"\n',
            5,
            "bad CIDR '198.18.0.0/33'",
        ),
        ('[[session]]\ntarget = "mon0"\n[[session.rule]]\naction = "copy"\n', 4, "accept or reject"),
        (
            '[[session]]\ntarget = "mon0"\n[[session.rule]]\naction = "accept"\ndestination_ports = 80\n',
            5,
            "ports need protocol tcp or udp",
        ),
        (
            '[[session]]\ntarget = "mon0"\n[[session.rule]]\naction = "accept"\nprotocol = "tcp"\n'
            'source_ports = "90-80"\n',
            6,
            "bad port range",
        ),
        (
            '[[session]]\ntarget = "mon0"\n[[session.rule]]\naction = "accept"\nsource = "198.18.0.0/16"\n'
            'destination = "2001:db8::/32"\n',
            6,
            "different families",
        ),
        (
            '[[session]]\ntarget = "mon0"\n[[session.rule]]\naction = "accept"\ncolour = "red"\n',
            5,
            "unknown key 'colour'",
        ),
        ('[[session]]\ntarget = "mon0"\ntruncate = 10\n', 3, "truncate must be"),
        ('[[session]]\ntarget = "mon0"\ncutoff = "lots"\n', 3, "cutoff must be bytes (65536, 64K, 1MiB), not 'lots'"),
        ('[[session]]\ntarget = "mon0"\nsample = 0\n', 3, "sample must be"),
        ("[[session]]\nnumber = 1\n", 1, "no target"),
        ('[[session]]\ntarget = "vxlan://198.18.9.2"\n', 2, "vxlan needs a VNI"),
        ('[[session]]\ntarget = "vxlan://198.18.9.2/16777216"\n', 2, "VNI 16777216 out of range"),
        ('[[session]]\ntarget = "erspan://198.18.9.2/1024"\n', 2, "session id 1024 out of range"),
        ('[[session]]\ntarget = "gre://198.18.9.2:99/1"\n', 2, "gre has no UDP port"),
        ('[[session]]\ntarget = "ipip://198.18.9.2/1"\n', 2, "unknown tunnel 'ipip'"),
        ('[[session]]\ntarget = "vxlan://[198.18.9.2]/1"\n', 2, "brackets are for IPv6"),
        ('[[session]]\ntarget = "mon0"\n\n[[session]]\ntarget = "mon1"\nbogus = 1\n', 6, "unknown key 'bogus'"),
        (
            '[[session]]\ntarget = "mon0"\nnumber = 1\n[[session]]\ntarget = "mon1"\nnumber = 1\n',
            1,
            "two sessions are numbered 1",
        ),
        ('[[session]]\ntarget = "mon0"\n[[session.rule]\n', 3, ""),
        ('[monitor]\nname = "x"\n', 1, "unknown key 'monitor'"),
    ],
)
def test_a_bad_file_says_where_in_one_line(text, line, says):
    with pytest.raises(InputError) as e:
        parse_sessions(text, "s.toml")
    msg = str(e.value)
    assert msg.startswith(f"s.toml:{line}: "), msg
    assert says in msg and "\n" not in msg


def test_limits():
    many = "".join(f'[[session]]\ntarget = "mon{i}"\n' for i in range(17))
    with pytest.raises(InputError, match="at most 16"):
        parse_sessions(many)
    rules = '[[session]]\ntarget = "mon0"\n' + '[[session.rule]]\naction = "accept"\n' * 257
    with pytest.raises(InputError, match="at most 256"):
        parse_sessions(rules)


def test_unreadable_file(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        load_sessions(tmp_path / "none.toml")


@pytest.mark.parametrize(
    "text,kind,addr,port,key",
    [
        ("vxlan://198.18.9.2/100", "vxlan", "198.18.9.2", 4789, 100),
        ("vxlan://198.18.9.2:8472/1", "vxlan", "198.18.9.2", 8472, 1),
        ("geneve://[2001:db8::1]:7000/5", "geneve", "2001:db8::1", 7000, 5),
        ("gre://198.18.9.2", "gre", "198.18.9.2", None, None),
        ("gre://198.18.9.2/4294967295", "gre", "198.18.9.2", None, 2**32 - 1),
        ("erspan3://[2001:db8::1]/1023", "erspan3", "2001:db8::1", None, 1023),
    ],
)
def test_targets(text, kind, addr, port, key):
    t = parse_target(text)
    assert (t.kind, str(t.address), t.port, t.key) == (kind, addr, port, key)


def first_match(sessions, frame):
    """The sessions a frame goes to by the plain reading of the rules."""
    out = []
    for slot, s in enumerate(sessions):
        for r in s.rules:
            if matches(r, frame):
                if r.action == "accept":
                    out.append(slot)
                break
    return out


def matches(r, f):
    if r.direction != "any" and r.direction != f["dir"]:
        return False
    if r.proto is not None and r.proto != f["proto"]:
        return False
    for net, addr in ((r.src, f["src"]), (r.dst, f["dst"])):
        if net is not None and (addr.version != net.version or addr not in net):
            return False
    if r.family is not None and r.family != f["src"].version:
        return False
    for rng, port in ((r.sports, f["sport"]), (r.dports, f["dport"])):
        if rng is not None and (port is None or not rng[0] <= port <= rng[1]):
            return False
    return True


def classify(bits, f):
    """The tables' answer, as the program computes it (sessions.h)."""
    x = bits["direction"][0 if f["dir"] == "ingress" else 1]
    x &= bits["proto"][f["proto"] if f["proto"] is not None else UNKNOWN_PROTO]
    fam = f["src"].version
    for side, addr in ((0, f["src"]), (1, f["dst"])):
        best = max(
            (p for (fa, sd, p) in bits["tries"] if fa == fam and sd == side and addr in p), key=lambda p: p.prefixlen
        )
        x &= bits["tries"][(fam, side, best)]
    x &= bits["sport"][f["sport"] if f["sport"] is not None else NO_PORT]
    x &= bits["dport"][f["dport"] if f["dport"] is not None else NO_PORT]
    taken, decided = [], set()
    for i, (slot, r) in enumerate(bits["rules"]):
        if x >> i & 1 and slot not in decided:
            decided.add(slot)
            if r.action == "accept":
                taken.append(slot)
    return taken


def test_tables_agree_with_first_match_on_random_rules():
    """Random nested prefixes, ranges, protocols and directions over 4
    sessions and 64 rules; 3000 random frames (some without ports): the
    bitmap tables give exactly what a plain first-match reading gives."""
    rnd = random.Random(22)
    nets4 = ["198.18.0.0/15", "198.18.0.0/16", "198.18.1.0/24", "198.18.1.128/25", "198.18.1.7/32"]
    nets6 = ["2001:2::/32", "2001:2:0:1::/64", "2001:2:0:1::7/128"]

    def rule():
        fam = rnd.choice([None, 4, 6])
        pool = nets4 if fam == 4 else nets6 if fam == 6 else []
        proto = rnd.choice([None, "tcp", "udp", "icmp"])
        kw = dict(
            action=rnd.choice(["accept", "reject"]), direction=rnd.choice(["any", "ingress", "egress"]), protocol=proto
        )
        if pool and rnd.random() < 0.7:
            kw["source"] = rnd.choice(pool)
        if pool and rnd.random() < 0.5:
            kw["destination"] = rnd.choice(pool)
        if proto in ("tcp", "udp"):
            for side in ("source_ports", "destination_ports"):
                if rnd.random() < 0.5:
                    lo = rnd.choice([0, 53, 80, 1000, 5000, 65535])
                    kw[side] = f"{lo}-{min(65535, lo + rnd.choice([0, 1, 100, 60000]))}"
        return Rule(**kw)

    sessions = [Session(target=f"mon{i}", rules=[rule() for _ in range(16)]) for i in range(4)]
    bits = field_bits(sessions)
    addrs4 = ["198.18.1.7", "198.18.1.200", "198.18.1.1", "198.18.200.1", "198.19.0.1", "203.0.113.1"]
    addrs6 = ["2001:2:0:1::7", "2001:2:0:1::8", "2001:2:9::1", "2001:db8::1"]
    for _ in range(3000):
        pool = addrs4 if rnd.random() < 0.5 else addrs6
        proto = rnd.choice([6, 17, 1, 58, None])
        ported = proto in (6, 17) and rnd.random() < 0.8
        f = dict(
            dir=rnd.choice(["ingress", "egress"]),
            proto=proto,
            src=ipaddress.ip_address(rnd.choice(pool)),
            dst=ipaddress.ip_address(rnd.choice(pool)),
            sport=rnd.choice([0, 53, 80, 81, 1000, 1100, 5000, 65535]) if ported else None,
            dport=rnd.choice([0, 53, 80, 443, 1000, 5000, 60000, 65535]) if ported else None,
        )
        assert classify(bits, f) == first_match(sessions, f), f


def test_monitor_and_watch_as_one_session():
    s = watching("mon0", ["198.18.1.0/24", "2001:2::/48"], match="any", sample=4)
    assert (s.target.ifname, s.sample) == ("mon0", 4)
    assert [str(r) for r in s.rules] == [
        "accept from 198.18.1.0/24",
        "accept to 198.18.1.0/24",
        "accept from 2001:2::/48",
        "accept to 2001:2::/48",
    ]
    assert [str(r) for r in watching("mon0", ["198.18.1.7/32"], match="dst").rules] == ["accept to 198.18.1.7/32"]
    assert [str(r) for r in watching("mon0").rules] == ["accept"]
    with pytest.raises(InputError, match="unknown match mode"):
        watching("mon0", [], match="both")
