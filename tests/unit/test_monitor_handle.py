"""The monitor's protocol logic, driven without sockets."""

import msgpack

from dyper.agent import protocol
from dyper.monitor.server import Monitor
from tests.factories import HELLO, make_report

ID = b"h:1:x"


def decode_all(replies):
    return [protocol.decode(data) for _, data in replies]


def test_hello_report_and_ctl():
    m = Monitor("tcp://127.0.0.1:0")
    assert m.handle(ID, protocol.encode(protocol.HELLO, HELLO)) == []
    # DYMON answers every report with the agent's timings
    (timings,) = decode_all(m.handle(ID, protocol.encode(protocol.REPORT, make_report([(7, 3, [1, 0])]))))
    assert timings[0] == protocol.CONFIGURE and timings[1]["plan"]["sample_delay_s"] > 0
    (reply,) = decode_all(m.handle(b"cli", protocol.encode(protocol.CTL, {"id": 5, "op": "sessions"})))
    assert reply[0] == protocol.CTL_REPLY and reply[1]["id"] == 5
    assert reply[1]["result"][0]["pid"] == 1 and reply[1]["result"][0]["samples"] == 3
    (reply,) = decode_all(m.handle(b"cli", protocol.encode(protocol.CTL, {"id": 6, "op": "top", "args": {"pid": 1}})))
    assert reply[1]["result"]["functions"][0]["name"] == "f"
    (reply,) = decode_all(m.handle(b"cli", protocol.encode(protocol.CTL, {"id": 7, "op": "top", "args": {"pid": 9}})))
    assert reply[1]["ok"] is False and "not known" in reply[1]["error"]


def test_report_from_unknown_agent_is_stashed_and_resync_requested():
    m = Monitor("tcp://127.0.0.1:0")
    first = make_report([(7, 3, [1, 0])], with_tables=False)
    (resync,) = decode_all(m.handle(ID, protocol.encode(protocol.REPORT, first)))
    assert resync[0] == protocol.RESYNC
    # a second one within the resync interval is stashed without another request
    assert m.handle(ID, protocol.encode(protocol.REPORT, dict(first, seq=1))) == []
    # the agent answers with hello and a report carrying its full tables
    m.handle(ID, protocol.encode(protocol.HELLO, HELLO))
    m.handle(ID, protocol.encode(protocol.REPORT, make_report([(7, 1, [2, 0])], seq=2)))
    session = m.session_for(1)
    assert session is not None and session.samples == 3 + 3 + 1  # nothing received was lost


def test_garbage_is_counted_and_dropped():
    m = Monitor("tcp://127.0.0.1:0")
    for junk in (b"", b"\x00\x01", msgpack.packb(["dyper", 1, "report", {"agent": 3}]), b"x" * 1000):
        assert m.handle(ID, junk) == []
    assert m.counters["bad_frames"] == 4
    m.handle(ID, protocol.encode(protocol.HELLO, HELLO))
    m.handle(ID, protocol.encode(protocol.REPORT, make_report([(7, 3, [1, 0])])))
    assert m.session_for(1).samples == 3


def test_bye_marks_session_disconnected_and_detach_targets_connected_agents():
    m = Monitor("tcp://127.0.0.1:0")
    m.handle(ID, protocol.encode(protocol.HELLO, HELLO))
    assert m.session_for(1).connected
    m.handle(ID, protocol.encode(protocol.BYE, {"agent": "h:1:x", "reason": "detach"}))
    assert not m.session_for(1).connected
    assert m.send_to_pid(1, protocol.DETACH, {}) == 0


def test_the_search_asks_for_detailing_through_ctl_and_the_agent_gets_a_request():
    m = Monitor("tcp://127.0.0.1:0")
    m.handle(ID, protocol.encode(protocol.HELLO, HELLO))
    cpu = {"ovhd_ms": 1.0, "slow": 1.0, "itvl_ms": 100.0, "prty": 0.5, "allows": []}
    report = dict(make_report([(7, 3, [1, 0])]), proflets={"cpu": cpu})
    m.handle(ID, protocol.encode(protocol.REPORT, report))
    ask = {"id": 9, "op": "detail", "args": {"pid": 1, "proflet": "cpu"}}
    (reply,) = decode_all(m.handle(b"cli", protocol.encode(protocol.CTL, ask)))
    assert reply[1]["result"] == {"asked": 1}
    # On the agent's next report the request leaves the queue as a detail message.
    replies = decode_all(m.handle(ID, protocol.encode(protocol.REPORT, dict(report, seq=1, strings=[], locs=[]))))
    assert (protocol.DETAIL, {"proflet": "cpu", "first": True}) in replies
    # A proflet the agent does not run is not asked for.
    ask = {"id": 10, "op": "detail", "args": {"pid": 1, "proflet": "heap"}}
    (reply,) = decode_all(m.handle(b"cli", protocol.encode(protocol.CTL, ask)))
    assert reply[1]["result"] == {"asked": 0}
