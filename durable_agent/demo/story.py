"""`durable-agent demo`: the point of the product in one offline command, no API key.

    1. copy the bundled project (a calculator whose add() subtracts) to a folder of its own,
       kept with the demo's store so the commands printed at the end find the run (home.py)
    2. run the bundled scripted task in a child process that is killed with SIGKILL at the
       worst moment: calc.py is edited on disk, the edit's outcome not yet recorded
       (power_cut.py: the real CLI, whose edit_file is followed by a SIGKILL)
    3. read what the database holds after the crash
    4. resume the run in a new child process
    5. print side by side what was recorded before the crash and what ran after
    6. print and run the SQL that shows nothing ran twice, and count the test runs the
       workspace itself witnessed

Everything reported is read back from the database and the workspace after the fact, never
assumed: if the story did not happen as planned, the demo says what did happen and exits 1.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from msgspec import Struct

import durable_agent
from durable_agent.cli.streams import forgiving
from durable_agent.config.layers import sqlite_url
from durable_agent.demo.checks import Verdict, check_story
from durable_agent.demo.home import demo_home, invoked_as
from durable_agent.errors import ConfigError
from durable_agent.presentation import fmt_ms, short, step_what
from durable_agent.status import StepKind
from durable_agent.store.payloads import ToolOutput
from durable_agent.store.records import RunRecord, StepRecord, StepState
from durable_agent.store.runs import Store

TASK = "inspect the repo and fix the bug"

WITNESS = ".test-runs.log"  # test_calc.py appends the call id that ran it
CHILD_TIMEOUT_S = 120


class Child(Struct, frozen=True):
    pid: int
    code: int
    hung: bool  # stopped by the demo's watchdog, not by the planned crash

    @property
    def killed(self) -> bool:
        return self.code == -signal.SIGKILL and not self.hung


def run_demo(db: str | None, env: Mapping[str, str], prog: str | None = None) -> int:
    """Play the demo; what it made is kept (home.py) for the commands it prints, written
    the way this program was run (`prog`: sys.argv[0] by default)."""
    home = demo_home(env)
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    try:
        (home / run_id).mkdir(parents=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot keep the demo in {home}: {exc.strerror or exc}; set XDG_DATA_HOME to a "
            "writable folder"
        ) from None
    return _Demo(home, run_id, db, env, prog or invoked_as()).play()


def clean_demo(env: Mapping[str, str], prog: str | None = None) -> int:
    """`durable-agent demo --clean`: remove what the demos kept (their workspaces and store)."""
    home = demo_home(env)
    if not home.exists():
        say(f"nothing to remove: {home} does not exist")
        return 0
    runs = sorted(p.name for p in home.iterdir() if p.is_dir())
    try:
        shutil.rmtree(home)
    except OSError as exc:
        raise ConfigError(f"cannot remove {home}: {exc.strerror or exc}") from None
    say(f"removed {home}: {len(runs)} demo run(s) and the demo's store")
    say(
        "(runs a demo recorded in a store given with --db are left there: "
        f"{prog or invoked_as()} list --db URL)"
    )
    return 0


def say(text: str = "") -> None:
    # A reader that goes away (`demo | head`) must not leave a child running in a workspace
    # this process then deletes: the story goes on to its end, unread.
    print(text, file=forgiving(sys.stdout), flush=True)


class _Demo:
    def __init__(
        self, home: Path, run_id: str, db: str | None, env: Mapping[str, str], prog: str
    ) -> None:
        self.home, self.root, self.prog = home, home / run_id, prog
        self.workspace = self.root / "project"
        self.db_file = None if db else home / "demo.db"
        self.db = db or sqlite_url(home / "demo.db")
        self.run_id = run_id
        self.env = _child_env(env, self.root)
        # Our own bundled script in its own temporary workspace: where no sandbox can be had,
        # it may run unconfined (a user's task may not: `start` refuses, see os_sandbox.py).
        from durable_agent.tools.os_sandbox import Mechanism, resolve_sandbox

        self.unsandboxed = (
            resolve_sandbox("workspace-write", False, env).mechanism is Mechanism.NONE
        )

    def play(self) -> int:
        _copy_tree(resources.files("durable_agent.demo").joinpath("project"), self.workspace)
        say(
            "durable-agent demo · offline: a scripted model, no API key, nothing leaves this machine"
        )
        say(f"  workspace  {self.workspace}  (a copy of a tiny project: add() subtracts)")
        say(f"  database   {self.db}")
        sandbox = ["--sandbox", "off"] if self.unsandboxed else []
        if self.unsandboxed:
            say(
                "  sandbox    none here (no bubblewrap, no Landlock): this bundled demo runs its "
                "commands unsandboxed; your own runs will refuse to (see `durable-agent doctor`)"
            )
        say()
        say(
            f'1. {self.prog} start "{TASK}" --model demo --shell allow'
            + " --sandbox off" * self.unsandboxed
        )
        say(
            "   in a child process whose power goes out right after edit_file writes calc.py "
            "(a SIGKILL, before the edit is recorded)"
        )
        first = self._child(
            [
                "start",
                TASK,
                "--model",
                "demo",
                "--shell",
                "allow",
                "--no-memory",  # the user's own AGENTS.md is not the bundled task's
                *sandbox,
                "--workspace",
                str(self.workspace),
                "--run-id",
                self.run_id,
            ],
            module="durable_agent.demo.power_cut",
        )
        if not first.killed:
            why = "hung and was stopped" if first.hung else f"exited with code {first.code}"
            say(f"✗ the child was not killed by the planned crash: it {why}")
            return 1
        say(f"   ✗ process {first.pid} killed by SIGKILL: no clean-up, no goodbye")
        say()

        store = _open_store(self.db)
        try:
            before_run, before = store.get_run(self.run_id), store.steps(self.run_id)
            witness_before = _witness(self.workspace)
            self._after_crash(before_run, before, first.pid)

            say(
                f"3. resume in a new child process: {self.prog} resume {self.run_id}"
                f" --db {shlex.quote(self.db)}"
            )
            second = self._child(["resume", self.run_id])
            say(f"   process {second.pid} exited with code {second.code}")
            say()
            run, after = store.get_run(self.run_id), store.steps(self.run_id)
            _side_by_side(run, before, after, first.pid, second.pid)
            verdict = check_story(
                run=run,
                before=before,
                after=after,
                resumed_code=second.code,
                witness_before=witness_before,
                witness=_witness(self.workspace),
                calc_py=(self.workspace / "calc.py").read_text(encoding="utf-8"),
            )
            self._proof(store, verdict)
        finally:
            store.engine.dispose()
        self._epilogue()
        return 0 if verdict.ok else 1

    def _child(self, args: Sequence[str], module: str = "durable_agent") -> Child:
        """`python -m MODULE ARGS` with its output streamed, indented, as it comes."""
        cmd = [sys.executable, "-m", module, *args, "--db", self.db]
        proc = subprocess.Popen(
            cmd,
            cwd=self.workspace,
            env=self.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        hung = threading.Event()

        def stop() -> None:  # a demo must never hang; SIGTERM so it is not mistaken for the crash
            hung.set()
            proc.terminate()

        watchdog = threading.Timer(CHILD_TIMEOUT_S, stop)
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                say(f"   │ {line.rstrip()}")
            code = proc.wait()
        finally:
            watchdog.cancel()
        return Child(proc.pid, code, hung.is_set())

    def _after_crash(self, run: RunRecord, steps: list[StepRecord], pid: int) -> None:
        say("2. what the database holds after the crash")
        done = [s for s in steps if s.state != StepState.STARTED]
        say(
            f"   run {run.id}: status {run.status}, its lease still held by {run.lease_owner} "
            f"(process {pid}, now gone)"
        )
        say(
            f"   {len(done)} steps with an outcome: {run.step_count} model answers "
            f"({run.prompt_tokens + run.completion_tokens} tokens paid), "
            f"{sum(1 for s in done if s.kind == StepKind.TOOL)} tool results"
        )
        for s in steps:
            if s.state == StepState.STARTED:
                say(
                    f"   step {s.seq}, {short(step_what(run, s), 40)}: intent recorded, "
                    "outcome never committed"
                )
        edited = "return a + b" in (self.workspace / "calc.py").read_text(encoding="utf-8")
        say(
            f"   calc.py on disk: {'already edited (the write happened)' if edited else 'not edited yet'}"
        )
        say()

    def _proof(self, store: Store, verdict: Verdict) -> None:
        say("5. proof: nothing ran twice")
        self._query(
            store,
            "every step is recorded once: duplicated idempotency keys",
            "SELECT idempotency_key, COUNT(*) AS n FROM steps WHERE run_id = :run_id "
            "GROUP BY idempotency_key HAVING COUNT(*) > 1",
        )
        self._query(
            store,
            "each tool call: how many times it was tried",
            "SELECT seq AS step, tool_name, call_id, attempts, state FROM steps "
            "WHERE run_id = :run_id AND kind = 'tool' ORDER BY seq",
        )
        for line in verdict.lines:
            say(f"   {line}")
        say()
        say(
            "✓ crashed with SIGKILL, resumed, finished; nothing ran twice"
            if verdict.ok
            else "✗ the demo did not go as described above: " + "; ".join(verdict.problems)
        )

    def _query(self, store: Store, title: str, sql: str) -> None:
        shown = sql.replace(":run_id", f"'{self.run_id}'")
        say(f"   -- {title}")
        if self.db_file is not None:
            say(f'   $ sqlite3 -header {self.db_file} "{shown}"')
        else:
            say(f"   {shown};")
        columns, rows = store.query(sql, {"run_id": self.run_id})
        if not rows:
            say("   (no rows)")
        else:
            widths = [
                max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(columns)
            ]
            say("   " + "  ".join(str(c).ljust(w) for c, w in zip(columns, widths, strict=True)))
            for row in rows:
                say("   " + "  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)))
        say()

    def _epilogue(self) -> None:
        p, db = self.prog, f" --db {shlex.quote(self.db)}"
        say(f"see it yourself: {p} show {self.run_id}{db}")
        say(f"                 {p} list{db}")
        say(f"                 {p} export {self.run_id}{db}")
        if self.db_file is not None:
            say(f"                 sqlite3 {self.db_file} 'SELECT * FROM run_timeline'")
        say(f"kept: {self.root}")
        say(f"      (`{p} demo --clean` removes what the demos kept, in {self.home})")


def _side_by_side(
    run: RunRecord, before: list[StepRecord], after: list[StepRecord], pid1: int, pid2: int
) -> None:
    say("4. side by side: what was recorded before the crash, and what the resume did")
    earlier = {s.seq: s for s in before}
    rows = [("#", "step", f"before the crash (pid {pid1})", f"after the resume (pid {pid2})")]
    for s in after:
        old = earlier.get(s.seq)
        what = f"{s.kind} {step_what(run, s)}" if s.kind == StepKind.MODEL else step_what(run, s)
        rows.append((str(s.seq), short(what, 36), _before(old), _after(old, s)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        say(f"   {r[0]:>{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}")
    say()


def _before(old: StepRecord | None) -> str:
    if old is None:
        return "—"
    if old.state == StepState.STARTED:
        return "intent only, no outcome"
    return str(old.state)


def _after(old: StepRecord | None, new: StepRecord) -> str:
    if old is None:
        return f"ran: {new.state} · {fmt_ms(new.duration_ms)}"
    if old.state == StepState.STARTED:
        out = new.typed_output
        result = out.result if isinstance(out, ToolOutput) else None
        return f"settled, attempts {new.attempts}: {short(result or new.state, 60)}"
    if (old.finished_at, old.attempts, old.state) == (new.finished_at, new.attempts, new.state):
        return "kept as recorded, not run again"
    return f"{old.state} → {new.state}, attempts {old.attempts} → {new.attempts}"


def _witness(workspace: Path) -> Counter[str]:
    path = workspace / WITNESS
    if not path.exists():
        return Counter()
    return Counter(
        line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    )


def _open_store(url: str) -> Store:
    from durable_agent.store.engine import open_store_engine

    return Store(open_store_engine(url))


def _copy_tree(src: Traversable, dest: Path) -> None:
    """The bundled project may sit in a zip or a wheel: copy through importlib.resources."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name == "__pycache__":
            continue
        if item.is_dir():
            _copy_tree(item, dest / item.name)
        else:
            (dest / item.name).write_bytes(item.read_bytes())


def _child_env(env: Mapping[str, str], root: Path) -> dict[str, str]:
    """The children's environment: the same everywhere, whatever the user configured.

    No OPENAI_* or DURABLE_AGENT_* settings and an empty config file (a configured --verify
    or a small --max-steps must not change the story); `python3` on PATH is this interpreter
    (the demo's command is `python3 test_calc.py`); this package importable even when it
    is not installed.
    """
    child = {k: v for k, v in env.items() if not k.startswith(("OPENAI_", "DURABLE_AGENT_"))}
    config = root / "config.toml"
    config.write_text("# empty: the demo ignores the user's configuration\n", encoding="utf-8")
    child["DURABLE_AGENT_CONFIG"] = str(config)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in ("python3", "python"):
        (bin_dir / name).symlink_to(sys.executable)
    child["PATH"] = os.pathsep.join([str(bin_dir), child.get("PATH", os.defpath)])
    package_parent = str(Path(durable_agent.__file__).resolve().parent.parent)
    child["PYTHONPATH"] = os.pathsep.join(
        p for p in [package_parent, child.get("PYTHONPATH", "")] if p
    )
    return child
