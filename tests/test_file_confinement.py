"""File tools see what the kernel's sandbox lets commands see (issue 11): no tool follows a
symlink out of the workspace, search_text skips such links instead of printing what they
point at, no tool writes inside any git directory (nested ones and gitdir-file targets
included), and new files get the mode the process umask gives."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_agent.tools import build_tools
from durable_agent.tools.base import ToolContext, ToolFailure, ToolResult

SECRET = "s3cret-outside-the-workspace"


def call(ws: Path, name: str, **args: object) -> ToolResult:
    tool = build_tools("deny")[name]
    ctx = ToolContext(workspace=ws, run_id="r", call_id="c")
    try:
        return tool.run(tool.args_model.model_validate(args), ctx)
    except ToolFailure as exc:
        return ToolResult(error=str(exc))


@pytest.fixture
def linked(workspace: Path, tmp_path: Path) -> Path:
    """A workspace with links to a file and a directory outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (workspace / "src").mkdir()
    (workspace / "src" / "ok.py").write_text("x = 1\n")
    (workspace / "src" / "leak.txt").symlink_to(outside / "secret.txt")
    (workspace / "outdir").symlink_to(outside)
    return outside


def test_search_text_skips_links_that_point_outside(workspace: Path, linked: Path) -> None:
    for path in (".", "src"):
        result = call(workspace, "search_text", pattern="s3cret", path=path)
        assert result.error is None and result.output == "no matches", result
    assert (
        call(workspace, "search_text", pattern="x = 1").output == "src/ok.py:1: x = 1"
    )  # positive control
    named = call(workspace, "search_text", pattern="s3cret", path="src/leak.txt")
    assert named.error and "outside the workspace" in named.error


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("read_file", {"path": "src/leak.txt"}),
        ("read_file", {"path": "outdir/secret.txt"}),
        ("list_files", {"path": "outdir"}),
        ("search_text", {"pattern": "s3cret", "path": "outdir"}),
        ("write_file", {"path": "src/leak.txt", "content": "gotcha\n"}),
        ("write_file", {"path": "outdir/new.txt", "content": "gotcha\n"}),
        ("edit_file", {"path": "src/leak.txt", "old_string": "s3cret", "new_string": "gotcha"}),
    ],
)
def test_no_file_tool_follows_a_link_out_of_the_workspace(
    workspace: Path, linked: Path, name: str, args: dict[str, object]
) -> None:
    before = sorted(p.name for p in linked.iterdir())
    result = call(workspace, name, **args)
    assert result.error and "outside the workspace" in result.error, result
    assert SECRET not in result.output
    assert (linked / "secret.txt").read_text() == SECRET + "\n"
    assert sorted(p.name for p in linked.iterdir()) == before


def test_list_files_shows_a_link_out_but_does_not_descend(workspace: Path, linked: Path) -> None:
    listing = call(workspace, "list_files", max_depth=5).output.splitlines()
    assert "outdir/" in listing and not any(
        line.startswith("outdir/") and line != "outdir/" for line in listing
    )


@pytest.fixture
def repos(workspace: Path) -> Path:
    for gitdir in (workspace / ".git", workspace / "vendor" / "lib" / ".git"):
        (gitdir / "hooks").mkdir(parents=True)
        (gitdir / "objects").mkdir()
        (gitdir / "refs").mkdir()
        (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
        (gitdir / "config").write_text("[core]\n")
    # A worktree-style repository: `.git` is a file naming a git dir elsewhere in the workspace.
    data = workspace / "store" / "wt-data"
    for d in ("objects", "refs", "hooks"):
        (data / d).mkdir(parents=True)
    (data / "HEAD").write_text("ref: refs/heads/main\n")
    (data / "config").write_text("[core]\n")
    (workspace / "wt").mkdir()
    (workspace / "wt" / ".git").write_text("gitdir: ../store/wt-data\n")
    (workspace / "gitlink").symlink_to(workspace / "vendor" / "lib" / ".git")
    return workspace


@pytest.mark.parametrize(
    "path",
    [
        ".git/config",
        ".git/hooks/pre-commit",
        "vendor/lib/.git/config",
        "vendor/lib/.git/hooks/post-checkout",
        "new/.git/config",  # not a repository yet: planting one is refused as well
        "wt/.git",
        "store/wt-data/config",
        "store/wt-data/hooks/pre-commit",
        "gitlink/config",
        "vendor/../vendor/lib/.git/config",
    ],
)
def test_no_file_tool_writes_inside_any_git_dir(repos: Path, path: str) -> None:
    before = {p: p.read_bytes() for p in repos.rglob("*") if p.is_file()}
    for name, args in (
        ("write_file", {"content": "[core]\n\tfsmonitor = rm -rf ~\n"}),
        ("edit_file", {"old_string": "[core]", "new_string": "[core]\n\tfsmonitor = x"}),
    ):
        result = call(repos, name, path=path, **args)
        assert result.error and "git directory" in result.error, (name, path, result)
    after = {p: p.read_bytes() for p in repos.rglob("*") if p.is_file()}
    assert after == before
    assert (
        call(repos, "write_file", path="vendor/lib/README", content="fine\n").error is None
    )  # control


@pytest.fixture
def umask_027() -> Iterator[None]:
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def test_new_files_get_the_umask_mode_and_old_files_keep_theirs(
    workspace: Path, umask_027: None
) -> None:
    assert call(workspace, "write_file", path="new.txt", content="n\n").error is None
    assert stat.S_IMODE((workspace / "new.txt").stat().st_mode) == 0o640  # 0666 & ~027
    script = workspace / "run.sh"
    script.write_text("#!/bin/sh\necho a\n")
    script.chmod(0o755)
    assert (
        call(workspace, "edit_file", path="run.sh", old_string="echo a", new_string="echo b").error
        is None
    )
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert call(workspace, "write_file", path="deep/er/f.txt", content="x").error is None
    assert stat.S_IMODE((workspace / "deep" / "er" / "f.txt").stat().st_mode) == 0o640


@pytest.mark.parametrize(
    "path", ["in.db", "in.db-wal", "in.db-shm", "in.db-journal", "mcp-logs/x.log", "./sub/../in.db"]
)
@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
def test_no_file_tool_writes_the_runs_own_store(workspace: Path, path: str, tool: str) -> None:
    # A store may lie in the workspace (--sandbox off / read-only): overwriting it lost every run.
    (workspace / "sub").mkdir()
    (workspace / "mcp-logs").mkdir()
    for name in ("in.db", "in.db-wal", "in.db-shm", "in.db-journal", "mcp-logs/x.log"):
        (workspace / name).write_text("old")
    ctx = ToolContext(
        workspace=workspace, run_id="r", call_id="c", store=f"sqlite:///{workspace / 'in.db'}"
    )
    builtin = build_tools("deny")[tool]
    args = (
        {"path": path, "content": "new"}
        if tool == "write_file"
        else {"path": path, "old_string": "old", "new_string": "new"}
    )
    with pytest.raises(ToolFailure, match="own store"):
        builtin.run(builtin.args_model.model_validate(args), ctx)
    assert all(
        (workspace / n).read_text() == "old" for n in ("in.db", "in.db-wal", "mcp-logs/x.log")
    )
    other = (
        builtin.run(builtin.args_model.model_validate({**args, "path": "in.db.txt"}), ctx)
        if tool == "write_file"
        else None
    )
    assert other is None or other.error is None  # a neighbour with a similar name is not the store


@pytest.mark.parametrize(
    ("name", "spelling"),
    [
        ("50% off.db", "{ws}/50% off.db"),
        ("st?x.db", "{ws}/st?x.db"),
        ("a b.db", "sqlite:///{ws}/a%20b.db"),
        ("st?x.db", "sqlite:///{ws}/st%3Fx.db"),
        ("st.db", "sqlite:///file:{ws}/st.db?uri=true"),
        ("st.db", "sqlite:///file://localhost{ws}/st.db?mode=rwc&uri=yes"),
        ("a b.db", "sqlite:///file:{ws}/a%2520b.db?uri=true"),
    ],
)
def test_the_store_kept_from_file_tools_is_the_file_the_store_opens(
    workspace: Path, name: str, spelling: str
) -> None:
    """The store's name as a plain path or a URL with escapes: the file kept from the tools is
    the one SQLAlchemy opens (a URL's `%20` is a space; a path's `?` is part of the name)."""
    from durable_agent.store.engine import make_engine

    db = spelling.format(ws=workspace)
    engine = make_engine(db)
    with engine.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x)")
        conn.commit()
    engine.dispose()
    assert (workspace / name).is_file() and sorted(p.name for p in workspace.iterdir()) == [name], (
        list(workspace.iterdir())
    )
    ctx = ToolContext(workspace=workspace, run_id="r", call_id="c", store=db)
    builtin = build_tools("deny")["write_file"]
    with pytest.raises(ToolFailure, match="own store"):
        builtin.run(builtin.args_model.model_validate({"path": name, "content": "new"}), ctx)


@pytest.mark.parametrize(
    ("folder", "order"),
    [
        ("vendor/", ["config", "HEAD", "objects/info/.keep", "refs/heads/.keep"]),
        (
            "vendor/",
            ["refs/heads/.keep", "objects/info/.keep", "config"],
        ),  # a common dir's shape: no HEAD
        ("vendor/", ["config", "HEAD", "commondir"]),
        (
            "",
            ["config", "HEAD", "objects/info/.keep", "refs/heads/.keep"],
        ),  # the workspace itself, bare
    ],
    ids=["config-first", "config-last", "commondir", "workspace-root"],
)
def test_file_writes_one_by_one_do_not_assemble_a_repository(
    workspace: Path, tmp_path: Path, folder: str, order: list[str]
) -> None:
    # Each write alone lands in a folder that is not yet a git dir; together they would make
    # `vendor/` one whose config runs a program at the next `git status` there, outside any
    # sandbox. The write that would complete the shape is refused, and git finds no repository.

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    pwned = tmp_path / "PWNED"
    contents = {
        "config": f'[core]\n\trepositoryformatversion = 0\n\tworktree = ..\n\tfsmonitor = "touch {pwned}; false"\n',
        "HEAD": "ref: refs/heads/main\n",
        "commondir": "../.git\n",
    }
    results = [
        call(workspace, "write_file", path=f"{folder}{p}", content=contents.get(p, ""))
        for p in order
    ]
    assert results[-1].error and "git directory" in results[-1].error, results
    assert all(r.error is None for r in results[:-1]), results  # the harmless part went through
    if folder:
        subprocess.run(
            ["git", "init", "-q", str(workspace)], check=True
        )  # as a user's checkout would be
    for command in (["status"], ["diff"], ["config", "-l"]):
        subprocess.run(
            ["git", *command],
            cwd=workspace / folder,
            capture_output=True,
            timeout=30,
            env={**os.environ, "GIT_CEILING_DIRECTORIES": str(workspace.parent)},
        )
    assert not pwned.exists()


def _git(workspace: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Real git in `cwd`, never looking above the workspace for a repository."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(workspace)},
    )


def test_a_head_link_and_executable_files_count_as_git_does(
    workspace: Path, tmp_path: Path
) -> None:
    # Planted by the repository's own content (or an earlier command): git takes a HEAD that
    # is a link into refs/ (even dangling) and objects/, refs/ that are merely executable.
    # The config that would complete such a shape is refused like any other.
    odd = workspace / "odd"
    odd.mkdir()
    (odd / "HEAD").symlink_to("refs/heads/main")
    for name in ("objects", "refs"):
        (odd / name).write_text("")
        (odd / name).chmod(0o755)
    pwned = tmp_path / "PWNED"
    config = f'[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "touch {pwned}; false"\n'
    found = _git(workspace, odd, "rev-parse", "--git-dir")
    assert found.returncode == 0 and found.stdout.strip() == ".", (
        found
    )  # git's own view: a repository
    result = call(workspace, "write_file", path="odd/config", content=config)
    assert result.error and "git directory" in result.error, result
    _git(workspace, odd, "status")
    assert not pwned.exists() and not (odd / "config").exists()


def test_a_common_dir_named_by_a_planted_commondir_is_not_assembled_either(
    workspace: Path, tmp_path: Path
) -> None:
    # vendor/HEAD and vendor/commondir (../common) as the repository's content had them;
    # git then reads objects/, refs/ and the config of common/, which needs no HEAD. The
    # file tools may make common/objects and common/refs, but not the config that would
    # run a program at the user's next paged git command in vendor/.
    vendor = workspace / "vendor"
    vendor.mkdir()
    (vendor / "HEAD").write_text("ref: refs/heads/main\n")
    (vendor / "commondir").write_text("../common\n")
    pwned = tmp_path / "PWNED"
    config = f'[core]\n\trepositoryformatversion = 0\n\tpager = "touch {pwned}; cat"\n'
    results = [
        call(workspace, "write_file", path=p, content="")
        for p in ("common/objects/info/.keep", "common/refs/heads/.keep")
    ]
    assert all(r.error is None for r in results), results
    found = _git(workspace, vendor, "rev-parse", "--git-common-dir")
    assert found.returncode == 0 and found.stdout.strip().endswith("common"), (
        found
    )  # git's own view
    result = call(workspace, "write_file", path="common/config", content=config)
    assert result.error and "git directory" in result.error, result
    _git(workspace, vendor, "-c", "core.pager=", "branch")
    assert not pwned.exists() and not (workspace / "common" / "config").exists()
