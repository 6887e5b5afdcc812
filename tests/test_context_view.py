"""The request a compacted run sends (context_view.py, context_budget.py), without a server."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_agent.config.settings import Settings
from durable_agent.context.budget import DEFAULT_WINDOW, calibrate, context_window, request_budget
from durable_agent.context.view import HEAD, ContextView, stub_text
from durable_agent.loop.replay import rebuild
from durable_agent.messages import Message, ToolCall


def history(calls_per_turn: list[int]) -> list[Message]:
    out = [Message("system", "sys"), Message("user", "task")]
    for t, n in enumerate(calls_per_turn):
        calls = tuple(
            ToolCall(f"call_{t}_{i}", "read_file", f'{{"path": "f{t}_{i}"}}') for i in range(n)
        )
        out.append(Message("assistant", None if n else "thinking", tool_calls=calls))
        out += [Message("tool", f"content {c.id}" * 50, tool_call_id=c.id) for c in calls]
    return out


def test_windows_come_from_the_config_then_the_table_then_the_default() -> None:
    s = Settings(model="gpt-4.1-mini", models={"gpt-4.1-mini": {"context_window": 5000}})
    assert context_window(s) == 5000
    assert context_window(Settings(model="openrouter/gpt-4o-mini")) == 128_000
    assert context_window(Settings(model="gpt-4.1-nano")) == 1_047_576  # not gpt-4's 8k
    assert context_window(Settings(model="my-local-model")) == DEFAULT_WINDOW
    assert request_budget(Settings(model="gpt-4o", max_context_tokens=20_000)) == 20_000


def test_calibration_follows_the_provider_within_bounds() -> None:
    assert calibrate(1000, 1200) == 1.2
    assert calibrate(1000, None) == 1.0
    assert calibrate(1000, 10**9) == 4.0 and calibrate(1000, 1) == 0.5


def test_a_stub_names_the_tool_the_size_and_read_output() -> None:
    assert stub_text("call_12", "read_file", "x" * 6144) == (
        '[output of read_file call_12 elided: 6,144 bytes; call read_output("call_12") to see it again]'
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=12), st.data())
def test_a_tool_call_and_its_results_are_never_split(
    calls_per_turn: list[int], data: st.DataObject
) -> None:
    messages = history(calls_per_turn)
    assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
    cut = data.draw(st.sampled_from(assistants))
    tools = [i for i, m in enumerate(messages) if m.role == "tool" and i >= cut]
    elided = data.draw(st.lists(st.sampled_from(tools), unique=True)) if tools else []
    state = rebuild(
        "r",
        messages,
        active_ms=0,
        model_tokens=(0, 0),
        compactions=[
            {"stage": "elide", "turn": 1, "elided": elided},
            {"stage": "summarize", "turn": 2, "start": cut, "summary": "S"},
        ],
    )
    request = state.request()
    assert request[:HEAD] == messages[:HEAD]
    called = [c.id for m in request if m.role == "assistant" for c in m.tool_calls]
    answered = [m.tool_call_id for m in request if m.role == "tool"]
    assert called == answered  # each call answered, in order; no orphan result
    assert len(request) == HEAD + 1 + len(messages) - cut  # the summary, then verbatim from the cut
    # Replay is the live state: the same boundary applied as it came gives the same request.
    live = ContextView()
    live.apply({"elided": elided}, messages)
    live.apply({"start": cut, "summary": "S"}, messages)
    assert live.request(messages) == request


def test_openai_models_are_counted_with_tiktoken_when_it_is_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    from durable_agent.context import budget as context_budget

    class Encoding:
        def encode(self, text: str, disallowed_special: tuple[str, ...] = ()) -> list[int]:
            return [0] * len(text.split())  # one token per word: unlike the estimate

    fake = types.ModuleType("tiktoken")
    fake.encoding_for_model = lambda name: Encoding()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    monkeypatch.setattr(context_budget, "_COUNTERS", {})
    text = "a few words of text " * 10
    assert context_budget.text_counter("gpt-4o-mini")(text) == 50
    assert (
        context_budget.text_counter("qwen2.5-coder")(text) == (len(text) + 3) // 4
    )  # the estimate
    fake.encoding_for_model = lambda name: (_ for _ in ()).throw(KeyError(name))  # type: ignore[attr-defined]
    assert context_budget.text_counter("gpt-unknown")(text) == (len(text) + 3) // 4
