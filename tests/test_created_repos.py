"""A repository a command creates keeps nothing that makes git run a program on the host.

Through the real CLI, under bubblewrap and under Landlock: a command runs `git init` and
plants in the new repository every kind of setting and hook git runs, then the test runs
the user's `git status` / `git diff` / `git log` there, outside any sandbox, and checks
that nothing planted ran. A repository the user had before the run is not touched."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from sandbox_support import need_bwrap
from side_effects_support import run_cli

from durable_agent.tools.os_sandbox import Mechanism, resolve_sandbox


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


def _plant(tmp: Path) -> str:
    """One command: a new repository (and a submodule's git dir in it) with every kind of
    setting and hook that runs a program, each leaving a file in `tmp` when it runs."""

    def mark(name: str) -> str:
        return f"touch {tmp}/ran-{name}"

    config = "\n".join(
        [
            "[core]",
            f"\tfsmonitor = {mark('fsmonitor')}; false",
            f"\tpager = {mark('pager')}; cat",
            "\thooksPath = myhooks",
            f"\tsshCommand = {mark('ssh')}",
            f"\teditor = {mark('editor')}",
            "[diff]",
            f"\texternal = {mark('external')}",
            '[diff "x"]',
            f"\ttextconv = {mark('textconv')}; cat",
            '[filter "f"]',
            f"\tclean = {mark('clean')}; cat",
            f"\tsmudge = {mark('smudge')}; cat",
            f"\tprocess = {mark('process')}",
            '[merge "m"]',
            f"\tdriver = {mark('merge')}",
            "[credential]",
            f"\thelper = !{mark('credential')}",
            "[alias]",
            f"\tst = !{mark('alias')}",
            "[include]",
            "\tpath = ../../planted.cfg",
            '[includeIf "gitdir:/"]',
            "\tpath = ../../planted.cfg",
            "[user]",
            "\tname = Kept Name",
            "",
        ]
    )
    hook = f"#!/bin/sh\n{mark('hook')}\n"
    return (
        "set -e; git init -q sub && cd sub"
        f" && printf '%s' '{config}' >> .git/config"
        f" && printf '[core]\\n\\tpager = {mark('included')}; cat\\n' > ../planted.cfg"
        " && mkdir -p myhooks .git/modules/lib/hooks"
        f" && printf '{hook}' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout"
        f" && cp .git/hooks/post-checkout .git/hooks/pre-commit"
        f" && printf '[core]\\n\\tfsmonitor = {mark('submodule')}\\n' > .git/modules/lib/config"
        " && mkdir -p ../progs .git/worktrees/w && cp .git/hooks/pre-commit ../progs/"
        " && ln -s ../../../progs .git/worktrees/w/hooks"
        f" && cp .git/hooks/pre-commit .git/modules/lib/hooks/pre-commit"
        " && printf '* diff=x filter=f merge=m\\n' > .gitattributes"
        " && echo planted"
    )


def _user_runs_git(repo: Path, tmp: Path) -> None:
    """What the user does next, outside the sandbox: it must run nothing planted."""
    (repo / "a.txt").write_text("a\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "u",
        "GIT_AUTHOR_EMAIL": "u@x",
        "GIT_COMMITTER_NAME": "u",
        "GIT_COMMITTER_EMAIL": "u@x",
    }
    for args in (
        ["status"],
        ["add", "a.txt"],
        ["commit", "-qm", "x"],
        ["-P", "log", "-p"],
        ["diff", "HEAD"],
        ["checkout", "-q", "-b", "other"],
        ["-c", "pager.log=true", "log", "-1"],
        ["st"],
    ):
        subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, check=False)


def _check(run: str, outputs: list[str], ws: Path, tmp: Path) -> None:
    planted = outputs[0]
    assert "planted" in planted, planted
    ran = sorted(p.name for p in tmp.glob("ran-*"))
    assert ran == [], f"{run}: planted programs ran on the host: {ran}"
    note = planted[planted.find("removed from the git repository") :]
    assert "removed from the git repository sub/.git, which this run created" in planted, planted
    for removed in (
        "core.fsmonitor",
        "core.pager",
        "core.hookspath",
        "core.sshcommand",
        "diff.external",
        "diff.x.textconv",
        "filter.f.clean",
        "merge.m.driver",
        "credential.helper",
        "alias.st",
        "include.path",
        "hooks/pre-commit",
        "hooks/post-checkout",
        "modules/lib/config",
        "modules/lib/hooks/pre-commit",
        "worktrees/w/hooks (a link)",
    ):
        assert removed in note, (removed, note)
    config = (ws / "sub" / ".git" / "config").read_text()
    assert "Kept Name" in config and "repositoryformatversion" in config, config
    # git's own sample hooks stay
    assert (ws / "sub" / ".git" / "hooks" / "pre-push.sample").exists()


def test_a_repository_a_command_creates_runs_nothing_it_planted(  # type: ignore[no-untyped-def]
    env, workspace, write_script, db_path, tmp_path
) -> None:
    need_bwrap()
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    marks = tmp_path / "marks"
    marks.mkdir()
    # The user's own repository, with a hook of their own: left as it is.
    subprocess.run(["git", "init", "-q", "mine"], cwd=workspace, check=True)
    own_hook = workspace / "mine" / ".git" / "hooks" / "pre-commit"
    own_hook.write_text("#!/bin/sh\nexit 0\n")
    own_hook.chmod(0o755)
    with (workspace / "mine" / ".git" / "config").open("a") as f:
        f.write("[alias]\n\tmine = status\n")
    own_config = (workspace / "mine" / ".git" / "config").read_text()
    script = write_script(_turns(_plant(marks), "echo second"))
    r = run_cli(
        env, workspace, "start", "t", "--model", script, "--shell", "allow", "--run-id", "g"
    )
    assert r.code == 0, r.stderr
    outputs = _tool_outputs(db_path, "g")
    _user_runs_git(workspace / "sub", marks)
    _check("bubblewrap", outputs, workspace, marks)
    assert (workspace / "mine" / ".git" / "config").read_text() == own_config
    assert own_hook.exists()


def test_under_landlock_a_later_command_cannot_plant_in_it_either(  # type: ignore[no-untyped-def]
    env, workspace, write_script, db_path, tmp_path
) -> None:
    sandbox = resolve_sandbox("workspace-write", False, {"PATH": str(tmp_path / "empty")})
    if sandbox.mechanism is not Mechanism.LANDLOCK:
        pytest.skip(f"the kernel has no usable Landlock here ({sandbox.problem})")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    git = shutil.which("git")
    marks = tmp_path / "marks"
    marks.mkdir()
    no_bwrap = {k: v for k, v in env.items() if k != "DURABLE_AGENT_SANDBOX"}
    bin_dir = tmp_path / "bin"  # git and the shell's tools, but no bwrap
    bin_dir.mkdir()
    for tool in ("git", "touch", "mkdir", "cp", "chmod", "cat", "printf"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    assert git is not None
    no_bwrap["PATH"] = str(bin_dir)
    later = f"printf '[core]\\n\\tfsmonitor = touch {marks}/ran-later\\n' >> sub/.git/config"
    script = write_script(_turns(_plant(marks), later))
    r = run_cli(
        no_bwrap, workspace, "start", "t", "--model", script, "--shell", "allow", "--run-id", "l"
    )
    assert r.code == 0, r.stderr
    outputs = _tool_outputs(db_path, "l")
    assert "core.fsmonitor in config" in outputs[1], outputs[1]
    _user_runs_git(workspace / "sub", marks)
    _check("landlock", outputs, workspace, marks)
