"""The request hash: the same history gives the same digest; any change anywhere changes it."""

from __future__ import annotations

from durable_agent.messages import HistoryHash, Message, ToolCall


def digest(*messages: Message) -> str:
    h = HistoryHash()
    for m in messages:
        h.add(m)
    return h.digest


def test_same_history_same_digest_and_every_field_counts() -> None:
    call = ToolCall("call_0_0", "read_file", '{"path": "a"}')
    base = [Message("system", "s"), Message("user", "t"), Message("assistant", None, (call,)),
            Message("tool", "x", tool_call_id="call_0_0")]
    assert digest(*base) == digest(*base)
    variants = [
        [Message("system", "s!"), *base[1:]],
        [*base[:2], Message("assistant", "", (call,)), base[3]],  # None is not ""
        [*base[:2], Message("assistant", None, (ToolCall("call_0_0", "read_file", '{"path": "b"}'),)), base[3]],
        [*base[:3], Message("tool", "x", tool_call_id="call_0_1")],
        base[:3],
    ]
    assert len({digest(*v) for v in variants} | {digest(*base)}) == len(variants) + 1


def test_boundaries_between_messages_are_unambiguous() -> None:
    assert digest(Message("user", "ab"), Message("user", "c")) != digest(Message("user", "a"), Message("user", "bc"))
