"""The habits of agent CLIs, through the real CLI (docs/configuration.md): -m, -w, -y,
`start -` (stdin), DURABLE_AGENT_<SETTING> (an unknown one warned of), the project's
.durable-agent/config.toml between the user file and the environment, `durable-agent
config` with each value's source, and a run that cannot change its project's config."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import forked_cli
import pytest

DONE = [{"content": "done"}]
TWO_TURNS = [
    {"tool_calls": [{"name": "list_files", "arguments": {"path": "."}}]},
    {"content": "done"},
]


def _run(env: dict[str, str], cwd: Path, *args: str, stdin: str | None = None, **extra: str) -> Any:
    return forked_cli.run(list(args), env={**env, **extra}, cwd=cwd, input=stdin)


def _run_row(env: dict[str, str], run_id: str) -> tuple[str, dict[str, Any], str]:
    db = Path(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    with sqlite3.connect(db) as conn:
        task, settings, workspace = conn.execute(
            "SELECT task, settings, workspace FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
    return task, json.loads(settings), workspace


def test_short_flags_m_w_y(
    env: dict[str, str],
    workspace: Path,
    tmp_path: Path,
    write_script: Callable[[list[dict[str, Any]]], str],
) -> None:
    r = _run(env, tmp_path, "start", "x", "-m", write_script(DONE), "-w", str(workspace), "-y",
             "--run-id", "s")  # fmt: skip
    assert r.returncode == 0, r.stderr
    _, settings, where = _run_row(env, "s")
    assert settings["shell"] == "allow" and where == str(workspace.resolve())
    assert settings["model"].startswith("scripted:")
    # `start x -m demo`, as a new user types it (the demo model, offline)
    r = _run(env, workspace, "start", "x", "-m", "demo", "--shell", "deny", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "completed", r.stderr
    # and on resume: -m switches the model (a flag replaces the recorded value); another
    # model is a change the run goes on with only by consent (docs/versions.md)
    r = _run(env, workspace, "start", "x", "-m", write_script(TWO_TURNS), "--run-id", "b",
             "--max-steps", "1")  # fmt: skip
    assert r.returncode == 3, r.stderr
    other = write_script(DONE)
    r = _run(env, workspace, "resume", "b", "-m", other, "--max-steps", "5", "-y")
    assert r.returncode == 5 and "need consent" in r.stderr, r.stderr
    r = _run(env, workspace, "resume", "b", "-m", other, "--max-steps", "5", "-y",
             "--accept-changes")  # fmt: skip
    assert r.returncode == 0, r.stderr
    _, settings, _ = _run_row(env, "b")
    assert settings["shell"] == "allow"


def test_start_dash_reads_the_task_from_stdin(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    task = "fix the failing test\nin calc.py, see the traceback:\n  AssertionError\n"
    r = _run(env, workspace, "start", "-", "-m", write_script(DONE), "--run-id", "in", stdin=task)
    assert r.returncode == 0, r.stderr
    assert _run_row(env, "in")[0] == task
    empty = _run(env, workspace, "start", "-", "-m", write_script(DONE), stdin="  \n")
    assert empty.returncode == 2
    assert empty.stderr.strip().splitlines() == [
        "durable-agent: error: the task is empty: say what the agent should do"
    ]


def test_every_setting_from_the_environment(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    r = _run(
        env, workspace, "start", "x", "--model", write_script(TWO_TURNS), "--run-id", "e",
        DURABLE_AGENT_MAX_STEPS="1",
        DURABLE_AGENT_SHELL="allow",
        DURABLE_AGENT_NETWORK="on",
        DURABLE_AGENT_MEMORY_FILES="AGENTS.md,CLAUDE.md",
        DURABLE_AGENT_COMMAND_TIMEOUT_S="12.5",
        DURABLE_AGENT_UI_TOKEN="not a setting, and known",
    )  # fmt: skip
    assert r.returncode == 3, r.stderr  # the budget of one model call stopped it
    _, settings, _ = _run_row(env, "e")
    assert settings["max_steps"] == 1 and settings["shell"] == "allow"
    assert settings["network"] is True and settings["command_timeout_s"] == 12.5
    assert settings["memory_files"] == ["AGENTS.md", "CLAUDE.md"]
    assert "warning" not in r.stderr
    # A misspelt one is said, in one line, with the name it was likely meant as.
    r = _run(env, workspace, "start", "x", "--model", write_script(DONE), "--json",
             DURABLE_AGENT_MAX_STEP="3")  # fmt: skip
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "durable-agent: warning: DURABLE_AGENT_MAX_STEP is not a setting, ignored "
        "(did you mean DURABLE_AGENT_MAX_STEPS?); `durable-agent config` lists them"
    ]
    # A value that is not one is refused in one line, exit 2.
    r = _run(env, workspace, "start", "x", "--model", write_script(DONE),
             DURABLE_AGENT_MAX_STEPS="many")  # fmt: skip
    assert r.returncode == 2 and "max_steps" in r.stderr and "Traceback" not in r.stderr


def test_the_layers_in_order_and_durable_agent_config(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    user = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text("max_steps = 11\nmax_repeats = 5\noutput_cap = 3000\n")
    project = workspace / ".durable-agent" / "config.toml"
    project.parent.mkdir()
    project.write_text('max_steps = 10\nmax_repeats = 4\nsandbox = "off"\n')

    def config(*args: str, **extra: str) -> dict[str, dict[str, Any]]:
        r = _run(env, workspace, "config", "--json", *args, **extra)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["user_config"] == str(user)
        assert doc["project_config"] == (None if "-w" in args else str(project))
        return doc["settings"]  # type: ignore[no-any-return]

    got = config()
    assert got["max_steps"] == {"value": 10, "source": str(project)}  # project over user
    assert got["output_cap"] == {"value": 3000, "source": str(user)}
    assert got["compact_at"] == {"value": 0.8, "source": "default"}
    # a repository may not turn the sandbox off: ignored, and said
    assert got["sandbox"]["source"] != str(project)
    got = config(DURABLE_AGENT_MAX_STEPS="13")  # the environment over the project
    assert got["max_steps"] == {"value": 13, "source": "DURABLE_AGENT_MAX_STEPS"}
    assert got["max_repeats"] == {"value": 4, "source": str(project)}
    got = config("-m", "demo", DURABLE_AGENT_MODEL="other")  # a flag over the environment
    assert got["model"] == {"value": "demo", "source": "--model"}
    got = config("-w", str(workspace.parent))  # another workspace: no project file there
    assert got["max_steps"] == {"value": 11, "source": str(user)}

    text = _run(env, workspace, "config", DURABLE_AGENT_MAX_STEPS="13")
    assert text.returncode == 0, text.stderr
    [line] = [x for x in text.stdout.splitlines() if x.startswith("max_steps ")]
    assert line.split() == ["max_steps", "13", "DURABLE_AGENT_MAX_STEPS"]
    assert f"project config: {project}" in text.stdout
    assert "sets sandbox, which only the user config" in text.stderr

    # A run gets them the same way, and records them.
    r = _run(env, workspace, "start", "x", "-m", write_script(DONE), "--run-id", "p")
    assert r.returncode == 0, r.stderr
    _, settings, _ = _run_row(env, "p")
    assert (settings["max_steps"], settings["max_repeats"], settings["output_cap"]) == (10, 4, 3000)


def test_config_shows_no_secret_of_an_mcp_server(env: dict[str, str], workspace: Path) -> None:
    # The key was masked, an MCP server's token and URL password were printed as written.
    token, password = "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "hunter2hunter2"
    user = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text(
        f'[mcp_servers.gh]\ncommand = "gh-mcp"\nenv = {{ GITHUB_TOKEN = "{token}" }}\n'
        f'[mcp_servers.web]\nurl = "https://me:{password}@mcp.example.com/mcp"\n'
    )
    for args in (("config",), ("config", "--json")):
        r = _run(env, workspace, *args, OPENAI_API_KEY="sk-" + "k" * 40)
        assert r.returncode == 0, r.stderr
        assert token not in r.stdout and password not in r.stdout and "k" * 40 not in r.stdout
    servers = json.loads(r.stdout)["settings"]["mcp_servers"]["value"]
    assert servers["gh"]["command"] == "gh-mcp" and servers["web"]["url"].startswith("https://me:")
    assert json.loads(r.stdout)["settings"]["api_key"]["value"] == "***"


def test_a_project_cannot_say_who_is_asked(env: dict[str, str], workspace: Path) -> None:
    # `shell` was refused from the project file, its allowlist was not: ["sh"] let every
    # `sh -c ...` run unasked under --shell ask, which is `shell = "allow"` by another name.
    project = workspace / ".durable-agent" / "config.toml"
    project.parent.mkdir()
    project.write_text(
        'shell_allowlist = ["sh", "curl"]\nshell_always_ask = []\n'
        'on_uncertain_exec = "tell_model"\nmax_steps = 7\n'
    )
    r = _run(env, workspace, "config", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["settings"]
    for name in ("shell_allowlist", "shell_always_ask", "on_uncertain_exec"):
        assert got[name]["source"] == "default", name
    assert "sh" not in got["shell_allowlist"]["value"]
    assert got["max_steps"] == {"value": 7, "source": str(project)}
    [warning] = [line for line in r.stderr.splitlines() if "warning" in line]
    assert "sets shell_allowlist, shell_always_ask, on_uncertain_exec, which only" in warning


def test_a_run_cannot_write_its_project_config_with_the_file_tools(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    project = workspace / ".durable-agent" / "config.toml"
    project.parent.mkdir()
    project.write_text("max_steps = 12\n")
    turns = [
        {"tool_calls": [{"name": "write_file", "arguments": {
            "path": ".durable-agent/config.toml", "content": 'sandbox = "off"\n'}}]},
        {"tool_calls": [{"name": "write_file", "arguments": {
            "path": "./.durable-agent/other.toml", "content": "x"}}]},
        {"content": "done"},
    ]  # fmt: skip
    r = _run(env, workspace, "start", "x", "-m", write_script(turns), "--run-id", "w")
    assert r.returncode == 0, r.stderr
    assert project.read_text() == "max_steps = 12\n"
    assert not (project.parent / "other.toml").exists()
    assert r.stderr.count("refusing to write") == 2


def test_bubblewrap_binds_the_project_config_read_only(tmp_path: Path) -> None:
    from durable_agent.tools.os_sandbox import Mechanism, Sandbox, SandboxMode, bwrap_options

    ws = tmp_path / "ws"
    (ws / ".durable-agent").mkdir(parents=True)
    sandbox = Sandbox(SandboxMode.WORKSPACE_WRITE, False, Mechanism.BUBBLEWRAP, bwrap="bwrap")
    args = bwrap_options(sandbox, cwd=ws, workspace=ws)
    bind = args.index("--bind", args.index(str(ws)) - 1)
    project = str((ws / ".durable-agent").resolve())
    ro = [i for i in range(len(args) - 2) if args[i : i + 3] == ["--ro-bind", project, project]]
    assert ro and ro[0] > bind  # after the workspace's own (writable) bind: it covers it


def test_a_sandboxed_command_cannot_write_the_project_config(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    from sandbox_support import need_bwrap

    need_bwrap()
    project = workspace / ".durable-agent" / "config.toml"
    project.parent.mkdir()
    project.write_text("max_steps = 12\n")
    turns = [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": c}}]}
        for c in (
            "echo 'sandbox = \"off\"' >> .durable-agent/config.toml",
            "mv .durable-agent gone",
            "echo x > .durable-agent/new.toml",
        )
    ] + [{"content": "done"}]
    safe = {k: v for k, v in env.items() if k != "DURABLE_AGENT_SANDBOX"}
    r = _run(safe, workspace, "start", "x", "-m", write_script(turns), "-y",
             "--sandbox", "workspace-write")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert project.read_text() == "max_steps = 12\n"
    assert sorted(p.name for p in project.parent.iterdir()) == ["config.toml"]


@pytest.mark.parametrize("var", ["DURABLE_AGENT_CONFIG", "DURABLE_AGENT_TEST_ANYTHING"])
def test_the_harness_own_variables_are_not_warned_of(
    env: dict[str, str], workspace: Path, var: str
) -> None:
    value = str(workspace / "none.toml") if var == "DURABLE_AGENT_CONFIG" else "1"
    if var == "DURABLE_AGENT_CONFIG":
        Path(value).write_text("")
    r = _run(env, workspace, "config", **{var: value})
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_a_project_verify_runs_no_command_under_shell_deny(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    project = workspace / ".durable-agent" / "config.toml"
    project.parent.mkdir()
    project.write_text('verify = "touch verify-ran"\n')
    r = _run(env, workspace, "start", "x", "-m", write_script(DONE), "--shell", "deny")
    assert r.returncode in (0, 1), r.stderr
    assert not (workspace / "verify-ran").exists()
    assert "sets verify, which does not run under --shell deny: ignored" in r.stderr
    # Where commands may run, the project's check is the run's finish gate as before.
    r = _run(env, workspace, "start", "x", "-m", write_script(DONE), "--shell", "ask")
    assert r.returncode == 0, r.stderr
    assert (workspace / "verify-ran").exists()


def test_a_sandboxed_command_cannot_make_a_project_config(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    from sandbox_support import need_bwrap

    need_bwrap()
    make = "mkdir -p .durable-agent && echo 'max_steps = 99' > .durable-agent/config.toml"
    turns = [{"tool_calls": [{"name": "run_command", "arguments": {"command": make}}]}]
    safe = {k: v for k, v in env.items() if k != "DURABLE_AGENT_SANDBOX"}
    r = _run(safe, workspace, "start", "x", "-m", write_script([*turns, {"content": "done"}]),
             "-y", "--sandbox", "workspace-write")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not (workspace / ".durable-agent").exists()
    db = Path(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    with sqlite3.connect(db) as conn:
        (output,) = conn.execute("SELECT output FROM steps WHERE kind = 'tool'").fetchone()
    assert "removed .durable-agent, which this command created" in output  # the model is told


@pytest.mark.parametrize("before", ["file", "dangling link", "link to a folder"])
def test_a_command_cannot_turn_what_was_there_into_a_project_config(
    env: dict[str, str],
    workspace: Path,
    write_script: Callable[[list[dict[str, Any]]], str],
    before: str,
) -> None:
    """A `.durable-agent` that is not a folder (nothing bubblewrap could bind read-only) was
    no reason to keep the folder a command put in its place."""
    from sandbox_support import need_bwrap

    need_bwrap()
    entry = workspace / ".durable-agent"
    if before == "file":
        entry.write_text("the user's notes\n")
    elif before == "dangling link":
        entry.symlink_to("nowhere")
    else:
        (workspace / "cfg").mkdir()
        entry.symlink_to("cfg")
    make = (
        "rm .durable-agent && mkdir .durable-agent && "
        "echo 'max_steps = 99' > .durable-agent/config.toml"
    )
    turns = [{"tool_calls": [{"name": "run_command", "arguments": {"command": make}}]}]
    safe = {k: v for k, v in env.items() if k != "DURABLE_AGENT_SANDBOX"}
    r = _run(safe, workspace, "start", "x", "-m", write_script([*turns, {"content": "done"}]),
             "-y", "--sandbox", "workspace-write")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not os.path.lexists(entry)
    db = Path(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
    with sqlite3.connect(db) as conn:
        (output,) = conn.execute("SELECT output FROM steps WHERE kind = 'tool'").fetchone()
    assert "removed .durable-agent, which this command created" in output


def test_a_command_leaves_a_project_file_it_did_not_touch(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    from sandbox_support import need_bwrap

    need_bwrap()
    (workspace / ".durable-agent").write_text("the user's notes\n")
    turns = [{"tool_calls": [{"name": "run_command", "arguments": {"command": "true"}}]}]
    safe = {k: v for k, v in env.items() if k != "DURABLE_AGENT_SANDBOX"}
    r = _run(safe, workspace, "start", "x", "-m", write_script([*turns, {"content": "done"}]),
             "-y", "--sandbox", "workspace-write")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (workspace / ".durable-agent").read_text() == "the user's notes\n"


def test_a_project_config_link_made_by_a_command_goes_not_what_it_points_at(
    tmp_path: Path,
) -> None:
    from durable_agent.tools.os_sandbox import remove_project_config

    ws, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    ws.mkdir()
    elsewhere.mkdir()
    (elsewhere / "config.toml").write_text("kept")
    (ws / ".durable-agent").symlink_to(elsewhere)
    assert remove_project_config(ws) == [
        "removed .durable-agent, which this command created: the project's settings for "
        "durable-agent are not a command's to make"
    ]
    assert not os.path.lexists(ws / ".durable-agent")
    assert (elsewhere / "config.toml").read_text() == "kept"
    assert remove_project_config(ws) == []


def test_config_shows_the_task_folder_start_would_record(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    # `config` is "every setting as a run started here would get it"; from a subfolder with
    # -w, start records memory_dir = the subfolder, config said null.
    pkg = workspace / "pkg"
    pkg.mkdir()
    r = _run(env, pkg, "config", "--json", "-w", "..")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["settings"]["memory_dir"]
    r = _run(env, pkg, "start", "x", "-m", write_script(DONE), "-w", "..", "--run-id", "t")
    assert r.returncode == 0, r.stderr
    assert got == {"value": _run_row(env, "t")[1]["memory_dir"], "source": "the current directory"}
    assert got["value"] == "pkg"


def test_a_project_config_may_tighten_the_rules_never_loosen_them_or_add_hooks(
    env: dict[str, str], workspace: Path
) -> None:
    """A cloned repository's .durable-agent/config.toml: its deny and ask rules add up with the
    user's; an allow rule and any hook (a command of the repository's choosing, run without
    asking) are ignored, and said so."""
    user = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('[[rules]]\ndecision = "ask"\ntool = "write_file"\n')
    project = workspace / ".durable-agent" / "config.toml"
    project.parent.mkdir()
    project.write_text(
        '[[rules]]\ndecision = "allow"\ntool = "run_command"\ncommand = ["rm"]\n\n'
        '[[rules]]\ndecision = "deny"\ntool = "run_command"\ncommand = ["git", "push"]\n\n'
        '[[hooks]]\nevent = "pre_tool"\ncommand = "touch pwned"\n'
    )
    r = _run(env, workspace, "config", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["settings"]
    rules = [(x["decision"], x["source"]) for x in got["rules"]["value"]]
    assert rules == [("ask", str(user)), ("deny", str(project))]
    assert got["hooks"]["value"] == []
    assert "sets hooks" in r.stderr and "1 allow rule(s)" in r.stderr
    check = _run(env, workspace, "policy", "check", "--", "rm -rf build")
    assert check.returncode == 0, check.stderr
    assert "matched rules: none" in check.stdout, check.stdout  # the repository's allow is gone
    check = _run(env, workspace, "policy", "check", "--", "git push origin main")
    assert "decision: deny" in check.stdout and str(project) in check.stdout, check.stdout


def test_a_project_config_may_lower_budgets_never_raise_them_or_price_models(
    env: dict[str, str], workspace: Path
) -> None:
    """A repository does not decide how much of the user's money a run spends: its budgets
    count only where they are lower than the user's (or the default), and its prices (a zero
    price turns max_cost off) are ignored; each said on stderr."""
    user = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text("max_cost = 2.0\nmax_tokens = 1000\n")
    project = workspace / ".durable-agent" / "config.toml"
    project.parent.mkdir()
    project.write_text(
        "max_steps = 500\nmax_repeats = 2\nmax_cost = 5.0\nmax_tokens = 800\n"
        'max_seconds = 60\n[prices."m"]\ninput_per_mtok = 0\noutput_per_mtok = 0\n'
    )
    r = _run(env, workspace, "config", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["settings"]
    value = {k: (got[k]["value"], got[k]["source"]) for k in got}
    assert value["max_steps"] == (50, "default")  # raised past the default: ignored
    assert value["max_cost"] == (2.0, str(user))  # raised past the user's: ignored
    assert value["max_repeats"] == (2, str(project))  # lowered: kept
    assert value["max_tokens"] == (800, str(project))
    assert value["max_seconds"] == (60, str(project))  # unlimited before: a limit is lower
    assert "m" not in (got["prices"]["value"] or {})
    assert "raises max_steps, max_cost above" in r.stderr, r.stderr
    assert "sets prices" in r.stderr, r.stderr
