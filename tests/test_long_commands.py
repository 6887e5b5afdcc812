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
    return Sandbox(
        SandboxMode.WORKSPACE_WRITE, False, Mechanism.LANDLOCK, landlock_abi=landlock_abi()
    )


def _heredoc(body: str) -> str:
    """A command that writes `body` to out.txt and its `$0` to zero.txt."""
    return f"cat > out.txt <<'END-OF-BODY'\n{body}\nEND-OF-BODY\necho \"$0\" > zero.txt"


@pytest.mark.parametrize("kind", ["off", "bwrap", "landlock"])
def test_a_command_longer_than_one_argument_runs_byte_for_byte(tmp_path: Path, kind: str) -> None:
    sandbox = _sandbox(kind)
    frame = len(_heredoc("").encode())
    line = "é ünïcode \\ $HOME `x` 'q' \"d\" \t\x01 " * 10
    for size in (
        MAX_ARGUMENT,
        MAX_ARGUMENT + 1,
        3 * 1024 * 1024,
    ):  # the last that fits, the first that does not
        prefix = line * ((size - frame) // len(line.encode()))
        body = prefix + "x" * (size - frame - len(prefix.encode()))
        command = _heredoc(body)
        assert len(command.encode()) == size
        out = run_process(
            command, cwd=tmp_path, env=ENV, timeout_s=60, sandbox=sandbox, workspace=tmp_path
        )
        assert out.exit_code == 0, out.stderr
        assert (tmp_path / "out.txt").read_bytes() == body.encode() + b"\n"
        # Only $0 tells the two apart: the shell's name, or the file the shell read.
        zero = (tmp_path / "zero.txt").read_text().strip()
        assert (
            (zero.endswith("bash") or zero.endswith("sh"))
            if size <= MAX_ARGUMENT
            else zero.startswith("/dev/fd/")
        )


def test_the_command_cannot_rewrite_the_script_it_runs_from(tmp_path: Path) -> None:
    # The shell reads a long command as it goes: were the file writable, a command could
    # change what runs after it. It is sealed: every write fails.
    command = (
        "for f in /proc/$$/fd/*; do case $(readlink $f) in *memfd:*) "
        "printf 'echo rewritten > hacked.txt\\n' 1<> $f && echo wrote; "
        "printf 'more' >> $f && echo appended;; esac; done 2>/dev/null\n"
        f"# {'p' * MAX_ARGUMENT}\necho ran-to-the-end"
    )
    out = run_process(command, cwd=tmp_path, env=ENV, timeout_s=30, sandbox=None)
    assert out.exit_code == 0 and out.stdout == "ran-to-the-end\n", (out.stdout, out.stderr)
    assert not (tmp_path / "hacked.txt").exists()


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.text(
        st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"),
        min_size=1,
        max_size=200,
    )
)
def test_hostile_text_in_a_long_command_arrives_as_written(tmp_path: Path, text: str) -> None:
    # printf %s with a quoted argument: what the model wrote must reach the command as it is,
    # whichever way the command travelled. (Single quotes inside are closed and reopened.)
    quoted = "'" + text.replace("'", "'\\''") + "'"
    pad = f"\n# {'z' * MAX_ARGUMENT}\n"
    out = run_process(
        f"printf %s {quoted} > got.bin{pad}", cwd=tmp_path, env=ENV, timeout_s=30, sandbox=None
    )
    assert out.exit_code == 0, out.stderr
    assert (tmp_path / "got.bin").read_bytes() == os.fsencode(text)


_IN_A_CHILD = """
import json, os, resource, sys
from pathlib import Path
from durable_agent.tools.base import ToolFailure
from durable_agent.tools.process import run_process
stack, size, env_bytes, cwd = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
if stack:
    resource.setrlimit(resource.RLIMIT_STACK, (stack, resource.RLIM_INFINITY))
env = {"PATH": os.environ["PATH"]}
env.update({f"BIG{i}": "v" * 60_000 for i in range(env_bytes // 60_000)})
command = "echo ran > ran.txt # " + "c" * (size - 21)
try:
    out = run_process(command, cwd=cwd, env=env, timeout_s=30, sandbox=None)
    print(json.dumps({"exit": out.exit_code, "stderr": out.stderr}))
except ToolFailure as exc:
    print(json.dumps({"refused": str(exc)}))
"""


def _in_a_child(
    tmp_path: Path, *, stack: int = 0, size: int, env_bytes: int = 0, stdin_closed: bool = False
) -> dict[str, object]:
    """run_process in a harness of its own: a stack limit, or its stdin closed."""
    import json
    import sys

    (tmp_path / "ran.txt").unlink(missing_ok=True)
    argv = [sys.executable, "-c", _IN_A_CHILD, str(stack), str(size), str(env_bytes), str(tmp_path)]
    if stdin_closed:  # as a harness started with `0<&-`
        argv = ["/bin/sh", "-c", 'exec "$@" 0<&-', "sh", *argv]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_a_harness_started_without_stdin_still_runs_a_long_command(tmp_path: Path) -> None:
    # The sealed file would have been descriptor 0, which the child's /dev/null stdin then
    # replaced: the shell read an empty script and said "exit 0" having run nothing.
    assert _in_a_child(tmp_path, size=MAX_ARGUMENT + 100, stdin_closed=True)["exit"] == 0
    assert (tmp_path / "ran.txt").read_text() == "ran\n"


def test_a_command_under_one_arguments_limit_but_over_execs_total_goes_by_file(
    tmp_path: Path,
) -> None:
    # A small stack limit makes exec's total limit 128 KiB: a command just under the limit
    # of one argument no longer fits beside the rest, and must take the file too.
    assert _in_a_child(tmp_path, stack=256 * 1024, size=MAX_ARGUMENT - 71)["exit"] == 0
    assert (tmp_path / "ran.txt").read_text() == "ran\n"
    # An environment that alone passes the limit: refused in one line, nothing runs.
    refused = _in_a_child(tmp_path, stack=256 * 1024, size=100, env_bytes=180_000)
    assert "cannot start the command" in str(refused["refused"]) and "\n" not in str(
        refused["refused"]
    )
    assert not (tmp_path / "ran.txt").exists()


_AT_THE_BORDER = """
import json, os, resource, sys
from pathlib import Path
from durable_agent.tools.base import ToolFailure
from durable_agent.tools.process import run_process
from durable_agent.tools.sealed import exec_limit
resource.setrlimit(resource.RLIMIT_STACK, (int(sys.argv[1]), resource.RLIM_INFINITY))
cwd, seen = Path(sys.argv[2]), []
command = "echo ran"
for fill in range(exec_limit() - 9000, exec_limit() + 200, 37):  # an environment near the limit
    env = {"PATH": os.environ["PATH"], "FILL": "f" * (fill % 130_000), "FILL2": "g" * (fill - fill % 130_000)}
    try:
        out = run_process(command, cwd=cwd, env=env, timeout_s=30, sandbox=None)
        seen.append("ran" if out.exit_code == 0 and out.stdout == "ran\\n" else repr(out))
    except ToolFailure as exc:
        seen.append("refused" if str(exc).startswith("cannot start the command") else str(exc))
print(json.dumps(sorted(set(seen))))
"""


@pytest.mark.slow  # a few hundred commands
@pytest.mark.parametrize("stack", [64 * 1024, 256 * 1024, 8 << 20])
def test_at_execs_limit_a_command_runs_or_is_refused_never_fails_to_start(
    tmp_path: Path, stack: int
) -> None:
    # The estimate left out the program's path that the kernel copies as well: just under
    # the limit, exec failed with E2BIG ("Argument list too long: .../python"). On a small
    # stack the kernel's 128 KiB floor let through what the guard then had no stack to run.
    import json
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.run(
        [sys.executable, "-c", _AT_THE_BORDER, str(stack), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)) <= {"ran", "refused"}, proc.stdout


def test_an_environment_variable_longer_than_one_string_is_named(tmp_path: Path) -> None:
    with pytest.raises(ToolFailure, match="the environment variable HUGE is longer"):
        run_process(
            "echo ran > ran.txt",
            cwd=tmp_path,
            env={**ENV, "HUGE": "h" * MAX_ARGUMENT},
            timeout_s=10,
            sandbox=None,
        )
    assert not (tmp_path / "ran.txt").exists()


def test_a_nul_byte_is_refused_in_one_line_and_nothing_runs(tmp_path: Path) -> None:
    for command in ("touch ran\0 more", "touch ran # " + "y" * MAX_ARGUMENT + "\0"):
        with pytest.raises(ToolFailure, match="NUL byte"):
            run_process(command, cwd=tmp_path, env=ENV, timeout_s=10, sandbox=None)
    assert not (tmp_path / "ran").exists()


@pytest.mark.slow  # 800 repository shapes, scanned before each command
def test_a_workspace_with_more_repositories_than_bwrap_takes_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    # bubblewrap refuses past BWRAP_MAX_ARGS arguments ("Exceeded maximum number of
    # arguments"): the model would see that and no way out. The harness refuses first, in
    # words that name the way out, and nothing runs. Below the limit, every repository stays
    # protected.
    need_bwrap()
    sandbox = resolve_sandbox("workspace-write", False, os.environ)
    assert sandbox.bwrap is not None
    options = ["--ro-bind", "/", "/", "--unshare-uts"] + ["--unsetenv", "X"] * (
        (BWRAP_MAX_ARGS - 2 - 4) // 2
    )
    assert (
        len(options) + len(["--", "true"]) == BWRAP_MAX_ARGS
    )  # as many as the harness lets through
    at = subprocess.run(
        [sandbox.bwrap, *options, "--", "true"], capture_output=True, text=True, check=False
    )
    assert at.returncode == 0, at.stderr
    over = subprocess.run(
        [sandbox.bwrap, *options, "--unshare-ipc", "--", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (
        over.returncode != 0 and "maximum number of arguments" in over.stderr
    )  # the limit is bwrap's own

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

    make(50)  # bwrap's own cost grows with the square of its mounts: 500 would take 10 s
    last = ws / "r0049" / ".git"
    out = run_process(
        f"echo made > made.txt; echo '[core] fsmonitor = x' >> {last}/config",
        cwd=ws,
        env=ENV,
        timeout_s=120,
        sandbox=sandbox,
        workspace=ws,
    )
    assert out.exit_code != 0 and "Read-only file system" in out.stderr, out.stderr
    assert (ws / "made.txt").read_text() == "made\n" and (last / "config").read_text() == "[core]\n"

    make(800)
    with pytest.raises(
        SandboxUnavailable, match=r"too many git repositories.*--sandbox read-only"
    ) as refused:
        run_process(
            "echo again > made.txt", cwd=ws, env=ENV, timeout_s=120, sandbox=sandbox, workspace=ws
        )
    assert "\n" not in str(refused.value) and (ws / "made.txt").read_text() == "made\n"
