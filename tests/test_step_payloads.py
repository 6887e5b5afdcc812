"""Typed step payloads (store/payloads.py): every kind the loop writes decodes to its struct
and encodes back to the JSON it wrote; no stored value makes decoding raise, or `show` and
`export` fail; an interrupted write whose intent lost its plan asks instead of crashing."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compaction import read_script, write_files

from durable_agent.cli.parser import main
from durable_agent.status import StepKind
from durable_agent.store import payloads
from durable_agent.store.engine import open_store_engine
from durable_agent.store.payloads import (
    CompactInput,
    CompactOutput,
    ModelInput,
    ModelOutput,
    ToolInput,
    ToolOutput,
    Unknown,
    VerifyInput,
    VerifyOutput,
    decode_input,
    decode_output,
)
from durable_agent.store.runs import Store

TYPED_INPUT = {
    StepKind.MODEL: ModelInput,
    StepKind.TOOL: ToolInput,
    StepKind.VERIFY: VerifyInput,
    StepKind.COMPACT: CompactInput,
}
TYPED_OUTPUT = {
    StepKind.MODEL: ModelOutput,
    StepKind.TOOL: ToolOutput,
    StepKind.VERIFY: VerifyOutput,
    StepKind.COMPACT: CompactOutput,
}


def _same_text(stored: str, payload: Any) -> None:
    """The payload encodes to the stored JSON: the same keys, values and key order."""
    again = payloads.encode(payload)
    assert json.dumps(json.loads(again)) == json.dumps(json.loads(stored))
    assert msgspec.json.encode(json.loads(stored)) == again


@pytest.fixture
def recorded(
    cli: Callable[..., Any], write_script: Callable[..., str], workspace: Path, db_path: Path
) -> list[tuple[str, str, str | None, str | None, str | None]]:
    """A real run with every kind of step: model calls, a write, a command, reads,
    elisions and a summary (a small context budget), and the finish gate's check."""
    write_files(workspace, 20, size=2000)
    script = [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "new.txt", "content": "x"}}]},
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo hi"}}]},
        *read_script(20),
    ]
    model = write_script(script)
    result = cli(
        "start",
        "read",
        "--model",
        model,
        "--max-context-tokens",
        "4000",
        "--verify",
        "true",
        "--run-id",
        "every",
    )
    assert result.code == 0, result.stderr
    with sqlite3.connect(db_path) as con:
        rows = con.execute(
            "SELECT kind, effect, state, input, output FROM steps WHERE run_id = 'every' ORDER BY seq"
        ).fetchall()
    return rows


def test_every_kind_round_trips_to_the_json_the_loop_wrote(
    recorded: list[tuple[str, str, str | None, str | None, str | None]], db_path: Path
) -> None:
    seen: set[tuple[str, str | None]] = set()
    for kind, effect, _state, input_text, output_text in recorded:
        assert input_text is not None and output_text is not None
        typed_in = decode_input(kind, json.loads(input_text))
        typed_out = decode_output(kind, json.loads(output_text))
        assert type(typed_in) is TYPED_INPUT[StepKind(kind)], input_text
        assert type(typed_out) is TYPED_OUTPUT[StepKind(kind)], output_text
        _same_text(input_text, typed_in)
        _same_text(output_text, typed_out)
        stage = typed_out.stage if isinstance(typed_out, CompactOutput) else None
        seen.add((kind, effect or stage))
    assert seen >= {
        ("model", None),
        ("tool", "write"),
        ("tool", "exec"),
        ("tool", "read"),
        ("verify", None),
        ("compact", "elide"),
        ("compact", "summarize"),
    }
    # The records the store hands out carry the same typed payloads, decoded once.
    engine = open_store_engine(f"sqlite:///{db_path}")
    try:
        steps = Store(engine).steps("every")
    finally:
        engine.dispose()
    write = next(s for s in steps if s.effect == "write")
    assert isinstance(write.typed_input, ToolInput) and write.typed_input.plan
    assert write.typed_input.plan.path == "new.txt"
    assert write.typed_input is write.typed_input  # kept: not decoded again
    model = next(s for s in steps if s.kind == StepKind.MODEL)
    assert isinstance(model.typed_output, ModelOutput)
    assert model.typed_output.tool_calls[0].function.name == "write_file"


# Any JSON value, with the keys the payloads use so that near-misses are common.
KEYS = st.sampled_from(
    [
        *{
            f.encode_name
            for t in (*TYPED_INPUT.values(), *TYPED_OUTPUT.values())
            for f in msgspec.structs.fields(t)
        },
        "function",
        "name",
        "arguments",
        "id",
        "counted",
        "reason",
    ]
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(KEYS | st.text(max_size=5), inner, max_size=6)
    ),
    max_leaves=20,
)
KINDS = (
    st.sampled_from([*(k.value for k in StepKind), "weird", ""]) | st.text(max_size=8) | st.none()
)


@pytest.mark.slow  # over 2 s on 2 cores
@given(kind=KINDS, value=JSON)
@settings(max_examples=400, deadline=None)
def test_decoding_any_json_never_raises(kind: Any, value: Any) -> None:
    for decoded in (decode_input(kind, value), decode_output(kind, value)):
        if isinstance(decoded, Unknown):
            assert decoded.value is value  # kept as stored, for show and export
        else:
            assert isinstance(value, dict)
            payloads.encode(decoded)  # and it encodes


def _mutations(example: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid payload with one key dropped, or one value replaced by any JSON."""
    keys = st.sampled_from(sorted(example))
    dropped = keys.map(lambda k: {n: v for n, v in example.items() if n != k})
    replaced = st.tuples(keys, JSON).map(lambda kv: {**example, kv[0]: kv[1]})
    return dropped | replaced


VALID = {
    "model": (
        {"turn": 0, "request_hash": "ab", "messages": 2, "model": "m"},
        {
            "content": "done",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4},
            "over_budget": {"tokens": 9, "budget": 5},
            "nudge": {"reason": "length", "message": "go on"},
        },
    ),
    "tool": (
        {"arguments": {"path": "a"}, "plan": {"path": "a", "before_sha": None, "after_sha": "x"}},
        {"result": "ok", "data": {"bytes": 1}, "workspace_note": "left out"},
    ),
    "verify": (
        {"command": "true"},
        {"command": "true", "exit_code": 0, "timed_out": False, "output_tail": "", "passed": True},
    ),
    "compact": (
        {"stage": "summarize", "start": 3, "from": 1, "tokens_before": 10},
        {"stage": "elide", "turn": 2, "elided": [1, 2], "tokens_before": 9, "tokens_after": 5},
    ),
}


@st.composite
def near_misses(draw: st.DrawFn) -> tuple[str, Any, Any]:
    kind = draw(st.sampled_from(sorted(VALID)))
    given_in, given_out = VALID[kind]
    return kind, draw(_mutations(given_in)), draw(_mutations(given_out))


@pytest.mark.slow  # over 2 s on 2 cores
@given(case=near_misses())
@settings(max_examples=300, deadline=None)
def test_a_payload_with_a_key_missing_or_of_another_type_decodes(
    case: tuple[str, Any, Any],
) -> None:
    kind, value_in, value_out = case
    for decoded, value in (
        (decode_input(kind, value_in), value_in),
        (decode_output(kind, value_out), value_out),
    ):
        assert isinstance(
            decoded, Unknown | TYPED_INPUT[StepKind(kind)] | TYPED_OUTPUT[StepKind(kind)]
        )
        if isinstance(decoded, Unknown):
            assert decoded.value is value


def test_the_valid_examples_are_typed() -> None:
    """The near-miss test starts from payloads that do decode (else it proves nothing)."""
    for kind, (value_in, value_out) in VALID.items():
        assert type(decode_input(kind, value_in)) is TYPED_INPUT[StepKind(kind)]
        assert type(decode_output(kind, value_out)) is TYPED_OUTPUT[StepKind(kind)]
        _same_text(json.dumps(value_in), decode_input(kind, value_in))
        _same_text(json.dumps(value_out), decode_output(kind, value_out))


@given(case=near_misses(), where=st.sampled_from(["input", "output", "both"]))
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@pytest.mark.slow  # over 2 s on 2 cores
def test_show_and_export_read_any_payload_through_the_cli(
    recorded: list[Any],
    db_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    case: tuple[str, Any, Any],
    where: str,
) -> None:
    kind, value_in, value_out = case
    with sqlite3.connect(db_path) as con:
        seq = con.execute(
            "SELECT min(seq) FROM steps WHERE run_id = 'every' AND kind = ?", (kind,)
        ).fetchone()[0]
        if where in ("input", "both"):
            con.execute(
                "UPDATE steps SET input = ? WHERE run_id = 'every' AND seq = ?",
                (json.dumps(value_in), seq),
            )
        if where in ("output", "both"):
            con.execute(
                "UPDATE steps SET output = ? WHERE run_id = 'every' AND seq = ?",
                (json.dumps(value_out), seq),
            )
    monkeypatch.setenv("DURABLE_AGENT_DB", f"sqlite:///{db_path}")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    for command in (["show", "every"], ["show", "every", "--json"], ["export", "every"]):
        capsys.readouterr()
        assert main(command) == 0, (command, capsys.readouterr().err)
        assert "Traceback" not in capsys.readouterr().err


def test_show_and_export_read_an_unknown_shape_in_a_real_process(
    recorded: list[Any], db_path: Path, cli: Callable[..., Any]
) -> None:
    with sqlite3.connect(db_path) as con:
        con.execute(
            'UPDATE steps SET input = \'[1, {"plan": 2}]\', output = \'{"usage": "lots"}\' '
            "WHERE run_id = 'every' AND kind IN ('model', 'tool', 'verify', 'compact')"
        )
    for command in (["show", "every"], ["show", "every", "--json"], ["export", "every"]):
        result = cli(*command)
        assert result.code == 0 and "Traceback" not in result.stderr, result.stderr
    shown = json.loads(cli("show", "every", "--json").stdout)
    assert shown["steps"][0]["output"] == {"usage": "lots"}  # shown as stored


@pytest.mark.slow  # over 2 s on 2 cores
def test_an_interrupted_write_whose_plan_is_unreadable_asks_instead_of_crashing(
    cli: Callable[..., Any], write_script: Callable[..., str], workspace: Path, db_path: Path
) -> None:
    model = write_script(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "n.txt", "content": "x"}}
                ]
            },
            {"content": "done"},
        ]
    )
    # Kill the run at each checkpoint in turn until one leaves the write's intent open.
    for crash_after in range(1, 8):
        run_id = f"cut{crash_after}"
        cli(
            "start",
            "write",
            "--model",
            model,
            "--run-id",
            run_id,
            extra_env={"DURABLE_AGENT_CRASH_AFTER": str(crash_after)},
        )
        with sqlite3.connect(db_path) as con:
            open_write = con.execute(
                "SELECT seq FROM steps WHERE run_id = ? AND effect = 'write' AND state = 'started'",
                (run_id,),
            ).fetchone()
            if open_write is None:
                continue
            con.execute(
                "UPDATE steps SET input = ? WHERE run_id = ? AND seq = ?",
                (
                    '{"arguments": {"path": "n.txt", "content": "x"}, "plan": "lost"}',
                    run_id,
                    open_write[0],
                ),
            )
        break
    else:
        pytest.fail("no checkpoint left the write's intent open")
    result = cli("resume", run_id)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.code == 5, result.stderr  # blocked: a person decides whether to write again
    assert "no readable plan" in cli("approvals", run_id).stdout + cli("show", run_id).stdout


def test_a_resume_calibrates_from_the_typed_model_output() -> None:
    from durable_agent.loop.replay import calibration_of

    reported = {
        "content": "x",
        "tool_calls": [],
        "usage": {"prompt_tokens": 1200, "completion_tokens": 1},
        "context": {"counted": 1000},
    }
    assert calibration_of(decode_output("model", reported)) == 1.2
    estimated = {**reported, "usage": {**reported["usage"], "estimated": True}}
    assert calibration_of(decode_output("model", estimated)) == 1.0
    assert calibration_of(decode_output("model", {**reported, "context": "?"})) == 1.0
