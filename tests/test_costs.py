"""Costs without a hand-written table: the shipped prices, cached prompt tokens read from
the provider (`usage.prompt_tokens_details.cached_tokens`) and stored per step, and the
run's cost, the sum of its steps', shown by `list`, `show` and the web view.

The fake server reports the usage each test scripts (faults `{"turn": t, "usage": ...}`),
cached tokens among them, so every figure below is computed from what it sent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from provider_support import FAST_RETRIES, KEY, toml_value

from durable_agent.config.prices import PRICES_AS_OF, SHIPPED, shipped_row
from durable_agent.config.settings import ModelPrice, Settings

SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "list_files", "arguments": {}}]},
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
    {"content": "All done."},
]
# What the server reports for each turn: (prompt, completion, cached or None: no details).
USAGE = [(12_000, 300, 8_000), (15_000, 200, 0), (16_000, 100, None)]


def _usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    usage["total_tokens"] = prompt + completion
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
    return usage


@pytest.fixture
def server(workspace: Path) -> Iterator[FakeOpenAI]:
    (workspace / "notes.txt").write_text("remember the milk\n")
    faults = [{"turn": t, "usage": _usage(*u)} for t, u in enumerate(USAGE)]
    with FakeOpenAI(script=SCRIPT, faults=faults) as fake:
        yield fake


def _run(
    cli: Callable[..., Any], server: FakeOpenAI, tmp_path: Path, model: str, **config: Any
) -> Any:
    path = tmp_path / "config.toml"
    lines = [f"{k} = {toml_value(v)}" for k, v in {**FAST_RETRIES, **config}.items()]
    path.write_text("\n".join(lines) + "\n")
    extra = {"OPENAI_API_KEY": KEY, "DURABLE_AGENT_CONFIG": str(path)}
    result = cli(
        "start", "fix it", "--base-url", server.url, "--model", model, "--json", extra_env=extra
    )
    assert result.code == 0, result.stderr
    return result


def test_cached_tokens_and_costs_are_stored_per_step_and_the_run_is_their_sum(
    cli: Callable[..., Any], server: FakeOpenAI, tmp_path: Path, sql: Callable[..., list[Any]]
) -> None:
    price = {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cached_input_per_mtok": 0.5}
    result = _run(cli, server, tmp_path, "house-model", prices={"house-model": price})
    run_id = result.json()["run_id"]
    steps = sql(
        "SELECT prompt_tokens, completion_tokens, cached_tokens, cost FROM steps "
        "WHERE kind = 'model' ORDER BY seq"
    )
    expected = []
    for prompt, completion, cached in USAGE:
        c = cached or 0
        cost = ((prompt - c) * 2.0 + c * 0.5 + completion * 8.0) / 1e6
        expected.append((prompt, completion, c, cost))
    assert [(p, o, c) for p, o, c, _ in steps] == [(p, o, c) for p, o, c, _ in expected]
    assert [s[3] for s in steps] == pytest.approx([e[3] for e in expected])
    # Steps that paid nothing have no cost; the run's totals are the sum of its steps'.
    assert sql("SELECT count(*) FROM steps WHERE kind = 'tool' AND cost IS NOT NULL") == [(0,)]
    ((cached_total, run_cost),) = sql("SELECT cached_tokens, cost FROM runs")
    assert cached_total == 8_000
    assert run_cost == pytest.approx(sum(s[3] for s in steps))
    assert run_cost == pytest.approx(sum(e[3] for e in expected))

    shown = f"{run_cost:.4f}"
    listing = cli("list").stdout
    assert shown in listing and "COST" in listing.splitlines()[0]
    show = cli("show", run_id).stdout
    assert f"cost {shown}" in show and "(8000 cached)" in show
    assert f"{steps[0][3]:.4f}" in show  # each model step's cost in the timeline


def test_a_model_in_the_shipped_table_is_priced_with_no_prices_configured(
    cli: Callable[..., Any], server: FakeOpenAI, tmp_path: Path, sql: Callable[..., list[Any]]
) -> None:
    _run(cli, server, tmp_path, "gpt-4.1-mini-2025-04-14")  # a dated snapshot of gpt-4.1-mini
    inp, out, cached = SHIPPED["gpt-4.1-mini"]
    expected = sum(((p - (c or 0)) * inp + (c or 0) * cached + o * out) / 1e6 for p, o, c in USAGE)
    assert sql("SELECT cost FROM runs")[0][0] == pytest.approx(expected)


def test_prices_override_the_shipped_table_and_an_unknown_model_has_no_cost(
    cli: Callable[..., Any], server: FakeOpenAI, tmp_path: Path, sql: Callable[..., list[Any]]
) -> None:
    price = {"input_per_mtok": 100.0, "output_per_mtok": 0.0}  # no cached price: input's
    _run(cli, server, tmp_path, "gpt-4o", prices={"gpt-4o": price})
    assert sql("SELECT cost FROM runs")[0][0] == pytest.approx(sum(u[0] for u in USAGE) * 1e-4)
    _run(cli, server, tmp_path, "someone-elses-model")
    assert sql("SELECT cost FROM runs ORDER BY created_at DESC LIMIT 1") == [(None,)]
    assert sql("SELECT count(*) FROM steps WHERE cost IS NOT NULL") == [(3,)]


def test_the_shipped_table_is_dated_and_found_by_name() -> None:
    assert PRICES_AS_OF[:4].isdigit()
    assert shipped_row("gpt-4o-mini-2024-07-18") == SHIPPED["gpt-4o-mini"]  # not gpt-4o's
    assert shipped_row("openai/gpt-4.1") == SHIPPED["gpt-4.1"]
    assert shipped_row("gpt-4.1x") is None and shipped_row("llama3") is None
    s = Settings(model="gpt-5-mini", max_cost=1.0)  # a cost budget needs no [prices] now
    assert s.price("gpt-5-mini") == ModelPrice(
        input_per_mtok=0.25, output_per_mtok=2.0, cached_input_per_mtok=0.025
    )


def test_a_cached_count_that_is_no_count_is_not_a_discount() -> None:
    from durable_agent.models.usage import cached_prompt_tokens

    assert cached_prompt_tokens({"prompt_tokens_details": {"cached_tokens": 5}}, 10) == 5
    for bad in (-1, 11, 2.5, True, "5", None):
        assert cached_prompt_tokens({"prompt_tokens_details": {"cached_tokens": bad}}, 10) == 0
    assert cached_prompt_tokens({"prompt_tokens_details": None}, 10) == 0


@pytest.mark.slow
def test_the_web_view_shows_each_step_cost_and_the_run_total(
    cli: Callable[..., Any],
    server: FakeOpenAI,
    tmp_path: Path,
    env: dict[str, str],
    sql: Callable[..., list[Any]],
) -> None:
    import httpx
    from ui_support import start_ui, stop

    price = {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cached_input_per_mtok": 0.5}
    run_id = _run(cli, server, tmp_path, "house-model", prices={"house-model": price}).json()[
        "run_id"
    ]
    proc, address = start_ui(env, env["DURABLE_AGENT_DB"], log=tmp_path / "ui.log")
    try:
        runs = httpx.get(address).text
        page = httpx.get(f"{address}runs/{run_id}").text
    finally:
        stop(proc)
    ((total,),) = sql("SELECT cost FROM runs")
    assert f"{total:.4f}" in runs and f"cost {total:.4f}" in page
    for (cost,) in sql("SELECT cost FROM steps WHERE cost IS NOT NULL"):
        assert f"cost {cost:.4f}" in page
    assert "(8000 cached)" in page
