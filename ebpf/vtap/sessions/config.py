"""vTAP sessions: what to copy (ordered rules), where to (a target), how much
(truncation) and how often (sampling). Plain data, checked when made; the
kernel side is tc_sessions.py.

    >>> Session(target="vxlan://198.18.9.2/100", truncate=128,
    ...         rules=[Rule("accept", protocol="tcp", destination_ports="80")])  # doctest: +SKIP

A sessions file (TOML, read with the standard library's tomllib):

    [[session]]
    number = 1                        # orders the sessions (default: file order)
    target = "erspan://198.18.9.2/7"  # or an interface name: "mon0"
    truncate = 128                    # copy the first 128 bytes (default: whole frames)
    sample = 1                        # 1 in N accepted frames (default 1: all)
    cutoff = "1MiB"                   # each flow's first MiB each way, then SYN/FIN/RST (default 0: all)

      [[session.rule]]                # first match decides, in file order
      action = "reject"
      protocol = "udp"
      destination_ports = "53"

      [[session.rule]]
      action = "accept"
      source = "198.18.0.0/24"

Errors name the file and the line: "sessions.toml:7: rule 2 of session 1:
bad CIDR '198.18.0.0/33'", and nothing of a bad file is applied.
"""

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ebpf.abi import defines
from ebpf.errors import InputError
from ebpf.vtap.cutoff import parse_size

SESSIONS_H = defines("vtap/sessions/sessions.h")
SESSIONS_MAX = SESSIONS_H["SESS_MAX"]
RULES_MAX = SESSIONS_H["SESS_RULES_MAX"]
SAMPLE_MAX = SESSIONS_H["SESS_SAMPLE_MAX"]
TRUNCATE_MIN = 64
TRUNCATE_MAX = 65535

PROTOCOLS = {"tcp": 6, "udp": 17, "icmp": 1, "icmpv6": 58, "sctp": 132, "gre": 47, "esp": 50}
DIRECTIONS = ("any", "ingress", "egress")
ACTIONS = ("accept", "reject")
KINDS = {
    "local": SESSIONS_H["SESS_T_LOCAL"],
    "vxlan": SESSIONS_H["SESS_T_VXLAN"],
    "geneve": SESSIONS_H["SESS_T_GENEVE"],
    "gre": SESSIONS_H["SESS_T_GRE"],
    "erspan": SESSIONS_H["SESS_T_ERSPAN2"],
    "erspan3": SESSIONS_H["SESS_T_ERSPAN3"],
}
DEFAULT_PORTS = {"vxlan": 4789, "geneve": 6081}
KEY_LIMITS = {
    "vxlan": (0, 2**24 - 1, "VNI"),
    "geneve": (0, 2**24 - 1, "VNI"),
    "gre": (0, 2**32 - 1, "key"),
    "erspan": (0, 1023, "session id"),
    "erspan3": (0, 1023, "session id"),
}


def _keyed(key, fn, *args):
    """fn(*args), its InputError marked with the key it is about (so that the
    sessions file can say the key's line)."""
    try:
        return fn(*args)
    except InputError as e:
        e.key = key
        raise


def _net(text, what):
    try:
        return ipaddress.ip_network(str(text), strict=False)
    except ValueError:
        raise InputError(f"{what}: bad CIDR {text!r}") from None


def _ports(value, what):
    """80, "80", "1024-65535" -> (low, high)."""
    if isinstance(value, bool):
        raise InputError(f"{what}: bad port range {value!r}")
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(value))
    if not m:
        raise InputError(f"{what}: bad port range {value!r} (a port, or LOW-HIGH)")
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) else lo
    if not 0 <= lo <= hi <= 65535:
        raise InputError(f"{what}: bad port range {value!r} (0-65535, low first)")
    return lo, hi


def _protocol(value, what):
    if value is None or value == "any":
        return None
    if isinstance(value, str) and value.lower() in PROTOCOLS:
        return PROTOCOLS[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 254:
        return value
    raise InputError(f"{what}: unknown protocol {value!r} ({', '.join(PROTOCOLS)}, a number 0-254, or any)")


@dataclass
class Rule:
    """One rule: first match decides. None means any."""

    action: str
    direction: str = "any"
    protocol: int | str | None = None
    source: str | None = None
    destination: str | None = None
    source_ports: str | int | None = None
    destination_ports: str | int | None = None
    whole: bool = False  # a held host's rule (an alert's), not the file's: past the cutoff (tc_sessions.py)

    def __post_init__(self):
        self.check("rule")

    def check(self, what):
        def bad(key, msg):
            e = InputError(f"{what}: {msg}")
            e.key = key
            raise e

        if self.action not in ACTIONS:
            bad("action", f"action must be accept or reject, not {self.action!r}")
        if self.direction not in DIRECTIONS:
            bad("direction", f"direction must be ingress, egress or any, not {self.direction!r}")
        self.proto = _keyed("protocol", _protocol, self.protocol, what)
        self.src = None if self.source in (None, "any") else _keyed("source", _net, self.source, what)
        self.dst = None if self.destination in (None, "any") else _keyed("destination", _net, self.destination, what)
        if self.src and self.dst and self.src.version != self.dst.version:
            bad("destination", f"source {self.src} and destination {self.dst} are of different families")
        self.sports = None if self.source_ports is None else _keyed("source_ports", _ports, self.source_ports, what)
        self.dports = (
            None
            if self.destination_ports is None
            else _keyed("destination_ports", _ports, self.destination_ports, what)
        )
        if self.sports or self.dports:
            if self.proto not in (6, 17):
                bad("destination_ports" if self.dports else "source_ports", "ports need protocol tcp or udp")

    @property
    def family(self):
        net = self.src or self.dst
        return net.version if net else None

    def __str__(self):
        parts = [self.action]
        if self.direction != "any":
            parts.append(self.direction)
        if self.proto is not None:
            parts.append(next((n for n, v in PROTOCOLS.items() if v == self.proto), str(self.proto)))
        for name, net, ports in (("from", self.src, self.sports), ("to", self.dst, self.dports)):
            if net or ports:
                where = str(net) if net else "any"
                if ports:
                    where += f" port {ports[0]}" + (f"-{ports[1]}" if ports[1] != ports[0] else "")
                parts.append(f"{name} {where}")
        if self.whole:
            parts.append("whole")
        return " ".join(parts)


@dataclass
class Target:
    """Where a session's copies go: an interface, or a tunnel to a collector."""

    kind: str
    ifname: str | None = None
    address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    port: int | None = None
    key: int | None = None
    text: str = ""

    def __str__(self):
        return self.text


_URL = re.compile(
    r"(?P<kind>[a-z0-9]+)://(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^/:]+))(?::(?P<port>\d+))?(?:/(?P<key>\d+))?$"
)


def parse_target(text, what="target") -> Target:
    """mon0 | vxlan://ADDR[:PORT]/VNI | geneve://ADDR[:PORT]/VNI | gre://ADDR[/KEY]
    | erspan://ADDR/SESSION | erspan3://ADDR/SESSION (IPv6: [ADDR])."""
    if not isinstance(text, str) or not text:
        raise InputError(f"{what}: a target is an interface name or KIND://ADDR/KEY, not {text!r}")
    if "://" not in text:
        if len(text) > 15 or "/" in text or " " in text:
            raise InputError(f"{what}: {text!r} is not an interface name (or a KIND://ADDR/KEY tunnel)")
        return Target("local", ifname=text, text=text)
    m = _URL.match(text)
    kinds = ", ".join(k for k in KINDS if k != "local")
    if not m:
        raise InputError(f"{what}: bad target {text!r} (KIND://ADDR[:PORT]/KEY, KIND one of {kinds})")
    kind = m.group("kind")
    if kind not in KINDS or kind == "local":
        raise InputError(f"{what}: unknown tunnel {kind!r} in {text!r} ({kinds})")
    try:
        addr = ipaddress.ip_address(m.group("v6") or m.group("host"))
    except ValueError:
        raise InputError(f"{what}: bad collector address in {text!r}") from None
    if m.group("v6") and addr.version != 6:
        raise InputError(f"{what}: brackets are for IPv6 addresses, in {text!r}")
    port = m.group("port")
    if port is not None and kind not in DEFAULT_PORTS:
        raise InputError(f"{what}: {kind} has no UDP port, in {text!r}")
    port = int(port) if port is not None else DEFAULT_PORTS.get(kind)
    if port is not None and not 1 <= port <= 65535:
        raise InputError(f"{what}: bad port in {text!r}")
    key = m.group("key")
    lo, hi, name = KEY_LIMITS[kind]
    if key is None and kind != "gre":
        raise InputError(f"{what}: {kind} needs a {name}: {kind}://ADDR/{name.upper().replace(' ', '_')}")
    key = int(key) if key is not None else None
    if key is not None and not lo <= key <= hi:
        raise InputError(f"{what}: {name} {key} out of range ({lo}-{hi}) in {text!r}")
    return Target(kind, address=addr, port=port, key=key, text=text)


@dataclass
class Session:
    """A target, its ordered rules, truncation, sampling; `number` orders sessions."""

    target: str | Target
    rules: list = field(default_factory=list)
    number: int | None = None
    truncate: int = 0
    sample: int = 1
    fit: bool = False
    name: str | None = None
    cutoff: int | str = 0  # payload bytes per flow and direction it copies (ebpf/vtap/cutoff.h); 0: all

    def __post_init__(self):
        self.check("session")

    def check(self, what):
        def bad(key, msg):
            e = InputError(f"{what}: {msg}")
            e.key = key
            raise e

        if not isinstance(self.target, Target):
            self.target = _keyed("target", parse_target, self.target, what)
        if self.number is not None and (
            isinstance(self.number, bool) or not isinstance(self.number, int) or not 0 <= self.number <= 2**31
        ):
            bad("number", f"number must be a whole number, not {self.number!r}")
        t = self.truncate
        if isinstance(t, bool) or not isinstance(t, int) or not (t == 0 or TRUNCATE_MIN <= t <= TRUNCATE_MAX):
            bad("truncate", f"truncate must be 0 (whole frames) or {TRUNCATE_MIN}-{TRUNCATE_MAX} bytes, not {t!r}")
        n = self.sample
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= SAMPLE_MAX:
            bad("sample", f"sample must be 1 (every frame) to {SAMPLE_MAX}, not {n!r}")
        try:
            self.cutoff = parse_size(self.cutoff)
        except InputError as e:
            bad("cutoff", str(e))
        if not isinstance(self.fit, bool):
            bad("fit", f"fit must be true or false, not {self.fit!r}")
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            bad("name", f"name must be a non-empty string, not {self.name!r}")
        rules = []
        for i, r in enumerate(self.rules, 1):
            if isinstance(r, dict):
                r = _rule_from(r, f"{what}: rule {i}")
            elif not isinstance(r, Rule):
                raise InputError(f"{what}: rule {i} is neither a Rule nor a table")
            rules.append(r)
        self.rules = rules

    @property
    def label(self):
        return self.name or f"session {self.number}"


def watching(monitor, watch=None, match="any", sample=1, name=None) -> Session:
    """`vtap --monitor MON --watch CIDR... --match M --sample N` as one session:
    a rule accepting each watched CIDR as a source (match src), a destination
    (dst) or either (any); no watch-list: every IP frame. (The command itself
    runs the simple case on TcMirror, which copies without the sender's hop,
    and with no watch-list copies non-IP frames too.)"""
    sides = {"src": ("source",), "dst": ("destination",), "any": ("source", "destination")}
    if match not in sides:
        raise InputError(f"unknown match mode {match!r} (src, dst or any)")
    rules = (
        [Rule("accept")]
        if watch is None
        else [Rule("accept", **{side: str(net)}) for net in watch for side in sides[match]]
    )
    return Session(target=monitor, rules=rules, sample=sample, name=name)


def _rule_from(table, what):
    known = {"action", "direction", "protocol", "source", "destination", "source_ports", "destination_ports"}
    extra = set(table) - known
    if extra:
        e = InputError(f"{what}: unknown key {sorted(extra)[0]!r} ({', '.join(sorted(known))})")
        e.key = sorted(extra)[0]
        raise e
    if "action" not in table:
        raise InputError(f"{what}: no action (accept or reject)")
    try:
        return Rule(**table)
    except InputError as e:
        again = InputError(str(e).replace("rule: ", f"{what}: ", 1))
        again.key = getattr(e, "key", None)
        raise again from None


def ordered(sessions) -> list:
    """Sessions sorted by number (unnumbered ones numbered by position), checked
    for the program's limits."""
    sessions = list(sessions)
    if len(sessions) > SESSIONS_MAX:
        raise InputError(f"{len(sessions)} sessions: the program takes at most {SESSIONS_MAX}")
    for i, s in enumerate(sessions, 1):
        if not isinstance(s, Session):
            raise InputError(f"session {i}: not a Session")
        if s.number is None:
            s.number = i
    seen = {}
    for s in sessions:
        if s.number in seen:
            raise InputError(f"two sessions are numbered {s.number}")
        seen[s.number] = s
    n = sum(len(s.rules) for s in sessions)
    if n > RULES_MAX:
        raise InputError(f"{n} rules in all: the program takes at most {RULES_MAX}")
    return sorted(sessions, key=lambda s: s.number)


# --- the sessions file ------------------------------------------------------------

_SESSION_HDR = re.compile(r"^\s*\[\[\s*session\s*\]\]")
_RULE_HDR = re.compile(r"^\s*\[\[\s*session\s*\.\s*rule\s*\]\]")
_TABLE_HDR = re.compile(r"^\s*\[")


def _locate(lines, session, rule=None, key=None):
    """The line (1-based) of a session's (or its rule's) key, else of its header."""
    s = r = -1
    start = None
    for n, line in enumerate(lines, 1):
        if _SESSION_HDR.match(line):
            s, r = s + 1, -1
            if s == session and rule is None:
                start = n
            elif start is not None:
                break
        elif _RULE_HDR.match(line):
            r += 1
            if s == session and r == rule:
                start = n
            elif start is not None:
                break
        elif _TABLE_HDR.match(line) and start is not None:
            break
        elif start is not None and key and re.match(rf"^\s*{re.escape(key)}\s*=", line):
            return n
    return start or 1


def load_sessions(path) -> list:
    """Read a sessions file; any error raises InputError 'FILE:LINE: what'."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    return parse_sessions(text, str(path))


def parse_sessions(text, name="sessions") -> list:
    lines = text.splitlines()
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column \d+\)", str(e))
        msg = re.sub(r"\s*\(at line.*\)$", "", str(e))
        raise InputError(f"{name}:{m.group(1) if m else 1}: {msg}") from None
    extra = set(doc) - {"session"}
    if extra:
        key = sorted(extra)[0]
        line = next((n for n, ln in enumerate(lines, 1) if re.match(rf"^\s*\[?\[?\s*{re.escape(key)}\b", ln)), 1)
        raise InputError(f"{name}:{line}: unknown key {key!r}: a sessions file holds [[session]] tables")
    tables = doc.get("session", [])
    if not isinstance(tables, list):
        raise InputError(f"{name}:1: 'session' must be an array of tables ([[session]])")
    known = {"number", "target", "truncate", "sample", "fit", "name", "cutoff", "rule"}
    sessions = []
    for i, t in enumerate(tables):
        what = f"session {i + 1}"
        for key in t:
            if key not in known:
                raise InputError(
                    f"{name}:{_locate(lines, i, key=key)}: {what}: unknown key {key!r} ({', '.join(sorted(known))})"
                )
        if "target" not in t:
            raise InputError(f"{name}:{_locate(lines, i)}: {what}: no target")
        rules = []
        for j, rt in enumerate(t.get("rule", [])):
            try:
                rules.append(_rule_from(rt, f"rule {j + 1} of {what}"))
            except InputError as e:
                raise InputError(f"{name}:{_locate(lines, i, j, getattr(e, 'key', None))}: {e}") from None
        try:
            sessions.append(
                Session(
                    target=t["target"],
                    rules=rules,
                    number=t.get("number"),
                    truncate=t.get("truncate", 0),
                    sample=t.get("sample", 1),
                    fit=t.get("fit", False),
                    name=t.get("name"),
                    cutoff=t.get("cutoff", 0),
                )
            )
        except InputError as e:
            where = _locate(lines, i, key=getattr(e, "key", None))
            raise InputError(f"{name}:{where}: {str(e).replace('session: ', what + ': ', 1)}") from None
    try:
        return ordered(sessions)
    except InputError as e:
        raise InputError(f"{name}:1: {e}") from None
