"""`--sandbox` with real bubblewrap (and the real Landlock fallback): doctor, the refusal
when no mechanism is available, legitimate work inside (pytest with tmp dirs, git
add/commit in a workspace repo, a verify command), what is recorded with the run, the
network switch, and a sandboxed command that must still die with its harness."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_support import Listener, need_bwrap, open_listener
from scale_helpers import wait_for
from side_effects_support import AS_NOBODY, need_nobody, nobodys_folder, run_cli

from durable_agent.tools.os_sandbox import (
    LANDLOCK_SCRIPT,
    Mechanism,
    Sandbox,
    SandboxMode,
    SandboxUnavailable,
    bwrap_argv,
    landlock_abi,
    resolve_sandbox,
    store_refusal,
)
from durable_agent.tools.process import command_env, run_process

PY = sys.executable


@pytest.fixture(name="listener")
def _listener() -> Iterator[Listener]:
    yield from open_listener()


@pytest.fixture
def no_mechanism(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """An environment where neither bubblewrap (not on PATH) nor Landlock (the test hook)
    is available. Commands run by absolute path or as bash builtins."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    safe = {k: v for k, v in env.items() if k != "DURABLE_AGENT_SANDBOX"}  # see conftest.NO_SANDBOX
    return {**safe, "PATH": str(empty), "DURABLE_AGENT_NO_LANDLOCK": "1"}


def _turns(*commands: str) -> list[dict[str, object]]:
    return [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": c}}]} for c in commands
    ] + [{"content": "done"}]


def _tool_outputs(db: Path, run_id: str) -> list[str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT content FROM messages WHERE run_id=? AND role='tool' ORDER BY seq", (run_id,)
        ).fetchall()
    return [r[0] for r in rows]


# -- doctor ------------------------------------------------------------------------------------
def test_doctor_names_bubblewrap_and_passes_its_self_check(cli) -> None:  # type: ignore[no-untyped-def]
    need_bwrap()
    r = cli("doctor")
    assert r.code == 0, r.stdout + r.stderr
    assert "workspace-write by bubblewrap, network off" in r.stdout
    for check in (
        "a write inside the workspace works",
        "a write outside the workspace fails",
        ".git/config is read-only",
        "the network is off",
        "other processes are hidden",
        "daemon sockets under /run are hidden",
        "kernel settings are read-only (/proc/sys)",
    ):
        assert f"ok  {check}" in r.stdout
    assert "✓ the sandbox works" in r.stdout


def test_doctor_and_start_refuse_with_one_clear_line_when_no_mechanism(  # type: ignore[no-untyped-def]
    no_mechanism, workspace, write_script
) -> None:
    r = run_cli(no_mechanism, workspace, "doctor")
    assert r.code == 1
    assert "install bubblewrap" in r.stdout and "--sandbox off" in r.stdout
    script = write_script(_turns("echo ran > ledger"))
    s = run_cli(no_mechanism, workspace, "start", "t", "--model", script, "--shell", "allow")
    assert s.code == 2
    lines = s.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "refusing to run commands" in lines[0]
        and "install bubblewrap" in lines[0]
    )
    assert not (workspace / "ledger").exists()
    # Said plainly, it runs unconfined; and a run without commands needs no sandbox at all.
    off = run_cli(
        no_mechanism,
        workspace,
        "start",
        "t",
        "--model",
        script,
        "--shell",
        "allow",
        "--sandbox",
        "off",
        "--run-id",
        "off",
    )
    assert off.code == 0, off.stderr
    assert (workspace / "ledger").read_text() == "ran\n"
    files_only = run_cli(
        no_mechanism,
        workspace,
        "start",
        "t",
        "--model",
        write_script([{"content": "ok"}]),
        "--shell",
        "deny",
    )
    assert files_only.code == 0, files_only.stderr


def test_run_process_refuses_rather_than_running_unconfined(tmp_path: Path, no_mechanism) -> None:  # type: ignore[no-untyped-def]
    sandbox = resolve_sandbox("workspace-write", False, no_mechanism)
    assert sandbox.mechanism is Mechanism.NONE
    with pytest.raises(SandboxUnavailable, match="install bubblewrap"):
        run_process(
            f"echo ran > {tmp_path}/ledger", cwd=tmp_path, env={}, timeout_s=10, sandbox=sandbox
        )
    assert not (tmp_path / "ledger").exists()


def test_landlock_is_used_only_where_it_keeps_the_harness_environment_out(tmp_path: Path) -> None:
    # Some kernels run Landlock without its ptrace-class denial: a command there opens
    # /proc/<harness>/environ (the API key). Looked at here with the helper itself, then
    # the fallback must be refused (commands never run), not used with a warning.
    if landlock_abi() == 0:
        pytest.skip("the kernel has no Landlock")
    probe = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(LANDLOCK_SCRIPT),
            "read-only",
            str(tmp_path),
            str(tmp_path),
            "off",
            "--",
            "/bin/sh",
            "-c",
            f": < /proc/{os.getpid()}/environ",
        ],
        capture_output=True,
        check=False,
    )
    sandbox = resolve_sandbox("workspace-write", False, {"PATH": str(tmp_path / "no-bwrap")})
    if probe.returncode == 0:
        assert sandbox.mechanism is Mechanism.NONE and "/proc/PID/environ" in sandbox.problem
        with pytest.raises(SandboxUnavailable):
            run_process(
                f"echo ran > {tmp_path}/ledger", cwd=tmp_path, env={}, timeout_s=10, sandbox=sandbox
            )
        assert not (tmp_path / "ledger").exists()
    else:
        assert probe.returncode != 126, probe.stderr  # the helper itself worked
        assert sandbox.mechanism is Mechanism.LANDLOCK


def test_the_landlock_helper_confines_writes_on_any_kernel_with_landlock(tmp_path: Path) -> None:
    # Whether or not this kernel's Landlock is good enough to be the fallback, the helper's
    # filesystem rules are real: the workspace and the private TMPDIR only.
    if landlock_abi() == 0:
        pytest.skip("the kernel has no Landlock")
    ws, outside = tmp_path / "ws", tmp_path / "outside.txt"
    ws.mkdir()
    outside.write_text("keep\n")
    sandbox = Sandbox(
        SandboxMode.WORKSPACE_WRITE, False, Mechanism.LANDLOCK, landlock_abi=landlock_abi()
    )
    out = run_process(
        f"echo in > inside.txt; echo out > {outside}; echo t > $TMPDIR/t && echo tmp-ok",
        cwd=ws,
        env={"PATH": os.environ["PATH"]},
        timeout_s=20,
        sandbox=sandbox,
        workspace=ws,
    )
    assert (ws / "inside.txt").read_text() == "in\n" and outside.read_text() == "keep\n"
    assert "tmp-ok" in out.stdout and "Permission denied" in out.stdout + out.stderr


def test_landlock_fallback_confines_writes_and_says_what_it_does_not_enforce(  # type: ignore[no-untyped-def]
    tmp_path: Path, env, workspace, write_script
) -> None:
    sandbox = resolve_sandbox("workspace-write", False, {"PATH": str(tmp_path)})
    if sandbox.mechanism is not Mechanism.LANDLOCK:
        pytest.skip(f"the kernel has no usable Landlock here ({sandbox.problem})")
    no_bwrap = {
        k: v for k, v in env.items() if k != "DURABLE_AGENT_SANDBOX"
    }  # see conftest.NO_SANDBOX
    no_bwrap["PATH"] = str(tmp_path / "empty")
    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n")
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("[core]\n")
    script = write_script(
        _turns(
            f"echo in > inside.txt; echo out > {outside}; echo t > $TMPDIR/t && echo tmp-ok",
            "echo '[core] fsmonitor = x' >> .git/config",
        )
    )
    r = run_cli(
        no_bwrap, workspace, "start", "t", "--model", script, "--shell", "allow", "--run-id", "ll"
    )
    assert r.code == 0, r.stderr
    warning = [line for line in r.stderr.splitlines() if "falling back to Landlock" in line]
    assert len(warning) == 1 and "not enforced" in warning[0] and "PID namespace" in warning[0]
    assert (workspace / "inside.txt").read_text() == "in\n"
    assert outside.read_text() == "keep\n"
    out = _tool_outputs(tmp_path / "store.db", "ll")[0]
    assert "tmp-ok" in out and "Permission denied" in out
    # Landlock cannot make .git read-only inside a writable workspace: the change is named.
    assert "note: this command changed .git/config" in _tool_outputs(tmp_path / "store.db", "ll")[1]
    d = run_cli(no_bwrap, workspace, "doctor")
    assert d.code == 0 and "by landlock" in d.stdout, d.stdout


# -- legitimate work -----------------------------------------------------------------------------
@pytest.mark.slow
def test_pytest_git_commit_and_verify_work_inside_the_sandbox(cli, workspace, db_path) -> None:  # type: ignore[no-untyped-def]
    need_bwrap()
    (workspace / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (workspace / "test_calc.py").write_text(
        textwrap.dedent("""\
        from calc import add

        def test_add(tmp_path):
            (tmp_path / "x").write_text("tmp dirs work")
            assert add(2, 3) == 5
        """)
    )
    git = "git -c user.name=Agent -c user.email=agent@example.com"
    script = [
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {"command": f"{PY} -m pytest -q -p no:cacheprovider"},
                }
            ]
        },
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {
                        "command": f"git init -q && {git} add calc.py test_calc.py && {git} commit -qm first && git status --short"
                    },
                }
            ]
        },
        {
            "tool_calls": [
                {
                    "name": "edit_file",
                    "arguments": {"path": "calc.py", "old_string": "a + b", "new_string": "b + a"},
                }
            ]
        },
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {
                        "command": f"git diff --stat && {git} commit -qam second && git log --oneline | wc -l"
                    },
                }
            ]
        },
        {
            "tool_calls": [
                {"name": "run_command", "arguments": {"command": "git config user.name Mallory"}}
            ]
        },
        {"content": "done"},
    ]
    path = workspace.parent / "legit.json"
    path.write_text(json.dumps(script))
    r = cli(
        "start",
        "t",
        "--model",
        f"scripted:{path}",
        "--shell",
        "allow",
        "--run-id",
        "legit",
        "--verify",
        f"{PY} -m pytest -q -p no:cacheprovider",
    )
    assert r.code == 0, r.stderr
    outputs = _tool_outputs(db_path, "legit")
    assert outputs[0].startswith("exit code: 0") and "1 passed" in outputs[0]
    assert outputs[1].startswith("exit code: 0"), outputs[1]
    assert outputs[3].startswith("exit code: 0") and outputs[3].rstrip().endswith("2"), outputs[3]
    assert not outputs[4].startswith(
        "exit code: 0"
    )  # the documented rule: .git/config is read-only
    log = subprocess.run(
        ["git", "log", "--format=%s"], cwd=workspace, capture_output=True, text=True, check=True
    )
    assert log.stdout.split() == ["second", "first"]
    assert "Mallory" not in (workspace / ".git" / "config").read_text()


def test_make_a_compiler_and_a_nested_repo_commit_work_inside_the_sandbox(  # type: ignore[no-untyped-def]
    cli, workspace, write_script, db_path
) -> None:
    need_bwrap()
    missing = [tool for tool in ("make", "cc") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"not installed here: {', '.join(missing)}")
    (workspace / "hello.c").write_text(
        '#include <stdio.h>\nint main(void) { puts("hello from cc"); return 0; }\n'
    )
    # cc writes its temporary files under TMPDIR (/tmp inside: private) and the output here.
    (workspace / "Makefile").write_text("hello: hello.c\n\tcc -O0 -o hello hello.c\n")
    lib = workspace / "vendor" / "lib"
    lib.mkdir(parents=True)
    (lib / "a.txt").write_text("a\n")
    git = "git -c user.name=Agent -c user.email=agent@example.com"
    subprocess.run(
        f"git init -q && {git} add a.txt && {git} commit -qm a", shell=True, cwd=lib, check=True
    )
    script = write_script(
        _turns(
            "make && ./hello",
            f"echo b >> vendor/lib/a.txt && {git} -C vendor/lib commit -qam b && git -C vendor/lib log --oneline | wc -l",
        )
    )
    r = cli("start", "t", "--model", script, "--shell", "allow", "--run-id", "build")
    assert r.code == 0, r.stderr
    made, committed = _tool_outputs(db_path, "build")
    assert made.startswith("exit code: 0") and "hello from cc" in made, made
    assert committed.startswith("exit code: 0") and committed.rstrip().endswith("2"), committed
    assert (workspace / "hello").is_file()


def test_a_bare_repository_a_command_made_is_protected_from_the_next_command(  # type: ignore[no-untyped-def]
    cli, workspace, write_script, db_path, tmp_path
) -> None:
    # Not named .git, so only its shape says it is one: the config a later command plants
    # would run at the user's next paged git command there, outside any sandbox.
    need_bwrap()
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    pwned = tmp_path / "PWNED"
    script = write_script(
        _turns(
            "git init -q --bare tools && ls tools",
            f"printf '[core]\\n\\tpager = touch {pwned}\\n' >> tools/config; tail -n 1 tools/config",
        )
    )
    r = cli("start", "t", "--model", script, "--shell", "allow", "--run-id", "bare")
    assert r.code == 0, r.stderr
    made, planted = _tool_outputs(db_path, "bare")
    assert made.startswith("exit code: 0") and "objects" in made, made
    assert "Read-only file system" in planted, planted
    assert "pager" not in (workspace / "tools" / "config").read_text()


@pytest.mark.parametrize(
    ("make", "config"),
    [
        # A folder shaped like a bare repository (here the workspace root itself) hid every
        # repository below it from the walk: the workspace's own .git/config became writable.
        ("mkdir objects refs && touch config && git init -q && ls", ".git/config"),
        # A repository under a name the walk skips, and a common dir inside a .git, named by
        # a commondir file: git reads both configs.
        ("git init -q --bare node_modules && ls node_modules", "node_modules/config"),
        (
            "mkdir -p c/.git/x/objects c/.git/x/refs v && touch c/.git/x/config && "
            "echo 'ref: refs/heads/main' > v/HEAD && echo ../c/.git/x > v/commondir && ls v",
            "c/.git/x/config",
        ),
        # git reads a .git file or commondir whole, dropping only trailing newlines: a name
        # ending in a space is another folder than the one stripped of it.
        (
            "git init -q --bare '.git/x ' && mkdir w && printf 'gitdir: ../.git/x \\n' > w/.git && "
            "git -C w rev-parse --git-dir",
            ".git/x /config",
        ),
        # Inside a folder shaped like a bare repository's objects/, and behind a link into .git.
        (
            "mkdir -p objects refs && touch config && git init -q objects/x && echo made",
            "objects/x/.git/config",
        ),
        ("git init -q .git/x && ln -s .git/x proj && echo made", ".git/x/.git/config"),
        # Under a name git's object store uses; a .git link to a `gitdir:` file elsewhere.
        (
            "git init -q --bare tools && git init -q tools/objects/pack && echo made",
            "tools/objects/pack/.git/config",
        ),
        (
            "git init -q . && git init -q --bare .git/x && printf 'gitdir: ../.git/x\\n' > gf && mkdir sub && "
            "ln -s ../gf sub/.git && git -C sub rev-parse --git-dir",
            ".git/x/config",
        ),
    ],
    ids=[
        "root-shaped-like-one",
        "skipped-name",
        "common-dir-inside-dot-git",
        "name-ending-in-a-space",
        "inside-objects",
        "behind-a-link",
        "in-an-object-store-name",
        "link-to-a-gitdir-file",
    ],
)
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_every_config_git_would_read_is_read_only_for_the_next_command(  # type: ignore[no-untyped-def]
    cli, workspace, write_script, db_path, make, config
) -> None:
    need_bwrap()
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    script = write_script(_turns(make, f"echo '[core]' >> '{config}' && echo wrote"))
    r = cli("start", "t", "--model", script, "--shell", "allow", "--run-id", "cfg")
    assert r.code == 0, r.stderr
    made, planted = _tool_outputs(db_path, "cfg")
    assert made.startswith("exit code: 0"), made
    assert "wrote" not in planted and ("Read-only file system" in planted or "busy" in planted), (
        planted
    )


def test_a_path_longer_than_the_system_takes_does_not_stop_the_next_command(  # type: ignore[no-untyped-def]
    cli, write_script, db_path, workspace
) -> None:
    # A folder the walk could not open (ENAMETOOLONG) was bound read-only: bwrap could not
    # find it, and every later command failed, in any run in that workspace.
    need_bwrap()
    long = "/".join(["x" * 250] * 20)
    script = write_script(_turns(f"mkdir -p {long} && echo made", "echo second"))
    try:
        r = cli("start", "t", "--model", script, "--shell", "allow", "--run-id", "longpath")
        assert r.code == 0, r.stderr
        made, second = _tool_outputs(db_path, "longpath")
        assert (
            made.startswith("exit code: 0")
            and second.startswith("exit code: 0")
            and "second" in second
        ), second
    finally:
        subprocess.run(["rm", "-rf", "x" * 250], cwd=workspace, check=False)


def test_a_tree_a_thousand_folders_deep_does_not_stop_the_next_command(  # type: ignore[no-untyped-def]
    cli, write_script, db_path, workspace
) -> None:
    # Python 3.11's os.walk recursed: RecursionError before every later command, resume too.
    need_bwrap()
    script = write_script(
        _turns('mkdir -p $(printf "a/%.0s" $(seq 1100)) && echo made', "echo second")
    )
    try:
        r = cli("start", "t", "--model", script, "--shell", "allow", "--run-id", "deeptree")
        assert r.code == 0, r.stderr
        made, second = _tool_outputs(db_path, "deeptree")
        assert (
            made.startswith("exit code: 0")
            and second.startswith("exit code: 0")
            and "second" in second
        ), second
        with sqlite3.connect(db_path) as conn:
            notes = [
                r[0]
                for r in conn.execute(
                    "SELECT json_extract(output, '$.workspace_note') FROM steps "
                    "WHERE run_id = 'deeptree' AND kind = 'tool' ORDER BY seq"
                )
            ]
        assert notes[0] and "levels deep left out of the snapshot" in notes[0], notes
    finally:
        subprocess.run(["rm", "-rf", "a"], cwd=workspace, check=False)  # (shutil.rmtree recurses)


def test_read_only_mode_refuses_writes_in_the_workspace(
    cli, workspace, write_script, db_path
) -> None:  # type: ignore[no-untyped-def]
    need_bwrap()
    (workspace / "a.txt").write_text("a\n")
    script = write_script(_turns("cat a.txt; echo b > a.txt"))
    r = cli(
        "start",
        "t",
        "--model",
        script,
        "--shell",
        "allow",
        "--sandbox",
        "read-only",
        "--run-id",
        "ro",
    )
    assert r.code == 0, r.stderr
    assert (workspace / "a.txt").read_text() == "a\n"
    assert "Read-only file system" in _tool_outputs(db_path, "ro")[0]


def test_a_store_inside_the_workspace_is_refused_where_commands_could_rewrite_it(  # type: ignore[no-untyped-def]
    cli, workspace, write_script
) -> None:
    """A command that can write the store can write `runs.settings`: `sandbox` set to `off`
    there, and the next resume runs everything unconfined. So a writable workspace must not
    hold the store; a read-only one may."""
    need_bwrap()
    script = write_script(_turns("echo ran > ledger"))
    (workspace / "data").mkdir()
    for db in (
        "agent.db",
        f"sqlite:///{workspace / 'data' / 'agent.db'}",
        str(workspace / "data" / "agent.db"),
    ):
        r = cli("start", "t", "--model", script, "--shell", "allow", "--db", db)
        lines = r.stderr.strip().splitlines()
        assert r.code == 2 and len(lines) == 1 and "is inside the workspace" in lines[0], r.stderr
        assert "--sandbox read-only" in lines[0]
    assert not (workspace / "ledger").exists()
    assert not (workspace / "agent.db").exists() and not (workspace / "data" / "agent.db").exists()
    db = str(workspace / "agent.db")
    assert store_refusal(resolve_sandbox("workspace-write", False, os.environ), db, workspace)
    assert store_refusal(resolve_sandbox("read-only", False, os.environ), db, workspace) is None
    assert (
        store_refusal(
            resolve_sandbox("workspace-write", False, os.environ),
            str(workspace.parent / "agent.db"),
            workspace,
        )
        is None
    )
    assert (
        store_refusal(
            resolve_sandbox("workspace-write", False, os.environ),
            "postgresql://127.0.0.1/test",
            workspace,
        )
        is None
    )


# -- recorded with the run, shown by `show` --------------------------------------------------
def test_mode_and_mechanism_are_recorded_and_shown(cli, write_script, sql) -> None:  # type: ignore[no-untyped-def]
    need_bwrap()
    r = cli(
        "start", "t", "--model", write_script(_turns("true")), "--shell", "allow", "--run-id", "rec"
    )
    assert r.code == 0, r.stderr
    settings = json.loads(sql("SELECT settings FROM runs WHERE id='rec'")[0][0])
    assert (settings["sandbox"], settings["network"], settings["sandbox_mechanism"]) == (
        "workspace-write",
        False,
        "bubblewrap",
    )
    shown = cli("show", "rec")
    assert "sandbox    workspace-write by bubblewrap, network off" in shown.stdout
    again = cli(
        "resume", "rec"
    )  # a completed run: but the recorded mechanism must not break loading
    assert again.code == 2


# -- network -------------------------------------------------------------------------------------
def test_network_is_off_by_default_and_on_when_asked(tmp_path: Path, listener: Listener) -> None:
    need_bwrap()
    connect = f"{PY} -c \"import socket; socket.create_connection(('127.0.0.1', {listener.port}), timeout=5)\""
    env = command_env(os.environ, run_id="r", call_id="c")
    off = run_process(
        connect,
        cwd=tmp_path,
        env=env,
        timeout_s=30,
        sandbox=resolve_sandbox("workspace-write", False, os.environ),
    )
    assert off.exit_code != 0 and listener.connections() == 0
    on = run_process(
        connect,
        cwd=tmp_path,
        env=env,
        timeout_s=30,
        sandbox=resolve_sandbox("workspace-write", True, os.environ),
    )
    assert on.exit_code == 0, on.stderr
    assert listener.connections() == 1  # the positive control: the listener can see one


# -- the guard still holds -------------------------------------------------------------------------
def _marked(marker: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry.name}/cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_sandboxed_command_dies_with_its_harness(tmp_path: Path) -> None:
    need_bwrap()
    marker = f"1000.{uuid.uuid4().int % 10**6}"  # a sleep no one else runs
    harness = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from durable_agent.tools.os_sandbox import resolve_sandbox
        from durable_agent.tools.process import command_env, run_process
        run_process("sleep {marker} & setsid sleep {marker} & wait", cwd=Path({str(tmp_path)!r}),
                    env=command_env(os.environ, run_id="r", call_id="c"), timeout_s=600,
                    sandbox=resolve_sandbox("workspace-write", False, os.environ))
        """)
    proc = subprocess.Popen([PY, "-c", harness])
    try:
        wait_for(lambda: len(_marked(f"sleep\0{marker}")) == 2, timeout_s=30)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # Even the `setsid` one, which left the process group: the PID namespace goes with bwrap.
        wait_for(lambda: not _marked(f"sleep\0{marker}"), timeout_s=30)
    finally:
        proc.kill()
        proc.wait()
        for pid in _marked(f"sleep\0{marker}"):
            os.kill(pid, signal.SIGKILL)


# -- the wrapper itself --------------------------------------------------------------------------
def test_every_git_dir_in_the_workspace_gets_its_code_paths_bound_read_only(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for repo in (ws, ws / "a" / "b"):
        (repo / ".git" / "hooks").mkdir(parents=True)
        (repo / ".git" / "config").write_text("[core]\n")
    (ws / "wt").mkdir()
    (ws / "gitdata").mkdir()
    (ws / "gitdata" / "config").write_text("[core]\n")
    (ws / "wt" / ".git").write_text("gitdir: ../gitdata\n")  # a worktree-style .git file
    need_bwrap()
    sandbox = resolve_sandbox("workspace-write", False, os.environ)
    argv = bwrap_argv(sandbox, ["true"], cwd=ws, workspace=ws)
    ro = {argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"}
    for path in (
        ws / ".git" / "config",
        ws / ".git" / "hooks",
        ws / "a" / "b" / ".git" / "config",
        ws / "a" / "b" / ".git" / "hooks",
        ws / "wt" / ".git",
        ws / "gitdata" / "config",
        ws / "gitdata" / "hooks",
    ):
        assert str(path) in ro, path
    # Pinned (bound onto themselves) so that no repository can be moved aside and replaced:
    # every git dir and every directory between the workspace and one.
    pinned = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind" and argv[i + 1] != str(ws)]
    assert pinned == [
        str(p)
        for p in (
            ws / ".git",
            ws / "a",
            ws / "gitdata",
            ws / "wt",
            ws / "a" / "b",
            ws / "a" / "b" / ".git",
        )
    ]
    assert argv.index("--bind", argv.index(str(ws)) + 1) < argv.index(str(ws / ".git" / "config"))
    assert "--unshare-net" in argv and "--cap-drop" in argv and "--unshare-pid" in argv
    assert "--unshare-net" not in bwrap_argv(
        resolve_sandbox("workspace-write", True, os.environ), ["true"], cwd=ws, workspace=ws
    )


def test_cancel_kills_a_sandboxed_command_and_everything_it_started(  # type: ignore[no-untyped-def]
    env, workspace, tmp_path, write_script
) -> None:
    need_bwrap()
    from side_effects_support import spawn

    marker = f"1000.{uuid.uuid4().int % 10**6}"
    script = write_script(_turns(f"sleep {marker} & setsid sleep {marker} & wait"))
    proc = spawn(
        env,
        workspace,
        tmp_path / "logs",
        "start",
        "t",
        "--model",
        script,
        "--shell",
        "allow",
        "--run-id",
        "cx",
    )
    try:
        wait_for(
            lambda: len(_marked(f"sleep\0{marker}")) == 2, timeout_s=30, what="the sandboxed sleeps"
        )
        assert run_cli(env, workspace, "cancel", "cx").code == 0
        assert proc.wait(timeout=30) == 4, proc.stderr()
        # Deterministic: bwrap's init is in the group, and a dying PID-namespace init leaves the
        # live set only after every other process of its namespace is gone.
        assert not _marked(f"sleep\0{marker}")
    finally:
        proc.kill()
        for pid in _marked(f"sleep\0{marker}"):
            os.kill(pid, signal.SIGKILL)


def test_daemon_sockets_under_run_are_out_of_reach(tmp_path: Path) -> None:
    """A read-only mount does not stop connect() on a unix socket: /run (PostgreSQL with
    trust auth, docker.sock, D-Bus) must be hidden, not just read-only."""
    need_bwrap()
    import socket

    path = Path(f"/run/durable-agent-test-{uuid.uuid4().hex[:12]}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
    except OSError as exc:
        server.close()
        pytest.skip(f"cannot create a socket under /run here: {exc}")
    try:
        server.listen(4)
        server.setblocking(False)
        connect = (
            f"{PY} -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{path}')\""
        )
        env = command_env(os.environ, run_id="r", call_id="c")
        inside = run_process(
            connect,
            cwd=tmp_path,
            env=env,
            timeout_s=30,
            sandbox=resolve_sandbox("workspace-write", True, os.environ),
        )
        assert inside.exit_code != 0 and "No such file" in inside.stderr
        outside = run_process(connect, cwd=tmp_path, env=env, timeout_s=30, sandbox=None)
        assert outside.exit_code == 0, outside.stderr  # the positive control
    finally:
        server.close()
        path.unlink(missing_ok=True)


def test_kernel_settings_stay_read_only_even_for_root(tmp_path: Path) -> None:
    """Root without capabilities may still write most sysctls, and some name programs the
    kernel runs as root outside any namespace (`kernel.core_pattern = |/ws/x`,
    `kernel.modprobe`): /proc/sys must be read-only inside. Opened for append, never written."""
    need_bwrap()
    probe = (
        f'{PY} -c "import os, sys\n'
        "for p in ('/proc/sys/kernel/core_pattern', '/proc/sys/kernel/modprobe', '/proc/sysrq-trigger'):\n"
        "    try: open(p, 'a').close()\n"
        "    except OSError as e: print(p, e.strerror)\n"
        "    else: print(p, 'WRITABLE')\""
    )
    env = command_env(os.environ, run_id="r", call_id="c")
    inside = run_process(
        probe,
        cwd=tmp_path,
        env=env,
        timeout_s=30,
        sandbox=resolve_sandbox("workspace-write", False, os.environ),
    )
    assert inside.exit_code == 0 and "/proc/sys/kernel/core_pattern" in inside.stdout, inside.stderr
    assert "WRITABLE" not in inside.stdout, inside.stdout
    if os.geteuid() == 0:  # as root, only the read-only mount stands in the way
        assert "core_pattern Read-only file system" in inside.stdout, inside.stdout


def test_a_resume_on_a_host_with_another_mechanism_says_so_and_records_it(  # type: ignore[no-untyped-def]
    env, workspace, tmp_path, write_script, sql
) -> None:
    need_bwrap()
    if (
        resolve_sandbox("workspace-write", False, {"PATH": str(tmp_path)}).mechanism
        is not Mechanism.LANDLOCK
    ):
        pytest.skip("needs Landlock as the second mechanism")
    script = write_script(_turns("echo here > made-here"))  # a builtin: PATH is empty later
    first = run_cli(
        env, workspace, "start", "t", "--model", script, "--run-id", "mv"
    )  # --shell ask: blocks
    assert first.code == 5, first.stderr
    assert run_cli(env, workspace, "approve", "mv").code == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    again = run_cli({**env, "PATH": str(empty)}, workspace, "resume", "mv")
    assert again.code == 0, again.stderr
    assert "sandbox_mechanism: 'bubblewrap' → 'landlock'" in again.stderr
    assert (
        json.loads(sql("SELECT settings FROM runs WHERE id='mv'")[0][0])["sandbox_mechanism"]
        == "landlock"
    )
    assert (workspace / "made-here").exists()


def test_a_worker_without_a_sandbox_leaves_the_run_for_one_with_it(  # type: ignore[no-untyped-def]
    env, workspace, write_script, no_mechanism
) -> None:
    script = write_script(_turns("echo ran > ledger"))
    # Enqueued as if from a host with a sandbox (this one may have none): --sandbox off to get
    # past `start`'s own check, then the recorded mode set to what such a host records.
    queued = run_cli(
        env,
        workspace,
        "start",
        "t",
        "--model",
        script,
        "--shell",
        "allow",
        "--detach",
        "--run-id",
        "wq",
        "--sandbox",
        "off",
    )
    assert queued.code == 0, queued.stderr
    with sqlite3.connect(workspace.parent / "store.db") as conn:
        conn.execute(
            "UPDATE runs SET settings = json_set(settings, '$.sandbox', 'workspace-write')"
        )
    w = run_cli(no_mechanism, workspace, "worker", "--once", "--poll", "0.1")
    assert w.code == 0, w.stderr
    assert "refusing to run commands" in w.stderr
    assert not (workspace / "ledger").exists()
    with sqlite3.connect(workspace.parent / "store.db") as conn:
        assert conn.execute("SELECT status FROM runs WHERE id='wq'").fetchone() == ("pending",)


def test_programs_under_tmp_stay_runnable_while_the_rest_of_tmp_is_private(tmp_path: Path) -> None:
    """A checkout and its virtualenv under /tmp (as CI may make them): the private /tmp must not
    hide the interpreter or a PATH entry, and must still hide everything else of the host's /tmp."""
    need_bwrap()
    base = Path("/tmp") / f"da-keep-{uuid.uuid4().hex[:8]}"
    try:
        venv = base / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        tool = venv / "bin" / "hello-tool"
        tool.write_text("#!/bin/sh\necho hello from the tool\n")
        tool.chmod(0o755)
        (base / "secret.txt").write_text("not for the command")
        ws = base / "ws"
        ws.mkdir()
        env = {
            **command_env(os.environ, run_id="r", call_id="c"),
            "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        }
        sandbox = resolve_sandbox("workspace-write", False, os.environ)
        ran = run_process(
            "hello-tool && touch made-here", cwd=ws, env=env, timeout_s=30, sandbox=sandbox
        )
        assert ran.exit_code == 0 and "hello from the tool" in ran.stdout, ran.stderr
        assert (ws / "made-here").exists()
        hidden = run_process(
            f"cat {base / 'secret.txt'}", cwd=ws, env=env, timeout_s=30, sandbox=sandbox
        )
        assert hidden.exit_code != 0 and "not for the command" not in hidden.stdout
        changed = run_process(f"touch {tool}.new", cwd=ws, env=env, timeout_s=30, sandbox=sandbox)
        assert changed.exit_code != 0 and not Path(f"{tool}.new").exists()  # kept read-only
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_a_planted_commondir_is_removed_but_never_through_a_link_out(tmp_path: Path) -> None:
    from durable_agent.tools.gitguard import git_state, remove_planted

    ws = tmp_path / "ws"
    outside = tmp_path / "outside" / "lib"
    for repo in (ws, ws / "lib", outside):
        (repo / ".git" / "objects").mkdir(parents=True)
        (repo / ".git" / "config").write_text("[core]\n")
    before = git_state(ws)
    (ws / ".git" / "commondir").write_text("../evil\n")
    (outside / ".git" / "commondir").write_text("theirs\n")
    # The nested repository replaced by a link to one outside (possible where nothing pins it).
    os.rename(ws / "lib", tmp_path / "lib-moved")
    (ws / "lib").symlink_to(outside)
    notes = remove_planted(before, ws)
    assert notes == [
        "removed .git/commondir, which this command created: it would make git read "
        "another repository's config when you run git there"
    ]
    assert not (ws / ".git" / "commondir").exists()
    assert (outside / ".git" / "commondir").read_text() == "theirs\n"


def test_commands_see_neither_the_harness_config_nor_its_store(  # type: ignore[no-untyped-def]
    env, workspace, write_script
) -> None:
    # The config file may hold the API key (redaction catches it whole, not split in two),
    # and the store holds every run's history and approvals: bubblewrap hides both (the
    # folder, where it is the harness's own; else the files). Outside /tmp, which the
    # sandbox replaces anyway: as under a home directory.
    import forked_cli

    need_bwrap()
    home = Path(tempfile.mkdtemp(prefix="da-hide-", dir="/var/tmp"))
    try:
        key = "sk-proj-" + "CONFIGKEY0987654321zyxwvuTSRQ"
        conf_dir = home / "config" / "durable-agent"
        conf_dir.mkdir(parents=True)
        (conf_dir / "config.toml").write_text(f'api_key = "{key}"\n')
        store = home / "elsewhere" / "store.db"
        store.parent.mkdir()
        env = {
            **env,
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_DATA_HOME": str(home / "data"),
            "DURABLE_AGENT_DB": f"sqlite:///{store}",
        }
        reads = (
            f"cut -c1-20 {conf_dir}/config.toml; cut -c21- {conf_dir}/config.toml; "
            f"ls -A {conf_dir} | wc -l; cat {store} | wc -c; cat {store}-wal | wc -c; echo end"
        )

        def start(run_id: str, command: str, env: dict[str, str]) -> str:
            proc = forked_cli.run(
                [
                    "start",
                    "t",
                    "--model",
                    write_script(_turns(command)),
                    "--shell",
                    "allow",
                    "--run-id",
                    run_id,
                ],
                env=env,
                cwd=workspace,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr
            db = (
                Path(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))
                if "DURABLE_AGENT_DB" in env
                else home / "data" / "durable-agent" / "durable-agent.db"
            )
            return _tool_outputs(db, run_id)[0]

        out = start("hide1", reads, env)
        assert "CONFIGKEY" not in out and "No such file" in out, out
        assert [line for line in out.splitlines() if line.strip().isdigit()] == ["0", "0", "0"], (
            out
        )  # all empty
        # The default store, in the harness's own data folder: the whole folder is hidden.
        data = home / "data" / "durable-agent"
        listed = start(
            "hide2",
            f"ls -A {data} | wc -l; echo end",
            {k: v for k, v in env.items() if k != "DURABLE_AGENT_DB"},
        )
        assert (data / "durable-agent.db").stat().st_size > 0  # it is there, on the host
        assert [line for line in listed.splitlines() if line.strip().isdigit()] == ["0"], listed
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_config_made_or_relinked_while_a_worker_lives_is_hidden_at_once(tmp_path: Path) -> None:
    # A worker process lives on while the user makes the config file, or points its link at
    # another dotfile: the next command must not see either.
    from durable_agent.tools.os_sandbox import for_run, hidden

    need_bwrap()
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    env.pop("DURABLE_AGENT_CONFIG", None)
    db = f"sqlite:///{tmp_path / 'elsewhere' / 'store.db'}"
    sandbox = for_run(
        "workspace-write", False, env, db
    )  # asked once, as a worker's tool calls share it
    folder = tmp_path / "config" / "durable-agent"
    assert not any(h.startswith(str(folder)) for h in hidden(sandbox))
    folder.mkdir(parents=True)
    (tmp_path / "dots").mkdir()
    (tmp_path / "dots" / "a.toml").write_text('model = "a"\n')
    (tmp_path / "dots" / "b.toml").write_text('model = "b"\n')
    (folder / "config.toml").symlink_to(tmp_path / "dots" / "a.toml")
    made = hidden(for_run("workspace-write", False, env, db))
    assert str(tmp_path / "dots" / "a.toml") in made and str(folder) in made
    (folder / "config.toml").unlink()
    (folder / "config.toml").symlink_to(tmp_path / "dots" / "b.toml")
    relinked = hidden(for_run("workspace-write", False, env, db))
    assert (
        str(tmp_path / "dots" / "b.toml") in relinked
        and str(tmp_path / "dots" / "a.toml") not in relinked
    )


def test_a_folder_a_command_made_unlistable_is_listable_again_and_what_is_below_protected() -> None:
    # `git init d/sub && chmod 311 d`: the walk cannot list d, so it could not find the
    # repository below, and the next command could write d/sub/.git/config. Bound read-only
    # instead, `chmod 311 .` could never be undone. Needs a user the permission bits apply
    # to (root reads any folder): `nobody`, by setpriv.
    need_nobody("git")
    probe = [
        *AS_NOBODY,
        "-c",
        f"import sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r}); "
        "import durable_agent.tools.gitguard",
    ]
    if subprocess.run(probe, capture_output=True, timeout=60).returncode != 0:
        pytest.skip("nobody cannot read this checkout or its Python")
    with nobodys_folder() as ws:
        code = (
            f"import os, subprocess, sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r}); "
            f"os.chdir({str(ws)!r}); subprocess.run('git init -q d/sub && chmod 311 d', shell=True, "
            "check=True); from pathlib import Path; from durable_agent.tools.gitguard import git_protections; "
            "print([str(p) for p in git_protections(Path('.'))[1]]); print(oct(os.stat('d').st_mode & 0o777))"
        )
        proc = subprocess.run([*AS_NOBODY, "-c", code], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        read_only, mode = proc.stdout.splitlines()
        assert str(ws / "d" / "sub" / ".git" / "config") in read_only, read_only  # found, protected
        assert mode == "0o711" and f"'{ws / 'd'}'" not in read_only  # listable again, not bound


def test_a_path_entry_the_harness_may_not_look_into_is_passed_over() -> None:
    # `PATH=/root/.cargo/bin:...` for a harness that is not root: looking for a virtualenv
    # there raised PermissionError, and every command failed.
    need_nobody()
    hidden = Path(tempfile.mkdtemp(dir="/tmp"))
    (hidden / "bin").mkdir()
    hidden.chmod(0o700)  # root's own
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r}); "
        "from pathlib import Path; from durable_agent.tools.os_sandbox import programs_in_tmp; "
        f"print(programs_in_tmp({{'PATH': '{hidden}/bin:/usr/bin'}}, Path('/nonexistent')))"
    )
    try:
        proc = subprocess.run([*AS_NOBODY, "-c", code], capture_output=True, text=True, timeout=60)
        if "ModuleNotFoundError" in proc.stderr or "Permission denied: '/work" in proc.stderr:
            pytest.skip("nobody cannot read this checkout or its Python")
        assert proc.returncode == 0, proc.stderr
    finally:
        shutil.rmtree(hidden, ignore_errors=True)
