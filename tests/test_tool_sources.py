"""Pieces of the tool sources without servers: the effect class of an MCP tool from its
annotations, NAME__TOOL names, the MCP settings over the layers, the catalog in the store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_agent.config.mcp_servers import parse_cli_server
from durable_agent.config.settings import load_settings
from durable_agent.errors import ConfigError
from durable_agent.mcp.tools import effect_of, tool_name
from durable_agent.status import EffectClass

hint = st.sampled_from([True, False, None])


@given(read_only=hint, idempotent=hint, destructive=hint)
def test_effect_class_from_annotations(
    read_only: bool | None, idempotent: bool | None, destructive: bool | None
) -> None:
    annotations = {
        k: v
        for k, v in {
            "readOnlyHint": read_only,
            "idempotentHint": idempotent,
            "destructiveHint": destructive,
        }.items()
        if v is not None
    }
    effect, asks = effect_of(annotations, None)
    if read_only:
        assert (effect, asks) == (EffectClass.READ, False)
    elif idempotent and destructive is False:
        assert (effect, asks) == (EffectClass.WRITE, False)
    else:
        # Not known to be safe to repeat: never re-run alone; asks unless declared harmless.
        assert effect is EffectClass.EXEC and asks is (destructive is not False)
    assert effect_of(annotations, "read")[0] is EffectClass.READ  # the config's word wins


@given(
    server=st.from_regex(r"[A-Za-z0-9_-]{1,32}", fullmatch=True),
    remote=st.text(min_size=1, max_size=100),
)
def test_tool_names_are_valid_function_names(server: str, remote: str) -> None:
    name = tool_name(server, remote)
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name)
    # Taken already (another tool cleaned or cut to the same name): one of its own, still valid.
    other = tool_name(server, remote, taken={name})
    assert other != name and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", other)
    assert other == tool_name(server, remote, taken={name})  # the same on every listing


def test_cli_servers_add_to_the_config_and_resume_keeps_the_run_s(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[mcp_servers.a]\ncommand = "srv-a"\nenv = { API_TOKEN = "tok-secret-1", MODE = "x" }\n'
        '[mcp_servers.b]\nurl = "https://user:pw@example.com/mcp"\n'
    )
    env = {"DURABLE_AGENT_CONFIG": str(config), "HOME": str(tmp_path)}
    name, spec = parse_cli_server("c=srv-c --flag 'two words'")
    settings = load_settings({"mcp_servers": {name: spec}}, env)
    assert sorted(settings.mcp_servers) == ["a", "b", "c"]
    assert settings.mcp_servers["c"].args == ["--flag", "two words"]
    recorded = settings.redacted_dict()
    assert recorded["mcp_servers"]["a"]["env"] == {"API_TOKEN": "***", "MODE": "x"}
    assert recorded["mcp_servers"]["b"]["url"] == "https://user:***@example.com/mcp"
    # A resume: the run's servers (not a server added to the config since), with the
    # masked token taken from the config again.
    config.write_text(config.read_text() + '[mcp_servers.d]\ncommand = "srv-d"\n')
    again = load_settings({}, env, base={"mcp_servers": recorded["mcp_servers"]})
    assert sorted(again.mcp_servers) == ["a", "b", "c"]
    assert again.mcp_servers["a"].env == {"API_TOKEN": "tok-secret-1", "MODE": "x"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("noequals", "NAME=COMMAND"),
        ("x=", "NAME=COMMAND"),
        ("=cmd", "NAME=COMMAND"),
        ("x=cmd 'unclosed", "No closing quotation"),
    ],
)
def test_bad_mcp_flags_are_config_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_cli_server(spec)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[mcp_servers.a]\nargs = ["x"]\n', "either `command`"),
        ('[mcp_servers.a]\ncommand = "x"\nurl = "http://h/mcp"\n', "either `command`"),
        ('[mcp_servers."a__b"]\ncommand = "x"\n', "no '__'"),
        ('[mcp_servers.a]\ncommand = "x"\n[mcp_servers.a.tools.t]\neffect = "maybe"\n', "effect"),
    ],
)
def test_bad_server_config_is_one_config_error(tmp_path: Path, toml: str, message: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(toml)
    with pytest.raises(ConfigError, match=message):
        load_settings({}, {"DURABLE_AGENT_CONFIG": str(config), "HOME": str(tmp_path)})


def test_the_first_recorded_catalog_wins(store_url: str, tmp_path: Path) -> None:
    from durable_agent.messages import Message
    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.runs import Store

    store = Store(open_store_engine(store_url, durability="full"))
    store.create_run(
        "r1",
        task="t",
        workspace=str(tmp_path),
        model="m",
        settings={},
        first_messages=[Message("user", "t")],
    )
    assert store.tool_sources("r1") is None
    first = {"mcp_servers": {"a": {"tools": [{"name": "a__x", "effect": "read"}]}}}
    assert store.record_tool_sources("r1", first) == first
    assert store.record_tool_sources("r1", {"mcp_servers": {}}) == first
    assert store.tool_sources("r1") == first
