"""What users plug in or write by hand, done wrong: tools that return the wrong thing, exit
the process or raise the package's own errors; tool definitions an endpoint would refuse;
run ids that would name a folder outside a worker's root; config files of the wrong shape.
Each must end in an honest record or one line, never a run that can never finish."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from durable_agent import Agent, EffectClass, ToolContext, ToolResult
from durable_agent.errors import ConfigError, RunNotFound, UsageError


class NoArgs(BaseModel):
    pass


def _tool(name: str, returns: Callable[[], Any], effect: EffectClass = EffectClass.READ) -> Any:
    class Odd:
        args_model: ClassVar[type[BaseModel]] = NoArgs
        description: ClassVar[str] = "odd"

        def run(self, args: NoArgs, ctx: ToolContext) -> Any:
            return returns()

    tool = Odd()
    tool.name = name  # type: ignore[attr-defined]
    tool.effect = effect  # type: ignore[attr-defined]
    return tool


def _exit() -> Any:
    sys.exit(0)


def _own_error() -> Any:
    raise RunNotFound("other")


def _deep() -> dict[str, Any]:
    data: dict[str, Any] = {}
    for _ in range(5000):
        data = {"d": data}
    return data


ODD = {
    "none": lambda: None,
    "text": lambda: "just text",
    "number_output": lambda: ToolResult(output=123),  # type: ignore[arg-type]
    "tuple_keys": lambda: ToolResult(output="ok", data={(1, 2): "x"}),  # type: ignore[dict-item]
    "deep_data": lambda: ToolResult(output="ok", data=_deep()),
    "exits": _exit,
    "own_error": _own_error,
}


@pytest.mark.parametrize("effect", [EffectClass.READ, EffectClass.EXEC])
def test_a_tool_answering_wrongly_is_an_error_observation_and_the_run_finishes(
    tmp_path: Path,
    workspace: Path,
    env: dict[str, str],
    write_script: Callable[..., str],
    effect: EffectClass,
) -> None:
    # Each of these failed the run at recording time (or, sys.exit, ended the process "with
    # success"), with no step recorded: every resume ran the tool again to the same end.
    tools = [_tool(name, fn, effect) for name, fn in ODD.items()]
    turns = [{"tool_calls": [{"name": name, "arguments": {}}]} for name in ODD] + [
        {"content": "done"}
    ]
    db = tmp_path / "odd.db"
    agent = Agent(
        model=write_script(turns),
        workspace=workspace,
        db=f"sqlite:///{db}",
        tools=tools,
        shell="allow",
        env=env,
    )
    outcome = agent.start("call the odd tools")
    assert (outcome.status, outcome.answer) == ("completed", "done"), outcome
    rows = (
        sqlite3.connect(db)
        .execute(
            "SELECT tool_name, state, error, output FROM steps WHERE kind = 'tool' ORDER BY seq"
        )
        .fetchall()
    )
    by_name = {r[0]: r for r in rows}
    assert set(by_name) == set(ODD)
    for name in ("none", "text", "number_output", "exits", "own_error"):
        assert by_name[name][1] == "failed" and by_name[name][2], by_name[name]
    assert "sys.exit(0)" in by_name["exits"][2] and "RunNotFound" in by_name["own_error"][2]
    for name in (
        "tuple_keys",
        "deep_data",
    ):  # the answer stands; the data that cannot be stored goes
        assert by_name[name][1] == "completed" and "data_dropped" in by_name[name][3], by_name[name]


def _defined(**attrs: Any) -> Any:
    class Defined:
        name: ClassVar[Any] = "fine"
        description: ClassVar[Any] = "a tool"
        args_model: ClassVar[Any] = NoArgs
        effect: ClassVar[Any] = EffectClass.READ

        def run(self, args: NoArgs, ctx: ToolContext) -> ToolResult:
            return ToolResult(output="ok")

    tool = Defined()
    for key, value in attrs.items():
        setattr(tool, key, value)
    return tool


class Unschemable(BaseModel):
    hook: Callable[[], None]


@pytest.mark.parametrize(
    "attrs, said",
    [
        ({"name": "bad name!"}, "is not 1 to 64 letters"),
        ({"name": "x" * 65}, "is not 1 to 64 letters"),
        ({"name": 42}, "is not 1 to 64 letters"),
        ({"description": None}, "no description"),
        ({"effect": "exec"}, "not EffectClass"),
        ({"args_model": dict}, "not a pydantic model"),
        ({"args_model": Unschemable}, "without a JSON schema"),
    ],
)
def test_a_tool_an_endpoint_could_not_take_is_refused_in_one_line(
    tmp_path: Path, workspace: Path, env: dict[str, str], attrs: dict[str, Any], said: str
) -> None:
    with pytest.raises(ConfigError, match=said) as refused:
        Agent(
            model="scripted:/dev/null",
            workspace=workspace,
            db=f"sqlite:///{tmp_path / 'x.db'}",
            tools=[_defined(**attrs)],
            env=env,
        ).start("t")
    assert "\n" not in str(refused.value)


def test_two_tools_of_one_name_from_one_source_are_refused(
    tmp_path: Path, workspace: Path, env: dict[str, str]
) -> None:
    # The last one silently won: a read tool replaced by an exec tool of the same name.
    with pytest.raises(ConfigError, match="two tools are named 'fine'"):
        Agent(
            model="scripted:/dev/null",
            workspace=workspace,
            db=f"sqlite:///{tmp_path / 'x.db'}",
            tools=[_defined(), _defined(effect=EffectClass.EXEC)],
            env=env,
        ).start("t")


@pytest.mark.slow  # a CLI process for each id
@pytest.mark.parametrize(
    "run_id", ["..", ".", "-x", "a/b", "../../x", "a\x00b", "a\udcffb", "", "x" * 65]
)
def test_a_run_id_that_is_no_folder_name_of_its_own_is_refused(
    tmp_path: Path,
    workspace: Path,
    env: dict[str, str],
    run_id: str,
    write_script: Callable[..., str],
) -> None:
    # `..` ran a worker's run in the parent of --workspace-root, and restored it there.
    db = f"sqlite:///{tmp_path / 'ids.db'}"
    agent = Agent(model=write_script([{"content": "done"}]), workspace=workspace, db=db, env=env)
    with pytest.raises(UsageError, match="invalid run id"):
        agent.start("t", run_id=run_id)
    if "\x00" not in run_id and "\udcff" not in run_id:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "durable_agent",
                "start",
                "t",
                f"--run-id={run_id}",
                "--model",
                "scripted:/nonexistent",
                "--db",
                db,
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=workspace,
            check=False,
        )
        assert (
            proc.returncode == 2
            and "--run-id takes" in proc.stderr
            and proc.stderr.count("\n") == 1
        )


def _config(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return {"DURABLE_AGENT_CONFIG": str(path)}


START = ("start", "t", "--model", "scripted:/nonexistent")


@pytest.mark.slow  # CLI processes
@pytest.mark.parametrize(
    "text, said, commands",
    [
        ("db = 5\n", "db must be text", [("list",), START]),
        ('db = ["a"]\n', "db must be text", [("list",), START]),
        ("workspace = 5\n", "workspace must be text", [START]),
        ("durable-agent = 5\n", "must be a table", [("list",), START]),
        ("mcp_servers = 5\n", "mcp_servers must be a table", [START]),  # (list needs no servers)
        (
            'max_steps = 1\n[durable-agent]\nshell = "allow"\n',
            "both beside and inside",
            [("list",), START],
        ),
        ("max_steps = true\n", "must be a number, not true or false", [START]),  # was taken as 1
        ("store_retry_attempts = true\n", "must be a number", [("list",), START]),
        (
            "lease_seconds = 0.001\n",
            "lease_seconds: Input should be greater than or equal to 1",
            [("list",), START],
        ),
        (
            '[prices."m"]\ninput_per_mtok = 1e308\noutput_per_mtok = 1\n',
            "less than or equal",
            [START],
        ),  # cost: inf
    ],
)
def test_a_config_of_the_wrong_shape_is_one_line(
    tmp_path: Path,
    env: dict[str, str],
    workspace: Path,
    text: str,
    said: str,
    commands: list[tuple[str, ...]],
) -> None:
    # Tracebacks before (TypeError, AttributeError), or, for the last, settings silently dropped.
    config = {k: v for k, v in env.items() if k != "DURABLE_AGENT_DB"}  # the config's own db counts
    config.update(_config(tmp_path, text))
    for args in commands:
        proc = subprocess.run(
            [sys.executable, "-m", "durable_agent", *args],
            env=config,
            cwd=workspace,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert proc.returncode == 2 and said in proc.stderr and proc.stderr.count("\n") == 1, (
            args,
            proc.stderr,
        )


def test_a_fifo_named_as_the_config_does_not_hang(
    tmp_path: Path, env: dict[str, str], workspace: Path
) -> None:
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    done = threading.Event()
    proc = subprocess.Popen(
        [sys.executable, "-m", "durable_agent", "list"],
        env={**env, "DURABLE_AGENT_CONFIG": str(fifo)},
        cwd=workspace,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _out, err = proc.communicate(timeout=60)
    finally:
        done.set()
        proc.kill()
    assert proc.returncode == 2 and "not a regular file" in err and err.count("\n") == 1


def test_runs_through_the_api_says_a_bad_status_or_limit_as_the_command_does(
    tmp_path: Path, workspace: Path, env: dict[str, str]
) -> None:
    agent = Agent(
        model="scripted:/dev/null",
        workspace=workspace,
        db=f"sqlite:///{tmp_path / 'r.db'}",
        env=env,
    )
    for bad in ({"status": "bogus"}, {"limit": 0}, {"limit": -1}, {"limit": True}, {"limit": "5"}):
        with pytest.raises(UsageError):
            agent.runs(**bad)  # type: ignore[arg-type]
    assert agent.runs(limit=10**20) == []  # (an OverflowError before)


def test_export_escapes_the_line_breaks_that_splitlines_would_cut_on(
    cli: Callable[..., Any], write_script: Callable[..., str]
) -> None:
    import json

    text = "a\u2028b\u2029c\x85d"
    script = write_script([{"content": text}])
    assert cli("start", "t", "--model", script, "--run-id", "lb", "--quiet").code == 0
    out = cli("export", "lb").stdout
    lines = out.splitlines()  # every Python line break, not only \n
    assert lines == out.split("\n")[:-1] and any(
        json.loads(line).get("content") == text for line in lines
    )


def test_the_api_called_with_none_answers_with_its_own_errors(
    tmp_path: Path, workspace: Path, env: dict[str, str]
) -> None:
    agent = Agent(
        model="scripted:/dev/null",
        workspace=workspace,
        db=f"sqlite:///{tmp_path / 'n.db'}",
        env=env,
    )
    for call in (
        lambda: agent.show(None),
        lambda: agent.resume(None),
        lambda: agent.approve(None),  # type: ignore[arg-type]
        lambda: agent.start(None),
    ):  # type: ignore[arg-type]
        with pytest.raises(UsageError):  # RunNotFound is one
            call()
