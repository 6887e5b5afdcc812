"""Token usage, `--max-tokens` and the `--max-cost` budget, through the real CLI.

The fake server reports `prompt_tokens = len(json.dumps(messages)) // 4` and
`completion_tokens = 5`, so the expected numbers are computed from its request log.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from provider_support import MODEL, Endpoint, serve

from durable_agent.config.settings import ModelPrice
from durable_agent.loop import guard
from durable_agent.status import StopReason

SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "list_files", "arguments": {}}]},
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
    {"content": "All done."},
]
PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 2000.0}  # absurd, so cents add up fast


@pytest.fixture
def api(
    cli: Callable[..., Any], env: dict[str, str], workspace: Path, tmp_path: Path
) -> Iterator[Endpoint]:
    with serve(cli, env, workspace, tmp_path, SCRIPT) as endpoint:
        yield endpoint


def reported_prompt_tokens(request: dict[str, Any]) -> int:
    return len(json.dumps(request["body"]["messages"])) // 4


def test_usage_of_each_response_is_recorded_on_its_step_and_summed_on_the_run(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    result = api.start("--json")
    assert result.code == 0, result.stderr
    expected = [(r["turn"], reported_prompt_tokens(r), 5) for r in api.server.requests]
    assert len(expected) == len(SCRIPT)
    steps = sql(
        "SELECT turn, prompt_tokens, completion_tokens FROM steps "
        "WHERE kind = 'model' ORDER BY turn"
    )
    assert [tuple(s) for s in steps] == expected
    prompt, completion = sum(p for _, p, _ in expected), 5 * len(SCRIPT)
    assert sql("SELECT prompt_tokens, completion_tokens FROM runs") == [(prompt, completion)]
    out = result.json()
    assert (out["prompt_tokens"], out["completion_tokens"]) == (prompt, completion)
    # Tool steps are not model calls: no tokens on them.
    assert sql("SELECT count(*) FROM steps WHERE kind = 'tool' AND prompt_tokens > 0") == [(0,)]


@pytest.mark.slow
def test_max_tokens_stops_before_the_next_call_and_resume_can_raise_it(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    first = api.start("--json", "--max-tokens", "50")
    assert first.code == 3, first.stderr
    out = first.json()
    assert (out["status"], out["stop_reason"], out["steps"]) == ("budget_exceeded", "max_tokens", 1)
    assert [r["turn"] for r in api.server.requests] == [0]  # the second call was never made
    used = out["prompt_tokens"] + out["completion_tokens"]
    assert used >= 50
    assert sql("SELECT error FROM runs") == [(f"used {used} tokens of max_tokens=50",)]

    second = api.resume(out["run_id"], "--json", "--max-tokens", "100000")
    assert second.code == 0, second.stderr
    assert [r["turn"] for r in api.server.requests] == [0, 1, 2]  # turn 0 was not paid twice


@pytest.mark.slow
def test_max_cost_stops_as_budget_exceeded_max_tokens_with_a_cost_message(
    api: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api.configure(prices={MODEL: PRICE})
    first = api.start("--json", "--max-cost", "0.05")
    assert first.code == 3, first.stderr
    out = first.json()
    assert (out["status"], out["stop_reason"], out["steps"]) == ("budget_exceeded", "max_tokens", 1)
    spent = (out["prompt_tokens"] * 1000.0 + out["completion_tokens"] * 2000.0) / 1e6
    assert spent >= 0.05
    assert sql("SELECT error FROM runs") == [(f"cost budget: spent {spent:.4f} of max_cost=0.05",)]
    assert len(api.server.requests) == 1

    second = api.resume(out["run_id"], "--json", "--max-cost", "100")
    assert second.code == 0, second.stderr
    assert second.json()["status"] == "completed"
    assert [r["turn"] for r in api.server.requests] == [0, 1, 2]
    # The raised budget is recorded on the run, like the other budgets.
    recorded = sql("SELECT json_extract(settings, '$.max_cost') FROM runs")
    assert recorded == [(100.0,)]
    # `show` prints what the run cost at the recorded price.
    total = second.json()
    cost = (total["prompt_tokens"] * 1000.0 + total["completion_tokens"] * 2000.0) / 1e6
    shown = api.cli("show", out["run_id"])
    assert f"cost {cost:.4f}" in shown.stdout


def test_max_cost_without_a_price_for_the_model_is_a_configuration_error(api: Endpoint) -> None:
    result = api.start("--max-cost", "1")
    assert result.code == 2
    assert f'prices."{MODEL}"' in result.stderr
    # pydantic's framing stays out of the one line (issue 17: the words say what is wrong)
    assert (
        "Value error" not in result.stderr and "invalid settings: --max-cost needs" in result.stderr
    ), result.stderr
    assert api.server.requests == []


def test_cost_is_computed_per_million_tokens() -> None:
    price = ModelPrice(input_per_mtok=0.4, output_per_mtok=1.6)
    assert price.cost(1_000_000, 0) == pytest.approx(0.4)
    assert price.cost(250_000, 500_000) == pytest.approx(0.1 + 0.8)


@pytest.mark.parametrize(
    ("max_cost", "spent", "stops"),
    [
        (None, 99.0, False),  # no budget
        (1.0, None, False),  # no price: nothing to compare
        (1.0, 0.999, False),
        (1.0, 1.0, True),  # reached: the next call would exceed it
    ],
)
def test_cost_budget_decision(max_cost: float | None, spent: float | None, stops: bool) -> None:
    decision = guard.before_model_cost(max_cost, spent)
    assert (decision is not None) == stops
    if decision is not None:
        assert decision[0] is StopReason.MAX_TOKENS and "cost" in decision[1]
