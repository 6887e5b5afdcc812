"""A run crashed, something it runs with changed, then `resume` (docs/versions.md): for each
kind of change the classification, the exit code, the run_versions rows and the consent step.

The run is a real process killed by SIGKILL from inside its first tool call (a plugin tool
that kills its own harness once), so the resume continues a run cut off mid-turn. Plugins
come from a distribution on PYTHONPATH whose module and entry points the test rewrites
between the crash and the resume: a tool removed, its schema changed, one added.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import Result

PLUGIN = """
import os, signal
from typing import Any, ClassVar

from pydantic import BaseModel

from durable_agent.status import EffectClass
from durable_agent.tools.base import ToolContext, ToolResult


class Args(BaseModel):
    text: str
{extra_field}

class Probe:
    name: ClassVar[str] = "{name}"
    description: ClassVar[str] = "{description}"
    args_model: ClassVar[type[BaseModel]] = Args
    effect: ClassVar[EffectClass] = EffectClass.{effect}

    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        marker = {marker!r}
        if not os.path.exists(marker):  # the first call: the harness dies here (a crash)
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return ToolResult(output="probed " + args.text)


def make() -> Probe:
    return Probe()
"""


class Lab:
    """A store, a workspace and a plugin distribution the test can change between sessions."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.tmp = tmp_path
        self.db = tmp_path / "store.db"
        self.ws = tmp_path / "ws"
        self.ws.mkdir(exist_ok=True)
        (self.ws / "a.txt").write_text("hello\n")
        self.site = tmp_path / "site"
        self.env = {**env, "PYTHONPATH": str(self.site), "DURABLE_AGENT_DB": f"sqlite:///{self.db}"}
        self.script = tmp_path / "script.json"
        self.other = tmp_path / "other.json"
        turns = [
            {"tool_calls": [{"name": "probe", "arguments": {"text": "x"}}]},
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
            {"content": "done"},
        ]
        self.script.write_text(json.dumps(turns))
        self.other.write_text(json.dumps(turns))

    def plugin(
        self,
        *,
        present: bool = True,
        extra_field: str = "",
        description: str = "Probe a text.",
        effect: str = "READ",
    ) -> None:
        pkg = self.site / "da_version_probe"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(
            PLUGIN.format(
                extra_field=extra_field,
                name="probe",
                description=description,
                effect=effect,
                marker=str(self.tmp / "crashed-once"),
            )
        )
        info = self.site / "da_version_probe-0.1.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: da-version-probe\nVersion: 0.1\n"
        )
        points = "[durable_agent.tools]\nprobe = da_version_probe:make\n" if present else ""
        (info / "entry_points.txt").write_text(points)

    def da(self, *args: str) -> Result:
        import forked_cli

        proc = forked_cli.run(args, env=self.env, cwd=self.ws, timeout=120)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def start_and_crash(self, shell: str = "deny") -> None:
        r = self.da(
            "start", "t", "--model", f"scripted:{self.script}", "--shell", shell,
            "--run-id", "r", "--quiet",
        )  # fmt: skip
        assert r.code == -9, (r.code, r.stderr)

    def sql(self, statement: str) -> list[Any]:
        with sqlite3.connect(self.db) as conn:
            return conn.execute(statement).fetchall()

    def reasons(self) -> list[str]:
        return [r for (r,) in self.sql("SELECT reason FROM run_versions ORDER BY id")]

    def version_steps(self) -> list[Any]:
        return self.sql("SELECT seq, state, input FROM steps WHERE kind = 'version'")

    def fingerprint_set(self, path: str, value: str) -> None:
        """What an earlier release recorded: the run's row edited as that release wrote it."""
        with sqlite3.connect(self.db) as conn:
            conn.execute(
                f"UPDATE run_versions SET fingerprint = json_set(fingerprint, '{path}', ?)",
                (value,),
            )

    def status(self) -> tuple[str, str | None]:
        ((status, reason),) = self.sql("SELECT status, stop_reason FROM runs WHERE id = 'r'")
        return status, reason


@pytest.fixture
def lab(tmp_path: Path, env: dict[str, str]) -> Lab:
    return Lab(tmp_path, env)


def _errors(r: Result) -> int:
    return sum(line.startswith("durable-agent: error:") for line in r.stderr.splitlines())


def _consent_flow(lab: Lab, resume: Result, what: str) -> None:
    """Needs consent: blocked, the diff in `show`, no row, then --accept-changes goes on."""
    assert resume.code == 5, resume.stderr
    assert lab.status() == ("blocked", "changed_since_checkpoint")
    assert lab.reasons() == ["start"]
    assert what in resume.stderr
    show = lab.da("show", "r")
    assert "changed since the checkpoint" in show.stdout and what in show.stdout, show.stdout
    listed = lab.da("list", "--needs-consent")
    assert listed.stdout.splitlines()[0] == "r" and what in listed.stdout
    again = lab.da("resume", "r", "--quiet", "--accept-changes")
    assert again.code == 0, again.stderr
    assert lab.reasons() == ["start", "accepted"]
    ((seq, state, consent),) = lab.version_steps()
    assert state == "completed" and any(what in c["what"] for c in json.loads(consent)["changes"])
    ((row_seq,),) = lab.sql("SELECT seq FROM run_versions WHERE reason = 'accepted'")
    assert row_seq == seq  # the row took effect at the consent step
    assert lab.da("list", "--needs-consent").stdout == ""


@pytest.mark.slow  # over 2 s on 2 cores
def test_a_used_tool_removed_needs_consent(lab: Lab) -> None:
    lab.plugin()
    lab.start_and_crash()
    lab.plugin(present=False)
    _consent_flow(lab, lab.da("resume", "r", "--quiet"), "tool probe")


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_a_used_tools_schema_changed_needs_consent(lab: Lab) -> None:
    lab.plugin()
    lab.start_and_crash()
    lab.plugin(extra_field="    loud: bool = False")
    _consent_flow(lab, lab.da("resume", "r", "--quiet"), "tool probe")


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_a_different_model_needs_consent_and_pin_keeps_the_recorded_one(lab: Lab) -> None:
    lab.plugin()
    lab.start_and_crash()
    moved = lab.da("resume", "r", "--quiet", "--model", f"scripted:{lab.other}")
    assert moved.code == 5 and "model" in moved.stderr, moved.stderr
    assert lab.reasons() == ["start"]
    pinned = lab.da("resume", "r", "--quiet", "--pin")
    assert pinned.code == 0, pinned.stderr
    assert lab.reasons() == ["start"]  # nothing changed: no row, no consent step
    assert lab.version_steps() == []
    # The question the block asked no longer stands: answered and used, not left pending.
    assert lab.sql("SELECT decision, used_at IS NOT NULL FROM approvals") == [("approved", 1)]
    ((model,),) = lab.sql("SELECT json_extract(fingerprint, '$.model.name') FROM run_versions")
    assert model == f"scripted:{lab.script}"


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_a_different_endpoint_needs_consent(lab: Lab) -> None:
    lab.plugin()
    lab.start_and_crash()
    r = lab.da("resume", "r", "--quiet", "--base-url", "http://127.0.0.1:9/v1")
    _consent_flow(lab, r, "model endpoint")


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_a_minor_release_needs_consent_and_a_patch_release_does_not(lab: Lab) -> None:
    lab.plugin()
    lab.start_and_crash()
    lab.fingerprint_set("$.durable_agent", "0.0.9")
    _consent_flow(lab, lab.da("resume", "r", "--quiet"), "durable-agent")


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_a_patch_release_is_compatible(lab: Lab) -> None:
    from durable_agent.loop.versions import RELEASE

    lab.plugin()
    lab.start_and_crash()
    major, minor = RELEASE.split(".")[:2]
    lab.fingerprint_set("$.durable_agent", f"{major}.{minor}.999")
    r = lab.da("resume", "r")
    assert r.code == 0, r.stderr
    assert "changed since the last checkpoint: durable-agent" in r.stderr
    assert lab.reasons() == ["start", "compatible"] and lab.version_steps() == []


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_a_changed_system_prompt_needs_consent(lab: Lab) -> None:
    lab.plugin()
    lab.start_and_crash()
    lab.fingerprint_set("$.system_prompt_sha256", "0" * 64)
    _consent_flow(lab, lab.da("resume", "r", "--quiet"), "system prompt")


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_a_tool_added_and_a_description_changed_are_compatible(lab: Lab) -> None:
    lab.plugin()
    lab.start_and_crash()
    lab.plugin(description="Probe a text, now described better.")
    (lab.site / "da_version_probe" / "extra.py").write_text(
        "from da_version_probe import Probe\n\n"
        "class Extra(Probe):\n    name = 'extra_probe'\n\n"
        "def make():\n    return Extra()\n"
    )
    info = lab.site / "da_version_probe-0.1.dist-info" / "entry_points.txt"
    info.write_text(info.read_text() + "extra = da_version_probe.extra:make\n")
    r = lab.da("resume", "r")
    assert r.code == 0, r.stderr
    assert "tool extra_probe" in r.stderr and "tool probe" in r.stderr
    assert lab.reasons() == ["start", "compatible"] and lab.version_steps() == []
    ((changes,),) = lab.sql("SELECT changes FROM run_versions WHERE reason = 'compatible'")
    assert {c["level"] for c in json.loads(changes)} == {"compatible"}


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_a_raised_budget_is_compatible(lab: Lab) -> None:
    lab.plugin()
    lab.start_and_crash()
    r = lab.da("resume", "r", "--max-steps", "80")
    assert r.code == 0, r.stderr
    assert "setting max_steps" in r.stderr
    assert lab.reasons() == ["start", "compatible"]


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_a_newer_schema_is_refused_and_nothing_is_written(lab: Lab) -> None:
    lab.plugin()
    lab.start_and_crash()
    lab.fingerprint_set("$.schema", "0099")
    before = lab.sql("SELECT * FROM steps"), lab.sql("SELECT id, reason FROM run_versions")
    approvals = lab.sql("SELECT count(*) FROM approvals")
    r = lab.da("resume", "r", "--quiet", "--accept-changes")
    assert r.code == 2, r.stderr
    assert _errors(r) == 1 and "store schema" in r.stderr
    assert (
        lab.sql("SELECT * FROM steps"),
        lab.sql("SELECT id, reason FROM run_versions"),
    ) == before
    assert lab.sql("SELECT count(*) FROM approvals") == approvals
    assert lab.status()[0] == "running"  # as the crash left it


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_an_open_call_to_a_removed_tool_is_refused(lab: Lab) -> None:
    lab.plugin(effect="EXEC")  # an exec call leaves its intent row when the crash hits
    lab.start_and_crash(shell="allow")
    assert lab.sql("SELECT state FROM steps WHERE tool_name = 'probe'") == [("started",)]
    lab.plugin(present=False)
    r = lab.da("resume", "r", "--quiet", "--accept-changes")
    assert r.code == 2, r.stderr
    assert "tool probe" in r.stderr and _errors(r) == 1
    assert lab.reasons() == ["start"] and lab.version_steps() == []


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_approve_is_consent_too(lab: Lab) -> None:
    lab.plugin()
    lab.start_and_crash()
    lab.plugin(present=False)
    assert lab.da("resume", "r", "--quiet").code == 5
    approved = lab.da("approve", "r", "--by", "ana")
    assert approved.code == 0, approved.stderr
    r = lab.da("resume", "r", "--quiet")
    assert r.code == 0, r.stderr
    ((_, _, consent),) = lab.version_steps()
    assert json.loads(consent)["accepted_by"] == "ana"
    assert lab.sql("SELECT used_at IS NOT NULL FROM approvals") == [(1,)]


def test_the_agent_api_stops_for_consent_and_accepts_when_told(
    tmp_path: Path, env: dict[str, str]
) -> None:
    from durable_agent import Agent

    ws = tmp_path / "api-ws"
    ws.mkdir()
    (ws / "a.txt").write_text("hello\n")
    script = tmp_path / "api.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
                {"content": "done"},
            ]
        )
    )
    db = tmp_path / "api.db"
    agent = Agent(f"scripted:{script}", ws, f"sqlite:///{db}", env=env, shell="deny", max_steps=1)
    assert agent.start("t", run_id="a").stop_reason == "max_steps"
    with sqlite3.connect(db) as conn:  # as a release of another minor version recorded it
        conn.execute(
            "UPDATE run_versions SET fingerprint = json_set(fingerprint, '$.durable_agent', '0.0.1')"
        )
    stopped = agent.resume("a", max_steps=5)
    assert (stopped.status, stopped.stop_reason) == ("blocked", "changed_since_checkpoint")
    assert "durable-agent: 0.0.1" in (stopped.error or "")
    done = agent.resume("a", accept_changes=True)
    assert done.status == "completed", done.error
    with sqlite3.connect(db) as conn:
        reasons = [r for (r,) in conn.execute("SELECT reason FROM run_versions ORDER BY id")]
        (by,) = conn.execute(
            "SELECT json_extract(input, '$.accepted_by') FROM steps WHERE kind = 'version'"
        ).fetchone()
    assert reasons == ["start", "accepted"] and "Agent.resume" in by


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_the_web_view_shows_what_changed_and_its_approve_continues(lab: Lab) -> None:
    pytest.importorskip("starlette", reason="the `ui` extra is not installed")
    from ui_support import client

    lab.plugin()
    lab.start_and_crash()
    lab.plugin(present=False)
    assert lab.da("resume", "r", "--quiet").code == 5
    c = client(f"sqlite:///{lab.db}")
    page = c.get("/runs/r").text
    assert "changed_since_checkpoint" in page and 'class="reason"' in page
    assert "[needs_consent] tool probe" in page and 'id="approve-button"' in page


@pytest.mark.slow  # real processes with a plugin on PYTHONPATH: a few seconds each
def test_a_damaged_version_row_does_not_make_the_run_unresumable(lab: Lab) -> None:
    lab.plugin()
    lab.start_and_crash()
    with sqlite3.connect(lab.db) as conn:
        conn.execute("""UPDATE run_versions SET fingerprint = '{"model": "x", "tools": 5}'""")
    r = lab.da("resume", "r")
    assert r.code == 0, r.stderr
    assert "unreadable" in r.stderr and lab.reasons() == ["start", "unreadable"]
