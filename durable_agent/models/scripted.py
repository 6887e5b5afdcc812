"""A model that replays a JSON script of turns: offline demos and end-to-end tests.

A script is a JSON list; turn i is answered on the i-th model call of the run:
  {"content": "final answer"}
  {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}
An "arguments" string is passed through raw (to script malformed JSON). An optional
"delay_s" makes the call take that long (to crash a run mid-call in tests).

A script for a run that delegates (docs/delegation.md) is a JSON object instead: each key a
run's task, its value that run's list of turns, and "*" the list of any other run (the
parent's): {"*": [...], "count the files": [...]}. A run is answered from the list of its
task (its first user message).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from durable_agent.errors import ConfigError
from durable_agent.messages import Message, ModelTurn, ToolCall, Usage
from durable_agent.tools.limits import read_capped

MAX_SCRIPT_BYTES = 64 * 1024 * 1024  # far above any real script; /dev/zero is not one


Script = list[dict[str, Any]]


def load_script(path: Path) -> Script | dict[str, Script]:
    try:
        with path.open("rb") as f:
            raw = read_capped(f, os.fstat(f.fileno()).st_size, MAX_SCRIPT_BYTES)
        if len(raw) > MAX_SCRIPT_BYTES:
            raise ConfigError(f"script file {path} is larger than {MAX_SCRIPT_BYTES >> 20} MiB")
        data = _parsed(raw)
    except FileNotFoundError:
        raise ConfigError(f"script file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read script file {path}: {exc}") from None
    except ValueError as exc:  # JSONDecodeError, or json's refusal of an int of 4,301 digits
        raise ConfigError(f"script file {path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ConfigError(f"script file {path} is nested too deeply to be a script") from None
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        return {
            str(task): validate_script(turns, f"{path} (task {task!r})")
            for task, turns in data.items()
        }
    return validate_script(data, str(path))


def _parsed(raw: bytes) -> Any:
    """The script's JSON. msgspec reads a long script three times faster than json (a
    10,000-turn script is read again at every resume); what it refuses (NaN, a lone
    surrogate, a number past a float's range, a broken file) json reads, or reports, as
    before."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # (a ValidationError is a DecodeError)
        return json.loads(raw.decode("utf-8"))


TURN_KEYS = frozenset({"content", "tool_calls", "delay_s"})
CALL_KEYS = frozenset({"name", "arguments"})


def validate_script(data: Any, where: str) -> list[dict[str, Any]]:
    """The script, checked turn by turn when it is loaded: a wrong shape is a one-line
    configuration error naming the turn (exit 2), never a model_error halfway through a run."""
    if not isinstance(data, list):
        raise ConfigError(f"script {where} must be a JSON list of turns, not {_kind(data)}")
    if not data:
        raise ConfigError(
            f'script {where} has no turns: give at least one, e.g. [{{"content": "done"}}]'
        )
    for i, turn in enumerate(data):
        problem = _turn_problem(turn)
        if problem is not None:
            raise ConfigError(
                f'script {where}: turn {i} {problem} (see docs/models.md, "Scripted models")'
            )
    return data


def _turn_problem(turn: Any) -> str | None:
    if not isinstance(turn, dict):
        return f"must be an object, not {_kind(turn)}"
    keys = turn.keys()
    if "tool_calls" not in turn and "content" not in turn:
        return 'needs "content" or "tool_calls"'
    if not keys <= TURN_KEYS:  # (a set comparison: a 10,000-turn script is checked at once)
        # a misspelt key would be ignored silently: the turn would not be what was meant
        unknown = sorted(keys - TURN_KEYS)
        return f'has an unknown key "{unknown[0]}" (a turn has "content", "tool_calls", "delay_s")'
    if turn.get("content") is not None and not isinstance(turn["content"], str):
        return f'has a "content" that is {_kind(turn["content"])}, not text'
    if "delay_s" in turn:
        delay = turn["delay_s"]
        if isinstance(delay, bool) or not isinstance(delay, (int, float)):
            return f'has a "delay_s" that is {_kind(delay)}, not a number of seconds'
        if not 0 <= delay < 86_400:  # NaN and Infinity fail too
            return f'has a "delay_s" of {delay}: give seconds from 0 to 86400'
    calls = turn.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list):
        return f'has "tool_calls" that is {_kind(calls)}, not a list'
    for j, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            return f'has a tool call ({j}) without a "name"'
        if not call.keys() <= CALL_KEYS:
            unknown = sorted(call.keys() - CALL_KEYS)
            return f'has a tool call ({j}) with an unknown key "{unknown[0]}" (a call has "name", "arguments")'
        if "arguments" in call and not isinstance(call["arguments"], (dict, str)):
            return f'has a tool call ({j}) whose "arguments" is {_kind(call["arguments"])}: give an object (or a string, sent raw)'
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def demo_script() -> list[dict[str, Any]]:
    text = resources.files("durable_agent.demo").joinpath("script.json").read_text(encoding="utf-8")
    return validate_script(json.loads(text), "demo")


class ScriptedModel:
    def __init__(self, turns: Script | dict[str, Script], name: str) -> None:
        self.turns: Script = turns if isinstance(turns, list) else []
        self.by_task = turns if isinstance(turns, dict) else {}
        self.name = name

    def complete(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], turn: int
    ) -> ModelTurn:
        turns = self.turns
        if self.by_task:  # the run's own list, by its task (its first user message)
            task = next((m.content or "" for m in messages if m.role == "user"), "")
            turns = self.by_task.get(task, self.by_task.get("*", []))
        return self._answer(turns, turn, messages)

    def _answer(self, turns: Script, turn: int, messages: Sequence[Message]) -> ModelTurn:
        if turn >= len(turns):
            count = f"{len(turns)} turn" + ("" if len(turns) == 1 else "s")
            return ModelTurn(
                content=f"The script is exhausted after {count}.",
                usage=Usage(prompt_tokens=10, completion_tokens=10),
            )
        spec = turns[turn]
        if spec.get("delay_s"):
            time.sleep(float(spec["delay_s"]))
        calls = []
        for i, call in enumerate(spec.get("tool_calls") or []):
            args = call.get("arguments", {})
            raw = args if isinstance(args, str) else json.dumps(args)
            calls.append(ToolCall(id=f"call_{turn}_{i}", name=call["name"], arguments=raw))
        content = spec.get("content")
        last = messages[-1].content or "" if messages else ""
        usage = Usage(
            prompt_tokens=20 + len(last) // 4,
            completion_tokens=5 + len(content or "") // 4 + 10 * len(calls),
        )
        return ModelTurn(content=content, tool_calls=tuple(calls), usage=usage)
