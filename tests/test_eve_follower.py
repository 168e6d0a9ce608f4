"""ebpf.vtap.alerts.EveFollower: a Suricata EVE JSON file followed as Suricata and
logrotate write it (issue 35, part 2's input): from its end, whole lines only, through
rotation and truncation, malformed lines and other events counted, not taken."""

import json
import os

from ebpf.vtap.alerts import EveFollower


def alert(src, dst, sid=1):
    return (
        json.dumps(
            {
                "timestamp": "2026-11-27T12:00:00.000000+0000",
                "event_type": "alert",
                "src_ip": src,
                "dest_ip": dst,
                "alert": {"signature_id": sid, "signature": f"test {sid}"},
            }
        )
        + "\n"
    )


def pairs(alerts):
    return [(str(a.src), str(a.dst), a.sid) for a in alerts]


def test_it_starts_at_the_end_and_takes_whole_lines_only(tmp_path):
    eve = tmp_path / "eve.json"
    eve.write_text(alert("198.18.0.1", "198.18.0.2", 1))  # history: not taken
    f = EveFollower(str(eve))
    assert f.poll() == []
    with open(eve, "a") as w:
        w.write(alert("198.18.0.3", "198.18.0.4", 2))
        line = alert("2001:2::1", "2001:2::2", 3)
        w.write(line[:20])  # a half line: waits for its newline
        w.flush()
        assert pairs(f.poll()) == [("198.18.0.3", "198.18.0.4", 2)]
        w.write(line[20:])
    assert pairs(f.poll()) == [("2001:2::1", "2001:2::2", 3)]
    assert f.counters["alerts"] == 2 and f.counters["lines"] == 2


def test_malformed_lines_and_other_events_are_counted_and_skipped(tmp_path):
    eve = tmp_path / "eve.json"
    eve.write_text("")
    f = EveFollower(str(eve))
    with open(eve, "a") as w:
        w.write("not json\n[1, 2]\n" + json.dumps({"event_type": "flow"}) + "\n" + alert("198.18.0.5", "198.18.0.6"))
    assert pairs(f.poll()) == [("198.18.0.5", "198.18.0.6", 1)]
    assert (f.counters["malformed"], f.counters["events"], f.counters["alerts"]) == (2, 1, 1)


def test_rotation_reads_the_old_file_to_its_end_then_the_new_from_its_start(tmp_path):
    eve = tmp_path / "eve.json"
    eve.write_text("")
    f = EveFollower(str(eve))
    with open(eve, "a") as w:
        w.write(alert("198.18.0.1", "198.18.0.2", 1))
    os.rename(eve, tmp_path / "eve.json.1")  # logrotate's create: the writer still writes the old one...
    with open(tmp_path / "eve.json.1", "a") as w:
        w.write(alert("198.18.0.1", "198.18.0.2", 2))
    eve.write_text(alert("198.18.0.1", "198.18.0.2", 3))  # ...until it reopens the path
    assert [a.sid for a in f.poll()] == [1, 2, 3]
    assert f.counters["rotations"] == 1


def test_truncation_reads_again_from_the_start(tmp_path):
    eve = tmp_path / "eve.json"
    eve.write_text("")
    f = EveFollower(str(eve))
    with open(eve, "a") as w:
        w.write(alert("198.18.0.1", "198.18.0.2", 1) * 3)
    assert [a.sid for a in f.poll()] == [1, 1, 1]
    with open(eve, "r+") as w:  # copytruncate: the same file, emptied, then written on
        w.truncate(0)
    with open(eve, "a") as w:
        w.write(alert("198.18.0.1", "198.18.0.2", 4))
    assert [a.sid for a in f.poll()] == [4]
    assert f.counters["truncations"] == 1


def test_a_file_not_there_yet_is_read_from_its_start_once_it_appears(tmp_path):
    eve = tmp_path / "eve.json"
    f = EveFollower(str(eve))
    assert f.poll() == []
    eve.write_text(alert("198.18.0.7", "198.18.0.8", 9))
    assert [a.sid for a in f.poll()] == [9]


def _alert(src, dst):
    from ebpf.vtap.alerts import Alert, _addr  # noqa: PLC0415

    return Alert(_addr(src), _addr(dst), 1, "t", "", 0.0)


def test_holds_renew_expire_and_stop_at_the_cap():
    from ebpf.vtap.alerts import Holds  # noqa: PLC0415

    h = Holds(hold=10, cap=3)
    assert [str(a) for a in h.take(_alert("198.18.0.1", "198.18.0.2"), now=0)] == ["198.18.0.1", "198.18.0.2"]
    assert [str(a) for a in h.take(_alert("198.18.0.1", "2001:2::9"), now=5)] == ["2001:2::9"]  # .1 renewed
    assert h.take(_alert("198.18.0.3", "198.18.0.2"), now=6) == []  # .3 past the cap; .2 renewed
    assert h.counters == {"added": 3, "renewed": 2, "expired": 0, "capped": 1}
    assert [str(a) for a in h.expire(now=10)] == []  # .2 renewed at 6, .1 at 5: none ends at 10
    assert sorted(str(a) for a in h.expire(now=15)) == ["198.18.0.1", "2001:2::9"]
    assert [str(n) for n in h.networks()] == ["198.18.0.2/32"]
    assert [str(a) for a in h.expire(now=16)] == ["198.18.0.2"] and h.networks() == []


def test_holds_take_only_the_side_asked():
    from ebpf.vtap.alerts import Holds  # noqa: PLC0415

    assert [str(a) for a in Holds(which="src").take(_alert("198.18.0.1", "198.18.0.2"), now=0)] == ["198.18.0.1"]
    assert [str(a) for a in Holds(which="dst").take(_alert("198.18.0.1", "198.18.0.2"), now=0)] == ["198.18.0.2"]
