"""The one place concrete classes are chosen: settings in, a ready Runner out."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from durable_agent.config.settings import Settings
from durable_agent.errors import ConfigError
from durable_agent.loop.runner import Runner
from durable_agent.models import ModelClient
from durable_agent.observer import Observer
from durable_agent.redact import Redactor
from durable_agent.store.runs import Store, open_store, store_policy
from durable_agent.tool_sources import ToolSet
from durable_agent.tools.base import Tool
from durable_agent.tools.os_sandbox import Mechanism, resolve_sandbox, store_refusal


def build_model(settings: Settings, stream_memo: Path | None = None) -> ModelClient:
    """`stream_memo`: the file remembering endpoints that do not stream (models/openai_chat.py)."""
    model = _endpoint_or_script(settings, stream_memo)
    if settings.tool_protocol == "text":
        from durable_agent.models.text_protocol import TextProtocolModel

        return TextProtocolModel(model)
    return model


def _endpoint_or_script(settings: Settings, stream_memo: Path | None = None) -> ModelClient:
    name = settings.model
    if not name:
        raise ConfigError(
            "no model configured: pass --model NAME (or set DURABLE_AGENT_MODEL) and set "
            "OPENAI_API_KEY for the OpenAI API, or --base-url for a local server; "
            "`--model demo` runs offline"
        )
    if name == "demo":
        from durable_agent.models.scripted import ScriptedModel, demo_script

        return ScriptedModel(demo_script(), "demo")
    if name.startswith("scripted:"):
        from durable_agent.models.scripted import ScriptedModel, load_script

        path = Path(name.removeprefix("scripted:")).expanduser()
        if not path.is_absolute():
            # The name is recorded as written: a relative path is read from the run's workspace
            # (recorded absolute), wherever `resume`, a worker or `fork` runs, and a worker's
            # --workspace-root rebuilds it with the files (docs/models.md).
            path = settings.workspace.expanduser().resolve() / path
            if not path.exists():
                raise ConfigError(
                    f"script file not found: {path} (a relative scripted: path is read from "
                    "the run's workspace; give an absolute path for a file elsewhere)"
                )
        return ScriptedModel(load_script(path), name)
    key = settings.api_key.get_secret_value() if settings.api_key else None
    if not key:
        if not settings.base_url:
            raise ConfigError(
                f"model {name!r} needs an API key: set OPENAI_API_KEY (or pass --base-url for a "
                "local OpenAI-compatible server that needs none)"
            )
        key = (
            "not-needed"  # local servers (Ollama, vLLM, llama.cpp) ignore it, the client wants one
        )
    from durable_agent.models.openai_chat import OpenAIChatModel

    return OpenAIChatModel(
        name,
        api_key=key,
        base_url=settings.base_url,
        read_timeout=settings.request_timeout_s,
        connect_timeout=settings.connect_timeout_s,
        temperature=settings.temperature,
        api_type=settings.api_type,
        api_version=settings.api_version,
        stream=settings.stream,
        stream_memo=stream_memo,
    )


def retry_policy(settings: Settings):  # type: ignore[no-untyped-def]
    from durable_agent.models.retry import RetryPolicy

    return RetryPolicy.from_settings(settings)


def build_runner(
    settings: Settings,
    *,
    env: Mapping[str, str],
    store: Store | None = None,
    observer: Observer | None = None,
    cancel: threading.Event | None = None,
    extra_tools: Sequence[Tool] = (),
) -> Runner:
    """A Runner for `settings` (not changed: the resolved workspace goes into a copy)."""
    workspace = settings.workspace.expanduser().resolve()
    if not workspace.is_dir():
        raise ConfigError(f"workspace is not a directory: {settings.workspace}")
    settings = settings.model_copy(update={"workspace": workspace})
    sandbox = resolve_sandbox(settings.sandbox, settings.network, env)
    stdio_servers = any(s.command for s in settings.mcp_servers.values())
    if settings.shell != "deny" or settings.verify or stdio_servers:
        from durable_agent.config.layers import default_db_url

        # A worker gives the run back for one whose host can contain its commands.
        why = (
            sandbox.refusal()
            if sandbox.mechanism is Mechanism.NONE
            else store_refusal(sandbox, settings.db or default_db_url(env), workspace)
        )
        if why:
            raise ConfigError(why)
    settings.set_sandbox_mechanism(sandbox.mechanism.value)
    settings = _without_the_store(settings, env)
    # The key may come from the config file, not only from a credential-named variable.
    key = {"api_key": settings.api_key.get_secret_value()} if settings.api_key else {}
    redactor = Redactor.from_env(env, shapes=settings.redact_observations, extra=key)
    tool_set = build_tool_set(settings, env, extra_tools)
    return Runner(
        store=store or open_store(settings),
        settings=settings,
        model=build_model(settings, stream_memo(env)),
        tools=dict(tool_set.local),
        env=env,
        redactor=redactor,
        observer=observer,
        cancel=cancel,
        retry_policy=retry_policy(settings),
        store_policy=store_policy(settings),
        tool_source=tool_set,
        model_for=lambda child: build_model(child, stream_memo(env)),
    )


def _without_the_store(settings: Settings, env: Mapping[str, str]) -> Settings:
    """A SQLite store kept inside the workspace (allowed unless commands may write there) is
    left out of its snapshots: its own writes are not the run's changes to the files, and
    would read as drift on every resume."""
    from durable_agent.config.layers import default_db_url, store_files

    root = str(settings.workspace)
    mine = []
    for i, path in enumerate(store_files(settings.db or default_db_url(env))):
        if not path.startswith(os.path.join(root, "")):
            return settings
        rel = "".join(
            "\\" + c if c in "\\[]*?!# " else c  # gitignore syntax: these are literal
            for c in os.path.relpath(path, root)
        )
        mine.append(f"/{rel}/" if i == 4 else f"/{rel}")  # the last one is the MCP log folder
    if not mine:
        return settings
    return settings.model_copy(
        update={"exclude": [*settings.exclude, *(p for p in mine if p not in settings.exclude)]}
    )


def build_tool_set(
    settings: Settings, env: Mapping[str, str], extra_tools: Sequence[Tool] = ()
) -> ToolSet:
    return ToolSet(settings, env, extra=extra_tools, log_dir=log_dir(settings, env))


def stream_memo(env: Mapping[str, str]) -> Path:
    """The file of endpoints that do not stream: in the data directory, whatever the store
    (one next to a store kept in the workspace would be a change to the files)."""
    from durable_agent.config.layers import default_db_url, store_files

    return Path(store_files(default_db_url(env))[0]).parent / "no-stream.json"


def log_dir(settings: Settings, env: Mapping[str, str]) -> Path:
    """Where MCP servers' stderr is kept: next to a SQLite store, else in the data directory."""
    from durable_agent.config.layers import default_db_url, store_files

    files = store_files(settings.db or default_db_url(env)) or store_files(default_db_url(env))
    return Path(files[4])
