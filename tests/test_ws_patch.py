"""`durable-agent diff` is a patch real `git apply` applies: random changes (adds, deletes,
edits, empty files, mode changes, symlinks, binary files, names with spaces, quotes and
non-ASCII letters) made by a real run's commands in a git repository, then the run's patch
applied to a fresh copy of the starting tree must give the run's tree byte for byte; so must
the steps' patches (`diff --step N`), each checked by `git apply --check` first.

The patch once dropped an empty new file without a word (`git apply` skipped it)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from itertools import count
from pathlib import Path
from typing import Any

import forked_cli
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_agent.workspace.secrets import HELD

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

START: dict[str, tuple[str, Any]] = {
    "a.txt": ("file", b"one\ntwo\nthree\n"),
    "space name.txt": ("file", b"with a space\n"),
    "\u00fcn\u00ef.txt": ("file", "\u00fcn\u00ef\n".encode()),
    "no-eol.txt": ("file", b"no newline at the end"),
    "empty": ("file", b""),
    "bin.dat": ("file", b"\x00\x01binary\xff" * 20),
    "run.sh": ("exe", b"#!/bin/sh\necho hi\n"),
    "dir/in.txt": ("file", b"in a folder\n"),
    "link": ("link", "a.txt"),
}
NEW_NAMES = [
    "new file.txt",
    "\u00fcnic\u00f6de/\u00f1.bin",
    "sub dir/e",
    'quote"d',
    "back\\slash",
    "dir/second.txt",
]
CONTENTS = st.one_of(
    st.just(b""),
    st.binary(max_size=40).map(lambda b: b + b"\x00"),  # binary: a NUL byte
    st.lists(st.sampled_from([b"x", b"yy", b" ", b"z z", b"\r"]), max_size=6).map(
        lambda parts: b"\n".join(parts) + b"\n"
    ),
    st.text("ab \u00e9\n", max_size=30).map(str.encode),  # may end without a newline
)
TARGETS = st.sampled_from(["a.txt", "nowhere/\u00fc", "../outside"])
_ids = count()


def _write_start(root: Path) -> None:
    for name, (kind, value) in START.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "link":
            path.symlink_to(value)
        else:
            path.write_bytes(value)
            path.chmod(0o755 if kind == "exe" else 0o644)


def _git(root: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=root,
        input=data,
        capture_output=True,
        check=False,
    )


def _repo(root: Path) -> Path:
    root.mkdir(parents=True)
    _write_start(root)
    assert _git(root, "init", "-q").returncode == 0
    assert _git(root, "add", "-A").returncode == 0
    assert _git(root, "commit", "-qm", "start").returncode == 0
    return root


def _tree(root: Path) -> dict[str, Any]:
    """Every file and symlink: its bytes and executable bit, or its target."""
    out: dict[str, Any] = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not (dirpath == str(root) and d == ".git")]
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(dirpath, d)))]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            else:
                out[rel] = ("file", Path(path).read_bytes(), os.stat(path).st_mode & 0o100)
    return out


@st.composite
def steps(draw: st.DrawFn) -> list[list[str]]:
    """Up to 3 steps of up to 3 changes each, as python statements on the workspace."""
    state = {n: k for n, (k, _) in START.items()}
    out = []
    for _ in range(draw(st.integers(1, 3))):
        ops = []
        for _ in range(draw(st.integers(1, 3))):
            files = sorted(n for n, k in state.items() if k != "link")
            links = sorted(n for n, k in state.items() if k == "link")
            absent = [n for n in NEW_NAMES if n not in state]
            kind = draw(st.sampled_from(["add", "edit", "delete", "chmod", "symlink", "unlink"]))
            if kind == "add" and absent:
                name, data = draw(st.sampled_from(absent)), draw(CONTENTS)
                exe = draw(st.booleans())
                ops.append(f"put({name.encode()!r}, {data!r}, {exe})")
                state[name] = "exe" if exe else "file"
            elif kind == "edit" and files:
                name = draw(st.sampled_from(files))
                ops.append(f"put({name.encode()!r}, {draw(CONTENTS)!r}, {state[name] == 'exe'})")
            elif kind == "delete" and state:
                name = draw(st.sampled_from(sorted(state)))
                ops.append(f"os.unlink({name.encode()!r})")
                del state[name]
            elif kind == "chmod" and files:
                name = draw(st.sampled_from(files))
                state[name] = "file" if state[name] == "exe" else "exe"
                ops.append(
                    f"os.chmod({name.encode()!r}, {0o755 if state[name] == 'exe' else 0o644})"
                )
            elif kind == "symlink" and (absent or files):
                name = draw(st.sampled_from(absent or files))  # a new link, or a file becomes one
                ops.append(f"link({name.encode()!r}, {draw(TARGETS).encode()!r})")
                state[name] = "link"
            elif kind == "unlink" and links:  # a link becomes a file
                name = draw(st.sampled_from(links))
                ops.append(f"put({name.encode()!r}, {draw(CONTENTS)!r}, False)")
                state[name] = "file"
        out.append(ops or ["pass"])
    return out


PRELUDE = (
    "import os\n"
    "def clear(p):\n"
    "    if os.path.lexists(p): os.unlink(p)\n"
    "    os.makedirs(os.path.dirname(p) or b'.', exist_ok=True)\n"
    "def put(p, data, exe):\n"
    "    clear(p)\n"
    "    open(p, 'wb').write(data)\n"
    "    os.chmod(p, 0o755 if exe else 0o644)\n"
    "def link(p, target):\n"
    "    clear(p)\n"
    "    os.symlink(target, p)\n"
)


def _da(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return forked_cli.run(args, env=env, cwd=cwd, text=False)


def _applied(root: Path, patch: bytes) -> None:
    (root.parent / "p.patch").write_bytes(patch)
    check = _git(root, "apply", "--check", str(root.parent / "p.patch"))
    assert check.returncode == 0, (check.stderr, patch)
    done = _git(root, "apply", str(root.parent / "p.patch"))
    assert done.returncode == 0, (done.stderr, patch)


@pytest.mark.slow
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=steps())
def test_git_apply_reproduces_the_run_s_changes_byte_for_byte(
    plan: list[list[str]], env: dict[str, str], tmp_path: Path, write_script: Any
) -> None:
    base = tmp_path / f"ex{next(_ids)}"
    workspace = _repo(base / "ws")
    env = {**env, "DURABLE_AGENT_DB": f"sqlite:///{base / 'store.db'}"}
    env["DURABLE_AGENT_SANDBOX"] = "off"  # (what is tested is the patch, not the sandbox)
    commands = [
        f"{shlex.quote(sys.executable)} -c {shlex.quote(PRELUDE + chr(10).join(ops))}"
        for ops in plan
    ]
    script = write_script(
        [
            *(
                {"tool_calls": [{"name": "run_command", "arguments": {"command": c}}]}
                for c in commands
            ),
            {"content": "done"},
        ]
    )
    started = _da(
        ["start", "t", "--model", script, "--shell", "allow", "--run-id", "p", "--quiet"],
        env,
        workspace,
    )
    assert started.returncode == 0, started.stderr

    whole = _da(["diff", "p"], env, workspace)
    assert whole.returncode == 0, whole.stderr
    fresh = _repo(base / "fresh")
    _applied(fresh, whole.stdout)
    assert _tree(fresh) == _tree(workspace), whole.stdout

    shown = json.loads(_da(["show", "p", "--json"], env, workspace).stdout)
    stepwise = _repo(base / "stepwise")
    for step in shown["steps"]:
        if step["kind"] == "tool":
            one = _da(["diff", "p", "--step", str(step["seq"])], env, workspace)
            assert one.returncode == 0, one.stderr
            if one.stdout:
                _applied(stepwise, one.stdout)
    assert _tree(stepwise) == _tree(workspace)


def test_an_empty_new_file_and_a_held_secret(
    env: dict[str, str], tmp_path: Path, write_script: Any
) -> None:
    """`git apply` skipped the empty file of the old patch without a word; a file that holds
    a secret is left out of the patch with a comment line, which `git apply` skips."""
    workspace = _repo(tmp_path / "ws")
    command = "touch 'brand new' && echo 'API=x' > .env && printf 'z\\n' >> a.txt"
    script = write_script(
        [
            {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
            {"content": "done"},
        ]
    )
    env = {**env, "DURABLE_AGENT_SANDBOX": "off"}
    started = _da(
        ["start", "t", "--model", script, "--shell", "allow", "--run-id", "e", "--quiet"],
        env,
        workspace,
    )
    assert started.returncode == 0, started.stderr
    patch = _da(["diff", "e"], env, workspace).stdout
    assert b'diff --git "a/brand new" "b/brand new"\nnew file mode 100644\n' in patch, patch
    assert f"# File a/.env or b/.env {HELD}: not shown, left out of this patch\n".encode() in patch
    assert b"API" not in patch
    fresh = _repo(tmp_path / "fresh")
    _applied(fresh, patch)
    assert (fresh / "brand new").read_bytes() == b""
    assert (fresh / "a.txt").read_bytes() == b"one\ntwo\nthree\nz\n"
    assert not (fresh / ".env").exists()  # held: left out, and said so
