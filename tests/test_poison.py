"""Poison data: generated file names, file bytes, command output bytes and model-written
strings go through every built-in tool (list_files, search_text, read_file, write_file,
edit_file, run_command, read_output), the real CLI and both stores (SQLite and
PostgreSQL). No run may end unresumable, `show`/`export`/`list` never fail, and the
tool results the model got say what is really there.

The generated run is stopped by a budget halfway (`--max-steps 3`) and resumed, so the
history with the poison in it is read back, re-hashed and continued from the rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import forked_cli
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from durable_agent.cli.parser import main
from durable_agent.encoding import decode_text, encode_content, looks_binary, show_name
from durable_agent.store.engine import open_store_engine
from durable_agent.store.runs import Store
from durable_agent.store.storable import storable

# Many real processes and generated cases: the full run has them, the fast lane does not.
pytestmark = pytest.mark.slow

ANY_CHAR = st.characters(exclude_categories=())  # surrogates and NUL included
NAMES = st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\x00" not in b)
CONTENTS = st.one_of(
    st.binary(max_size=120),
    st.text(max_size=60).map(lambda t: t.encode("latin-1", errors="replace")),
    st.text(max_size=60).map(lambda t: t.encode("utf-8") + b"\xff\xfe" + t.encode("utf-8")),
    st.text(max_size=40).map(lambda t: t.encode("utf-8").replace(b"a", b"\x00")),
)
MODEL_TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=30),
    st.sampled_from(["x\ud800y", "\udcff\udcfe", "a\x00b", "\\xff", "é\ud83d"]),
)


def printf_command(data: bytes, fd: int) -> str:
    """A command that writes exactly `data` (every byte as an octal escape) to fd 1 or 2."""
    escapes = "".join(f"\\{b:03o}" for b in data)
    return f"printf '{escapes}'" + (" >&2" if fd == 2 else "")


TOOL_NAMES = st.sampled_from(
    [
        "list_files",
        "search_text",
        "read_file",
        "write_file",
        "edit_file",
        "run_command",
        "read_output",
        "no_such_tool",
    ]
)
# Argument shapes a model may send, as raw text: JSON of any shape whose values are never
# text (so no shape names a real command or path), or not JSON at all.
NOT_TEXT = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "path",
                    "content",
                    "command",
                    "pattern",
                    "call_id",
                    "old_string",
                    "new_string",
                    "limit",
                    "x",
                ]
            ),
            inner,
            max_size=3,
        )
    ),
    max_leaves=8,
)
ARGUMENTS = st.one_of(NOT_TEXT.map(json.dumps), MODEL_TEXT)
ODD_CALL = ("read_file", '{"path": 7}')


def poison_script(
    names: list[bytes],
    contents: list[bytes],
    output: bytes,
    text: str,
    odd: tuple[str, str] = ODD_CALL,
    lead: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """`lead`: turns before these (their call ids then start at call_<len(lead)>_0)."""
    shown = [show_name(os.fsdecode(n)) for n in names]
    lead = lead or []
    return [
        *lead,
        {"tool_calls": [{"name": "list_files", "arguments": {}}]},
        {"tool_calls": [{"name": "search_text", "arguments": {"pattern": "."}}]},
        # The names as list_files showed them: the model must be able to name the files back.
        {"tool_calls": [{"name": "read_file", "arguments": {"path": s}} for s in shown]},
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "w.txt", "content": text}},
                {
                    "name": "edit_file",
                    "arguments": {
                        "path": "w.txt",
                        "old_string": text[:2] or "x",
                        "new_string": text + "!",
                    },
                },
                {"name": "write_file", "arguments": {"path": "new\\xff\\xfe.txt", "content": text}},
            ]
        },
        {
            "tool_calls": [
                {"name": "run_command", "arguments": {"command": printf_command(output, 1)}},
                {"name": "run_command", "arguments": {"command": printf_command(output, 2)}},
                {"name": "run_command", "arguments": {"command": f"echo {shlex.quote(text)}"}},
            ]
        },
        # read_output: the poisoned output again, read back from the rows after the resume,
        # and a call id that is the model's text (no such call: an error observation).
        {
            "tool_calls": [
                {"name": "read_output", "arguments": {"call_id": f"call_{len(lead) + 4}_0"}},
                {"name": "read_output", "arguments": {"call_id": text}},
                # a call of any name with arguments of any shape (raw text)
                {"name": odd[0], "arguments": odd[1]},
            ]
        },
        {"content": f"done {text}"},
    ]


def make_workspace(root: Path, names: list[bytes], contents: list[bytes]) -> None:
    for name, data in zip(names, contents, strict=True):
        with open(os.fsencode(root) + b"/" + name, "wb") as f:
            f.write(data)


def observations(store: Store, run_id: str) -> dict[str, str]:
    return {m.tool_call_id: m.content for m in store.messages(run_id) if m.role == "tool"}


def check_observations(
    seen: dict[str, str],
    workspace: Path,
    names: list[bytes],
    contents: list[bytes],
    output: bytes,
    text: str,
) -> None:
    """What the model was told is what is there (redaction aside: key-shaped text may be masked)."""
    listed = seen["call_0_0"]
    for name in names:
        assert show_name(os.fsdecode(name)) in listed
    for i, data in enumerate(contents):
        got = seen[f"call_2_{i}"]
        if "REDACTED" in got:
            continue
        if looks_binary(data[:8192]):
            assert "binary file, not shown" in got
        else:
            decoded, note = decode_text(data)
            assert got.startswith(storable(decoded)) and (note is None or note in got)
    written, replaced = encode_content(text)
    assert (workspace / "w.txt").exists()
    assert ("lone surrogate" in seen["call_3_0"]) == bool(replaced)
    assert (os.fsencode(workspace) + b"/new\xff\xfe.txt") in [
        os.fsencode(p) for p in workspace.iterdir()
    ]
    with open(os.fsencode(workspace) + b"/new\xff\xfe.txt", "rb") as f:
        assert f.read() == written
    if "REDACTED" not in seen["call_4_0"]:
        shown = storable(decode_text(output)[0])
        assert seen["call_4_0"].startswith("exit code: 0")
        assert shown in seen["call_4_0"] and shown in seen["call_4_1"]
    assert (
        seen["call_5_0"] == seen["call_4_0"]
    )  # read_output gives the stored result back unchanged
    assert seen["call_5_1"].startswith("Error: no recorded tool result with call id")
    assert "call_5_2" in seen  # the odd call was answered (a result or an error), once


# -- stores --------------------------------------------------------------------------------
@pytest.fixture
def run_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    """The CLI's `main` in this process (fast enough for generated examples)."""
    for k in list(os.environ):
        if k.startswith(("OPENAI_", "DURABLE_AGENT_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.mark.slow
def test_generated_poison_through_every_tool_and_the_cli_on_both_stores(
    store_url: str, tmp_path: Path, run_cli: Callable[..., tuple[int, str, str]]
) -> None:
    engine = open_store_engine(store_url)
    store = Store(engine)
    counter = iter(range(1_000_000))

    @settings(
        max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(
        names=st.lists(NAMES, min_size=1, max_size=3, unique=True),
        data=st.data(),
        output=st.binary(max_size=80),
        text=MODEL_TEXT,
        odd=st.tuples(TOOL_NAMES, ARGUMENTS),
    )
    def one_run(
        names: list[bytes], data: st.DataObject, output: bytes, text: str, odd: tuple[str, str]
    ) -> None:
        names = [f"{i}_".encode() + n for i, n in enumerate(names)]  # never w.txt or new*.txt
        contents = [data.draw(CONTENTS) for _ in names]
        n = next(counter)
        workspace = Path(tempfile.mkdtemp(prefix=f"ws{n}-", dir=tmp_path))
        make_workspace(workspace, names, contents)
        script = tmp_path / f"script{n}.json"
        script.write_text(json.dumps(poison_script(names, contents, output, text, odd)))
        common = ["--db", store_url, "--quiet"]
        code, out, err = run_cli(
            "start",
            "poison",
            "--workspace",
            str(workspace),
            "--model",
            f"scripted:{script}",
            "--shell",
            "allow",
            "--max-steps",
            "3",
            "--json",
            *common,
        )
        assert code == 3, err  # budget_exceeded: stopped halfway on purpose
        run_id = json.loads(out)["run_id"]
        code, out, err = run_cli("resume", run_id, "--max-steps", "50", "--json", *common)
        assert code == 0, err
        assert json.loads(out)["status"] == "completed"
        for command in (
            ["show", run_id],
            ["show", run_id, "--json"],
            ["export", run_id],
            ["list"],
            ["list", "--json"],
        ):
            code, out, err = run_cli(*command, "--db", store_url)
            assert code == 0 and "Traceback" not in err, (command, err)
        check_observations(observations(store, run_id), workspace, names, contents, output, text)

    try:
        one_run()
    finally:
        engine.dispose()


# -- the real CLI in a subprocess, one fixed worst case ---------------------------------------
@pytest.mark.slow
def test_the_worst_case_run_in_a_real_process_on_both_stores(
    store_url: str, tmp_path: Path, env: dict[str, str]
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    names = [b"bad\xff\xfename.txt", b"latin.txt", b"nul.bin", b"mixed.txt"]
    contents = [
        b"hello\n",
        "café olé\n".encode("latin-1"),
        b"a\x00b\n",
        "naïve ".encode() + b"\xff\n",
    ]
    make_workspace(workspace, names, contents)
    os.mkdir(os.fsencode(workspace) + b"/dir\xfe")
    with open(os.fsencode(workspace) + b"/dir\xfe/in\xff.txt", "wb") as f:
        f.write(b"inside\n")
    output = b"a\x00b\xff\xfe" + "é".encode()
    script = tmp_path / "script.json"
    first = {"tool_calls": [{"name": "read_file", "arguments": {"path": "dir\\xfe/in\\xff.txt"}}]}
    turns = poison_script(names, contents, output, "x\ud800y\x00z", lead=[first])
    script.write_text(json.dumps(turns))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return forked_cli.run([*args, "--db", store_url], env=env, cwd=workspace)

    started = cli("start", "poison", "--model", f"scripted:{script}", "--shell", "allow", "--json")
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    for command in (["show", run_id], ["show", run_id, "--json"], ["export", run_id], ["list"]):
        done = cli(*command)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stderr)
    engine = open_store_engine(store_url)
    try:
        seen = observations(Store(engine), run_id)
    finally:
        engine.dispose()
    assert seen["call_0_0"] == "inside\n"  # a file in a folder whose name is not UTF-8
    # The first turn moved the others one on: renumber them back for the shared checks.
    shifted = {
        f"call_{int(k.split('_')[1]) - 1}_{k.split('_')[2]}": v
        for k, v in seen.items()
        if k != "call_0_0"
    }
    check_observations(shifted, workspace, names, contents, output, "x\ud800y\x00z")
    assert (
        "bad\\xff\\xfename.txt" in shifted["call_0_0"]
        and "dir\\xfe/in\\xff.txt" in shifted["call_0_0"]
    )
    assert "[decoded as latin-1" in shifted["call_2_1"] and "café olé" in shifted["call_2_1"]
    assert "binary file, not shown" in shifted["call_2_2"]
    assert "naïve \\xff" in shifted["call_2_3"]
    assert "a\\x00b" in shifted["call_4_0"]  # NUL in command output, visible and storable


# -- killed anywhere with the poison in its history, then resumed -------------------------------
@pytest.mark.parametrize("crash_after", [1, 5, 11, 22, 37, 47])
def test_a_poisoned_run_killed_at_a_checkpoint_resumes_to_completion(
    store_url: str, tmp_path: Path, env: dict[str, str], crash_after: int
) -> None:
    """SIGKILL at the k-th checkpoint boundary (test_crash.py's switch), then resume: the
    history read back must hash to the keys recorded before the kill (a model step cut off
    is matched by its request hash, a tool step by its arguments), or resume would refuse."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    names = [b"bad\xff\xfename.txt", b"latin.txt", b"nul.bin"]
    contents = [b"hello\n", "café\n".encode("latin-1"), b"a\x00b\n"]
    make_workspace(workspace, names, contents)
    script = tmp_path / "script.json"
    text = "x\ud800y\x00z\udcff"
    script.write_text(json.dumps(poison_script(names, contents, b"a\x00b\xff", text)))
    config = tmp_path / "config.toml"
    config.write_text('on_uncertain_exec = "tell_model"\n')  # a cut-off command: tell, do not block
    e = {**env, "DURABLE_AGENT_CONFIG": str(config)}

    def cli(*args: str, crash: int | None = None) -> subprocess.CompletedProcess[str]:
        extra = {} if crash is None else {"DURABLE_AGENT_CRASH_AFTER": str(crash)}
        return forked_cli.run(
            [*args, "--db", store_url, "--quiet"], env={**e, **extra}, cwd=workspace
        )

    first = cli(
        "start",
        "poison",
        "--model",
        f"scripted:{script}",
        "--shell",
        "allow",
        "--run-id",
        "p1",
        crash=crash_after,
    )
    assert first.returncode == -9, first.stderr  # killed mid-run (the run has about 50 boundaries)
    for _ in range(3):  # a kill can leave a command cut off: that is one resume each
        resumed = cli("resume", "p1")
        if resumed.returncode == 0 or "already completed" in resumed.stderr:
            break
    assert "Traceback" not in resumed.stderr
    engine = open_store_engine(store_url)
    try:
        run = Store(engine).get_run("p1")
        assert (run.status, run.answer) == ("completed", storable(f"done {text}"))
        seen = observations(Store(engine), "p1")
    finally:
        engine.dispose()
    assert "bad\\xff\\xfename.txt" in seen["call_0_0"]
    with open(os.fsencode(workspace) + b"/new\xff\xfe.txt", "rb") as f:
        assert f.read() == encode_content(text)[0]


def test_a_workspace_whose_own_path_is_not_utf8_resumes(
    tmp_path: Path, env: dict[str, str], write_script: Callable[..., str]
) -> None:
    workspace = os.fsencode(tmp_path) + b"/w\xffs"
    os.mkdir(workspace)
    model = write_script(
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a", "content": "x"}}]},
            {"content": "ok"},
        ]
    )

    def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "durable_agent", *args, "--quiet"],
            env=env,
            cwd=workspace,
            capture_output=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    assert cli("start", "t", "--model", model, "--max-steps", "1", "--run-id", "w").returncode == 3
    # The recorded workspace is `...w\xffs` (storable); resume finds the folder it names.
    resumed = cli("resume", "w", "--max-steps", "5")
    assert resumed.returncode == 0, resumed.stderr
    assert os.path.exists(workspace + b"/a")


def test_a_poisoned_command_that_needs_approval_on_both_stores(
    store_url: str, tmp_path: Path, run_cli: Callable[..., tuple[int, str, str]]
) -> None:
    """`--shell ask`: the command (NUL, a lone surrogate, a byte escape) is stored in the
    approvals row and shown by `show`; approved, it runs (or fails as an observation)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {
                    "tool_calls": [
                        {
                            "name": "run_command",
                            "arguments": {"command": "rm -rf x\x00 \ud800 \udcff"},
                        }
                    ]
                },
                {"content": "done"},
            ]
        )
    )
    db = ["--db", store_url]
    code, out, err = run_cli(
        "start",
        "task \udcff\udcfe",
        "--workspace",
        str(workspace),
        "--model",
        f"scripted:{script}",
        "--run-id",
        "ask1",
        "--json",
        *db,
    )
    assert code == 5 and json.loads(out)["status"] == "blocked", err
    code, out, err = run_cli("show", "ask1", *db)
    assert code == 0 and "rm -rf x\\x00 \ufffd \\xff" in out, err
    assert (
        run_cli("approve", "ask1", "--by", "me\udcff", *db)[0] == 0
    )  # argv bytes that are not UTF-8
    code, out, err = run_cli("resume", "ask1", "--json", *db)
    assert code == 0 and json.loads(out)["status"] == "completed", err
    engine = open_store_engine(store_url)
    try:
        seen = observations(Store(engine), "ask1")
    finally:
        engine.dispose()
    assert seen["call_0_0"].startswith("Error: ")  # a NUL cannot be in an argv: an observation
    for command in (["show", "ask1"], ["export", "ask1"], ["list"]):
        assert run_cli(*command, *db)[0] == 0


# -- the file tools in this process: the fast bulk ----------------------------------------------
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=st.one_of(st.text(ANY_CHAR, max_size=12), NAMES.map(lambda b: show_name(os.fsdecode(b)))),
    content=MODEL_TEXT,
    data=CONTENTS,
)
def test_file_tools_fail_only_as_observations(
    tmp_path: Path, path: str, content: str, data: bytes
) -> None:
    """Any path text and content: a result or a ToolFailure (or an OSError, which the loop
    turns into an observation too), never an encoding error; and a Latin-1 file edited in
    one place keeps every other byte."""
    from durable_agent.tools import build_tools
    from durable_agent.tools.base import ToolContext, ToolFailure

    workspace = Path(tempfile.mkdtemp(dir=tmp_path))
    (workspace / "f.txt").write_bytes(data)
    tools = build_tools("deny")
    ctx = ToolContext(workspace=workspace, run_id="r", call_id="c")
    for name, args in [
        ("write_file", {"path": path, "content": content}),
        ("read_file", {"path": path}),
        ("list_files", {"path": path}),
        ("search_text", {"pattern": ".", "path": path}),
        ("edit_file", {"path": path, "old_string": content[:1] or "x", "new_string": content}),
    ]:
        tool = tools[name]
        with contextlib.suppress(ToolFailure, OSError):
            tool.run(tool.args_model.model_validate(args), ctx)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.text(
        st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
        min_size=1,
        max_size=80,
    ),
    at=st.integers(0, 79),
)
def test_a_latin1_file_edited_in_one_place_keeps_every_other_byte(
    tmp_path: Path, text: str, at: int
) -> None:
    from durable_agent.encoding import text_encoding
    from durable_agent.tools import build_tools
    from durable_agent.tools.base import ToolContext

    data = text.encode("latin-1")
    assume(text_encoding(data) == "latin-1" and not looks_binary(data))
    old = text[at % len(text)]
    assume(text.count(old) == 1)
    workspace = Path(tempfile.mkdtemp(dir=tmp_path))
    (workspace / "f.txt").write_bytes(data)
    tool = build_tools("deny")["edit_file"]
    ctx = ToolContext(workspace=workspace, run_id="r", call_id="c")
    result = tool.run(
        tool.args_model.model_validate({"path": "f.txt", "old_string": old, "new_string": "é"}), ctx
    )
    assert result.error is None
    assert (workspace / "f.txt").read_bytes() == data.replace(old.encode("latin-1"), b"\xe9")
