"""The live output of start/resume: plain timeline lines on a pipe, a redrawn status line
with the elapsed time on a terminal (a real pty for the CLI), only JSON with --json, and
the summary line."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

from scale_helpers import wait_for

from durable_agent.cli import render
from durable_agent.cli.render import StatusLine, Timeline, summary
from durable_agent.observer import StepEvent
from durable_agent.workspace import progress

ERASE = StatusLine.ERASE


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Locked(io.StringIO):
    """A StringIO whose reads and the status thread's writes do not interleave."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, s: str) -> int:
        with self.lock:
            return super().write(s)

    def text(self) -> str:
        with self.lock:
            return self.getvalue()


def model(state: str, **kw: object) -> StepEvent:
    return StepEvent(0, 0, "model", "m", state=state, **kw)  # type: ignore[arg-type]


def test_not_a_tty_gets_plain_lines_only() -> None:
    out = io.StringIO()
    t = Timeline(out)  # a StringIO is not a terminal
    t.step(model("started"))
    t.step(
        model("completed", detail="read_file", duration_ms=5, prompt_tokens=10, completion_tokens=2)
    )
    t.step(StepEvent(-1, 1, "tool", "read_file", detail="a.txt"))
    t.step(
        StepEvent(
            1,
            1,
            "tool",
            "read_file",
            detail="a.txt",
            state="failed",
            duration_ms=1,
            error="file not found: a.txt\nmore",
        )
    )
    t.close()
    assert t.status is None
    assert out.getvalue() == (
        "Step 0 · model call 1 · m → read_file · 5 ms · 10+2 tokens\n"
        "Step 1 · tool · read_file a.txt · 1 ms · error: file not found: a.txt\n"
    )


def test_on_a_tty_the_status_line_is_erased_before_each_timeline_line() -> None:
    out, clock = Locked(), FakeClock()
    t = Timeline(out, live=True, interval=3600, clock=clock)  # the thread never ticks here
    t.step(model("started"))
    assert out.text() == ERASE + "| model m thinking 0.0 s"
    clock.now += 1.5
    t.step(
        model(
            "completed", detail="edit_file", duration_ms=1500, prompt_tokens=7, completion_tokens=3
        )
    )
    t.step(StepEvent(-1, 1, "tool", "edit_file", detail="src/app.py"))
    clock.now += 0.25
    t.step(
        StepEvent(1, 1, "tool", "edit_file", detail="src/app.py", state="completed", duration_ms=12)
    )
    t.close()
    assert out.text() == (
        ERASE
        + "| model m thinking 0.0 s"
        + ERASE
        + "Step 0 · model call 1 · m → edit_file · 1.5 s · 7+3 tokens\n"
        + ERASE
        + "| edit_file src/app.py running 0.0 s · 10 tokens so far"
        + ERASE
        + "Step 1 · tool · edit_file src/app.py · 12 ms\n"
    )


def test_the_thread_redraws_the_elapsed_time_and_close_erases_it() -> None:
    out, clock = Locked(), FakeClock()
    t = Timeline(out, live=True, interval=0.005, clock=clock)
    t.step(StepEvent(-1, 1, "tool", "run_command", detail="make test"))
    clock.now += 42.0
    wait_for(lambda: "make test running 42.0 s" in out.text(), 5, "the status line to be redrawn")
    t.close()
    assert t.status is not None and t.status._thread is not None
    assert not t.status._thread.is_alive()
    assert out.text().endswith(ERASE)
    final = len(out.text())
    clock.now += 1
    assert len(out.text()) == final  # closed: nothing is drawn any more


def test_a_retry_is_a_line_and_the_step_keeps_its_clock() -> None:
    out, clock = Locked(), FakeClock()
    t = Timeline(out, live=True, interval=3600, clock=clock)
    t.step(model("started"))
    clock.now += 2
    t.step(model("retry", attempts=1, error="429 rate limited"))
    assert out.text().endswith(
        ERASE
        + "  ↺ model m: attempt 1 failed: 429 rate limited\n"
        + ERASE
        + "| model m thinking 2.0 s · retrying: attempt 2"
    )
    t.close()


def test_summary_line() -> None:
    run = SimpleNamespace(
        id="r1",
        status="completed",
        stop_reason="finished",
        step_count=9,
        tool_call_count=1,
        message_count=19,
        prompt_tokens=329,
        completion_tokens=156,
        active_ms=1324,
        error=None,
        model="m",
        settings=None,
        cached_tokens=None,
        cost=None,
    )
    out = io.StringIO()
    summary(run, out)
    assert out.getvalue() == (
        "9 model calls · 1 tool call · 19 messages · 485 tokens (329 in + 156 out) · 1.3 s · "
        "completed (finished)\n"
    )
    run.status, run.stop_reason, run.error = (
        "budget_exceeded",
        "max_steps",
        "the step budget (9) is used up",
    )
    out = io.StringIO()
    summary(run, out)
    assert out.getvalue().splitlines()[1:] == [
        "  the step budget (9) is used up",
        "  continue with: durable-agent resume r1",
    ]


SLOW = [
    {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo hi"}}]},
    {"content": "done"},
]


def test_cli_on_a_pipe_has_no_control_codes_and_json_is_alone(cli, write_script) -> None:
    script = write_script(SLOW)
    r = cli("start", "t", "--model", script, "--shell", "allow")
    assert r.code == 0
    assert "\r" not in r.stderr and "\x1b" not in r.stderr
    assert "Step 1 · tool · run_command echo hi" in r.stderr
    assert r.stderr.splitlines()[-1].endswith("completed (finished)")
    assert r.stdout == "done\n"

    r = cli("start", "t", "--model", script, "--shell", "allow", "--json")
    assert r.code == 0 and r.stderr == ""
    assert set(r.json()) >= {
        "run_id",
        "status",
        "stop_reason",
        "answer",
        "steps",
        "tool_calls",
        "prompt_tokens",
        "completion_tokens",
        "duration_ms",
    }


def test_cli_on_a_terminal_shows_what_runs_and_erases_it(
    env, workspace: Path, write_script
) -> None:
    script = write_script(SLOW)
    program = ["-m", "durable_agent", "start", "t", "--model", script, "--shell", "allow"]
    code, text = on_a_terminal(program, env, workspace)
    assert code == 0
    assert (
        ERASE + "⠋ model " in text and " thinking 0.0 s" in text
    )  # the label is cut, never the time
    assert "run_command echo hi running" in text
    # Every timeline line starts on a cleared line: no status text is left in front of it.
    for line in text.split("\r\n"):
        if "Step " in line:
            assert (ERASE + "Step ") in line and line.rsplit(ERASE, 1)[1].startswith("Step ")
    assert "completed (finished)\r\ndone\r\n" in text


def test_workspace_work_between_steps_is_shown_then_erased(monkeypatch) -> None:
    """A long first snapshot or drift check (no step under way) shows in the status line
    with what it has listed so far; a step's own line takes precedence; once the work is
    over its line is erased."""
    monkeypatch.setattr(render, "WORK_SHOWN_AFTER", 0)
    out = Locked()
    t = Timeline(out, live=True, interval=0.005)
    with progress.working("snapshotting the workspace"):
        progress.listed(1234)
        wait_for(
            lambda: (
                "snapshotting the workspace" in out.text() and "1,234 paths listed" in out.text()
            ),
            10,
            "the work to be shown",
        )
        t.step(StepEvent(-1, 1, "tool", "run_command", detail="make"))
        drawn = len(out.text())
        wait_for(lambda: len(out.text()) > drawn + 200, 10, "redraws")
        assert "snapshotting" not in out.text()[drawn:]  # the step's label, not the work's
        t.step(StepEvent(1, 1, "tool", "run_command", detail="make", state="completed"))
        drawn = len(out.text())
        wait_for(lambda: "snapshotting" in out.text()[drawn:], 10, "the work again")
    drawn = len(out.text())
    wait_for(lambda: out.text().endswith(ERASE), 10, "the work's line to be erased")
    t.close()
    assert "snapshotting" not in out.text()[drawn:]


def test_a_scan_counts_what_it_lists_in_the_work_of_its_thread(tmp_path: Path) -> None:
    from durable_agent.workspace.scan import DEFAULT_EXCLUDE, Scanner

    for d in range(3):
        for f in range(5):
            (tmp_path / f"d{d}" / f"f{f}").parent.mkdir(exist_ok=True)
            (tmp_path / f"d{d}" / f"f{f}").write_text("x")
    seen: list[int] = []
    with progress.working("checking") as work:
        other = threading.Thread(target=lambda: seen.append(progress.under_way() is work))
        other.start()
        other.join()
        Scanner(tmp_path, list(DEFAULT_EXCLUDE), 1 << 20).scan()
        with progress.working("inner") as inner:  # the outermost work counts
            assert inner is work
    assert work.done == 3 + 15 and seen == [True]  # the root's 3 names, each folder's 5
    assert progress.under_way() is None
    progress.listed(5)  # outside any work: counted nowhere, no error


# Runs the CLI with the work shown at once (not after half a second), and each count a work
# advances by held until the status line has asked for the work twice since (the second
# draw shows the count): a small workspace's work shows.
_SHOWN_AT_ONCE = """
import sys, threading
from durable_agent.cli import render
from durable_agent.cli.parser import main
from durable_agent.workspace import progress
render.WORK_SHOWN_AFTER = 0
asked, real_work, real_advanced = threading.Event(), render.workspace_work, progress.advanced
def work():
    shown = real_work()
    if shown is not None:
        asked.set()
    return shown
def advanced(n, unit):
    real_advanced(n, unit)
    if progress.under_way() is not None:
        for _ in range(2):
            asked.clear()
            if not asked.wait(30):
                raise SystemExit("the status line never asked")
render.workspace_work = work
progress.advanced = advanced
sys.argv = ["durable-agent", *sys.argv[1:]]
sys.exit(main())
"""


def on_a_terminal(program: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """`python PROGRAM...` with a pty for its stdin, stdout and stderr: its exit code, and
    all it wrote there."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, *program],
        cwd=cwd,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    chunks = []
    while True:  # until the child closes its end of the terminal
        try:
            data = os.read(leader, 4096)
        except OSError:  # EIO: the child is gone
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks).decode()


def _on_a_terminal(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    return on_a_terminal(["-c", _SHOWN_AT_ONCE, *argv], env, cwd)


def test_cli_shows_the_first_snapshot_and_the_drift_check_on_a_terminal(
    env, workspace: Path, write_script
) -> None:
    for i in range(20):
        (workspace / f"f{i}.txt").write_text(f"{i}\n")
    script = write_script([{"content": "done"}])
    code, text = _on_a_terminal(
        ["start", "t", "--model", script, "--detach", "--run-id", "w1"], env, workspace
    )
    assert code == 0, text
    assert re.search(
        re.escape(ERASE) + r"⠋ snapshotting the workspace [\d.]+ s · 20 paths listed", text
    )
    last = text.split("\r\n")[-2]  # the run id, on a line of its own: erased before it
    assert last.rsplit(ERASE, 1)[-1] == "w1", text
    code, text = _on_a_terminal(["resume", "w1"], env, workspace)
    assert code == 0, text
    assert "checking the workspace against its last snapshot" in text
    for line in text.split("\r\n"):  # no line of the timeline is written after the work's
        if "Step " in line or "completed (finished)" in line:
            assert "checking" not in line.rsplit(ERASE, 1)[-1]


def test_cli_restore_shows_what_it_has_written_on_a_terminal(
    env, workspace: Path, write_script, tmp_path: Path
) -> None:
    for i in range(20):
        (workspace / f"f{i}.txt").write_text(f"{i}\n")
    script = write_script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "n.txt", "content": "x"}}
                ]
            },
            {"content": "done"},
        ]
    )
    code, text = _on_a_terminal(["start", "t", "--model", script, "--run-id", "r1"], env, workspace)
    assert code == 0, text
    out = tmp_path / "restored"
    code, text = _on_a_terminal(["restore", "r1", "--at", "1", "--to", str(out)], env, workspace)
    assert code == 0, text
    assert re.search(r"restoring the workspace [\d.]+ s · 21 of 21 paths written", text), text
    last = text.split("\r\n")[-2]  # what it says at the end: on an erased line
    assert last.rsplit(ERASE, 1)[-1].startswith(f"restored {out} to the snapshot after step 1")
    assert (out / "n.txt").read_text() == "x" and (out / "f7.txt").read_text() == "7\n"
