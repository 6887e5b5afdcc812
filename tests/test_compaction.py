"""Long runs never hit the context wall (issue 13): compaction as durable `compact` steps.

The real CLI and the real openai client against tests/fake_openai.py with a WINDOW: the
server answers 400 `context_length_exceeded` to any request over it (counted its
documented way, JSON length // 4) and logs a hash per message, so these tests see what
was sent, not what the harness believes it sent.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI
from provider_support import KEY, MODEL, Endpoint
from scale_helpers import wait_for

WINDOW = 16_000
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]


def read_script(turns: int) -> list[dict[str, Any]]:
    """Turn i reads file i (each a different 6 KB file), then the answer."""
    reads = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": f"f{i:03}.txt"}}]}
        for i in range(turns)
    ]
    return [*reads, {"content": "read them all"}]


def write_files(workspace: Path, count: int, size: int = 6144) -> None:
    rng = random.Random(13)
    for i in range(count):
        text = ""
        while len(text) < size:
            text += " ".join(rng.choice(WORDS) for _ in range(10)) + "\n"
        (workspace / f"f{i:03}.txt").write_text(f"file {i}\n" + text[: size - 8])


@pytest.fixture
def windowed(
    request: pytest.FixtureRequest,
    cli: Callable[..., Any],
    env: dict[str, str],
    workspace: Path,
    tmp_path: Path,
) -> Iterator[Endpoint]:
    turns = getattr(request, "param", 150)
    write_files(workspace, turns)
    with FakeOpenAI(script=read_script(turns), window=WINDOW) as server:
        endpoint = Endpoint(cli, server, env, workspace, tmp_path / "config.toml")
        endpoint.configure(models={MODEL: {"context_window": WINDOW}})
        yield endpoint


def outputs(sql: Callable[..., list[Any]], kind: str) -> list[tuple[int, dict[str, Any]]]:
    rows = sql(
        "SELECT turn, output FROM steps WHERE kind = ? AND state = 'completed' ORDER BY seq", kind
    )
    return [(t, o if isinstance(o, dict) else json.loads(o)) for t, o in rows]


def turn_requests(server: FakeOpenAI) -> list[dict[str, Any]]:
    return [r for r in server.requests if r["kind"] == "turn"]


@pytest.mark.slow
def test_150_reads_of_6kb_in_a_16k_window_complete_without_passing_it(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    result = windowed.start("--json", "--max-steps", "200", task="read every file")
    assert result.code == 0, result.stderr
    out = result.json()
    assert (out["status"], out["answer"], out["steps"], out["tool_calls"]) == (
        "completed",
        "read them all",
        151,
        150,
    )
    requests = windowed.server.requests
    assert max(r["prompt_tokens"] for r in requests) <= WINDOW  # never refused, never over
    assert windowed.answered() == {
        **{t: 1 for t in range(151)},
        -1: sum(r["kind"] == "summary" for r in requests),
    }
    # Without compaction the history would be ~150 × 1.6k tokens: both stages had to run.
    compacts = outputs(sql, "compact")
    stages = {o["stage"] for _, o in compacts}
    assert stages == {"elide", "summarize"}
    assert sum(o["stage"] == "summarize" for _, o in compacts) == sum(
        r["kind"] == "summary" for r in requests
    )
    assert all(o["tokens_after"] < o["tokens_before"] for _, o in compacts)
    # Nothing deleted: every result is still stored once.
    assert sql("SELECT count(*) FROM messages WHERE role = 'tool'") == [(150,)]
    events = [
        json.loads(line) for line in windowed.cli("export", out["run_id"]).stdout.splitlines()
    ]
    compacted = [e for e in events if e["type"] == "context_compacted"]
    assert len(compacted) == len(compacts)
    assert all(e["tokens_after"] < e["tokens_before"] for e in compacted)
    shown = windowed.cli("show", out["run_id"]).stdout
    assert "context summarize:" in shown and " → " in shown
    # Prefix: between compactions every request's messages extend the previous request's exactly.
    assert_each_request_extends_the_last(
        turn_requests(windowed.server), {t for t, _ in compacts}, 151
    )


def assert_each_request_extends_the_last(
    turns: list[dict[str, Any]], compacted_at: set[int], count: int
) -> None:
    assert [r["turn"] for r in turns] == list(range(count))
    extended = 0
    for before, after in zip(turns, turns[1:], strict=False):
        assert (
            after["hashes"][:2] == before["hashes"][:2]
        )  # the system prompt and the task, always verbatim
        if after["turn"] in compacted_at:
            assert after["hashes"][: len(before["hashes"])] != before["hashes"]  # it did change
            continue
        assert after["hashes"][: len(before["hashes"])] == before["hashes"], f"turn {after['turn']}"
        assert len(after["hashes"]) == len(before["hashes"]) + 2  # the call and its result
        extended += 1
    assert 0 < len(compacted_at) < extended  # compaction is rare, not a little every turn


@pytest.mark.parametrize("windowed", [30], indirect=True)
@pytest.mark.slow
def test_between_compactions_each_request_extends_the_previous_one_exactly(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    windowed.server.window = 8000
    windowed.configure(keep_recent_outputs=2, models={MODEL: {"context_window": 8000}})
    result = windowed.start("--json", "--max-steps", "100")
    assert result.code == 0, result.stderr
    compacts = outputs(sql, "compact")
    assert {o["stage"] for _, o in compacts} == {"elide", "summarize"}
    assert_each_request_extends_the_last(
        turn_requests(windowed.server), {t for t, _ in compacts}, 31
    )


def _resume_popen(api: Endpoint, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "durable_agent", "resume", run_id, "--quiet"],
        cwd=api.workspace,
        env={**api.env, **api.cli_env()},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.communicate()


def summary_bodies(server: FakeOpenAI) -> list[str]:
    return [json.dumps(r["body"]["messages"]) for r in server.requests if r["kind"] == "summary"]


@pytest.mark.slow
@pytest.mark.parametrize("windowed", [40], indirect=True)
def test_kill_during_the_summary_call_pays_it_again_once_and_after_it_never(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    api = windowed
    window = 6000  # small: summaries come early
    api.server.window = window
    api.configure(keep_recent_outputs=1, models={MODEL: {"context_window": window}})
    api.server.add_faults([{"kind": "summary", "attempt": 1, "delay": 60.0}])
    proc = api.popen("--run-id", "cut", "--quiet", "--max-steps", "100")
    try:
        wait_for(lambda: summary_bodies(api.server), what="the first summary request")
        rows = sql(
            "SELECT state, turn FROM steps WHERE kind = 'compact' AND input LIKE '%summarize%'"
        )
        assert [r[0] for r in rows] == ["started"]  # its intent is committed before the call
        summary_turn = rows[0][1]
    finally:
        _kill(proc)

    # Resume: the interrupted summary is requested once more; then kill before the next turn answers.
    api.server.add_faults([{"turn": summary_turn, "attempt": 1, "delay": 60.0}])
    proc = _resume_popen(api, "cut")
    try:
        wait_for(
            lambda: any(r["turn"] == summary_turn for r in api.server.requests),
            what="the turn after the summary",
        )
        assert sql(
            "SELECT state FROM steps WHERE kind = 'compact' AND turn = ? AND input LIKE '%summarize%'",
            summary_turn,
        ) == [("completed",)]
    finally:
        _kill(proc)
    first, again = summary_bodies(api.server)
    assert first == again  # the very same summary request, made again exactly once

    result = api.resume("cut", "--json")
    assert result.code == 0, result.stderr
    assert result.json()["status"] == "completed"
    bodies = summary_bodies(api.server)
    assert bodies.count(first) == 2  # never a third time
    assert len(set(bodies)) == len(bodies) - 1  # every other summary was paid once
    assert sum(o["stage"] == "summarize" for _, o in outputs(sql, "compact")) == len(set(bodies))
    assert max(r["prompt_tokens"] for r in api.server.requests) <= window


@pytest.mark.parametrize("windowed", [30], indirect=True)
@pytest.mark.slow
def test_the_wall_forces_one_compaction_and_one_retry(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # The harness believes the window is far larger than the server's: only the 400 stops it.
    windowed.configure(models={MODEL: {"context_window": 200_000}})
    result = windowed.start("--json", "--max-steps", "100")
    assert result.code == 0, result.stderr
    refused = [r for r in windowed.server.requests if r["prompt_tokens"] > WINDOW]
    assert refused  # the wall was hit ...
    compacts = outputs(sql, "compact")
    assert len(compacts) >= len(refused)  # ... and each time compaction made room
    failed = sql("SELECT count(*) FROM steps WHERE kind = 'model' AND state = 'failed'")
    assert failed == [(len(refused),)]
    assert result.json()["steps"] == 31


@pytest.mark.parametrize("windowed", [3], indirect=True)
def test_a_request_that_cannot_fit_fails_saying_what_was_tried(windowed: Endpoint) -> None:
    windowed.server.window = 500  # smaller than one file: no compaction can help
    windowed.configure(models={MODEL: {"context_window": 200_000}})
    result = windowed.start("--json")
    assert result.code == 1
    out = result.json()
    assert out["stop_reason"] == "model_error"
    assert "context_length" in out["error"] and "tried: compacting the context" in out["error"]
    assert sum(r["prompt_tokens"] > 500 for r in windowed.server.requests) <= 3  # bounded
    # The advice works: a model with a larger window (the server's, now) finishes the run.
    assert "Resume with --model naming a model with a larger window" in out["error"]
    windowed.server.window = 100_000
    windowed.configure(
        models={MODEL: {"context_window": 200_000}, "bigger": {"context_window": 100_000}}
    )
    assert "--accept-changes" in out["error"]
    again = windowed.resume(out["run_id"], "--model", "bigger", "--accept-changes", "--json")
    assert again.code == 0 and again.json()["status"] == "completed", again.stderr


@pytest.mark.parametrize("windowed", [12], indirect=True)
def test_read_output_returns_an_elided_result(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    windowed.server.script[12:] = [
        {"tool_calls": [{"name": "read_output", "arguments": {"call_id": "call_0_0"}}]},
        {"content": "done"},
    ]
    windowed.configure(keep_recent_outputs=1, models={MODEL: {"context_window": 6000}})
    windowed.server.window = 6000
    result = windowed.start("--json")
    assert result.code == 0, result.stderr
    last = turn_requests(windowed.server)[-1]["body"]["messages"]
    assert last[-1]["role"] == "tool" and last[-1]["content"].startswith("file 0\n")
    stubs = [m["content"] for m in last if m["role"] == "tool" and "elided" in m["content"]]
    assert stubs and all('call read_output("call_' in s for s in stubs)


@pytest.mark.parametrize("windowed", [12], indirect=True)
@pytest.mark.slow
def test_compact_by_hand_then_resume_sends_the_smaller_request(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    first = windowed.start("--json", "--max-steps", "6", "--run-id", "byhand")
    assert first.code == 3, first.stderr  # budget_exceeded: a stopped run
    assert sql("SELECT count(*) FROM steps WHERE kind = 'compact'") == [
        (0,)
    ]  # under the threshold so far
    before = turn_requests(windowed.server)[-1]["prompt_tokens"]
    done = windowed.cli("compact", "byhand", extra_env=windowed.cli_env())
    assert done.code == 0, done.stderr
    assert "context compacted" in done.stdout and "durable-agent resume byhand" in done.stdout
    assert [o["stage"] for _, o in outputs(sql, "compact")] == ["elide", "summarize"]
    assert sum(r["kind"] == "summary" for r in windowed.server.requests) == 1
    assert sql("SELECT status, stop_reason FROM runs") == [
        ("budget_exceeded", "max_steps")
    ]  # as it was
    again = windowed.resume("byhand", "--json", "--max-steps", "20")
    assert again.code == 0, again.stderr
    resumed = turn_requests(windowed.server)[6]
    assert resumed["turn"] == 6 and resumed["prompt_tokens"] < before
    assert resumed["body"]["messages"][2]["content"].startswith(
        "[Summary of the earlier conversation"
    )
    assert sum(r["kind"] == "summary" for r in windowed.server.requests) == 1  # not paid again


@pytest.mark.slow
@pytest.mark.parametrize("windowed", [40], indirect=True)
def test_a_compacted_run_stops_and_resumes_on_both_stores(
    windowed: Endpoint, store_url: str
) -> None:
    """Stopped by a budget between compactions, resumed: replay rebuilds the compacted request
    from the recorded boundaries, on SQLite and PostgreSQL alike."""
    window = 6000
    windowed.server.window = window
    windowed.configure(keep_recent_outputs=1, models={MODEL: {"context_window": window}})
    windowed.env["DURABLE_AGENT_DB"] = store_url
    first = windowed.start("--json", "--max-steps", "25", "--run-id", "both")
    assert first.code == 3, first.stderr
    done = windowed.resume("both", "--json", "--max-steps", "100")
    assert done.code == 0, done.stderr
    shown = json.loads(windowed.cli("show", "both", "--json").stdout)
    compacts = [s for s in shown["steps"] if s["kind"] == "compact"]
    summaries = [s for s in compacts if (s["output"] or {}).get("stage") == "summarize"]
    bodies = summary_bodies(windowed.server)
    assert summaries and len(bodies) == len(set(bodies)) == len(summaries)  # each paid once
    turns = turn_requests(windowed.server)
    assert [r["turn"] for r in turns] == list(
        range(41)
    )  # every turn asked once: no refusal, no repeat
    assert max(r["prompt_tokens"] for r in windowed.server.requests) <= window
    compacted_at = {s["turn"] for s in compacts}
    for before, after in zip(turns, turns[1:], strict=False):  # across the resume too
        if after["turn"] not in compacted_at:
            assert after["hashes"][: len(before["hashes"])] == before["hashes"], (
                f"turn {after['turn']}"
            )


def test_a_scripted_run_compacts_with_a_local_summary_that_takes_no_script_turn(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    workspace: Path,
    sql: Callable[..., list[Any]],
) -> None:
    write_files(workspace, 20, size=2000)
    model = write_script(read_script(20))
    result = cli("start", "read", "--model", model, "--max-context-tokens", "4000", "--json")
    assert result.code == 0, result.stderr
    out = json.loads(result.stdout)
    assert (out["answer"], out["steps"]) == ("read them all", 21)  # every script turn, in order
    stages = [o["stage"] for _, o in outputs(sql, "compact")]
    assert "elide" in stages and "summarize" in stages
    summary = next(o["summary"] for _, o in outputs(sql, "compact") if o["stage"] == "summarize")
    assert summary.startswith("Task: as given.") and "call_" in summary


def test_results_shorter_than_their_stubs_are_not_elided(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    workspace: Path,
    sql: Callable[..., list[Any]],
) -> None:
    # 58 one-line results elided made the request bigger: 2,403 -> 3,616 tokens.
    (workspace / "a.txt").write_text("x\n")
    model = write_script(
        [
            *(
                {
                    "tool_calls": [
                        {"name": "read_file", "arguments": {"path": "a.txt", "offset": i % 2}}
                    ]
                }
                for i in range(80)
            ),
            {"content": "done"},
        ]
    )
    result = cli(
        "start",
        "read",
        "--model",
        model,
        "--max-context-tokens",
        "3000",
        "--max-repeats",
        "999",
        "--max-steps",
        "200",
        "--json",
    )
    assert result.code == 0, result.stderr
    done = outputs(sql, "compact")
    assert done, "the budget was never reached: the test shows nothing"
    assert all(o["tokens_after"] < o["tokens_before"] for _, o in done), done


@pytest.mark.slow
@pytest.mark.parametrize("windowed", [20], indirect=True)
@pytest.mark.parametrize("unreported", [False, True], ids=["usage", "no-usage-on-odd-turns"])
def test_counts_follow_a_provider_that_tokenizes_differently_also_after_a_resume(
    windowed: Endpoint, sql: Callable[..., list[Any]], unreported: bool
) -> None:
    """The server counts twice the harness's estimate (JSON length // 2). Calibrated with each
    call's reported prompt_tokens, and with the recorded one after a resume, no request is
    refused: one session of 8 calls, then sessions of 2 (half the calls are a session's first).
    A call without usage leaves the calibration as it was, live and after a resume alike
    (a resume took 1.0 when a session's last call reported none)."""
    window = 12_000
    windowed.server.window = window
    windowed.server.chars_per_token = 2
    if unreported:
        windowed.server.add_faults(
            [{"turn": t, "no_usage": True, "times": 100} for t in range(1, 40, 2)]
        )
    windowed.configure(keep_recent_outputs=1, models={MODEL: {"context_window": window}})
    result = windowed.start("--json", "--max-steps", "8", "--run-id", "cal")
    for steps in range(10, 40, 2):
        if result.json()["status"] == "completed":
            break
        assert result.code == 3, result.stderr  # stopped by --max-steps, resumable
        result = windowed.resume("cal", "--json", "--max-steps", str(steps))
    assert result.code == 0, result.stderr
    assert result.json()["status"] == "completed"
    assert max(r["prompt_tokens"] for r in windowed.server.requests) <= window  # none refused
    assert [r["turn"] for r in turn_requests(windowed.server)] == list(range(21))  # each asked once
    assert sql("SELECT count(*) FROM steps WHERE kind = 'model' AND state = 'failed'") == [(0,)]
    assert any(o["stage"] == "summarize" for _, o in outputs(sql, "compact"))  # it had to compact


@pytest.mark.parametrize("windowed", [12], indirect=True)
def test_summaries_are_written_by_compact_model_on_the_same_endpoint(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    windowed.server.window = 6000
    windowed.configure(compact_model="summary-model", models={MODEL: {"context_window": 6000}})
    result = windowed.start("--json")
    assert result.code == 0, result.stderr
    summaries = [r for r in windowed.server.requests if r["kind"] == "summary"]
    assert summaries and {r["body"]["model"] for r in summaries} == {"summary-model"}
    assert {r["body"]["model"] for r in turn_requests(windowed.server)} == {MODEL}
    models = sql("SELECT input FROM steps WHERE kind = 'compact' AND input LIKE '%summarize%'")
    assert [json.loads(i)["model"] if isinstance(i, str) else i["model"] for (i,) in models] == [
        "summary-model"
    ] * len(summaries)


def test_the_live_timeline_shows_each_compaction_with_tokens_before_and_after(
    cli: Callable[..., Any], write_script: Callable[..., str], workspace: Path
) -> None:
    write_files(workspace, 20, size=2000)
    result = cli(
        "start", "read", "--model", write_script(read_script(20)), "--max-context-tokens", "4000"
    )
    assert result.code == 0, result.stderr
    lines = result.stderr.splitlines()
    elided = [line for line in lines if " · compact · context elided " in line]
    summarized = [line for line in lines if " · compact · context summarized messages " in line]
    assert elided and summarized, result.stderr
    for line in elided + summarized:
        before, after = (
            int(n.replace(",", "")) for n in line.split(": ")[-1].split(" tokens")[0].split(" → ")
        )
        assert after < before, line


@pytest.mark.parametrize("windowed", [12], indirect=True)
@pytest.mark.parametrize("how", ["compact", "smaller cap"])
@pytest.mark.slow
def test_a_model_call_cut_off_by_a_crash_then_compacted_is_superseded_not_a_mismatch(
    windowed: Endpoint, sql: Callable[..., list[Any]], how: str
) -> None:
    """Killed during model call 6; then the context is compacted before that call is made
    again (by hand, or by a resume with a smaller --max-context-tokens): the call is made
    with the compacted request, and the run completes (no step_mismatch)."""
    api = windowed
    api.server.add_faults([{"turn": 6, "attempt": 1, "delay": 60.0}])
    proc = api.popen("--run-id", "cut", "--quiet")
    try:
        wait_for(lambda: any(r["turn"] == 6 for r in api.server.requests), what="model call 7")
    finally:
        _kill(proc)
    assert sql("SELECT state FROM steps WHERE kind = 'model' AND turn = 6") == [("started",)]
    if how == "compact":
        done = api.cli("compact", "cut", extra_env=api.cli_env())
        assert done.code == 0, done.stderr
        result = api.resume("cut", "--json")
    else:
        result = api.resume("cut", "--json", "--max-context-tokens", "8000")
    assert result.code == 0, result.stderr
    assert (result.json()["status"], result.json()["answer"]) == ("completed", "read them all")
    first, again = [r for r in turn_requests(api.server) if r["turn"] == 6]
    assert again["prompt_tokens"] < first["prompt_tokens"]  # made again, compacted
    assert again["body"]["messages"][2]["content"].startswith(
        "[Summary of the earlier conversation"
    )
    assert sql(
        "SELECT count(*) FROM steps WHERE kind = 'model' AND turn = 6 AND state = 'completed'"
    ) == [(1,)]


@pytest.mark.parametrize("windowed", [12], indirect=True)
@pytest.mark.slow
def test_a_model_call_that_failed_after_this_turns_compaction_is_made_again_on_resume(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    """The provider fails (500s, retries exhausted) on the call right after a compaction: the
    run ends model_error, and `resume` makes that same call again (the same key), not a
    duplicate step."""
    api = windowed
    api.server.window = 8000
    api.configure(models={MODEL: {"context_window": 8000}})
    api.server.add_faults(
        [{"turn": 4, "status": 500, "times": 6}]
    )  # every attempt (FAST_RETRIES: 6)
    first = api.start("--json", "--run-id", "again")
    assert first.code == 1 and first.json()["stop_reason"] == "model_error", first.stdout
    assert {t for (t,) in sql("SELECT turn FROM steps WHERE kind = 'compact'")} == {
        4
    }  # compacted at that turn
    result = api.resume("again", "--json")
    assert result.code == 0, result.stdout + result.stderr
    assert (result.json()["status"], result.json()["answer"]) == ("completed", "read them all")
    assert sql(
        "SELECT state, count(*) FROM steps WHERE kind = 'model' AND turn = 4 GROUP BY state"
    ) == [("completed", 1)]


@pytest.mark.slow
@pytest.mark.parametrize("windowed", [12], indirect=True)
def test_compact_by_hand_keeps_the_lease_through_a_long_summary_call(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    """A summary call longer than the lease: `compact` renews it meanwhile, so a `resume`
    started then is refused (exit 6, the run is live) instead of taking the run over."""
    api = windowed
    api.configure(lease_seconds=1.0, request_timeout_s=60.0)
    first = api.start("--json", "--max-steps", "6", "--run-id", "held")
    assert first.code == 3, first.stderr
    api.server.add_faults([{"kind": "summary", "delay": 12.0}])
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent", "compact", "held"],
        cwd=api.workspace,
        env={**api.env, **api.cli_env()},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: summary_bodies(api.server), what="the summary request")
        asked = time.monotonic()
        wait_for(lambda: time.monotonic() - asked > 2.5, what="two and a half lease periods")
        taken = api.resume("held", "--json")
        assert taken.code == 6, taken.stdout + taken.stderr
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "context compacted" in out
    assert sum(r["kind"] == "summary" for r in api.server.requests) == 1
    assert sql("SELECT status, stop_reason FROM runs") == [("budget_exceeded", "max_steps")]


@pytest.mark.parametrize(
    ("windowed", "size", "chars_per_token"),
    [(20, 6144, 4), (20, 4096, 3)],
    indirect=["windowed"],
    ids=["6kb", "4kb-denser-count"],
)
@pytest.mark.slow
def test_a_budget_barely_above_one_turn_does_not_pay_a_summary_every_turn(
    windowed: Endpoint, sql: Callable[..., list[Any]], size: int, chars_per_token: int
) -> None:
    # Each turn reads a 6 KB file (~1.6k tokens), or 4 KB counted denser by the server: the
    # task and the last turn, with one more like it, pass compact_at of a 2,200-token budget,
    # so no summary can make room for the next turns. Summarizing every turn (as it once did:
    # 19 summaries of ~1.2k tokens for 20 turns) gives way to eliding every result the model
    # has seen, for free, and a summary only when that is not enough; no request over the budget.
    write_files(windowed.workspace, 20, size=size)
    windowed.server.chars_per_token = chars_per_token
    windowed.server.window = 2200  # refused over it
    result = windowed.start("--json", "--max-context-tokens", "2200")
    assert result.code == 0, result.stderr
    assert result.json()["answer"] == "read them all"
    requests = windowed.server.requests
    turns = [r["prompt_tokens"] for r in requests if r["kind"] == "turn"]
    summaries = [r["prompt_tokens"] for r in requests if r["kind"] == "summary"]
    assert len(turns) == 21 and max(turns) <= 2200
    assert 0 < len(summaries) <= 10
    assert max(summaries) < 700  # the results they cover were elided first: never a whole file
    compacts = outputs(sql, "compact")
    assert sum(o["stage"] == "elide" for _, o in compacts) >= 15
    # Every result but the newest turn's was elided: the model always sees what it just asked for.
    last = turn_requests(windowed.server)[-1]["body"]["messages"]
    assert last[-1]["role"] == "tool" and last[-1]["content"].startswith("file 19\n")


def compactions(sql: Callable[..., list[Any]], run_id: str) -> list[tuple[Any, ...]]:
    """(turn, stage, elided seqs, cut) of a run's completed compactions, in order."""
    rows = sql(
        "SELECT turn, output FROM steps WHERE run_id = ? AND kind = 'compact' AND state = 'completed' "
        "ORDER BY seq",
        run_id,
    )
    return [
        (t, o["stage"], o.get("elided"), o.get("start"))
        for t, o in ((t, json.loads(o)) for t, o in rows)
    ]


BIG_TASK = "fix the bug. " + "context " * 700  # ~1.4k tokens: a budget of 2,200 barely holds it


@pytest.mark.slow
@pytest.mark.parametrize(
    ("windowed", "task", "size"),
    [(20, "fix the bug", 6144), (25, BIG_TASK, 500)],
    indirect=["windowed"],
    ids=["6kb-reads", "big-task"],
)
def test_a_tight_budget_compacts_the_same_way_through_crashes(
    windowed: Endpoint, sql: Callable[..., list[Any]], task: str, size: int
) -> None:
    # The same run twice on one server (answers depend only on the request): once whole, once
    # killed at every 7th checkpoint boundary of each process and resumed. Its compactions
    # (stage, turn, elided seqs, cut) and the requests it sent are the same.
    _same_through_crashes(windowed, sql, task, size)


@pytest.mark.slow
@pytest.mark.parametrize("windowed", [20], indirect=True)
def test_a_summary_with_bytes_the_store_cleans_compacts_the_same_way_through_crashes(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # A NUL and a lone surrogate in the summary: kept raw in memory but stored cleaned, a
    # resume read back another history than the first session held, and a crash after the
    # next call's intent ended every resume in step_mismatch (and the rest sent other bytes).
    windowed.server.add_faults(
        [
            {
                "kind": "summary",
                "times": 1000,
                "message": {
                    "role": "assistant",
                    "content": "Task:\u0000 read the files \ud800 so far",
                },
            }
        ]
    )
    _same_through_crashes(windowed, sql, "fix the bug", 6144)
    summaries = [o["summary"] for _, o in outputs(sql, "compact") if o["stage"] == "summarize"]
    assert summaries and all("\x00" not in t and "\ud800" not in t for t in summaries)


@pytest.mark.parametrize("windowed", [20], indirect=True)
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_a_summary_keeps_no_escaped_spelling_of_the_harness_key(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # A summary is the model's free text, like an answer: the key spelt with JSON escapes
    # ("\u0073k-...", which any JSON reader decodes) was stored and sent back as it came.
    escaped = "\\u00" + KEY[:1].encode().hex() + KEY[1:]
    windowed.server.add_faults(
        [
            {
                "kind": "summary",
                "times": 1000,
                "message": {
                    "role": "assistant",
                    "content": 'Read 12 files. Config seen: {"api_key": "' + escaped + '"}',
                },
            }
        ]
    )
    assert windowed.start("--max-context-tokens", "2200", task="fix the bug").code == 0
    summaries = [o["summary"] for _, o in outputs(sql, "compact") if o["stage"] == "summarize"]
    assert summaries and all(KEY[1:] not in t and "[REDACTED" in t for t in summaries)
    sent = [json.dumps(r["body"]) for r in windowed.server.requests]
    assert sum("Read 12 files" in body for body in sent) > 0 and not any(
        KEY[1:] in body for body in sent
    )


@pytest.mark.parametrize("windowed", [20], indirect=True)
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_a_summary_that_is_only_reasoning_counts_as_empty(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # It was kept as the summary, dropping the list of results that can be read again.
    windowed.server.add_faults(
        [
            {
                "kind": "summary",
                "times": 1000,
                "message": {
                    "role": "assistant",
                    "content": "<think>what was done so far</think>\n",
                },
            }
        ]
    )
    assert windowed.start("--max-context-tokens", "2200", task="fix the bug").code == 0
    summaries = [o["summary"] for _, o in outputs(sql, "compact") if o["stage"] == "summarize"]
    assert summaries and all(
        t.startswith("(the summary came back empty)") and "call_" in t for t in summaries
    )


@pytest.mark.parametrize("windowed", [0], indirect=True)
def test_a_request_over_the_budget_that_nothing_can_shrink_is_sent_saying_so(
    windowed: Endpoint,
) -> None:
    # A --max-context-tokens below the task alone: sent and paid without a word, before.
    result = windowed.start(
        "--max-context-tokens", "1000", "--run-id", "big", task="fix it " + "x" * 20_000
    )
    assert result.code == 0, result.stderr
    assert (
        "over the context budget of 1,000, and compacting cannot make it smaller" in result.stderr
    )
    assert "tokens, over the budget of 1,000) → answer" in windowed.cli("show", "big").stdout


def _same_through_crashes(
    api: Endpoint, sql: Callable[..., list[Any]], task: str, size: int
) -> None:
    write_files(api.workspace, 25, size=size)
    whole = api.start("--json", "--max-context-tokens", "2200", "--run-id", "whole", task=task)
    assert whole.code == 0, whole.stderr
    seen = len(api.server.requests)
    crash = {**api.cli_env(), "DURABLE_AGENT_CRASH_AFTER": "7"}
    result = api.cli(
        "start",
        task,
        *api.model_flags(),
        "--json",
        "--max-context-tokens",
        "2200",
        "--run-id",
        "cut",
        extra_env=crash,
    )
    kills = 0
    while result.code == -signal.SIGKILL:
        kills += 1
        assert kills < 200
        result = api.cli("resume", "cut", "--json", extra_env=crash)
    assert result.code == 0, result.stderr
    assert kills > 10
    assert compactions(sql, "cut") == compactions(sql, "whole")
    assert any(stage == "summarize" for _, stage, _, _ in compactions(sql, "whole"))
    bodies = [json.dumps(r["body"]["messages"]) for r in api.server.requests]
    first, second = bodies[:seen], bodies[seen:]
    assert (
        list(dict.fromkeys(second)) == first
    )  # a request cut off by a kill is made again, nothing else


CONTEXT_REFUSAL = {
    "status": 400,
    "body": {
        "error": {
            "message": "This model's maximum context length is 2000 tokens.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    },
}


@pytest.mark.parametrize("windowed", [12], indirect=True)
def test_a_refusal_right_after_a_tight_elide_compacts_again_without_reusing_its_step(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # keep_recent_outputs = 0: the forced compaction would elide the last turn's results,
    # which the tight elide of the same turn left; one elide per turn (its key), so it summarizes.
    windowed.configure(keep_recent_outputs=0, models={MODEL: {"context_window": WINDOW}})
    windowed.server.add_faults([{"turn": 6, "attempt": 1, **CONTEXT_REFUSAL}])
    result = windowed.start("--json", "--max-context-tokens", "2200")
    assert result.code == 0, result.stderr
    keys = [
        k for (k,) in sql("SELECT idempotency_key FROM steps WHERE kind = 'compact' AND turn = 6")
    ]
    assert keys[0] == "compact:6:elide" and len(keys) == 2 and keys[1].startswith("compact:6:")


@pytest.mark.parametrize("windowed", [12], indirect=True)
@pytest.mark.slow
def test_compact_by_hand_after_a_tight_elide_of_the_same_turn(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    windowed.configure(
        keep_recent_outputs=0, retry_max_attempts=1, models={MODEL: {"context_window": WINDOW}}
    )
    windowed.server.add_faults([{"turn": 6, "attempt": 1, "status": 401}])
    stopped = windowed.start("--json", "--max-context-tokens", "2200", "--run-id", "r")
    assert stopped.code == 1 and sql(
        "SELECT count(*) FROM steps WHERE idempotency_key = 'compact:6:elide'"
    ) == [(1,)]
    done = windowed.cli("compact", "r", extra_env=windowed.cli_env())
    assert done.code == 0, done.stderr
    # No second elide under the turn's key; what is left to summarize is the stubs, fewer
    # tokens than a summary (capped at 330 here) takes: none is paid, and that is said.
    assert "no summary made" in done.stdout, done.stdout
    assert sql(
        "SELECT idempotency_key FROM steps WHERE kind = 'compact' AND turn = 6 ORDER BY seq"
    ) == [("compact:6:elide",)]
    assert windowed.resume("r", "--json").code == 0


@pytest.mark.parametrize("windowed", [12], indirect=True)
@pytest.mark.slow
def test_a_resume_with_a_smaller_budget_compacts_a_turn_that_compacted_already(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # Turn 7 of this run compacts by an elide alone (the request is then ~1.9k of 2.2k); the
    # call fails, and the run is resumed under a budget its request no longer fits.
    windowed.configure(retry_max_attempts=1, models={MODEL: {"context_window": WINDOW}})
    windowed.server.add_faults([{"turn": 7, "attempt": 1, "status": 401}])
    stopped = windowed.start("--json", "--max-context-tokens", "2200", "--run-id", "r")
    assert stopped.code == 1
    assert [o["stage"] for t, o in outputs(sql, "compact") if t == 7] == ["elide"]
    resumed = windowed.resume("r", "--json", "--max-context-tokens", "1850")
    assert resumed.code == 0, resumed.stderr
    turn_7 = [o for t, o in outputs(sql, "compact") if t == 7]
    assert [o["stage"] for o in turn_7] == ["elide", "summarize"]
    assert turn_7[1]["tokens_before"] > 1850


@pytest.mark.slow
@pytest.mark.parametrize("windowed", [20], indirect=True)
def test_a_tight_budget_compacts_the_same_way_through_a_failing_disk(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # The store's disk fails for good ("disk I/O error" at every statement from the N-th on)
    # at points spread over the run, compactions included: the run stops (exit 7) and a
    # resume once the disk is back makes the compactions of the run that never failed.
    api = windowed
    whole = api.start("--json", "--max-context-tokens", "2200", "--run-id", "whole")
    assert whole.code == 0, whole.stderr
    for at in (50, 100, 150, 200):
        rid = f"disk{at}"
        fault = {
            **api.cli_env(),
            "DURABLE_AGENT_FAULT_AT": str(at),
            "DURABLE_AGENT_FAULT": "io_error",
            "DURABLE_AGENT_FAULT_REPEAT": "100",
        }
        stopped = api.cli(
            "start",
            "fix the bug",
            *api.model_flags(),
            "--json",
            "--max-context-tokens",
            "2200",
            "--run-id",
            rid,
            extra_env=fault,
        )
        assert stopped.code == 7, (at, stopped.stderr)
        resumed = api.resume(rid, "--json")
        assert resumed.code == 0, (at, resumed.stderr)
        assert compactions(sql, rid) == compactions(sql, "whole"), at


@pytest.mark.slow
@pytest.mark.parametrize("windowed", [12], indirect=True)
def test_a_summary_refused_as_too_long_fails_the_run_saying_so_and_resume_does_not_brick_it(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # The configured window is larger than the provider's real one for the summary request:
    # its own 400 is not the run's request hitting the wall (which compacts once more and
    # retries): summarizing the same messages again was a second row under the same key.
    windowed.server.add_faults([{"kind": "summary", **CONTEXT_REFUSAL, "times": 100}])
    result = windowed.start("--json", "--max-context-tokens", "2600")
    assert result.code == 1, result.stderr
    out = result.json()
    assert (out["status"], out["stop_reason"]) == ("failed", "model_error")
    assert "the summary request was refused as too long" in out["error"], out["error"]
    assert "IntegrityError" not in result.stderr + out["error"]
    assert (
        sum(r["kind"] == "summary" for r in windowed.server.requests) == 1
    )  # not summarized twice
    for _ in range(
        2
    ):  # each resume tries once more (the provider may have changed), and stops the same way
        again = windowed.resume(out["run_id"], "--json")
        assert again.code == 1, again.stderr
        assert "the summary request was refused as too long" in again.json()["error"]
    assert sum(r["kind"] == "summary" for r in windowed.server.requests) == 3
    keys = [
        k
        for (k,) in sql(
            "SELECT idempotency_key FROM steps WHERE kind = 'compact' AND state = 'failed'"
        )
    ]
    assert len(keys) == len(set(keys)) == 1  # one row, tried three times
    assert sql("SELECT attempts FROM steps WHERE kind = 'compact' AND state = 'failed'") == [(3,)]
    windowed.server.clear_faults()
    done = windowed.resume(out["run_id"], "--json")
    assert done.code == 0, done.stderr
    assert done.json()["answer"] == "read them all"


@pytest.mark.parametrize("windowed", [12], indirect=True)
@pytest.mark.parametrize(
    "answer",
    [
        {"message": {"role": "assistant", "content": "HUGE summary text. " * 20_000}},
        {
            "message": {"role": "assistant", "content": "a summary that was cut " * 50},
            "finish_reason": "length",
        },
        {"message": {"role": "assistant", "content": ""}},
        {
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "x",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": "{}"},
                    }
                ],
            }
        },
    ],
    ids=["huge", "length", "empty", "tool-calls"],
)
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_an_odd_summary_answer_keeps_the_requests_under_the_budget_and_what_was_dropped_findable(
    windowed: Endpoint, sql: Callable[..., list[Any]], answer: dict[str, Any]
) -> None:
    windowed.server.add_faults([{"kind": "summary", **answer, "times": 100}])
    result = windowed.start("--json", "--max-context-tokens", "2600")
    assert result.code == 0, result.stderr
    turns = [r["prompt_tokens"] for r in windowed.server.requests if r["kind"] == "turn"]
    assert len(turns) == 13 and max(turns) <= 2600  # a 380 KB summary once sent 96k tokens
    summaries = [o["summary"] for _, o in outputs(sql, "compact") if o["stage"] == "summarize"]
    assert summaries
    for text in summaries:
        assert (
            len(text) <= 0.15 * 2600 * 6
        )  # its share of the budget (a token is rarely over 6 characters)
        if "huge" in json.dumps(answer).lower():
            assert text.endswith("[summary cut: it was longer than its share of the context]")
        elif answer.get("finish_reason") == "length":
            assert "[the summary was cut off at the model's length limit]" in text
        else:  # nothing usable came: the dropped results can still be read again, by id
            assert (
                text.startswith("(the summary came back empty)")
                or "(the summary came back empty)" in text
            )
            assert "read_output(call_id), newest first: call_" in text


@pytest.mark.parametrize("windowed", [8], indirect=True)
def test_results_larger_than_the_budget_do_not_pay_a_summary_every_turn(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # Each turn reads 16 KB (~4k tokens) under a 2,000-token budget (output_cap lets that
    # through): the newest result alone passes it, so no summary can bring a request under.
    # Summarizing the little before it each turn (5 calls in 7 turns, 1% smaller each) gives
    # way to eliding, which is free; the provider's window (larger here) is the judge.
    write_files(windowed.workspace, 8, size=16_384)
    result = windowed.start("--json", "--max-context-tokens", "2000")
    assert result.code == 0, result.stderr
    assert result.json()["answer"] == "read them all"
    assert sum(r["kind"] == "summary" for r in windowed.server.requests) == 0
    assert (
        sum(o["stage"] == "elide" for _, o in outputs(sql, "compact")) >= 5
    )  # the free stage still runs


@pytest.mark.slow
@pytest.mark.parametrize("windowed", [8], indirect=True)
def test_a_resume_after_an_elide_that_no_summary_could_help_decides_the_same(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    # The elide of such a turn says a summary may follow; the resume must weigh it the same
    # way the first session did (none), not pay for one the uninterrupted run never made.
    write_files(windowed.workspace, 8, size=16_384)
    whole = windowed.start("--json", "--max-context-tokens", "2000", "--run-id", "whole")
    assert whole.code == 0, whole.stderr
    second_elide = [t for t, o in outputs(sql, "compact") if o["stage"] == "elide"][1]
    windowed.configure(retry_max_attempts=1, models={MODEL: {"context_window": WINDOW}})
    windowed.server.add_faults([{"turn": second_elide, "status": 401}])
    before = len(windowed.server.requests)
    assert windowed.start("--json", "--max-context-tokens", "2000", "--run-id", "cut").code == 1
    assert windowed.resume("cut", "--json").code == 0
    stages = {
        rid: [(t, json.loads(o)["stage"]) for r, t, o in rows if r == rid]
        for rows in [
            sql(
                "SELECT run_id, turn, output FROM steps WHERE kind = 'compact' "
                "AND state = 'completed' ORDER BY seq"
            )
        ]
        for rid in ("whole", "cut")
    }
    assert stages["cut"] == stages["whole"]
    assert not any(r["kind"] == "summary" for r in windowed.server.requests[before:])


@pytest.mark.slow
@pytest.mark.parametrize("windowed", [40], indirect=True)
def test_empty_summaries_again_and_again_still_name_every_result_they_replaced(
    windowed: Endpoint, sql: Callable[..., list[Any]]
) -> None:
    windowed.server.add_faults(
        [{"kind": "summary", "message": {"role": "assistant", "content": ""}, "times": 1000}]
    )
    result = windowed.start("--json", "--max-context-tokens", "2600")
    assert result.code == 0, result.stderr
    summaries = [o for _, o in outputs(sql, "compact") if o["stage"] == "summarize"]
    assert len(summaries) > 2
    last = summaries[-1]
    replaced = [
        i
        for (i,) in sql(
            "SELECT tool_call_id FROM messages WHERE role = 'tool' AND seq < ?", last["start"]
        )
    ]
    assert replaced and all(i in last["summary"] for i in replaced), last["summary"]
    assert last["summary"].count("(the summary came back empty)") == 1  # not nested


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_compact_by_hand_pays_no_summary_that_would_not_shrink_the_request(
    cli: Callable[..., Any],
    env: dict[str, str],
    workspace: Path,
    tmp_path: Path,
    sql: Callable[..., list[Any]],
) -> None:
    """A small context: the older turns hold fewer tokens than a summary takes. `compact`
    made it bigger (~1,060 → ~1,089) and paid a call for it; now it says so and calls nothing."""
    reads = []
    for name in "abcd":  # a.txt is elided (free), then what is left to summarize is small
        (workspace / f"{name}.txt").write_text(f"{name}\n" * (3000 if name == "a" else 1))
        reads.append({"tool_calls": [{"name": "read_file", "arguments": {"path": f"{name}.txt"}}]})
    with FakeOpenAI(script=[*reads, {"content": "done"}], window=WINDOW) as server:
        endpoint = Endpoint(cli, server, env, workspace, tmp_path / "config.toml")
        endpoint.configure(keep_recent_outputs=0, models={MODEL: {"context_window": WINDOW}})
        first = endpoint.start("--json", "--max-steps", "4", "--run-id", "small")
        assert first.code == 3, first.stderr
        done = endpoint.cli("compact", "small", extra_env=endpoint.cli_env())
        assert done.code == 0, done.stderr
        assert "context compacted in 1 step(s)" in done.stdout, done.stdout  # the elide
        assert "no summary made" in done.stdout and "no model call was paid" in done.stdout
        assert [r["kind"] for r in server.requests].count("summary") == 0
        assert [o["stage"] for _, o in outputs(sql, "compact")] == ["elide"]
        again = endpoint.resume("small", "--json", "--max-steps", "10")
        assert again.code == 0, again.stderr
        assert [r["kind"] for r in server.requests].count("summary") == 0  # nor on resume


def raw_call(call_id: str, path: str) -> dict[str, Any]:
    """An assistant message as a provider sends it, with this tool-call id."""
    arguments = json.dumps({"path": path})
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "read_file", "arguments": arguments},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


@pytest.mark.slow
@pytest.mark.parametrize("windowed", [40], indirect=True)
def test_call_ids_with_a_nul_after_a_compacted_resume_are_looked_up_as_stored(
    windowed: Endpoint, store_url: str
) -> None:
    """A resume of a compacted run looks a new call's id up among the results it did not
    read (model_step._call_ids, `Journal.answered_before`): a provider's id with a NUL in it
    (JSON "\\u0000") is looked up as the store holds it, not as sent (PostgreSQL refuses a
    NUL in a statement's text: the resumed run failed on it). And an id that is a NUL id's
    stored spelling is a reused id, given another (it was kept: two calls with one id)."""
    from sqlalchemy import select

    from durable_agent.loop import turns
    from durable_agent.loop.replay import rebuild
    from durable_agent.messages import HEAD
    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.journal import Journal
    from durable_agent.store.rows import message_from_row
    from durable_agent.store.schema import messages

    window = 6000
    windowed.server.window = window
    windowed.configure(keep_recent_outputs=1, models={MODEL: {"context_window": window}})
    windowed.env["DURABLE_AGENT_DB"] = store_url
    first = windowed.start("--json", "--max-steps", "25", "--run-id", "ids")
    assert first.code == 3, first.stderr
    engine = open_store_engine(store_url)
    assert Journal(engine, "ids", "nobody", 0, 30).load().older.start > HEAD  # compacted
    # The fake takes a call's turn from ids shaped call_T_i: the two odd ids are both its 25.
    windowed.server.add_faults(
        [
            {"turn": 25, "message": raw_call("x\u0000y", "f000.txt")},
            {"turn": 25, "message": raw_call("x\\x00y", "f001.txt")},
        ]
    )
    done = windowed.resume("ids", "--json", "--max-steps", "100")
    assert done.code == 0, done.stderr
    with engine.connect() as conn:
        every = [
            message_from_row(r)
            for r in conn.execute(
                select(messages).where(messages.c.run_id == "ids").order_by(messages.c.seq)
            )
        ]
    ids = [c.id for m in every for c in m.tool_calls]
    assert "x\\x00y" in ids and len(ids) == len(set(ids))  # stored as storable; none twice
    assert {m.tool_call_id for m in every if m.role == "tool"} == set(ids)
    loaded = Journal(engine, "ids", "nobody", 0, 30).load()
    states = [
        rebuild(
            "ids",
            history,
            active_ms=0,
            model_tokens=loaded.model_tokens,
            compactions=loaded.compactions,
            window=turns.window_of(loaded.user_turns),
            older=older,
        )
        for history, older in ((loaded.messages, loaded.older), (every, None))
    ]
    part, whole = states
    for name in ("step_count", "tool_call_count", "last_fingerprint", "repeat_streak"):
        assert getattr(part, name) == getattr(whole, name), name
    assert part.request() == whole.request()
    engine.dispose()
