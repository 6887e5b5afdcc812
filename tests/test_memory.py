"""Project memory (docs/memory.md) through the real CLI: AGENTS.md files read from the
workspace root down to the task's folder and from the user's config folder, recorded as a
`memory` step, kept by a resume (after a SIGKILL) although the files changed since, read
again by a fork; the 32 KiB cap, --no-memory and memory_files."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import forked_cli
import pytest

HEADER = "# Project memory"
SCRIPT = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "x"}}]},
    {"content": "done"},
]


def _rows(env: dict[str, str], sql: str, *params: Any) -> list[Any]:
    """Rows of the run's store, SQLite or PostgreSQL (`?` placeholders)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(env["DURABLE_AGENT_DB"])
    try:
        with engine.connect() as conn:
            statement = sql
            for i in range(len(params)):
                statement = statement.replace("?", f":p{i}", 1)
            found = conn.execute(
                sqlalchemy.text(statement), {f"p{i}": v for i, v in enumerate(params)}
            )
            return [tuple(r) for r in found]
    finally:
        engine.dispose()


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _memory_messages(env: dict[str, str], run_id: str) -> list[str]:
    return [
        r[0]
        for r in _rows(
            env,
            "SELECT content FROM messages WHERE run_id = ? AND role = 'system' AND seq > 0 "
            "ORDER BY seq",
            run_id,
        )
        if r[0].startswith(HEADER)
    ]


def _history(env: dict[str, str], run_id: str) -> list[tuple[str, str | None]]:
    return [
        tuple(r)
        for r in _rows(
            env, "SELECT role, content FROM messages WHERE run_id = ? ORDER BY seq", run_id
        )
    ]


def _run(env: dict[str, str], cwd: Path, *args: str, **extra: str) -> Any:
    return forked_cli.run(list(args), env={**env, **extra}, cwd=cwd)


@pytest.fixture
def project(workspace: Path) -> Path:
    """A workspace with AGENTS.md at its root and in pkg/sub; returns pkg/sub."""
    sub = workspace / "pkg" / "sub"
    sub.mkdir(parents=True)
    (workspace / "AGENTS.md").write_text("root rule: use tabs\n")
    (workspace / "pkg" / "AGENTS.md").write_text("pkg rule: no prints\n")
    (sub / "AGENTS.md").write_text("sub rule: old text\n")
    return sub


def test_nested_files_are_read_nearest_last_from_the_task_folder(
    env: dict[str, str],
    workspace: Path,
    project: Path,
    write_script: Callable[[list[dict[str, Any]]], str],
) -> None:
    (env_home := Path(env["XDG_CONFIG_HOME"]) / "durable-agent").mkdir(parents=True)
    (env_home / "AGENTS.md").write_text("user rule: answer in English\n")
    r = _run(env, project, "start", "t", "-m", write_script(SCRIPT), "-w", str(workspace))
    assert r.returncode == 0, r.stderr
    run_id = _rows(env, "SELECT id FROM runs")[0][0]
    [text] = _memory_messages(env, run_id)
    order = [text.index(s) for s in ("user rule", "root rule", "pkg rule", "sub rule")]
    assert order == sorted(order), text  # the user's first, the task's folder last
    assert "--- pkg/sub/AGENTS.md ---" in text
    # after the system prompt and the task, before the first answer
    roles = [role for role, _ in _history(env, run_id)]
    assert roles[:4] == ["system", "user", "system", "assistant"]
    [(kind, state, given)] = _rows(
        env, "SELECT kind, state, input FROM steps WHERE run_id = ? AND seq = 0", run_id
    )
    loaded = _json(given)
    assert (kind, state) == ("memory", "completed")
    assert [f["path"] for f in loaded["files"]][1:] == [
        "AGENTS.md",
        "pkg/AGENTS.md",
        "pkg/sub/AGENTS.md",
    ]
    assert loaded["dir"] == "pkg/sub" and loaded["text"] == text
    assert all(len(f["sha256"]) == 64 for f in loaded["files"])
    assert "memory" in r.stderr and "pkg/sub/AGENTS.md" in r.stderr  # the timeline's line
    # Outside the workspace, the task's folder is its root.
    r = _run(env, workspace.parent, "start", "t", "-m", write_script(SCRIPT), "-w", str(workspace))
    assert r.returncode == 0, r.stderr
    newest = _rows(env, "SELECT id FROM runs ORDER BY created_at DESC")[0][0]
    [text] = _memory_messages(env, newest)
    assert "root rule" in text and "sub rule" not in text and "pkg rule" not in text


@pytest.mark.parametrize(
    "crash_after",
    [pytest.param(2, marks=pytest.mark.slow), 4, pytest.param(6, marks=pytest.mark.slow)],
)
@pytest.mark.slow  # over 2 s on 2 cores
def test_a_resume_keeps_the_recorded_text_when_the_files_changed(
    env: dict[str, str],
    workspace: Path,
    project: Path,
    write_script: Callable[[list[dict[str, Any]]], str],
    crash_after: int,
    store_url: str,
) -> None:
    """SIGKILL after the memory step's intent (2), its outcome (4), the first model call (6);
    the files change; the resumed run goes on with the text read at the start, says the
    files changed, and its history is the one an uninterrupted run has."""
    env = {**env, "DURABLE_AGENT_DB": store_url}  # SQLite, and PostgreSQL
    script = write_script(SCRIPT)
    ref = _run(env, project, "start", "t", "-m", script, "--run-id", "ref", "-w", str(workspace))
    assert ref.returncode == 0, ref.stderr
    (workspace / "out.txt").unlink()
    killed = _run(
        env,
        project,
        "start",
        "t",
        "-m",
        script,
        "--run-id",
        "r",
        "-w",
        str(workspace),
        DURABLE_AGENT_CRASH_AFTER=str(crash_after),
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    at_kill = _rows(env, "SELECT kind, state FROM steps WHERE run_id = 'r' ORDER BY seq")
    assert (
        at_kill
        == {
            2: [("memory", "started")],
            4: [("memory", "completed")],
            6: [("memory", "completed"), ("model", "started")],
        }[crash_after]
    )
    (project / "AGENTS.md").write_text("sub rule: NEW text\n")
    (workspace / "AGENTS.md").write_text("root rule: NEW spaces\n")
    drift = _run(env, workspace, "resume", "r")  # files changed since the last snapshot
    assert drift.returncode == 5 and "workspace_drift" in drift.stderr, drift.stderr
    assert _run(env, workspace, "approve", "r").returncode == 0  # go on with them as they are
    resumed = _run(env, workspace, "resume", "r")
    assert resumed.returncode == 0, resumed.stderr
    assert "project memory changed since the run recorded it" in resumed.stderr
    [text] = _memory_messages(env, "r")
    assert "sub rule: old text" in text and "NEW" not in text
    assert _history(env, "r") == _history(env, "ref")
    assert _rows(env, "SELECT count(*) FROM steps WHERE run_id = 'r' AND kind = 'memory'") == [(1,)]


def test_a_fork_reads_the_files_again(
    env: dict[str, str],
    workspace: Path,
    project: Path,
    write_script: Callable[[list[dict[str, Any]]], str],
    tmp_path: Path,
) -> None:
    user = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "AGENTS.md"
    user.parent.mkdir(parents=True)
    user.write_text("user rule: v1\n")
    r = _run(env, project, "start", "t", "-m", write_script(SCRIPT), "--run-id", "a", "-w", "../..")
    assert r.returncode == 0, r.stderr
    there = tmp_path / "forked"
    r = _run(env, workspace, "fork", "a", "--at", "2", "-w", str(there), "--run-id", "b")
    assert r.returncode == 0, r.stderr
    user.write_text("user rule: v2\n")  # (the user's file: no drift of the fork's workspace)
    r = _run(env, workspace, "resume", "b")
    assert r.returncode == 0, r.stderr
    texts = _memory_messages(env, "b")
    assert len(texts) == 2 and "v1" in texts[0] and "v2" in texts[1], texts
    assert "sub rule: old text" in texts[1]  # from the fork's folders, recorded as pkg/sub
    assert "changed" not in r.stderr  # what it goes on with is what the files say
    # the history before the new message is the original's, unchanged (a prompt cache holds)
    assert _history(env, "b")[: len(_history(env, "a")) - 1] == _history(env, "a")[:-1]


def test_the_text_is_capped_at_32_kib_with_a_note(
    env: dict[str, str],
    workspace: Path,
    project: Path,
    write_script: Callable[[list[dict[str, Any]]], str],
) -> None:
    (workspace / "AGENTS.md").write_text("far rule\n" + "y" * 40_000 + "\n")
    r = _run(env, project, "start", "t", "-m", write_script(SCRIPT), "--run-id", "c", "-w", "../..")
    assert r.returncode == 0, r.stderr
    [text] = _memory_messages(env, "c")
    assert "[project memory cut: the first" in text and "32 KiB" in text
    assert "sub rule: old text" in text and "far rule" not in text  # the nearest are kept
    body = text.split("\n\n", 1)[1]
    assert len(body.encode()) <= 32 * 1024


def test_a_key_cut_in_two_by_the_cap_is_not_sent_in_part(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    # The text was cut at 32 KiB, then redacted: a key across the cut was no key any more,
    # and its tail went to the store and the model.
    key = "sk-proj-HARNESSKEY0123456789abcdefghij"
    head = "--- AGENTS.md ---\n" + "x" * 100
    cut_at = len(head) + 10  # the cut falls 10 characters into the key
    after = 32 * 1024 + cut_at - len(head) - len(key)
    (workspace / "AGENTS.md").write_text("x" * 100 + key + "\n" + "y" * (after - 1))
    r = _run(env, workspace, "start", "t", "-m", write_script(SCRIPT), "--run-id", "k",
             OPENAI_API_KEY=key)  # fmt: skip
    assert r.returncode == 0, r.stderr
    [text] = _memory_messages(env, "k")
    assert "[project memory cut: the first" in text
    [(given,)] = _rows(env, "SELECT input FROM steps WHERE run_id = 'k' AND kind = 'memory'")
    for said in (text, json.dumps(_json(given))):
        assert key[10:] not in said and key[20:] not in said


def test_no_memory_and_memory_files(
    env: dict[str, str],
    workspace: Path,
    project: Path,
    write_script: Callable[[list[dict[str, Any]]], str],
) -> None:
    script = write_script(SCRIPT)
    killed = _run(
        env, project, "start", "t", "-m", script, "--no-memory", "--run-id", "off", "-w", "../..",
        DURABLE_AGENT_CRASH_AFTER="2",
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    r = _run(env, project, "resume", "off")
    assert r.returncode == 0, r.stderr
    assert _memory_messages(env, "off") == []
    assert _rows(env, "SELECT count(*) FROM steps WHERE kind = 'memory'") == [(0,)]
    settings = _json(_rows(env, "SELECT settings FROM runs WHERE id = 'off'")[0][0])
    assert settings["memory"] is False

    (project / "CLAUDE.md").write_text("claude rule\n")
    config = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('memory_files = ["AGENTS.md", "CLAUDE.md"]\n')
    r = _run(env, project, "start", "t", "-m", script, "--run-id", "both", "-w", "../..")
    assert r.returncode == 0, r.stderr
    [text] = _memory_messages(env, "both")
    assert text.index("sub rule") < text.index("claude rule")  # in the setting's order
    r = _run(
        env, project, "start", "t", "-m", script, "--run-id", "claude", "-w", "../..",
        DURABLE_AGENT_MEMORY_FILES="CLAUDE.md",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    [text] = _memory_messages(env, "claude")
    assert "claude rule" in text and "rule: use tabs" not in text


def test_a_link_out_of_the_workspace_is_not_read(
    env: dict[str, str],
    workspace: Path,
    write_script: Callable[[list[dict[str, Any]]], str],
    tmp_path: Path,
) -> None:
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY MATERIAL\n")
    (workspace / "AGENTS.md").symlink_to(secret)
    r = _run(env, workspace, "start", "t", "-m", write_script(SCRIPT), "--run-id", "l")
    assert r.returncode == 0, r.stderr
    assert _memory_messages(env, "l") == []
    assert _rows(env, "SELECT count(*) FROM steps WHERE kind = 'memory'") == [(0,)]


def test_a_link_swapped_in_after_the_check_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The path is checked (realpath inside the workspace), then opened: a link put in the
    # file's place between the two is caught on the open file. The check is made to see
    # the file as it was before the swap.
    from durable_agent.workspace import memory

    workspace = tmp_path / "ws"
    workspace.mkdir()
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY MATERIAL\n")
    (workspace / "AGENTS.md").symlink_to(secret)
    (workspace / "sub").mkdir()
    (workspace / "sub" / "AGENTS.md").write_text("rule: in the workspace\n")
    real = memory.os.path.realpath

    def as_before_the_swap(path: Any) -> str:
        found = real(path)
        return str(workspace / "AGENTS.md") if found == str(secret) else found

    monkeypatch.setattr(memory.os.path, "realpath", as_before_the_swap)
    found = memory.read_memory(workspace, "sub", ["AGENTS.md"], {"HOME": str(tmp_path)})
    assert "PRIVATE KEY" not in found.text
    assert "rule: in the workspace" in found.text  # a file in the workspace is still read


def test_a_summary_keeps_the_memory_messages_verbatim() -> None:
    """The compacted request: system prompt, task, then every memory message the summary
    replaced the turns around, then the summary and the recent turns."""
    from durable_agent.context.memory import MemoryFile, compose
    from durable_agent.context.view import ContextView
    from durable_agent.messages import Message

    memory = compose([MemoryFile("AGENTS.md", "0" * 64, 5, "rule")])
    messages = [
        Message("system", "prompt"),
        Message("user", "task"),
        Message("system", memory.text),
        Message("assistant", "a1"),
        Message("user", "more"),
        Message("assistant", "a2"),
    ]
    view = ContextView()
    view.apply({"stage": "summarize", "turn": 1, "start": 4, "summary": "S"}, messages)
    request = view.request(messages)
    assert [m.content for m in request][:3] == ["prompt", "task", memory.text]
    assert request[3].content is not None and request[3].content.endswith("S")
    assert [m.content for m in request][4:] == ["more", "a2"]


def test_the_text_protocol_sends_a_later_system_message_as_the_users() -> None:
    from durable_agent.messages import Message
    from durable_agent.models.text_protocol import to_text_messages

    sent = to_text_messages(
        [
            Message("system", "prompt"),
            Message("user", "task"),
            Message("system", "# Project memory"),
        ],
        [],
    )
    assert [m.role for m in sent] == ["system", "user"]
    assert sent[1].content == "task\n\n# Project memory"


def test_reload_memory_adds_a_message_once_per_turn_when_the_text_changed(
    env: dict[str, str],
    workspace: Path,
    write_script: Callable[[list[dict[str, Any]]], str],
) -> None:
    """What `continue` calls for a new turn of a finished run (loop/memory_step.py)."""
    import time

    from durable_agent.config.settings import load_settings, recorded_settings
    from durable_agent.config.store import open_store
    from durable_agent.loop.memory_step import reload_memory, run_memory_sha256
    from durable_agent.store import leases
    from durable_agent.store.journal import Journal
    from durable_agent.wiring import build_runner

    user = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "AGENTS.md"
    user.parent.mkdir(parents=True)
    user.write_text("user rule: v1\n")
    (workspace / "AGENTS.md").write_text("root rule\n")
    r = _run(env, workspace, "start", "t", "-m", write_script(SCRIPT), "--run-id", "c",
             "--max-steps", "1")  # fmt: skip
    assert r.returncode == 3, r.stderr  # stopped, and may be taken up again

    def session(turn_of: Callable[[Any], int]) -> str | None:
        store = open_store(None, env)
        run = store.get_run("c")
        settings = load_settings({}, env, base=recorded_settings(run.settings))
        runner = build_runner(settings, env=env, store=store)
        owner = leases.new_owner()
        epoch, _ = runner.store.take_over("c", owner, settings.lease_seconds)
        journal = Journal(runner.store.engine, "c", owner, epoch, settings.lease_seconds)
        try:
            ctx = runner.context(journal, time.monotonic())
            reload_memory(ctx, turn_of(ctx))
            return run_memory_sha256(ctx)
        finally:
            journal.release_lease()
            journal.close()

    first = _memory_messages(env, "c")
    assert len(first) == 1 and "v1" in first[0]
    assert session(lambda ctx: 7) == _sha(first[0])  # unchanged: recorded, nothing added
    user.write_text("user rule: v2\n")
    after = session(lambda ctx: 8)
    texts = _memory_messages(env, "c")
    assert len(texts) == 2 and "v2" in texts[1] and after == _sha(texts[1])
    user.write_text("user rule: v3\n")
    session(lambda ctx: 8)  # the same turn again (a crash, a repeated continue): once
    assert len(_memory_messages(env, "c")) == 2
    user.unlink()
    (workspace / "AGENTS.md").unlink()
    session(lambda ctx: 9)  # the files are gone: said once, not again
    session(lambda ctx: 10)
    texts = _memory_messages(env, "c")
    assert len(texts) == 3 and "no instruction files are found any more" in texts[2]
    keys = _rows(env, "SELECT idempotency_key FROM steps WHERE kind = 'memory' ORDER BY seq")
    assert keys == [("memory:0",), *((f"memory:{t}:reload",) for t in (7, 8, 9))]  # 10: nothing


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def test_continue_reads_the_changed_files_for_its_new_turn(
    env: dict[str, str],
    workspace: Path,
    project: Path,
    write_script: Callable[[list[dict[str, Any]]], str],
) -> None:
    script = write_script([{"content": "first"}, {"content": "second"}, {"content": "third"}])
    r = _run(env, project, "start", "t", "-m", script, "-w", str(workspace))
    assert r.returncode == 0, r.stderr
    run_id = _rows(env, "SELECT id FROM runs")[0][0]
    (project / "AGENTS.md").write_text("sub rule: NEW text\n")
    r = _run(env, project, "continue", run_id, "go on")
    assert r.returncode == 0, r.stderr
    texts = _memory_messages(env, run_id)
    assert len(texts) == 2 and "old text" in texts[0] and "NEW text" in texts[1], texts
    roles = [role for role, _ in _history(env, run_id)]
    # the person's message, then the new memory, then the answer
    assert roles[-3:] == ["user", "system", "assistant"], roles
    # The same files again: a further turn adds no memory message.
    r = _run(env, project, "continue", run_id, "once more")
    assert r.returncode == 0, r.stderr
    assert len(_memory_messages(env, run_id)) == 2


def test_a_continue_killed_after_its_message_then_resumed_reads_the_files_too(
    env: dict[str, str],
    workspace: Path,
    project: Path,
    write_script: Callable[[list[dict[str, Any]]], str],
) -> None:
    # Killed between the message step and the read of the files, then `resume`d (which
    # docs/continue.md says goes on with the turn): the turn went on with the old text,
    # unlike the same `continue` again or an uninterrupted one.
    script = write_script([{"content": "first"}, {"content": "second"}])
    r = _run(env, project, "start", "t", "-m", script, "-w", str(workspace), "--run-id", "k")
    assert r.returncode == 0, r.stderr
    (project / "AGENTS.md").write_text("sub rule: NEW text\n")
    # boundaries: the message step's intent 1-2, its outcome 3-4, then the memory step
    r = _run(env, project, "continue", "k", "go on", DURABLE_AGENT_CRASH_AFTER="4")
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert _rows(env, "SELECT COUNT(*) FROM steps WHERE kind = 'user_message'") == [(1,)]
    r = _run(env, project, "resume", "k")
    assert r.returncode == 0, r.stderr
    texts = _memory_messages(env, "k")
    assert len(texts) == 2 and "NEW text" in texts[1], texts
    roles = [role for role, _ in _history(env, "k")]
    assert roles[-3:] == ["user", "system", "assistant"], roles
    # `continue --detach`: a worker drives the turn, and reads the files for it as well.
    (project / "AGENTS.md").write_text("sub rule: NEWER text\n")
    script = write_script([{"content": "third"}])
    r = _run(env, project, "continue", "k", "and again", "--detach", "-m", script)
    assert r.returncode == 0, r.stderr
    r = _run(env, project, "worker", "--once", "--quiet")
    assert r.returncode == 0, r.stderr
    assert _rows(env, "SELECT status FROM runs WHERE id = 'k'") == [("completed",)]
    texts = _memory_messages(env, "k")
    assert len(texts) == 3 and "NEWER text" in texts[2], texts


@pytest.mark.slow  # over 2 s on 2 cores
def test_a_project_cannot_read_the_users_config_as_memory(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    token = "lin_api_supersecretvalue_1234"
    user = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text(f'[mcp_servers.linear]\ncommand = "x"\nenv = {{ LINEAR_TOKEN = "{token}" }}\n')
    (workspace / ".durable-agent").mkdir()
    (workspace / ".durable-agent" / "config.toml").write_text(
        'memory_files = ["AGENTS.md", "config.toml"]\n'
    )
    r = _run(env, workspace, "start", "t", "-m", write_script(SCRIPT), "--run-id", "u")
    assert r.returncode == 0, r.stderr
    sent = "\n".join(str(c) for (c,) in _rows(env, "SELECT content FROM messages"))
    assert token not in sent
    # (the user's own instruction file is read as ever)
    (user.parent / "AGENTS.md").write_text("user rule\n")
    r = _run(env, workspace, "start", "t", "-m", write_script(SCRIPT), "--run-id", "v")
    assert r.returncode == 0, r.stderr
    [text] = _memory_messages(env, "v")
    assert "user rule" in text and token not in text


def test_a_project_cannot_make_the_read_hold_every_file_whole(
    env: dict[str, str], workspace: Path, write_script: Callable[[list[dict[str, Any]]], str]
) -> None:
    # memory_files with a name many times, or many links to one big file: each was read
    # whole (1 MiB) and held until the 32 KiB cut (400 of them: 1.3 GB, 15 s). Now the
    # nearest are read first and what lies past the cap is only counted.
    (workspace / "AGENTS.md").write_text("far rule\n" + "y" * (1024 * 1024) + "\n")
    links = [f"n{i}.md" for i in range(30)]
    for name in links:
        (workspace / name).symlink_to("AGENTS.md")
    names = ", ".join(f'"{n}"' for n in ["AGENTS.md", *links, *links])
    (workspace / ".durable-agent").mkdir()
    (workspace / ".durable-agent" / "config.toml").write_text(f"memory_files = [{names}]\n")
    r = _run(env, workspace, "start", "t", "-m", write_script(SCRIPT), "--run-id", "h")
    assert r.returncode == 0, r.stderr
    [(given,)] = _rows(env, "SELECT input FROM steps WHERE run_id = 'h' AND kind = 'memory'")
    listed = [f["path"] for f in _json(given)["files"]]
    assert listed == ["n29.md"], listed
    [text] = _memory_messages(env, "h")
    cut = int(text.split("the first ", 1)[1].split(" bytes", 1)[0].replace(",", ""))
    assert cut > 30 * 1024 * 1024  # the 30 files left out are counted
