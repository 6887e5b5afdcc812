"""Attacks on the workspace, secret and environment defences, through the real CLI.

Each test is an attack that once got through: a secret in a variable named as a locale
(`LC_*`) reaching commands, a secret in a file's name stored in a snapshot manifest, and
the like. They run real processes (the CLI, the sandboxed command) and check what reached
the command, the store or the disk.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import zlib
from pathlib import Path
from typing import Any

import pytest
from test_workspace_secrets import _refused, tampered  # noqa: F401 (a fixture)
from workspace_support import da


def _db(env: dict[str, str]) -> Path:
    return Path(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))


def _start(env: dict[str, str], ws: Path, model: str, run_id: str) -> Any:
    return da(
        ["start", "t", "--workspace", str(ws), "--model", model, "--shell", "allow"]
        + ["--run-id", run_id, "--quiet"],
        env,
        ws,
    )


def _stored_text(db: Path) -> bytes:
    """Every blob and every tree of the store, decompressed, and the raw database bytes."""
    parts = [p.read_bytes() for p in sorted(db.parent.glob(db.name + "*"))]
    with sqlite3.connect(db) as conn:
        for table in ("workspace_blobs", "workspace_trees"):
            parts += [zlib.decompress(d) for (d,) in conn.execute(f"SELECT data FROM {table}")]
    return b"\n".join(parts)


def _command(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]}


def _observations(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return "\n".join(str(o) for (o,) in conn.execute("SELECT output FROM steps"))


def test_a_credential_named_as_a_locale_variable_reaches_no_command(
    env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    """`LC_*` passes as locale: a credential-named `LC_` variable must not."""
    value = "lcv-" + secrets.token_hex(12)
    env = {**env, "LC_MYSQL_PWD": value, "LC_API_KEY": value, "LC_ALL": "C"}
    script = [
        _command('echo "seen:${#LC_MYSQL_PWD}:${#LC_API_KEY}:${LC_ALL:-none}"'),
        {"content": "done"},
    ]
    proc = _start(env, workspace, write_script(script), "lc")
    assert proc.returncode == 0, proc.stderr
    out = _observations(_db(env))
    assert "seen:0:0:C" in out, out


def test_a_secret_in_a_file_name_is_not_stored(env, workspace, write_script) -> None:  # type: ignore[no-untyped-def]
    token = "svc-" + secrets.token_hex(16)
    env = {**env, "MY_SERVICE_TOKEN": token}
    (workspace / "plain.txt").write_text("nothing here\n")
    script = [_command(f"touch 'note-{token}.txt' && mkdir -p 'd{token}'"), {"content": "done"}]
    proc = _start(env, workspace, write_script(script), "nm")
    assert proc.returncode == 0, proc.stderr
    stored = _stored_text(_db(env))
    assert b"note-" in stored  # the snapshot saw the file
    assert token.encode() not in stored


def _git(ws: Path, *args: str, home: Path) -> Any:
    import subprocess

    return subprocess.run(
        ["git", *args],
        cwd=ws,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_commondir_planted_in_an_existing_repository_runs_nothing(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    """`.git/commondir` makes git read its config (and hooks) from another folder, which
    a command may fill: the user's next `git status` must run nothing of it."""
    home = tmp_path / "home"
    home.mkdir()
    for args in (
        ["init", "-q", "."],
        ["-c", "user.name=u", "-c", "user.email=u@e"]
        + ["commit", "-q", "--allow-empty", "-m", "x"],
    ):
        assert _git(workspace, *args, home=home).returncode == 0
    mark = tmp_path / "pwned"
    plant = (
        "mkdir evil && cp -r .git/objects .git/refs evil/ && "
        f"printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = \"touch {mark}; false\"\\n'"
        " > evil/config && echo ../evil > .git/commondir; echo planted:$?"
    )
    proc = _start(env, workspace, write_script([_command(plant), {"content": "done"}]), "cd")
    assert proc.returncode == 0, proc.stderr
    status = _git(workspace, "status", home=home)
    assert not mark.exists(), (_observations(_db(env)), status.stderr)


@pytest.mark.parametrize("label", ["link-parent", "file-parent"])
def test_a_manifest_entry_beneath_a_link_or_file_is_refused_untouched(
    tmp_path, env, workspace, request, label
) -> None:  # type: ignore[no-untyped-def]
    """Each path is well-formed alone; together they ask a restore to write through a link
    to outside (`out` -> a folder elsewhere, then `out/f`) or beneath a file."""
    tree, seq, rows, keep_ref, store = request.getfixturevalue("tampered")
    outside = tmp_path / "outside"
    outside.mkdir()
    kept = [r for r in rows if r[0] != "keep.txt"]
    hostile = {
        "link-parent": [
            ["out", "link", 0o777, "", str(outside), 0],
            ["out/f", "file", 0o644, keep_ref, "", 18],
        ],
        "file-parent": [
            ["keep.txt", "file", 0o644, keep_ref, "", 18],
            ["keep.txt/f", "file", 0o644, keep_ref, "", 18],
        ],
    }[label]
    store(sorted([*kept, *hostile]))
    _refused(env, workspace, tmp_path, tree, seq, label)
    assert list(outside.iterdir()) == []


@pytest.mark.xfail(
    strict=True,
    reason="a secret-named link withholds only its own target string: the file it points"
    " at is judged by its own name and content (the scanner would need a pass after the walk,"
    " cache and deltas included)",
)
def test_a_dotenv_that_is_a_link_withholds_what_it_points_at(env, workspace, write_script) -> None:  # type: ignore[no-untyped-def]
    """`.env -> config/production` (as direnv set-ups do): the content behind the
    conventional name is the secret, wherever the link puts it in the workspace."""
    password = "pw-" + secrets.token_hex(10)  # known to no variable, no key shape
    (workspace / "config").mkdir()
    (workspace / "config" / "production").write_text(f"DB_PASSWORD={password}\n")
    (workspace / ".env").symlink_to("config/production")
    script = [_command("echo hi > out.txt"), {"content": "done"}]
    proc = _start(env, workspace, write_script(script), "ln")
    assert proc.returncode == 0, proc.stderr
    assert password.encode() not in _stored_text(_db(env))


def test_a_hard_link_a_command_makes_cannot_reach_outside(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    """A command links files it can see outside the workspace (the store, the test's own
    files, /etc); the file tools then write and edit through those names."""
    canary = tmp_path / "canary.txt"
    canary.write_text("outside\n")
    db = _db(env)
    targets = [str(canary), "/etc/hostname", str(db), str(tmp_path)]
    links = " ; ".join(
        f"ln {t} l{i} 2>/dev/null; ln -P {t} p{i} 2>/dev/null" for i, t in enumerate(targets)
    )
    script = [
        _command(links + "; ls"),
        *(
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": f"l{i}", "content": "x\n"}}
                ]
            }
            for i in range(2)
        ),
        {"content": "done"},
    ]
    before = {p: Path(p).read_bytes() for p in targets[:2]}
    proc = _start(env, workspace, write_script(script), "hl")
    assert proc.returncode == 0, proc.stderr
    assert {p: Path(p).read_bytes() for p in targets[:2]} == before
    assert all(Path(p).stat().st_nlink == 1 for p in (str(canary), str(db)))


def _kill_harness(db: Path) -> str:
    """Shell that SIGKILLs the CLI running this command: its nearest ancestor holding the
    store open."""
    return (
        'p=$PPID; while [ "$p" -gt 1 ]; do '
        f'if ls -l /proc/$p/fd 2>/dev/null | grep -q "{db}"; then kill -9 $p; break; fi; '
        "p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2); done"
    )


def test_a_deleted_write_ahead_log_loses_no_step(tmp_path, env, workspace, write_script) -> None:  # type: ignore[no-untyped-def]
    """A bad day: someone deletes the store's `-wal` (it looks like a leftover) during a
    run, and the run is killed later. Every step it went on to record must be there at
    resume (or the run stop at once): a step's intent lost would run its effect again."""
    db = _db(env)
    env = {**env, "DURABLE_AGENT_SANDBOX": "off"}  # the deleting hand is outside any sandbox
    script = [
        _command(f"rm -f {db}-wal; echo gone"),
        _command("echo once >> side.txt"),
        _command(
            f"if [ ! -e {tmp_path}/killed ]; then touch {tmp_path}/killed; {_kill_harness(db)}; fi"
        ),
        {"content": "done"},
    ]
    model = write_script(script)
    proc = _start(env, workspace, model, "wal")
    assert proc.returncode == 7 or (tmp_path / "killed").exists(), _observations(db)
    if proc.returncode == 7:  # stopped at once, what it had recorded kept
        assert "error: the store is unavailable" in proc.stderr and "write-ahead log" in proc.stderr
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM steps WHERE run_id = 'wal'").fetchone()[0]
        return
    resumed = da(["resume", "wal", "--model", model, "--quiet"], env, workspace)
    assert resumed.returncode == 0, resumed.stderr
    assert (workspace / "side.txt").read_text() == "once\n"


@pytest.mark.parametrize("nested", ["inner", "outer"])
def test_a_run_in_a_folder_of_a_live_runs_workspace_is_refused(
    tmp_path, env, workspace, write_script, nested
) -> None:  # type: ignore[no-untyped-def]
    """The lease is per workspace path: a second run in a subfolder of a live run's
    workspace (or in the folder holding it) shares files with it all the same, its commands
    able to swap the folders the first run's file tools work through."""
    from test_workspace_lease import held_by_a_run

    hold = write_script([_command("cat gate"), {"content": "done"}])
    quick = write_script([{"content": "done"}])
    if nested == "inner":
        live, other = workspace, workspace / "sub"
    else:
        live, other = workspace / "sub", workspace
    live.mkdir(exist_ok=True)
    other.mkdir(exist_ok=True)
    with held_by_a_run(live, env, hold, "A") as (proc, gate):
        refused = da(["start", "t", "--model", quick, "--run-id", "B", "--quiet"], env, other)
        os.write(gate, b"go\n")
    assert refused.returncode == 6, refused.stderr
    assert "in use by" in refused.stderr and "--allow-shared-workspace" in refused.stderr
    assert proc.returncode == 0


def test_repositories_a_command_creates_by_other_ways_run_nothing(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    """`--separate-git-dir` (the git dir elsewhere, a `gitdir:` file in the work tree),
    `git config --worktree`, and an `[include] path` to a file the command writes."""
    home = tmp_path / "home"
    home.mkdir()
    mark = tmp_path / "pwned"
    run = f'"touch {mark}; false"'
    plant = " && ".join(
        [
            "mkdir -p .hidden && git init -q --separate-git-dir=.hidden/store a",
            "printf 'gitdir: ../.hidden/store\\n' > a/.git",
            f"git -C a config core.fsmonitor {run}",
            "git init -q b",
            "git -C b config extensions.worktreeConfig true",
            f"git -C b config --worktree core.fsmonitor {run}",
            "git init -q c",
            f"printf '[core]\\n\\tfsmonitor = {run}\\n' > inc",
            "printf '[include]\\n\\tpath = ../../inc\\n' >> c/.git/config",
            "echo planted",
        ]
    )
    proc = _start(env, workspace, write_script([_command(plant), {"content": "done"}]), "g")
    assert proc.returncode == 0, proc.stderr
    assert "stdout:\\nplanted" in _observations(_db(env)), _observations(_db(env))
    for repo in ("a", "b", "c"):
        _git(workspace / repo, "status", home=home)
        assert not mark.exists(), (repo, _observations(_db(env)))


@pytest.mark.xfail(
    strict=True,
    reason="content is matched as it is: a secret a command compresses (or encodes, or splits"
    " over two files) is stored; no detector can undo every encoding",
)
def test_a_compressed_copy_of_a_secret_is_not_stored(env, workspace, write_script) -> None:  # type: ignore[no-untyped-def]
    token = "svc-" + secrets.token_hex(16)
    env = {**env, "MY_SERVICE_TOKEN": token}
    (workspace / ".env").write_text(f"MY_SERVICE_TOKEN={token}\n")
    script = [_command("gzip -c .env > backup.gz"), {"content": "done"}]
    proc = _start(env, workspace, write_script(script), "gz")
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(_db(env)) as conn:
        blobs = [zlib.decompress(d) for (d,) in conn.execute("SELECT data FROM workspace_blobs")]
    import gzip

    assert not any(b[:2] == b"\x1f\x8b" and token.encode() in gzip.decompress(b) for b in blobs)


KILLED_PLUGIN = """
import os
import signal
from typing import Any, ClassVar

from pydantic import BaseModel

from durable_agent import EffectClass, ToolContext, ToolResult


class Args(BaseModel):
    path: str
    text: str


class SaveNote:
    name: ClassVar[str] = "save_note"
    description: ClassVar[str] = "Write a note into the workspace."
    args_model: ClassVar[type[BaseModel]] = Args
    effect: ClassVar[EffectClass] = EffectClass.WRITE
    idempotent: ClassVar[bool] = True

    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        (ctx.workspace / args.path).write_text(args.text)
        mark = os.environ["KILL_MARK"]
        if not os.path.exists(mark):  # the first attempt dies between its write and outcome
            open(mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return ToolResult(output="saved " + args.path)
"""


def test_a_planless_write_killed_before_its_outcome_keeps_its_before_snapshot(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL between a plan-less write's intent and its outcome; resumed, the step's
    changes are still measured from the snapshot its intent took."""
    (workspace / "a.txt").write_text("alpha\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "b.txt").write_text("beta\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "da_killed_note.py").write_text(KILLED_PLUGIN)
    config = tmp_path / "config.toml"
    config.write_text('tools = ["da_killed_note:SaveNote"]\n')
    env = {
        **env,
        "PYTHONPATH": str(site),
        "DURABLE_AGENT_CONFIG": str(config),
        "KILL_MARK": str(tmp_path / "killed"),
    }
    model = write_script(
        [
            {"tool_calls": [{"name": "save_note", "arguments": {"path": "p.txt", "text": "n\n"}}]},
            {"content": "done"},
        ]
    )
    first = _start(env, workspace, model, "pk")
    assert first.returncode == -9 and (tmp_path / "killed").exists(), first.stderr
    resumed = da(["resume", "pk", "--quiet"], env, workspace)
    assert resumed.returncode == 0, resumed.stderr
    with sqlite3.connect(_db(env)) as conn:
        changes = conn.execute(
            "SELECT c.path, c.change FROM step_changes c JOIN steps s ON s.run_id = c.run_id "
            "AND s.seq = c.seq WHERE s.tool_name = 'save_note' ORDER BY c.path"
        ).fetchall()
        rows = conn.execute(
            "SELECT seq, kind, state, tool_name, tree_before, tree_id FROM steps WHERE run_id = 'pk'"
        ).fetchall()
    assert changes == [("p.txt", "added")], (changes, rows)
