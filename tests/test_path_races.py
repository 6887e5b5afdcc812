"""File operations of the harness cannot be raced out of the workspace (issue 41, item 1).

A process that outlives its call swaps a folder of the workspace and a link to outside with
renameat2(RENAME_EXCHANGE) in a tight loop, while the harness works through that folder:
thousands of file-tool calls in this process, snapshot scans, restores, and runs, a
`restore --force` and a `diff` through the real CLI. Nothing outside may be written or
read: the canary folder stays byte-identical and its text is in no observation, no
snapshot, no transcript.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from workspace_support import picture

from durable_agent.errors import DurableAgentError
from durable_agent.tools import beneath, build_tools
from durable_agent.tools.base import ToolContext, ToolFailure, ToolResult
from durable_agent.workspace.materialize import materialize
from durable_agent.workspace.scan import Scanner

CANARY = "CANARY-outside-the-workspace-7f3a"
RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "arm64": 276}.get(platform.machine())

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(RENAMEAT2 is None, reason="renameat2's number is known for x86_64/arm64"),
]

# Swaps `a` and `b` (same folder) until the stop file appears, at most `count` times or
# `seconds` seconds, and leaves them as it found them (an even number of exchanges). An
# exchange that fails (a restore removed one of the names for a moment) is counted apart.
SWAPPER = r"""
import ctypes, os, sys, time
nr, a, b, stop, count, seconds = sys.argv[1:7]
nr, count = int(nr), int(count)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
a, b = os.fsencode(a), os.fsencode(b)
def exchange():
    return libc.syscall(ctypes.c_long(nr), ctypes.c_int(-100), ctypes.c_char_p(a),
                        ctypes.c_int(-100), ctypes.c_char_p(b), ctypes.c_uint(2)) == 0
deadline = time.monotonic() + float(seconds)
print("ready", flush=True)
done = failed = 0
while done < count:
    # Checked by attempts, not by swaps: once a restore has removed one of the names for
    # good, every exchange fails and `done` stays where it was.
    if (done + failed) % 512 == 0 and (os.path.exists(stop) or time.monotonic() > deadline):
        break
    if exchange():
        done += 1
    else:
        failed += 1
if done % 2 and exchange():
    done += 1
print(done, failed, flush=True)
"""


@contextmanager
def swapping(folder: Path, link: Path, stop: Path, seconds: float = 60) -> Iterator[list[int]]:
    """The swapper running for the block; yields [swaps, failed] once it has stopped."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(RENAMEAT2), str(folder), str(link), str(stop)]
        + ["50000000", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    counts: list[int] = []
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield counts
    finally:
        stop.touch()
        out, _ = proc.communicate(timeout=seconds + 30)
        stop.unlink()
        counts.extend(int(n) for n in out.split())
    assert proc.returncode == 0, out


@pytest.fixture
def layout(workspace: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """ws/d (a folder) and ws/l (a link to the canary folder), both holding x.txt and
    sub/deep.txt: whichever `d` is at a given moment, the same paths exist under it."""
    ws = workspace
    outside = tmp_path / "outside"
    for root, text in ((ws / "d", "inside"), (outside, CANARY)):
        (root / "sub").mkdir(parents=True)
        (root / "x.txt").write_text(f"{text} x\n")
        (root / "sub" / "deep.txt").write_text(f"{text} deep\n")
    (outside / "only-outside.txt").write_text(CANARY + "\n")
    (ws / "l").symlink_to(outside)
    (ws / "top.txt").write_text("top\n")
    return ws, outside, tmp_path / "stop"


def _call(ws: Path, name: str, **args: object) -> ToolResult:
    tool = build_tools("deny")[name]
    ctx = ToolContext(workspace=ws, run_id="r", call_id="c")
    try:
        return tool.run(tool.args_model.model_validate(args), ctx)
    except ToolFailure as exc:
        return ToolResult(error=str(exc))
    except OSError as exc:  # the tool step turns these into error observations as well
        return ToolResult(error=f"{type(exc).__name__}: {exc}")


def _blob_of(contents: dict[str, bytes]) -> Callable[[str], bytes]:
    return lambda ref: contents[ref]


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "component-walk"])
def test_file_tools_snapshots_and_restores_stay_inside_while_a_folder_is_swapped(
    layout: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch, openat2: bool
) -> None:
    ws, outside, stop = layout
    if not openat2:
        monkeypatch.setattr(beneath, "_syscall", None)
    elif not beneath.has_openat2():
        pytest.skip("this kernel has no openat2")
    before = picture(outside)
    scanner = Scanner(ws, [], 1 << 20)
    first = scanner.scan()
    target, contents = first.manifest, dict(first.contents)
    seen: list[str] = []
    done = {"ok": 0, "refused": 0, "scans": 0, "restores": 0}
    with swapping(ws / "d", ws / "l", stop) as counts:
        for i in range(240):
            results = [
                _call(ws, "write_file", path="d/x.txt", content=f"inside {i}\n"),
                _call(ws, "read_file", path="d/x.txt"),
                _call(ws, "edit_file", path="d/x.txt", old_string="inside", new_string="edited"),
                _call(ws, "write_file", path="d/sub/new.txt", content=f"new {i}\n"),
                _call(ws, "read_file", path="d/sub/deep.txt"),
                _call(ws, "list_files", path="d", max_depth=3),
                _call(ws, "list_files", path=".", max_depth=3),
                _call(ws, "search_text", pattern="CANARY|inside|edited", path="d"),
                _call(ws, "search_text", pattern="CANARY|inside|edited"),
            ]
            for r in results:
                seen.append(r.output + (r.error or ""))
                done["ok" if r.error is None else "refused"] += 1
            if i % 10 == 0:
                scan = scanner.scan()
                seen.extend(os.fsdecode(p) for p in scan.manifest)
                seen.extend(data.decode("utf-8", "replace") for data in scan.contents.values())
                done["scans"] += 1
            if i % 40 == 20:
                # While the folder flips, a restore is often refused (the scan and the disk
                # disagree) or stops partway, and says so; what matters is where it wrote.
                # Up to 50 tries each time, so that some also run their writes to the end.
                for _try in range(50):
                    try:
                        materialize(target, ws, scanner, _blob_of(contents))
                    except DurableAgentError:
                        continue
                    done["restores"] += 1
                    break
    leaked = [s for s in seen if CANARY in s or "only-outside" in s]
    assert not leaked, f"{len(leaked)} observation(s) read outside: {leaked[:3]}"
    assert picture(outside) == before, "a file outside the workspace was written"
    assert counts[0] > 1000, counts  # the swapper really ran through the calls
    assert done["ok"] > 100 and done["scans"] == 24 and done["restores"] > 0, done


def test_runs_restores_and_diffs_through_the_cli_stay_inside(
    layout: tuple[Path, Path, Path],
    cli: Callable[..., Any],
    write_script: Callable[[list[dict[str, Any]]], str],
) -> None:
    ws, outside, stop = layout
    before = picture(outside)
    calls: list[dict[str, Any]] = []
    for i in range(30):
        calls += [
            {"name": "write_file", "arguments": {"path": "d/x.txt", "content": f"inside {i}\n"}},
            {"name": "read_file", "arguments": {"path": "d/x.txt"}},
            {"name": "read_file", "arguments": {"path": "d/sub/deep.txt"}},
            {"name": "list_files", "arguments": {"path": "d"}},
            {"name": "search_text", "arguments": {"pattern": "CANARY|inside"}},
        ]
    model = write_script(
        [{"tool_calls": calls[:75]}, {"tool_calls": calls[75:]}, {"content": "ok"}]
    )
    with swapping(ws / "d", ws / "l", stop) as counts:
        run = cli(
            "start", "edit d", "--model", model, "--shell", "deny", "--json", "--run-id", "r1"
        )
        if run.code == 5 and "workspace_drift" in run.stdout:
            # The swaps since the run's first snapshot are a change the session start sees
            # (an odd number of them): continue with the files as they are.
            assert cli("approve", "r1").code == 0
            run = cli("resume", "r1", "--json")
        assert run.code == 0, run.stdout + run.stderr
        restored = cli("restore", "r1", "--at", "1", "--to", str(ws), "--force")
        diff = cli("diff", "r1")
        exported = cli("export", "r1")
    # Done, stopped at a link that appeared (1), or refused because the scan and the disk
    # disagreed while the folder flipped (2): never a traceback, and never written outside.
    assert restored.code in (0, 1, 2), restored.stderr
    assert "Traceback" not in restored.stderr
    assert diff.code == 0 and exported.code == 0, (diff.stderr, exported.stderr)
    for shown in (run, restored, diff, exported):
        assert CANARY not in shown.stdout + shown.stderr
    results = [json.loads(line) for line in exported.stdout.splitlines() if line.strip()]
    assert any("inside" in json.dumps(r) for r in results)  # the tools did read the workspace
    assert picture(outside) == before, "a file outside the workspace was written"
    assert counts[0] > 100, counts
