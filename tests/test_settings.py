"""Settings layers and the documented defaults."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from durable_agent.config.settings import Settings, load_settings
from durable_agent.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_default_toml_is_current_and_loads() -> None:
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_default_config.py"), "--check"]
    )
    assert check.returncode == 0
    data = tomllib.loads((ROOT / "config" / "default.toml").read_text())
    assert Settings(**data).model_dump(exclude={"workspace"}) == Settings().model_dump(
        exclude={"workspace"}
    )


def test_layers_defaults_config_env_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('max_steps = 7\nmodel = "from-config"\nmax_repeats = 9\n')
    env = {
        "DURABLE_AGENT_CONFIG": str(cfg),
        "DURABLE_AGENT_MODEL": "from-env",
        "HOME": str(tmp_path),
    }
    s = load_settings({"max_repeats": 2}, env)
    assert (s.max_steps, s.model, s.max_repeats) == (7, "from-env", 2)
    assert s.db and s.db.endswith("durable-agent/durable-agent.db")


def test_a_resume_learns_the_window_and_price_of_a_model_the_run_never_used(tmp_path: Path) -> None:
    # The recorded `models` table replaced the config file's whole: `resume --model bigger`
    # (what a run that cannot fit is told to do) never saw bigger's context_window.
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "[models.small]\ncontext_window = 9000\n[models.bigger]\ncontext_window = 200000\n"
        "[prices.bigger]\ninput_per_mtok = 2\noutput_per_mtok = 8\n"
    )
    env = {"DURABLE_AGENT_CONFIG": str(cfg), "HOME": str(tmp_path)}
    recorded = {
        "model": "small",
        "models": {"small": {"context_window": 3000}},
        "prices": {"small": {"input_per_mtok": 1, "output_per_mtok": 1}},
    }
    s = load_settings({"model": "bigger"}, env, base=recorded)
    assert s.models["bigger"].context_window == 200_000 and s.prices["bigger"].output_per_mtok == 8
    assert s.models["small"].context_window == 3000  # the run's own entry stays as recorded
    assert set(s.prices) == {"small", "bigger"}


def test_a_resume_keeps_what_the_run_ran_with_whatever_the_file_says_now(tmp_path: Path) -> None:
    # The run used gpt-4o with the built-in window and no price; the file gained entries for
    # it, and for a model the run never named, since. Neither is this run's business: the
    # first would change its window and cost under it, the second showed as a change of
    # settings on every resume and was written into the run.
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[models."gpt-4o"]\ncontext_window = 4000\n[models.other]\ncontext_window = 9000\n'
        '[prices."gpt-4o"]\ninput_per_mtok = 500\noutput_per_mtok = 500\n'
    )
    env = {"DURABLE_AGENT_CONFIG": str(cfg), "HOME": str(tmp_path)}
    recorded = {"model": "gpt-4o", "models": {}, "prices": {}}
    for flags in ({}, {"model": "gpt-4o"}):
        s = load_settings(flags, env, base=recorded)
        assert (s.models, s.prices) == ({}, {}), flags


def test_api_key_is_never_in_the_recorded_settings() -> None:
    s = load_settings({}, {"OPENAI_API_KEY": "sk-secret-value-123", "HOME": "/tmp"})
    assert s.api_key is not None and "sk-secret" not in repr(s)
    assert "sk-secret" not in str(s.redacted_dict())


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("max_steps = 'x'", "max_steps"),
        ("nonsense = 1", "nonsense"),
        ("not toml", "cannot read config"),
        ("lease_seconds = 1e12", "lease_seconds"),
    ],
)  # past datetime's range
def test_bad_config_is_a_clear_error(tmp_path: Path, content: str, needle: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(content)
    with pytest.raises(ConfigError, match=needle):
        load_settings({}, {"DURABLE_AGENT_CONFIG": str(cfg), "HOME": str(tmp_path)})


def test_no_password_is_in_the_recorded_settings() -> None:
    s = Settings(db="postgresql://u:secret@h/d", base_url="http://u:pw@host/v1")
    recorded = s.redacted_dict()
    text = str({k: v for k, v in recorded.items() if k != "shell_allowlist"})  # it has `pwd`
    assert "secret" not in text and "pw" not in text
    assert "db" not in recorded  # resume and workers bring their own store URL
    assert recorded["base_url"] == "http://u:***@host/v1"
    plain = Settings(base_url="http://127.0.0.1:8080/v1").redacted_dict()
    assert plain["base_url"] == "http://127.0.0.1:8080/v1"


def test_recorded_settings_leave_out_what_was_never_stored_in_full() -> None:
    from durable_agent.config.settings import recorded_settings

    stored = Settings(
        db="postgresql://u:secret@h/d", base_url="http://u:pw@host/v1"
    ).redacted_dict()
    base = recorded_settings(stored)
    assert "db" not in base and "base_url" not in base  # the env or flags supply them again
    assert (
        recorded_settings({"base_url": "http://localhost:11434/v1"})["base_url"]
        == "http://localhost:11434/v1"
    )


def test_build_runner_leaves_the_callers_settings_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner gets a copy with the workspace resolved and the sandbox found; the caller's
    Settings (an API user's, a worker's) keep what was given."""
    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.runs import Store
    from durable_agent.wiring import build_runner

    (tmp_path / "ws").mkdir()
    monkeypatch.chdir(tmp_path)
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    settings = load_settings(
        {"workspace": "ws", "model": "demo", "db": f"sqlite:///{tmp_path / 's.db'}"}, env
    )
    before = settings.redacted_dict()
    engine = open_store_engine(str(settings.db))
    try:
        runner = build_runner(settings, env=env, store=Store(engine))
    finally:
        engine.dispose()
    assert runner.settings.workspace == (tmp_path / "ws").resolve()
    assert "sandbox_mechanism" in runner.settings.redacted_dict()
    assert settings.workspace == Path("ws") and settings.redacted_dict() == before
    assert "sandbox_mechanism" not in before


def test_a_relative_script_path_is_recorded_as_written_and_read_from_the_workspace(
    cli, env: dict[str, str], tmp_path: Path
) -> None:  # noqa: ANN001
    import sqlite3

    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    (here / "s.json").write_text(
        '[{"tool_calls": [{"name": "list_files", "arguments": {}}]}, {"content": "done"}]'
    )
    first = cli(
        "start", "t", "--model", "scripted:s.json", "--max-steps", "1", "--run-id", "rel", cwd=here
    )
    assert first.code == 3, first.stderr
    with sqlite3.connect(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///")) as conn:
        recorded = conn.execute(
            "SELECT model, json_extract(settings, '$.model') FROM runs WHERE id = 'rel'"
        ).fetchone()
    assert recorded == ("scripted:s.json", "scripted:s.json")  # as written (docs/models.md)
    resumed = cli("resume", "rel", "--max-steps", "5", cwd=elsewhere)  # read from the workspace
    assert resumed.code == 0, resumed.stderr
    # Relative to the run's workspace, not to where the command runs, at `start` too.
    other = cli("start", "t", "--model", "scripted:s.json", "--workspace", str(elsewhere), cwd=here)
    assert other.code == 2
    assert f"script file not found: {elsewhere / 's.json'}" in other.stderr
    assert "read from the run's workspace" in other.stderr


def test_every_number_setting_refuses_true_and_false_and_only_those_are_listed() -> None:
    from pydantic import ValidationError

    from durable_agent.config.settings import NUMBER_FIELDS

    numbers = {
        name
        for name, field in Settings.model_fields.items()
        if field.annotation in (int, float, int | None, float | None)
    }
    assert set(NUMBER_FIELDS) == numbers and len(NUMBER_FIELDS) == len(numbers)
    for name in NUMBER_FIELDS:
        with pytest.raises(ValidationError, match="must be a number, not true or false"):
            Settings(**{name: True})


def test_the_tables_a_config_gives_are_validated_and_recorded_as_their_models() -> None:
    """rules, hooks, MCP servers, prices, models, notify and otel are validated by their
    models' validators, built only when a value is given (settings._WhenGiven): their errors
    name the entry and field, and the recorded settings hold what the models dump."""
    cfg = {
        "rules": [{"decision": "deny", "tool": "write_file", "reason": "no"}],
        "hooks": [{"event": "stop", "command": "true"}],
        "mcp_servers": {"t": {"command": "srv", "startup_timeout_sec": 5}},
        "prices": {"m": {"input_per_mtok": 1, "output_per_mtok": 2}},
        "models": {"m": {"context_window": 4096}},
        "notify": [{"url": "https://example.com/hook"}],
        "otel": {"enabled": True},
    }
    s = Settings(**cfg)  # type: ignore[arg-type]
    assert s.rules[0].decision == "deny" and s.hooks[0].event == "stop"
    assert s.mcp_servers["t"].startup_timeout_s == 5  # the model's own before-validator
    assert s.price("m") is not None and s.models["m"].context_window == 4096
    assert s.notify[0].events[0] == "blocked" and s.otel.enabled
    recorded = s.redacted_dict()
    assert recorded["rules"][0]["decision"] == "deny" and recorded["hooks"][0]["timeout_s"] == 60.0
    assert recorded["mcp_servers"]["t"]["command"] == "srv" and "otel" not in recorded
    assert Settings(**recorded).rules == s.rules  # a resume rebuilds the same
    s.rules = [{"decision": "ask", "tool": "*"}]  # type: ignore[list-item]  (validate_assignment)
    assert s.rules[0].decision == "ask"
    bad = {
        "rules": (
            [{"decision": "maybe"}],
            "rules.0.decision: Input should be 'allow', 'ask' or 'deny'",
        ),
        "hooks": ([{"event": "stop"}], "hooks.0.command: Field required"),
        "mcp_servers": ({"t": {"args": []}}, "mcp_servers.t: give either `command`"),
        "prices": ({"m": {"input_per_mtok": -1, "output_per_mtok": 1}}, "prices.m.input_per_mtok"),
        "notify": ([{"url": "ftp://x"}], "notify.0: a [[notify]] url must be http://"),
        "otel": ({"enabled": True, "x": 1}, "otel.x: Extra inputs are not permitted"),
    }
    for name, (value, needle) in bad.items():
        with pytest.raises(ConfigError) as caught:
            load_settings({name: value}, {"HOME": "/nonexistent"})
        assert needle in str(caught.value), (name, str(caught.value))


def test_a_credential_value_in_a_setting_is_recorded_by_name_and_resupplied_on_resume(
    tmp_path: Path,
) -> None:
    """The recorded settings name a credential (`[REDACTED:NAME]`), never hold its value;
    a resume takes such a setting from the layers again (as a masked base_url), never
    runs the marker."""
    from durable_agent.config.mcp_servers import parse_cli_server
    from durable_agent.config.settings import recorded_settings

    token, key = "tok-0123456789abcdef", "sk-config-key-0123456789"
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'api_key = "{key}"\nverify = "check {token}"\n'
        f'[mcp_servers.a]\ncommand = "srv-a"\nargs = ["--token", "{token}"]\n'
    )
    env = {"DURABLE_AGENT_CONFIG": str(cfg), "HOME": str(tmp_path), "GH_TOKEN": token}
    name, spec = parse_cli_server(f"c=srv-c --key {key}")
    flags = {"base_url": f"http://h/v1?k={key}", "mcp_servers": {name: spec}}
    settings = load_settings(flags, env)
    recorded = settings.redacted_dict()
    text = json.dumps(recorded)
    assert token not in text and key not in text
    assert recorded["verify"] == "check [REDACTED:GH_TOKEN]"
    assert recorded["mcp_servers"]["a"]["args"] == ["--token", "[REDACTED:GH_TOKEN]"]
    assert recorded["base_url"] == "http://h/v1?k=[REDACTED:api_key]"
    again = load_settings({}, env, base=recorded_settings(recorded))
    assert "[REDACTED" not in json.dumps(again.model_dump(mode="json"))
    assert again.verify == f"check {token}"  # from the config again
    assert again.mcp_servers["a"].args == ["--token", token]
    assert "c" not in again.mcp_servers  # given by a flag: the resume's flags give it again
    assert again.base_url is None
