"""The loop through the real CLI with scripted models: budgets, observations, exit codes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from side_effects_support import assert_history_valid

WRITE = {
    "tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "hello\n"}}]
}
DONE = {"content": "all done"}


def read(path: str, **extra: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": "read_file", "arguments": {"path": path, **extra}}]}


def model_steps(sql, run_id: str) -> int:  # type: ignore[no-untyped-def]
    return sql("SELECT COUNT(*) FROM steps WHERE run_id=? AND kind='model'", run_id)[0][0]


def history_is_valid(sql, run_id: str) -> None:  # type: ignore[no-untyped-def]
    """Every assistant tool call has exactly one tool result before the next model call."""
    db = sql("PRAGMA database_list")[0][2]
    assert_history_valid(Path(db), run_id)


def test_completed_run_prints_id_first_answer_on_stdout(
    cli_inproc, write_script, workspace, sql
) -> None:
    r = cli_inproc(
        "start", "write a file", "--model", write_script([WRITE, DONE]), "--run-id", "r1"
    )
    assert r.code == 0
    assert r.stdout.strip() == "all done"
    assert r.stderr.splitlines()[0].startswith("run r1")
    assert "Step 0" in r.stderr and "write_file" in r.stderr
    assert (workspace / "out.txt").read_text() == "hello\n"
    status, reason, steps, tools = sql(
        "SELECT status, stop_reason, step_count, tool_call_count FROM runs"
    )[0]
    assert (status, reason, steps, tools) == ("completed", "finished", 2, 1)
    history_is_valid(sql, "r1")


def test_json_output_is_one_object(cli_inproc, write_script) -> None:
    r = cli_inproc("start", "t", "--model", write_script([WRITE, DONE]), "--json")
    assert r.code == 0
    doc = json.loads(r.stdout)
    for key in (
        "run_id",
        "status",
        "stop_reason",
        "answer",
        "steps",
        "tool_calls",
        "prompt_tokens",
        "completion_tokens",
        "duration_ms",
    ):
        assert key in doc
    assert doc["status"] == "completed" and doc["steps"] == 2 and doc["tool_calls"] == 1
    assert doc["prompt_tokens"] > 0 and doc["completion_tokens"] > 0


def test_max_steps_allows_exactly_that_many_model_calls_and_resume_raises_it(
    cli_inproc, write_script, sql
) -> None:
    script = write_script([read("a.txt"), read("b.txt"), read("c.txt"), DONE])
    r = cli_inproc("start", "t", "--model", script, "--max-steps", "2", "--run-id", "ms")
    assert r.code == 3
    assert model_steps(sql, "ms") == 2
    assert sql("SELECT status, stop_reason FROM runs")[0] == ("budget_exceeded", "max_steps")
    history_is_valid(sql, "ms")
    again = cli_inproc("resume", "ms")  # same budget: stops before any new call
    assert again.code == 3 and model_steps(sql, "ms") == 2
    raised = cli_inproc("resume", "ms", "--max-steps", "10")
    assert raised.code == 0, raised.stderr
    assert model_steps(sql, "ms") == 4
    assert sql("SELECT step_count, tool_call_count FROM runs")[0] == (4, 3)


def test_max_tool_calls_and_max_tokens(cli_inproc, write_script, sql) -> None:
    script = write_script([read("a"), read("b"), read("c"), DONE])
    assert (
        cli_inproc("start", "t", "--model", script, "--max-tool-calls", "2", "--run-id", "tc").code
        == 3
    )
    assert sql("SELECT stop_reason, tool_call_count FROM runs WHERE id='tc'")[0] == (
        "max_tool_calls",
        2,
    )
    assert (
        cli_inproc("start", "t", "--model", script, "--max-tokens", "30", "--run-id", "tk").code
        == 3
    )
    reason, p, c = sql(
        "SELECT stop_reason, prompt_tokens, completion_tokens FROM runs WHERE id='tk'"
    )[0]
    assert reason == "max_tokens" and p + c >= 30
    assert model_steps(sql, "tk") < 4


def test_repeated_action_stops_before_the_extra_call_and_is_resumable(
    cli_inproc, write_script, sql, workspace
) -> None:
    (workspace / "a.txt").write_text("x")
    same = {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt", "offset": 0}}]}
    same_reordered = {
        "tool_calls": [{"name": "read_file", "arguments": {"offset": 0, "path": "a.txt"}}]
    }
    script = write_script([same, same_reordered, same, same, DONE])
    r = cli_inproc("start", "t", "--model", script, "--run-id", "rep", "--max-repeats", "3")
    assert r.code == 3
    assert sql("SELECT status, stop_reason FROM runs")[0] == ("budget_exceeded", "repeated_action")
    assert sql("SELECT COUNT(*) FROM steps WHERE kind='tool'")[0][0] == 3
    assert cli_inproc("resume", "rep", "--max-repeats", "4").code == 0
    assert sql("SELECT COUNT(*) FROM steps WHERE kind='tool'")[0][0] == 4


def test_bad_calls_are_observations_and_the_loop_goes_on(cli_inproc, write_script, sql) -> None:
    script = write_script(
        [
            {"tool_calls": [{"name": "no_such_tool", "arguments": {}}]},
            {"tool_calls": [{"name": "read_file", "arguments": "{not json"}]},
            {"tool_calls": [{"name": "read_file", "arguments": {"offset": 3}}]},
            read("missing.txt"),
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "../../etc/passwd"}}]},
            DONE,
        ]
    )
    r = cli_inproc("start", "t", "--model", script, "--run-id", "obs")
    assert r.code == 0
    results = [c for (c,) in sql("SELECT content FROM messages WHERE role='tool' ORDER BY seq")]
    assert len(results) == 5
    assert "unknown tool 'no_such_tool'" in results[0]
    assert "not valid JSON" in results[1]
    assert "path" in results[2] and "Field required" in results[2]
    assert "file not found" in results[3]
    assert "outside the workspace" in results[4]
    assert all(c.startswith("Error:") for c in results)
    assert sql("SELECT COUNT(*) FROM steps WHERE kind='tool' AND state='failed'")[0][0] == 5
    history_is_valid(sql, "obs")


def test_each_message_is_stored_once(cli_inproc, write_script, sql) -> None:
    script = write_script([read("a"), read("b"), read("c"), DONE])
    cli_inproc("start", "t", "--model", script, "--run-id", "once")
    count, stored = sql("SELECT message_count, (SELECT COUNT(*) FROM messages) FROM runs")[0]
    # system + task + 4 assistant + 3 tool results, no copies
    assert count == stored == 9
    assert sql("SELECT COUNT(DISTINCT seq) FROM messages")[0][0] == 9


def test_duplicate_provider_call_ids_are_replaced(cli_inproc, write_script, sql) -> None:
    two = {
        "tool_calls": [
            {"name": "list_files", "arguments": {}},
            {"name": "list_files", "arguments": {"path": "."}},
        ]
    }
    cli_inproc("start", "t", "--model", write_script([two, two, DONE]), "--run-id", "ids")
    ids = [r[0] for r in sql("SELECT call_id FROM steps WHERE kind='tool'")]
    assert len(ids) == len(set(ids)) == 4


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["resume", "nope"], "no run with id 'nope'"),
        (["show", "nope"], "no run with id 'nope'"),
        (["start", "t"], "OPENAI_API_KEY"),
        (["start", "t", "--model", "gpt-4.1-mini"], "OPENAI_API_KEY"),
        (["start", "t", "--model", "scripted:/no/such/file.json"], "script file not found"),
        (["start", "t", "--model", "demo", "--max-steps", "0"], "max_steps"),
        (
            ["start", "t", "--model", "demo", "--workspace", "/no/such/dir"],
            "workspace is not a directory",
        ),
        (["start", "t", "--model", "demo", "--run-id", "bad id!"], "--run-id"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(cli_inproc, args, needle) -> None:
    r = cli_inproc(*args)
    assert r.code == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("arguments", "kind"), [("[1,2]", "a list"), ("3", "a number"), ('"x"', "a string")]
)
def test_valid_json_that_is_not_an_object_is_not_called_invalid_json(
    cli_inproc, write_script, sql, arguments: str, kind: str
) -> None:
    script = write_script([{"tool_calls": [{"name": "read_file", "arguments": arguments}]}, DONE])
    assert cli_inproc("start", "t", "--model", script).code == 0
    ((result,),) = sql("SELECT content FROM messages WHERE role='tool'")
    assert f"arguments must be a JSON object, not {kind}" in result
    assert "not valid JSON" not in result


def test_search_text_says_which_files_it_skipped_as_too_big(
    cli_inproc, write_script, sql, workspace
) -> None:
    (workspace / "big.log").write_text("needle\n" + "x" * 2_100_000)
    (workspace / "small.txt").write_text("hay\n")
    script = write_script(
        [{"tool_calls": [{"name": "search_text", "arguments": {"pattern": "needle"}}]}, DONE]
    )
    assert cli_inproc("start", "t", "--model", script).code == 0
    ((result,),) = sql("SELECT content FROM messages WHERE role='tool'")
    assert result.startswith("no matches")
    assert "1 file(s) not searched: larger than the 2 MB search limit (big.log)" in result


def test_bad_flag_exits_2(cli) -> None:
    r = cli("start", "t", "--max-steps", "many")
    assert r.code == 2 and "invalid int value" in r.stderr


def test_unreadable_script_is_a_clear_error(cli_inproc, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = cli_inproc("start", "t", "--model", f"scripted:{bad}")
    assert r.code == 2 and "not valid JSON" in r.stderr


@pytest.mark.parametrize(
    ("script", "problem"),
    [
        ([DONE, {"content": 42}], 'turn 1 has a "content" that is a number, not text'),
        (
            [{"tool_calls": {"name": "read_file"}}],
            'turn 0 has "tool_calls" that is an object, not a list',
        ),
        (
            [{"tool_calls": [{"name": "read_file", "arguments": [1]}]}],
            'turn 0 has a tool call (0) whose "arguments"',
        ),
        ([DONE, DONE, "done"], "turn 2 must be an object, not a string"),
        ([{"content": "x", "delay_s": "soon"}], 'turn 0 has a "delay_s" that is a string'),
        ({"content": "x"}, "must be a JSON list of turns, not an object"),
        ([DONE, {"content": "x", "contnet": "y"}], 'turn 1 has an unknown key "contnet"'),
        (
            [{"tool_calls": [{"name": "read_file", "argumnets": {"path": "a"}}]}],
            'turn 0 has a tool call (0) with an unknown key "argumnets"',
        ),
        ([], "has no turns: give at least one"),
    ],
)
def test_a_wrong_script_is_refused_when_loaded_with_the_turn(
    cli_inproc, tmp_path: Path, sql, script: object, problem: str
) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(script))
    r = cli_inproc("start", "t", "--model", f"scripted:{path}")
    assert r.code == 2, r.stderr
    assert problem in r.stderr and "may be a bug" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1  # one line, no traceback


def test_resume_of_a_completed_run_exits_2(cli_inproc, write_script) -> None:
    assert cli_inproc("start", "t", "--model", write_script([DONE]), "--run-id", "c1").code == 0
    r = cli_inproc("resume", "c1")
    assert r.code == 2 and "completed; nothing to resume" in r.stderr


def test_a_resume_that_looked_before_the_run_completed_neither_takes_nor_reopens_it(
    cli_inproc, write_script, env, sql, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # `resume` read the run as running, then its owner finished it; the lease was taken all
    # the same: the completed run was set running again, replayed, and its settings changed.
    from durable_agent.store.runs import Store

    assert (
        cli_inproc("start", "t", "--model", write_script([read("a"), DONE]), "--run-id", "R").code
        == 0
    )
    before = sql(
        "SELECT status, stop_reason, lease_epoch, finished_at, settings, resume_count FROM runs"
    )
    real = Store.get_run

    def seen_before_it_completed(self, run_id):  # type: ignore[no-untyped-def]
        from msgspec.structs import replace

        return replace(real(self, run_id), status="running")

    monkeypatch.setattr(Store, "get_run", seen_before_it_completed)
    r = cli_inproc("resume", "R", "--max-steps", "1")
    assert r.code == 2 and "run R is completed; nothing to resume" in r.stderr, r.stderr
    assert (
        sql(
            "SELECT status, stop_reason, lease_epoch, finished_at, settings, resume_count FROM runs"
        )
        == before
    )


def test_compact_puts_back_the_status_the_run_has_under_its_lease_not_the_one_it_read_before(
    cli_inproc, write_script, sql, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # Another session ended between `compact`'s read and its lease (blocked, an approval
    # pending); compact then wrote back the status it had read first: budget_exceeded.
    import sqlite3

    from durable_agent.store.runs import Store

    assert (
        cli_inproc(
            "start",
            "t",
            "--model",
            write_script([read("a"), DONE]),
            "--run-id",
            "C",
            "--max-steps",
            "1",
        ).code
        == 3
    )
    real = Store.take_over

    def another_session_first(self, run_id, owner, lease_seconds, **kw):  # type: ignore[no-untyped-def]
        db = sqlite3.connect(self.engine.url.database)
        db.execute(
            "UPDATE runs SET status = 'blocked', stop_reason = 'approval_required' WHERE id = ?",
            (run_id,),
        )
        db.commit()
        db.close()
        return real(self, run_id, owner, lease_seconds, **kw)

    monkeypatch.setattr(Store, "take_over", another_session_first)
    assert cli_inproc("compact", "C").code == 0
    assert sql("SELECT status, stop_reason FROM runs") == [("blocked", "approval_required")]


def test_resume_json_of_a_run_another_live_process_holds_is_one_object(
    cli_inproc, write_script, env
) -> None:  # type: ignore[no-untyped-def]
    from durable_agent.store import leases
    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.runs import Store

    cli_inproc(
        "start",
        "t",
        "--model",
        write_script([read("a"), DONE]),
        "--run-id",
        "J",
        "--max-steps",
        "1",
    )
    store = Store(open_store_engine(env["DURABLE_AGENT_DB"]))
    store.acquire_lease("J", leases.new_owner(), 60)  # this test process is alive
    r = cli_inproc("resume", "J", "--json")
    store.engine.dispose()
    assert r.code == 6, r.stderr
    out = json.loads(r.stdout)  # stdout held nothing
    assert out["run_id"] == "J" and out["status"] is None and "another live process" in out["error"]


def test_live_lease_makes_resume_exit_6_and_a_dead_owner_is_taken_over(
    cli_inproc, write_script, env, sql
) -> None:
    from durable_agent.store import leases
    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.runs import Store

    cli_inproc(
        "start",
        "t",
        "--model",
        write_script([read("a"), DONE]),
        "--run-id",
        "L",
        "--max-steps",
        "1",
    )
    store = Store(open_store_engine(env["DURABLE_AGENT_DB"]))
    store.acquire_lease("L", leases.new_owner(), 60)  # this test process is alive
    r = cli_inproc("resume", "L", "--max-steps", "5")
    assert r.code == 6 and "another live process" in r.stderr
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.engine.dispose()
    from sqlalchemy import text

    from durable_agent.store.leases import _pid_space

    def owned_by(owner: str) -> None:
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE runs SET lease_owner=:o WHERE id='L'"), {"o": owner})

    # Without its pid's space (an owner of another PID namespace, or written before it was
    # recorded) a missing pid proves nothing: the lease is left to expire.
    owned_by(f"{socket.gethostname()}:{dead.pid}:gone")
    assert cli_inproc("resume", "L", "--max-steps", "5").code == 6
    owned_by(f"{socket.gethostname()}:{dead.pid}:gone-{_pid_space()}")
    r = cli_inproc("resume", "L", "--max-steps", "5")
    assert r.code == 0, r.stderr
    epochs = sorted({e for (e,) in sql("SELECT lease_epoch FROM steps WHERE run_id='L'")})
    assert len(epochs) == 2  # first session's steps, then the takeover's


@pytest.mark.slow  # over 2 s on 2 cores
def test_cancel_a_pending_run_and_a_live_one(cli, write_script, env, sql) -> None:
    r = cli("start", "t", "--model", write_script([DONE]), "--detach")
    run_id = r.stdout.strip()
    assert cli("cancel", run_id).code == 0
    assert sql("SELECT status FROM runs WHERE id=?", run_id)[0][0] == "cancelled"

    slow = write_script([{"delay_s": 0.3, **read("a")}] * 200)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "durable_agent",
            "start",
            "t",
            "--model",
            slow,
            "--run-id",
            "live",
            "--max-repeats",
            "1000",
            "--quiet",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = (
            sql("SELECT step_count FROM runs WHERE id='live'")
            if Path(env["DURABLE_AGENT_DB"][10:]).exists()
            else []
        )
        if rows and rows[0][0] >= 1:
            break
        time.sleep(0.05)
    assert cli("cancel", "live").stdout.startswith("cancellation requested")
    assert proc.wait(timeout=30) == 4
    status, reason, steps = sql("SELECT status, stop_reason, step_count FROM runs WHERE id='live'")[
        0
    ]
    assert (status, reason) == ("cancelled", "cancelled") and steps < 200
    history_is_valid(sql, "live")


@pytest.mark.slow
def test_max_seconds_counts_active_time_across_resumes(cli_inproc, write_script, sql) -> None:
    # Wide margins: a loaded machine may spend a good part of a second before the first call.
    slow = {"delay_s": 0.5, **read("a")}
    script = write_script(
        [
            slow,
            dict(slow, tool_calls=[{"name": "read_file", "arguments": {"path": "b"}}]),
            slow,
            slow,
            slow,
            DONE,
        ]
    )
    r = cli_inproc(
        "start",
        "t",
        "--model",
        script,
        "--max-seconds",
        "1.2",
        "--run-id",
        "secs",
        "--max-repeats",
        "9",
    )
    assert r.code == 3
    reason, steps, active = sql("SELECT stop_reason, step_count, active_ms FROM runs")[0]
    assert reason == "max_seconds" and 1 <= steps < 6 and active >= 1200
    again = cli_inproc("resume", "secs")  # the time already spent still counts
    assert again.code == 3 and sql("SELECT step_count FROM runs")[0][0] == steps
    assert cli_inproc("resume", "secs", "--max-seconds", "60").code == 0


def test_run_ids_can_be_abbreviated_unless_ambiguous(cli_inproc, write_script) -> None:
    script = write_script([DONE])
    cli_inproc("start", "t", "--model", script, "--run-id", "abc-one")
    cli_inproc("start", "t", "--model", script, "--run-id", "abc-two")
    assert cli_inproc("show", "abc-o").stdout.count("abc-one") >= 1
    r = cli_inproc("show", "abc")
    assert r.code == 2 and "ambiguous" in r.stderr and "abc-one" in r.stderr


def test_a_tool_that_raises_is_an_observation_not_a_crash(
    cli_inproc, write_script, workspace, sql
) -> None:
    from typing import ClassVar

    from pydantic import BaseModel

    from durable_agent import tools as registry
    from durable_agent.status import EffectClass

    class NoArgs(BaseModel):
        pass

    class Broken:
        name: ClassVar[str] = "broken"
        description: ClassVar[str] = "always fails"
        args_model: ClassVar[type[BaseModel]] = NoArgs
        effect: ClassVar[EffectClass] = EffectClass.READ

        def run(self, args: NoArgs, ctx: object) -> None:
            raise RuntimeError("boom inside the tool")

    (workspace / "a.txt").write_text("a file, not a folder\n")
    registry.register_tool(Broken())
    try:
        script = write_script(
            [
                {"tool_calls": [{"name": "broken", "arguments": {}}]},
                {
                    "tool_calls": [
                        {"name": "write_file", "arguments": {"path": "a.txt/x", "content": "x"}}
                    ]
                },
                DONE,
            ]
        )
        r = cli_inproc("start", "t", "--model", script, "--run-id", "boom")
    finally:
        registry._custom.pop("broken", None)
    assert r.code == 0, r.stderr
    results = [c for (c,) in sql("SELECT content FROM messages WHERE role='tool' ORDER BY seq")]
    assert results[0] == "Error: RuntimeError: boom inside the tool"
    assert results[1].startswith("Error:") and "a.txt" in results[1]
    assert (workspace / "a.txt").read_text() == "a file, not a folder\n"


def test_arguments_nested_past_pythons_recursion_limit_are_an_error_the_model_sees(
    cli, write_script, sql
) -> None:  # type: ignore[no-untyped-def]
    # json.loads raises RecursionError, not ValueError, for a value nested ~1,000 deep: the
    # run ended "failed (tool_error): unexpected RecursionError".
    deep = "[" * 100_000 + "]" * 100_000
    script = write_script(
        [
            {
                "tool_calls": [
                    {
                        "name": "write_file",
                        "arguments": '{"path": "a.txt", "content": "x", "n": ' + deep + "}",
                    }
                ]
            },
            {"content": "done"},
        ]
    )
    r = cli("start", "t", "--model", script, "--run-id", "deep")
    assert r.code == 0, r.stderr
    (error,) = sql("SELECT error FROM steps WHERE run_id = 'deep' AND kind = 'tool'")[0]
    assert error == "invalid arguments for write_file: arguments nest more than 100 levels deep"
