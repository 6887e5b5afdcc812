"""The garbage collector around a command (durable_agent/cli/collector.py): paused for the
start-up, on (with the start-up frozen) for a run's loop, and as it was after `main`."""

from __future__ import annotations

import gc
from typing import Any

import pytest


def test_a_run_loops_with_the_collector_on_and_main_leaves_it_as_it_found_it(
    cli_inproc, write_script, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from durable_agent.loop.runner import Runner

    seen: list[tuple[bool, int]] = []
    real = Runner.execute

    def execute(self: Runner, *args: Any, **kwargs: Any) -> Any:
        seen.append((gc.isenabled(), gc.get_freeze_count()))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "execute", execute)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    result = cli_inproc(
        "start", "t", "--model", write_script([{"content": "done"}]), "--run-id", "g1"
    )
    assert result.code == 0, result.err
    assert len(seen) == 1 and seen[0][0] and seen[0][1] > 1000, seen  # on, the start-up frozen
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.parametrize("args", [("show", "no-such-run"), ("start", " "), ("list",)])
def test_a_command_that_runs_no_loop_or_fails_leaves_the_collector_on(cli_inproc, args) -> None:  # type: ignore[no-untyped-def]
    result = cli_inproc(*args)
    assert result.code in (0, 2), result.err
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_the_start_up_sets_off_no_collection(env: dict[str, str], workspace, write_script) -> None:  # type: ignore[no-untyped-def]
    """What the pause is for: in a new process, a start's imports and set-up set off no
    collection (each found next to nothing to free; a full one walks every object)."""
    import json
    import subprocess
    import sys

    code = (
        "import gc, json, sys\n"
        "from durable_agent.cli.parser import main\n"
        "seen, inside = [], [False]\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and inside[0]"
        " and seen.append((info['generation'], gc.get_freeze_count() > 0)))\n"
        "inside[0] = True\n"
        "code = main(sys.argv[1:])\n"
        "inside[0] = False\n"
        "print(json.dumps(seen))\n"
        "sys.exit(code)\n"
    )
    script = write_script(
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": f"f{i}"}}]}
            for i in range(300)
        ]
        + [{"content": "done"}]
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "start",
            "t",
            "--model",
            script,
            "--quiet",
            "--max-steps",
            "400",
        ],
        env=env,
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert [s for s in seen if not s[1]] == [], seen  # none while starting up
    assert any(s[1] for s in seen), seen  # and the loop's collections do run (frozen start-up)


@pytest.mark.parametrize("command", ["worker", "ui"])
def test_the_long_lived_commands_run_with_the_collector_on(
    cli_inproc, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:  # type: ignore[no-untyped-def]
    import durable_agent.ui.serve as serve_module
    import durable_agent.worker as worker_module

    seen: list[bool] = []
    target, name = (worker_module, "run_worker") if command == "worker" else (serve_module, "serve")
    monkeypatch.setattr(target, name, lambda *a, **k: seen.append(gc.isenabled()) or 0)
    result = cli_inproc(command, *(["--once"] if command == "worker" else ["--port", "0"]))
    assert result.code == 0, result.err
    assert seen == [True]


def test_main_leaves_a_callers_collector_off_and_its_frozen_objects_frozen(
    cli_inproc, write_script
) -> None:  # type: ignore[no-untyped-def]
    from durable_agent.cli.parser import main

    gc.disable()
    try:
        with pytest.raises(SystemExit):
            main(["--version"])
        assert not gc.isenabled()
        assert (
            cli_inproc(
                "start", "t", "--model", write_script([{"content": "done"}]), "--run-id", "g3"
            ).code
            == 0
        )
        assert not gc.isenabled()
    finally:
        gc.enable()
    gc.freeze()  # as a server that forks would
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 1000
        assert (
            cli_inproc(
                "start", "t", "--model", write_script([{"content": "done"}]), "--run-id", "g4"
            ).code
            == 0
        )
        after = gc.get_freeze_count()  # (frozen objects freed by their counts leave it)
        assert frozen - 1000 < after <= frozen and gc.isenabled()  # not unfrozen, nothing added
    finally:
        gc.unfreeze()


def test_the_process_ends_with_everything_frozen_and_the_store_closed(
    env: dict[str, str], workspace, write_script, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """The process's own command: Python's finalization collects everything start-up made
    (7% of a one-step start's instructions) for nothing the OS would not free. So `main`
    freezes it all at the end, after closing the store's connections: SQLite checkpoints its
    WAL into the store on the last close, and leaves no `-wal` file beside it."""
    import json
    import subprocess
    import sys

    code = (
        "import gc, sys\n"
        "from durable_agent.cli.parser import main\n"
        "sys.argv = ['durable-agent', *sys.argv[1:]]\n"
        "code = main()\n"
        "frozen = gc.get_freeze_count()\n"
        # The finalizer's first collection calls the callbacks: what it would pass over.
        "gc.callbacks.append(lambda phase, info: phase == 'start' and print("
        "'passes over', gc.get_count()[2] + sum(len(gc.get_objects(g)) for g in range(3)),"
        " 'frozen', frozen, flush=True))\n"
        "sys.exit(code)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "start", "t", "--model", write_script([{"content": "done"}])],
        env=env,
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    line = [x for x in out.stdout.splitlines() if x.startswith("passes over")][-1].split()
    over, frozen = int(line[2]), int(line[4])
    assert frozen > 100_000 and over < 10_000, out.stdout  # start-up made ~200,000 objects
    store = tmp_path / "store.db"
    assert store.exists() and not (tmp_path / "store.db-wal").exists()
    assert json.loads(
        subprocess.run(
            [sys.executable, "-m", "durable_agent", "list", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
