"""The store-boundary rule (store/storable.py), and the tools' text and name encoding
(durable_agent/encoding.py), as properties over generated values; then the same values written to
the real SQLite and PostgreSQL stores and read back."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec.json  # noqa: F401  (read_json reads by msgspec where it is loaded)
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scale_helpers import pg_schema
from sqlalchemy import Engine, insert, select

from durable_agent.encoding import (
    decode_text,
    encode_content,
    looks_binary,
    name_from_arg,
    show_name,
)
from durable_agent.store.engine import open_store_engine
from durable_agent.store.prepared import json_text
from durable_agent.store.rows import utcnow
from durable_agent.store.schema import messages, runs, steps
from durable_agent.store.storable import read_json, storable, storable_text

# Every code point, surrogates and NUL included (hypothesis leaves out surrogates by default).
ANY_CHAR = st.characters(exclude_categories=())
ANY_TEXT = st.text(ANY_CHAR, max_size=40)
NASTY_TEXT = st.one_of(
    ANY_TEXT,
    st.sampled_from(
        ["\ud800", "\udcff", "a\x00b", "\\x00", "\\xff", "\ufffd", "x\udc80y\ud83d", "\x00\x00", ""]
    ),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    NASTY_TEXT,
    st.binary(max_size=10),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(NASTY_TEXT, inner, max_size=4),
    ),
    max_leaves=20,
)

FAST = settings(max_examples=100, deadline=None)


def strings_in(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings_in(k)
            yield from strings_in(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from strings_in(v)


def same_json(a: Any, b: Any) -> bool:
    """Equal, numbers up to float precision (jsonb keeps numbers as numeric: 7.9e16 comes
    back as an integer)."""
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# -- read_json: msgspec first, json for what it refuses -----------------------------------------
def _read_json_by_json(text: str | bytes) -> object:
    """read_json as it was, json alone."""
    try:
        return storable(json.loads(text))
    except (ValueError, RecursionError):
        return text


@settings(max_examples=400, deadline=None)
@given(VALUES, st.booleans(), st.sampled_from(["", "NaN", "1e400", '"\\ud800"', '"\\u0000"']))
def test_read_json_gives_what_json_gave(value: Any, ascii_only: bool, odd: str) -> None:
    # Any JSON text, surrogates, NUL, NaN and numbers past a float's range spelt in it, and
    # text that is not JSON: the value read is the one json read (then made storable).
    text = json.dumps(value, ensure_ascii=ascii_only, default=repr)
    for raw in (text, f"[{odd}, {text}]" if odd else text, text[:-1] or "x"):
        got, expected = read_json(raw), _read_json_by_json(raw)
        assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True), raw
        for piece in strings_in(got) if got is not raw else ():  # (not JSON: as written)
            piece.encode("utf-8")  # no surrogate reaches a row's reader
            assert "\x00" not in piece


@pytest.mark.parametrize("depth", [300, 600, 900])
@pytest.mark.parametrize("as_bytes", [False, True], ids=["str", "bytes"])
def test_read_json_of_a_value_nested_past_the_walk_is_as_json_read_it(
    depth: int, as_bytes: bool
) -> None:
    # A hand-edited row nested deeper than storable's walk recurses (json reads it, the
    # walk raises RecursionError) was shown as written; msgspec reads far deeper, and its
    # value, not walked, must not come back where json's reading gave the text.
    for opening, closing in (("[", "]"), ('{"k": ', "}")):
        text = opening * depth + "1" + closing * depth
        raw: str | bytes = text.encode() if as_bytes else text
        got, expected = read_json(raw), _read_json_by_json(raw)  # (the same stack depth)
        assert type(got) is type(expected), (depth, opening, type(got), type(expected))
        if expected is raw:
            assert got is raw


# -- storable ----------------------------------------------------------------------------------
@FAST
@given(VALUES)
def test_storable_values_are_utf8_without_nul_and_valid_json(value: Any) -> None:
    clean = storable(value)
    for text in strings_in(clean):
        text.encode("utf-8")  # raises on any surrogate left
        assert "\x00" not in text
    # allow_nan=False: NaN and Infinity are not JSON (json_extract and jsonb refuse them).
    json.dumps(clean, allow_nan=False)


@FAST
@given(VALUES)
def test_the_prepared_statements_json_text_is_the_storable_value(value: Any) -> None:
    """The hot path's JSON parameters (store/prepared.py) skip the walk when the dump is
    clean: the text must still say exactly what `storable` would, with no NUL (raw or as the
    \\u0000 escape jsonb refuses) and no surrogate in it."""
    text = json_text(value)
    if value is None:
        assert text is None
        return
    assert text is not None
    assert same_json(json.loads(text), json.loads(json.dumps(storable(value), default=str)))
    text.encode("utf-8")
    assert "\x00" not in text and "\\u0000" not in text.replace("\\\\", "")


@FAST
@given(VALUES)
def test_storable_is_idempotent(value: Any) -> None:
    # The loop cleans the history in memory and the store cleans the rows: both must agree.
    once = storable(value)
    assert storable(once) == once


@FAST
@given(st.text(max_size=60))
def test_clean_text_is_left_alone_as_the_same_object(text: str) -> None:
    text = text.replace("\x00", "")
    assert storable_text(text) is text


def test_storable_spells_each_problem() -> None:
    assert storable("a\ud800b") == "a\ufffdb"  # a lone half of a pair: nothing to recover
    assert storable("bad\udcff\udcfe.txt") == "bad\\xff\\xfe.txt"  # surrogateescape: the byte
    assert storable("a\x00b") == "a\\x00b"
    assert storable({"k\x00": [1.5, math.inf, -math.inf, math.nan, b"\xffok"]}) == {
        "k\\x00": [1.5, "Infinity", "-Infinity", "NaN", "\\xffok"]
    }
    assert storable((None, True, 3)) == (None, True, 3)


# -- names and text ----------------------------------------------------------------------------
NAME_BYTES = st.binary(min_size=1, max_size=16).filter(
    lambda b: b"/" not in b and b"\x00" not in b and b not in (b".", b"..")
)


@FAST
@given(NAME_BYTES)
def test_a_shown_name_is_clean_and_names_the_same_file_back(raw: bytes) -> None:
    name = os.fsdecode(raw)  # what os.listdir gives: bad bytes as surrogates
    shown = show_name(name)
    shown.encode("utf-8")
    assert storable(shown) == shown
    # Taken back in a path argument (nothing exists there, so no literal name wins).
    assert os.fsencode(name_from_arg("/nonexistent-workspace", shown)) == raw


def test_a_file_really_named_with_a_backslash_escape_wins(tmp_path: Path) -> None:
    (tmp_path / "a\\xffb").write_text("literal")
    assert name_from_arg(tmp_path, "a\\xffb") == "a\\xffb"
    assert name_from_arg(tmp_path, "c\\xffd") == "c\udcffd"
    assert (
        name_from_arg(tmp_path, "e\\x41f") == "e\\x41f"
    )  # below 0x80 every byte decodes: never escaped


@FAST
@given(st.binary(max_size=300))
def test_decoded_text_is_storable_and_utf8_stays_exact(data: bytes) -> None:
    text, note = decode_text(data)
    assert storable(text) == text
    try:
        exact = data.decode("utf-8")
    except UnicodeDecodeError:
        assert note is not None
    else:
        assert note is None and text == exact.replace("\x00", "\\x00")


def test_decoding_rules() -> None:
    assert decode_text("café olé\n".encode("latin-1")) == (
        "café olé\n",
        "decoded as latin-1: the text is not UTF-8",
    )
    text, note = decode_text("naïve café ".encode() + b"\xff")
    assert text == "naïve café \\xff" and note and "1 byte(s)" in note
    assert decode_text(b"a\x00b") == ("a\\x00b", None)
    assert not looks_binary("café olé\n".encode("latin-1") * 100)
    assert not looks_binary(b"\x1b[31mred\x1b[0m\n")  # colours in a log are text
    assert looks_binary(b"a\x00b")
    assert looks_binary(bytes(range(1, 256)) * 8)  # control bytes everywhere, no NUL
    assert encode_content("x\ud800y") == ("x\ufffdy".encode(), 1)
    assert encode_content("plain é") == ("plain é".encode(), 0)


# -- both real stores ----------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        eng = open_store_engine(f"sqlite:///{tmp_path / 'store.db'}")
        yield eng
        eng.dispose()
        return
    with pg_schema() as url:
        eng = open_store_engine(url)
        yield eng
        eng.dispose()


def test_every_storable_value_is_written_and_read_back_unchanged_on_both_dialects(
    engine: Engine,
) -> None:
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(
            insert(runs).values(
                id="r",
                task="t",
                workspace="w",
                model="m",
                status="pending",
                created_at=now,
                updated_at=now,
            )
        )
    seq = iter(range(1_000_000))

    @settings(
        max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(text=NASTY_TEXT, value=VALUES)
    def write_and_read(text: str, value: Any) -> None:
        n = next(seq)
        row = storable(
            {
                "run_id": "r",
                "seq": n,
                "kind": "tool",
                "state": "completed",
                "idempotency_key": f"k{n}:{text}",
                "call_id": text,
                "tool_name": text[:100],
                "input": {"arguments": value},
                "output": value,
                "error": text,
                "started_at": now,
            }
        )
        message = storable(
            {
                "run_id": "r",
                "seq": n,
                "role": "tool",
                "content": text,
                "tool_calls": [{"function": {"arguments": text}}],
                "created_at": now,
            }
        )
        with engine.begin() as conn:  # a DataError here is the bug this module exists for
            conn.execute(insert(steps), [row])
            conn.execute(insert(messages), [message])
        with engine.connect() as conn:
            got = conn.execute(select(steps).where(steps.c.run_id == "r", steps.c.seq == n)).one()
            msg = conn.execute(
                select(messages).where(messages.c.run_id == "r", messages.c.seq == n)
            ).one()
        # JSON has no tuples: compare as JSON would hand them back.
        assert same_json(got.input, json.loads(json.dumps(row["input"])))
        assert same_json(got.output, json.loads(json.dumps(row["output"])))
        assert (got.error, got.call_id, msg.content) == (
            row["error"],
            row["call_id"],
            message["content"],
        )
        assert msg.tool_calls == message["tool_calls"]

    write_and_read()
