"""Hosts held in a session (SessionMirror.watch_for / follow_alerts, `vtap --sessions F
--alerts EVE --alert-session NAME`): a held host's frames, both ways, go to the named
session's target whole, past its cutoff, ahead of the file's rules, which keep their own
counts; the first copy of each hold is stamped; a hold that ends takes the host away."""

import re

import pytest
from helpers import Tool
from test_vtap_alerts import alert_then_copies, copied, until
from test_vtap_sessions import tc_entries, vtap

from ebpf import InputError
from ebpf.vtap.sessions.config import Rule, Session
from ebpf.vtap.sessions.tc_sessions import SessionMirror

PAYLOAD = 128 - 42  # the Flow's frames: 128 bytes, UDP


def ids_session(tb, cutoff=PAYLOAD * 10):
    """One session to the monitor whose only rule matches none of the tests' frames."""
    return Session(
        target=tb.monitor_iface, name="ids", cutoff=cutoff, rules=[Rule("accept", protocol="udp", destination_ports=7)]
    )


def test_a_held_host_goes_whole_into_its_session_and_leaves_with_its_hold(tb1):
    with SessionMirror([ids_session(tb1)], netns=tb1.ns(tb1.tap_host)) as tap:
        tap.attach(tb1.tap_iface, "ingress")
        with pytest.raises(InputError, match="no session takes held hosts"):
            tap.watch_for(tb1.src4, 5)
        with pytest.raises(InputError, match=r"no session 'nope' to hold hosts in \(sessions: ids\)"):
            tap.set_alert_session("nope")
        assert copied(tb1, tb1.src4) == 0  # the file's rule takes none of it
        tap.watch_for(tb1.src4, 4.0, session="ids")
        # all 50, past the session's cutoff of ten datagrams: the held host's rules are whole
        assert copied(tb1, tb1.src4) == 50 and copied(tb1, tb1.alt_src4) == 0
        assert until(lambda: tap.alert_counters()["alert_first_copies"] == 1)
        # the file's rule keeps its place and its count; the held rules are not the file's
        assert tap.rule_counters() == {("ids", 1, "accept udp to any port 7"): 0}
        assert tap.session_counters()["ids"]["sent"] == 50
        assert until(lambda: tap.held() == [], seconds=10)
        assert copied(tb1, tb1.src4) == 0
        # held again: a new hold, not yet copied (the last hold's stamp is not its)
        tap.watch_for(tb1.src4, 30.0)
        assert tap.first_match_ns(tb1.src4) == 0
        assert copied(tb1, tb1.src4) == 50
        assert until(lambda: tap.alert_counters()["alert_first_copies"] == 2)
        c = tap.alert_counters()
    assert (c["alert_added"], c["alert_expired"], c["alert_hosts"]) == (2, 1, 1)


def sessions_file(path, tb):
    path.write_text(
        f'[[session]]\nname = "ids"\ntarget = "{tb.monitor_iface}"\ncutoff = {PAYLOAD * 10}\n'
        '  [[session.rule]]\n  action = "accept"\n  protocol = "udp"\n  destination_ports = "7"\n'
    )
    return path


def test_vtap_sessions_with_alerts_on_the_command_line(tb1, tmp_path):
    """`vtap --sessions F --alerts EVE --alert-session ids`: nothing copied until the alert,
    then all of its source's frames to the session's target; the counters in the JSON."""
    eve = tmp_path / "eve.json"
    eve.touch()
    f = sessions_file(tmp_path / "s.toml", tb1)
    tool = Tool(
        tb1.ns(tb1.tap_host),
        "vtap",
        "--sessions",
        str(f),
        "--iface",
        tb1.tap_iface,
        "--alerts",
        str(eve),
        "--alert-session",
        "ids",
        "--alert-watch",
        "src",
        interval=0.3,
    )
    assert tool.attached["alerts"]["session"] == "ids"
    final = alert_then_copies(tool, tb1, eve)
    assert final["sent"] == 50  # all of them, past the session's cutoff of ten


@pytest.mark.parametrize(
    "extra, status, says",
    [
        (["--alert-session", "nope"], 2, r"no session 'nope' to hold hosts in \(sessions: ids\)"),
        ([], 2, r"--alerts with --sessions needs --alert-session NAME"),
    ],
)
def test_alerts_into_a_session_bad_input_is_one_line_and_attaches_nothing(tb1, tmp_path, extra, status, says):
    f = sessions_file(tmp_path / "s.toml", tb1)
    ns = tb1.ns(tb1.tap_host)
    r = vtap(ns, "--sessions", str(f), "--iface", tb1.tap_iface, "--alerts", str(tmp_path / "eve.json"), *extra)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == status and len(lines) == 1, r.stderr
    assert re.search(says, lines[0]), lines[0]
    assert tc_entries(ns, tb1.tap_iface) == []


def test_alert_session_without_sessions_is_a_usage_error(tb1, tmp_path):
    r = vtap(
        tb1.ns(tb1.tap_host), "--monitor", tb1.monitor_iface, "--alerts", str(tmp_path / "e"), "--alert-session", "x"
    )
    assert r.returncode == 2 and "--alert-session goes with --sessions" in r.stderr


def test_held_hosts_take_two_rules_each_and_a_host_with_no_room_is_counted(tb1, capfd):
    """The program takes 256 rules in all: beside a file of 252, two hosts fit and two do
    not (counted, said once); a file edit that would not fit with the hosts held is refused
    whole, the sessions in force kept."""
    rules = [Rule("accept", protocol="udp", destination_ports=1000 + i) for i in range(252)]
    ids = Session(target=tb1.monitor_iface, name="ids", rules=rules)
    with SessionMirror([ids], netns=tb1.ns(tb1.tap_host)) as tap:
        for i in range(1, 5):
            tap.watch_for(f"198.18.9.{i}", 30, session="ids")
        tap.load_program()  # the held hosts go in with the file's rules: 256
        c = tap.alert_counters()
        assert (c["alert_hosts"], c["alert_no_room"]) == (2, 2)
        assert [str(n) for n in tap.held()] == ["198.18.9.1/32", "198.18.9.2/32"]
        assert len(tap.rule_counters()) == 252
        more = Session(target=tb1.monitor_iface, name="ids", rules=[*rules, Rule("reject")])
        with pytest.raises(
            InputError, match=r"257 rules with the 2 held hosts' \(two each\): the program takes at most 256"
        ):
            tap.set_sessions([more])
        assert len(tap.sessions[0].rules) == 252
    err = capfd.readouterr().err
    assert err.count("no room for") == 1 and "256 rules in all, two a held host" in err
