"""Tool plugins: an installed distribution's entry point (`durable_agent.tools`) and the
config's `tools = ["module:Name"]`, seen by `durable-agent tools` and used by a run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

PLUGIN = """
from typing import Any, ClassVar

from pydantic import BaseModel

from durable_agent.status import EffectClass
from durable_agent.tools.base import ToolContext, ToolResult


class Args(BaseModel):
    text: str


class Shout:
    name: ClassVar[str] = "shout"
    description: ClassVar[str] = "Upper-case a text."
    args_model: ClassVar[type[BaseModel]] = Args
    effect: ClassVar[EffectClass] = EffectClass.READ

    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        return ToolResult(output=args.text.upper() + " (run " + ctx.run_id + ")")


class Whisper(Shout):
    name: ClassVar[str] = "whisper"
    description: ClassVar[str] = "Lower-case a text."

    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        return ToolResult(output=args.text.lower())


def make() -> Shout:
    return Shout()


NOT_A_TOOL = 42
"""


@pytest.fixture
def plugin_env(tmp_path: Path) -> dict[str, str]:
    """An importable distribution `da-demo-plugin` with an entry point, as pip would leave it."""
    site = tmp_path / "site"
    (site / "da_demo_plugin").mkdir(parents=True)
    (site / "da_demo_plugin" / "__init__.py").write_text(PLUGIN)
    info = site / "da_demo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: da-demo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[durable_agent.tools]\nshout = da_demo_plugin:make\n")
    return {"PYTHONPATH": str(site)}


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_a_plugin_tool_is_listed_and_used_in_a_run(
    cli: Callable[..., Any],
    plugin_env: dict[str, str],
    write_script: Callable[..., str],
    tmp_path: Path,
    sql: Callable[..., list[Any]],
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('tools = ["da_demo_plugin:Whisper"]\n')
    extra_env = {**plugin_env, "DURABLE_AGENT_CONFIG": str(config)}
    r = cli("tools", "--json", extra_env=extra_env)
    assert r.code == 0, r.stderr
    tools = {t["name"]: t for t in r.json()}
    assert tools["shout"] == {
        "name": "shout",
        "source": "plugin da-demo-plugin",
        "effect": "read",
        "description": "Upper-case a text.",
    }
    assert tools["whisper"]["source"] == "config da_demo_plugin:Whisper"
    table = cli("tools", "--shell", "deny", extra_env=extra_env).stdout.splitlines()
    assert table[0].split() == ["NAME", "SOURCE", "EFFECT", "DESCRIPTION"]
    assert ["shout", "plugin", "da-demo-plugin", "read", "Upper-case", "a", "text."] in [
        r.split() for r in table
    ]
    assert not any(r.startswith("run_command") for r in table)  # --shell deny: not offered
    model = write_script(
        [
            {
                "tool_calls": [
                    {"name": "shout", "arguments": {"text": "hi"}},
                    {"name": "whisper", "arguments": {"text": "HO"}},
                ]
            },
            {"content": "done"},
        ]
    )
    r = cli(
        "start",
        "use the plugin",
        "--model",
        model,
        "--json",
        "--run-id",
        "plug",
        extra_env=extra_env,
    )
    assert r.code == 0, r.stderr
    rows = sql(
        "SELECT tool_name, effect, json_extract(output, '$.result') FROM steps "
        "WHERE kind = 'tool' ORDER BY seq"
    )
    assert rows == [("shout", "read", "HI (run plug)"), ("whisper", "read", "ho")]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("da_demo_plugin:NOT_A_TOOL", "is not a tool"),
        ("da_demo_plugin:Missing", "cannot import 'da_demo_plugin:Missing'"),
        ("no_such_module_here:X", "cannot import"),
        ("da_demo_plugin", "is not `package.module:Name`"),
        ("da_demo_plugin:Shout", "two tools are named 'shout'"),
    ],
)
@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_a_bad_tool_entry_is_one_line(
    cli: Callable[..., Any], plugin_env: dict[str, str], tmp_path: Path, spec: str, message: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f"tools = [{json.dumps(spec)}]\n")
    r = cli("tools", extra_env={**plugin_env, "DURABLE_AGENT_CONFIG": str(config)})
    assert r.code == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_entry_points_found_are_the_standard_librarys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # plugins.entry_points reads only the distributions that name the group: the same entry
    # points as metadata.entry_points(group=...), whatever the header's spaces, with a
    # distribution shadowed by one of the same name earlier on sys.path, and others' groups.
    from importlib import metadata

    from durable_agent.tools.plugins import ENTRY_POINT_GROUP, entry_points

    def dist(site: str, name: str, text: str) -> None:
        info = tmp_path / site / f"{name.replace('-', '_')}-0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(text)

    dist("first", "da-shadowed", "[durable_agent.tools]\nwins = a:b\n")
    dist("second", "da-shadowed", "[durable_agent.tools]\nloses = a:c\n")
    dist(
        "second",
        "da-spaced",
        "[console_scripts]\nx = a:d\n\n[ durable_agent.tools ]\nspaced = a:e\n",
    )
    dist(
        "second",
        "da-other",
        "[other.group]\nnot_ours = a:f\n# durable_agent.tools named in a comment\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path / "second"))
    monkeypatch.syspath_prepend(str(tmp_path / "first"))
    ours = [(ep.name, ep.value, ep.dist.name if ep.dist else None) for ep in entry_points()]
    theirs = [
        (ep.name, ep.value, ep.dist.name if ep.dist else None)
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)
    ]
    assert sorted(ours) == sorted(theirs)
    assert "wins" in {name for name, _, _ in ours} and "loses" not in {name for name, _, _ in ours}


def test_plugins_served_by_a_finders_own_distribution_are_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A distribution that is no folder of files gives its entry points its own way (no
    # entry_points.txt to read first): they are asked for as the standard library asks.
    import sys
    from importlib import metadata
    from importlib.metadata import Distribution, DistributionFinder, EntryPoint, EntryPoints

    from durable_agent.tools.plugins import ENTRY_POINT_GROUP, entry_points

    class Dist(Distribution):
        def read_text(self, filename: str) -> str | None:
            return (
                "Metadata-Version: 2.1\nName: custom-tools\nVersion: 1\n"
                if filename == "METADATA"
                else None
            )

        def locate_file(self, path: Any) -> Any:
            return path

        @property
        def entry_points(self) -> EntryPoints:
            return EntryPoints(
                [EntryPoint("shout", "my_tools:Shout", ENTRY_POINT_GROUP)._for(self)]
            )

    class Finder(DistributionFinder):
        def find_spec(self, *args: Any, **kwargs: Any) -> None:
            return None

        def find_distributions(self, context: Any = None) -> Any:
            if context is None or context.name in (None, "custom-tools", "custom_tools"):
                yield Dist()

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder()])
    theirs = [ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)]
    assert theirs == ["shout"]
    assert [ep.name for ep in entry_points()] == theirs


def test_a_python_write_tool_whose_plan_is_its_own_object_runs_and_is_recorded(
    tmp_path: Path,
) -> None:
    # The WriteTool protocol reads a plan's path and hashes: any object that has them will do.
    import dataclasses
    import hashlib

    from pydantic import BaseModel

    from durable_agent import Agent, EffectClass, ToolResult

    @dataclasses.dataclass(frozen=True)
    class Plan:
        path: str
        before_sha: str | None
        after_sha: str

    class Args(BaseModel):
        path: str

    class Touch:
        name = "touch"
        description = "write x into a file"
        args_model = Args
        effect = EffectClass.WRITE

        def plan(self, args: Args, ctx: Any) -> Plan:
            return Plan(args.path, None, hashlib.sha256(b"x").hexdigest())

        def current_sha(self, plan: Any, ctx: Any) -> str | None:
            p = ctx.workspace / plan.path
            return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None

        def run(self, args: Args, ctx: Any) -> Any:
            (ctx.workspace / args.path).write_text("x")
            return ToolResult(output="ok")

    ws = tmp_path / "ws"
    ws.mkdir()
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "touch", "arguments": {"path": "f.txt"}}]},
                {"content": "done"},
            ]
        )
    )
    db = tmp_path / "store.db"
    outcome = Agent(
        model=f"scripted:{script}",
        workspace=ws,
        db=f"sqlite:///{db}",
        tools=[Touch()],
        shell="deny",
        sandbox="off",
    ).start("go")
    assert outcome.status == "completed", outcome.error
    assert (ws / "f.txt").read_text() == "x"
    import sqlite3

    with sqlite3.connect(db) as conn:
        (plan,) = conn.execute(
            "SELECT json_extract(input, '$.plan') FROM steps WHERE tool_name = 'touch'"
        ).fetchone()
    assert json.loads(plan) == {
        "path": "f.txt",
        "before_sha": None,
        "after_sha": hashlib.sha256(b"x").hexdigest(),
    }


OWN_PLAN_TOOL = """
import dataclasses, hashlib
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from durable_agent.status import EffectClass
from durable_agent.tools.base import ToolResult

LOG = Path(__file__).with_name("runs.log")


@dataclasses.dataclass(frozen=True)
class Plan:  # not the harness's WritePlan: the protocol reads only these three fields
    path: str
    before_sha: str | None
    after_sha: str


class Args(BaseModel):
    path: str


class Touch:
    name: ClassVar[str] = "touch"
    description: ClassVar[str] = "Write x into a file."
    args_model: ClassVar[Any] = Args
    effect: ClassVar[EffectClass] = EffectClass.WRITE

    def plan(self, args: Args, ctx: Any) -> Plan:
        return Plan(args.path, None, hashlib.sha256(b"x").hexdigest())

    def current_sha(self, plan: Any, ctx: Any) -> str | None:
        p = ctx.workspace / plan.path
        return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None

    def run(self, args: Args, ctx: Any) -> ToolResult:
        with LOG.open("a") as log:
            log.write(args.path + "\\n")
        (ctx.workspace / args.path).write_text("x")
        return ToolResult(output="ok")
"""


@pytest.mark.slow  # many CLI processes: the full lane only
def test_a_plugin_write_with_its_own_plan_runs_once_whatever_checkpoint_the_process_is_killed_at(
    cli: Callable[..., Any], write_script: Callable[..., str], tmp_path: Path, workspace: Path
) -> None:
    # SIGKILL at each checkpoint boundary of a run whose one write is a plugin's with a plan
    # of its own type, then resume: the write lands once, never twice, and the run completes.
    site = tmp_path / "own_site"
    site.mkdir()
    (site / "own_plan_tool.py").write_text(OWN_PLAN_TOOL)
    config = tmp_path / "own.toml"
    config.write_text('tools = ["own_plan_tool:Touch"]\n')
    extra = {"PYTHONPATH": str(site), "DURABLE_AGENT_CONFIG": str(config)}
    for k in range(1, 7):
        name = f"f{k}.txt"
        model = write_script(
            [{"tool_calls": [{"name": "touch", "arguments": {"path": name}}]}, {"content": "done"}]
        )
        first = cli(
            "start",
            "touch",
            "--model",
            model,
            "--shell",
            "deny",
            "--sandbox",
            "off",
            "--run-id",
            f"own-{k}",
            extra_env={**extra, "DURABLE_AGENT_CRASH_AFTER": str(k)},
        )
        assert first.code == -9, (k, first.code, first.stderr)
        done = cli("resume", f"own-{k}", extra_env=extra)
        assert done.code == 0, (k, done.stderr)
        assert (workspace / name).read_text() == "x"
        runs = (site / "runs.log").read_text().splitlines() if (site / "runs.log").exists() else []
        assert runs.count(name) == 1, (k, runs)


def test_a_package_whose_entry_points_txt_is_not_utf8_breaks_no_command(
    cli: Callable[..., Any], write_script: Callable[..., str], tmp_path: Path
) -> None:
    # Any installed distribution's metadata is read when plugins are looked for (ours, and
    # pydantic's own search as it builds its first model): one such file, not UTF-8, made
    # every command that validates settings end in a UnicodeDecodeError traceback.
    site = tmp_path / "broken_site"
    info = site / "broken_pkg-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_bytes(b"[durable_agent.tools]\nx = y:z\n\xff\xfe\n")
    extra = {"PYTHONPATH": str(site)}
    r = cli("tools", "--json", extra_env=extra)
    assert r.code == 0, r.stderr
    assert "read_file" in {t["name"] for t in r.json()}
    r = cli("start", "t", "--model", write_script([{"content": "done"}]), "--json", extra_env=extra)
    assert r.code == 0, r.stderr
    assert r.json()["answer"] == "done"
