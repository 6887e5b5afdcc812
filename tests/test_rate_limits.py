"""Rate limits per model shared by every worker through the store (docs/fleets.md): the
sliding window itself on SQLite and PostgreSQL with a fixed clock, and four worker
processes against a local OpenAI-compatible server that records when each request
arrives. The window is configured short (`rate_limit_window_s = 2`, rpm = 3) so the test
takes seconds; the code path is the one a 60 s window takes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import Result
from hypothesis import given, settings
from hypothesis import strategies as st
from scale_helpers import Workers, pg_schema

from durable_agent.store import fleet
from durable_agent.store.engine import open_store_engine
from durable_agent.store.rows import utcnow


def test_sliding_window_waits_until_the_oldest_leave(store_url: str) -> None:
    engine = open_store_engine(store_url)
    t0 = utcnow()
    rpm = [fleet.Want("rpm:m", 1, 3)]
    for i in range(3):
        wait, ids = fleet.take_capacity(engine, rpm, 10.0, t0 + timedelta(seconds=i))
        assert wait == 0 and len(ids) == 1
    wait, ids = fleet.take_capacity(engine, rpm, 10.0, t0 + timedelta(seconds=3))
    assert ids == [] and wait == pytest.approx(7.0)  # the first leaves the window at t0+10
    wait, _ = fleet.take_capacity(engine, rpm, 10.0, t0 + timedelta(seconds=10.5))
    assert wait == 0
    # tokens: a call is let through only with room for its estimate; the real usage replaces it
    tpm = [fleet.Want("tpm:m", 600, 1000)]
    wait, (first,) = fleet.take_capacity(engine, tpm, 10.0, t0)
    assert wait == 0
    assert fleet.take_capacity(engine, tpm, 10.0, t0 + timedelta(seconds=1))[0] > 0
    fleet.settle_capacity(engine, [first], t0, {first: 300})  # it used fewer than estimated
    assert fleet.take_capacity(engine, tpm, 10.0, t0 + timedelta(seconds=1))[0] == 0
    # all or nothing: a call over its tpm records no request in rpm either
    both = [fleet.Want("rpm:n", 1, 5), fleet.Want("tpm:n", 2000, 1000)]
    assert fleet.take_capacity(engine, both[1:], 10.0, t0)[0] == 0  # alone in an empty window
    assert fleet.take_capacity(engine, both, 10.0, t0)[0] > 0
    assert fleet.take_capacity(engine, both[:1], 10.0, t0)[0] == 0
    engine.dispose()


def _max_in_window(times: list[float], window: float) -> int:
    times = sorted(times)
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


@pytest.mark.slow  # over 2 s: the window must pass a few times
@pytest.mark.postgres
def test_four_workers_stay_under_rpm(
    cli: Callable[..., Result], env: dict[str, str], tmp_path: Path
) -> None:
    from fake_openai import FakeOpenAI

    limit, window, runs = 3, 2.0, 6
    config = tmp_path / "limits.toml"
    config.write_text(f'rate_limit_window_s = {window}\n[models."m"]\nrpm = {limit}\n')
    script = [{"tool_calls": [{"name": "list_files", "arguments": {}}]}, {"content": "done"}]
    with pg_schema() as db, FakeOpenAI(script=script) as fake:
        wenv = {**env, "DURABLE_AGENT_CONFIG": str(config), "OPENAI_API_KEY": "sk-test"}
        for i in range(runs):
            ws = tmp_path / f"ws{i}"
            ws.mkdir()
            res = cli(
                "start", "t", "--model", "m", "--base-url", fake.url, "--detach",
                "--db", db, "--workspace", str(ws), extra_env=wenv,
            )  # fmt: skip
            assert res.code == 0, res.stderr
        workers = Workers(wenv, db, tmp_path / "logs")
        procs = [workers.start("--once", "--poll", "0.1") for _ in range(4)]
        try:
            assert all(p.wait(timeout=120) == 0 for p in procs)
        finally:
            workers.kill_all()
        arrived = [r["at"] for r in fake.requests]
        assert len(arrived) == 2 * runs
        assert all(r["fault"] is None for r in fake.requests)  # no 429 was ever due
        # the server's count by arrival, over a window a hair shorter than the limiter's
        assert _max_in_window(arrived, window) <= limit, arrived
        # 12 requests at 3 per 2 s cannot all go in less than 6 s: the limit held them back
        assert max(arrived) - min(arrived) >= (2 * runs / limit - 1) * window
        logs = "".join(workers.log(p) for p in procs)
        assert "waiting for rate limit: m (rpm 3)" in logs


def _max_tokens_in_window(requests: list[dict[str, object]], window: float) -> int:
    events = sorted((float(r["at"]), int(r["prompt_tokens"]) + 5) for r in requests)  # type: ignore[call-overload]
    best = 0
    for i, (t, _) in enumerate(events):
        best = max(best, sum(n for u, n in events[i:] if u < t + window))
    return best


@pytest.mark.slow  # over 2 s: the window must pass a few times
@pytest.mark.postgres
def test_four_workers_stay_under_tpm(
    cli: Callable[..., Result], env: dict[str, str], tmp_path: Path
) -> None:
    import json

    from fake_openai import FakeOpenAI

    from durable_agent.context.prompts import SYSTEM_PROMPT

    # room for two and a half first requests a window, as the server counts them
    first = (
        len(
            json.dumps(
                [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "t"}]
            )
        )
        // 4
    )
    tpm, window, runs = int(first * 2.5), 2.0, 4
    config = tmp_path / "limits.toml"
    config.write_text(f'rate_limit_window_s = {window}\n[models."m"]\ntpm = {tpm}\n')
    script = [{"tool_calls": [{"name": "list_files", "arguments": {}}]}, {"content": "done"}]
    with pg_schema() as db, FakeOpenAI(script=script) as fake:
        wenv = {**env, "DURABLE_AGENT_CONFIG": str(config), "OPENAI_API_KEY": "sk-test"}
        for i in range(runs):
            ws = tmp_path / f"ws{i}"
            ws.mkdir()
            res = cli(
                "start", "t", "--model", "m", "--base-url", fake.url, "--detach",
                "--db", db, "--workspace", str(ws), extra_env=wenv,
            )  # fmt: skip
            assert res.code == 0, res.stderr
        workers = Workers(wenv, db, tmp_path / "logs")
        procs = [workers.start("--once", "--poll", "0.1") for _ in range(4)]
        try:
            assert all(p.wait(timeout=120) == 0 for p in procs)
        finally:
            workers.kill_all()
        assert len(fake.requests) == 2 * runs
        assert _max_tokens_in_window(fake.requests, window) <= tpm
        logs = "".join(workers.log(p) for p in procs)
        assert f"waiting for rate limit: m (tpm {tpm})" in logs


_ENGINES: dict[str, object] = {}


@settings(max_examples=30, deadline=None)
@given(
    limit=st.integers(1, 6),
    takes=st.lists(
        st.tuples(st.floats(0, 3, allow_nan=False), st.integers(1, 4)), min_size=1, max_size=25
    ),
)
def test_a_window_never_holds_more_than_its_limit(
    limit: int, takes: list[tuple[float, int]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Whatever the gaps and sizes, each taker that waits as told and tries again never
    puts more than `limit` in any window (a want over the limit only alone)."""
    import uuid

    if "e" not in _ENGINES:
        _ENGINES["e"] = open_store_engine(f"sqlite:///{tmp_path_factory.mktemp('w') / 's.db'}")
    engine = _ENGINES["e"]
    key, window, now = f"rpm:{uuid.uuid4().hex}", 10.0, utcnow()
    taken: list[tuple[int, int]] = []
    clock = 0.0
    for gap, amount in takes:
        clock += gap
        while True:
            at = now + timedelta(seconds=clock)  # to the microsecond, as the store keeps it
            clock = (at - now).total_seconds()
            wait, ids = fleet.take_capacity(
                engine,  # type: ignore[arg-type]
                [fleet.Want(key, amount, limit)],
                window,
                at,
            )
            if ids:
                taken.append((round(clock * 1e6), amount))  # microseconds: exact comparisons
                break
            assert wait > 0
            clock += wait
    for t, _ in taken:
        inside = [a for u, a in taken if t - round(window * 1e6) < u <= t]
        assert sum(inside) <= limit or len(inside) == 1, (taken, t)
