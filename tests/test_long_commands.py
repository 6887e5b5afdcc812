"""Past the limits on a command line: a command longer than one argument may be (it failed
with E2BIG, "Argument list too long", and never ran; now it runs byte for byte, see
tools/sealed.py), and a workspace whose git repositories need more mounts than bubblewrap
takes (refused in words that say what to do, not with bwrap's own message)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sandbox_support import need_bwrap

from durable_agent.tools.base import ToolFailure
from durable_agent.tools.os_sandbox import (
    BWRAP_MAX_ARGS,
    Mechanism,
    Sandbox,
    SandboxMode,
    SandboxUnavailable,
    landlock_abi,
    resolve_sandbox,
)
from durable_agent.tools.process import run_process
from durable_agent.tools.sealed import MAX_ARGUMENT

ENV = {"PATH": os.environ["PATH"]}


def _sandbox(kind: str) -> Sandbox | None:
    if kind == "off":
        return None
    if kind == "bwrap":
        need_bwrap()
        return resolve_sandbox("workspace-write", False, os.environ)
    if landlock_abi() == 0:
        pytest.skip("the kernel has no Landlock")
    return Sandbox(SandboxMode.WORKSPACE_WRITE, False, Mechanism.LANDLOCK, landlock_abi=landlock_abi())


def _heredoc(body: str) -> str:
    """A command that writes `body` to out.txt and its `$0` to zero.txt."""
    return f"cat > out.txt <<'END-OF-BODY'\n{body}\nEND-OF-BODY\necho \"$0\" > zero.txt"


@pytest.mark.parametrize("kind", ["off", "bwrap", "landlock"])
def test_a_command_longer_than_one_argument_runs_byte_for_byte(tmp_path: Path, kind: str) -> None:
    sandbox = _sandbox(kind)
    frame = len(_heredoc("").encode())
    line = "é ünïcode \\ $HOME `x` 'q' \"d\" \t\x01 " * 10
    for size in (MAX_ARGUMENT, MAX_ARGUMENT + 1, 3 * 1024 * 1024):  # the last that fits, the first that does not
        prefix = line * ((size - frame) // len(line.encode()))
        body = prefix + "x" * (size - frame - len(prefix.encode()))
        command = _heredoc(body)
        assert len(command.encode()) == size
        out = run_process(command, cwd=tmp_path, env=ENV, timeout_s=60, sandbox=sandbox, workspace=tmp_path)
        assert out.exit_code == 0, out.stderr
        assert (tmp_path / "out.txt").read_bytes() == body.encode() + b"\n"
        # Only $0 tells the two apart: the shell's name, or the file the shell read.
        zero = (tmp_path / "zero.txt").read_text().strip()
        assert (zero.endswith("bash") or zero.endswith("sh")) if size <= MAX_ARGUMENT else zero.startswith("/dev/fd/")


def test_the_command_cannot_rewrite_the_script_it_runs_from(tmp_path: Path) -> None:
    # The shell reads a long command as it goes: were the file writable, a command could
    # change what runs after it. It is sealed: every write fails.
    command = ("for f in /proc/$$/fd/*; do case $(readlink $f) in *memfd:*) "
               "printf 'echo rewritten > hacked.txt\\n' 1<> $f && echo wrote; "
               "printf 'more' >> $f && echo appended;; esac; done 2>/dev/null\n"
               f"# {'p' * MAX_ARGUMENT}\necho ran-to-the-end")
    out = run_process(command, cwd=tmp_path, env=ENV, timeout_s=30, sandbox=None)
    assert out.exit_code == 0 and out.stdout == "ran-to-the-end\n", (out.stdout, out.stderr)
    assert not (tmp_path / "hacked.txt").exists()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"),
                    min_size=1, max_size=200))
def test_hostile_text_in_a_long_command_arrives_as_written(tmp_path: Path, text: str) -> None:
    # printf %s with a quoted argument: what the model wrote must reach the command as it is,
    # whichever way the command travelled. (Single quotes inside are closed and reopened.)
    quoted = "'" + text.replace("'", "'\\''") + "'"
    pad = f"\n# {'z' * MAX_ARGUMENT}\n"
    out = run_process(f"printf %s {quoted} > got.bin{pad}", cwd=tmp_path, env=ENV, timeout_s=30, sandbox=None)
    assert out.exit_code == 0, out.stderr
    assert (tmp_path / "got.bin").read_bytes() == os.fsencode(text)


def test_a_nul_byte_is_refused_in_one_line_and_nothing_runs(tmp_path: Path) -> None:
    for command in ("touch ran\0 more", "touch ran # " + "y" * MAX_ARGUMENT + "\0"):
        with pytest.raises(ToolFailure, match="NUL byte"):
            run_process(command, cwd=tmp_path, env=ENV, timeout_s=10, sandbox=None)
    assert not (tmp_path / "ran").exists()


@pytest.mark.slow  # 1,300 repository shapes, scanned before and after each command
def test_a_workspace_with_more_repositories_than_bwrap_takes_is_refused_in_one_line(tmp_path: Path) -> None:
    # bubblewrap refuses past BWRAP_MAX_ARGS arguments ("Exceeded maximum number of
    # arguments"): the model would see that and no way out. The harness refuses first, in
    # words that name the way out, and nothing runs. Below the limit, every repository stays
    # protected.
    need_bwrap()
    sandbox = resolve_sandbox("workspace-write", False, os.environ)
    assert sandbox.bwrap is not None
    options = ["--ro-bind", "/", "/", "--unshare-uts"] + ["--unsetenv", "X"] * ((BWRAP_MAX_ARGS - 2 - 4) // 2)
    assert len(options) + len(["--", "true"]) == BWRAP_MAX_ARGS  # as many as the harness lets through
    at = subprocess.run([sandbox.bwrap, *options, "--", "true"], capture_output=True, text=True, check=False)
    assert at.returncode == 0, at.stderr
    over = subprocess.run([sandbox.bwrap, *options, "--unshare-ipc", "--", "true"], capture_output=True, text=True,
                          check=False)
    assert over.returncode != 0 and "maximum number of arguments" in over.stderr  # the limit is bwrap's own

    ws = tmp_path / "ws"
    def make(count: int) -> None:
        for i in range(count):  # the shape git itself recognises (gitguard._looks_like_git_dir)
            git = ws / f"r{i:04d}" / ".git"
            if git.exists():
                continue
            for folder in ("objects", "refs", "hooks", "info"):
                (git / folder).mkdir(parents=True)
            (git / "HEAD").write_text("ref: refs/heads/main\n")
            (git / "config").write_text("[core]\n")

    make(500)
    last = ws / "r0499" / ".git"
    out = run_process(f"echo made > made.txt; echo '[core] fsmonitor = x' >> {last}/config",
                      cwd=ws, env=ENV, timeout_s=120, sandbox=sandbox, workspace=ws)
    assert out.exit_code != 0 and "Read-only file system" in out.stderr, out.stderr
    assert (ws / "made.txt").read_text() == "made\n" and (last / "config").read_text() == "[core]\n"

    make(800)
    with pytest.raises(SandboxUnavailable, match=r"too many git repositories.*--sandbox read-only") as refused:
        run_process("echo again > made.txt", cwd=ws, env=ENV, timeout_s=120, sandbox=sandbox, workspace=ws)
    assert "\n" not in str(refused.value) and (ws / "made.txt").read_text() == "made\n"
