"""Answers that are not answers (issue 17): cut off, empty, without usage, reasoning blocks.

The real CLI and the real openai client against tests/fake_openai.py. A cut-off answer
is continued, an empty one nudged once and a second one in a row fails the run
(`empty_answer`); each nudge is written with the model step's outcome, so a resume
neither buys the answer again nor nudges twice. A response without `usage` gets an
estimate (marked on the step) and the token budget still stops the run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from provider_support import Endpoint, serve

from durable_agent.loop.model_step import CUT_NUDGE, EMPTY_NUDGE
from durable_agent.models.text_protocol import parse_tool_calls

SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
    {"content": "All done."},
    {"content": "Really done."},
    {"content": "Done at last."},
]
EMPTY_SHAPES: list[dict[str, Any]] = [
    {"role": "assistant", "content": None},
    {"role": "assistant", "content": ""},
    {"role": "assistant", "content": None, "tool_calls": []},
    {"role": "assistant", "content": None, "reasoning": "I should think about this."},
    {"role": "assistant", "content": "<think>\nThe file says hello.\n</think>\n"},
]


@pytest.fixture
def api(
    cli: Callable[..., Any], env: dict[str, str], workspace: Path, tmp_path: Path
) -> Iterator[Endpoint]:
    with serve(cli, env, workspace, tmp_path, SCRIPT) as endpoint:
        yield endpoint


def model_outputs(sql: Callable[..., list[Any]]) -> list[dict[str, Any]]:
    rows = sql("SELECT output FROM steps WHERE kind = 'model' ORDER BY seq")
    return [r[0] if isinstance(r[0], dict) else json.loads(r[0]) for r in rows]


def user_texts(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["body"]["messages"] if m["role"] == "user"]


def test_a_cut_off_answer_is_continued_not_accepted(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.server.add_faults([{"turn": 1, "finish_reason": "length"}])
    result = api.start("--json")
    assert result.code == 0, result.stderr
    out = result.json()
    # Not the cut turn 1 alone: the model went on where it stopped, the answer is both parts.
    assert (out["status"], out["answer"]) == ("completed", "All done.Really done.")
    assert [r["turn"] for r in api.server.requests] == [0, 1, 2]
    assert user_texts(api.server.requests[2])[-1] == CUT_NUDGE  # the model was told
    cut = model_outputs(sql)[1]
    assert cut["finish_reason"] == "length"
    assert cut["nudge"] == {"reason": "length", "message": CUT_NUDGE}


def test_an_answer_cut_twice_is_joined_across_a_resume(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.server.add_faults(
        [{"turn": 1, "finish_reason": "length"}, {"turn": 2, "finish_reason": "length"}]
    )
    first = api.start("--json", "--max-steps", "3")  # stops right after the second cut
    assert first.json()["stop_reason"] == "max_steps", first.stderr
    assert first.json()["answer"] is None  # a cut-off answer is no answer
    again = api.resume(first.json()["run_id"], "--json", "--max-steps", "5")
    assert again.code == 0, again.stderr
    assert again.json()["answer"] == "All done.Really done.Done at last."
    assert sql("SELECT answer FROM runs") == [("All done.Really done.Done at last.",)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape",
    EMPTY_SHAPES,
    ids=["null", "empty", "empty-tool-calls", "reasoning-only", "think-block-only"],
)
def test_an_empty_answer_is_nudged_once(
    api: Endpoint, sql: Callable[..., list[Any]], shape: dict[str, Any]
) -> None:
    api.server.add_faults([{"turn": 1, "message": shape}])
    result = api.start("--json")
    assert result.code == 0, result.stderr
    assert result.json()["answer"] == "Really done."
    assert user_texts(api.server.requests[2]).count(EMPTY_NUDGE) == 1
    assert model_outputs(sql)[1]["nudge"]["reason"] == "empty_answer"


def test_two_empty_answers_in_a_row_fail_the_run(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.server.add_faults(
        [{"turn": 1, "message": EMPTY_SHAPES[0]}, {"turn": 2, "message": EMPTY_SHAPES[1]}]
    )
    result = api.start("--json")
    assert result.code == 1, result.stderr
    out = result.json()
    assert (out["status"], out["stop_reason"]) == ("failed", "empty_answer")
    assert [r["turn"] for r in api.server.requests] == [0, 1, 2]
    (error,) = sql("SELECT error FROM runs")
    assert "nothing twice in a row" in error[0]
    # The stop leaves a resumable run: a resume nudges once more (nothing is bought again,
    # the empty answer is not taken as a finish) and the model goes on.
    again = api.resume(out["run_id"], "--json")
    assert again.code == 0, again.stderr
    assert again.json()["answer"] == "Done at last."
    assert [r["turn"] for r in api.server.requests] == [0, 1, 2, 3]
    assert user_texts(api.server.requests[3]).count(EMPTY_NUDGE) == 2
    assert sql(
        "SELECT count(*) FROM messages WHERE role = 'user' AND content = ?", EMPTY_NUDGE
    ) == [(2,)]


def test_the_nudge_is_durable_a_resume_neither_re_pays_nor_re_nudges(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # Turn 1 is empty (nudged); turn 2 fails permanently, so the run stops right after the nudge.
    api.server.add_faults([{"turn": 1, "message": EMPTY_SHAPES[0]}, {"turn": 2, "status": 400}])
    first = api.start("--json")
    assert first.json()["stop_reason"] == "model_error", first.stderr
    assert sql(
        "SELECT count(*) FROM messages WHERE role = 'user' AND content = ?", EMPTY_NUDGE
    ) == [(1,)]
    second = api.resume(first.json()["run_id"], "--json")
    assert second.code == 0, second.stderr
    assert [r["turn"] for r in api.server.requests] == [
        0,
        1,
        2,
        2,
    ]  # turns 0 and 1 not bought again
    assert (
        api.server.requests[-1]["body"]["messages"] == api.server.requests[-2]["body"]["messages"]
    )
    assert user_texts(api.server.requests[-1]).count(EMPTY_NUDGE) == 1
    assert sql(
        "SELECT count(*) FROM messages WHERE role = 'user' AND content = ?", EMPTY_NUDGE
    ) == [(1,)]


def test_without_usage_tokens_are_estimated_marked_and_budgeted(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.server.add_faults([{"no_usage": True, "times": 10}])
    result = api.start("--json", "--max-tokens", "60")
    assert result.code == 3, result.stderr
    out = result.json()
    assert (out["status"], out["stop_reason"]) == ("budget_exceeded", "max_tokens")
    assert out["prompt_tokens"] + out["completion_tokens"] >= 60
    usage = model_outputs(sql)[0]["usage"]
    assert (
        usage["estimated"] is True and usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    )
    assert sql("SELECT prompt_tokens, completion_tokens FROM steps WHERE kind = 'model'") == [
        (usage["prompt_tokens"], usage["completion_tokens"])
    ]


@pytest.mark.parametrize(
    "usage",
    [
        {
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "total_tokens": 0,
        },  # a placeholder: nothing is free
        {"total_tokens": 12},  # no counts of its parts
        None,
    ],
)
def test_usage_that_counts_nothing_is_estimated_and_budgeted(
    api: Endpoint, sql: Callable[..., list[Any]], usage: dict[str, Any] | None
) -> None:
    api.server.add_faults([{"usage": usage, "times": 10}])
    result = api.start("--json", "--max-tokens", "60")
    assert result.code == 3, result.stderr
    assert result.json()["stop_reason"] == "max_tokens"
    assert model_outputs(sql)[0]["usage"]["estimated"] is True


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 3_000_000_000, "completion_tokens": 5},
        {"prompt_tokens": 2**63, "completion_tokens": 5},
        {"prompt_tokens": 20, "completion_tokens": -5},
    ],
    ids=["past-32-bits", "past-64-bits", "negative"],
)
def test_a_count_that_is_no_count_is_estimated_and_the_answer_recorded_once(
    api: Endpoint, store_url: str, usage: dict[str, Any]
) -> None:
    # The store refused the step's row (PostgreSQL: integer out of range, the run left
    # `running`; SQLite: OverflowError, the run failed as a tool error) and every resume
    # paid for the same call again.
    api.server.add_faults([{"usage": usage, "times": 10}])
    result = api.start("--db", store_url, "--json")
    assert result.code == 0, result.stderr
    out = result.json()
    assert out["status"] == "completed" and 0 < out["prompt_tokens"] < 100_000
    assert [r["turn"] for r in api.server.requests] == list(
        range(len(api.server.requests))
    )  # each paid once


def test_a_finish_reason_that_is_not_a_word_is_not_stored(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # A provider echoing text (here the key it was sent) in finish_reason: stored verbatim.
    from provider_support import KEY

    api.server.add_faults(
        [{"turn": 0, "finish_reason": KEY}, {"turn": 1, "finish_reason": "tool_calls"}]
    )
    assert api.start("--json").code == 0
    outputs = model_outputs(sql)
    assert "finish_reason" not in outputs[0] and outputs[1]["finish_reason"] == "tool_calls"
    assert not sql("SELECT count(*) FROM steps WHERE output LIKE ?", f"%{KEY}%")[0][0]


def test_reported_usage_is_not_marked_estimated(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    assert api.start("--json").code == 0
    assert all("estimated" not in o["usage"] for o in model_outputs(sql))


@pytest.mark.parametrize("block", ["think", "reasoning", "THINK"])
def test_a_tool_call_inside_a_reasoning_block_is_not_a_call(block: str) -> None:
    text = (
        f'<{block}>\nmaybe:\nTOOL_CALL {{"name": "run_shell", "input": {{"command": "rm -rf x"}}}}\n'
        f'</{block}>\nTOOL_CALL {{"name": "read_file", "input": {{"path": "a.txt"}}}}'
    )
    calls = parse_tool_calls(text, 3)
    assert [c.name for c in calls] == ["read_file"]
    unclosed = '<think>\nTOOL_CALL {"name": "run_shell", "input": {"command": "rm -rf x"}}'
    assert parse_tool_calls(unclosed, 0) == ()


def test_text_protocol_does_not_run_a_call_from_a_think_block(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    (api.workspace / "victim.txt").write_text("keep me\n")
    thinking = (
        '<think>\nTOOL_CALL {"name": "write_file", "input": {"path": "victim.txt", '
        '"content": "gone"}}\n</think>\nThe file is fine.'
    )
    api.server.add_faults([{"turn": 0, "message": {"role": "assistant", "content": thinking}}])
    result = api.start("--json", "--tool-protocol", "text")
    assert result.code == 0, result.stderr
    assert result.json()["tool_calls"] == 0
    assert (api.workspace / "victim.txt").read_text() == "keep me\n"


def test_the_timeline_and_show_say_which_answers_were_not_final_and_which_counts_are_estimated(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.server.add_faults(
        [
            {"turn": 0, "no_usage": True},
            {"turn": 1, "finish_reason": "length"},
            {"turn": 2, "message": EMPTY_SHAPES[0]},
        ]
    )
    result = api.start()
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == "Done at last."
    lines = result.stderr.splitlines()

    def line(prefix: str) -> str:
        (found,) = [x for x in lines if x.startswith(prefix)]
        return found

    first = line("Step 0 · model call 1 · fake-model → read_file · ")
    assert first.endswith(" tokens (estimated: no usage reported)") and " · ~" in first
    assert line("Step 2 · model call 2 · ").startswith(
        "Step 2 · model call 2 · fake-model → cut off at the length limit, told to continue: All done. · "
    )
    assert line("Step 3 · model call 3 · ").startswith(
        "Step 3 · model call 3 · fake-model → (empty answer, told to answer) · "
    )
    assert "~" not in line("Step 4 · model call 4 · ")  # reported usage is shown as it came
    assert "(partly estimated: the endpoint reported no usage)" in line(
        "4 model calls · 5 steps · "
    )

    ((run_id,),) = sql("SELECT id FROM runs")
    shown = api.cli("show", run_id).stdout
    rows = {r.split()[0]: r for r in shown.splitlines() if r[:4].strip().isdigit()}
    assert " ~" in rows["0"] and "model call 1 → read_file" in rows["0"]
    assert rows["2"].endswith(
        "model call 2 → cut off at the length limit, told to continue: All done."
    )
    assert rows["3"].endswith("model call 3 → empty answer, told to answer")
    assert rows["4"].endswith("model call 4 → answer: Done at last.") and "~" not in rows["4"]
    assert "tokens (partly estimated: the endpoint reported no usage)" in shown


def test_answers_that_are_only_thinking_fail_the_run_and_a_resume_does_not_take_them(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    thinking = EMPTY_SHAPES[-1]
    api.server.add_faults([{"turn": 1, "message": thinking}, {"turn": 2, "message": thinking}])
    first = api.start("--json")
    assert first.code == 1, first.stderr
    assert (first.json()["status"], first.json()["stop_reason"]) == ("failed", "empty_answer")
    # The recorded history ends with the thinking: a resume nudges, it does not finish with it.
    again = api.resume(first.json()["run_id"], "--json")
    assert again.code == 0, again.stderr
    assert again.json()["answer"] == "Done at last."
    assert user_texts(api.server.requests[-1]).count(EMPTY_NUDGE) == 2
