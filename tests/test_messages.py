"""The request hash: the same history gives the same digest; any change anywhere changes it."""

from __future__ import annotations

import pytest

from durable_agent.messages import MAX_ARGUMENT_DEPTH, HistoryHash, Message, ToolCall


def digest(*messages: Message) -> str:
    h = HistoryHash()
    for m in messages:
        h.add(m)
    return h.digest


def test_same_history_same_digest_and_every_field_counts() -> None:
    call = ToolCall("call_0_0", "read_file", '{"path": "a"}')
    base = [
        Message("system", "s"),
        Message("user", "t"),
        Message("assistant", None, (call,)),
        Message("tool", "x", tool_call_id="call_0_0"),
    ]
    assert digest(*base) == digest(*base)
    variants = [
        [Message("system", "s!"), *base[1:]],
        [*base[:2], Message("assistant", "", (call,)), base[3]],  # None is not ""
        [
            *base[:2],
            Message("assistant", None, (ToolCall("call_0_0", "read_file", '{"path": "b"}'),)),
            base[3],
        ],
        [*base[:3], Message("tool", "x", tool_call_id="call_0_1")],
        base[:3],
    ]
    assert len({digest(*v) for v in variants} | {digest(*base)}) == len(variants) + 1


def test_boundaries_between_messages_are_unambiguous() -> None:
    assert digest(Message("user", "ab"), Message("user", "c")) != digest(
        Message("user", "a"), Message("user", "bc")
    )


def test_arguments_nested_past_the_limit_are_refused_where_they_come_in() -> None:
    # Stored as parsed values, arguments nested ~800 deep made show, export, resume and the
    # run's own summary recurse past Python's limit; ~1,000 deep failed the parse itself.
    def nested(depth: int) -> str:
        return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"

    assert ToolCall("c", "t", nested(MAX_ARGUMENT_DEPTH)).parsed_arguments()  # at the limit: fine
    for depth in (MAX_ARGUMENT_DEPTH + 1, 800, 100_000):
        call = ToolCall("c", "t", nested(depth))
        with pytest.raises(ValueError, match="nest more than 100 levels deep"):
            call.parsed_arguments()
        assert call.arguments_or_text() == call.arguments  # recorded as the text it came as
    with pytest.raises(ValueError, match="not null"):
        ToolCall("c", "t", "null").parsed_arguments()
