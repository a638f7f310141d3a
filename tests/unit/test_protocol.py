import msgpack
import pytest

from dyper.agent import protocol
from dyper.agent.protocol import DecodeError, decode, encode, parse_budget


def report(**over):
    body = {
        "agent": "h:1:a",
        "seq": 0,
        "epoch": 0,
        "t": 1.0,
        "window_s": 1.0,
        "strings": [[0, "f.py"]],
        "locs": [[0, 0, 0, 1, 2, 0]],
        "stacks": [[7, 3, [0]]],
        "samples": 3,
    }
    body.update(over)
    return body


def test_round_trip_report():
    msg_type, body = decode(encode(protocol.REPORT, report()))
    assert msg_type == protocol.REPORT
    assert body["stacks"] == [[7, 3, [0]]]
    assert (
        decode(encode(protocol.REPORT, report(unit_costs={"sample": 1e-4, "report": 2e-3})))[1]["unit_costs"]["report"]
        == 2e-3
    )


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        b"garbage that is not msgpack at all \xff\xfe",
        msgpack.packb([1, 2, 3]),
        msgpack.packb(["dyper", 99, "report", {}]),  # unknown version
        msgpack.packb(["dyper", 1, "launch_missiles", {}]),  # unknown type
        msgpack.packb(["dyper", 1, "report", []]),  # body not a map
        msgpack.packb(["dyper", 1, "report", {"agent": "x"}]),  # missing fields
        encode(protocol.REPORT, report())[:-3],  # truncated
    ],
)
def test_malformed_frames_raise_decode_error(data):
    with pytest.raises(DecodeError):
        decode(data)


@pytest.mark.parametrize(
    "field, value",
    [
        ("seq", "zero"),
        ("stacks", [[1, 2]]),
        ("stacks", [[1, 2, ["x"]]]),
        ("locs", [[0, 0, 0, 1]]),
        ("strings", [[0, 5]]),
        ("samples", True),
        ("t", None),
        ("unit_costs", {"sample": "fast"}),
        ("unit_costs", [1e-4, 1e-3]),
    ],
)
def test_wrong_types_are_rejected(field, value):
    with pytest.raises(DecodeError):
        decode(encode(protocol.REPORT, report(**{field: value})))


#: Each message type's body, as the protocol module types it.
BODIES = {
    protocol.HELLO: protocol.Hello,
    protocol.REPORT: protocol.Report,
    protocol.BYE: protocol.Bye,
    protocol.ERROR: protocol.Error,
    protocol.CONFIGURE: protocol.Configure,
    protocol.DETAIL: protocol.Detail,
    protocol.DETACH: protocol.Detach,
    protocol.RESYNC: protocol.Resync,
    protocol.CTL: protocol.Ctl,
    protocol.CTL_REPLY: protocol.CtlReply,
}


def test_every_message_type_has_a_typed_body():
    assert set(BODIES) == set(protocol._SCHEMAS)


@pytest.mark.parametrize("msg_type", sorted(BODIES))
def test_typed_body_names_the_fields_its_schema_checks(msg_type):
    body, schema = BODIES[msg_type], protocol._SCHEMAS[msg_type]
    assert body.__required_keys__ == set(schema.required)
    assert body.__optional_keys__ == set(schema.optional)
    if msg_type == protocol.REPORT:
        raw = protocol._RAW_REPORT
        assert (set(raw.required), set(raw.optional)) == (set(schema.required), set(schema.optional))


#: A value no field of the nested parts takes.
_BAD = {"x": []}


@pytest.mark.parametrize("key", sorted(protocol.ProfletState.__optional_keys__))
def test_proflet_state_schema_checks_each_typed_field(key):
    assert not protocol.ProfletState.__required_keys__
    decode(encode(protocol.REPORT, report(proflets={"p": {}})))
    with pytest.raises(DecodeError):
        decode(encode(protocol.REPORT, report(proflets={"p": {key: _BAD}})))


@pytest.mark.parametrize("key", sorted(protocol.Plan.__optional_keys__))
def test_plan_schema_checks_each_typed_field(key):
    assert not protocol.Plan.__required_keys__
    decode(encode(protocol.CONFIGURE, {"plan": {}}))
    with pytest.raises(DecodeError):
        decode(encode(protocol.CONFIGURE, {"plan": {key: _BAD}}))


def test_trigger_event_schema_requires_each_typed_field():
    event = {"t": 1.0, "name": "n", "kind": "k", "why": "w", "before_s": 1.0, "after_s": 2.0, "budget": 0.1}
    assert protocol.TriggerEvent.__required_keys__ == set(event)
    decode(encode(protocol.REPORT, report(triggers=[event])))
    for key in event:
        with pytest.raises(DecodeError):
            decode(encode(protocol.REPORT, report(triggers=[{k: v for k, v in event.items() if k != key}])))


def test_receiver_restricts_types():
    data = encode(protocol.DETACH, {})
    assert decode(data, protocol.AGENT_ACCEPTS)[0] == protocol.DETACH
    with pytest.raises(DecodeError):
        decode(data, protocol.MONITOR_ACCEPTS)


def test_size_limit_on_both_sides():
    with pytest.raises(DecodeError):
        decode(b"\x00" * (protocol.MAX_FRAME_BYTES + 1))
    with pytest.raises(ValueError):
        encode(protocol.ERROR, {"agent": "a", "message": "x" * (protocol.MAX_FRAME_BYTES + 1)})


def test_claimed_huge_array_does_not_allocate():
    # A 5-byte frame claiming a 4-billion-element array is refused by msgpack's
    # length-derived limits instead of allocating.
    with pytest.raises(DecodeError):
        decode(b"\xdd\xff\xff\xff\xff")


@pytest.mark.parametrize("text, value", [("1%", 0.01), ("0.1%", 0.001), ("25%", 0.25), ("0.05", 0.05), (0.01, 0.01)])
def test_parse_budget(text, value):
    assert parse_budget(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["150%", "-1", "abc", "0", "0%", "nan", "51%"])
def test_parse_budget_rejects(text):
    with pytest.raises(ValueError) as info:
        parse_budget(text)
    assert "budget" in str(info.value) and "\n" not in str(info.value)
