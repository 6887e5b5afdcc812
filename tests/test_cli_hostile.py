"""A careless or hostile user at the command line: odd run ids, special files in the
workspace, broken config and script files, output that cannot be written. Every answer is
one line `durable-agent: error: ...` (exit 2 for bad input), never a traceback or a hang,
and nothing in the store changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_agent.models.scripted import _parsed

DONE = {"content": "done"}


def one_line_error(stderr: str) -> bool:
    lines = stderr.strip().splitlines()
    return (
        len(lines) == 1
        and lines[0].startswith("durable-agent: error: ")
        and "Traceback" not in stderr
    )


def no_runs(sql: Any) -> bool:
    """The store holds no run (or was not even made)."""
    import sqlite3

    try:
        return bool(sql("SELECT count(*) FROM runs") == [(0,)])
    except sqlite3.OperationalError as exc:
        return "no such table" in str(exc)


def _run_raw(
    env: dict[str, str], cwd: Path, *args: str | bytes, **kw: Any
) -> subprocess.CompletedProcess[bytes]:
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kw}
    return subprocess.run(
        [sys.executable, "-m", "durable_agent", *args],
        cwd=cwd,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
        **streams,
    )


@pytest.mark.slow
def test_an_empty_a_non_utf8_or_a_huge_run_id_is_no_run(
    cli, write_script, env, workspace, sql
) -> None:
    # The only run in the store: an empty id must not be taken as the prefix of every id.
    assert (
        cli(
            "start",
            "t",
            "--model",
            write_script([{"delay_s": 0, "content": "x"}]),
            "--detach",
            "--run-id",
            "only",
        ).code
        == 0
    )
    for command in ("show", "export", "cancel", "approve", "resume", "compact", "diff"):
        for run_id in ("", b"\xff", "a" * 100_000):
            r = _run_raw(env, workspace, command, run_id)
            err = r.stderr.decode("utf-8", "replace")
            assert r.returncode == 2, (command, run_id[:10], err[-300:])
            assert one_line_error(err) and "no run with id" in err, (command, err[-300:])
            assert len(err) < 300  # a 100,000-character id is not echoed whole
    assert sql("SELECT status, cancel_requested FROM runs") == [("pending", 0)]


def test_a_fifo_or_socket_in_the_workspace_is_refused_not_opened(
    cli, write_script, workspace, sql
) -> None:
    import socket

    os.mkfifo(workspace / "fifo")
    os.symlink("fifo", workspace / "fifolink")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(workspace / "sock"))
    (workspace / "a.txt").write_text("needle\n")
    calls = [
        {"name": "read_file", "arguments": {"path": "fifo"}},
        {"name": "read_file", "arguments": {"path": "fifolink"}},
        {"name": "read_file", "arguments": {"path": "sock"}},
        {"name": "search_text", "arguments": {"pattern": "needle"}},
        {"name": "write_file", "arguments": {"path": "fifo", "content": "x"}},
        {"name": "edit_file", "arguments": {"path": "fifo", "old_string": "a", "new_string": "b"}},
    ]
    script = write_script([{"tool_calls": calls}, DONE])
    # Before: the open of a FIFO without a writer blocked the harness for good (SIGTERM too).
    r = cli("start", "t", "--model", script, "--sandbox", "off", "--quiet", timeout=60)
    sock.close()
    assert r.code == 0, r.stderr
    results = [row[0] for row in sql("SELECT content FROM messages WHERE role='tool' ORDER BY seq")]
    assert results[0] == "Error: fifo is not a regular file (a FIFO)"
    assert results[1] == "Error: fifolink is not a regular file (a FIFO)"
    assert results[2] == "Error: sock is not a regular file (a socket)"
    assert results[3] == "a.txt:1: needle"
    assert results[4] == results[5] == "Error: fifo is not a regular file (a FIFO)"
    assert (workspace / "fifo").is_fifo()  # not replaced by a regular file


@pytest.mark.parametrize(
    "content, says",
    [
        (b"\xff\xfe = 1\n", "not UTF-8 text"),
        (b"a = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
    ],
)
def test_a_config_file_that_is_not_toml_text_is_one_line(cli, tmp_path, content, says) -> None:
    config = tmp_path / "bad.toml"
    config.write_bytes(content)
    r = cli("list", extra_env={"DURABLE_AGENT_CONFIG": str(config)})
    assert r.code == 2 and one_line_error(r.stderr) and says in r.stderr, r.stderr[-500:]


def test_a_config_file_that_never_ends_is_refused(cli) -> None:
    r = cli("list", extra_env={"DURABLE_AGENT_CONFIG": "/dev/zero"}, timeout=60)
    assert r.code == 2 and one_line_error(r.stderr) and "larger than 4 MiB" in r.stderr


@pytest.mark.parametrize(
    "turns, says",
    [
        ('[{"delay_s": -1, "content": "x"}]', 'a "delay_s" of -1'),
        ('[{"delay_s": NaN, "content": "x"}]', 'a "delay_s" of nan'),
        ('[{"delay_s": Infinity, "content": "x"}]', 'a "delay_s" of inf'),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('[{"delay_s": 1e400, "content": "x"}]', 'a "delay_s" of inf'),
        ('[{"tool_calls": [{"name": "x", "arguments": null}]}]', '"arguments" is null'),
        ('[{"tool_calls": [{"name": "x", "arguments": 3}]}]', '"arguments" is a number'),
        ('[{"delay_s": true, "content": "x"}]', '"delay_s" that is a boolean'),
        ('[{"content": "x"}] and more', "is not valid JSON"),
        # More digits than Python converts to an int (4300): json's ValueError, not a traceback.
        ('[{"delay_s": ' + "1" * 5000 + ', "content": "x"}]', "is not valid JSON"),
        ('[{"content": "x", "tool_calls": []}, {}]', 'turn 1 needs "content" or "tool_calls"'),
    ],
)
def test_a_bad_script_is_a_usage_error_before_the_run(cli, tmp_path, sql, turns, says) -> None:
    script = tmp_path / "s.json"
    script.write_text(turns)
    r = cli("start", "t", "--model", f"scripted:{script}")
    assert r.code == 2 and one_line_error(r.stderr) and says in r.stderr, r.stderr[-500:]


def test_a_script_that_never_ends_is_refused(cli) -> None:
    r = cli("start", "t", "--model", "scripted:/dev/zero", timeout=60)
    assert r.code == 2 and one_line_error(r.stderr) and "larger than 64 MiB" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("start", "t", "--max-steps", "nan"),
        ("start", "t", "--max-steps", "-inf"),
        ("restore", "x"),
        ("bogus",),
        ("worker", "--concurrency", "1e400"),
    ],
)
def test_a_usage_error_is_one_line(cli, args) -> None:
    r = cli(*args)
    assert r.code == 2 and one_line_error(r.stderr), r.stderr
    assert "--help`" in r.stderr


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1",
        "http://u:hunter2@h:abc/v1",
        "http://[zz]/v1",
        "not a url",
        "ftp://u:hunter2@x",
        "http:///v1",
        "http://[::1]x/",
        "http://u:hunter2@[::1]]:80/",
        "http://ho st/v1",
    ],
)
@pytest.mark.parametrize("where", ["flag", "env"])
def test_a_base_url_that_is_no_http_url_is_one_line_before_any_run(
    env, workspace, sql, url, where
) -> None:
    # The client's URL parser raised a traceback (exit 1); `ftp://` or no host made a run
    # that retried as a connection error and failed.
    args = ["start", "t", "--model", "m1", "--quiet"] + (
        ["--base-url", url] if where == "flag" else []
    )
    r = _run_raw(
        {**env, "OPENAI_API_KEY": "k", **({"OPENAI_BASE_URL": url} if where == "env" else {})},
        workspace,
        *args,
    )
    err = r.stderr.decode()
    assert r.returncode == 2 and one_line_error(err), err
    assert "base_url" in err and "hunter2" not in err
    assert no_runs(sql)


def test_an_endpoint_model_name_that_is_not_utf8_is_one_line(env, workspace, sql) -> None:
    r = _run_raw(
        {**env, "OPENAI_API_KEY": "k"},
        workspace,
        "start",
        "t",
        "--model",
        b"m\xff",
        "--base-url",
        "http://127.0.0.1:9/v1",
    )
    err = r.stderr.decode()
    assert r.returncode == 2 and one_line_error(err) and "UTF-8" in err, err
    assert no_runs(sql)


def test_list_with_a_limit_beyond_sql_integers_lists_all(cli, write_script) -> None:
    assert cli("start", "t", "--model", write_script([DONE]), "--quiet").code == 0
    r = cli("list", "--limit", "99999999999999999999999", "--json")
    assert r.code == 0, r.stderr
    assert len(r.json()) == 1


def test_output_that_cannot_be_written_is_one_line(cli, write_script, env, workspace) -> None:
    assert cli("start", "t", "--model", write_script([DONE]), "--run-id", "r1", "--quiet").code == 0
    with open("/dev/full", "wb") as full:
        r = _run_raw(env, workspace, "show", "r1", stdout=full, stderr=subprocess.PIPE)
    assert r.returncode == 1 and one_line_error(r.stderr.decode()), r.stderr.decode()
    assert "No space left on device" in r.stderr.decode()
    # stdout closed (`>&-`): nothing to write to, and no traceback either
    r = subprocess.run(
        ["sh", "-c", 'exec "$0" -m durable_agent export r1 >&-', sys.executable],
        cwd=workspace,
        env=env,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    assert r.returncode == 0 and r.stderr == b"", r.stderr.decode()
    assert json.loads(cli("export", "r1").stdout.splitlines()[0])["type"] == "run_started"


def test_an_os_error_that_is_not_the_output_names_its_file(monkeypatch, capsys) -> None:
    # Before, every OSError reaching the CLI said "cannot write the output", naming nothing.
    import errno

    from durable_agent.cli import parser as cli
    from durable_agent.cli import read_commands

    def refuse(args: Any, env: dict[str, str]) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", "/srv/repo/.env")

    monkeypatch.setattr(read_commands, "cmd_show", refuse)
    assert cli.main(["show", "r1"]) == 1
    err = capsys.readouterr().err
    assert err == "durable-agent: error: Permission denied: '/srv/repo/.env'\n", err

    def rename(args: Any, env: dict[str, str]) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link", b"/a", None, "/b")

    monkeypatch.setattr(read_commands, "cmd_show", rename)
    assert cli.main(["show", "r1"]) == 1
    assert (
        capsys.readouterr().err == "durable-agent: error: Invalid cross-device link: '/a' -> '/b'\n"
    )


def test_a_fifo_among_the_git_hooks_does_not_hang_a_command(
    cli, write_script, workspace, sql
) -> None:
    from sandbox_support import need_bwrap

    need_bwrap()
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    os.mkfifo(workspace / ".git" / "hooks" / "post-checkout")
    script = write_script(
        [{"tool_calls": [{"name": "run_command", "arguments": {"command": "echo hi"}}]}, DONE]
    )
    # Before: the digest of the protected git entries opened the FIFO and waited for good.
    r = cli("start", "t", "--model", script, "--shell", "allow", "--quiet", timeout=60)
    assert r.code == 0, r.stderr
    ((result,),) = sql("SELECT content FROM messages WHERE role='tool'")
    assert "hi" in result


@pytest.mark.parametrize("command", [["start", "t"], ["tools"], ["resume", "queued"]])
def test_an_empty_workspace_flag_is_an_error_not_the_current_directory(
    cli, write_script, sql, command
) -> None:
    # `--workspace "$UNSET"` would otherwise run the agent wherever the shell happens to be.
    script = write_script([DONE])
    assert cli("start", "t", "--model", script, "--detach", "--run-id", "queued").code == 0
    r = (
        cli(*command, "--workspace", "", "--model", script)
        if command[0] != "tools"
        else cli(*command, "--workspace", "")
    )
    assert r.code == 2 and one_line_error(r.stderr) and "the workspace is empty" in r.stderr, (
        r.stderr
    )
    assert sql("SELECT id, status FROM runs") == [("queued", "pending")]


@pytest.mark.slow
def test_restore_and_fork_refuse_an_odd_snapshot_id_and_an_empty_directory(
    cli, write_script, env, workspace, tmp_path
) -> None:
    (workspace / "keep.txt").write_text("mine\n")
    script = write_script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}
                ]
            },
            DONE,
        ]
    )
    assert (
        cli("start", "t", "--model", script, "--run-id", "r1", "--sandbox", "off", "--quiet").code
        == 0
    )
    for tree in (b"\xff", b"../x", b"garbage"):
        r = _run_raw(env, workspace, "restore", "r1", "--tree", tree, "--to", str(tmp_path / "out"))
        err = r.stderr.decode("utf-8", "replace")
        assert r.returncode == 2 and one_line_error(err) and "no workspace snapshot" in err, err[
            -400:
        ]
    # An empty DIR (an unset variable) is not the current directory: --force would overwrite it.
    r = cli("restore", "r1", "--at", "1", "--to", "", "--force")
    assert r.code == 2 and one_line_error(r.stderr) and "--to is empty" in r.stderr, r.stderr
    r = cli("fork", "r1", "--at", "1", "--workspace", "")
    assert r.code == 2 and one_line_error(r.stderr) and "--workspace is empty" in r.stderr, r.stderr
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt", "keep.txt"]


def test_a_reader_of_the_timeline_that_goes_away_does_not_fail_the_run(  # type: ignore[no-untyped-def]
    cli, env, workspace, write_script
) -> None:
    # `durable-agent resume ID 2>&1 | head -4`: once head had its lines, the next timeline
    # line raised BrokenPipeError inside the step it reported, and the run ended
    # `failed (tool_error)`. What is printed is a view; the run is in the store.
    go = (
        workspace / "node_modules" / "go"
    )  # where a command sees it, and no snapshot looks (no drift)
    script = write_script(
        [
            {
                "tool_calls": [
                    {
                        "name": "run_command",
                        "arguments": {
                            "command": "until [ -e node_modules/go ]; do sleep 0.05; done"
                        },
                    }
                ]
            },
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "after.txt", "content": "x"}}
                ]
            },
            {"content": "done"},
        ]
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "durable_agent",
            "start",
            "t",
            "--model",
            script,
            "--run-id",
            "piped",
            "--shell",
            "allow",
        ],
        cwd=workspace,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    assert b"piped" in proc.stderr.readline()  # the reader saw the start, then left
    proc.stderr.close()
    go.parent.mkdir()
    go.touch()
    assert proc.wait(timeout=120) == 0
    shown = cli("show", "piped", "--json")
    assert shown.code == 0 and json.loads(shown.stdout)["status"] == "completed", shown.stdout[:500]
    assert (workspace / "after.txt").read_text() == "x"


@pytest.mark.parametrize("closed", ["stderr", "stdout"])
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_output_nobody_reads_changes_neither_the_run_nor_its_exit_code(  # type: ignore[no-untyped-def]
    cli, env, workspace, write_script, closed
) -> None:
    # `start ... 2>&1 | true`: the header line failed after the run was created and leased,
    # so it was never executed (left 'running'), exit 0; with stdout gone, a run that ended
    # budget_exceeded exited 0 instead of 3.
    script = write_script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a.txt", "content": "a"}}
                ]
            },
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "b.txt", "content": "b"}}
                ]
            },
            {"content": "done"},
        ]
    )
    for run_id, extra, code in (("full", [], 0), ("short", ["--max-steps", "1"], 3)):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first line
        try:
            streams = {
                closed: write,
                "stdout" if closed == "stderr" else "stderr": subprocess.DEVNULL,
            }
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "durable_agent",
                    "start",
                    "t",
                    "--model",
                    script,
                    "--run-id",
                    run_id,
                    *extra,
                ],
                cwd=workspace,
                env=env,
                stdin=subprocess.DEVNULL,
                timeout=120,
                **streams,
            )  # type: ignore[call-overload]
        finally:
            os.close(write)
        assert proc.returncode == code, (run_id, proc.returncode)
        shown = cli("show", run_id, "--json")
        status = json.loads(shown.stdout)["status"]
        assert status == ("completed" if code == 0 else "budget_exceeded"), (run_id, status)
    assert (workspace / "b.txt").read_text() == "b"


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_a_stderr_or_stdout_nobody_can_write_keeps_every_exit_code(  # type: ignore[no-untyped-def]
    cli, env, workspace, write_script, tmp_path
) -> None:
    import importlib.util

    # The error line itself failed: exit 2, 6 and 7 all became 1 (a resumable run reported
    # failed); `start --detach >/dev/full` queued the run yet exited 1, "No space left on device".
    def da_to(args: list[str], **streams: Any) -> int:
        return subprocess.run(
            [sys.executable, "-m", "durable_agent", *args],
            cwd=workspace,
            env=env,
            stdin=subprocess.DEVNULL,
            timeout=120,
            **streams,
        ).returncode

    with open("/dev/full", "w") as full:
        assert da_to(["resume", "nosuch"], stdout=subprocess.DEVNULL, stderr=full) == 2
        if importlib.util.find_spec("psycopg") is not None:  # (a store that refuses: exit 7)
            (tmp_path / "c.toml").write_text("store_retry_attempts = 2\nstore_retry_seconds = 1\n")
            env_fast = {**env, "DURABLE_AGENT_CONFIG": str(tmp_path / "c.toml")}
            assert (
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "durable_agent",
                        "list",
                        "--db",
                        "postgresql://127.0.0.1:1/x",
                    ],
                    cwd=workspace,
                    env=env_fast,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=full,
                    timeout=120,
                ).returncode
                == 7
            )
        script = write_script([{"content": "done"}])
        assert (
            da_to(
                ["start", "t", "--model", script, "--run-id", "queued", "--detach"],
                stdout=full,
                stderr=subprocess.DEVNULL,
            )
            == 0
        )
    shown = cli("show", "queued", "--json")
    assert json.loads(shown.stdout)["status"] == "pending"


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_the_demo_read_by_nobody_still_runs_to_its_end(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # `demo | head -c 2000`: the print failed mid-story, the resumed child was left running in
    # a workspace this process then deleted (the run failed), and the demo exited 0.
    db = tmp_path / "demo.db"
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "durable_agent", "demo", "--db", f"sqlite:///{db}"],
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=180,
        )
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    import sqlite3

    assert sqlite3.connect(db).execute("SELECT status FROM runs").fetchall() == [("completed",)]


def test_a_small_script_or_config_is_read_without_a_buffer_the_size_of_the_cap(tmp_path) -> None:
    # `f.read(cap + 1)` allocated the whole cap up front (64 MiB for a script, 4 MiB for the
    # config) to read a few bytes; the cap itself still holds, to the byte.
    import tracemalloc

    from durable_agent.config.layers import MAX_CONFIG_BYTES, read_config_file
    from durable_agent.errors import ConfigError
    from durable_agent.models.scripted import MAX_SCRIPT_BYTES, load_script

    script, config = tmp_path / "s.json", tmp_path / "c.toml"
    script.write_text('[{"content": "done"}]')
    config.write_text("max_steps = 7\n")
    tracemalloc.start()
    try:
        assert load_script(script) == [{"content": "done"}]
        assert read_config_file(config) == {"max_steps": 7}
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    turn = b'[{"content": "done"}]'
    script.write_bytes(turn + b" " * (MAX_SCRIPT_BYTES - len(turn)))  # exactly the cap: read
    assert load_script(script) == [{"content": "done"}]
    with script.open("ab") as f:
        f.write(b" ")
    with pytest.raises(ConfigError, match="larger than 64 MiB"):
        load_script(script)
    config.write_bytes(b"a = 1" + b" " * (MAX_CONFIG_BYTES - 6) + b"\n")
    assert read_config_file(config) == {"a": 1}
    with config.open("ab") as f:
        f.write(b"\n")
    with pytest.raises(ConfigError, match="larger than 4 MiB"):
        read_config_file(config)


@pytest.mark.parametrize("entry", ["python -m durable_agent", "durable-agent"])
def test_a_ctrl_c_while_the_process_ends_changes_nothing_and_prints_no_traceback(
    env, workspace, write_script, entry
) -> None:
    # A second Ctrl-C that lands after the command is over, while the interpreter ends (its
    # threads joined, its atexit handlers run), printed a KeyboardInterrupt traceback from
    # threading._shutdown and changed the exit code. Here the SIGINT is sent from an atexit
    # handler, i.e. at that very moment, through the same entry points as the real command.
    start = (
        "import runpy; runpy.run_module('durable_agent', run_name='__main__')"
        if entry.startswith("python")
        else "from durable_agent.cli.parser import main; raise SystemExit(main())"
    )  # the console script's body
    script = write_script([{"content": "done"}])
    code = (
        "import atexit, os, signal, sys\n"
        "atexit.register(os.kill, os.getpid(), signal.SIGINT)\n"
        f"sys.argv = ['durable-agent', 'start', 't', '--model', {script!r}, '--quiet']\n" + start
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0 and r.stdout.strip() == "done", (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(alphabet=st.characters(codec="utf-8")),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values, st.booleans())
@settings(max_examples=300, deadline=None)
def test_a_script_reads_as_json_reads_it(value: object, ascii_only: bool) -> None:
    # models/scripted.py reads a script with msgspec, and with json what msgspec refuses:
    # the values are json's either way (a lone surrogate, NaN and 1e400 included).
    text = json.dumps(value, ensure_ascii=ascii_only)
    for raw in (text, text.replace("0.0", "1e400"), '["\\ud800", NaN, ' + text + "]"):
        expected = json.loads(raw)
        got = _parsed(raw.encode("utf-8", "surrogatepass"))
        assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
