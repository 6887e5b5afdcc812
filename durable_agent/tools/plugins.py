"""Tools from outside the package: installed plugins and import paths named in the config.

A plugin is a distribution with an entry point in the group `durable_agent.tools`; the
config names others as `tools = ["package.module:Attr"]`. Either may point to a Tool
object, a Tool class or any zero-argument factory returning a Tool.
"""

from __future__ import annotations

import importlib
import re
from importlib import metadata
from typing import Any, cast

from msgspec import Struct

from durable_agent.errors import ConfigError
from durable_agent.status import EffectClass
from durable_agent.tools.base import Tool, protocol_problem

ENTRY_POINT_GROUP = "durable_agent.tools"


class Loaded(Struct, frozen=True):
    tool: Tool
    source: str  # "plugin DIST" or "config MODULE:ATTR"


def entry_points() -> list[metadata.EntryPoint]:
    """`metadata.entry_points(group=ENTRY_POINT_GROUP)`, parsing only the entry_points.txt of
    the distributions that name the group: the standard library parses every installed
    distribution's (1.5% of a one-step start, measured). The same distributions count: the
    first one of a name on sys.path, as the standard library dedups them; the names are
    worked out only when one may name the group (a third of the search, with no plugin)."""
    dists = list(metadata.distributions())
    may = [_may_name_group(dist) for dist in dists]
    if not any(may):
        return []
    found, seen = [], set()
    for dist, named in zip(dists, may, strict=True):
        name = getattr(dist, "_normalized_name", None) or dist.name  # the standard library's key
        if name in seen:
            continue
        seen.add(name)
        if named:
            found += [ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP]
    return found


def _may_name_group(dist: metadata.Distribution) -> bool:
    """False for files that never name the group; any other kind, a finder's own, may give
    its entry points otherwise: always asked."""
    if not isinstance(dist, metadata.PathDistribution):
        return True
    try:
        text = dist.read_text("entry_points.txt")
    except (OSError, UnicodeError):  # unreadable for every reader, ours or not: passed over
        return False
    return text is not None and ENTRY_POINT_GROUP in text  # a superset: the parse decides


def load_plugins() -> list[Loaded]:
    loaded = []
    for ep in entry_points():
        dist = ep.dist.name if ep.dist is not None else ep.value
        where = f"plugin {dist} (entry point {ep.name} = {ep.value})"
        try:
            target = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is a configuration error
            raise ConfigError(f"cannot load tool {where}: {type(exc).__name__}: {exc}") from None
        loaded.append(Loaded(as_tool(target, where), f"plugin {dist}"))
    return loaded


def load_named(specs: list[str]) -> list[Loaded]:
    loaded = []
    for spec in specs:
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise ConfigError(f"tools: {spec!r} is not `package.module:Name`")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                target = getattr(target, part)
        except Exception as exc:  # noqa: BLE001 - ImportError, AttributeError, errors at import
            raise ConfigError(
                f"tools: cannot import {spec!r}: {type(exc).__name__}: {exc}"
            ) from None
        loaded.append(Loaded(as_tool(target, f"tools entry {spec!r}"), f"config {spec}"))
    return loaded


def as_tool(target: Any, where: str) -> Tool:
    """The Tool behind `target`: itself, or what calling it (a class, a factory) returns."""
    candidate = target
    if isinstance(target, type) or (callable(target) and not _looks_like_tool(target)):
        try:
            candidate = target()
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(
                f"{where}: calling it to make the tool failed: {type(exc).__name__}: {exc}"
            ) from None
    missing = [
        a
        for a in ("name", "description", "args_model", "effect", "run")
        if not hasattr(candidate, a)
    ]
    if missing:
        raise ConfigError(f"{where} is not a tool: it has no {', '.join(missing)}")
    try:
        EffectClass(candidate.effect)
    except ValueError:
        raise ConfigError(
            f"{where}: effect {candidate.effect!r} is not read, write or exec"
        ) from None
    return cast(Tool, candidate)


TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what OpenAI-compatible endpoints take


def check_tool(tool: Any, where: str) -> None:
    """ConfigError, in one line, for a tool the loop could not offer or record: a name an
    endpoint refuses, a description that is not text, arguments without a JSON schema, an
    effect that is not an EffectClass, a write that neither plans nor says it is idempotent
    (the docs' contract, docs/tools.md; the Protocols in tools/base.py)."""
    from pydantic import BaseModel

    name = getattr(tool, "name", None)
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: the tool's name {name!r} is not 1 to 64 letters, digits, _ or -"
        )
    if not isinstance(getattr(tool, "description", None), str):
        raise ConfigError(f"{where}: the tool {name!r} has no description text")
    if not isinstance(getattr(tool, "effect", None), EffectClass):
        raise ConfigError(
            f"{where}: the tool {name!r} has effect {getattr(tool, 'effect', None)!r}, "
            "not EffectClass.READ, WRITE or EXEC"
        )
    model = getattr(tool, "args_model", None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ConfigError(
            f"{where}: the tool {name!r} has args_model {model!r}, not a pydantic model"
        )
    try:
        model.model_json_schema()
    except Exception as exc:  # noqa: BLE001 - whatever pydantic raises, said in one line
        raise ConfigError(
            f"{where}: the tool {name!r} has arguments without a JSON schema: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    if not callable(getattr(tool, "run", None)):
        raise ConfigError(f"{where}: the tool {name!r} has no run method")
    problem = protocol_problem(tool)
    if problem is not None:
        raise ConfigError(f"{where}: the tool {name!r} {problem}")


def _looks_like_tool(obj: Any) -> bool:
    return all(hasattr(obj, a) for a in ("name", "args_model", "effect", "run"))
